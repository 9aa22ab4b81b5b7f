"""Find the last ``\\boxed{...}`` / ``\\fbox{...}`` / ``\\boxed X`` answer in a text, brace-balanced.

Source: docs/scoring_rules.md §2–§3 and scoring cases math500-06, math500-08, math500-09. A ``[^}]+`` regex
truncates nested braces (``\\boxed{\\frac{1}{2}}`` -> ``\\frac{1``, case math500-08), so braces are
counted (escaped ``\\{`` / ``\\}`` do not count). ``\\boxed 2`` (space, no braces) yields the next token.
Unlike lm-eval's ``last_boxed_only_string`` (lm-eval #3477) the *last* box by position wins, whichever
form it has. An unclosed ``\\boxed{`` is ignored (the previous complete box, if any, is used). A blank
box (``\\boxed{}``, only spaces or LaTeX spacing such as ``\\,`` ``~``) is not an answer and is skipped,
so "... \\boxed{42}. I have put my final answer within \\boxed{}." reads 42 (docs/scoring.md).
"""

from __future__ import annotations

import re

__all__ = ["last_boxed", "last_boxed_at", "all_boxed", "is_blank"]

_BOX = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_SPACING = re.compile(r"\\(?:[,:;! ]|quad|qquad|thinspace|medspace|thickspace|enspace)|~|\s")


_EMPTY_WRAPPER = re.compile(r"\\(?:text|mathrm|mbox|textbf|mathbf)\{\}")


def is_blank(content: str) -> bool:
    """True for box content that holds nothing but whitespace, LaTeX spacing commands, empty braces or
    an empty ``\\text{}``."""
    s = _SPACING.sub("", content)
    while True:
        t = _EMPTY_WRAPPER.sub("", s).replace("{}", "")
        if t == s:
            return not s
        s = t


def _content_at(text: str, pos: int) -> str | None:
    """Content of the box whose command name ends at ``pos``; None if malformed/unclosed."""
    i = pos
    n = len(text)
    while i < n and text[i] in " \t":
        i += 1
    if i < n and text[i] == "{":
        depth = 0
        j = i
        while j < n:
            c = text[j]
            if c == "\\" and j + 1 < n and text[j + 1] in "{}":
                j += 2
                continue
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    return text[i + 1 : j]
            j += 1
        return None
    if i > pos:  # "\boxed 2": a space, then one token up to whitespace or '$'
        m = re.match(r"[^\s$]+", text[i:])
        if m:
            return m.group(0).rstrip(".,;")
    return None


def all_boxed(text: str) -> list[str]:
    """Contents of every well-formed box in ``text``, in order of appearance."""
    out = []
    for m in _BOX.finditer(text):
        c = _content_at(text, m.end())
        if c is not None:
            out.append(c)
    return out


def last_boxed_at(text: str) -> tuple[str, int] | None:
    """``(content stripped, start offset of its command)`` of the last well-formed, non-blank box."""
    for m in reversed(list(_BOX.finditer(text))):
        c = _content_at(text, m.end())
        if c is not None and not is_blank(c):
            return c.strip(), m.start()
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last well-formed, non-blank box in ``text`` (stripped), or None."""
    found = last_boxed_at(text)
    return None if found is None else found[0]
