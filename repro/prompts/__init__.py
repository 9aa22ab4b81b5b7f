"""Versioned prompt templates, one per benchmark: ``build_prompt(benchmark, source) -> Prompt``.

Each benchmark's template file, template number, the fields it reads and its stop strings are declared
in ``repro.benchmarks.<name>``; this module renders them.

Contract (docs/interfaces.md, "Prompts"): ``Prompt.messages`` is a list of chat messages
(``{"role", "content"}``) that the backend renders through the model's chat template;
``Prompt.stop`` lists the stop strings cut from the completion after generation (the scorer cuts them
again, so the cut is idempotent); ``Prompt.template_version`` is ``<benchmark>/v<N>+<sha256[:8] of the
template file>`` and goes into provenance, so any edit of a template changes the recorded version.
``source`` is the original benchmark record (field names as in ``../shared/data/*.jsonl``).

Choices (all zero-shot, single user turn): each benchmark module says which peer prompt it follows and
why (``repro/benchmarks/<name>.py``). Stop strings: the end-of-text / end-of-turn / mask markers of the
LLaDA2 tokenizer (``EOS_MARKERS``: ``<|endoftext|>``, ``<|role_end|>``, ``<|mask|>``, a new ``<role>``
turn) for every benchmark, then the benchmark's declared ones. Not done here: few-shot prompts, system
prompts, chat-template rendering.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import jinja2

from repro import benchmarks

__all__ = ["Prompt", "build_prompt", "template_version", "stop_strings", "EOS_MARKERS"]

_TEMPLATE_DIR = Path(__file__).with_name("templates")

#: Special-token text that ends a completion when a backend did not strip it (docs/engine.md §5).
EOS_MARKERS = ("<|endoftext|>", "<|role_end|>", "<|mask|>", "<role>")


@dataclass(frozen=True)
class Prompt:
    """A rendered prompt: chat messages, stop strings and the template version for provenance."""

    messages: list[dict] = field(default_factory=list)
    stop: list[str] = field(default_factory=list)
    template_version: str = ""


def _declared(benchmark: str) -> benchmarks.Benchmark:
    """The benchmark's declaration (template, prompt fields, stop strings); ValueError if unknown."""
    return benchmarks.get(benchmark)


@lru_cache(maxsize=None)
def _load(benchmark: str) -> tuple[jinja2.Template, str]:
    b = _declared(benchmark)
    text = (_TEMPLATE_DIR / b.template).read_text(encoding="utf-8")
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=False)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]
    return env.from_string(text), f"{benchmark}/v{b.template_number}+{digest}"


def template_version(benchmark: str) -> str:
    """``<benchmark>/v<N>+<sha256[:8]>`` of the template file used for ``benchmark``."""
    return _load(benchmark)[1]


def stop_strings(benchmark: str) -> list[str]:
    """All strings at which a completion for ``benchmark`` is cut (EOS markers first)."""
    return list(EOS_MARKERS) + list(_declared(benchmark).stop)


def build_prompt(benchmark: str, source: dict) -> Prompt:
    """Render the prompt for one original benchmark record ``source`` (see module docstring)."""
    b = _declared(benchmark)
    if not isinstance(source, dict):
        raise TypeError(f"build_prompt({benchmark!r}, source): source must be a dict, got {type(source).__name__}")
    missing = [f for f in b.prompt_fields if f not in source]
    if missing:
        raise ValueError(
            f"build_prompt({benchmark!r}): source record lacks field(s) {missing}; "
            f"it has {sorted(source)} (pass the original record, i.e. problem['source'])"
        )
    template, version = _load(benchmark)
    content = template.render(**source)
    return Prompt(
        messages=[{"role": "user", "content": content}],
        stop=stop_strings(benchmark),
        template_version=version,
    )
