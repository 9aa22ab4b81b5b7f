"""A real full disk under a Snakemake run of the tiny model: the work directory on a 3 MB tmpfs (needs root and
mount; skipped otherwise), filled once the checkpoint and problems are there. The run stops with one line naming
the work directory, its free space and what to free -- not Snakemake's "Please ensure write permissions for the
directory .../.snakemake" -- and leaves no half-written temp file of a job record; with space again, the same
command finishes. Snakemake's job records (workflow/workdir_records.py) on a full disk: one WorkflowError line."""

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from snakemake.exceptions import WorkflowError

from _e2e import Workflow
from repro.config import REPO_ROOT
from repro.data import BUILTIN_DIR

sys.path.insert(0, str(REPO_ROOT / "workflow"))
import workdir_records as wr  # noqa: E402


def test_write_json_on_a_full_disk_leaves_no_temp_file_and_names_the_work_directory(tmp_path, monkeypatch):

    def full(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(wr.json, "dump", full)
    with pytest.raises(OSError) as e:
        wr._write_json(tmp_path / "records" / "x.json", {"rule": "a"})
    assert list((tmp_path / "records").iterdir()) == []
    with pytest.raises(WorkflowError, match=rf"^no space left on the device for the work directory {tmp_path} \("):
        wr._disk_full(e.value, tmp_path, "the work directory")
    wr._disk_full(OSError(errno.EACCES, "denied"), tmp_path, "the work directory")  # not a full disk: no line


@pytest.mark.slow
def test_a_run_on_a_full_work_directory_names_it(tmp_path):
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a small tmpfs")
    wf = Workflow(tmp_path, BUILTIN_DIR, {"models": ["tiny-orl"], "benchmarks": ["gsm8k"], "limit": 3,
                                         "max_new_tokens": 32}, target="main_table")
    wf.work.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(wf.work)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        first = [str(wf.work / p) for p in ("smoke/decoders/tiny-orl/gsm8k/seed12345.yaml", "verified/tiny-orl.json",
                                            "smoke/problems/gsm8k.for-generation.jsonl", "smoke/problems/gsm8k.jsonl")]
        target, wf.target = wf.target, []
        wf.run(*first)  # the checkpoint, its stamp, the problems and the decoder config; no generation yet
        wf.target = target
        st = os.statvfs(wf.work)
        filler = wf.work / "filler"
        filler.write_bytes(b"x" * (st.f_bavail * st.f_frsize - 6_000))
        out = wf.run(check=False)
        assert wf.returncode != 0
        assert (f"no space left on the device for the work directory {wf.work} (0 MB free): free space on that disk "
                "(old runs' work/<suite> folders") in out, out[-3000:]
        assert "Please ensure write permissions" not in out
        assert not [p for p in wf.work.rglob("*.tmp")]  # no half-written record or output
        filler.unlink()
        wf.run()
        assert (wf.results / "smoke" / "main_table.md").is_file()
    finally:
        subprocess.run(["umount", str(wf.work)])
    assert not Path(wf.work / "filler").exists()
