"""GSM8K grader of lm-evaluation-harness: ``gsm8k.yaml`` (task version 3) ``flexible-extract`` + ``exact_match``.

Contract: the grader protocol of ``repro.scoring.graders`` (``IN_WORKER = False``: ``grade`` runs here).
What it does (the task file's own settings, checked against the installed lm-eval file by the tests): the
last match of ``(-?[$0-9.,]{2,})|(-?[0-9]+)`` in the completion cut at the stop strings (as lm-eval's
``until`` does), its first non-empty group stripped (``RegexFilter(group_select=-1)``), compared by HF
``exact_match`` with the task's ``regexes_to_ignore`` (``,``, ``\\$``, ``(?s).*#### ``, ``\\.$``) and
``ignore_case`` against the dataset's ``answer`` text. Its ``strict-match`` (``#### N`` only) is not used:
our prompt asks for ``\\boxed{}``. Pure Python: nothing to install.
"""

from __future__ import annotations

import re

from ..truncate import truncate_for

__all__ = ["NAME", "TITLE", "SHORT", "IN_WORKER", "problem", "version", "grade", "flexible", "exact_match",
           "FLEXIBLE", "IGNORE"]

NAME = "lm_eval_gsm8k"
TITLE = "lm-evaluation-harness GSM8K grader (gsm8k.yaml v3: flexible-extract, exact_match)"
SHORT = "lm-eval flexible-extract"
IN_WORKER = False

FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
IGNORE = (",", "\\$", "(?s).*#### ", "\\.$")
FALLBACK = "[invalid]"  # lm-eval RegexFilter's fallback


def problem() -> str | None:
    """Always runs (pure Python)."""
    return None


def version() -> dict:
    """The task version and regex this re-implementation follows."""
    return {"lm_eval_gsm8k_yaml": "task version 3.0", "regex": FLEXIBLE.pattern, "regexes_to_ignore": list(IGNORE)}


def flexible(text: str) -> str:
    """lm-eval ``RegexFilter(group_select=-1)`` + ``take_first``: the last match, its first non-empty group,
    stripped; ``[invalid]`` when nothing matches."""
    found = FLEXIBLE.findall(text)
    if not found:
        return FALLBACK
    groups = [g for g in found[-1] if g]
    return groups[0].strip() if groups else FALLBACK


def _normalise(s: str) -> str:
    for pattern in IGNORE:
        s = re.sub(pattern, "", s)
    return s.lower()


def exact_match(pred: str, reference: str) -> bool:
    """HF ``exact_match`` with gsm8k.yaml's ``regexes_to_ignore`` and ``ignore_case``."""
    return _normalise(pred) == _normalise(reference)


def grade(benchmark: str, problems: list[dict], completions: dict, scores: list[dict], workers: int,
          timeout_s: float | None = None) -> list[dict]:
    """One verdict per problem (see module docstring); ``scores``, ``workers``, ``timeout_s`` unused."""
    out = []
    for p in problems:
        reference = (p.get("source") or {}).get("answer") or str(p["gold"])
        pred = flexible(truncate_for(benchmark, completions[p["id"]]))
        out.append({"extracted": pred, "correct": exact_match(pred, reference), "status": "ok",
                    "detail": f"flexible-extract {pred!r} vs {_normalise(reference)!r}"})
    return out
