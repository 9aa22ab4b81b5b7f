"""The turn-4 kinds as kinds (docs/scoring_rules.md §2 item 8, §3 item 11, §4), on real MATH-500 / GSM8K /
HumanEval / MBPP problems, with variants the case file does not hold and near-misses that must stay wrong.

Kinds: list words (``\\text{ and }``, ``\\text{ or }``), a set for an interval or ordered tuple, repeating decimals,
Unicode mathematics, E-notation (policy: unless the gold uses Euler's e), roman constants after a number; GSM8K
"Answer:" lines, remarks in a box, powers of ten, hedges, fractions; CommonMark fences (length and character,
list-item indentation), answers split over several blocks. Each fix has a switch (repro/scoring/fixes.py): one
test shows a switched-off fix makes its verdict wrong again, so these tests cannot pass without the fixes.
"""

from fractions import Fraction

import pytest

from repro.scoring import fixes, gsm8k, score_records
from repro.scoring.code.extract import extract_code, fence_blocks
from repro.scoring.math_forms import connectives_to_commas, repeating_to_fraction, unicode_to_latex, uses_euler
from repro.scoring.verify_worker import get_pool

from scoring_util import WORKERS

F = "```"


def mv(gold, pred):
    return get_pool(WORKERS).check(gold, pred)


def by_id(problems, bench, pid):
    return next(p for p in problems(bench) if p["id"] == pid)


# ---------------------------------------------------------------------------- MATH-500 on real golds
@pytest.mark.parametrize("uid,pred,ok", [
    ("test/intermediate_algebra/428.json", "3, 5 \\text{ and } 7", True),        # no comma before "and"
    ("test/intermediate_algebra/428.json", "3,\\ 5,\\text{and}\\ 7", True),
    ("test/intermediate_algebra/428.json", "3, 5, and 7", True),                  # plain words, no \text
    ("test/intermediate_algebra/428.json", "3 \\text{ or } 5 \\text{ or } 7", True),
    ("test/intermediate_algebra/428.json", "3, 5 \\text{ and } 9", False),         # near-miss: one element wrong
    ("test/intermediate_algebra/428.json", "3 \\text{ and } 5", False),            # near-miss: one missing
    ("test/algebra/1078.json", "(-\\sqrt{3}, \\sqrt{3})", True),                  # the interval itself
    ("test/algebra/1078.json", "\\{-\\sqrt{3}, \\sqrt{3}\\}", False),              # a set of its endpoints
    ("test/algebra/1078.json", "\\sqrt{3}, -\\sqrt{3}", False),                     # bare endpoints, other order
    ("test/precalculus/807.json", "(3, \\frac{\\pi}{2})", True),
    ("test/precalculus/807.json", "\\{\\frac{\\pi}{2}, 3\\}", False),               # set, the other order
    ("test/precalculus/807.json", "3, \\frac{\\pi}{2}", False),                     # bare list for a point
    ("test/counting_and_probability/430.json", "0.\\bar{3}", True),
    ("test/counting_and_probability/430.json", "0.333\\ldots", True),
    ("test/counting_and_probability/430.json", "0.3333...", True),
    ("test/counting_and_probability/430.json", "0.\\overline{33}", True),
    ("test/counting_and_probability/430.json", "0.333", False),                     # near-miss: a rounded decimal
    ("test/counting_and_probability/430.json", "0.3\\overline{4}", False),
    ("test/prealgebra/1834.json", "√(53)", True),
    ("test/prealgebra/1834.json", "√{53}", True),
    ("test/prealgebra/1834.json", "√35", False),                                    # near-miss: other radicand
    ("test/algebra/2470.json", "137 ½", True),
    ("test/algebra/2470.json", "137¼", False),                                      # near-miss: other fraction
    ("test/algebra/2470.json", "½", False),
    ("test/number_theory/598.json", "6.72e-05", True),
    ("test/number_theory/598.json", "6.72e-6", False),                              # near-miss: other exponent
    ("test/number_theory/598.json", "6.72 e-5", False),                             # spaced: Euler's e, not a float
])
def test_math_turn4_kinds_on_real_golds(problems, uid, pred, ok):
    gold = by_id(problems, "math500", uid)["gold"]
    v = mv(gold, pred)
    assert v["status"] == "ok" and v["equal"] is ok, (gold, pred, v)


@pytest.mark.parametrize("gold,pred,ok", [
    ("3R^2", "3R²", True), ("3R^2", "3R³", False), ("3R^2", "3", False),           # superscripts, not the 3 alone
    ("\\frac{270}{7}^\\circ", "\\frac{270}{7}°", True), ("\\frac{270}{7}^\\circ", "\\frac{27}{7}°", False),
    ("3e", "3\\mathrm{e}", True), ("3", "3\\mathrm{e}", False),                     # roman constants: never units
    ("2 + 3i", "2 + 3\\mathrm{i}", True), ("2", "2 + 3\\mathrm{i}", False),
    ("2e - 1", "2e-1", True), ("0.2", "2e-1", True), ("0.2", "2e-2", False),      # policy: Euler's e only if the gold has it
])
def test_math_turn4_kinds_by_form(gold, pred, ok):
    v = mv(gold, pred)
    assert v["status"] == "ok" and v["equal"] is ok, (gold, pred, v)


def test_math_form_rewrites():
    assert repeating_to_fraction("0.1\\overline{6}") == "\\frac{1}{6}"
    assert repeating_to_fraction("0.142857142857\\ldots") == "\\frac{1}{7}"
    assert repeating_to_fraction("-1.\\overline{9}") == "-2"
    assert repeating_to_fraction("0.12\\ldots") == "0.12\\ldots"  # no repetition: left as written
    assert repeating_to_fraction("0.\\dot{1}4285\\dot{7}") == "\\frac{1}{7}"
    assert unicode_to_latex("√53") == "\\sqrt{53}" and unicode_to_latex("2√(x+1)") == "2\\sqrt{x+1}"
    assert unicode_to_latex("137½") == "\\frac{275}{2}" and unicode_to_latex("-2¾") == "-\\frac{11}{4}"
    assert unicode_to_latex("x²⁺¹") == "x^{2+1}" and unicode_to_latex("abc") == "abc"
    assert connectives_to_commas("3, 5, \\text{ and } 7") == "3, 5, 7"
    assert connectives_to_commas("\\text{Monday}") == "\\text{Monday}"
    assert uses_euler("e^{2}") and uses_euler("\\mathrm{e}") and not uses_euler(".0000672")
    assert not uses_euler("\\sec x") and not uses_euler("\\text{eggs}")


# ---------------------------------------------------------------------------- GSM8K on real problems
def _gsm8k(problems, idx, text):
    p = by_id(problems, "gsm8k", f"gsm8k/{idx}")
    return gsm8k.score(p, text)


@pytest.mark.parametrize("idx,text,ok", [
    (0, "She sells 9 eggs.\n\nAnswer: 18\n\nThat is 126 dollars a week.", True),
    (0, "She sells 9 eggs.\n\n**Final Answer:** 18 (9 eggs at $2)\n\nOver 7 days: 126.", True),
    (0, "She sells 9 eggs.\n\nAnswer: 126\n\nCheck: 9 * 2 = 18.", False),            # near-miss: the line is wrong
    (0, "\\boxed{\\$18 \\text{ (that is, 9 \\times 2)}}", True),
    (0, "\\boxed{(9)(2) = 18}", True),
    (0, "\\boxed{16 \\text{ eggs (minus 7)}}", False),                             # near-miss: the box is wrong
    (1206, "So he keeps $4 × 10^4.", True),
    (1206, "The answer is 4 * 10^{4} dollars.", True),
    (1206, "The answer is 4 \\times 10^{5} dollars.", False),                      # near-miss: other exponent
    (0, "The answer is 18 or 19.", False),                                        # hedge
    (0, "\\boxed{18 \\text{ or } 26}", False),                                     # hedge in a box
    (0, "The answer is 18 (or 18.00 dollars).", True),                              # restated, no hedge
    (212, "The answer is 4 1/2 hours.", False),                                   # 4.5, not 4 (gold 5)
    (212, "It takes 11/2 hours, so the answer is 5½.", False),
    (212, "It takes 16.5 / 3 hours; the answer is 10/2.", True),                    # 10/2 = 5
    (212, "The answer is 5 hours (about 5½ with breaks is wrong).", True),
])
def test_gsm8k_turn4_kinds_on_real_problems(problems, idx, text, ok):
    got = _gsm8k(problems, idx, text)
    assert got["correct"] is ok, got


def test_gsm8k_numbers_read_with_what_follows_them():
    assert gsm8k.find_numbers("4 \\times 10^{4} and 7") == [("4 \\times 10^{4}", 40000), ("7", 7)]
    assert [v for _, v in gsm8k.find_numbers("5½ or 4 1/2 or 9/2 on 1/2/2020")][:3] == [Fraction(11, 2), Fraction(9, 2),
                                                                                         Fraction(9, 2)]
    assert gsm8k.extract("The answer is 18 or 26.")[2] == "hedge"


# ---------------------------------------------------------------------------- code on real problems
def _split_answer(prompt_free_def):
    return f"We need math:\n\n{F}python\nimport math\n{F}\n\nThen:\n\n{F}python\n{prompt_free_def}\n{F}\n"


@pytest.mark.parametrize("bench,pid,text,ok", [
    ("humaneval", "HumanEval/2", "1. Code:\n   " + F + "python\n   def truncate_number(number: float) -> float:\n"
     "       return number % 1.0\n   " + F + "\n", True),                            # list item, 3-space indent
    ("humaneval", "HumanEval/2", _split_answer("def truncate_number(number: float) -> float:\n"
                                               "    return number - math.floor(number)"), True),
    ("humaneval", "HumanEval/2", _split_answer("def truncate_number(number: float) -> float:\n"
                                               "    return math.floor(number)"), False),  # near-miss: wrong
    ("humaneval", "HumanEval/2", f"{F}python\ndef truncate_number(number: float) -> float:\n    return number % 1.0\n"
     f"{F}\n\nUsage:\n\n{F}python\nprint(truncate_number(3.5))\nassert False\n{F}\n", True),  # usage never joins
    ("humaneval", "HumanEval/2", "~~~~python\ndef truncate_number(number: float) -> float:\n    '''\n    ~~~\n"
     "    '''\n    return number % 1.0\n~~~~\n", True),                               # tildes, inner shorter fence
    ("mbpp", "mbpp/20", "- Answer:\n\n  " + F + "python\n  def is_woodall(x):\n      k = 1\n"
     "      while k * 2 ** k - 1 <= x:\n          if k * 2 ** k - 1 == x:\n              return True\n"
     "          k += 1\n      return False\n  " + F + "\n", True),
    ("mbpp", "mbpp/20", F + "python\ndef helper(k):\n    return k * 2 ** k - 1\n" + F + "\n\n" + F +
     "python\ndef is_woodall(x):\n    return any(helper(k) == x for k in range(1, 64))\n" + F + "\n", True),
])
def test_code_turn4_kinds_on_real_problems(problems, bench, pid, text, ok):
    p = by_id(problems, bench, pid)
    got = score_records(bench, [p], {pid: text}, WORKERS)[0]
    assert got["correct"] is ok, got["reason"]


def test_fences_as_commonmark_reads_them():
    before, blocks = fence_blocks("x\n````py\na\n```\nb\n````\n~~~\nc\n```\n~~~")
    assert before == "x" and blocks == [("py", "a\n```\nb"), ("", "c\n```")]
    assert fence_blocks("  ```python title=\"a.py\"\n  def f():\n      pass\n  ```")[1] == [("python", "def f():\n    pass")]
    code, how = extract_code(_split_answer("def f():\n    return math.pi"), "f")
    assert how == "fenced+blocks" and code.startswith("import math\n")


def test_a_switched_off_fix_makes_its_verdict_wrong_again(monkeypatch, problems):
    p = by_id(problems, "gsm8k", "gsm8k/0")
    text = "She sells 9 eggs.\n\nAnswer: 18\n\nThat is 126 dollars a week."
    assert gsm8k.score(p, text)["correct"]
    monkeypatch.setenv(fixes.ENV, "gsm8k_answer_line")
    assert not gsm8k.score(p, text)["correct"]
    monkeypatch.setenv(fixes.ENV, "no_such_fix")
    with pytest.raises(ValueError, match="unknown fix"):
        fixes.on("gsm8k_hedge")
