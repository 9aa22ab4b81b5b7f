"""Weights-only 4-bit (nvfp4-w4a16) expert GEMMs vs the dequantize-at-load values (repro/engine/kernels/moe_w4.py)."""
import pytest
import torch

pytest.importorskip("triton")

from repro.checkpoint import nvfp4 as Q  # noqa: E402
from repro.engine.kernels import moe as M  # noqa: E402
from repro.engine.kernels import moe_gemm as MG  # noqa: E402
from repro.engine.kernels import moe_w4 as W4  # noqa: E402

from .conftest import rel_err  # noqa: E402
from .test_moe import SMALL_CFG  # noqa: E402

# the 16-bit kernels' small tiles, with BLOCK_K = 32 (two 16-wide dots of even / odd inputs per K tile)
CFG = {**SMALL_CFG, "gate_up": dict(SMALL_CFG["gate_up"], BLOCK_K=32), "down": dict(SMALL_CFG["down"], BLOCK_K=32)}


#: the fused 4-bit MoE in a 16-bit dtype against the fp32 reference on the same dequantized weights: three roundings
#: to the dtype in sequence (inter, the pair rows, the output). Emulated in torch in bf16 at these tests' shapes over
#: 40 seeds: rel. err. median 2.8e-3, max 3.4e-3 (max 2.8e-3 with fp32 pair rows); the H100's kernels 3.0e-3 and
#: 3.1e-3 (2026-12-07). fp16 rounds 8x finer.
BF16_TOL = 5e-3


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


def _prmt(a, b, sel):
    """PTX ``prmt.b32`` (default mode) on int64 tensors: byte k of the result is byte (sel >> 4k) & 7 of the
    8 bytes b:a (bit 3 of a selector nibble replicates that byte's sign bit; PTX ISA, "prmt")."""
    src = (a & 0xFFFFFFFF) | ((b & 0xFFFFFFFF) << 32)
    sel = torch.as_tensor(sel)
    out = torch.zeros_like(src)
    for k in range(4):
        nib = (sel >> (4 * k)) & 0xF
        byte = (src >> (8 * (nib & 7))) & 0xFF
        byte = torch.where((nib & 8) != 0, torch.where(byte >= 0x80, 0xFF, 0), byte)
        out |= byte << (8 * k)
    return out


def _bits(t):
    return t.view(torch.int16).long() & 0xFFFF


def _derived_tables(s32):
    """Decode 4's table build (moe_w4._LUT_TABLE_DERIVED) emulated: P = (B, A) = (bf16(fl32(1.5 s)), bf16(s)) as
    one bf16x2 word, (B/2, A/2), (2B, 2A), (4B, 4A) by bf16 multiplies (rounded to nearest, as mul.rn.bf16x2),
    then the four PRMTs (0x640D / 0x751D: byte 0 = the replicated sign bit of A's high byte)."""
    a, b = s32.to(torch.bfloat16), (s32 * 1.5).to(torch.bfloat16)
    word = lambda lo, hi: _bits(lo) | (_bits(hi) << 16)  # noqa: E731
    p, q, p2, p4 = word(a, b), word(a * 0.5, b * 0.5), word(a * 2.0, b * 2.0), word(a * 4.0, b * 4.0)
    return _prmt(q, p, 0x640D), _prmt(q, p, 0x751D), _prmt(p2, p4, 0x6420), _prmt(p2, p4, 0x7531)


def _emulate_lut_decode(words, s32, dtype, derived=False):
    """The inline-PTX lookup-table decode of moe_w4 (tables + word decode), emulated with integer tensor ops:
    words int64 [n] in the "lut" layout, s32 fp32 [n] their block scales -> [n, 8] ``dtype`` values in input
    order 8t..8t+7 (X_i = input 2i, X_{4+i} = input 2i+1). ``derived``: decode 4's tables, else decode 3's."""
    mags = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    T = _bits((mags[None, :] * s32[:, None]).to(dtype))  # [n, 8] = bf16(fl32(c·s))
    tl0 = sum((T[:, c] & 0xFF) << (8 * c) for c in range(4))
    th0 = sum((T[:, c] >> 8) << (8 * c) for c in range(4))
    tl1 = sum((T[:, 4 + c] & 0xFF) << (8 * c) for c in range(4))
    th1 = sum((T[:, 4 + c] >> 8) << (8 * c) for c in range(4))
    if derived:
        tl0, th0, tl1, th1 = _derived_tables(s32)
    i = words & 0x77777777
    j = i >> 16
    l0, h0 = _prmt(tl0, tl1, i & 0xFFFF), _prmt(th0, th1, i & 0xFFFF)
    l1, h1 = _prmt(tl0, tl1, j), _prmt(th0, th1, j)
    h0 = h0 | (words & 0x80808080)
    h1 = h1 | ((words << 4) & 0x80808080)
    v = [_prmt(l0, h0, 0x5140), _prmt(l0, h0, 0x7362), _prmt(l1, h1, 0x5140), _prmt(l1, h1, 0x7362)]
    halves = torch.stack([torch.stack([x & 0xFFFF, x >> 16], -1) for x in v], 1).reshape(-1, 8)  # X_0..X_7
    vals = halves.to(torch.int16).view(dtype)  # wraps >= 0x8000 to negative int16: the same bits
    order = [0, 4, 1, 5, 2, 6, 3, 7]  # inputs 0..7 = X_0, X_4, X_1, X_5, ...
    return vals[:, order]


def _all_codes_and_scales(gs):
    """(packed bytes [rows, 256] in the export's layout, E4M3 scales [rows, 32], global scale per row, rows):
    every byte in every word position against every finite non-negative E4M3 scale byte x each of ``gs``."""
    sbytes = torch.arange(127, dtype=torch.int32).to(torch.uint8)  # every finite E4M3 byte (0x7F is NaN)
    sb = sbytes.repeat(len(gs))  # one row per (scale byte, global scale)
    g2 = torch.tensor(gs).repeat_interleave(127)
    q = torch.arange(256, dtype=torch.int32).to(torch.uint8).repeat(sb.numel(), 1)
    scale = sb[:, None].repeat(1, q.shape[1] * 2 // 16).view(torch.float8_e4m3fn)
    return q, scale, g2, q.shape[0]


def _decode_all(q, scale, g2, rows, derived):
    in_f = q.shape[1] * 2
    words = Q._words(Q.to_lut_layout(q)).reshape(-1)  # [rows * in/8]
    s32 = (scale.float()[:, :, None].repeat(1, 1, 2).reshape(rows, -1) * g2[:, None]).reshape(-1)
    return _emulate_lut_decode(words, s32, torch.bfloat16, derived).reshape(rows, in_f)


@pytest.mark.parametrize("derived", [False, True])
def test_lut_decode_is_dequantize_at_load_for_every_code_and_scale(derived):
    """The lookup-table decode's bit design (per-block magnitude tables of bf16(fl32(e2m1 · s32)), byte-permute
    lookups, sign bits of the "lut" layout) emulated on the CPU: every one of the 2^8 code pairs x 4 word
    positions, against every finite E4M3 scale byte x 3 global scales, equals nvfp4.dequantize bit for bit;
    derived (decode 4): tables from bf16(s) and bf16(1.5 s) by power-of-two multiples, also at both ends of
    moe_w4.DERIVED_G_RANGE (the smallest block scales' A/2 at the least normal bf16, 6 · 448 · g near the top)."""
    dtype = torch.bfloat16
    gs = [1.0, 1.0 / 3.0, 0.7 * 2.0 ** -20] + (list(W4.DERIVED_G_RANGE) if derived else [])
    q, scale, g2, rows = _all_codes_and_scales(gs)
    want = torch.stack([Q.dequantize(q[r:r + 1], scale[r:r + 1], g2[r], dtype=dtype)[0] for r in range(rows)])
    got = _decode_all(q, scale, g2, rows, derived)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    assert torch.equal(Q.from_lut_layout(Q.to_lut_layout(q)), q)
    if derived:
        assert W4.derived_tables_ok(g2)


@pytest.mark.parametrize("g", [2.0 ** -124, 2.0 ** 123])
def test_derived_tables_refused_outside_their_range(g):
    """Outside DERIVED_G_RANGE the derived tables are wrong for some block scale (A/2 subnormal: halving and
    rounding no longer commute; 4 · B overflows): the guard says so, the default decode is then 3, an explicit
    decode 4 is refused, and the kernels' cached check (moe_gemm.experts_derived_ok) re-checks g after it changes."""
    q, scale, g2, rows = _all_codes_and_scales([g])
    want = torch.stack([Q.dequantize(q[r:r + 1], scale[r:r + 1], g2[r], dtype=torch.bfloat16)[0]
                        for r in range(rows)])
    got = _decode_all(q, scale, g2, rows, derived=True)
    assert not torch.equal(got.view(torch.int16), want.view(torch.int16))
    assert not W4.derived_tables_ok(g2)
    w = Q.NVFP4Experts(2, 8, 32, 1, torch.bfloat16)
    w.g.fill_(0.5)
    assert MG.experts_derived_ok(w)
    w.g[1, 0] = g
    assert MG.experts_derived_ok(w) is False
    act = torch.zeros(1, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="W4_DECODE 4"):
        W4.pick_decode("lut", act, 4, derived_ok=False)


def test_lut_layout_round_trip_and_errors():
    g = torch.Generator().manual_seed(1)
    q = torch.randint(0, 256, (3, 5, 24), generator=g, dtype=torch.int32).to(torch.uint8)
    lut = Q.to_lut_layout(q)
    assert lut.shape == q.shape and not torch.equal(lut, q)
    assert torch.equal(Q.from_lut_layout(lut), q)
    with pytest.raises(ValueError, match="multiple of 4"):
        Q.to_lut_layout(q[..., :6])
    w = Q.NVFP4Experts(2, 8, 32, 1, torch.float32)
    w.q.copy_(torch.randint(0, 256, w.q.shape, generator=g, dtype=torch.int32).to(torch.uint8))
    w.s.fill_(0x38)  # 1.0
    w.g.fill_(0.5)
    m = w.with_layout("modelopt")
    assert m.layout == "modelopt" and torch.equal(m.dequantize(), w.dequantize())
    assert torch.equal(m.with_layout("lut").q, w.q)
    with pytest.raises(ValueError, match="layout"):
        Q.NVFP4Experts(2, 8, 32, 1, torch.float32, layout="marlin")


@pytest.mark.parametrize("decode", [0, 1, 2, 3, 4])
def test_kernel_dequantizes_every_code_and_scale_exactly(dev, decode):
    """One-hot activation rows through the down GEMM read the kernel's dequantized weights back column by
    column: they equal NVFP4Experts.dequantize() (the dequantize-at-load values) bit for bit, for all 256
    packed bytes and all finite E4M3 scale bytes (subnormals included). Decodes 0/1 read the "modelopt"
    layout, 2/3/4 the "lut" one (3/4, inline PTX, on the GPU only)."""
    if decode >= 3 and dev == "cpu":
        pytest.skip("inline PTX: GPU only")
    dt = torch.float32 if dev == "cpu" else torch.bfloat16
    H, N, E = 64, 64, 2
    w2 = Q.NVFP4Experts(E, H, N, 1, dt, dev, layout=W4.DECODE_LAYOUT[decode])
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    w2.q.copy_(codes.repeat(E * H * N // 2 // 256).view(E, H, N // 2))
    sbytes = torch.tensor([b for b in range(128) if b & 0x7F != 0x7F], dtype=torch.uint8)  # no NaN
    w2.s.copy_(sbytes.repeat(-(-E * H * N // 16 // len(sbytes)))[: E * H * N // 16].view(E, H, N // 16))
    w2.g.copy_(torch.tensor([[0.75], [1.0 / 3.0]]))
    ws = M.MoEWorkspace(N, H, N, E, E, 1, dt, dev, split_k=1)
    ids = torch.arange(N, device=dev)[:, None] % E  # token t -> expert t % E
    M.moe_align(ids, torch.ones(N, 1, device=dev), ws)
    ws.inter.copy_(torch.eye(N, dtype=dt, device=dev))  # pair p = token p: row p selects input column p
    cfg = _decode_cfg(decode)
    if decode >= 3:  # >= 16 packed bytes per thread (moe_w4.pick_decode)
        cfg = {**cfg, "down": dict(cfg["down"], BLOCK_N=64, BLOCK_K=64, num_warps=4)}
    M.moe_down(w2, ws, cfg)
    want = w2.dequantize()
    for t in range(N):
        got = ws.pair_out[t]
        assert torch.equal(got.to(dt), want[t % E][:, t]), t


@pytest.mark.parametrize("dtype,T,shared,compact,seed,decode", [
    (torch.float32, 8, True, False, 0, 0),
    (torch.float16, 5, True, True, 1, 0),
    (torch.float32, 7, False, False, 2, 0),
    (torch.float16, 6, True, False, 3, 1),
    (torch.float32, 8, True, False, 4, 2),
    (torch.float16, 5, True, True, 5, 3),
    (torch.float16, 6, True, False, 6, 4),
])
def test_fused_moe_w4_matches_dequantized_reference(dev, dtype, T, shared, compact, seed, decode):
    if dev == "cuda":
        dtype = torch.bfloat16
    H, N, E, k, ng, tg = 64, 32, 16, 4, 4, 2
    x, gate, bias, w13, w2 = _experts(T, H, N, E, shared, dtype, dev, seed)
    if decode in (0, 1):
        w13, w2 = w13.with_layout("modelopt"), w2.with_layout("modelopt")
    elif decode >= 3 and dev == "cpu":
        decode = 2
    E1 = E + int(shared)
    ws = M.MoEWorkspace.create(T, H, N, E, E1, k, dtype, dev, split_k=2)
    ws.compact = compact
    ws.out.fill_(float("nan"))
    cfg = _decode_cfg(decode)
    if decode >= 3:  # tiles with >= 16 packed bytes per thread (moe_w4.pick_decode)
        cfg = {**cfg, "gate_up": dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=64, num_warps=1, num_stages=2,
                                      W4_DECODE=decode),
               "down": dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=32, num_warps=1, num_stages=2, W4_DECODE=decode)}
    out = M.fused_moe(x, gate, bias, w13, w2, top_k=k, n_group=ng, topk_group=tg, ws=ws, configs=cfg)
    assert not torch.isnan(out).any()
    topk = (ws.topk_ids.long(), ws.topk_w)
    ref = W4.moe_w4_reference(x, gate, bias, w13, w2, k, ng, tg, topk=topk)
    tol = 1e-5 if dtype == torch.float32 else BF16_TOL
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


@pytest.mark.parametrize("block_k", [128, 64])
def test_fused_moe_w4_k128_tiles_match_dequantized_reference(dev, block_k):
    """BLOCK_K = 128 and 64: the row interleave built with tl.join (the kWidth-8 dot operand on the GPU,
    moe_w4._interleave_rows), the default decode of the layout (2 under the interpreter, 3 on the GPU)."""
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    T, H, N, E, k, ng, tg = 6, 128, 128, 8, 2, 4, 2
    x, gate, bias, w13, w2 = _experts(T, H, N, E, True, dtype, dev, 7)
    ws = M.MoEWorkspace.create(T, H, N, E, E + 1, k, dtype, dev, split_k=2)
    cfg = {**CFG, "gate_up": dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=block_k, num_warps=1, num_stages=2),
           "down": dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=block_k, num_warps=1, num_stages=2)}
    ws.out.fill_(float("nan"))
    out = M.fused_moe(x, gate, bias, w13, w2, top_k=k, n_group=ng, topk_group=tg, ws=ws, configs=cfg)
    ref = W4.moe_w4_reference(x, gate, bias, w13, w2, k, ng, tg, topk=(ws.topk_ids.long(), ws.topk_w))
    assert not torch.isnan(out).any()
    assert rel_err(out, ref) < (1e-5 if dtype == torch.float32 else BF16_TOL)


#: the batched round's candidate 4-bit row tiles (docs/bench/graph_round_w4_sweep_sets.json): BLOCK_M 32 / 64
BATCHED_W4_TILES = {
    "m32": {"gate_up": dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=3),
            "down": dict(BLOCK_M=32, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=3)},
    "m64": {"gate_up": dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=3),
            "down": dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=3)},
    "m32_w8": {"gate_up": dict(BLOCK_M=32, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=3),
               "down": dict(BLOCK_M=32, BLOCK_N=256, BLOCK_K=64, num_warps=8, num_stages=3)},
    "m64_gu_k128": {"gate_up": dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=3),
                    "down": dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=3)},
}


@pytest.mark.parametrize("tiles", list(BATCHED_W4_TILES))
def test_down_reads_every_code_exactly_batched_row_tiles(dev, tiles):
    """The one-hot read-back of test_kernel_dequantizes_every_code_and_scale_exactly at the batched round's row
    tiles (BLOCK_M 32 / 64: another MMA layout on the GPU, wgmma from 64 rows): 64 pairs per expert, so every row
    of a 64-row tile is used; bit for bit equal to NVFP4Experts.dequantize() (GPU: decode 4, the tiles as given;
    interpreter: decode 2 with the same BLOCK_M / BLOCK_K)."""
    cfg_t = dict(BATCHED_W4_TILES[tiles]["down"])
    dt = torch.float32 if dev == "cpu" else torch.bfloat16
    H, N, E = max(cfg_t["BLOCK_N"], 64) if dev == "cuda" else 64, 128, 2
    if dev == "cpu":
        cfg_t.update(BLOCK_N=64, num_warps=1)
    w2 = Q.NVFP4Experts(E, H, N, 1, dt, dev, layout="lut")
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    w2.q.copy_(codes.repeat(-(-E * H * N // 2 // 256))[: E * H * N // 2].view(E, H, N // 2))
    sbytes = torch.tensor([b for b in range(128) if b & 0x7F != 0x7F], dtype=torch.uint8)  # no NaN
    w2.s.copy_(sbytes.repeat(-(-E * H * N // 16 // len(sbytes)))[: E * H * N // 16].view(E, H, N // 16))
    w2.g.copy_(torch.tensor([[0.75], [1.0 / 3.0]]))
    ws = M.MoEWorkspace(N, H, N, E, E, 1, dt, dev, split_k=1)
    ids = torch.arange(N, device=dev)[:, None] % E  # token t -> expert t % E: 64 pairs per expert
    M.moe_align(ids, torch.ones(N, 1, device=dev), ws)
    ws.inter.copy_(torch.eye(N, dtype=dt, device=dev))  # pair p = token p: row p selects input column p
    ws.pair_out.fill_(float("nan"))
    M.moe_down(w2, ws, {**CFG, "down": cfg_t})
    want = w2.dequantize()
    for t in range(N):
        assert torch.equal(ws.pair_out[t].to(dt), want[t % E][:, t]), t


@pytest.mark.parametrize("tiles", ["m32", "m64"])
def test_fused_moe_w4_batched_row_tiles_match_dequantized_reference(dev, tiles):
    """The fused 4-bit MoE at the batched round's row tiles (BLOCK_M 32 / 64, BLOCK_K 64) with 40 tokens (the
    shared expert's 40 rows span two 32-row tiles) against the dequantize-at-load reference, as the single-request
    BLOCK_M 16 with the same other tiles (slot invariance at these tiles: tests/kernels/test_batched_forward.py)."""
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    T, H, N, E, k, ng, tg = 40, 128, 128, 8, 2, 4, 2
    x, gate, bias, w13, w2 = _experts(T, H, N, E, True, dtype, dev, 8)
    bt = BATCHED_W4_TILES[tiles]
    cfg = {**CFG, "gate_up": dict(bt["gate_up"]), "down": dict(bt["down"], BLOCK_N=min(bt["down"]["BLOCK_N"], H))}
    for c in (cfg, {**CFG, **{n: dict(v, BLOCK_M=16) for n, v in cfg.items() if n in ("gate_up", "down")}}):
        ws = M.MoEWorkspace.create(T, H, N, E, E + 1, k, dtype, dev, split_k=2)
        ws.out.fill_(float("nan"))
        ws.pair_out.fill_(float("nan"))
        out = M.fused_moe(x, gate, bias, w13, w2, top_k=k, n_group=ng, topk_group=tg, ws=ws, configs=c)
        assert not torch.isnan(out).any()
        ref = W4.moe_w4_reference(x, gate, bias, w13, w2, k, ng, tg, topk=(ws.topk_ids.long(), ws.topk_w))
        assert rel_err(out, ref) < (1e-5 if dtype == torch.float32 else BF16_TOL)


def test_w4_refuses_bad_tiles_and_norm_fold(dev):
    x, gate, bias, w13, w2 = _experts(4, 64, 32, 16, True, torch.float32, dev, 3)
    ws = M.MoEWorkspace.create(4, 64, 32, 16, 17, 4, torch.float32, dev, split_k=2)
    M.moe_route_align(x, gate, bias, ws, 17, 4, 4, 2, configs=CFG)
    with pytest.raises(ValueError, match="BLOCK_K a multiple of 32"):
        M.moe_gate_up(x, w13, ws, 4, {**CFG, "gate_up": dict(CFG["gate_up"], BLOCK_K=16)})
    with pytest.raises(ValueError, match="norm_w"):
        M.moe_gate_up(x, w13, ws, 4, CFG, norm_w=torch.ones(64))
    with pytest.raises(ValueError, match="layout 'modelopt'"):
        M.moe_down(w2, ws, {**CFG, "down": dict(CFG["down"], W4_DECODE=1)})
    with pytest.raises(ValueError, match="W4_DECODE 3"):
        M.moe_down(w2, ws, {**CFG, "down": dict(CFG["down"], W4_DECODE=3)})  # fp32 / too few bytes per thread
    assert W4.pick_decode("lut", torch.zeros(1)) == 2 and W4.pick_decode("modelopt", torch.zeros(1)) == 1
    ws_noshared = M.MoEWorkspace.create(4, 64, 32, 16, 16, 4, torch.float32, dev, split_k=2)
    with pytest.raises(ValueError, match="workspace"):
        M.moe_down(w2, ws_noshared, CFG)


def test_decode_tile_counts_gate_and_up_columns():
    """A gate+up K step reads one packed tile of 2·BLOCK_N columns (gate and up rows interleaved), down one of
    BLOCK_N: the decode is chosen by those bytes per thread (session 9 found gate+up sized as BLOCK_N, so a
    BLOCK_N 32 gate+up tile fell back to the slow decode 2)."""
    from repro.engine.kernels.moe_gemm import w4_decode_tile

    assert w4_decode_tile(64, (32, 4), 2048, 1024, parts=2) == (64, 64, 4)
    assert w4_decode_tile(64, (128, 4), 512, 2048, parts=1) == (64, 128, 4)
    assert w4_decode_tile(128, (64, 4), 64, 48, parts=2) == (64, 48, 4)     # clamped to in_f and 2N


@pytest.mark.gpu
@pytest.mark.parametrize("tiles", [None, W4.W4_TILES_DEFAULT,
                                   {k: dict(v, BLOCK_K=128) for k, v in W4.W4_TILES_DEFAULT.items()},
                                   {"gate_up": dict(W4.W4_TILES_DEFAULT["gate_up"], BLOCK_N=32),
                                    "down": W4.W4_TILES_DEFAULT["down"]}])
def test_fused_moe_w4_bf16_full_shape(tiles):
    _full_shape(tiles, 32)
    if tiles is not None:   # every one of these tiles gives a thread >= 16 packed bytes: the inline-PTX decode
        ws = M.MoEWorkspace.create(32, 2048, 512, 256, 257, 8, torch.bfloat16, "cuda")
        w13 = W4.random_nvfp4_experts(256, 1024, 2048, 2, torch.bfloat16, "cuda", torch.Generator("cuda"))
        w13.shared = torch.zeros(1024, 2048, device="cuda", dtype=torch.bfloat16)
        gu = tiles["gate_up"]
        from repro.engine.kernels.moe_gemm import _expert_operand

        kw = _expert_operand(w13, ws, "moe_gate_up", gu["BLOCK_K"], None, (gu["BLOCK_N"], gu["num_warps"]),
                               parts=2)[-1]
        assert kw["W4_DECODE"] == 4


@pytest.mark.gpu
@pytest.mark.parametrize("tiles", list(BATCHED_W4_TILES))
def test_fused_moe_w4_bf16_full_shape_batched_row_tiles(tiles):
    """The full-size MoE layer at the batched round's 4-bit row tiles, 256 tokens (≈ 8 rows per routed expert, the
    shared expert over four 64-row tiles)."""
    _full_shape(BATCHED_W4_TILES[tiles], 256)


def _full_shape(tiles, T):
    H, N, E, k = 2048, 512, 256, 8
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
    out = M.fused_moe(x, gate, bias, w13, w2, top_k=k, ws=ws, configs=tiles)
    torch.cuda.synchronize()
    assert not torch.isnan(ws.pair_out).any()
    ref = W4.moe_w4_reference(x, gate, bias, w13, w2, k, topk=(ws.topk_ids.long(), ws.topk_w))
    assert rel_err(out, ref) < 1e-2
