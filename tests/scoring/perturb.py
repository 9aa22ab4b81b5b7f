"""Deterministic wrong answers derived from a MATH-500 gold: off by one, sign flipped, wrong fraction,
another word / choice letter.

Used by the acceptance tests (docs/scoring_rules.md §10: "the same answers perturbed ... are judged
wrong"). Only golds of a recognised simple shape get each perturbation: an integer, a decimal, ``\\frac{a}{b}`` /
``\\dfrac{a}{b}`` with an optional sign, or a lone ``\\text{word}``; other golds are skipped.
"""

from __future__ import annotations

import re

_INT = re.compile(r"^-?\d+$")
_DEC = re.compile(r"^-?\d+\.\d+$")
_FRAC = re.compile(r"^(-?)\\[dt]?frac\{(-?\d+)\}\{(\d+)\}$")


def off_by_one(gold: str) -> str | None:
    g = gold.strip()
    if _INT.match(g):
        return str(int(g) + 1)
    m = _FRAC.match(g)
    if m:
        return f"{m.group(1)}\\frac{{{int(m.group(2)) + 1}}}{{{m.group(3)}}}"
    return None


def sign_flipped(gold: str) -> str | None:
    g = gold.strip()
    if (_INT.match(g) or _DEC.match(g) or _FRAC.match(g)) and re.search(r"[1-9]", g):
        return g[1:] if g.startswith("-") else "-" + g
    return None


def wrong_fraction(gold: str) -> str | None:
    m = _FRAC.match(gold.strip())
    if m and m.group(2).lstrip("-") != m.group(3):
        return f"{m.group(1)}\\frac{{{m.group(3)}}}{{{m.group(2)}}}"
    return None


_WORD = re.compile(r"^\\text\{\s*(\(?)([A-Za-z]+)(\)?)\s*\}$")


def other_word(gold: str) -> str | None:
    """``\\text{(C)}`` -> ``\\text{(A)}``; ``\\text{east}`` -> ``\\text{north}`` (word and choice answers)."""
    m = _WORD.match(gold.strip())
    if not m:
        return None
    if len(m.group(2)) == 1:
        return f"\\text{{{m.group(1)}{'A' if m.group(2) != 'A' else 'B'}{m.group(3)}}}"
    return "\\text{north}" if m.group(2).lower() != "north" else "\\text{south}"


PERTURBATIONS = {"off_by_one": off_by_one, "sign_flipped": sign_flipped, "wrong_fraction": wrong_fraction,
                 "other_word": other_word}
