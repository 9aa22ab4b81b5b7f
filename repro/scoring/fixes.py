"""Named switches for the scoring fixes of the turn-4 kinds, for one diagnostic only.

Contract: ``on(name) -> bool`` is True unless ``name`` is listed in the environment variable
:data:`ENV` (comma-separated; worker processes inherit it); ``FIXES`` maps each name to the kind it
fixes (docs/scoring_rules.md). ``disabled() -> list[str]`` names the switched-off fixes;
``python -m repro.scoring score`` refuses to run while any is (a table never rests on a disabled fix).
``on`` raises ``ValueError`` for a name not in ``FIXES`` (a typo must not silently enable nothing).

Why: the grader-coverage measure (docs/scoring.md "Independent graders") counts how many of the verdicts a fix repairs the independent
graders would list, had the fix not been made (``scripts/grader_coverage.py``): each fix is switched
off in turn, on the case files only.
"""

from __future__ import annotations

import os

__all__ = ["ENV", "FIXES", "on", "disabled"]

ENV = "REPRO_SCORING_DISABLE"

FIXES = {
    # MATH-500 (math.py, math_forms.py)
    "math_connectives": "a list or alternatives joined by \\text{ and } / \\text{ or } (Math-Verify #14)",
    "math_set_vs_ordered": "a set answer never equals an interval or ordered-tuple gold (Math-Verify #10)",
    "math_repeating_decimal": "0.\\overline{3}, 0.333\\ldots as the exact repeating decimal",
    "math_unicode": "Unicode mathematics: √, superscripts, vulgar fractions, °, π (inspect_ai #897)",
    "math_e_notation": "6.72e-5 as E-notation unless the gold uses Euler's number (Numbas #1053)",
    "math_roman_constant": "\\mathrm{e}, \\mathrm{i} after a number are constants, not units",
    # GSM8K (gsm8k.py)
    "gsm8k_answer_line": "an 'Answer: 18' / '**Answer: 18**' line is an answer marker (azureml-assets #5274)",
    "gsm8k_box_remark": "a parenthetical remark inside a box is not the answer (evalscope #906)",
    "gsm8k_sci_notation": "4 \\times 10^{4} is 40000 (moodle-qtype_stack #316)",
    "gsm8k_hedge": "'the answer is 18 or 26' names no single answer (Visual-RFT #79)",
    "gsm8k_fractions": "5½, 4 1/2 and 9/2 read as their value, not their whole part (inspect_ai #897)",
    # HumanEval / MBPP (code/extract.py)
    "code_fence_indent": "a fenced block nested in a list item loses the list's indentation (CommonMark)",
    "code_fence_length": "a fence closes only with the same character, at least as long (CommonMark 4.5)",
    "code_split_blocks": "imports and helpers of the other code blocks join the defining block",
}


def disabled() -> list[str]:
    """The fixes named in :data:`ENV`, in ``FIXES`` order; ValueError for an unknown name."""
    names = [n.strip() for n in os.environ.get(ENV, "").split(",") if n.strip()]
    unknown = [n for n in names if n not in FIXES]
    if unknown:
        raise ValueError(f"{ENV} names unknown fix(es) {unknown}; known: {', '.join(FIXES)}")
    return [n for n in FIXES if n in names]


def on(name: str) -> bool:
    """Whether fix ``name`` is in force (always, outside the coverage diagnostic)."""
    if name not in FIXES:
        raise ValueError(f"unknown scoring fix {name!r}; known: {', '.join(FIXES)}")
    return name not in disabled()
