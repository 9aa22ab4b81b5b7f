"""The "hop" 4-bit decode (W4_DECODE 5 / 6, repro/engine/kernels/moe_w4_hop.py) and the swapped-operand expert
GEMMs (tile key W4_SWAP) vs their torch references: every code and scale exactly, the fused MoE block within the
bf16 rounding of the dequantized experts."""
import pytest
import torch

pytest.importorskip("triton")

from repro.checkpoint import nvfp4 as Q  # noqa: E402
from repro.engine.kernels import moe as M  # noqa: E402
from repro.engine.kernels import moe_w4 as W4  # noqa: E402
from repro.engine.kernels.moe_w4_hop import hop_decode_reference, hop_shift  # noqa: E402

from .conftest import rel_err  # noqa: E402
from .test_moe_w4 import CFG, _experts  # noqa: E402

SBYTES = torch.tensor([b for b in range(128) if b & 0x7F != 0x7F], dtype=torch.uint8)  # every finite E4M3 >= 0


def test_hop_layout_round_trip_and_decode_reference_is_exact():
    """to_hop_layout / from_hop_layout are inverses; the bf16 bit-placement decode (what the inline PTX does) gives
    e2m1 · e4m3 · 2^-8 exactly for all 256 packed bytes and every finite E4M3 scale (subnormals and 448 included);
    fp32 / fp16 give e2m1 · e4m3 (no shift)."""
    q = torch.arange(256, dtype=torch.int32).to(torch.uint8).repeat(len(SBYTES), 1)  # [S, 256] = 512 inputs
    s = SBYTES[:, None].expand(len(SBYTES), 32).contiguous()
    h = Q.to_hop_layout(q)
    assert torch.equal(Q.from_hop_layout(h), q) and not torch.equal(h, q)
    exact = Q.dequantize(q, s.view(torch.float8_e4m3fn), torch.tensor(2.0 ** -8))
    assert torch.equal(hop_decode_reference(h, s, torch.bfloat16).float(), exact)
    for dt in (torch.float32, torch.float16):
        want = Q.dequantize(q, s.view(torch.float8_e4m3fn), torch.tensor(1.0))
        assert torch.equal(hop_decode_reference(h, s, dt).float(), want.to(dt).float())
    with pytest.raises(ValueError, match="to_hop_layout"):
        Q.to_hop_layout(q[:, :6])
    w = Q.NVFP4Experts(2, 8, 32, 1, torch.float32)
    w.q.copy_(torch.randint(0, 256, w.q.shape, dtype=torch.int32).to(torch.uint8))
    w.s.copy_(SBYTES[:32].repeat(1)[: 2 * 8 * 2].view(2, 8, 2))
    w.g.fill_(0.5)
    hw = w.with_layout("hop")
    assert hw.layout == "hop" and torch.equal(hw.dequantize(), w.dequantize())
    assert torch.equal(hw.with_layout("lut").q, w.q)


def _every_code_experts(dev, dt, H=64, N=64, E=2):
    w2 = Q.NVFP4Experts(E, H, N, 1, dt, dev, layout="hop")
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    w2.q.copy_(codes.repeat(E * H * N // 2 // 256).view(E, H, N // 2))
    w2.s.copy_(SBYTES.repeat(-(-E * H * N // 16 // len(SBYTES)))[: E * H * N // 16].view(E, H, N // 16))
    w2.g.copy_(torch.tensor([[0.75], [1.0 / 3.0]]))
    return w2


@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("decode", [5, 6])
def test_down_reads_every_code_as_block_product_times_global_scale(dev, decode, swap):
    """One-hot activation rows through the down GEMM read the kernel's weights back: fl32(w' · (g · 2^SHIFT)),
    w' = hop_decode_reference (e2m1 · e4m3 · 2^-SHIFT, exact), bit for bit, for all 256 packed bytes and every
    finite E4M3 scale; decode 5 (inline PTX) on the GPU only; swapped operands (wgmma on Hopper) and not."""
    if decode == 5 and dev == "cpu":
        pytest.skip("inline PTX: GPU only")
    dt = torch.float32 if dev == "cpu" else torch.bfloat16
    H, N, E = 64, 64, 2
    w2 = _every_code_experts(dev, dt, H, N, E)
    ws = M.MoEWorkspace(N, H, N, E, E, 1, dt, dev, split_k=1, pair_dtype=torch.float32)  # the fp32 sums, unrounded
    ids = torch.arange(N, device=dev)[:, None] % E
    M.moe_align(ids, torch.ones(N, 1, device=dev), ws)
    ws.inter.copy_(torch.eye(N, dtype=dt, device=dev))
    cfg = {**CFG, "down": dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=2, W4_DECODE=decode,
                               W4_SWAP=swap)}
    M.moe_down(w2, ws, cfg)
    wp = hop_decode_reference(w2.q, w2.s, dt).float()  # [E, H, N]
    want = wp * (w2.g[:, :, None] * 2.0 ** hop_shift(dt))
    for t in range(N):
        assert torch.equal(ws.pair_out[t], want[t % E][:, t]), t


@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("dtype,T,shared,compact,seed,decode", [
    (torch.float32, 8, True, False, 0, 6),
    (torch.float16, 5, True, True, 1, 6),
    (torch.float32, 7, False, False, 2, 5),
])
def test_fused_moe_hop_matches_dequantized_reference(dev, dtype, T, shared, compact, seed, decode, swap):
    """The fused MoE block over "hop" experts equals the fp32 reference on the dequantized experts within the
    bf16 rounding of the weights (the contract: block products exact, g on the fp32 accumulator); fp32 under
    the interpreter to 1e-5. Decode 5 falls back to its twin 6 on the CPU."""
    if dev == "cuda":
        dtype = torch.bfloat16
    elif decode == 5:
        decode = 6
    H, N, E, k, ng, tg = 128, 64, 16, 4, 4, 2
    x, gate, bias, w13, w2 = _experts(T, H, N, E, shared, dtype, dev, seed)
    w13, w2 = w13.with_layout("hop"), w2.with_layout("hop")
    ws = M.MoEWorkspace.create(T, H, N, E, E + int(shared), k, dtype, dev, split_k=2)
    ws.compact = compact
    ws.out.fill_(float("nan"))
    tiles = dict(BLOCK_M=16, BLOCK_K=64, num_warps=4, num_stages=2, W4_DECODE=decode, W4_SWAP=swap)
    cfg = {**CFG, "gate_up": dict(tiles, BLOCK_N=32), "down": dict(tiles, BLOCK_N=64)}
    out = M.fused_moe(x, gate, bias, w13, w2, top_k=k, n_group=ng, topk_group=tg, ws=ws, configs=cfg)
    assert not torch.isnan(out).any()
    ref = W4.moe_w4_reference(x, gate, bias, w13, w2, k, ng, tg, topk=(ws.topk_ids.long(), ws.topk_w))
    assert rel_err(out, ref) < (1e-5 if dtype == torch.float32 else 5e-3)


def test_swap_needs_the_hop_layout(dev):
    dt = torch.float32 if dev == "cpu" else torch.bfloat16
    H, N, E = 64, 64, 2
    w2 = _every_code_experts(dev, dt, H, N, E).with_layout("lut")
    ws = M.MoEWorkspace(N, H, N, E, E, 1, dt, dev, split_k=1)
    with pytest.raises(ValueError, match="W4_SWAP"):
        M.moe_down(w2, ws, {**CFG, "down": dict(CFG["down"], BLOCK_K=64, W4_SWAP=True)})
    assert W4.pick_decode("hop", torch.zeros(1)) == 6
