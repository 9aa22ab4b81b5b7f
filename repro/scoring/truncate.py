"""Cut a raw completion at the first end-of-sequence marker or stop string, before any extraction.

Diffusion decoders fill their whole generation window; whatever follows the first EOS / end-of-turn /
mask marker or a stop string (e.g. an invented follow-up ``Question:``, scoring case gsm8k-07) is not
part of the answer. LLaDA / Fast-dLLM apply the task's ``until`` strings after generation the same way
(docs/scoring_rules.md §2 and §6). The stop list comes from ``repro.prompts.stop_strings`` so the scorer
and the prompt agree; cutting twice is harmless (idempotent).
"""

from __future__ import annotations

from repro.prompts import stop_strings

__all__ = ["truncate", "truncate_for"]


def truncate(text: str, stops) -> str:
    """``text`` up to (excluding) the earliest occurrence of any string in ``stops``."""
    if not isinstance(text, str):
        raise TypeError(f"completion must be a str, got {type(text).__name__}")
    cut = len(text)
    for s in stops:
        if s:
            i = text.find(s)
            if 0 <= i < cut:
                cut = i
    return text[:cut]


def truncate_for(benchmark: str, text: str) -> str:
    """Cut ``text`` at the EOS markers and stop strings of ``benchmark``'s prompt."""
    return truncate(text, stop_strings(benchmark))
