"""GSM8K scorer: numeric answer extraction and comparison with the ``#### N`` gold.

Contract: ``score(problem, completion) -> score record`` (docs/interfaces.md, "Scoring"); ``status`` is
``correct`` | ``wrong``; ``correct`` is the *flexible* verdict (primary score), ``strict_correct`` the
verdict when only an explicit ``\\boxed{}`` or ``#### N`` answer counts (diagnostic column).

Rules (docs/scoring_rules.md §2 "Recommended GSM8K scorer", §10):
1. The completion is cut at EOS markers and stop strings first (case gsm8k-07).
2. Prediction: of the explicit markers -- last non-blank ``\\boxed{}`` (its last number, or the value of
   a lone ``\\frac{a}{b}``), last "the answer is N", last ``#### N`` -- the one written last wins (a
   recited example's "the answer is 6" must not outrank the model's own final ``#### 18``); a marker
   followed by arithmetic states the side of an ``=`` that is a lone number ("the answer is 9 * 2 = 18"
   -> 18, not the operand 9);
   no marker: the last number in the text.
3. Numbers are anchored on digits: ``-?\\d{1,3}(,\\d{3})+`` or ``\\d+``, optional decimals; commas between
   digit groups and LaTeX separators (``{,}``, ``\\,``, ``\\!``, ``\\;``, ``\\:``, ``~``) are dropped,
   so ``8,000`` is 8000
   (cases gsm8k-01/02; OpenCompass reads ``000``); ``$``, ``%`` and unit words around a number are ignored;
   a scale word or suffix right after the digits multiplies (``1.2 million``, ``$890M``, ``5k``; not
   ``5 k`` or ``5km``; ``number_words``, case t3-gsm8k-01). A marker sentence without digits is read
   in number words ("the answer is eighteen").
4. Comparison is numeric with exact decimals (``29.00`` == ``29``, case gsm8k-04; lm-eval #3214).
5. The gold (text after ``#### ``, or a whole ``answer`` text) is normalised the same way: 14 golds
   carry thousands separators and 2 are negative (docs/scoring_rules.md §2).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction

from . import fixes
from .boxed import last_boxed_at
from .number_words import scale_after, word_numbers
from .truncate import truncate_for

__all__ = ["parse_gold", "extract", "score", "score_many", "find_numbers"]

# A minus sign counts only when it is not a binary minus (not preceded by a word char, ')' or ']').
_NUM = re.compile(r"(?<![\w.)\]])(-?)(\d{1,3}(?:,\d{3})+(?!\d)|\d+)(\.\d+)?")
_LATEX_SEP = re.compile(r"(?<=\d)(?:\{,\}|,\\!|\\[,!;:]|\{\\,\}|\\thinspace\s*|\\ |~)(?=\d)")
_ANSWER_IS = re.compile(r"answer\s+is\b[:\s]*", re.IGNORECASE)
_HASHES = re.compile(r"####\s*")
_FRAC = re.compile(r"^\s*(-)?\s*\\[dt]?frac\{(\d+)\}\{([1-9]\d*)\}\s*$")
# "Answer: 18", "**Answer: 18**", "Final Answer: 18 (...)" at the start of a line (turn-4 kind)
_ANSWER_LINE = re.compile(r"^[ \t>*_#-]*(?:final\s+)?answer\s*(?:\*\*|__)?\s*:\s*(?:\*\*|__)?", re.IGNORECASE | re.MULTILINE)
_VULGAR = {"½": (1, 2), "⅓": (1, 3), "⅔": (2, 3), "¼": (1, 4), "¾": (3, 4), "⅕": (1, 5), "⅖": (2, 5), "⅗": (3, 5),
           "⅘": (4, 5), "⅙": (1, 6), "⅚": (5, 6), "⅛": (1, 8), "⅜": (3, 8), "⅝": (5, 8), "⅞": (7, 8)}
_AFTER_VULGAR = re.compile(r" ?([" + "".join(_VULGAR) + "])")
_AFTER_MIXED = re.compile(r"[ \t]+(\d+)/([1-9]\d*)(?![\d/])")  # 4 1/2
_AFTER_SLASH = re.compile(r"/([1-9]\d*)(?![\d/.,])")  # 9/2 (not a date 1/2/2020, not 1/2.5)
_AFTER_POWER = re.compile(r"\s*(?:\\times|\\cdot|×|·|\*|x)\s*10\s*\^\s*\{?\s*([+-]?\d+)\s*\}?")  # 4 \times 10^{4}
_OR_GAP = re.compile(r"[\s$(]*(?:\\text\s*\{\s*)?\bor\b(?:\s*\})?[\s$(]*", re.IGNORECASE)
_PARENTHETICAL = re.compile(r"\([^()]*\)")
HEDGE = object()  # a marker stating two different values ("the answer is 18 or 26"): no answer


def _normalise_text(text: str) -> str:
    text = text.replace("\u2212", "-").replace("\u2013", "-")  # unicode minus / en dash
    text = _LATEX_SEP.sub(",", text)
    text = text.replace(",\\!", ",")
    return text


def find_numbers(text: str) -> list[tuple[str, Fraction]]:
    """All digit-numbers in ``text`` as ``(as written, exact value)`` pairs, in order; a scale word or
    suffix right after the digits multiplies (``1.2 million`` -> 1200000, ``$890M``, ``5k``)."""
    return [(w, v) for w, v, _ in _numbers_with_end(text)]


def _numbers_with_end(text: str) -> list[tuple[str, Fraction, int]]:
    """``find_numbers`` plus the end offset of each number in the normalised text."""
    out = []
    text = _normalise_text(text)
    end = 0
    for m in _NUM.finditer(text):
        if m.start() < end:  # inside the previous number's written form (the 10 and 4 of 4 \times 10^{4})
            continue
        digits = (m.group(1) + m.group(2).replace(",", "") + (m.group(3) or ""))
        try:
            value = Fraction(Decimal(digits))
        except (InvalidOperation, ValueError):  # pragma: no cover - regex guarantees a number
            continue
        value, end = _written_value(text, m, value)
        scale, length = scale_after(text, end)
        end += length
        out.append((text[m.start():end], value * scale, end))
    return out


def _written_value(text: str, m: re.Match, value: Fraction) -> tuple[Fraction, int]:
    """The value of the number ``m`` with what is written right after it, and where that ends: a fraction
    (``5½``, ``4 1/2``, ``9/2``) and a power of ten (``4 \\times 10^{4}``). Turn-4 kinds: read as the whole
    part alone, ``5½`` would score as 5 (inspect_ai #897) and ``4 \\times 10^{4}`` as 4 (moodle-qtype_stack #316)."""
    end, integer = m.end(), m.group(3) is None
    sign = -1 if value < 0 else 1
    if fixes.on("gsm8k_fractions") and integer:
        f = _AFTER_VULGAR.match(text, end)
        mixed = _AFTER_MIXED.match(text, end)
        slash = _AFTER_SLASH.match(text, end)
        if f:
            num, den = _VULGAR[f.group(1)]
            value, end = value + sign * Fraction(num, den), f.end()
        elif mixed and 0 < int(mixed.group(1)) < int(mixed.group(2)):
            value, end = value + sign * Fraction(int(mixed.group(1)), int(mixed.group(2))), mixed.end()
        elif slash:
            value, end = value / int(slash.group(1)), slash.end()
    power = _AFTER_POWER.match(text, end) if fixes.on("gsm8k_sci_notation") else None
    if power:
        value, end = value * Fraction(10) ** int(power.group(1)), power.end()
    return value, end


def _hedged(sentence: str) -> bool:
    """Whether ``sentence`` states two different values joined by "or" ("18 or 26"); the same value restated
    ("18 (or $18.00)") is no hedge. Turn-4 kind (Visual-RFT #79: "A or B" must not earn the reward)."""
    nums = _numbers_with_end(sentence)
    text = _normalise_text(sentence)
    for (_, a, end), (written, b, end_b) in zip(nums, nums[1:]):
        gap = text[end:end_b - len(written)]
        if a != b and _OR_GAP.fullmatch(gap):
            return True
    return False


def _with_words(text: str, allow_one: bool) -> tuple[str, Fraction] | None:
    """The last number-word phrase of ``text`` (``eighteen``, ``twenty-one``); a lone ``one`` only when
    ``allow_one`` (in running prose it is mostly a pronoun: "each one")."""
    words = [(w, v) for w, v, _, _ in word_numbers(text) if allow_one or w.lower() != "one"]
    return words[-1] if words else None


def _fmt(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    return str(Decimal(value.numerator) / Decimal(value.denominator)).rstrip("0").rstrip(".")


def parse_gold(gold: str) -> Fraction:
    """Exact value of a GSM8K gold: ``2,125``, ``-3``, ``#### 8000`` or a full ``answer`` text."""
    if not isinstance(gold, str):
        raise TypeError(f"GSM8K gold must be a str, got {type(gold).__name__}: {gold!r}")
    text = gold.rsplit("####", 1)[1] if "####" in gold else gold
    nums = find_numbers(text)
    if not nums:
        raise ValueError(f"GSM8K gold {gold!r} contains no number")
    return nums[0][1]


def _stated_value(tail: str) -> tuple[str, Fraction] | None:
    """The number a marker ("the answer is", ``####``) states: the first number of its sentence; when
    the marker is followed by arithmetic, the side of an ``=`` that is a lone number, the last such side
    (``9 * 2 = 18`` -> 18, ``18 = 9 * 2`` -> 18)."""
    line = tail.split("\n", 1)[0]
    sentence = re.split(r"\.(?=\s|$)", line, maxsplit=1)[0]
    if fixes.on("gsm8k_hedge") and _hedged(sentence):
        return sentence.strip(), HEDGE
    if "=" in sentence:
        sides = [find_numbers(side) for side in sentence.split("=")]
        lone = [nums[0] for nums in sides if len(nums) == 1]
        if lone:
            return lone[-1]
    nums = find_numbers(sentence) or find_numbers(line)
    if nums:
        return nums[0]
    words = [(w, v) for w, v, _, _ in word_numbers(sentence)]
    return words[0] if words else None


def _boxed_value(box: str) -> tuple[str, Fraction] | None:
    frac = _FRAC.search(box)
    if frac:  # \boxed{\frac{36}{2}}: the value, not the denominator
        sign = -1 if frac.group(1) else 1
        return frac.group(0), sign * Fraction(int(frac.group(2)), int(frac.group(3)))
    box = re.sub(r"\\(?:text|mathrm|textbf|mathbf|mbox)\s*\{([^{}]*)\}", r"\1", box)
    if fixes.on("gsm8k_box_remark"):  # "18 dollars (9 eggs at $2 each)": the remark is not the answer
        bare = _PARENTHETICAL.sub(" ", box)
        box = bare if find_numbers(bare) else box
    if fixes.on("gsm8k_hedge") and _hedged(box):
        return box.strip(), HEDGE
    nums = find_numbers(box)
    return nums[-1] if nums else _with_words(box, allow_one=True)


def extract(completion: str) -> tuple[str | None, Fraction | None, str]:
    """``(as written, value, rule)`` of the predicted answer of an already truncated completion.

    ``rule`` is ``boxed`` | ``answer_is`` | ``answer_line`` | ``hashes`` | ``number_words`` | ``last_number`` |
    ``hedge`` | ``none``. Among the explicit answer markers (last ``\\boxed{}``, last "the answer is", last line
    starting "Answer:" / "**Answer:" / "Final Answer:", last ``####``) the one written *last* wins: an earlier
    recited "the answer is 6" does not outrank the model's own final ``#### 18``. A winning marker that states
    two different values joined by "or" is a hedge: ``(as written, None, "hedge")``, no answer.
    """
    found = []  # (position, written, value, rule)
    box = last_boxed_at(completion)
    if box is not None:
        v = _boxed_value(box[0])
        if v is not None:
            found.append((box[1], *v, "boxed"))
    markers = [("answer_is", _ANSWER_IS), ("hashes", _HASHES)]
    if fixes.on("gsm8k_answer_line"):
        markers.append(("answer_line", _ANSWER_LINE))
    for rule, pattern in markers:
        for m in reversed(list(pattern.finditer(completion))):
            v = _stated_value(completion[m.end():])
            if v is not None:
                found.append((m.start(), *v, rule))
                break
    if found:
        _, written, value, rule = max(found, key=lambda f: f[0])
        return (written, None, "hedge") if value is HEDGE else (written, value, rule)
    nums = _numbers_with_end(completion)
    after = _normalise_text(completion)[nums[-1][2]:] if nums else completion
    words = _with_words(after, allow_one=False)
    if words is not None:  # policy: number words after the last digit-number state the answer
        return words[0], words[1], "number_words"
    if nums:
        return nums[-1][0], nums[-1][1], "last_number"
    return None, None, "none"


def score(problem: dict, completion: str, benchmark: str = "gsm8k") -> dict:
    """Score one completion against ``problem['gold']`` (see module docstring)."""
    gold = parse_gold(problem["gold"])
    text = truncate_for(benchmark, completion)
    written, value, rule = extract(text)
    correct = value is not None and value == gold
    strict = correct and rule in ("boxed", "hashes")
    if rule == "hedge":
        reason = f"hedge: {written!r} states more than one answer; gold {_fmt(gold)}"
    elif value is None:
        reason = f"no number found in the completion; gold {_fmt(gold)}"
    else:
        reason = f"{rule}: {written!r} -> {_fmt(value)} {'==' if correct else '!='} gold {_fmt(gold)}"
    return {
        "id": problem["id"],
        "benchmark": benchmark,
        "correct": bool(correct),
        "extracted": None if value is None else _fmt(value),
        "reason": reason,
        "status": "correct" if correct else "wrong",
        "strict_correct": bool(strict),
    }


def score_many(benchmark: str, problems: list[dict], completions: dict, workers: int) -> list[dict]:
    """Score records for ``problems`` in order (the ``math``-kind scorer interface; no worker needed)."""
    return [score(p, completions[p["id"]], benchmark) for p in problems]
