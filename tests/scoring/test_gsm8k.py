"""GSM8K scorer: extraction families (commas, $, .00, units, stop strings) and the real 1,319 golds."""

from fractions import Fraction

import pytest

from repro.scoring import gsm8k, score_records, summarize

from scoring_util import WORKERS


def verdict(output, gold):
    return gsm8k.score({"id": "t", "gold": gold}, output)


@pytest.mark.parametrize("output,gold", [
    # commas between digits (family of cases gsm8k-01/02)
    ("The answer is \\boxed{8,000}.", "8000"),
    ("Total: $1,450,000", "1,450,000"),
    ("so she saves \\$70,000.", "70000"),
    ("\\boxed{8{,}000}", "8000"),
    ("\\boxed{10,\\!080}", "10080"),
    ("That is 8\\,000 dollars", "8000"),
    # trailing .00 / decimals compared numerically (gsm8k-04)
    ("the total cost is $29.00", "29"),
    ("It costs 29.50 - so 29.5", "29.5"),
    # units and symbols around the number
    ("The answer is 18 dollars.", "18"),
    ("He ran 12 km in total.", "12"),
    ("A discount of 25%.", "25"),
    ("#### 42", "42"),
    ("The final answer is: $ 7", "7"),
    # negative golds (2 in the test set) and binary minus
    ("The temperature ends at -10 degrees.", "-10"),
    ("The change is \u221210.", "-10"),
    ("We compute 20-8 = 12", "12"),
    # priorities: boxed beats a later number; "answer is" beats a later number
    ("\\boxed{18} because 3 + 4 = 7", "18"),
    ("The answer is 18. Check: 2 * 9 = 18, 1 + 1 = 2", "18"),
    # stop strings / EOS before extraction (gsm8k-07)
    ("So 18.\n\nQuestion: Tom has 3 apples and buys 5 more?\nAnswer: 8", "18"),
    ("So 18.<|endoftext|>Then 99", "18"),
    ("So 18.<|mask|><|mask|>7", "18"),
    ("She makes 18 dollars.<|role_end|><role>HUMAN</role>and 5", "18"),
    # a boxed fraction is its value (not its denominator)
    ("\\boxed{\\frac{36}{2}}", "18"),
    ("\\boxed{-\\dfrac{20}{2}}", "-10"),
    ("\\boxed{18 \\text{ dollars}}", "18"),
    ("\\boxed{2 \\times 9 = 18}", "18"),
    # gold given as a whole answer text
    ("I get 5", "Natalia sold 48/2 = 24 clips.\n#### 5"),
    # LaTeX spacing as thousands separator (turn-2 family)
    ("She earns $1\\;250 in total", "1250"), ("That makes 12~000 people", "12000"),
    ("\\boxed{1\\:000\\:000}", "1000000"),
    # "the answer is" / "####" followed by arithmetic: the result after the last "=" (t2-gsm8k-01)
    ("Eggs left: 9. The answer is 9 * 2 = 18.", "18"),
    ("The answer is: 3 + 4 + 5 = $12 in all.", "12"),
    ("#### 6 * 7 = 42", "42"),
    ("The answer is 18 (that is 9 * 2).", "18"),
    # the marker written last wins (t2-gsm8k-02): a recited example's "answer is" does not outrank it
    ("Example: 21 - 15 = 6, so the answer is 6.\nOurs: 9 * 2 = 18.\n#### 18", "18"),
    ("Example: #### 6\nOurs: so the answer is 18.", "18"),
    ("Recall: the answer is 6.\nNow 9 * 2 = 18, so \\boxed{18}.", "18"),
    # an empty / blank box after the real one (t2-math500-18 family)
    ("So \\boxed{18}. I put the final answer within \\boxed{}.", "18"),
    ("\\boxed{18} \\boxed{ \\, }", "18"),
])
def test_correct_variants(output, gold):
    r = verdict(output, gold)
    assert r["correct"], r["reason"]
    assert r["status"] == "correct"


@pytest.mark.parametrize("output,gold", [
    ("The answer is \\boxed{8,001}.", "8000"),
    ("The answer is 800.", "8000"),
    ("So it is 18, then 3 + 4 = 7", "18"),           # last number wins without an explicit marker
    ("The answer is 10 degrees.", "-10"),
    ("So 29.01", "29"),
    ("I cannot tell.", "3"),
    ("\\boxed{}", "3"),
    ("\\boxed{\\frac{1}{2}}", "2"),
    ("Values 1,2345 and so on", "12345"),           # not a thousands separator
    ("The answer is 9 * 2 = 18.", "9"),             # the operand is not the answer
    ("#### 18\nA recited example: the answer is 6.", "18"),  # a later marker wins, even a wrong one
    ("Between 2~5 hours", "25"),                    # '~' is a separator only before a 3-digit group
])
def test_wrong_variants(output, gold):
    r = verdict(output, gold)
    assert not r["correct"], r["reason"]
    assert r["status"] == "wrong"


def test_strict_column_and_rules():
    r = verdict("We get 16-3-4=9 and 9*2=18.", "18")
    assert r["correct"] and r["strict_correct"] is False and r["reason"].startswith("last_number")
    r = verdict("so \\boxed{18}", "18")
    assert r["correct"] and r["strict_correct"] is True and r["extracted"] == "18"
    r = verdict("#### 18", "18")
    assert r["strict_correct"] is True


def test_numbers_and_gold_parsing():
    assert [v for _, v in gsm8k.find_numbers("a 1,234.5 b -3 c 4-2")] == [Fraction(12345, 10), -3, 4, 2]
    assert gsm8k.parse_gold("#### 2,125") == 2125
    with pytest.raises(ValueError, match="contains no number"):
        gsm8k.parse_gold("#### none")


SENTENCES = [
    "Adding everything up, she ends up with {g} in total.",
    "Therefore the answer is {g}.",
    "So the final amount is ${g}.",
    "After all the steps we get {g} dollars.",
    "Putting it together: {g}",
    "The result is \\boxed{{{g}}}.",
]


def test_all_real_golds_in_natural_sentences(problems):
    probs = problems("gsm8k")
    assert len(probs) == 1319
    completions = {p["id"]: "Let me work through it step by step.\n" + SENTENCES[i % len(SENTENCES)].format(g=p["gold"])
                   for i, p in enumerate(probs)}
    scores = score_records("gsm8k", probs, completions, WORKERS)
    bad = [s for s in scores if not s["correct"]]
    assert not bad, bad[:5]
    summary = summarize("gsm8k", scores)
    assert summary["correct"] == 1319 and summary["accuracy"] == 100.0
    assert any("," in p["gold"] for p in probs) and any(p["gold"].startswith("-") for p in probs)


def test_real_golds_perturbed_are_wrong(problems):
    probs = problems("gsm8k")
    for delta in (1, -1):
        comps = {p["id"]: f"The answer is {gsm8k.parse_gold(p['gold']) + delta}." for p in probs}
        assert not any(s["correct"] for s in score_records("gsm8k", probs, comps, WORKERS))
    comps = {p["id"]: f"The answer is {-gsm8k.parse_gold(p['gold'])}." for p in probs}
    flipped = [s for s, p in zip(score_records("gsm8k", probs, comps, WORKERS), probs) if s["correct"]]
    assert all(gsm8k.parse_gold(p["gold"]) == 0 for p in probs if p["id"] in {s["id"] for s in flipped})
