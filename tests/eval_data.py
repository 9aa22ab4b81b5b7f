"""Where the tests find the real benchmark files, and the one skip they give without them.

The files (``gsm8k.jsonl``, ``math500.jsonl``, ``humaneval.jsonl``, ``mbpp.jsonl`` in their original layouts) are
never in the repository: ``$ORL_EVAL_DATA`` names their folder, else ``../shared/data`` beside the checkout (the
development machines' layout). A user's clone has neither: every test that needs them skips with
:data:`SKIP_REASON` (quietly, one by one), and ``tests/conftest.py`` prints one line at the end counting those skips
and saying how to run them. ``ORL_EVAL_DATA`` set to a folder without the files means "no data" (the way to check a
clone's behaviour on a machine that has ``../shared``); conftest then also removes it from the environment, so the
pipeline runs of the tests fall back to the built-in problems as on a clone.

A uniquely named module (several test folders have a conftest): ``from eval_data import real_data``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ENV = "ORL_EVAL_DATA"
_OFF = "ORL_EVAL_TESTS_NO_DATA"  # set by configure() (inherited by pytest-xdist workers and the tests' subprocesses)
SKIP_REASON = "needs the real benchmark files (ORL_EVAL_DATA)"
HOW = (f"set {ENV}=/path/to/data (a folder holding gsm8k.jsonl, math500.jsonl, humaneval.jsonl and mbpp.jsonl "
       "in their original layouts) to run them")


def configure() -> None:
    """Called once per test process (conftest's ``pytest_configure``): an ``$ORL_EVAL_DATA`` without
    ``gsm8k.jsonl`` (empty or absent folder) means "no data": it moves out of the environment, so the pipeline
    runs the tests start see no data folder, as on a clone."""
    v = os.environ.get(ENV)
    if v is not None and not (Path(v) / "gsm8k.jsonl").is_file():
        os.environ[_OFF] = v
        del os.environ[ENV]


def looked_at() -> Path:
    """The folder the tests look in: ``$ORL_EVAL_DATA``, else ``../shared/data`` beside the checkout (never that
    when ``$ORL_EVAL_DATA`` named a folder without the files: see :func:`configure`)."""
    if os.environ.get(_OFF) is not None:
        return Path(os.environ[_OFF])
    return Path(os.environ.get(ENV) or REPO.parent / "shared" / "data")


def real_data(*files: str) -> Path | None:
    """The data folder when it holds ``gsm8k.jsonl`` and each of ``files`` (names like ``humaneval.jsonl``);
    None otherwise."""
    d = looked_at()
    return d if all((d / f).is_file() for f in ("gsm8k.jsonl", *files)) else None


def require(*files: str) -> Path:
    """:func:`real_data`, or skip the calling test with :data:`SKIP_REASON`."""
    d = real_data(*files)
    if d is None:
        pytest.skip(SKIP_REASON)
    return d


def chat_prompts(n_each: int, benchmarks: tuple[str, ...] = ("gsm8k", "humaneval")) -> list[list[dict]]:
    """The chat messages (``build_prompt(...).messages``) of the first ``n_each`` problems of each of
    ``benchmarks``, in that order, from the real data files; skips the calling test (:func:`require`) without them."""
    from repro.prompts import build_prompt

    d = require(*(f"{b}.jsonl" for b in benchmarks))
    out = []
    for bench in benchmarks:
        with (d / f"{bench}.jsonl").open() as f:
            out += [build_prompt(bench, json.loads(next(f))).messages for _ in range(n_each)]
    return out
