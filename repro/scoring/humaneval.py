"""HumanEval program assembly: prompt + completion (+ fence handling) + test + ``check(entry_point)``.

Contract: ``build_program(source, completion) -> (program, extracted_code, how)`` for an original
HumanEval record ``source`` (``prompt``, ``entry_point``, ``test``); execution and verdicts are done by
``code.sandbox`` through ``repro.scoring.score_records``.

Sources: openai/human-eval ``execution.py`` (program = prompt + completion + "\\n" + test + "\\n" +
``check(entry_point)``), docs/scoring_rules.md §4 "Recommended HumanEval scorer", cases humaneval-01..08.
- The completion is cut at EOS markers first; code comes from ``code.extract`` (fences with or without
  a tag, unclosed allowed; the first block that defines the entry point wins).
- If the code defines ``def <entry_point>(`` at top level (a restated function), the prompt is *not*
  duplicated: the program is the prompt's text before its ``def <entry_point>`` (imports, helper
  functions such as ``is_palindrome`` in HumanEval/10) + the code.
- Otherwise the code is a body continuation: prompt + code; a fenced body written without indentation
  is indented by four spaces (a fenced body must never be concatenated raw, case humaneval-07).
- The test code is hardened (``code.strict_compare``): its comparisons cannot be faked by the returned
  objects (an ``__eq__`` that always says True).
"""

from __future__ import annotations

import re

from .code.extract import defines, extract_code
from .code.strict_compare import harden
from .truncate import truncate_for

__all__ = ["build_program", "assemble", "canonical_program"]


def _check_source(source: dict) -> None:
    missing = [k for k in ("prompt", "entry_point", "test") if k not in source]
    if missing:
        raise ValueError(f"HumanEval record {source.get('task_id', '?')!r} lacks field(s) {missing}")


def _tests(source: dict) -> str:
    return "\n\n" + harden(source["test"]) + "\n" + f"check({source['entry_point']})\n"


def build_program(source: dict, completion: str) -> tuple[str, str, str]:
    """``(program, extracted code, how)``; see module docstring."""
    _check_source(source)
    prompt, entry = source["prompt"], source["entry_point"]
    text = truncate_for("humaneval", completion)
    # An unfenced body continues the prompt; a restated function stands alone.
    restated = defines(text, entry)
    code, how = extract_code(text, entry, context="" if restated else prompt)
    program, how = assemble(source, code, how)
    return program, code, how


def assemble(source: dict, code: str, how: str = "raw") -> tuple[str, str]:
    """``(program with its tests, how)`` for extracted ``code`` (module docstring: a restated function stands
    alone after the prompt's imports, a body continues the prompt); ``how`` gains ``+restated`` /
    ``+indented``. Also used by the independent extraction check (``graders/commonmark_code.py``)."""
    _check_source(source)
    prompt, entry = source["prompt"], source["entry_point"]
    if defines(code, entry):
        m = re.search(rf"^(?:async\s+)?def\s+{re.escape(entry)}\s*\(", prompt, re.MULTILINE)
        head = prompt[: m.start()] if m else ""
        program = head + "\n" + code
        how += "+restated"
    else:
        body = code
        first = next((ln for ln in body.split("\n") if ln.strip()), "")
        if how != "raw" and first and not first.startswith((" ", "\t")):
            body = "\n".join(("    " + ln) if ln.strip() else ln for ln in body.split("\n"))
            how += "+indented"
        program = prompt + body
    return program + _tests(source), how


def canonical_program(source: dict) -> str:
    """The reference program: prompt + canonical_solution + tests (what human-eval checks)."""
    _check_source(source)
    return source["prompt"] + source["canonical_solution"] + _tests(source)
