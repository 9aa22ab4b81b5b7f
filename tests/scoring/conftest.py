"""Shared fixtures for the scoring tests: where the real benchmark data and the regression cases live.

Data are never copied into the repository: ``ORL_EVAL_DATA`` names the directory, falling back to
``<repo>/../shared/data`` (tests/eval_data.py); the cases file is ``ORL_EVAL_CASES`` or ``<data>/../cases/scoring_cases.jsonl``.
Tests that need them are skipped with the path they looked at when absent.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # helper modules of this directory (perturb.py, scoring_util.py)

import eval_data  # noqa: E402
from scoring_util import REPO, WORKERS, cases_path, data_dir  # noqa: E402,F401


@pytest.fixture(scope="session")
def data() -> Path:
    return eval_data.require("humaneval.jsonl", "math500.jsonl", "mbpp.jsonl")


@pytest.fixture(scope="session")
def problems(data):
    from repro.scoring.cases import load_problems

    cache = {}

    def get(benchmark):
        if benchmark not in cache:
            cache[benchmark] = load_problems(data, benchmark)
        return cache[benchmark]

    return get

