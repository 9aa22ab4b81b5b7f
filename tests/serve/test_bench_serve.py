"""The serve benchmark script runs end to end (tiny checkpoint, CPU) and prints both figures and the ratio;
the server and LLM.generate produce the same tokens. Its speed figures are for the GPU (docs/perf.md)."""

from __future__ import annotations

import json

from repro.engine.serve import bench


def test_bench_prints_both_figures_and_ratio(serve_tiny_dir, capsys):
    assert bench.main(["--checkpoint", str(serve_tiny_dir), "--device", "cpu", "--tokens", "48",
                       "--prompt-tokens", "40", "--repeats", "1"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert "LLM.generate:" in out[-2] and "ratio server/direct:" in out[-2]
    doc = json.loads(out[-1])
    assert doc["ratio"] == doc["server_tokens_per_s"] / doc["direct_tokens_per_s"] and doc["ratio"] > 0
    run = doc["runs_server"][0]
    assert run["same_tokens"] and run["blocks"] >= 1 and run["tokens"] == doc["runs_direct"][0]["tokens"]
