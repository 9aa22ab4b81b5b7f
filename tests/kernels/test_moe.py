"""Fused MoE kernels vs the plain PyTorch reference (repro/engine/kernels/moe.py)."""
import pytest
import torch

pytest.importorskip("triton")

from repro.engine.kernels import logits as Lg  # noqa: E402
from repro.engine.kernels import moe as M  # noqa: E402

from .conftest import rel_err  # noqa: E402

SMALL_CFG = {
    "router": dict(BLOCK_E=16, SPLIT_K=2, BLOCK_K=16),
    "route": dict(num_warps=4),
    "gate_up": dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, num_stages=2),
    "down": dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, num_stages=2),
    "sum": dict(BLOCK_H=32),
}


def _inputs(T, H, N, E, shared, dtype, dev, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(dtype)
    gate = torch.randn(E, H, generator=g) * (1.0 / H ** 0.5)
    bias = torch.randn(E, generator=g) * 0.05
    E1 = E + 1 if shared else E
    w13 = (torch.randn(E1, 2 * N, H, generator=g) / H ** 0.5).to(dtype)
    w2 = (torch.randn(E1, H, N, generator=g) / N ** 0.5).to(dtype)
    return [t.to(dev) for t in (x, gate, bias, w13, w2)]


def _check_routing(x, gate, bias, ws, k, ng, tg):
    ids_ref, w_ref = M.route_reference(x, gate, bias, k, ng, tg)
    ids = ws.topk_ids.long()
    same = ids.sort(1).values.eq(ids_ref.sort(1).values).all(1)
    biased = torch.sigmoid(x.float() @ gate.float().t()) + bias.float()
    for t in torch.nonzero(~same).flatten().tolist():  # only near-ties may differ
        a = biased[t, ids[t]].sort().values
        b = biased[t, ids_ref[t]].sort().values
        assert (a - b).abs().max() < 1e-4, (t, ids[t], ids_ref[t])
    if bool(same.all()):
        order = ids.argsort(1)
        torch.testing.assert_close(ws.topk_w.gather(1, order), w_ref.gather(1, ids_ref.argsort(1)),
                                   rtol=1e-5, atol=1e-6)
    # alignment: every pair appears exactly once in its expert's list
    E = gate.shape[0]
    counts = ws.counts[:E].long()
    assert int(counts.sum()) == ids.numel()
    for e in range(E):
        lst = ws.pairs[e, : counts[e]].long()
        assert torch.all(ids.flatten()[lst] == e)
        assert lst.unique().numel() == lst.numel()


@pytest.mark.parametrize("dtype,T,shared,seed,compact", [
    (torch.float32, 8, True, 0, False),
    (torch.float16, 5, True, 1, False),
    (torch.float32, 16, False, 2, False),
    (torch.float32, 8, True, 3, True),
    (torch.float16, 7, False, 4, True),
])
def test_fused_moe_small(dev, dtype, T, shared, seed, compact):
    H, N, E, k, ng, tg = 64, 32, 16, 4, 4, 2
    x, gate, bias, w13, w2 = _inputs(T, H, N, E, shared, dtype, dev, seed)
    E1 = w13.shape[0]
    ws = M.MoEWorkspace.create(T, H, N, E, E1, k, dtype, dev, split_k=2)
    ws.compact = compact
    ws.out.fill_(float("nan"))
    out = M.fused_moe(x, gate, bias, w13, w2, top_k=k, n_group=ng, topk_group=tg, ws=ws, configs=SMALL_CFG)
    assert not torch.isnan(out).any()
    _check_routing(x, gate, bias, ws, k, ng, tg)
    nact = int(ws.counts[E1])
    assert nact == int((ws.counts[:E] > 0).sum())
    assert sorted(ws.active[:nact].tolist()) == torch.nonzero(ws.counts[:E] > 0).flatten().tolist()
    ref = M.moe_reference(x, gate, bias, w13, w2, k, ng, tg, topk=(ws.topk_ids.long(), ws.topk_w))
    tol = 1e-5 if dtype == torch.float32 and dev == "cpu" else 3e-3
    assert rel_err(out, ref) < tol


@pytest.mark.parametrize("w4", [False, True])
def test_expert_gemms_match_their_reference(dev, w4):
    """The two grouped GEMMs alone (kernels/moe_gemm.py) vs expert_gemms_reference, pair by pair: ws.inter
    (silu(gate)·up·routing weight) and ws.pair_out (inter · w2ᵀ, fp32) for routed and shared pairs, BF16 experts
    and NVFP4 experts (dequantized by the reference); outputs poisoned first, so every pair row must be written."""
    from repro.checkpoint import nvfp4 as Q

    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    T, H, N, E, k = 6, 64, 32, 8, 2
    x, gate, bias, w13, w2 = _inputs(T, H, N, E, True, dtype, dev, 11)
    cfg = SMALL_CFG
    if w4:
        def pack(w, parts):
            q = Q.NVFP4Experts(E, w.shape[1], w.shape[2], parts, dtype, dev)
            for e in range(E):
                for j in range(q.parts):
                    r = w.shape[1] // q.parts
                    t = Q.quantize(w[e, j * r:(j + 1) * r].float().cpu())
                    q.load_part(e, j, t["weight"].to(dev), t["weight_scale"].to(dev), t["weight_scale_2"].to(dev))
            return q.with_shared(w[E])
        w13, w2 = pack(w13, 2), pack(w2, 1)
        cfg = {**SMALL_CFG, "gate_up": dict(SMALL_CFG["gate_up"], BLOCK_K=32),
               "down": dict(SMALL_CFG["down"], BLOCK_K=32)}
    ws = M.MoEWorkspace.create(T, H, N, E, E + 1, k, dtype, dev, split_k=2)
    M.moe_route_align(x, gate, bias, ws, E + 1, k, 4, 2, 2.5, True, cfg)
    ws.inter.fill_(float("nan"))
    ws.pair_out.fill_(float("nan"))
    M.moe_gate_up(x, w13, ws, k, cfg)
    M.moe_down(w2, ws, cfg)
    ids = torch.cat([ws.topk_ids.long(), torch.full((T, 1), E, device=dev)], 1)  # pairs t·k + j, then T·k + t
    wts = torch.cat([ws.topk_w.float(), torch.ones(T, 1, device=dev)], 1)
    inter, out = M.expert_gemms_reference(x, w13, w2, ids, wts)
    got_i = torch.cat([ws.inter[:T * k].float().view(T, k, N), ws.inter[T * k:T * k + T].float()[:, None]], 1)
    got_o = torch.cat([ws.pair_out[:T * k].view(T, k, H), ws.pair_out[T * k:T * k + T][:, None]], 1)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert rel_err(got_i, inter) < tol and rel_err(got_o, out) < tol
    if w4:  # down-projection experts built with two global scales per expert (gate+up's): refused by name
        with pytest.raises(ValueError, match="parts=1"):
            M.moe_down(pack(torch.cat([w2.dequantize(), w2.shared[None]]), 2), ws, cfg)


def test_stack_experts_matches_layout():
    g = [torch.randn(4, 8) for _ in range(3)]
    u = [torch.randn(4, 8) for _ in range(3)]
    d = [torch.randn(8, 4) for _ in range(3)]
    sh = (torch.randn(4, 8), torch.randn(4, 8), torch.randn(8, 4))
    w13, w2 = M.stack_experts(g, u, d, shared=sh)
    assert w13.shape == (4, 8, 8) and w2.shape == (4, 8, 4)
    assert torch.equal(w13[1, :4], g[1]) and torch.equal(w13[1, 4:], u[1]) and torch.equal(w13[3, 4:], sh[1])


@pytest.mark.gpu
@pytest.mark.parametrize("seed,compact", [(0, False), (1, False), (2, True)])
def test_fused_moe_bf16_full_shape(seed, compact):
    T, H, N, E, k = 32, 2048, 512, 256, 8
    x, gate, bias, w13, w2 = _inputs(T, H, N, E, True, torch.bfloat16, "cuda", seed)
    ws = M.MoEWorkspace.create(T, H, N, E, E + 1, k, torch.bfloat16, "cuda")
    ws.compact = compact
    ws.out.fill_(float("nan"))
    ws.pair_out.fill_(float("nan"))
    out = M.fused_moe(x, gate, bias, w13, w2, top_k=k, ws=ws)
    torch.cuda.synchronize()
    assert not torch.isnan(out).any()
    _check_routing(x, gate, bias, ws, k, 8, 4)
    assert not torch.isnan(ws.pair_out).any()  # every (token, expert) row and the shared rows written
    ref = M.moe_reference(x, gate, bias, w13, w2, k, topk=(ws.topk_ids.long(), ws.topk_w))
    assert rel_err(out, ref) < 1e-2
    naive = M.moe_naive_loop(x, gate, bias, w13, w2, k)
    assert rel_err(naive, ref) < 2e-2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_seam_adapter_matches_engine_torch_impl(dev, dtype):
    """moe_forward_triton keeps the contract of repro.engine.layers.moe.moe_forward_torch."""
    seam = pytest.importorskip("repro.engine.layers.moe")
    T, H, N, E, k = 7, 64, 32, 16, 4
    x, gate, bias, w13, w2 = _inputs(T, H, N, E, False, dtype, dev, 11)
    w, ids = seam.route(x, gate, bias, k, 4, 2, 2.5)
    got = M.moe_forward_triton(x, w13, w2, w, ids)
    ref = seam.moe_forward_torch(x.float(), w13.float(), w2.float(), w, ids)
    assert got.dtype == x.dtype and not torch.isnan(got).any()
    assert rel_err(got, ref) < (1e-5 if dtype == torch.float32 and dev == "cpu" else 3e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_logits_stats_small(dev, dtype):
    T, V = 5, 1000
    logits = (torch.randn(T, V) * 3).to(dtype).to(dev)
    logits[1, 7] = logits[1, 900] = logits[1].max() + 1  # tie: first index wins
    part = torch.zeros(T, 4, 4, device=dev)
    pred = torch.full((T,), -1, dtype=torch.long, device=dev)
    conf = torch.full((T,), float("nan"), device=dev)
    ent = torch.full((T,), float("nan"), device=dev)
    Lg.logits_stats(logits, part, pred, conf, ent, nchunk=4, block_v=64)
    p_ref, c_ref, e_ref = Lg.logits_stats_reference(logits)
    assert torch.equal(pred, p_ref) and int(pred[1]) == 7
    torch.testing.assert_close(conf, c_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ent, e_ref, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
def test_logits_stats_bf16_full_vocab():
    T, V = 32, 157184
    logits = (torch.randn(T, V, device="cuda") * 2).bfloat16()
    part = torch.zeros(T, 16, 4, device="cuda")
    pred = torch.full((T,), -1, dtype=torch.long, device="cuda")
    conf = torch.full((T,), float("nan"), device="cuda")
    ent = torch.full((T,), float("nan"), device="cuda")
    Lg.logits_stats(logits, part, pred, conf, ent, nchunk=16)
    p_ref, c_ref, e_ref = Lg.logits_stats_reference(logits)
    assert torch.equal(pred, p_ref)
    torch.testing.assert_close(conf, c_ref, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(ent, e_ref, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_seam_adapter_bf16():
    seam = pytest.importorskip("repro.engine.layers.moe")
    T, H, N, E, k = 32, 2048, 512, 256, 8
    x, gate, bias, w13, w2 = _inputs(T, H, N, E, False, torch.bfloat16, "cuda", 3)
    w, ids = seam.route(x, gate, bias, k, 8, 4, 2.5)
    got = M.moe_forward_triton(x, w13, w2, w, ids)
    ref = seam.moe_forward_torch(x.float(), w13.float(), w2.float(), w, ids)
    assert not torch.isnan(got).any()
    assert rel_err(got, ref) < 1e-2


def test_fused_norm_router_and_gate_up(dev):
    """RMSNorm folded into the router GEMM and the gate+up GEMM == MoE on the normalised input."""
    if dev == "cuda":
        pytest.skip("fp32 tf32 dots on GPU; covered by the bf16 fast-path GPU test")
    from repro.engine.kernels import norm as Nm

    T, H, N, E, k, ng, tg = 6, 64, 32, 16, 4, 4, 2
    x, gate, bias, w13, w2 = _inputs(T, H, N, E, True, torch.float32, dev, 21)
    h = x * 3.0
    nw = torch.rand(H) + 0.5
    xn = Nm.rmsnorm_reference(h, nw)
    ws = M.MoEWorkspace.create(T, H, N, E, E + 1, k, torch.float32, dev, split_k=2)
    M.moe_route_align(h, gate, bias, ws, E + 1, k, ng, tg, configs=SMALL_CFG, norm_w=nw)
    M.moe_experts(h, w13, w2, ws, k, SMALL_CFG, norm_w=nw)
    out = M.moe_sum(ws, E, E + 1, k, SMALL_CFG)
    ids_ref, _ = M.route_reference(xn, gate, bias, k, ng, tg)
    assert torch.equal(ws.topk_ids.long().sort(1).values, ids_ref.sort(1).values)
    ref = M.moe_reference(xn, gate, bias, w13, w2, k, ng, tg, topk=(ws.topk_ids.long(), ws.topk_w))
    assert rel_err(out, ref) < 1e-5


@pytest.mark.parametrize("w4", [False, True])
def test_down_stores_each_pair_row_as_its_fp32_sum_rounded_once(dev, w4):
    """The down GEMM accumulates in fp32 and rounds once at the store: its pair rows in the activation dtype (the
    workspace's default pair_dtype) are bit for bit its fp32 rows rounded (fp16 under the interpreter, bf16 on the
    GPU; 16-bit and NVFP4 experts)."""
    from repro.checkpoint import nvfp4 as Q

    dtype = torch.bfloat16 if dev == "cuda" else torch.float16
    T, H, N, E, k = 6, 64, 32, 8, 2
    x, gate, bias, w13, w2 = _inputs(T, H, N, E, True, dtype, dev, 12)
    cfg = SMALL_CFG
    if w4:
        q = Q.NVFP4Experts(E, H, N, 1, dtype, dev)
        for e in range(E):
            t = Q.quantize(w2[e].float().cpu())
            q.load_part(e, 0, t["weight"].to(dev), t["weight_scale"].to(dev), t["weight_scale_2"].to(dev))
        w2 = q.with_shared(w2[E])
        cfg = {**SMALL_CFG, "down": dict(SMALL_CFG["down"], BLOCK_K=32)}
    ws = M.MoEWorkspace.create(T, H, N, E, E + 1, k, dtype, dev, split_k=2)
    assert ws.pair_out.dtype == dtype
    M.moe_route_align(x, gate, bias, ws, E + 1, k, 4, 2, 2.5, True, cfg)
    M.moe_gate_up(x, w13, ws, k, cfg)
    low = ws.pair_out.fill_(float("nan"))
    M.moe_down(w2, ws, cfg)
    ws.pair_out = torch.full(low.shape, float("nan"), device=dev)  # the same launch into fp32 rows
    M.moe_down(w2, ws, cfg)
    assert not torch.isnan(ws.pair_out).any()
    assert torch.equal(low, ws.pair_out.to(dtype))


@pytest.mark.parametrize("rows", [0, 2])
def test_top_k_sum_adds_low_precision_pair_rows_in_fp32(dev, rows):
    """The top-k sum (moe_sum, and add_rmsnorm's pairs mode at rows 0 and rows 2) adds 16-bit pair rows in fp32 and
    rounds once: one row of 1 plus eight rows of a quarter of the dtype's unit in the last place at 1 (a sum that
    16-bit accumulation rounds back to 1 after every add) gives 1 + 2 ulp, exactly, in every column."""
    from repro.engine.kernels import norm as Nm

    dtype = torch.bfloat16 if dev == "cuda" else torch.float16
    T, H, k = 3, 64, 8
    ulp = torch.finfo(dtype).eps  # unit in the last place at 1
    pairs = torch.full((T * k + T, H), ulp / 4, dtype=dtype, device=dev)
    pairs[0: T * k: k] = 1.0  # each token's first pair
    want = torch.full((T, H), 1 + 2 * ulp, dtype=dtype, device=dev)
    assert float(want[0, 0]) == 1 + 2 * ulp and float((torch.ones((), dtype=dtype) + ulp / 4)) == 1.0
    if rows == 0:
        ws = M.MoEWorkspace.create(T, H, 32, 16, 17, k, dtype, dev, split_k=1)
        ws.pair_out.copy_(pairs)
        assert torch.equal(M.moe_sum(ws, 16, 17, k, {"sum": dict(BLOCK_H=32)}), want)
    h = torch.zeros(T, H, dtype=dtype, device=dev)
    normed = torch.empty_like(h)
    Nm.add_rmsnorm(h, torch.ones(H, dtype=dtype, device=dev), normed, pairs=pairs, top_k=k, shared=True,
                   rows=rows)
    assert torch.equal(h, want)
    hr, _ = Nm.add_rmsnorm_reference(torch.zeros_like(h), torch.ones(H, dtype=dtype, device=dev), pairs=pairs,
                                     top_k=k, shared=True)
    assert torch.equal(hr, want)
