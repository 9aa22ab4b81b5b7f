"""The tuner's candidate selection (kernels/tune.py) without a GPU: timings are injected."""
import pytest

pytest.importorskip("triton")

from repro.engine.kernels import tune  # noqa: E402


def test_best_of_picks_the_fastest_candidate_and_skips_failures(monkeypatch):
    times = {16: 2.0, 32: 1.0, 64: None, 128: 3.0}  # by BLOCK_N; None: does not compile

    def fake_time(fn):
        ms = fn()
        if ms is None:
            raise RuntimeError("out of shared memory")
        return ms

    monkeypatch.setattr(tune, "graph_time_ms", fake_time)
    cands = [(16, n, 64, 4, 3) for n in times]
    rows = []
    ms, cfg = tune._best_of(cands, lambda c: f"k {c}", lambda cfg: (lambda: times[cfg["BLOCK_N"]]), 2e6, rows)
    assert (ms, cfg["BLOCK_N"]) == (1.0, 32) and cfg["num_stages"] == 3
    assert [r[1] for r in rows] == [2.0, 1.0, None, 3.0]
    assert rows[1][2] == "2 GB/s" and rows[2][2].startswith("RuntimeError")
    with pytest.raises(RuntimeError, match="no tile candidate ran"):
        tune._best_of(cands[2:3], lambda c: f"k {c}", lambda cfg: (lambda: None), 1.0, [])
