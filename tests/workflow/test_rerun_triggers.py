"""Rerun triggers of the scoring stage: a changed scoring setting that changes verdicts (scoring.timeout_s)
re-scores -- only the benchmarks it affects, without regenerating -- and one that does not
(scoring.workers) re-runs nothing; switching the generation backend regenerates. On a copy of the shared smoke run
(conftest.py: the tiny model, one problem of GSM8K and HumanEval)."""

import pytest

from _e2e import SMOKE_SUITE, job_counts

pytestmark = pytest.mark.slow

SUITE = SMOKE_SUITE


def snakemake(wf, scoring, *args, extra=None, suite_extra=None):
    wf.configure({**SUITE, **(suite_extra or {})}, {**(extra or {}), "scoring": scoring})
    return wf.run(*args)


def test_changed_timeout_rescores_code_benchmarks_only_and_workers_reruns_nothing(tmp_path, smoke_run):
    wf = smoke_run.copy_to(tmp_path)
    snakemake(wf, {"timeout_s": 10, "workers": 2})  # the copy's tables made again (and its scores, at this timeout)
    cell = "smoke/{}/tiny/{}/seed12345{}"
    gens = [wf.work / cell.format("generations", b, ".jsonl") for b in ("gsm8k", "humaneval")]
    scores = {b: wf.work / cell.format("scores", b, ".summary.json") for b in ("gsm8k", "humaneval")}
    before = {p: p.stat().st_mtime_ns for p in [*gens, *scores.values()]}

    # workers changes speed, not verdicts: nothing to do
    assert "Nothing to be done" in snakemake(wf, {"timeout_s": 10, "workers": 1}, "-n")

    # a new timeout: the HumanEval cell is re-scored (GSM8K runs no programs), then the table; no generation
    dry = snakemake(wf, {"timeout_s": 3, "workers": 2}, "-n")
    assert job_counts(dry) == {"score": 1, "write_table": 1, "main_table": 1, "total": 3}, dry[-3000:]
    assert "bench=humaneval" in dry and "Params have changed" in dry, dry[-3000:]
    snakemake(wf, {"timeout_s": 3, "workers": 2})
    after = {p: p.stat().st_mtime_ns for p in before}
    assert after[scores["humaneval"]] != before[scores["humaneval"]]
    assert after[scores["gsm8k"]] == before[scores["gsm8k"]] and all(after[g] == before[g] for g in gens)
    assert "Nothing to be done" in snakemake(wf, {"timeout_s": 3, "workers": 2}, "-n")

    # switching the generation backend regenerates (its shards and everything downstream); SGLang runs on CUDA
    # only (a CPU suite under sglang stops at start-up), so the dry run asks for a GPU suite
    dry = snakemake(wf, {"timeout_s": 3, "workers": 2}, "-n", extra={"backend": "sglang"},
                    suite_extra={"device": "cuda", "precision": "bf16"})
    assert job_counts(dry).get("generate_shard") == 2 and "Params have changed" in dry, dry[-3000:]
