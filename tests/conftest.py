"""Shared fixtures: where the real benchmark data lives (never copied into the repo)."""

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def shared_data_dir() -> Path | None:
    d = Path(os.environ.get("ORL_EVAL_DATA", REPO.parent / "shared" / "data"))
    return d if (d / "gsm8k.jsonl").is_file() else None


@pytest.fixture(scope="session")
def data_dir() -> Path:
    d = shared_data_dir()
    if d is None:
        pytest.skip("real benchmark data not found (set ORL_EVAL_DATA or place it at ../shared/data)")
    return d


@pytest.fixture(autouse=True)
def _restore_engine_seams():
    """Put back the engine's layer-seam choices after each test. Building an ``LLM`` on a GPU selects the Triton MoE
    and attention for the whole process (``repro.engine.llm``), and a later test would otherwise run on that choice.
    This happened: the fp32 CUDA parity test ran on TF32 Triton kernels after the batched-graph tests, and failed."""
    from repro.engine.layers import attention, moe

    saved = [(m, list(m._ACTIVE), list(getattr(m, "_ACTIVE_NAME", []))) for m in (moe, attention)]
    yield
    for m, active, name in saved:
        m._ACTIVE[:] = active
        if name:
            m._ACTIVE_NAME[:] = name
