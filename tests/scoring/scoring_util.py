"""Constants shared by the scoring tests (a uniquely named module: several test folders have a conftest)."""

import os
from pathlib import Path

import eval_data

REPO = Path(__file__).resolve().parents[2]
WORKERS = max(1, min(2, len(os.sched_getaffinity(0))))


def data_dir() -> Path:
    return eval_data.looked_at()


def cases_path() -> Path:
    return Path(os.environ.get("ORL_EVAL_CASES", data_dir().parent / "cases" / "scoring_cases.jsonl"))
