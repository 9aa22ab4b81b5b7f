"""Every case of every case file in ``../shared/cases/`` (``scoring_cases.jsonl``, ``_turn2``, ``_turn3``, ``_turn4``
and any later ``scoring_cases*.jsonl``) gets its ``expected_correct`` verdict: one regression suite, so a fix of
one round cannot break what an earlier round (or Math-Verify itself) got right.

Each case comes from a real bug report of a peer scorer (the ``note`` field says which). All cases are
scored in one ``run_cases`` call (as ``python -m repro.scoring cases`` does) and asserted one by one.
"""

import json
import subprocess
import sys

import pytest

from repro.scoring.cases import run_cases

from scoring_util import REPO, WORKERS, cases_path


def _files():
    """The turn-1 cases file and every ``scoring_cases*.jsonl`` beside it, in name order."""
    p = cases_path()
    if not p.is_file():
        return []
    return [p] + sorted(q for q in p.parent.glob("scoring_cases*.jsonl") if q != p)


def _load():
    return [json.loads(line) for f in _files() for line in f.read_text().splitlines() if line.strip()]


CASES = _load()


@pytest.fixture(scope="module")
def verdicts(data):
    if not CASES:
        pytest.skip(f"scoring cases not found at {cases_path()} (set ORL_EVAL_CASES)")
    results, summary = run_cases(CASES, data, WORKERS)
    return {r["id"]: r for r in results}, summary


@pytest.mark.parametrize("case", CASES or [pytest.param(None, marks=pytest.mark.skip(reason=f"scoring cases not found at {cases_path()} (set ORL_EVAL_CASES)"))],
                         ids=[c["id"] for c in CASES] or ["no-cases"])
def test_case_verdict(case, verdicts):
    got = verdicts[0][case["id"]]
    assert got["correct"] == case["expected_correct"], f"{case['id']}: {got['reason']}\nnote: {case['note']}"


def test_cases_cli(data, tmp_path):
    if not CASES:
        pytest.skip(f"scoring cases not found at {cases_path()} (set ORL_EVAL_CASES)")
    slow = ("while True", "setrecursionlimit")  # run to the 10 s timeout; covered by test_case_verdict
    subset = [c for c in CASES if c["benchmark"] != "humaneval" or not any(s in c["model_output"] for s in slow)]
    tmp = tmp_path / "cases.jsonl"
    tmp.write_text("".join(json.dumps(c) + "\n" for c in subset))
    out = subprocess.run([sys.executable, "-m", "repro.scoring", "cases", str(tmp), "--data-dir", str(data),
                          "--workers", str(WORKERS)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(x) for x in out.stdout.splitlines()]
    assert [r["id"] for r in lines[:-1]] == [c["id"] for c in subset]
    assert all(set(r) >= {"id", "correct", "extracted", "reason"} for r in lines[:-1])
    assert lines[-1]["summary"] is True and lines[-1]["disagree_ids"] == [] and lines[-1]["n"] == len(subset)


def test_every_case_file_is_in_the_suite():
    if not CASES:
        pytest.skip(f"scoring cases not found at {cases_path()} (set ORL_EVAL_CASES)")
    names = {f.name for f in _files()}
    assert {"scoring_cases.jsonl", "scoring_cases_turn4.jsonl"} <= names, names
    ids = [c["id"] for c in CASES]
    assert len(ids) == len(set(ids)), "case ids must be unique across the files"


def test_cases_cli_reports_disagreement(data, tmp_path):
    case = {"id": "x", "benchmark": "gsm8k", "model_output": "The answer is 5.", "gold": "#### 6", "expected_correct": True}
    f = tmp_path / "c.jsonl"
    f.write_text(json.dumps(case) + "\n")
    out = subprocess.run([sys.executable, "-m", "repro.scoring", "cases", str(f), "--data-dir", str(data)],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert json.loads(out.stdout.splitlines()[-1])["disagree_ids"] == ["x"]
