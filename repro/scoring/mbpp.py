"""MBPP program assembly: extracted code, then ``test_setup_code``, then *all* asserts of ``test_list``.

Contract: ``build_program(source, completion) -> (program, extracted_code, how)`` for an original MBPP
record (``code``, ``test_setup_code``, ``test_list``); execution by ``code.sandbox``.

Sources: docs/scoring_rules.md §5 and cases mbpp-01 (unfenced code + stray closing fence), mbpp-02 (all
three asserts, not only the one shown), mbpp-04 (task 367: code -> test_setup_code -> asserts; lm-eval
and OpenCompass omit the setup code and fail the task for every model). ``challenge_test_list`` is not
run (peers ignore it; report separately if ever needed). Extraction never cuts at a bare ``DONE``
substring and strips quotes only when the code is wrapped in them (see ``code.extract``). The asserts
are hardened (``code.strict_compare``): a returned object whose ``__eq__`` always says True fails them.
The entry point for choosing among fenced blocks (``code.extract``) is the first function the asserts
call that the completion defines.
"""

from __future__ import annotations

import re

from .code.extract import extract_code
from .code.strict_compare import harden
from .truncate import truncate_for

__all__ = ["build_program", "assemble", "reference_program"]


def _check_source(source: dict) -> None:
    missing = [k for k in ("test_list", "test_setup_code") if k not in source]
    if missing:
        raise ValueError(f"MBPP record {source.get('task_id', '?')!r} lacks field(s) {missing}")
    if not isinstance(source["test_list"], list) or not source["test_list"]:
        raise ValueError(f"MBPP record {source.get('task_id', '?')!r}: test_list must be a non-empty list")


def _tests(source: dict) -> str:
    return "\n\n" + (source.get("test_setup_code") or "") + "\n" + harden("\n".join(source["test_list"]))


def build_program(source: dict, completion: str) -> tuple[str, str, str]:
    """``(program, extracted code, how)``; see module docstring."""
    _check_source(source)
    text = truncate_for("mbpp", completion)
    code, how = extract_code(text, _entry_point(source, text))
    return assemble(source, code), code, how


def assemble(source: dict, code: str) -> str:
    """The program for extracted ``code``: the code, ``test_setup_code``, every assert (hardened)."""
    _check_source(source)
    return code + _tests(source)


def _entry_point(source: dict, text: str) -> str | None:
    """The function the asserts call that the completion defines (MBPP names no entry point), or None."""
    for name in re.findall(r"([A-Za-z_]\w*)\s*\(", "\n".join(source["test_list"])):
        if re.search(rf"\bdef\s+{re.escape(name)}\s*\(", text):
            return name
    return None


def reference_program(source: dict) -> str:
    """The reference solution with its setup code and asserts."""
    _check_source(source)
    return source["code"] + _tests(source)
