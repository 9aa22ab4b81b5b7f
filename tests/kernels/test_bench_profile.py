"""``bench round --breakdown``: the roles of the single-request round's kernels (repro/engine/bench/profiling.py)."""
import pytest
import torch

from repro.engine.bench.profiling import ROLES, breakdown_table, classify_round


def _layer(qkv, o, fused_attn=False, fused_route=False):
    """Kernel names of one MoE layer of BlockForward (norm_in_route) in launch order (``o`` a list: the O GEMM's
    kernels; ``fused_attn``: QK-norm/RoPE/KV write and attention in one launch; ``fused_route``: router and route
    in one launch)."""
    attn = ["_attn_fused_kernel"] if fused_attn else ["_qk_norm_rope_kv_kernel", "_attn_split_kernel",
                                                      "_attn_combine_kernel"]
    route = ["_fused_route_kernel"] if fused_route else ["_router_logits_kernel", "_route_select_kernel"]
    return ["_add_rmsnorm_kernel", qkv, *attn, *o, *route, "_moe_gate_up_kernel", "_moe_down_kernel"]


def test_classify_round_cublas_and_fused_attn():
    cublas = "nvjet_tst_64x8_64x16_4x1_v_bz_TNT"
    names = (["indexSelectLargeIndex"] + ["_add_rmsnorm_kernel", cublas, "_qk_norm_rope_kv_kernel",
                                          "_attn_split_kernel", "_attn_combine_kernel", cublas,
                                          "_add_rmsnorm_kernel", "_moe_gate_up_kernel", "_moe_down_kernel"]
             # a cuBLAS split-K reduction after the O GEMM: the O GEMM's role
             + _layer("sm90_xmma_gemm_bf16bf16_bf16f32", ["cutlass_80_wmma_tensorop_gemm", "splitKreduce_kernel"])
             + _layer(cublas, [cublas], fused_attn=True, fused_route=True)
             + ["_add_rmsnorm_kernel", cublas, "_logits_partial_stats_kernel", "_logits_stats_combine_kernel"])
    roles = classify_round(names, first_dense=1)
    assert set(roles) <= set(ROLES)
    assert roles[0] == "embed" and roles[2] == "qkv_gemm" and roles[6] == "o_gemm"
    assert roles[8:10] == ["dense_gate_up", "dense_down"]
    assert roles.count("qkv_gemm") == 3 and roles.count("o_gemm") == 4  # one O GEMM + its split-K reduction
    assert roles[names.index("splitKreduce_kernel")] == "o_gemm"
    assert roles.count("qk_norm_rope_kv") == 2 and roles.count("attn_fused") == 1  # the fused layer has none
    assert roles.count("gate_up") == 2 and roles.count("route_select") == 1 and roles.count("router") == 1
    assert roles.count("route_fused") == 1  # the fused layer's router + route
    assert roles[-3:] == ["lm_head", "logits_stats", "logits_stats"]
    assert "other" not in roles


def test_breakdown_table_lists_every_role_and_the_gaps():
    b = {"roles": {"qkv_gemm": {"us_per_launch": 6.5, "launches": 20, "ms": 0.13},
                   "attn_split": {"us_per_launch": 6.1, "launches": 20, "ms": 0.122}},
         "kernels_ms": 0.252, "graph_ms": 0.3, "kernels": 40, "source": "graph"}
    t = breakdown_table([("bf16", b), ("w4", b)])
    assert "| qkv_gemm | 6.50 (20) | 0.130 | 6.50 (20) | 0.130 |" in t
    assert "gaps (graph − Σ)" in t and "0.048" in t


@pytest.mark.gpu
def test_round_breakdown_small_model():
    """Every per-layer kernel found once per layer in a profiled graph replay; Σ kernels <= the replay time."""
    from repro.engine.bench.profiling import round_breakdown

    from .conftest import small_block_forward

    shape, _, fw = small_block_forward()
    fw.kv.normal_()
    fw.ids.copy_(torch.randint(0, shape.vocab, (32,), device="cuda"))
    fw.cache_len.fill_(1000)
    b = round_breakdown(fw, replays=3)
    r = b["roles"]
    assert r["qkv_gemm"]["launches"] == r["attn_split"]["launches"] == r["qk_norm_rope_kv"]["launches"] == shape.layers
    assert r["router"]["launches"] == shape.layers - shape.first_dense
    assert 0 < b["kernels_ms"] <= 1.2 * b["graph_ms"]


def test_every_round_variant_sets_real_options(dev):
    """bench.variants: every BASE key is a BlockForward option (a typo would be skipped silently when False), and
    each variant of ROUND_VARIANTS sets its options on a real forward (PDL aside: off without GPU support)."""
    from repro.engine.bench import variants as BV
    from repro.engine.kernels import _triton
    from repro.engine.kernels import fastpath as F

    from .test_fastpath import TINY, TINY_CFG

    W = F.random_weights(TINY, dev, torch.float32, seed=1)
    fw = F.BlockForward(W, TINY, 64, T=8, device=dev, configs=TINY_CFG)
    for key in BV.BASE:
        assert key in ("pdl", "compact") or hasattr(fw, key), key
    for name in BV.ROUND_VARIANTS:
        BV.set_variant(fw, name)
        want = {**BV.BASE, **BV.VARIANTS[name]}
        assert fw.ws.compact == want["compact"]
        for key, val in want.items():
            if key not in ("pdl", "compact"):
                assert getattr(fw, key) == val, (name, key)
    _triton.set_pdl(False)
