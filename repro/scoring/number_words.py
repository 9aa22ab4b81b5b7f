"""English number words and scale words: ``eighteen``, ``twenty-one``, ``one hundred and five``, ``1.2 million``.

Contract:
- ``word_numbers(text) -> [(as written, Fraction, start, end)]``: every maximal phrase of number words in
  ``text`` (case-insensitive; parts joined by spaces or hyphens, ``and`` only after ``hundred`` or a
  scale word), in order. A phrase that is not a well-formed number (``two three``) is split where it
  breaks.
- ``scale_after(text, pos) -> (multiplier, length)``: the scale word right after a digit-number that ends
  at ``pos``: a word ``thousand|million|billion|trillion`` after optional spaces, or a suffix written
  against the digits (``5k``, ``$890M``, ``2bn``, also ``2.5 bn``) and not followed by a letter (``5km``, ``5 k`` are
  units, not scales). ``(1, 0)`` when none.

Sources: scoring cases t3-gsm8k-01 (tool-eval-bench #100: "890 million" / "$890M" vs "890,000,000") and
t3-gsm8k-04 (openai/evals PR #297: an answer written "eighteen"); docs/scoring_rules.md §2.
"""

from __future__ import annotations

import re
from fractions import Fraction

__all__ = ["word_numbers", "scale_after", "SCALES"]

_UNITS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen".split())}
_TENS = {w: 10 * i for i, w in enumerate("_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()) if i >= 2}
SCALES = {"thousand": 10**3, "million": 10**6, "billion": 10**9, "trillion": 10**12}
_SUFFIX = {"k": 10**3, "m": 10**6, "b": 10**9, "bn": 10**9}
_WORD = re.compile(r"[A-Za-z]+")
_SCALE_WORD = re.compile(r"\s*(" + "|".join(SCALES) + r")\b", re.IGNORECASE)
_SCALE_SUFFIX = re.compile(r"(?:\s*(bn)|([kKMB]))(?![A-Za-z])")  # "bn" is never a unit: a space is fine


def scale_after(text: str, pos: int) -> tuple[int, int]:
    """See module docstring."""
    m = _SCALE_SUFFIX.match(text, pos) or _SCALE_WORD.match(text, pos)
    if not m:
        return 1, 0
    word = next(g for g in m.groups() if g).lower()
    return (SCALES.get(word) or _SUFFIX[word]), m.end() - pos


def _kind(w: str) -> str | None:
    if w in _UNITS:
        return "unit"
    if w in _TENS:
        return "tens"
    if w == "hundred":
        return "hundred"
    if w in SCALES:
        return "scale"
    return None


def word_numbers(text: str) -> list[tuple[str, Fraction, int, int]]:
    """See module docstring."""
    out: list[tuple[str, Fraction, int, int]] = []
    state = None  # running phrase: dict(start, end, total, current, last kind, and_ok)

    def close():
        nonlocal state
        if state is not None:
            out.append((text[state["start"]:state["end"]], Fraction(state["total"] + state["current"]),
                        state["start"], state["end"]))
        state = None

    for m in _WORD.finditer(text):
        w = m.group(0).lower()
        kind = _kind(w)
        if (w == "and" and state is not None and state["last"] in ("hundred", "scale")
                and re.fullmatch(r"[ \t]+", text[state["end"]:m.start()])):
            state["and_at"] = m.end()
            continue
        if kind is None:
            close()
            continue
        if state is not None:
            gap_ok = re.fullmatch(r"[ \t]+|-" if "and_at" not in state else r"[ \t]+",
                                  text[state.get("and_at", state["end"]):m.start()]) is not None
            last, cur = state["last"], state["current"]
            fits = gap_ok and (
                (kind == "unit" and (last == "tens" or last in ("hundred", "scale")) and cur % 10 == 0
                 and (last != "tens" or _UNITS[w] < 10))
                or (kind == "tens" and last in ("hundred", "scale") and cur % 100 == 0)
                or (kind == "hundred" and last in ("unit", "tens") and 0 < cur < 100)
                or (kind == "scale" and last in ("unit", "tens", "hundred") and cur > 0))
            if not fits:
                close()
        if state is None:
            if kind == "scale":
                continue  # "a million" without a count: not read
            state = {"start": m.start(), "end": m.end(), "total": 0, "current": 0, "last": None}
        if kind == "unit":
            state["current"] += _UNITS[w]
        elif kind == "tens":
            state["current"] += _TENS[w]
        elif kind == "hundred":
            state["current"] = (state["current"] or 1) * 100
        else:
            state["total"] += state["current"] * SCALES[w]
            state["current"] = 0
        state["last"], state["end"] = kind, m.end()
        state.pop("and_at", None)
    close()
    return out
