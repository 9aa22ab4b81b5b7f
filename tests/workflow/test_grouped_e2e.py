"""A grouped suite (`group_benchmarks: true`) end to end through Snakemake on the tiny model and real GSM8K and
HumanEval problems: one generation job serves both benchmarks; `kill -9` of Snakemake while it generates the
second benchmark, then the same command: the first benchmark's shard is kept, the second resumes, every
problem once; a changed HumanEval question re-runs the job, which regenerates HumanEval only (GSM8K's records
keep their bytes and mtime; its merge re-runs, as after any re-run of a job it depends on); the speed table's
note and the merged metas carry the jobs' fixed costs."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from repro.config import REPO_ROOT
from test_resume_e2e import generation_processes

pytestmark = pytest.mark.slow


def test_grouped_job_kill9_resume_and_one_changed_benchmark(tmp_path, data_dir):
    data = tmp_path / "data"
    data.mkdir()
    for b in ("gsm8k", "humaneval"):
        (data / f"{b}.jsonl").write_bytes((data_dir / f"{b}.jsonl").read_bytes())
    work, results = tmp_path / "work", tmp_path / "results"
    overlay = tmp_path / "overlay.json"
    overlay.write_text(json.dumps({
        "data_dir": str(data), "results_dir": str(results), "work_dir": str(work),
        "suites": {"smoke": {"models": ["tiny-orl"], "benchmarks": ["gsm8k", "humaneval"], "limit": 2,
                             "group_benchmarks": True, "max_new_tokens": 64}}}))
    target = str(results / "smoke" / "speed_table.md")  # generation, merges and the speed table; no scoring
    cmd = [sys.executable, "-m", "snakemake", target, "--cores", "2", "--snakefile", str(REPO_ROOT / "Snakefile"),
           "--directory", str(tmp_path), "--configfile", str(REPO_ROOT / "config.yaml"), str(overlay)]
    env = dict(os.environ, OMP_NUM_THREADS="1")

    def snakemake(*args):
        r = subprocess.run(cmd + list(args), cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
        assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
        return r.stdout + r.stderr

    group = work / "smoke/generations/tiny-orl/seed12345"
    index, gsm, he = group / "shard0of1.json", group / "shard0of1/gsm8k.jsonl", group / "shard0of1/humaneval.jsonl"
    he_partial = Path(str(he) + ".partial.jsonl")
    p = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True, env=env)
    deadline, killed = time.time() + 300, False
    try:
        while time.time() < deadline and p.poll() is None:
            if he_partial.exists() and he_partial.read_text().count("\n") >= 1:
                os.kill(p.pid, signal.SIGKILL)  # Snakemake only; the job dies with it (repro.backends.lifeline)
                killed = True
                break
            time.sleep(0.05)
        p.wait()
        if not killed:
            pytest.skip("generation finished before it could be killed (machine too fast for this check)")
        gone = time.time() + 20
        while generation_processes(index) and time.time() < gone:
            time.sleep(0.2)
        assert generation_processes(index) == []
    finally:
        for pid in generation_processes(index):
            os.kill(pid, signal.SIGKILL)
    assert gsm.is_file() and not index.exists()
    gsm_bytes = gsm.read_bytes()

    snakemake()  # the same command: stale locks removed, the job re-run
    log = (work / "logs/generate/smoke/tiny-orl/seed12345/shard0of1.log").read_text()
    assert "all done by an earlier run of this job with the same inputs: kept" in log and gsm.read_bytes() == gsm_bytes
    done = int(re.search(r"humaneval/seed12345 shard 0/1: 2 problems, (\d) already done", log).group(1))
    assert done >= 1
    for b in ("gsm8k", "humaneval"):
        merged = work / "smoke" / "generations" / "tiny-orl" / b / "seed12345.jsonl"
        ids = [json.loads(l)["id"] for l in merged.read_text().splitlines()]
        assert len(ids) == 2 and len(set(ids)) == 2
    assert "Nothing to be done" in snakemake("-n")
    # the resumed HumanEval shard records both sessions: the killed job's (its load paid) and the resuming one's
    he_meta = json.loads(Path(str(he) + ".meta.json").read_text())
    killed_s, last_s = he_meta["generation_sessions"]
    assert not killed_s["finished"] and last_s["finished"] and last_s["problems"] == 2 - done
    assert killed_s["job"]["id"] != last_s["job"]["id"] and killed_s["job"]["model_load_s"] is not None
    speed = (results / "smoke" / "speed_table.md").read_text()
    assert "Fixed costs: 2 generation jobs loaded a model" in speed and "serving 1 benchmark on average" in speed

    # one HumanEval question changed: the job re-runs and regenerates HumanEval only
    lines = (data / "humaneval.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    lines[0] = json.dumps(dict(first, prompt=first["prompt"].replace('"""', '"""Note: ', 1)))
    (data / "humaneval.jsonl").write_text("\n".join(lines) + "\n")
    counts = dict(re.findall(r"^(\w+)\s+(\d+)$", snakemake("-n"), re.M))
    assert counts == {"prepare_generation_problems": "1", "generate_group": "1", "merge_shards": "2",
                      "speed_table": "1", "total": "5"}, counts
    mtime = gsm.stat().st_mtime_ns
    snakemake()
    assert gsm.read_bytes() == gsm_bytes and gsm.stat().st_mtime_ns == mtime
    log = (work / "logs/generate/smoke/tiny-orl/seed12345/shard0of1.log").read_text()
    assert "humaneval/seed12345 shard 0/1: 2 problems, 0 already done, 2 to generate" in log
    speed = (results / "smoke" / "speed_table.md").read_text()
    # the shards now on disk: GSM8K from the killed job (its load served 2), HumanEval from the last (served 1)
    assert "Fixed costs: 2 generation jobs loaded a model" in speed, speed
    metas = {b: json.loads((work / f"smoke/generations/tiny-orl/{b}/seed12345.jsonl.meta.json").read_text())["shards"]
             for b in ("gsm8k", "humaneval")}
    assert metas["gsm8k"][0]["job"]["benchmarks_sharing_load"] == 2
    assert metas["humaneval"][0]["job"]["benchmarks_sharing_load"] == 1
