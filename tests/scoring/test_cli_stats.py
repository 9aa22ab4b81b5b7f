"""``python -m repro.scoring score`` end to end (formats of docs/interfaces.md), and the summary stats."""

import json
import subprocess
import sys

import pytest

from repro.scoring import summarize
from repro.scoring.stats import bootstrap_ci

from scoring_util import REPO, WORKERS

SCORE_KEYS = {"id", "benchmark", "correct", "extracted", "reason", "status", "strict_correct"}
SUMMARY_KEYS = {"benchmark", "n", "correct", "accuracy", "ci95", "status_counts", "strict_accuracy"}


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "repro.scoring", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def write_jsonl(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


@pytest.mark.parametrize("benchmark", ["gsm8k", "humaneval"])
def test_score_cli_end_to_end(benchmark, problems, tmp_path):
    probs = problems(benchmark)[:12]
    gens = []
    for i, p in enumerate(probs):
        if benchmark == "gsm8k":
            text = f"... so the answer is \\boxed{{{p['gold']}}}." if i % 3 else "I do not know, maybe 0.5."
        else:
            text = p["source"]["canonical_solution"] if i % 3 else "    return None\n"
        gens.append({"id": p["id"], "benchmark": benchmark, "completion": text, "seed": 1})
    pf = write_jsonl(tmp_path / "problems.jsonl", probs)
    gf = write_jsonl(tmp_path / "gens.jsonl", gens)
    out, summ = tmp_path / "out" / "scores.jsonl", tmp_path / "out" / "scores.summary.json"
    r = run_cli("score", "--benchmark", benchmark, "--problems", pf, "--generations", gf, "--out", out,
                "--summary", summ, "--workers", WORKERS)
    assert r.returncode == 0, r.stderr
    scores = [json.loads(x) for x in out.read_text().splitlines()]
    assert [s["id"] for s in scores] == [p["id"] for p in probs]
    assert all(set(s) == SCORE_KEYS for s in scores)
    assert [s["correct"] for s in scores] == [bool(i % 3) for i in range(12)]
    summary = json.loads(summ.read_text())
    assert set(summary) == SUMMARY_KEYS and summary["n"] == 12 and summary["correct"] == 8
    assert summary["accuracy"] == pytest.approx(100 * 8 / 12, abs=1e-3)
    lo, hi = summary["ci95"]
    assert 0 <= lo < summary["accuracy"] < hi <= 100
    if benchmark == "gsm8k":
        assert summary["status_counts"] == {"correct": 8, "wrong": 4} and summary["strict_accuracy"] == summary["accuracy"]
    else:
        assert summary["status_counts"] == {"failed": 4, "passed": 8} and summary["strict_accuracy"] is None
    assert not [p for p in out.parent.iterdir() if p.name.endswith(".tmp")], "atomic writes leave no temp files"


def test_score_cli_errors_name_the_bad_input(problems, tmp_path):
    probs = problems("gsm8k")[:3]
    pf = write_jsonl(tmp_path / "p.jsonl", probs)
    common = ["--out", tmp_path / "s.jsonl", "--summary", tmp_path / "s.json"]
    gf = write_jsonl(tmp_path / "g1.jsonl", [{"id": "gsm8k/999999", "completion": "1"}])
    r = run_cli("score", "--benchmark", "gsm8k", "--problems", pf, "--generations", gf, *common)
    assert r.returncode != 0 and "gsm8k/999999" in r.stderr and "g1.jsonl:1" in r.stderr
    gf = write_jsonl(tmp_path / "g2.jsonl", [{"id": "gsm8k/0", "completion": "1"}, {"id": "gsm8k/0", "completion": "2"}])
    r = run_cli("score", "--benchmark", "gsm8k", "--problems", pf, "--generations", gf, *common)
    assert r.returncode != 0 and "duplicate generation for id 'gsm8k/0'" in r.stderr
    gf = write_jsonl(tmp_path / "g3.jsonl", [{"id": "gsm8k/0", "text": "1"}])
    r = run_cli("score", "--benchmark", "gsm8k", "--problems", pf, "--generations", gf, *common)
    assert r.returncode != 0 and "no string 'completion'" in r.stderr
    (tmp_path / "bad.jsonl").write_text('{"id": "gsm8k/0", "completion": "1"}\n{not json\n')
    r = run_cli("score", "--benchmark", "gsm8k", "--problems", pf, "--generations", tmp_path / "bad.jsonl", *common)
    assert r.returncode != 0 and "bad.jsonl:2" in r.stderr
    assert not (tmp_path / "s.jsonl").exists() and not (tmp_path / "s.json").exists()
    # a subset of problems is scored with a warning
    gf = write_jsonl(tmp_path / "g4.jsonl", [{"id": "gsm8k/1", "completion": f"\\boxed{{{probs[1]['gold']}}}"}])
    r = run_cli("score", "--benchmark", "gsm8k", "--problems", pf, "--generations", gf, *common)
    assert r.returncode == 0 and "2 of 3 problems have no generation" in r.stderr
    assert json.loads((tmp_path / "s.json").read_text())["n"] == 1


def test_score_records_errors(problems):
    from repro.scoring import score_records

    probs = problems("gsm8k")[:2]
    with pytest.raises(ValueError, match="no completion for 1 problem"):
        score_records("gsm8k", probs, {probs[0]["id"]: "1"})
    with pytest.raises(ValueError, match="unknown benchmark 'gsm9k'"):
        score_records("gsm9k", probs, {})
    with pytest.raises(ValueError, match="is a 'gsm8k' problem, not 'mbpp'"):
        score_records("mbpp", probs, {p["id"]: "" for p in probs})


def test_bootstrap_ci_properties():
    assert bootstrap_ci([1] * 50) == (100.0, 100.0)
    assert bootstrap_ci([0] * 50) == (0.0, 0.0)
    lo, hi = bootstrap_ci([1, 0] * 250)  # p = 0.5, n = 500: normal approx +-4.38 points
    assert 45.0 < lo < 46.2 and 53.8 < hi < 55.0
    assert bootstrap_ci([1, 0, 0] * 100) == bootstrap_ci([1, 0, 0] * 100), "fixed seed: reproducible"
    with pytest.raises(ValueError):
        bootstrap_ci([])


def test_summarize_format():
    scores = [{"id": str(i), "benchmark": "mbpp", "correct": i < 3, "status": s, "strict_correct": None,
               "extracted": "", "reason": ""} for i, s in enumerate(["passed"] * 3 + ["failed", "timeout", "error"])]
    s = summarize("mbpp", scores)
    assert s == {**s, "benchmark": "mbpp", "n": 6, "correct": 3, "accuracy": 50.0, "strict_accuracy": None,
                 "status_counts": {"error": 1, "failed": 1, "passed": 3, "timeout": 1}}
    with pytest.raises(ValueError, match="no score records"):
        summarize("mbpp", [])
    with pytest.raises(ValueError, match="records of another benchmark"):
        summarize("gsm8k", scores)
