"""MATH-500 scorer: last-boxed answer extraction and math-verify equivalence with exactness guards.

Contract: ``extract(completion) -> (answer | None, rule)`` and ``equivalent(gold, pred) -> dict`` (the
latter is what ``verify_worker`` runs inside a separate process, never in the caller);
``score_many(benchmark, problems, completions, workers)`` scores a batch through the worker pool (what
``repro.scoring.score_records("math500", ...)`` calls). Status ``correct`` | ``wrong`` | ``timeout`` | ``error``;
``strict_correct`` is true only when the answer came from a ``\\boxed{}``/``\\fbox{}``.

Sources: docs/scoring_rules.md §3 "Recommended MATH-500 scorer" and the math500-* scoring cases.
1. Cut at EOS / stop strings; take the last balanced, non-blank ``\\boxed{...}`` (also ``\\fbox``,
   ``\\boxed 2``; cases math500-06/08/09; an empty ``\\boxed{}`` after the answer is skipped); fallback
   the last "final answer is X" / "Final Answer: X", then the last "the answer is X" (case t3-math500-13);
   otherwise no answer (wrong, logged). The box outranks a later unboxed statement: the prompt asks for
   the box (docs/scoring.md).
2. Gold = the ``answer`` field (never the last box of ``solution``: 8 solutions box two forms).
3. Primary verdict: Math-Verify 0.9.0, ``verify(parse("$gold$"), parse("$pred$"))`` -- gold first, the
   order matters. It handles ``\\text{}`` (math500-02/16), ``^\\circ`` (math500-13), ``10,\\!080``,
   LaTeX mixed numbers, tuples/intervals element-wise (math500-12) and ``\\pm`` as a set (math500-04).
   Before parsing, both sides get: LaTeX spacing between digit groups dropped (``11\\,111\\,100``,
   Math-Verify reads a product), and a plain-text mixed number ``15 39/40`` as a whole answer rewritten
   ``\\frac{639}{40}`` (Math-Verify reads ``15*39/40``; PRM800K's normaliser does the same rewrite).
4. Guards against known Math-Verify false positives (re-checked on 0.9.0):
   - malformed ``\\sqrt(2)`` is parsed as nothing, so ``4\\sqrt(2)`` == 4 (math500-01): ``\\sqrt(x)`` is
     rewritten to ``\\sqrt{x}`` before parsing;
   - float rounding equates tiny exact numbers (``1/2004!`` vs ``1/2006!``, ``1/2^99`` vs ``1/2^98``):
     when both sides are exact numbers (no Float, no free symbol) a True verdict must also pass an exact
     sympy check ``(gold - pred) == 0``; element-wise for tuples of the same length.
   A prediction written as a decimal approximation of an exact gold (``1.41421356`` for ``\\sqrt{2}``) is
   left to Math-Verify's rounding (accepted), as peers do. A percent sign on one side only
   (``10\\%`` vs ``10``) is dropped and the numbers compared again (PRM800K/Hendrycks strip ``\\%``;
   Math-Verify alone reads it as /100 and says unequal).
5. Turn-3 kinds (``math_normalize``; docs/scoring_rules.md §3, items 5-8): plain-text maths and wrapped numbers
   are rewritten before parsing; an option-letter gold is compared by letter; a contradicting unit word is
   wrong; a True verdict from a parse that did not read the whole gold or answer falls back to a
   normalised string comparison (case t3-math500-01, Math-Verify PR #82).
6. Math-Verify's own SIGALRM timeouts are disabled (they raise outside the main thread, Math-Verify
   #50/#55, case math500-05); the hard timeout is enforced by killing the worker process.
"""

from __future__ import annotations

import re

from . import fixes
from .boxed import last_boxed
from .math_forms import connectives_to_commas, e_notation, repeating_to_fraction, unicode_to_latex, uses_euler
from .math_normalize import accounts_for, contradicts, mc_letter, plain_to_latex, strip_unit, unit_of

__all__ = ["extract", "prepare", "equivalent", "score_many"]

_FINAL = re.compile(r"final answer(?:\s+is\b|\s*\**\s*:)[\s*:]*", re.IGNORECASE)
# Unboxed "The answer is 42 because ..." (policy of case t3-math500-13): a fallback after "final answer".
_ANSWER_IS = re.compile(r"\banswer\s+is\b[\s*:]*", re.IGNORECASE)
_PROSE_END = re.compile(r"[.;,!?](?:\s|$)|\s+(?:because|since|as|so|which|and|for|from|when|where|if)\b",
                        re.IGNORECASE)
# LaTeX spacing used as a thousands separator inside a number (``11\,111\,100``, ``1~000``): dropped
# before Math-Verify, which otherwise reads ``11\,111`` as a product.
_LATEX_THOUSANDS = re.compile(r"(?<=\d)(?:\\[,!;:]|\\thinspace|~|\\ )+\s*(?=\d{3}(?!\d))")
# A plain-text mixed number as the whole answer (``15 39/40``, optional unit in ``\text{}``).
_MIXED = re.compile(r"^(-)?\s*(\d+)\s+(\d+)\s*/\s*(\d+)(\s*\\(?:text|mbox|mathrm)\{[^{}]*\})?$")


def extract(completion: str) -> tuple[str | None, str]:
    """``(answer, rule)`` from an already truncated completion; rule: boxed | final_answer | answer_is |
    none (the box first, then the last "final answer is X", then the last "the answer is X")."""
    box = last_boxed(completion)
    if box is not None and box.strip():
        return box.strip(), "boxed"
    matches = list(_FINAL.finditer(completion))
    if matches:
        tail = completion[matches[-1].end():].split("\n", 1)[0].strip().strip("*").strip()
        tail = re.sub(r"\.\s*(?:I hope it is correct\.?)?$", "", tail).strip()
        if tail.startswith("$") and tail.endswith("$") and len(tail) > 1:
            tail = tail.strip("$").strip()
        if tail:
            return tail, "final_answer"
    matches = list(_ANSWER_IS.finditer(completion))
    if matches:
        stated = _stated(completion[matches[-1].end():])
        if stated:
            return stated, "answer_is"
    return None, "none"


def _stated(tail: str) -> str | None:
    """What an unboxed "the answer is X" states: a ``$...$`` / ``\\(...\\)`` formula right after the
    marker, else the text up to the end of the sentence or the first prose word ("because", "since")."""
    line = tail.split("\n", 1)[0].strip()
    m = re.match(r"\$\$?([^$]+)\$|\\\((.+?)\\\)", line)
    if m:
        return (m.group(1) or m.group(2)).strip() or None
    line = _PROSE_END.split(line, maxsplit=1)[0].strip().rstrip(".,;:").strip()
    return line or None


def _fix_sqrt_parens(s: str) -> str:
    """``\\sqrt(x)`` -> ``\\sqrt{x}`` with balanced parentheses (math500-01 family)."""
    out = []
    i = 0
    while True:
        j = s.find("\\sqrt(", i)
        if j < 0:
            out.append(s[i:])
            return "".join(out)
        k = j + len("\\sqrt(")
        depth = 1
        while k < len(s) and depth:
            depth += {"(": 1, ")": -1}.get(s[k], 0)
            k += 1
        if depth:  # unbalanced: leave as is
            out.append(s[i:])
            return "".join(out)
        out.append(s[i:j] + "\\sqrt{" + s[j + 6 : k - 1] + "}")
        i = k


def _mixed_number(s: str) -> str:
    """``15 39/40`` -> ``\\frac{639}{40}`` (whole part plus a proper fraction, as PRM800K reads
    ``7 3/4``); Math-Verify would read the space as a product (``15*39/40``). Other text unchanged."""
    m = _MIXED.match(s.strip())
    if not m:
        return s
    whole, num, den = int(m.group(2)), int(m.group(3)), int(m.group(4))
    if not 0 < num < den:
        return s
    return f"{m.group(1) or ''}\\frac{{{whole * den + num}}}{{{den}}}{m.group(5) or ''}"


def prepare(answer: str, e_is_notation: bool = False) -> str:
    """Text handed to Math-Verify's parser: Unicode mathematics as LaTeX, malformed-LaTeX fixes, repeating
    decimals as fractions, list words as commas, ``6.72e-5`` as E-notation when ``e_is_notation`` (the gold
    does not use Euler's number), LaTeX thousands spacing dropped, a plain mixed number rewritten as a
    fraction, unescaped ``$`` removed, ``$``-wrapped (``math_forms``; docs/scoring_rules.md §3)."""
    s = answer.strip()
    if fixes.on("math_unicode"):
        s = unicode_to_latex(s)
    s = _fix_sqrt_parens(plain_to_latex(s))
    if fixes.on("math_repeating_decimal"):
        s = repeating_to_fraction(s)
    if fixes.on("math_connectives"):
        s = connectives_to_commas(s)
    if e_is_notation and fixes.on("math_e_notation"):
        s = e_notation(s)
    s = re.sub(r"(?<!\\)\$", "", s)
    s = _LATEX_THOUSANDS.sub("", s)
    s = _mixed_number(s)
    return "$" + s + "$"


def _has_percent(s: str) -> bool:
    return "%" in s


def _drop_percent(s: str) -> str:
    return re.sub(r"\\?%", "", s)


def _exact_mismatch(g, p) -> bool:
    """True when ``g`` and ``p`` are exact numbers (or same-length tuples of them) that differ."""
    import sympy

    if isinstance(g, sympy.Tuple) and isinstance(p, sympy.Tuple):
        return len(g) == len(p) and any(_exact_mismatch(a, b) for a, b in zip(g, p))
    if not (isinstance(g, sympy.Expr) and isinstance(p, sympy.Expr)):
        return False
    if g.free_symbols or p.free_symbols or g.atoms(sympy.Float) or p.atoms(sympy.Float):
        return False
    if not (g.is_number and p.is_number):
        return False
    diff = sympy.simplify(g - p)
    return diff.is_zero is False


def _set_for_ordered(g, p) -> bool:
    """True when the answer is a set (a bare or braced list) and the gold an interval, a union of intervals
    or an ordered tuple: Math-Verify compares them element-wise in written order (case t4-math500-06/08,
    Math-Verify #10); a list never says which end is open nor which element comes first."""
    import sympy

    return isinstance(p, sympy.FiniteSet) and isinstance(g, (sympy.Interval, sympy.Union, sympy.Tuple))


def _norm_str(s: str) -> str:
    """Normalised string form for the string comparison (no parse, or a parse that dropped a part)."""
    s = re.sub(r"\\[dt]frac", r"\\frac", s)
    s = re.sub(r"\\(?:left|right|!|,|;|:|displaystyle)|\\(?:text|mathrm|textbf|mathbf|mbox)\{([^{}]*)\}|\s|\$",
               r"\1", s)
    return s.lower().rstrip(".")


def equivalent(gold: str, pred: str) -> dict:
    """Math-Verify verdict plus guards; runs in the worker process (imports math_verify lazily).

    Before Math-Verify: a multiple-choice gold (``(C)``) is compared by option letter; a unit word that
    contradicts the gold's unit makes the answer wrong (a missing unit does not). After it: a True
    verdict from a parse that did not account for the whole gold or answer (``accounts_for``) is
    replaced by a normalised string comparison (case t3-math500-01, Math-Verify PR #82)."""
    from math_verify import parse, verify

    gl = mc_letter(gold, gold=True)
    pl = mc_letter(pred) if gl else None
    if gl and pl:
        return {"gold_parsed": gl, "pred_parsed": pl, "equal": gl == pl, "detail": "multiple-choice letter"}
    gu, pu = unit_of(gold), unit_of(pred)
    if contradicts(gu, pu):
        return {"gold_parsed": None, "pred_parsed": None, "equal": False,
                "detail": f"unit {pu!r} contradicts the gold's unit {gu!r}"}
    e_notation_ok = not uses_euler(gold)  # policy: 6.72e-5 is E-notation unless the gold uses Euler's e
    gs, ps = prepare(strip_unit(gold), e_notation_ok), prepare(strip_unit(pred), e_notation_ok)
    g = parse(gs, parsing_timeout=None)
    p = parse(ps, parsing_timeout=None)
    info = {"gold_parsed": str(g[0]) if g else None, "pred_parsed": str(p[0]) if p else None}
    if not g:
        # Math-Verify could not read the gold: fall back to a normalised string comparison.
        eq = _norm_str(gold) == _norm_str(pred)
        return {**info, "equal": eq, "detail": "gold not parseable by math-verify; string comparison"}
    if not p:
        return {**info, "equal": False, "detail": "prediction not parseable by math-verify"}
    whole = accounts_for(gs, g) and accounts_for(ps, p)
    eq = bool(verify(g, p, timeout_seconds=None))
    detail = "math-verify"
    if eq and not whole:
        eq = _norm_str(gold) == _norm_str(pred)
        return {**info, "equal": eq,
                "detail": "math-verify parse did not account for the whole answer; string comparison"}
    if not eq and _has_percent(gold) != _has_percent(pred):
        # "10\\%" vs "10": Math-Verify reads % as /100; PRM800K and Hendrycks strip it. Accept when the
        # numbers agree once the percent sign is dropped from the side that has it.
        g2 = parse(prepare(_drop_percent(gold)), parsing_timeout=None)
        p2 = parse(prepare(_drop_percent(pred)), parsing_timeout=None)
        if g2 and p2 and verify(g2, p2, timeout_seconds=None) and not _exact_mismatch(g2[0], p2[0]):
            return {**info, "equal": True, "detail": "math-verify after dropping the percent sign"}
    if eq and fixes.on("math_set_vs_ordered") and _set_for_ordered(g[0], p[0]):
        return {**info, "equal": False,
                "detail": "math-verify said equal, but a set answers an interval or ordered-tuple gold"}
    if eq and _exact_mismatch(g[0], p[0]):
        same_without_percent = False
        if _has_percent(gold) or _has_percent(pred):  # Math-Verify equates 10\% and 10 on purpose
            g2 = parse(prepare(_drop_percent(gold)), parsing_timeout=None)
            p2 = parse(prepare(_drop_percent(pred)), parsing_timeout=None)
            same_without_percent = bool(g2 and p2 and not _exact_mismatch(g2[0], p2[0]))
        if not same_without_percent:
            eq = False
            detail = "math-verify said equal but the exact values differ (float-rounding guard)"
    return {**info, "equal": eq, "detail": detail}


def score_many(benchmark: str, problems: list[dict], completions: dict, workers: int) -> list[dict]:
    """Score records for ``problems`` in order: extraction here, equivalence in ``workers`` Math-Verify
    worker processes (``verify_worker``), called from as many threads."""
    from concurrent.futures import ThreadPoolExecutor

    from .truncate import truncate_for
    from .verify_worker import get_pool  # lazy: the worker process imports this module

    pool = get_pool(workers)

    def one(p):
        text = truncate_for(benchmark, completions[p["id"]])
        answer, rule = extract(text)
        rec = {"id": p["id"], "benchmark": benchmark, "extracted": answer, "strict_correct": False}
        if answer is None:
            return {**rec, "correct": False, "status": "wrong",
                    "reason": f"no \\boxed{{}} or 'final answer is' in the completion; gold {p['gold']!r}"}
        v = pool.check(str(p["gold"]), answer)
        ok = v["status"] == "ok" and bool(v["equal"])
        status = {"ok": "correct" if ok else "wrong"}.get(v["status"], v["status"])
        reason = (f"{rule}: {answer!r} {'==' if ok else '!='} gold {p['gold']!r} "
                  f"[{v['detail']}; parsed gold={v.get('gold_parsed')!r} pred={v.get('pred_parsed')!r}]")
        return {**rec, "correct": ok, "status": status, "reason": reason, "strict_correct": ok and rule == "boxed"}

    with ThreadPoolExecutor(max_workers=workers) as ex:
        return list(ex.map(one, problems))
