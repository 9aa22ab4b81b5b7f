"""The answer forms of the turn-3 scoring cases, as kinds (docs/scoring_rules.md §3, §2, §4): each kind on real
MATH-500 / GSM8K / HumanEval / MBPP problems where one fits, with near-misses that must stay wrong.

Kinds: a Math-Verify parse that did not read the whole answer never makes "equal" alone (Math-Verify PR #82);
plain-text constants and functions; decimal complex numbers with ``+ -``; a multiple-choice letter with its
option text; wrapper commands; a unit word contradicting the gold's; an unboxed "the answer is X" on MATH;
GSM8K scale words and number words; raw code closed by a stray fence; the last block defining the entry point.
"""

from fractions import Fraction

import pytest

from repro.scoring import gsm8k, score_records
from repro.scoring import math as m
from repro.scoring.math_normalize import accounts_for, mc_letter, plain_to_latex, unit_of
from repro.scoring.number_words import word_numbers
from repro.scoring.verify_worker import get_pool

from scoring_util import WORKERS

FENCE = "```"


def mv(gold, pred):
    return get_pool(WORKERS).check(gold, pred)


def by_id(problems, bench, pid):
    return next(p for p in problems(bench) if p["id"] == pid)


# ---------------------------------------------------------------------------- MATH-500: partial parses
@pytest.mark.parametrize("gold,pred", [
    ("1 - \\frac{1}{\\mathrm{e}}", "1 + \\frac{1}{\\mathrm{e}}"),      # t3-math500-01: both read as "1" before
    ("1 - \\frac{1}{\\mathrm{E}}", "1 + \\frac{1}{\\mathrm{E}}"),      # upper-case E: not normalised, still caught
    ("2\\operatorname{cis}(30^\\circ)", "2\\operatorname{cis}(60^\\circ)"),  # read as 2 and 2
    ("3 + \\foo{2}", "3 + \\foo{5}"),                                  # any command the parser drops
    ("1 - \\frac{1}{\\mathrm{e}}", "1"),                               # the surviving number alone
])
def test_a_parse_that_dropped_part_of_the_answer_never_says_equal(gold, pred):
    r = mv(gold, pred)
    assert r["status"] == "ok" and not r["equal"], r


@pytest.mark.parametrize("gold,pred", [
    ("1 - \\frac{1}{\\mathrm{e}}", "1 - \\frac{1}{e}"),                # \mathrm{e} is Euler's e
    ("2\\operatorname{cis}(30^\\circ)", "2 \\operatorname{cis}(30^\\circ)"),  # unreadable, same text: equal
    ("e^{2}", "\\mathrm{e}^2"),
    ("\\sin x", "\\operatorname{sin} x"),
])
def test_whole_answers_and_same_unreadable_text_stay_equal(gold, pred):
    r = mv(gold, pred)
    assert r["status"] == "ok" and r["equal"], r


def test_accounting_on_the_500_golds_and_solution_boxes(problems):
    """Every MATH-500 gold and the last box of every reference solution is read whole (so the check never
    turns a reference answer into a string comparison); the PR #82 example is not."""
    from math_verify import parse

    from repro.scoring.boxed import last_boxed

    partial = []
    for p in problems("math500"):
        for s in (p["gold"], last_boxed(p["source"]["solution"])):
            prepared = m.prepare(s)
            parsed = parse(prepared, parsing_timeout=None)
            if parsed and not accounts_for(prepared, parsed):
                partial.append((p["id"], s))
    assert partial == []
    bad = "$1 - \\frac{1}{\\mathrm{E}}$"
    assert not accounts_for(bad, parse(bad, parsing_timeout=None))


# ---------------------------------------------------------------------------- MATH-500: plain text, complex
def test_plain_text_constants_and_functions_on_a_real_problem(problems):
    gold = by_id(problems, "math500", "test/precalculus/1105.json")["gold"]  # -\frac{\pi}{6}
    assert mv(gold, "-pi/6")["equal"] and mv(gold, "-pi / 6")["equal"]
    assert not mv(gold, "pi/6")["equal"] and not mv(gold, "-pi/3")["equal"]  # near-misses


@pytest.mark.parametrize("gold,pred,equal", [
    ("\\frac{\\sqrt{3}}{2}", "sqrt(3)/2", True), ("\\infty", "infinity", True), ("(-\\infty, 0]", "(-inf, 0]", True),
    ("\\frac{1}{2}", "sin(pi/6)", True), ("2\\pi", "2pi", True), ("\\ln 2", "ln(2)", True),
    ("\\frac{\\sqrt{3}}{2}", "sqrt(2)/2", False), ("\\infty", "-infinity", False), ("\\frac{\\pi}{2}", "pi/4", False),
    ("14 - i", "14.0 + -1.0i", True), ("14 - i", "14 + -i", True), ("3 + 2i", "3.0 + 2.0i", True),  # t3-math500-05
    ("14 - i", "14.0 - 1.0j", True), ("\\dfrac{\\pi}{2}", "pi/2", True), ("42", "**42**", True),  # Python's j
    ("14 - i", "14.0 + 1.0i", False), ("14 - i", "14.0 + -2.0i", False), ("14 - i", "14.5 - 1.0i", False),
    ("14 - i", "14.0 + 1.0j", False), ("42", "**24**", False),
])
def test_plain_text_maths_and_decimal_complex_numbers(gold, pred, equal):
    r = mv(gold, pred)
    assert r["status"] == "ok" and r["equal"] == equal, r


def test_plain_to_latex_leaves_words_in_text_and_latex_alone():
    assert plain_to_latex("\\text{spin} + pi") == "\\text{spin} + \\pi "
    assert plain_to_latex("\\pi + \\sqrt{2}") == "\\pi + \\sqrt{2}"
    assert plain_to_latex("3 \\pm 2") == "3 \\pm 2" and plain_to_latex("12.50") == "12.50"


# ---------------------------------------------------------------------------- MATH-500: multiple choice, wrappers
def test_option_letter_with_its_text_on_a_real_problem(problems):
    gold = by_id(problems, "math500", "test/precalculus/819.json")["gold"]  # \text{(C)}
    for pred in ("\\text{C: Plane}", "C. Plane", "(C) Plane", "\\text{(C)}", "C", "\\textbf{C: Plane}", "Option C",
                 "\\mathrm{(C)}"):
        assert mv(gold, pred)["equal"], pred
    for pred in ("\\text{Plane}", "\\text{D: Cylinder}", "(D)", "Plane", "Option D"):  # the letter is what is asked
        assert not mv(gold, pred)["equal"], pred
    assert mc_letter("\\text{Cylinder}") is None and mc_letter(gold, gold=True) == "C"


@pytest.mark.parametrize("gold,pred,equal", [
    ("6", "\\textbf{6}", True), ("88.55", "\\mathbf{88.55}", True), ("6", "\\text{6}", True),
    ("6", "\\mathrm{6}", True), ("6", "\\textbf{7}", False), ("88.55", "\\mathbf{88.5}", False),
])
def test_wrapper_commands(gold, pred, equal):
    assert mv(gold, pred)["equal"] == equal


# ---------------------------------------------------------------------------- MATH-500: units
def test_a_contradicting_unit_is_wrong_a_missing_one_is_not(problems):
    gold = by_id(problems, "math500", "test/prealgebra/1044.json")["gold"]  # 5.4 \text{ cents}
    assert not mv(gold, "5.4 \\text{ dollars}")["equal"] and not mv(gold, "5.4 dollars")["equal"]
    assert mv(gold, "5.4")["equal"] and mv(gold, "5.4 \\text{ cents}")["equal"] and mv(gold, "5.4 cents")["equal"]
    assert not mv(gold, "5.5 \\text{ cents}")["equal"] and not mv(gold, "\\$5.40")["equal"]  # a dollar sign
    assert not mv("4000 \\text{ apples}", "4000 \\text{ bananas}")["equal"]       # two different words
    assert mv("4000 \\text{ apples}", "4000 apple")["equal"] and mv("\\$32,\\!348", "32348")["equal"]
    assert mv("4 \\text{ square units}", "4 \\text{ units}^2")["equal"]
    assert mv("12 \\text{ cm}", "12 \\text{ centimeters}")["equal"]
    assert not mv("12 \\text{ cm}", "12 \\text{ m}")["equal"]
    assert mv("90^\\circ", "90")["equal"]
    assert unit_of("4 \\text{ square units}") is None and unit_of("6 \\text{ sq cm}") == "square cm"


# ---------------------------------------------------------------------------- MATH-500: unboxed "the answer is"
@pytest.mark.parametrize("text,answer,rule", [
    ("Adding gives 40 + 2. The answer is 42 because the cases do not overlap.", "42", "answer_is"),  # t3-math500-13
    ("So the answer is $\\frac{1}{2}$, as claimed.", "\\frac{1}{2}", "answer_is"),
    ("The answer is: -3.\n", "-3", "answer_is"),
    ("\\boxed{5}. The answer is 6.", "5", "boxed"),                       # the box outranks it
    ("Earlier I thought the answer is 8.\nFinal Answer: 7", "7", "final_answer"),
    ("I cannot tell what the answer is.", None, "none"),
])
def test_unboxed_answer_is(text, answer, rule):
    assert m.extract(text) == (answer, rule)


def test_unboxed_answer_is_through_the_scorer_on_a_real_problem(problems):
    p = next(p for p in problems("math500") if p["gold"] == "42")
    right = "Adding both cases, the answer is 42 because they do not overlap."
    wrong = "Adding both cases, the answer is 41 because they do not overlap."
    a, b = score_records("math500", [p, {**p, "id": "x"}], {p["id"]: right, "x": wrong}, WORKERS)
    assert a["correct"] and not a["strict_correct"] and not b["correct"]


# ---------------------------------------------------------------------------- GSM8K: scale and number words
@pytest.mark.parametrize("text,value", [
    ("it earns 1.2 million dollars.", 1200000),                    # t3-gsm8k-01
    ("The budget is $890M.", 890000000), ("They raised 5k.", 5000), ("a 2.5 billion market", 2500000000),
    ("That is 3 thousand bricks.", 3000), ("2bn", 2000000000), ("It is 2.5 bn.", 2500000000),
    ("It costs 1.2 Million dollars", 1200000), ("So she has twelve hundred dollars.", 1200),
    ("She ran 5 km.", 5), ("She ran 5 k.", 5), ("only 5 kg", 5), ("1.2 millionths", Fraction(12, 10)),  # not scales
])
def test_scale_words(text, value):
    assert gsm8k.extract(text)[1] == value


def test_number_words_after_the_last_digit_number_on_a_real_problem(problems):
    p = by_id(problems, "gsm8k", "gsm8k/0")  # Janet's ducks, gold 18
    ok = "She has 16 - 3 - 4 = 9 eggs left and sells each for $2, so she makes eighteen dollars every day."
    near = ok.replace("eighteen", "nineteen")
    words = "So she makes $2 per egg; the answer is eighteen."
    scores = [gsm8k.score(p, t) for t in (ok, near, words)]
    assert [s["correct"] for s in scores] == [True, False, True], scores
    assert "number_words" in scores[0]["reason"]
    # a lone "one" after the last number is a pronoun, not the answer
    assert gsm8k.extract("She keeps 18 eggs, one for each friend.")[1] == 18
    assert gsm8k.extract("The total is 1,200,000 dollars, or 1.2 million.")[1] == 1200000


@pytest.mark.parametrize("text,values", [
    ("twenty-one", [21]), ("Twenty one", [21]), ("one hundred and five", [105]), ("seventy-five thousand", [75000]),
    ("two three", [2, 3]), ("one and two", [1, 2]), ("nineteen twenty", [19, 20]), ("a million", []),
    ("three hundred thousand four hundred twelve", [300412]), ("someone alone", []),
])
def test_number_word_phrases(text, values):
    assert [v for _, v, _, _ in word_numbers(text)] == values


# ---------------------------------------------------------------------------- code: stray fence, last block
def test_raw_code_closed_by_a_stray_fence_then_prose(problems):
    """bigcode-evaluation-harness PR #125 (t3-humaneval-01): the body before the fence is the program."""
    probs = [by_id(problems, "humaneval", f"HumanEval/{i}") for i in (0, 23, 35)]
    prose = f"\n{FENCE}\n\nThis uses the built-in function, so it's simple. Let me know if it's unclear."
    comps = {p["id"]: p["source"]["canonical_solution"].rstrip() + prose for p in probs}
    wrong = {**probs[1], "id": "wrong"}
    comps["wrong"] = "    return len(string) + 1" + prose
    got = {s["id"]: s for s in score_records("humaneval", probs + [wrong], comps, WORKERS)}
    assert [got[p["id"]]["correct"] for p in probs] == [True] * 3, [got[p["id"]]["reason"] for p in probs]
    assert not got["wrong"]["correct"] and "This uses" not in got["wrong"]["extracted"]
    mb = by_id(problems, "mbpp", "mbpp/17")
    text = f"Sure, here it is:\ndef square_perimeter(a):\n    return 4 * a\n{FENCE}\nIt multiplies the side by four."
    assert score_records("mbpp", [mb], {mb["id"]: text}, WORKERS)[0]["correct"]  # prose before the code too


def test_the_last_block_defining_the_entry_point_is_the_answer(problems):
    """Policy of t3-humaneval-02: a draft block followed by a corrected one is judged by the correction; the
    reverse order is judged by the (wrong) last block. MBPP's entry point comes from its asserts."""
    he = by_id(problems, "humaneval", "HumanEval/23")
    good = "def strlen(string: str) -> int:\n    return len(string)"
    bad = "def strlen(string: str) -> int:\n    return len(string) - 1"
    block = lambda code: f"{FENCE}python\n{code}\n{FENCE}\n"
    mb = by_id(problems, "mbpp", "mbpp/17")
    mgood, mbad = "def square_perimeter(a):\n    return 4 * a", "def square_perimeter(a):\n    return 3 * a"
    usage = "print(square_perimeter(10))"
    probs = [he, {**he, "id": "he-rev"}]
    comps = {he["id"]: "Draft:\n" + block(bad) + "Fixed:\n" + block(good),
             "he-rev": "Draft:\n" + block(good) + "Changed my mind:\n" + block(bad)}
    mprobs = [mb, {**mb, "id": "mb-rev"}]
    mcomps = {mb["id"]: block(mbad) + "Corrected:\n" + block(mgood) + "Usage:\n" + block(usage),
              "mb-rev": block(mgood) + block(mbad) + block(usage)}
    he_s = score_records("humaneval", probs, comps, WORKERS)
    mb_s = score_records("mbpp", mprobs, mcomps, WORKERS)
    assert [s["correct"] for s in he_s + mb_s] == [True, False, True, False], [s["reason"] for s in he_s + mb_s]
