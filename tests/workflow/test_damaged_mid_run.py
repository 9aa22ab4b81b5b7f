"""A checkpoint damaged while generations run: nothing made from it survives the repair.

* a generation job whose checkpoint file changes (size or mtime) while it generates writes no shard and says
  which file changed and what to do (repro.backends.generation_job, Job.recheck_checkpoint);
* each shard meta records the stamp it ran under, and when a later check of the checkpoint fails the shards,
  partial files and merged files made under that stamp are removed, and nothing else
  (repro.checkpoint.suspect.remove_generated_under; the e2e case: test_tracked_inputs.py)."""

import json
from pathlib import Path

import pytest

from repro import paths as P
from repro.backends import generation_job as gen
from repro.checkpoint.suspect import remove_generated_under, stamp_identity
from repro.checkpoint.manifest import write_manifest
from repro.checkpoint.verify import verify, write_stamp


@pytest.fixture
def ckpt(tmp_path):
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(b"\0" * 64)
    write_manifest(d)
    stamp = tmp_path / "verified.json"
    write_stamp(verify(d), stamp)
    return d, stamp


class DamagingBackend:
    """Generates each problem (completion = its id); after the second one, a checkpoint file is rewritten."""

    name = "engine"

    def __init__(self, victim: Path):
        self.victim, self.calls = victim, 0

    def generate(self, prompts, decoder):
        for p in prompts:
            self.calls += 1
            if self.calls == 2:
                self.victim.write_bytes(b"\1" * 64)  # same size, a new mtime
            yield {"prompt_text": "q", "completion": "a", "prompt_tokens": 1, "generated_tokens": 1,
                   "forwards": {"prefill": 1, "denoise": 1, "commit": 1}, "tpf": 1.0, "wall_s": 0.01,
                   "tokens_per_s": 1.0,
                   "finish_reason": "eos", "device": "cpu"}

    def describe(self):
        return {"backend": "damaging"}

    def close(self):
        pass


def test_checkpoint_changed_during_the_job_writes_no_shard(ckpt, tmp_path, monkeypatch, capsys, data_dir):
    from repro.data import load_problems

    d, stamp = ckpt
    problems = tmp_path / "problems.jsonl"
    problems.write_text("".join(json.dumps(p) + "\n" for p in load_problems("gsm8k", data_dir, limit=3).problems))
    dec = tmp_path / "dec.yaml"
    dec.write_text("algorithm: low_confidence\nthreshold: 0.9\nmax_new_tokens: 8\n")
    out = tmp_path / "g" / "shard0of1.jsonl"
    monkeypatch.setattr(gen, "get_backend", lambda *a, **k: DamagingBackend(d / "model.safetensors"))
    rc = gen.main(["--model", "m", "--model-dir", str(d), "--role", "base", "--verified", str(stamp),
                   "--benchmark", "gsm8k", "--decoder", str(dec), "--problems", str(problems), "--seed", "1",
                   "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and not out.exists() and not Path(str(out) + ".meta.json").exists()
    assert f"the checkpoint {d} changed while this job generated {out.name}" in err, err
    assert "changed: model.safetensors" in err and "Fix: run the workflow again" in err, err


def _shard(work: Path, model: str, bench: str, stamp: dict | None, ended_at: float = 0.0, grouped: bool = False):
    tmpl = P.GROUP_SHARD if grouped else P.SHARD
    f = work / tmpl.format(suite="smoke", model=model, bench=bench, seed=1, shard=0, nshards=1)
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text("{}\n")
    meta = {"model": model, "benchmark": bench, "seed": 1, "shard": 0, "checkpoint_manifest_sha256": "m",
            "job": {"ended_at": ended_at}}
    if stamp is not None:
        meta["checkpoint_stamp"] = stamp_identity(stamp)
    Path(str(f) + ".meta.json").write_text(json.dumps(meta))
    merged = work / P.GENERATIONS.format(suite="smoke", model=model, bench=bench, seed=1)
    merged.parent.mkdir(parents=True, exist_ok=True)
    merged.write_text("{}\n")
    Path(str(merged) + ".meta.json").write_text(json.dumps({"sha256": "x", "shards": []}))
    if grouped:
        f.parent.with_suffix(".json").write_text("{}")
    return f, merged


def test_a_failed_check_removes_what_was_made_under_its_stamp(tmp_path):
    work = tmp_path / "work"
    failed = {"verified_at": "2026-01-02T00:00:00+00:00", "stat_fingerprint": "f2", "manifest_sha256": "m"}
    earlier = {"verified_at": "2026-01-01T00:00:00+00:00", "stat_fingerprint": "f1", "manifest_sha256": "m"}
    bad, bad_merged = _shard(work, "orl", "gsm8k", failed)
    bad_g, _ = _shard(work, "orl", "mbpp", failed, grouped=True)
    ok, ok_merged = _shard(work, "orl", "humaneval", earlier)  # vouched for by the later, successful check
    other, _ = _shard(work, "base", "gsm8k", {**failed, "stat_fingerprint": "g"})
    legacy_new, _ = _shard(work, "orl", "math500", None, ended_at=1767312000.0 + 60)  # no checkpoint_stamp: by time
    partial = Path(str(ok) + ".partial.jsonl")
    partial.write_text("{}\n")
    lines = remove_generated_under(work, failed, "orl", dry_run=True)
    assert len(lines) == 3 and bad.exists() and partial.exists()  # a dry run removes nothing
    lines = remove_generated_under(work, failed, "orl")
    assert [ln.split(" generated")[0] for ln in lines] == [
        "removed the shards (seed 1) of orl/gsm8k (suite smoke)",
        "removed the shards (seed 1) of orl/math500 (suite smoke)",
        "removed the shards (seed 1) of orl/mbpp (suite smoke)"]
    assert not bad.exists() and not Path(str(bad) + ".meta.json").exists() and not bad_merged.exists()
    assert not bad_g.exists() and not bad_g.parent.with_suffix(".json").exists()  # the grouped job's index
    assert not legacy_new.exists() and not partial.exists()
    assert ok.exists() and ok_merged.exists() and other.exists()


def test_a_work_directory_under_a_speed_folder_removes_merged_files_too(tmp_path):
    """Speed probes are told by the layout inside the work directory, not by its absolute path: under
    ``/x/speed/work`` a shard is still a shard, whose merged file goes with it."""
    work = tmp_path / "speed" / "work"
    failed = {"verified_at": "2026-01-02T00:00:00+00:00", "stat_fingerprint": "f2", "manifest_sha256": "m"}
    bad, bad_merged = _shard(work, "orl", "gsm8k", failed)
    probe = work / "smoke" / "speed" / "orl" / "gsm8k.jsonl"
    probe.parent.mkdir(parents=True)
    probe.write_text("{}\n")
    Path(str(probe) + ".meta.json").write_text(json.dumps({"model": "orl", "benchmark": "gsm8k",
                                                           "checkpoint_stamp": stamp_identity(failed)}))
    lines = remove_generated_under(work, failed, "orl")
    assert [ln.split(" generated")[0] for ln in lines] == [
        "removed the shards (seed 1), speed-probe records of orl/gsm8k (suite smoke)"]
    assert not bad.exists() and not bad_merged.exists() and not Path(str(bad_merged) + ".meta.json").exists()
    assert not probe.exists()


def test_a_stamp_refreshed_for_the_same_files_is_accepted(ckpt, monkeypatch):
    """Another run's start-up check verifies the folder again by content when an inode change time moved (a hard
    link, a chmod) and rewrites the stamp (a new fingerprint): the job goes on, its shard naming the new stamp.
    A stamp rewritten for files of another size or mtime still stops the shard."""
    import argparse
    import os

    monkeypatch.delenv("ORL_EVAL_GPU_CLAIM", raising=False)
    d, stamp = ckpt
    job = gen.Job(argparse.Namespace(model_dir=str(d), verified=str(stamp), device="cpu", precision="fp32",
                                     decoder=[]))
    started = job.stamp
    os.chmod(d / "model.safetensors", 0o600)  # the inode change time moves; size and mtime do not
    refreshed = write_stamp(verify(d), stamp)
    assert refreshed["stat_fingerprint"] != started["stat_fingerprint"]
    job.recheck_checkpoint(Path("shard0of1.jsonl"))
    assert job.stamp["stat_fingerprint"] == refreshed["stat_fingerprint"]
    os.utime(d / "model.safetensors", ns=(10**18, 10**18))  # touched: re-stamped for another mtime
    write_stamp(verify(d), stamp)
    with pytest.raises(gen.GenerationError, match="was rewritten while this job ran"):
        job.recheck_checkpoint(Path("shard0of1.jsonl"))
