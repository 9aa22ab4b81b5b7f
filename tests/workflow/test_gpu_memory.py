"""GPU memory a generation job asks for and checks: at batch S > 1 the batched engine holds one KV cache per slot
(layers x 2 x KV heads x head_dim x 2 B x positions) and the slots' logits, computed from the model config; the
speed probe and other batch-1 jobs need none of it."""

import argparse
import json

import pytest

from repro import cluster
from repro.backends import generation_job

REAL = {"num_hidden_layers": 20, "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 157184,
        "max_position_embeddings": 32768}  # LLaDA2.1-mini's config.json


def _checkpoint(d, cfg, weight_bytes=32_600_000_000):
    (d / "config.json").write_text(json.dumps(cfg))
    with open(d / "model.safetensors", "wb") as f:
        f.truncate(weight_bytes)  # sparse: the real size without the bytes
    return d


def test_batch_kv_caches_from_the_model_config(tmp_path):
    ckpt = _checkpoint(tmp_path, REAL)
    assert cluster.kv_bytes_per_position(REAL) == 40_960
    assert cluster.slot_positions(4096) == 5120 and cluster.slot_positions(64) == 2048
    one, b32 = cluster.gpu_need_bytes(ckpt, "bf16"), cluster.gpu_need_bytes(ckpt, "bf16", 32, 5120)
    # 32 slots x (40,960 B x 5,120 positions + 32 x 157,184 x 2 B of logits) = 7.03 GB (docs/perf.md: 6.7 GB + 322 MB)
    assert b32 - one == 32 * (40_960 * 5120 + 32 * 157_184 * 2) == 7_032_799_232
    assert cluster.gpu_need_bytes(ckpt, "bf16", 1, 5120) == one  # batch 1: the single-request path, no slots
    # what the rules declare covers the checkpoint's own sum, at both batch sizes
    assert one / 1e6 <= cluster.gpu_memory_need_mb({"type": "hf"}, "bf16") == 38_000
    assert b32 / 1e6 <= cluster.gpu_memory_need_mb({"type": "hf"}, "bf16", 32, 5120) == 45_000
    assert cluster.gpu_memory_need_mb({"type": "hf"}, "nvfp4-w4a16", 32, 5120) == 21_000
    assert cluster.gpu_memory_need_mb({"type": "tiny", "seed": 0}, "bf16", 32, 5120) == 1_000
    # another shape: half the layers, half the per-slot KV cache (read from config.json, not assumed)
    (tmp_path / "half").mkdir()
    half = _checkpoint(tmp_path / "half", {**REAL, "num_hidden_layers": 10})
    assert (cluster.gpu_need_bytes(half, "bf16", 32, 5120) - cluster.gpu_need_bytes(half, "bf16")
            == 32 * (20_480 * 5120 + 32 * 157_184 * 2))
    # a 40 GB card holds the model one request at a time but not 32 slots: refused with the numbers
    a100 = ("NVIDIA A100-SXM4-40GB", 40 * 10**9, (8, 0))
    assert cluster.gpu_problem(*a100, one, "bf16") is None
    msg = cluster.gpu_problem(*a100, b32, "bf16")
    assert "40.0 GB" in msg and "44.9 GB" in msg and "one per batch slot" in msg
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        cluster.batch_kv_bytes(REAL, 0, 5120)


def test_job_sizes_slots_from_its_decoders(tmp_path):
    """The generation job checks its GPU for the longest generation among its decoder configs."""
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("algorithm: orl\nmax_new_tokens: 4096\n")
    b.write_text("algorithm: orl\nmax_new_tokens: 8000\n")
    ns = argparse.Namespace(decoder=[str(a), str(b)])
    assert generation_job._slot_positions(ns) == 9216  # 1,024 prompt + 8,000 rounded up to 1,024
    assert generation_job._slot_positions(argparse.Namespace(decoder=str(a))) == 5120
