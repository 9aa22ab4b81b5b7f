"""Versioned prompt templates, one per benchmark: ``build_prompt(benchmark, source) -> Prompt``.

Contract (docs/interfaces.md, "Prompts"): ``Prompt.messages`` is a list of chat messages
(``{"role", "content"}``) that the backend renders through the model's chat template;
``Prompt.stop`` lists the stop strings cut from the completion after generation (the scorer cuts them
again, so the cut is idempotent); ``Prompt.template_version`` is ``<benchmark>/v<N>+<sha256[:8] of the
template file>`` and goes into provenance, so any edit of a template changes the recorded version.
``source`` is the original benchmark record (field names as in ``../shared/data/*.jsonl``).

Choices (all zero-shot, single user turn; sources in ``../shared/reference/scoring.md``):

- ``gsm8k``, ``math500``: ``{question|problem}\\nPlease reason step by step, and put your final answer
  within \\boxed{}.`` -- the OpenCompass ``math_0shot_gen_11c4b5`` instruction that LLaDA
  Instruct/1.5 were evaluated with (scoring.md section 3); Math-Verify's README also recommends asking
  for a boxed answer. GSM8K uses the same wording so one extractor (boxed first) serves both.
- ``humaneval``: ``Complete the following python code:\\n{prompt}`` -- OpenCompass
  ``humaneval_gen_8e312c`` (LLaDA Instruct/1.5, scoring.md section 4). The scorer accepts a fenced
  block, a restated function or a bare continuation of the prompt.
- ``mbpp``: the MBPP paper / README wording with the task text and *all three* asserts of
  ``test_list`` (which also reveal the function name), asking for one fenced python block
  (scoring.md section 5; zero-shot instead of the 3-shot ``[BEGIN]/[DONE]`` format because the model is a
  chat model and diffusion decoders fill the window -- the scorer still cuts at an exact ``[DONE]``).

Stop strings: the end-of-text / end-of-turn / mask markers of the LLaDA2 tokenizer (engine_spec.md
section 5: ``<|endoftext|>``, ``<|role_end|>``, ``<|mask|>``, a new ``<role>`` turn) for every
benchmark, plus a new few-shot-style turn (``\\nQuestion:`` / ``\\nProblem:``) for the math tasks, where
a diffusion model that fills its window tends to invent a follow-up question (scoring case gsm8k-07),
and ``[DONE]`` for MBPP. Not done here: few-shot prompts, system prompts, chat-template rendering.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import jinja2

__all__ = ["Prompt", "build_prompt", "template_version", "BENCHMARKS", "EOS_MARKERS", "STOP_STRINGS"]

_TEMPLATE_DIR = Path(__file__).with_name("templates")

#: benchmark -> (template file, version number). Bump the number when the wording changes on purpose.
_TEMPLATES = {
    "gsm8k": ("gsm8k.v1.j2", 1),
    "math500": ("math500.v1.j2", 1),
    "humaneval": ("humaneval.v1.j2", 1),
    "mbpp": ("mbpp.v1.j2", 1),
}
BENCHMARKS = tuple(_TEMPLATES)

#: Special-token text that ends a completion when a backend did not strip it (engine_spec.md section 5).
EOS_MARKERS = ("<|endoftext|>", "<|role_end|>", "<|mask|>", "<role>")

#: Stop strings per benchmark, applied after generation (in addition to EOS_MARKERS).
STOP_STRINGS = {
    "gsm8k": ("\nQuestion:",),
    "math500": ("\nProblem:",),
    "humaneval": (),
    "mbpp": ("[DONE]",),
}

# Fields each template reads from the source record (checked so a wrong record fails loudly).
_REQUIRED_FIELDS = {
    "gsm8k": ("question",),
    "math500": ("problem",),
    "humaneval": ("prompt",),
    "mbpp": ("text", "test_list"),
}


@dataclass(frozen=True)
class Prompt:
    """A rendered prompt: chat messages, stop strings and the template version for provenance."""

    messages: list[dict] = field(default_factory=list)
    stop: list[str] = field(default_factory=list)
    template_version: str = ""


def _check_benchmark(benchmark: str) -> None:
    if benchmark not in _TEMPLATES:
        raise ValueError(f"unknown benchmark {benchmark!r}; expected one of {', '.join(BENCHMARKS)}")


@lru_cache(maxsize=None)
def _load(benchmark: str) -> tuple[jinja2.Template, str]:
    filename, number = _TEMPLATES[benchmark]
    text = (_TEMPLATE_DIR / filename).read_text(encoding="utf-8")
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=False)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]
    return env.from_string(text), f"{benchmark}/v{number}+{digest}"


def template_version(benchmark: str) -> str:
    """``<benchmark>/v<N>+<sha256[:8]>`` of the template file used for ``benchmark``."""
    _check_benchmark(benchmark)
    return _load(benchmark)[1]


def stop_strings(benchmark: str) -> list[str]:
    """All strings at which a completion for ``benchmark`` is cut (EOS markers first)."""
    _check_benchmark(benchmark)
    return list(EOS_MARKERS) + list(STOP_STRINGS[benchmark])


def build_prompt(benchmark: str, source: dict) -> Prompt:
    """Render the prompt for one original benchmark record ``source`` (see module docstring)."""
    _check_benchmark(benchmark)
    if not isinstance(source, dict):
        raise TypeError(f"build_prompt({benchmark!r}, source): source must be a dict, got {type(source).__name__}")
    missing = [f for f in _REQUIRED_FIELDS[benchmark] if f not in source]
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
