"""A quantized checkpoint's row label names the precision its jobs actually ran, from the generation metas
(repro.tables.aggregate.labels_as_run), not a claim in config.yaml: the smoke suite's tiny NVFP4 model at its
configured nvfp4-w4a16 is "+ ORL (tiny NVFP4 checkpoint, 4-bit experts)"; the same checkpoint run at fp32
(experts dequantized at load) is labelled so, in the main table, its CSV and caption, and the speed table.
The same run on the real data shows the independent graders end to end: every cell's score summary has its report
beside it, one sentence under the caption gives the listed verdicts and bands per cell, listed_verdicts.md lies
beside the table and provenance names each grader and its version (repro/scoring/second_grader.py)."""

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
    # the independent graders: a report beside each summary, one sentence under the caption with each cell's band,
    # listed_verdicts.md beside the table (named so: the table reads the same wherever it was written), graders and
    # versions in provenance
    for bench in ("gsm8k", "math500", "humaneval"):
        reports = [json.loads((wf.work / paths.DISAGREEMENTS.format(suite="smoke", model=m, bench=bench, seed=12345))
                              .read_text()) for m in ("tiny-orl-nvfp4", "nvfp4-fp32")]
        assert [r["n"] for r in reports] == [1, 1] and all(r["listed"] == len(r["problems"]) for r in reports), reports
        assert all(len(r["band"]) == 2 and r["graders"] for r in reports), reports
    line = next(ln for ln in md.splitlines() if ln.startswith("Independent graders:"))
    assert line.endswith("details: listed_verdicts.md (beside this table).") and len(line) < 600, line
    assert (wf.results / "smoke" / "listed_verdicts.md").is_file()
    prov = json.loads((wf.results / "smoke" / "provenance.json").read_text())
    assert set(prov["independent_graders"]["math500"]["graders"]) == {"minerva", "prm800k", "math_verify"}
    assert prov["independent_graders"]["math500"]["graders"]["prm800k"]["version"]["mathruler"] == "0.1.0"
    assert [c["n"] for c in prov["independent_graders"]["gsm8k"]["cells"]] == [1, 1]
