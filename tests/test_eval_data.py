"""A clone without the real benchmark files (no ../shared, or ORL_EVAL_DATA naming a folder without them): the
tests that need them skip quietly, one line at the end counts them and says how to run them (tests/conftest.py,
tests/eval_data.py), and the runs the tests start see no data folder."""

import os
import re
import subprocess
import sys

import eval_data


def test_one_summary_line_counts_the_skips_and_names_orl_eval_data(tmp_path):
    empty = tmp_path / "data"
    empty.mkdir()
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_gold_through_stage.py"]
    r = subprocess.run(cmd, cwd=eval_data.REPO, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, ORL_EVAL_DATA=str(empty)))
    assert r.returncode == 0, r.stdout[-2000:]
    n = int(re.search(r"(\d+) skipped", r.stdout.splitlines()[-1]).group(1))
    lines = [x for x in r.stdout.splitlines() if "no real benchmark files" in x]
    assert lines == [f"{n} tests skipped: no real benchmark files in {empty}; set ORL_EVAL_DATA=/path/to/data (a "
                     "folder holding gsm8k.jsonl, math500.jsonl, humaneval.jsonl and mbpp.jsonl in their original "
                     "layouts) to run them"], r.stdout[-2000:]
    assert n > 0 and "SKIPPED" not in r.stdout  # each skip itself stays quiet


def test_orl_eval_data_without_the_files_means_no_data_also_for_subprocesses(tmp_path, monkeypatch):
    # both variables restored after the test (setenv first, so that monkeypatch records _OFF as absent and
    # removes what configure() sets: it leaked into the later tests of the same worker once)
    monkeypatch.setenv(eval_data._OFF, "")
    monkeypatch.delenv(eval_data._OFF)
    monkeypatch.setenv("ORL_EVAL_DATA", str(tmp_path))
    eval_data.configure()
    assert "ORL_EVAL_DATA" not in os.environ and eval_data.looked_at() == tmp_path
    assert eval_data.real_data() is None  # not ../shared/data beside the checkout, where a machine may have it
    (tmp_path / "gsm8k.jsonl").write_text("{}\n")
    assert eval_data.real_data() == tmp_path and eval_data.real_data("mbpp.jsonl") is None


def test_one_summary_line_counts_the_skips_without_the_scoring_cases(tmp_path):
    """No cases file: the case tests skip quietly and one line counts them and names ORL_EVAL_CASES."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/scoring/test_cases.py"]
    r = subprocess.run(cmd, cwd=eval_data.REPO, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, ORL_EVAL_CASES=str(tmp_path / "none.jsonl")))
    assert r.returncode == 0, r.stdout[-2000:]
    lines = [x for x in r.stdout.splitlines() if "bug-report cases" in x]
    n = int(re.search(r"(\d+) skipped", r.stdout.splitlines()[-1]).group(1))
    assert n > 0 and lines == [f"{n} tests skipped: the scorer's bug-report cases were not found; set "
                               "ORL_EVAL_CASES=/path/to/scoring_cases.jsonl (default: cases/scoring_cases.jsonl "
                               "beside the data folder) to run them"], r.stdout[-2000:]
