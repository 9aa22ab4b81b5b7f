"""MATH-500 and GSM8K grader: Math-Verify as its README uses it, on the whole completion.

Contract: the grader protocol of ``repro.scoring.graders`` (``IN_WORKER = True``).
``verify(parse(gold), parse(completion))`` (huggingface/Math-Verify 0.9.0, its default extraction: LaTeX and
plain expressions, boxed answers first, then its "final answer" anchors, then the last expression), the gold
``$``-wrapped for MATH-500 and without thousands separators for GSM8K (the way lighteval's GSM8K and MATH tasks
call it). Why: for GSM8K it is independent of our scorer (regex extraction, exact decimals); for MATH-500 it
is our primary's engine *without* our extraction, normalisations and guards, so every verdict those decide
(a Unicode answer we read, a set we refuse for an interval, or a guard that breaks what Math-Verify did right,
the kind of regression the turn-4 cases began with) is listed. Math-Verify is a dependency of the primary already.
"""

from __future__ import annotations

__all__ = ["NAME", "TITLE", "SHORT", "IN_WORKER", "problem", "version", "prepare", "verdict"]

NAME = "math_verify"
TITLE = "Math-Verify 0.9.0 as its README uses it: verify(parse(gold), parse(whole completion))"
SHORT = "Math-Verify alone"
IN_WORKER = True


def problem() -> str | None:
    """Why it cannot run here, or None."""
    from importlib.util import find_spec

    return None if find_spec("math_verify") else "math-verify is not installed (a dependency of the pipeline)"


def version() -> dict:
    """Package versions."""
    from importlib.metadata import version as v

    return {"math_verify": v("math-verify"), "latex2sympy2_extended": v("latex2sympy2_extended")}


def prepare() -> None:
    """Import Math-Verify (in a worker, before it reports ready)."""
    import math_verify  # noqa: F401


def verdict(benchmark: str, gold: str, completion: str) -> dict:
    """One Math-Verify verdict (module docstring); runs in the grader worker."""
    from math_verify import parse, verify

    g = parse(f"${gold}$" if benchmark == "math500" else gold.replace(",", ""), parsing_timeout=None)
    p = parse(completion, parsing_timeout=None)
    ok = bool(g and p and verify(g, p, timeout_seconds=None))
    pred = str(p[0]) if p else None
    return {"correct": ok, "extracted": pred,
            "detail": f"{pred!r} {'==' if ok else '!='} gold {str(g[0]) if g else None!r}"}
