"""Fixtures of the engine benchmarks' tests (repro/engine/bench/): a tiny checkpoint for the benchmarks that also
run on the CPU (``serve``). The GPU benchmarks' timed parts are replaced in these tests; their figures come from
device runs (docs/perf.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from repro.checkpoint.tiny import write_tiny


@pytest.fixture(scope="session")
def bench_tiny_dir(tmp_path_factory) -> Path:
    """A tiny checkpoint (``write_tiny``, seed 1), written once per test session."""
    d = tmp_path_factory.mktemp("bench_tiny")
    write_tiny(d, seed=1)
    return d
