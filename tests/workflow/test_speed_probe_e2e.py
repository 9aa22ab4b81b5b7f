"""The speed probe end to end through Snakemake: a suite generating batched (tiny model, CPU, batch_size 2, two
real GSM8K problems, HumanEval among its speed benchmarks but not its benchmarks) gets one probe job per
generated model x speed benchmark, which runs the same problems one request at a time at batch 1 with the
generation job's code; the speed table takes its single-request columns from the probe and says so; a second
run is "Nothing to be done"."""

import json

import pytest

from _e2e import Workflow, job_counts

pytestmark = pytest.mark.slow


def test_batched_suite_probe_feeds_the_single_request_columns(tmp_path, data_dir):
    wf = Workflow(tmp_path, data_dir, {"models": ["tiny-orl", "reference"], "benchmarks": ["gsm8k"], "limit": 2,
                                       "batch_size": 2, "max_new_tokens": 32},
                  target=tmp_path / "results/smoke/speed_table.md")  # generation, probes, merges, speed table
    work, results, snakemake = wf.work, wf.results, wf.run

    counts = job_counts(snakemake("-n"))
    assert counts["speed_probe"] == 1 and counts["generate_shard"] == 1, counts  # not for `reference`
    snakemake()
    gen = [json.loads(l) for l in (work / "smoke/generations/tiny-orl/gsm8k/seed12345.jsonl").read_text().splitlines()]
    probe_file = work / "smoke/speed/tiny-orl/gsm8k.jsonl"
    probe = [json.loads(l) for l in probe_file.read_text().splitlines()]
    meta = json.loads((work / "smoke/speed/tiny-orl/gsm8k.jsonl.meta.json").read_text())
    assert {r["batch_size"] for r in gen} == {2} and {r["batch_size"] for r in probe} == {1}
    assert [r["id"] for r in probe] == [r["id"] for r in gen]  # the first problems, in problem order
    assert meta["batch_size"] == 1 and meta["inputs"]["limit"] == 32 and meta["backend_info"]["engine_path"]
    # on the CPU both paths give the same greedy tokens (batch invariance), hence the same completions
    assert [r["completion"] for r in probe] == [r["completion"] for r in gen]
    md = (results / "smoke" / "speed_table.md").read_text()
    # the suite keeps 2 problems: the caption says so, as column n does (not "the first 32")
    assert "separate speed-probe run" in md and "first 2 problems of GSM8K (all that were generated; the subset is capped at 32 problems)" in md, md
    assert "the speed probe's 1 job loaded it again" in md, md  # its load is a fixed cost of the run too
    row = next(l for l in md.splitlines() if l.startswith("| + ORL (tiny") and "GSM8K" in l)
    cells = [c.strip() for c in row.strip("|").split("|")]
    tps = sum(r["generated_tokens"] for r in probe) / sum(r["wall_s"] for r in probe)
    assert cells[2] == "2" and cells[3] == f"{tps:.1f}", row  # n (1 req.) and tokens/s (1 req.) from the probe
    assert "Nothing to be done" in snakemake("-n")
