"""A grouped suite (`group_benchmarks: true`) end to end through Snakemake on the tiny model and real GSM8K and
HumanEval problems: one generation job serves both benchmarks; `kill -9` of Snakemake while it generates the
second benchmark, then the same command: the first benchmark's shard is kept, the second resumes, every
problem once; a changed HumanEval question re-runs the job, which regenerates HumanEval only (GSM8K's records
keep their bytes and mtime; its merge re-runs, as after any re-run of a job it depends on); the speed table's
note and the merged metas carry the jobs' fixed costs."""

import json
import re
from pathlib import Path

import pytest

from _e2e import Workflow, job_counts

pytestmark = pytest.mark.slow


def test_grouped_job_kill9_resume_and_one_changed_benchmark(tmp_path, data_dir):
    wf = Workflow(tmp_path, data_dir, {"models": ["tiny-orl"], "benchmarks": ["gsm8k", "humaneval"], "limit": 2,
                                       "group_benchmarks": True, "max_new_tokens": 64},
                  target=tmp_path / "results/smoke/speed_table.md")  # generation, merges, speed table; no scoring
    data, work, results, snakemake = wf.data, wf.work, wf.results, wf.run

    group = work / "smoke/generations/tiny-orl/seed12345"
    index, gsm, he = group / "shard0of1.json", group / "shard0of1/gsm8k.jsonl", group / "shard0of1/humaneval.jsonl"
    # Snakemake only, once HumanEval has a record; the job dies with it (repro.backends.lifeline)
    wf.kill_mid_generation(Path(str(he) + ".partial.jsonl"), 1, index)
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
    assert "Fixed costs: 2 generation jobs loaded a model" in speed and "served 1 benchmark on average" in speed

    # one HumanEval question changed: the job re-runs and regenerates HumanEval only
    lines = (data / "humaneval.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    lines[0] = json.dumps(dict(first, prompt=first["prompt"].replace('"""', '"""Note: ', 1)))
    (data / "humaneval.jsonl").write_text("\n".join(lines) + "\n")
    counts = job_counts(snakemake("-n"))
    assert counts == {"prepare_generation_problems": 1, "generate_group": 1, "merge_shards": 2,
                      "speed_table": 1, "total": 5}, counts
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
