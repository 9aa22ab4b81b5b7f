"""Shared fixtures: where the real benchmark data lives (never copied into the repo)."""

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def shared_data_dir() -> Path | None:
    d = Path(os.environ.get("ORL_EVAL_DATA", REPO.parent / "shared" / "data"))
    return d if (d / "gsm8k.jsonl").is_file() else None


@pytest.fixture
def data_dir() -> Path:
    d = shared_data_dir()
    if d is None:
        pytest.skip("real benchmark data not found (set ORL_EVAL_DATA or place it at ../shared/data)")
    return d
