"""A full disk (ENOSPC injected on write): the generation job ends with one line naming the full folder and what to
free, no traceback; nothing half-written (no shard, no temp file, the partial file holds whole records) and the rerun
resumes; after a failed run the workflow's one line names the work directory's disk (repro.io.full_disks)."""

import errno
import json
import re
import shutil
from pathlib import Path

import pytest

from repro import io as rio
from repro.backends import generation_job as gen
from repro.checkpoint.manifest import write_manifest
from repro.data import load_problems

from fake_backend import FakeBackend


@pytest.fixture
def argv(tmp_path, monkeypatch):
    monkeypatch.delenv("REPRO_SNAKEMAKE_PID", raising=False)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    stamp = tmp_path / "stamp.json"
    stamp.write_text(json.dumps({"manifest_sha256": write_manifest(ckpt)["manifest_sha256"]}))
    probs = load_problems("gsm8k", None, allow_hub=False).problems  # the built-in ones: every clone has them
    (tmp_path / "problems.jsonl").write_text("".join(json.dumps(p) + "\n" for p in probs))
    (tmp_path / "dec.yaml").write_text("algorithm: low_confidence\nthreshold: 0.9\n")
    out = tmp_path / "work" / "smoke" / "generations" / "m" / "gsm8k" / "seed1" / "shard0of1.jsonl"
    return out, [p["id"] for p in probs], [
        "--model", "m", "--model-dir", str(ckpt), "--role", "base", "--verified", str(stamp), "--decoder",
        str(tmp_path / "dec.yaml"), "--problems", str(tmp_path / "problems.jsonl"), "--benchmark", "gsm8k",
        "--seed", "1", "--out", str(out)]


def _enospc(*_a, **_k):
    raise OSError(errno.ENOSPC, "No space left on device")


def _one_error_line(err: str, folder: Path) -> str:
    lines = [x for x in err.splitlines() if x.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"error: no space left on the device for {folder} (")
    assert "MB free): free space" in lines[0]
    return lines[0]


def test_enospc_while_appending_records_is_one_line_and_the_rerun_resumes(argv, monkeypatch, capsys):
    out, ids, args = argv
    monkeypatch.setattr(gen, "get_backend", lambda *a, **k: FakeBackend())
    real_append, n = gen.append_jsonl, [0]

    def append(f, rec):  # the third record finds the disk full, after writing half a line
        n[0] += 1
        if n[0] == 3:
            f.write(json.dumps(rec)[:15])
            f.flush()
            _enospc()
        real_append(f, rec)

    monkeypatch.setattr(gen, "append_jsonl", append)
    assert gen.main(args) == 3
    line = _one_error_line(capsys.readouterr().err, out.parent)
    assert "records finished so far are kept in the partial file(s) there, and the job resumes from them" in line
    partial = Path(str(out) + ".partial.jsonl")
    assert not out.exists() and not Path(str(out) + ".meta.json").exists()
    assert [r["id"] for r in rio.read_jsonl_tolerant(partial)] == ids[:2]  # whole records; the torn one dropped
    monkeypatch.setattr(gen, "append_jsonl", real_append)
    backend = FakeBackend()
    monkeypatch.setattr(gen, "get_backend", lambda *a, **k: backend)
    assert gen.main(args) == 0 and backend.calls == len(ids) - 2
    assert [json.loads(x)["id"] for x in out.read_text().splitlines()] == ids and not partial.exists()


def test_enospc_while_writing_the_shard_leaves_no_shard_and_no_temp_file(argv, monkeypatch, capsys):
    out, ids, args = argv
    monkeypatch.setattr(gen, "get_backend", lambda *a, **k: FakeBackend())
    real_fsync = rio.os.fsync

    def fsync(fd):  # the shard's atomic write (temp file + rename) fails at its fsync, as a full disk does
        if re.fullmatch(rf"\.{re.escape(out.name)}\.\w+\.tmp", Path(f"/proc/self/fd/{fd}").resolve().name):
            _enospc()
        real_fsync(fd)

    monkeypatch.setattr(rio.os, "fsync", fsync)
    assert gen.main(args) == 3
    _one_error_line(capsys.readouterr().err, out.parent)
    assert not out.exists() and [p.name for p in out.parent.iterdir() if p.name.endswith(".tmp")] == []
    assert [r["id"] for r in rio.read_jsonl_tolerant(Path(str(out) + ".partial.jsonl"))] == ids
    monkeypatch.setattr(rio.os, "fsync", real_fsync)
    assert gen.main(args) == 0 and len(out.read_text().splitlines()) == len(ids)


def test_another_os_error_is_not_called_a_full_disk():
    assert rio.disk_full(OSError(errno.EACCES, "Permission denied"), "/tmp") is None
    assert rio.disk_full(ValueError("x"), "/tmp") is None
    assert rio.disk_full(OSError(errno.EDQUOT, "quota"), "/tmp").startswith("disk quota exceeded for /tmp (")


def test_the_failed_run_names_the_full_work_directory_once_per_disk(tmp_path, monkeypatch):
    work, results = tmp_path / "work", tmp_path / "results" / "smoke"  # results not made yet: its parent is probed
    work.mkdir()
    folders = {"work directory": work, "results folder": results, "Snakemake state (.snakemake)": tmp_path / ".sm"}
    assert rio.full_disks(folders) == [] or shutil.disk_usage(tmp_path).free < 64e6
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(rio.shutil, "disk_usage", lambda p: usage._replace(free=3_000_000))
    lines = rio.full_disks(folders)
    assert lines == [f"Error: no space left on the device for the work directory {work} (3 MB free): free space "
                     "on that disk (old runs' work/<suite> folders, results/ or checkpoints no longer needed, other "
                     "users' files) or point the work directory elsewhere (work_dir in the config, or "
                     "$ORL_EVAL_WORK), then run again"]
