"""MATH-500 grader: OpenAI's PRM800K grader as packaged in ``mathruler`` (PyPI ``mathruler`` 0.1.0, ``mathruler.grader``).

Contract: the grader protocol of ``repro.scoring.graders`` (``IN_WORKER = True``). ``grade_answer(given, truth)``
of ``openai/prm800k:prm800k/grading/grader.py`` (mathruler's copy): equal after the Hendrycks MATH
normalisation, else its own normalisation (units, ``\\text{}``, ``,\\!``, mixed numbers ``7 3/4``), tuples and
intervals element-wise with matching brackets, unreduced fractions must match exactly, an integer gold needs an
integer answer, else ``sympy.simplify(a - b) == 0`` on a ``pylatexenc`` reading. Extraction: mathruler's
``extract_boxed_content`` (the last ``\\boxed{``; our prompt asks for a box). Runs in a grader worker: its
``simplify`` has no time limit of its own (the worker is killed past ``worker.TIMEOUT_S``).
Why this one: conservative by design (brackets, reduced fractions, integers), a parser (``pylatexenc`` + sympy's
Python parser) that shares nothing with Math-Verify's or Minerva's ANTLR grammars, no antlr4 at all, and a
small, pinned, installable package (mathruler: 38 kB, maintained with EasyR1; it declares no dependencies, so
``sympy`` and ``pylatexenc`` are named in our ``graders`` extra). Qwen2.5-Math's ``math_equal`` is not on PyPI
and needs ``latex2sympy2`` with antlr4 4.7.2 (a third ANTLR version).
"""

from __future__ import annotations

__all__ = ["NAME", "TITLE", "SHORT", "IN_WORKER", "problem", "version", "prepare", "verdict"]

NAME = "prm800k"
TITLE = "OpenAI's PRM800K grader (openai/prm800k grading/grader.py) as packaged in mathruler 0.1.0"
SHORT = "PRM800K (mathruler)"
IN_WORKER = True
PIP = "mathruler==0.1.0"


def problem() -> str | None:
    """Why it cannot run here, or None."""
    from importlib.util import find_spec

    for mod, pip in (("mathruler", PIP), ("pylatexenc", "pylatexenc"), ("sympy", "sympy")):
        if find_spec(mod) is None:
            return f"{mod} is not installed ({pip}, in the graders extra)"
    return None


def version() -> dict:
    """Package versions."""
    from importlib.metadata import version as v

    return {"mathruler": v("mathruler"), "pylatexenc": v("pylatexenc"), "sympy": v("sympy")}


def prepare() -> None:
    """Import the grader (in a worker, before it reports ready)."""
    import mathruler.grader  # noqa: F401


def verdict(benchmark: str, gold: str, completion: str) -> dict:
    """One PRM800K verdict (module docstring); runs in the grader worker."""
    from mathruler.grader import extract_boxed_content, grade_answer

    given = extract_boxed_content(completion)
    if given == "None":  # mathruler's "no box"
        return {"correct": False, "extracted": None, "detail": "no \\boxed{} (mathruler's extraction)"}
    ok = bool(grade_answer(given, gold))
    return {"correct": ok, "extracted": given, "detail": f"boxed: {given!r} {'==' if ok else '!='} {gold!r}"}
