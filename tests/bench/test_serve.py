"""The serve benchmark script runs end to end (tiny checkpoint, CPU) and prints both figures and the ratio;
the server and LLM.generate produce the same tokens. Its speed figures are for the GPU (docs/perf.md)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi", reason="the server needs the 'serve' extra (scripts/setup.sh installs it)")
pytest.importorskip("uvicorn")

from repro.engine.bench.__main__ import main  # noqa: E402


def test_bench_prints_both_figures_and_ratio(bench_tiny_dir, capsys):
    """Through the package's entry point, as ``python -m repro.engine.bench serve ...``."""
    assert main(["serve", "--checkpoint", str(bench_tiny_dir), "--device", "cpu", "--tokens", "48",
                 "--prompt-tokens", "40", "--repeats", "1"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert "LLM.generate:" in out[-2] and "ratio server/direct:" in out[-2]
    doc = json.loads(out[-1])
    assert doc["ratio"] == doc["server_tokens_per_s"] / doc["direct_tokens_per_s"] and doc["ratio"] > 0
    run = doc["runs_server"][0]
    assert run["same_tokens"] and run["blocks"] >= 1 and run["tokens"] == doc["runs_direct"][0]["tokens"]


def test_concurrency_option_compares_concurrent_clients_with_the_batched_engine(bench_tiny_dir, capsys):
    assert main(["serve", "--checkpoint", str(bench_tiny_dir), "--device", "cpu", "--tokens", "48",
                 "--prompt-tokens", "40", "--repeats", "1", "--concurrency", "1,3"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    doc = json.loads(out[-1])
    rows = doc["concurrency"]
    assert [r["concurrency"] for r in rows] == [1, 3]
    for r, line in zip(rows, out[-3:-1]):
        assert line.startswith(f"{r['concurrency']} concurrent streaming clients:") and "ratio" in line
        assert r["ratio"] == r["server_tokens_per_s"] / r["batch_tokens_per_s"] > 0
        run = r["runs"][0]
        # every client got exactly the tokens the batched call gave its prompt
        assert r["same_tokens"] and run["server_tokens"] == run["batch_tokens"] > 0


def test_concurrency_option_refuses_bad_values(bench_tiny_dir, capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--checkpoint", str(bench_tiny_dir), "--device", "cpu", "--concurrency", "8,x"])
    assert "--concurrency '8,x'" in capsys.readouterr().err
