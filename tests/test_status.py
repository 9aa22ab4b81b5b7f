"""`python -m repro.status` on real partial files: the generation job (the real engine on the tiny checkpoint) is
stopped mid-shard in a one-benchmark job and in a grouped job, as a crash leaves them; the table shows per model ×
benchmark the problems done out of the total, tokens/s, an ETA while running and the state; after the reruns every
cell is done."""

import fcntl
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from repro import liveness, status
from repro.backends import generation_job as gen
from repro.checkpoint.tiny import write_tiny
from repro.data import load_problems
from repro.io import append_jsonl

BENCHES = {"gsm8k": 3, "humaneval": 2}  # the first built-in problems (every clone has them)


class Crash(Exception):
    pass


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    """A work directory with suite ``s``: problems and decoder configs for models ``tiny-orl`` (one-benchmark jobs,
    gsm8k in 2 shards), ``grouped`` (one grouped job over both benchmarks) and ``later`` (planned, not started)."""
    root = tmp_path_factory.mktemp("status")
    work, ckpt = root / "work", root / "tiny"
    write_tiny(ckpt, seed=1)
    stamp = root / "stamp.json"
    stamp.write_text(json.dumps({"manifest_sha256": json.loads((ckpt / "checkpoint_manifest.json").read_text())
                                 ["manifest_sha256"]}))
    base = work / "s"
    (base / "problems").mkdir(parents=True)
    for b in BENCHES:
        probs = load_problems(b, None, limit=BENCHES[b], allow_hub=False).problems
        (base / "problems" / f"{b}.for-generation.jsonl").write_text("".join(json.dumps(p) + "\n" for p in probs))
        for m in ("tiny-orl", "grouped", "later"):
            d = base / "decoders" / m / b
            d.mkdir(parents=True)
            (d / "seed1.yaml").write_text("algorithm: orl\nmax_new_tokens: 16\n")

    def args(model, benches, shard=0, n=1):
        a = gen.argparse.Namespace(backend="engine", model=model, model_dir=str(ckpt), role="orl", verified=str(stamp),
                                   benchmark=benches, seed=1, shard=shard, num_shards=n, device="cpu",
                                   precision="fp32", batch_size=1, limit=None, adapter_map=None, out=None,
                                   group_index=None)
        a.decoder = [str(base / "decoders" / model / b / "seed1.yaml") for b in benches]
        a.problems = [str(base / "problems" / f"{b}.for-generation.jsonl") for b in benches]
        if len(benches) > 1:
            a.group_index = str(base / "generations" / model / "seed1" / f"shard{shard}of{n}.json")
        else:
            a.out = str(base / "generations" / model / benches[0] / "seed1" / f"shard{shard}of{n}.jsonl")
        return a

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the workflow runs generation jobs (OMP_NUM_THREADS=1): the tiny model's fastest
    yield work, args
    torch.set_num_threads(threads)


def _crash_after(monkeypatch, n):
    calls = []

    def append(f, rec):
        if len(calls) == n:
            raise Crash()
        calls.append(rec["id"])
        append_jsonl(f, rec)
    monkeypatch.setattr(gen, "append_jsonl", append)


def _rows(text):
    """{(model, benchmark): [done/total, %, tokens/s, ETA, state]} of the table (columns split on 2+ spaces)."""
    import re

    out = {}
    for line in text.splitlines()[3:]:
        if not line.startswith(("-", "run: ")):
            cols = re.split(r"\s{2,}", line.strip())
            out[(cols[0], cols[1]) if cols[0] != "all" else ("all", "")] = cols[2:] if cols[0] != "all" else cols[1:]
    return out


def test_progress_of_a_stopped_run_then_of_the_finished_one(suite, monkeypatch, capsys):
    work, args = suite
    _crash_after(monkeypatch, 1)
    with pytest.raises(Crash):
        gen.run(args("tiny-orl", ["gsm8k"], 0, 2))  # shard 0 of 2 (problems 0 and 2): 1 record, then the crash
    _crash_after(monkeypatch, 3 + 1)
    with pytest.raises(Crash):
        gen.run(args("grouped", ["gsm8k", "humaneval"]))  # gsm8k finished, humaneval 1 of 2
    partial = work / "s" / "generations" / "tiny-orl" / "gsm8k" / "seed1" / "shard0of2.jsonl.partial.jsonl"
    last = json.loads(Path(str(partial)[: -len(".jsonl")] + ".sessions.json").read_text())[-1]
    assert last["problems"] == 1 and not last["finished"]

    # the plan of the run (written at its start from the config) names a model whose decoder configs are not
    # rendered yet: it counts (a fresh user saw "all 12/21" while 36 cells were planned)
    plan = [{"model": m, "benchmark": b, "seeds": [1], "records": [
        f"s/generations/{m}/{b}/seed1/shard{k}of{n}.jsonl" if m != "grouped" else f"s/generations/{m}/seed1/shard0of1/{b}.jsonl"
        for k in range(n)]} for m, n in (("tiny-orl", 2), ("grouped", 1), ("later", 1), ("unrendered", 1)) for b in BENCHES]
    status.write_plan(work, "s", plan)

    now = partial.stat().st_mtime + 1  # just after the crash: no Snakemake and no job alive, so stopped
    text = status.table(work, "s", now=now)
    rows = _rows(text)
    assert rows[("tiny-orl", "gsm8k")][:2] == ["1/3", "33%"], text
    assert rows[("tiny-orl", "gsm8k")][-1].startswith("stopped (rerun to resume; last write "), text
    assert float(rows[("tiny-orl", "gsm8k")][2]) == pytest.approx(last["generated_tokens"] / last["wall_s"], abs=0.06)
    assert rows[("tiny-orl", "gsm8k")][3] == "-"  # no ETA: nothing writes
    assert rows[("grouped", "gsm8k")][:2] == ["3/3", "100%"] and rows[("grouped", "gsm8k")][-1] == "done", text
    assert rows[("grouped", "humaneval")][:2] == ["1/2", "50%"] and rows[("grouped", "humaneval")][-1].startswith(
        "stopped (rerun to resume")
    assert rows[("later", "gsm8k")] == ["0/3", "0%", "-", "-", "not started"]
    assert rows[("unrendered", "gsm8k")] == ["0/3", "0%", "-", "-", "not started"], text
    assert rows[("tiny-orl", "humaneval")][0] == "0/2"
    assert rows[("all", "")][0] == f"{1 + 3 + 1}/{4 * 5}", text
    assert text.splitlines()[-1].startswith("run: stopped (no Snakemake holds this work directory); rerun the same "
                                            "command to resume")

    # the run alive (a Snakemake holds its claim on the work directory) and the shard's job alive: running
    claim = work / ".repro-runs" / "4242.lock"
    claim.parent.mkdir(exist_ok=True)
    claim.write_text(json.dumps({"pid": 4242, "directory": str(work.parent), "host": liveness.hostname()}))
    sessions = Path(str(partial)[: -len(".jsonl")] + ".sessions.json")
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", liveness.JOB_MODULE])
    try:
        with open(claim) as held:
            fcntl.flock(held, fcntl.LOCK_EX)  # as the live Snakemake holds it (workflow/run_claims.py)
            figures = json.loads(sessions.read_text())
            figures[-1]["job"]["pid"] = job.pid
            sessions.write_text(json.dumps(figures))
            text = status.table(work, "s", now=now)
            rows = _rows(text)
            assert rows[("tiny-orl", "gsm8k")][-1] == "running", text
            assert rows[("tiny-orl", "gsm8k")][3] == status.duration(last["wall_s"] / last["problems"])  # 1 left
            assert rows[("grouped", "humaneval")][-1] == "waiting"  # its job is gone, the run goes on: queued
            assert rows[("later", "gsm8k")][-1] == "waiting"
            assert text.splitlines()[-1] == f"run: alive (Snakemake pid 4242 in {work.parent})", text
            job.kill()
            job.wait()
            assert _rows(status.table(work, "s", now=now))[("tiny-orl", "gsm8k")][-1] == "waiting"  # the job died
        rows = _rows(status.table(work, "s", now=now + 3600))  # and the run: stopped an hour ago
        assert rows[("tiny-orl", "gsm8k")][-1].startswith("stopped (rerun to resume; last write "), rows
    finally:
        job.kill()
        job.wait()
        claim.unlink()

    monkeypatch.setattr(gen, "append_jsonl", append_jsonl)
    for model, benches, shard in (("tiny-orl", ["gsm8k"], 0), ("tiny-orl", ["gsm8k"], 1),
                                  ("grouped", ["gsm8k", "humaneval"], 0)):
        assert gen.run(args(model, benches, shard, 2 if model == "tiny-orl" else 1)) == 0
    assert status.main(["--work", str(work), "--suite", "s"]) == 0
    rows = _rows(capsys.readouterr().out)
    for cell in (("tiny-orl", "gsm8k"), ("grouped", "gsm8k"), ("grouped", "humaneval")):
        assert rows[cell][1] == "100%" and rows[cell][-1] == "done" and rows[cell][3] == "-", rows[cell]


def test_the_command_names_a_wrong_work_directory_or_suite(suite, tmp_path, capsys):
    work, _ = suite
    log = work / "logs" / "decoders" / "s" / "tiny-orl" / "gsm8k" / "seed12345.log"  # as a real run's logs lie
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("rendered\n")
    assert status.suites_in(work) == ["s"]  # the logs folder is no suite (a fresh user saw "suite logs: ...")
    assert status.main(["--work", str(tmp_path)]) == 2
    assert f"no suite has generation files under {tmp_path}: give the run's work directory" in capsys.readouterr().err
    assert status.main(["--work", str(work), "--suite", "paper"]) == 2
    assert "suite 'paper' has not started there (suites there: s)" in capsys.readouterr().err
    assert status.main(["--work", str(work)]) == 0
    assert capsys.readouterr().out.startswith(f"suite s: generation progress in {work / 's'} at ")


def test_records_left_from_earlier_inputs_do_not_count_for_a_run_that_regenerates_them(tmp_path):
    """A config change (new max_new_tokens, say) re-runs generation jobs whose finished records files are still on
    disk until each job starts. The run's plan lists those files under ``regenerate``; a listed file written before
    the plan is not progress of this run, one written after it is (the job wrote it again). Files the plan does
    not list count as they are. Real records: the tiny model's generation job on the first built-in GSM8K
    problems."""
    import os
    import time

    ckpt = tmp_path / "tiny"
    write_tiny(ckpt, seed=1)
    stamp = tmp_path / "stamp.json"
    stamp.write_text(json.dumps({"manifest_sha256": json.loads((ckpt / "checkpoint_manifest.json").read_text())
                                 ["manifest_sha256"]}))
    work, base = tmp_path / "work", tmp_path / "work" / "s"
    (base / "problems").mkdir(parents=True)
    probs = load_problems("gsm8k", None, limit=2, allow_hub=False).problems
    (base / "problems" / "gsm8k.for-generation.jsonl").write_text("".join(json.dumps(p) + "\n" for p in probs))
    recs = {}
    for m in ("old", "kept"):
        dec = base / "decoders" / m / "gsm8k" / "seed1.yaml"
        dec.parent.mkdir(parents=True)
        dec.write_text("algorithm: orl\nmax_new_tokens: 8\n")
        out = base / "generations" / m / "gsm8k" / "seed1" / "shard0of1.jsonl"
        gen.run(gen.argparse.Namespace(
            backend="engine", model=m, model_dir=str(ckpt), role="orl", verified=str(stamp), benchmark=["gsm8k"],
            seed=1, shard=0, num_shards=1, device="cpu", precision="fp32", batch_size=1, limit=None,
            adapter_map=None, out=str(out), group_index=None, decoder=[str(dec)],
            problems=[str(base / "problems" / "gsm8k.for-generation.jsonl")]))
        assert out.read_text().count("\n") == 2
        recs[m] = str(out.relative_to(work))
    past = time.time() - 3600
    for rel in recs.values():  # both written an hour before the run below started
        os.utime(work / rel, (past, past))
    status.write_plan(work, "s", [{"model": m, "benchmark": "gsm8k", "seeds": [1], "records": [recs[m]],
                                   "regenerate": [recs[m]] if m == "old" else []} for m in recs])
    now = time.time()
    rows = _rows(status.table(work, "s", now=now))
    assert rows[("kept", "gsm8k")][0] == "2/2" and rows[("kept", "gsm8k")][-1] == "done"
    assert rows[("old", "gsm8k")][0] == "0/2" and rows[("old", "gsm8k")][-1] != "done", rows
    assert rows[("all", "")][:2] == ["2/4", "50%"], rows
    os.utime(work / recs["old"])  # the run's job wrote it again
    rows = _rows(status.table(work, "s", now=time.time()))
    assert rows[("old", "gsm8k")][0] == "2/2" and rows[("old", "gsm8k")][-1] == "done"
