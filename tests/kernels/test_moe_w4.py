"""Weights-only 4-bit (nvfp4-w4a16) expert GEMMs vs the dequantize-at-load values (repro/engine/kernels/moe_w4.py)."""
import pytest
import torch

pytest.importorskip("triton")

from repro.checkpoint import nvfp4 as Q  # noqa: E402
from repro.engine.kernels import moe as M  # noqa: E402
from repro.engine.kernels import moe_w4 as W4  # noqa: E402

from .conftest import rel_err  # noqa: E402
from .test_moe import SMALL_CFG  # noqa: E402

# the 16-bit kernels' small tiles, with BLOCK_K = 32 (two 16-wide dots of even / odd inputs per K tile)
CFG = {**SMALL_CFG, "gate_up": dict(SMALL_CFG["gate_up"], BLOCK_K=32), "down": dict(SMALL_CFG["down"], BLOCK_K=32)}


def _experts(T, H, N, E, shared, dtype, dev, seed):
    """Inputs + NVFP4 experts quantized from random weights by the checkpoint quantizer (the real path)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(dtype)
    gate = torch.randn(E, H, generator=g) / H ** 0.5
    bias = torch.randn(E, generator=g) * 0.05

    def pack(out_f, in_f, parts):
        w = Q.NVFP4Experts(E, out_f, in_f, parts, dtype)
        rows = out_f // parts
        for e in range(E):
            for j in range(parts):
                t = Q.quantize(torch.randn(rows, in_f, generator=g) / in_f ** 0.5)
                w.load_part(e, j, t["weight"], t["weight_scale"], t["weight_scale_2"])
        return w

    w13, w2 = pack(2 * N, H, 2), pack(H, N, 1)
    if shared:
        w13.shared = (torch.randn(2 * N, H, generator=g) / H ** 0.5).to(dtype)
        w2.shared = (torch.randn(H, N, generator=g) / N ** 0.5).to(dtype)
    if dev != "cpu":
        w13, w2 = w13.to(dev), w2.to(dev)
    return x.to(dev), gate.to(dev), bias.to(dev), w13, w2


def _decode_cfg(decode):
    return {**CFG, **{k: dict(CFG[k], W4_DECODE=decode) for k in ("gate_up", "down")}}


@pytest.mark.parametrize("decode", [0, 1])
def test_kernel_dequantizes_every_code_and_scale_exactly(dev, decode):
    """One-hot activation rows through the down GEMM read the kernel's dequantized weights back column by
    column: they equal NVFP4Experts.dequantize() (the dequantize-at-load values) bit for bit, for all 256
    packed bytes and all finite E4M3 scale bytes (subnormals included)."""
    dt = torch.float32 if dev == "cpu" else torch.bfloat16
    H, N, E = 32, 64, 2
    w2 = Q.NVFP4Experts(E, H, N, 1, dt, dev)
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    w2.q.copy_(codes.repeat(E * H * N // 2 // 256).view(E, H, N // 2))
    sbytes = torch.tensor([b for b in range(128) if b & 0x7F != 0x7F], dtype=torch.uint8)  # no NaN
    w2.s.copy_(sbytes.repeat(-(-E * H * N // 16 // len(sbytes)))[: E * H * N // 16].view(E, H, N // 16))
    w2.g.copy_(torch.tensor([[0.75], [1.0 / 3.0]]))
    ws = M.MoEWorkspace(N, H, N, E, E, 1, dt, dev, split_k=1)
    ids = torch.arange(N, device=dev)[:, None] % E  # token t -> expert t % E
    M.moe_align(ids, torch.ones(N, 1, device=dev), ws)
    ws.inter.copy_(torch.eye(N, dtype=dt, device=dev))  # pair p = token p: row p selects input column p
    M.moe_down(w2, ws, _decode_cfg(decode))
    want = w2.dequantize()
    for t in range(N):
        got = ws.pair_out[t]
        assert torch.equal(got.to(dt), want[t % E][:, t]), t


@pytest.mark.parametrize("dtype,T,shared,compact,seed,decode", [
    (torch.float32, 8, True, False, 0, 0),
    (torch.float16, 5, True, True, 1, 0),
    (torch.float32, 7, False, False, 2, 0),
    (torch.float16, 6, True, False, 3, 1),
])
def test_fused_moe_w4_matches_dequantized_reference(dev, dtype, T, shared, compact, seed, decode):
    if dev == "cuda":
        dtype = torch.bfloat16
    H, N, E, k, ng, tg = 64, 32, 16, 4, 4, 2
    x, gate, bias, w13, w2 = _experts(T, H, N, E, shared, dtype, dev, seed)
    E1 = E + int(shared)
    ws = M.MoEWorkspace.create(T, H, N, E, E1, k, dtype, dev, split_k=2)
    ws.compact = compact
    ws.out.fill_(float("nan"))
    out = M.fused_moe(x, gate, bias, w13, w2, top_k=k, n_group=ng, topk_group=tg, ws=ws, configs=_decode_cfg(decode))
    assert not torch.isnan(out).any()
    topk = (ws.topk_ids.long(), ws.topk_w)
    ref = W4.moe_w4_reference(x, gate, bias, w13, w2, k, ng, tg, topk=topk)
    tol = 1e-5 if dtype == torch.float32 else 3e-3
    assert rel_err(out, ref) < tol
    # the same experts dequantized at load through the 16-bit kernels: the same values, so the same result
    # up to the fp32 summation order (even/odd split of the K loop)
    a, b = w13.dequantize(), w2.dequantize()
    if shared:
        a, b = torch.cat([a, w13.shared[None]]), torch.cat([b, w2.shared[None]])
    ws16 = M.MoEWorkspace.create(T, H, N, E, E1, k, dtype, dev, split_k=2)
    out16 = M.fused_moe(x, gate, bias, a.contiguous(), b.contiguous(), top_k=k, n_group=ng, topk_group=tg,
                        ws=ws16, configs=CFG)
    assert rel_err(out, out16) < tol


def test_w4_refuses_bad_tiles_and_norm_fold(dev):
    x, gate, bias, w13, w2 = _experts(4, 64, 32, 16, True, torch.float32, dev, 3)
    ws = M.MoEWorkspace.create(4, 64, 32, 16, 17, 4, torch.float32, dev, split_k=2)
    M.moe_route_align(x, gate, bias, ws, 17, 4, 4, 2, configs=CFG)
    with pytest.raises(ValueError, match="BLOCK_K a multiple of 32"):
        M.moe_gate_up(x, w13, ws, 4, {**CFG, "gate_up": dict(CFG["gate_up"], BLOCK_K=16)})
    with pytest.raises(ValueError, match="norm_w"):
        M.moe_gate_up(x, w13, ws, 4, CFG, norm_w=torch.ones(64))
    ws_noshared = M.MoEWorkspace.create(4, 64, 32, 16, 16, 4, torch.float32, dev, split_k=2)
    with pytest.raises(ValueError, match="workspace"):
        M.moe_down(w2, ws_noshared, CFG)


@pytest.mark.gpu
def test_fused_moe_w4_bf16_full_shape():
    T, H, N, E, k = 32, 2048, 512, 256, 8
    g = torch.Generator(device="cuda").manual_seed(0)
    w13 = W4.random_nvfp4_experts(E, 2 * N, H, 2, torch.bfloat16, "cuda", g, std=H ** -0.5)
    w2 = W4.random_nvfp4_experts(E, H, N, 1, torch.bfloat16, "cuda", g, std=N ** -0.5)
    w13.shared = torch.randn(2 * N, H, device="cuda", generator=g).to(torch.bfloat16) * H ** -0.5
    w2.shared = torch.randn(H, N, device="cuda", generator=g).to(torch.bfloat16) * N ** -0.5
    x = torch.randn(T, H, device="cuda", generator=g).to(torch.bfloat16)
    gate = torch.randn(E, H, device="cuda", generator=g) * H ** -0.5
    bias = torch.randn(E, device="cuda", generator=g) * 0.05
    ws = M.MoEWorkspace.create(T, H, N, E, E + 1, k, torch.bfloat16, "cuda")
    ws.pair_out.fill_(float("nan"))
    out = M.fused_moe(x, gate, bias, w13, w2, top_k=k, ws=ws)
    torch.cuda.synchronize()
    assert not torch.isnan(ws.pair_out).any()
    ref = W4.moe_w4_reference(x, gate, bias, w13, w2, k, topk=(ws.topk_ids.long(), ws.topk_w))
    assert rel_err(out, ref) < 1e-2
