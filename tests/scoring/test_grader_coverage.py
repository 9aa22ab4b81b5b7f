"""The grader-coverage measure (docs/scoring.md "Independent graders"): with each turn-4 scoring fix switched off in turn, how many of the verdicts
that go wrong on ``scoring_cases_turn4.jsonl`` do the independent graders list? (``scripts/grader_coverage.py``.)

The figure is asserted as measured (14 of 17, 82.4 %: at least the 80 % of the acceptance item), with the verdicts
no grader lists named: kinds no grader from the field reads (a repeating-decimal bar, a Unicode radical, an
"Answer:" line followed by a check with other numbers). The Unicode fraction in GSM8K prose (``5½`` read as its
whole part) is listed by Qwen2.5-Math's grader. A grader change that loses or gains one shows here. It takes minutes (each fix switched off is a fresh scoring
process with its worker pools), so it runs in the CI's later stage (``.ci/run``: ``ORL_EVAL_COVERAGE=1``), not in
the README's test command.
"""

import json
import os
import subprocess
import sys

import pytest

from scoring_util import REPO, cases_path

TURN4 = cases_path().parent / "scoring_cases_turn4.jsonl"


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("ORL_EVAL_COVERAGE") != "1",
                    reason="minutes long: set ORL_EVAL_COVERAGE=1 (the CI's later stage does)")
def test_graders_list_the_verdicts_each_disabled_fix_gets_wrong(tmp_path):
    if not TURN4.is_file():
        pytest.skip(f"{TURN4} not found (set ORL_EVAL_CASES)")
    out = tmp_path / "coverage.json"
    r = subprocess.run([sys.executable, "scripts/grader_coverage.py", str(TURN4), "--data-dir",
                        str(cases_path().parent.parent / "data"), "--json", str(out)], cwd=REPO,
                       capture_output=True, text=True, timeout=1200, env={k: v for k, v in os.environ.items()
                                                                           if k != "REPRO_SCORING_DISABLE"})
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    unlisted = sorted(w["id"] for f in res["fixes"] for w in f["wrong"] if not w["listed"])
    assert unlisted == ["t4-gsm8k-01", "t4-math500-11", "t4-math500-14"], r.stdout
    assert (res["listed"], res["wrong"]) == (14, 17) and res["percent"] >= 80.0, r.stdout
    by = {w["id"]: w["by"] for f in res["fixes"] for w in f["wrong"]}
    assert by["t4-gsm8k-06"] == ["qwen_math"], r.stdout  # the grader added for it, and only it
    every = {f["fix"] for f in res["fixes"]}
    assert "math_connectives" in every and all(f["wrong"] for f in res["fixes"] if f["fix"] != "math_roman_constant")
