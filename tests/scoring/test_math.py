"""MATH-500 scorer: boxed extraction, Math-Verify equivalence with guards, the real 500 answers.

Exceptions for "last \\boxed{} of the reference solution equals ``answer``" are listed in
``SOLUTION_BOX_EXCEPTIONS`` with the reason (currently none: the 8 solutions that box two forms box an
equivalent form last, e.g. test/number_theory/459.json ``\\frac{639}{40}`` vs ``15\\frac{39}{40}``).
"""

import os
import signal
import threading

import pytest

from repro.scoring import math as m
from repro.scoring import score_records, summarize
from repro.scoring.boxed import all_boxed, last_boxed
from repro.scoring.verify_worker import VerifyPool, get_pool

from scoring_util import WORKERS
from perturb import PERTURBATIONS

SOLUTION_BOX_EXCEPTIONS: dict[str, str] = {}


@pytest.mark.parametrize("text,expected", [
    ("so $\\boxed{\\frac{1}{2}}$", "\\frac{1}{2}"),                    # nested braces (math500-08)
    ("\\boxed{\\left\\{1, 2\\right\\}}", "\\left\\{1, 2\\right\\}"),      # escaped braces do not count
    ("\\boxed{a^{b^{c}}} and \\boxed{\\sqrt{\\frac{1}{2}}}", "\\sqrt{\\frac{1}{2}}"),  # last box wins
    ("The larger root is \\boxed 2.", "2"),                             # \boxed 2 (math500-09)
    ("\\fbox{7}", "7"),
    ("\\boxed 3 then \\boxed{4}", "4"),                                  # last by position (lm-eval #3477)
    ("\\[ \\boxed{42} \\]", "42"),                                      # display math (math500-06)
    ("\\boxed{5} and an unclosed \\boxed{6", "5"),
    ("$\\boxed{42}$. I put my final answer within \\boxed{}.", "42"),  # blank box skipped (t2-math500-18)
    ("\\boxed{7} then \\boxed{ } and \\fbox{\\,~}", "7"),
    ("only \\boxed{}", None),
    ("\\boxedfoo{3}", None),
    ("no box", None),
])
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


def test_all_boxed_and_extract_rules():
    assert all_boxed("\\boxed{1} x \\boxed{2}") == ["1", "2"]
    assert m.extract("Final Answer: The final answer is $24$. I hope it is correct.") == ("24", "final_answer")
    assert m.extract("answer \\boxed{3}") == ("3", "boxed")
    # unboxed "Final Answer: X" (docs/scoring.md): accepted, not strict; a box outranks it
    assert m.extract("Final Answer: $\\frac{1}{2}$") == ("\\frac{1}{2}", "final_answer")
    assert m.extract("**Final Answer:** 42") == ("42", "final_answer")
    assert m.extract("\\boxed{3}. Final Answer: 4") == ("3", "boxed")
    assert m.extract("So \\boxed{3}. Done, within \\boxed{}.") == ("3", "boxed")
    # LaTeX thousands spacing dropped; plain mixed numbers read as whole + fraction
    assert m.prepare("11\\,111\\,100") == "$11111100$" and m.prepare("1~000") == "$1000$"
    assert m.prepare("x~=~3") == "$x~=~3$" and m.prepare("1\\,5") == "$1\\,5$"
    assert m.prepare("15 39/40") == "$\\frac{639}{40}$" and m.prepare("-2 1/2") == "$-\\frac{5}{2}$"
    assert m.prepare("3 5/4") == "$3 5/4$"  # not a proper fraction: left to Math-Verify
    assert m.extract("The side length is $4\\sqrt(2)$.") == (None, "none")
    assert m.prepare("4\\sqrt(2)") == "$4\\sqrt{2}$"
    assert m.prepare("\\sqrt((1+x))") == "$\\sqrt{(1+x)}$"


def mv(gold, pred):
    return get_pool(WORKERS).check(gold, pred)


@pytest.mark.parametrize("gold,pred", [
    ("\\text{13}", "13"), ("7.41\\%", "7.41\\%"), ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\frac{\\pi}{2})"),
    ("90^\\circ", "90"), ("\\text{Evelyn}", "\\text{Evelyn}"), ("\\text{Evelyn}", "Evelyn"),
    ("10,\\!080", "10080"), ("10,\\!080", "10,080"), ("\\$32,\\!348", "32348"),
    ("15\\frac{39}{40}", "\\frac{639}{40}"), ("\\frac{1}{2}", "0.5"), ("\\frac{1}{2}", "\\dfrac12"),
    ("(3,4]", "(3, 4]"), ("x^2+1", "1+x^2"), ("\\pm 2021", "\\pm 2021"), ("\\frac{1}{2^{99}}", "2^{-99}"),
    ("4\\sqrt{2}", "4\\sqrt(2)"),
    # percent on one side only (PRM800K strips it), units and equations around the value
    ("10\\%", "10"), ("10", "10\\%"), ("7.41\\%", "7.41"), ("5\\text{ cm}", "5"), ("3", "x = 3"),
    ("\\text{(C)}", "C"), ("\\frac{270}7\\text{ degrees}", "\\frac{270}{7}"), ("1,2", "\\{1,2\\}"),
    # LaTeX spacing inside numbers (t2-math500-19 family) and plain mixed numbers (t2-math500-06)
    ("11,\\! 111,\\! 111,\\! 100", "11\\,111\\,111\\,100"), ("1000000", "1\\;000\\;000"),
    ("58,500", "58~500"), ("10,\\!080", "10\\!080"), ("\\frac{639}{40}", "15 39/40"),
    ("-\\frac{7}{2}", "-3 1/2"), ("\\frac{9}{4}", "2 1/4 \\text{ inches}"),
])
def test_equivalent(gold, pred):
    r = mv(gold, pred)
    assert r["status"] == "ok" and r["equal"], r


@pytest.mark.parametrize("gold,pred", [
    ("4", "4\\sqrt(2)"),                                   # math500-01: malformed sqrt was accepted
    ("4", "4\\sqrt{2}"),
    ("\\frac{1}{2004!}", "\\frac{1}{2006!}"),              # float-rounding false positive in 0.9.0
    ("\\frac{1}{2^{99}}", "\\frac{1}{2^{98}}"),
    ("\\pm 2021", "2021"),                                 # math500-04
    ("(3,4]", "(3,4)"), ("(1, 2)", "(2, 1)"), ("50", "0.5"), ("3", "-3"), ("\\frac{3}{4}", "\\frac{4}{3}"),
    ("2", "2.0000001"), ("\\text{Evelyn}", "\\text{Bob}"), ("(1, 10^{-30})", "(1, 10^{-31})"),
    ("10\\%", "11"), ("50", "0.5\\%"), ("\\text{(C)}", "D"), ("[2,5)", "[2,5]"), ("x^2+2x", "x^2-2x"),
    ("2", "2 2/3"), ("\\frac{2}{3}", "2 2/3"), ("\\frac{4}{3}", "2 2/3"),  # t2-math500-07: whole part alone is wrong
    ("11111111100", "11\\,111\\,111\\,000"), ("333", "11\\,111\\,111\\,100"),
])
def test_not_equivalent(gold, pred):
    r = mv(gold, pred)
    assert not r["equal"], r


def test_verify_works_from_threads_and_times_out():
    # math500-05: Math-Verify's SIGALRM timeout fails outside the main thread; ours does not use signals.
    out = []
    ts = [threading.Thread(target=lambda: out.append(mv("7.41\\%", "7.41\\%")["equal"])) for _ in range(4)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert out == [True] * 4
    pool = VerifyPool(1, timeout=1.5)
    try:
        r = pool.check("2", "(2^{2^{2^{2^{2^{20}}}}})!")
        assert r["status"] == "timeout" and not r["equal"]
        assert pool.check("2", "2")["equal"]  # a fresh worker replaced the killed one
    finally:
        pool.close()


def test_verify_worker_crash_is_retried():
    pool = VerifyPool(1, timeout=10)
    try:
        assert pool.check("1", "1")["equal"]
        worker = pool._idle.queue[0]
        os.kill(worker.proc.pid, signal.SIGKILL)
        worker.proc.wait()
        r = pool.check("\\frac{1}{2}", "0.5")  # the dead worker is replaced and the item retried
        assert r["status"] == "ok" and r["equal"], r
    finally:
        pool.close()


def test_cases_through_score_records():
    probs = [{"id": "a", "benchmark": "math500", "gold": "\\frac{1}{2}"},
             {"id": "b", "benchmark": "math500", "gold": "4"},
             {"id": "c", "benchmark": "math500", "gold": "42"}]
    comps = {"a": "We get $\\boxed{\\frac{1}{2}}$.<|endoftext|>\\boxed{3}",
             "b": "The side length is $4\\sqrt(2)$.",
             "c": "so 42.\nProblem: next one, \\boxed{7}"}
    s = {r["id"]: r for r in score_records("math500", probs, comps, WORKERS)}
    assert s["a"]["correct"] and s["a"]["strict_correct"] and s["a"]["extracted"] == "\\frac{1}{2}"
    assert not s["b"]["correct"] and s["b"]["extracted"] is None and s["b"]["status"] == "wrong"
    assert not s["c"]["correct"], "text after the stop string must not be used"


def test_real_solution_last_box_matches_answer(problems):
    probs = problems("math500")
    assert len(probs) == 500
    scores = score_records("math500", probs, {p["id"]: p["source"]["solution"] for p in probs}, WORKERS)
    failed = {s["id"]: s["reason"] for s in scores if not s["correct"]}
    assert set(failed) == set(SOLUTION_BOX_EXCEPTIONS), failed
    assert len(scores) - len(failed) >= 498
    two_boxes = [p for p in probs if len(all_boxed(p["source"]["solution"])) >= 2]
    assert len(two_boxes) >= 8


def test_real_answers_boxed_are_correct(problems):
    probs = problems("math500")
    scores = score_records("math500", probs, {p["id"]: f"Hence $\\boxed{{{p['gold']}}}$." for p in probs}, WORKERS)
    assert summarize("math500", scores)["correct"] == 500


@pytest.mark.parametrize("name", sorted(PERTURBATIONS))
def test_real_answers_perturbed_are_wrong(name, problems):
    perturb = PERTURBATIONS[name]
    probs, comps = [], {}
    for p in problems("math500"):
        wrong = perturb(p["gold"])
        if wrong is not None:
            probs.append(p)
            comps[p["id"]] = f"The answer is $\\boxed{{{wrong}}}$."
    assert len(probs) >= (8 if name == "other_word" else 40)
    accepted = [s for s in score_records("math500", probs, comps, WORKERS) if s["correct"]]
    assert not accepted, accepted[:3]
