"""repro.tables.speed: the speed table from generation records and shard metas (nothing re-run)."""

import json

import pytest

from repro import paths
from repro.tables import speed


def _rec(i, tokens, wall, bs, fw=(1, 10, 2)):
    return {"id": f"gsm8k/{i}", "backend": "engine", "generated_tokens": tokens, "wall_s": wall, "batch_size": bs,
            "forwards": {"prefill": fw[0], "denoise": fw[1], "commit": fw[2]}}


def _write(work, model, bench, recs, metas):
    g = work / paths.GENERATIONS.format(suite="s", model=model, bench=bench, seed=1)
    g.parent.mkdir(parents=True, exist_ok=True)
    g.write_text("".join(json.dumps(r) + "\n" for r in recs))
    (g.parent / (g.name + ".meta.json")).write_text(json.dumps({"shards": metas}))


SPEC = {"models": [{"name": "m", "label": "Model M"}, {"name": "ref", "label": "replayed", "replay": True}],
        "benchmarks": ["gsm8k", "humaneval"], "seeds": [1]}


def test_single_request_subset_batched_throughput_and_totals(tmp_path):
    meta1 = {"batch_size": 1, "precision": "bf16", "generated_last_session": {"generated_tokens": 400, "wall_s": 5.0},
             "backend_info": {"device": "cuda (NVIDIA H200)", "engine_path": "cuda-graph", "load_s": 20.0}}
    # gsm8k at batch 1: 40 records, only the first SUBSET (32) count for the single-request numbers
    _write(tmp_path, "m", "gsm8k", [_rec(i, 10, 0.1 if i < speed.SUBSET else 9.0, 1) for i in range(40)], [meta1])
    meta8 = {"batch_size": 8, "precision": "bf16", "generated_last_session": {"generated_tokens": 300, "wall_s": 1.0},
             "backend_info": {"device": "cuda (NVIDIA H200)", "engine_path": "batched-eager", "load_s": 30.0,
                              "batch": {"rounds": 10, "mean_round_s": 0.02, "wall_s": 1.0, "max_active": 8}}}
    _write(tmp_path, "m", "humaneval", [_rec(i, 30, 0.5, 8) for i in range(10)], [meta8])
    rows, total = speed.build(tmp_path, "s", SPEC)
    assert [r["benchmark"] for r in rows] == ["gsm8k", "humaneval", "all"]  # the replayed model is skipped
    g, h, a = rows
    assert g["n_single"] == 32 and g["tps_single"] == pytest.approx(100.0)  # 320 tokens / 3.2 s
    assert g["ms_per_forward"] == pytest.approx(3.2 / (32 * 13) * 1000)
    assert g["tpf"] == pytest.approx(400 / (40 * 12)) and g["tps_batch"] == pytest.approx(80.0)
    assert g["ms_per_round_batch"] is None and g["load_s"] == 20.0
    assert h["n_single"] == 0 and h["tps_single"] is None  # batched records are not single-request timings
    assert h["tps_batch"] == pytest.approx(300.0) and h["ms_per_round_batch"] == pytest.approx(20.0)
    assert a["tps_batch"] == pytest.approx(700 / 6.0) and a["load_s"] == 25.0
    cap = speed.caption(total, "s")
    assert "NVIDIA H200" in cap and "bf16" in cap and "batched-eager" in cap and "N = 1, 8" in cap
    md = speed.to_markdown(rows, cap)
    assert "| Model M | GSM8K | 32 | 100.0 |" in md
    assert "\\toprule" in speed.to_latex(rows, speed.caption(total, "s", latex=True), "tab:speed-s")


def test_cli_writes_three_files_and_names_a_missing_generation_file(tmp_path, capsys):
    _write(tmp_path, "m", "gsm8k", [_rec(0, 5, 0.1, 1)], [{"batch_size": 1}])
    spec = dict(SPEC, benchmarks=["gsm8k"])
    out = tmp_path / "res"
    assert speed.main(["--work", str(tmp_path), "--suite", "s", "--spec", json.dumps(spec), "--out-dir", str(out)]) == 0
    assert {p.name for p in out.iterdir()} == {"speed_table.md", "speed_table.tex", "speed_table.csv"}
    spec["benchmarks"] = ["gsm8k", "mbpp"]
    assert speed.main(["--work", str(tmp_path), "--suite", "s", "--spec", json.dumps(spec), "--out-dir", str(out)]) == 2
    assert "mbpp" in capsys.readouterr().err
