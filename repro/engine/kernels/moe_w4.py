"""Weights-only 4-bit routed experts (precision ``nvfp4-w4a16``): NVFP4 weight tiles dequantized in registers
for the grouped expert GEMMs of :mod:`.moe`, beside their torch reference :func:`moe_w4_reference`.

Format (NVIDIA ModelOpt NVFP4 export, :mod:`repro.checkpoint.nvfp4`; NVIDIA TensorRT Model Optimizer docs,
"NVFP4"): per expert projection ``W [out, in]``: packed e2m1 codes ``q`` uint8 ``[out, in/2]``, E4M3 block scales
``s`` ``[out, in/16]`` (one per 16 inputs, passed as their uint8 bits), a per-tensor fp32 global scale ``g``.
Value: ``W[n, k] = e2m1(code) · (e4m3(s[n, k/16]) · g)``, computed in fp32 in that order and rounded once to
the activation dtype: exactly the values of dequantize-at-load (``nvfp4.dequantize`` in fp32, then
``.to(dtype)``). The GEMMs accumulate in fp32. Bytes streamed per weight: 0.5 + 1/16 instead of 2.

Kernel layout (:class:`repro.checkpoint.nvfp4.NVFP4Experts`): ``w13`` q ``[E, 2N, H/2]``, s ``[E, 2N, H/16]``,
g ``[E, 2]`` (gate, up); ``w2`` q ``[E, H, N/2]``, s ``[E, H, N/16]``, g ``[E, 1]``; the shared expert stays in
the activation dtype (``.shared``) and is expert index E of the same launch (a runtime branch per program).
``q`` is in layout "lut" (the default; the export's bits permuted inside each 4-byte word at load,
``nvfp4.to_lut_layout``) or "modelopt" (the export's order).

Decodes (``W4_DECODE``, :func:`pick_decode`):

* 3 (layout "lut"; the GPU default where decode 4 is not exact or not built: sm_89): per 16-weight block, four byte
  tables of the 8 magnitudes ``bf16(fl32(e2m1(c) · s32))`` — the reference's own products and rounding, so exact by
  construction — then per 32-bit word (8 weights) 13 integer instructions: the selectors, 4 byte-permute (PRMT)
  lookups, the signs, 4 PRMT interleaving low and high bytes into bf16 pairs (inline PTX,
  ``tl.inline_asm_elementwise``, 4 bytes per call; bf16 activations). PRMT: PTX ISA, "prmt"; decoding several packed values per 32-bit instruction
  follows the mixed-precision Marlin kernels (Frantar et al., arXiv:2408.11743).
* 4 (default on the GPU, from sm_90, when every global scale g is in ``DERIVED_G_RANGE``): decode 3 with cheaper
  tables — only A = bf16(s32) and B = bf16(fl32(1.5 · s32)) are rounded from fp32; the other magnitudes are exact
  power-of-two multiples of them (bf16x2 multiplies: A/2, 2A, 2B, 4A, 4B) and the zero entry a sign-replicated
  byte, 9 instructions per block after s32 instead of 14 (:func:`derived_tables_ok` says when that is exact).
* 2: its pure-Triton twin (same layout and values; runs under the interpreter and for fp16 / fp32, and is the
  GPU default below sm_89, e.g. on an A100).
* 1 / 0 (layout "modelopt"): the session-3 arithmetic decodes (fp32 bit patterns, one multiply per weight).
* 5 / 6 (layout "hop"): the shift-and-mask decode of :mod:`.moe_w4_hop` (inline PTX / its pure-Triton twin), with
  another numeric contract: exact block products e2m1 · e4m3 in bf16, the global scale g on the fp32 accumulator
  (docs/engine.md §14). Only these read the tile key ``W4_SWAP`` (:func:`_w4_dot_swap`: weights as the MMA's
  operand A, wgmma on Hopper).

The K loop (:func:`_w4_gate_up_acc`, :func:`_w4_down_acc`) loads one contiguous activation tile and splits it into
even / odd inputs in registers, and one packed tile of ``[BLOCK_K/2, 2·BLOCK_N]`` (gate and up rows
interleaved) or ``[BLOCK_K/2, BLOCK_N]`` (down, rows interleaved the same way) whose decode feeds two dots
(even / odd inputs). With BLOCK_K >= 64 the interleave is built with ``tl.join``, after which Triton (3.6)
loads the packed tile straight into the dot-operand layout with kWidth 8: each thread decodes whole scale
blocks in registers, with no shared-memory round trip of the decoded tile (docs/perf_history.md, session 4).
"""
from __future__ import annotations

import torch

from ._triton import HAS_TRITON, tl, triton

__all__ = ["moe_w4_reference", "random_nvfp4_experts", "check_w4_tiles", "pick_decode", "derived_tables_ok",
           "W4_TILES_DEFAULT", "DERIVED_G_RANGE", "DECODE_MIN_CC"]

#: MoE tiles of the full-size 4-bit round (:class:`~repro.engine.kernels.fastpath.BlockForward` uses them when
#: the experts are packed and no tiles are given; the decode is :func:`pick_decode`'s default for the layout):
#: BLOCK_K 64 (93 / 96 registers, 5 programs per SM; session 4's BLOCK_K 128: 149 registers, 3 per SM), the
#: fastest measured on the H200: docs/perf_history.md, session 5. The batched round (``fastpath_batch.batched_tiles``) uses
#: them too, for every slot count: BLOCK_M 32 / 64 were faster only at 32 slots (docs/perf_history.md, "Session 5: the
#: 4-bit experts in the batched round").
W4_TILES_DEFAULT = {"gate_up": dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=3),
                    "down": dict(BLOCK_M=16, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=3)}

#: W4_DECODE values and the ``NVFP4Experts.layout`` each reads
DECODE_LAYOUT = {0: "modelopt", 1: "modelopt", 2: "lut", 3: "lut", 4: "lut", 5: "hop", 6: "hop"}

#: global scales g for which decode 4's derived tables are exact: with E4M3 block scales e ∈ {0} ∪ [2^-9, 448]
#: every s32 = fl32(e · g) is 0 or in [2^-125, 2^124), so A/2 is a normal bf16 (halving and rounding commute),
#: fl32(2^k · s32) = 2^k · s32 for k = 1, 2 and nothing overflows: bf16(fl32(c · s32)) = 2^k · bf16(fl32(c' · s32))
#: for c = 2^k · c', c' ∈ {1, 1.5} (IEEE 754 rounding is scale-invariant by powers of two in the normal range)
DERIVED_G_RANGE = (2.0 ** -116, 2.0 ** 115)


def derived_tables_ok(g: torch.Tensor) -> bool:
    """Whether decode 4 is exact for experts with global scales ``g`` (fp32, any shape): every g finite, in
    ``DERIVED_G_RANGE`` (block scales are non-negative E4M3, as in every ModelOpt export). Reads g (a device
    sync on a GPU: call it outside CUDA-graph capture; :meth:`NVFP4Experts.derived_tables_ok` caches it)."""
    lo, hi = DERIVED_G_RANGE
    return bool(((g >= lo) & (g <= hi)).all())


#: the compute capability each decode needs on a GPU (found by the ahead-of-time build, :mod:`repro.engine.aot`):
#: 3-6 convert the E4M3 block scales in hardware (``.to(tl.float8e4nv)``: ``cvt.rn.f16x2.e4m3x2``, sm_89; Triton
#: refuses fp8e4nv below 8.9), 4 and 5 multiply bf16 pairs (``mul.rn.bf16x2``, sm_90: PTX ISA, "mul (half
#: precision)"); 0-2 use integer and fp32 arithmetic only (any card)
DECODE_MIN_CC = {3: (8, 9), 4: (9, 0), 5: (9, 0), 6: (8, 9)}
_DECODE_NEEDS = {3: "the E4M3 hardware conversion", 4: "mul.rn.bf16x2", 5: "mul.rn.bf16x2",
                 6: "the E4M3 hardware conversion"}


def pick_decode(layout: str, act: torch.Tensor, decode: int | None = None, kernel: str = "moe",
                tile: tuple[int, int, int] = (128, 64, 4), derived_ok: bool | None = True) -> int:
    """The ``W4_DECODE`` of a launch over experts in ``layout`` with activations like ``act``: ``decode`` when
    given (checked), else 4 (inline-PTX lookup tables, derived) or 3 (the same, every table entry rounded from
    fp32) for "lut" experts with bf16 activations on a CUDA GPU and a tile (BLOCK_K, packed columns, num_warps;
    gate+up packs 2·BLOCK_N columns: ``moe_gemm.w4_decode_tile``) that gives every thread >= 16 consecutive packed bytes along K (the PTX decodes 4 bytes of one word per call,
    ``pack=4``, which needs a thread's registers to hold whole words) — 4 when ``derived_ok`` (the experts'
    :func:`derived_tables_ok`; None = unknown, e.g. first seen inside CUDA-graph capture: 3) —, 2 (the
    pure-Triton twin) for "lut" otherwise (interpreter, fp32, small tiles), 1 for "modelopt". On a GPU only the
    decodes its compute capability builds (:data:`DECODE_MIN_CC`): 4 from sm_90, 3 from sm_89, 2 below (A100).
    Raises ValueError when the decode does not read ``layout`` or needs what ``act``, the tile, g or the card is
    not (one line naming what works)."""
    from ._triton import capability, compiled

    bk, bn, nw = tile
    asm_ok = (compiled(act) and act.dtype == torch.bfloat16
              and bk // 2 >= 16 and (bk // 2) * bn >= 16 * 32 * nw)
    cc = capability(act)

    def builds(d):
        return cc is None or tuple(cc) >= DECODE_MIN_CC.get(d, (0, 0))

    if decode is None:
        if layout == "hop":
            picks = (5, 6) if asm_ok else (6,)
        elif layout == "lut":
            picks = ((4, 3, 2) if derived_ok else (3, 2)) if asm_ok else (2,)
        else:
            picks = (1,)
        for d in picks:
            if builds(d):
                return d
        raise ValueError(f"{kernel}: NVFP4 experts in layout {layout!r} need compute capability 8.9 on the GPU "
                         f"({_DECODE_NEEDS[6]}); this card is {cc[0]}.{cc[1]}: use layout 'lut' (decode 2, "
                         f"NVFP4Experts.with_layout('lut'))")
    if DECODE_LAYOUT.get(decode) != layout:
        raise ValueError(f"{kernel}: W4_DECODE {decode} reads experts in layout {DECODE_LAYOUT.get(decode)!r}, these "
                         f"are {layout!r} (convert with NVFP4Experts.with_layout, or drop W4_DECODE)")
    if not builds(decode):
        need = DECODE_MIN_CC[decode]
        works = [d for d, lay in DECODE_LAYOUT.items() if lay == layout and builds(d)]
        raise ValueError(f"{kernel}: W4_DECODE {decode} needs compute capability {need[0]}.{need[1]} "
                         f"({_DECODE_NEEDS[decode]}); this card is {cc[0]}.{cc[1]}: use "
                         f"{' or '.join(map(str, works)) or 'layout lut with decode 2'}, or drop W4_DECODE")
    if decode == 4 and derived_ok is False:
        raise ValueError(f"{kernel}: W4_DECODE 4 (derived tables) is exact only for global scales g in "
                         f"[2^-116, 2^115]; these experts have one outside (use 3, or drop W4_DECODE)")
    if decode in (3, 4, 5) and not asm_ok:
        raise ValueError(f"{kernel}: W4_DECODE {decode} (inline PTX) needs bf16 activations on a CUDA GPU and >= 16 "
                         f"packed bytes per thread (BLOCK_K/2 · BLOCK_N >= 512 · num_warps), got {act.dtype} on "
                         f"{act.device}, tile (BLOCK_K, BLOCK_N, num_warps) = {tile} (use 2, its pure-Triton twin, "
                         f"or larger tiles)")
    return decode


def moe_w4_reference(x, gate_w, expert_bias, w13, w2, top_k=8, n_group=8, topk_group=4, scaling=2.5,
                     renormalize=True, topk=None):
    """fp32 MoE block over NVFP4 experts: dequantize (``NVFP4Experts.dequantize``, the dequantize-at-load values
    in the experts' dtype), stack the shared expert as index E, then :func:`.moe.moe_reference`.

    x [T, H]; w13, w2: :class:`~repro.checkpoint.nvfp4.NVFP4Experts` ([E, 2N, H] / [E, H, N], shared expert
    in ``.shared`` or None). Returns [T, H] fp32."""
    from .moe_ref import moe_reference

    a, b = w13.dequantize(), w2.dequantize()
    if w13.shared is not None:
        a = torch.cat([a, w13.shared[None].to(a.dtype)], 0)
        b = torch.cat([b, w2.shared[None].to(b.dtype)], 0)
    return moe_reference(x, gate_w, expert_bias, a, b, top_k, n_group, topk_group, scaling, renormalize, topk)


def random_nvfp4_experts(E, out_f, in_f, parts, dtype, device, generator, std=0.02):
    """Random NVFP4 experts for benchmarks and tests: uniform random codes, E4M3 block scales uniform in
    [32, 128], global scales chosen so that the values have an rms near ``std``. The values follow the
    format exactly; their distribution is not a trained model's. Returns an ``NVFP4Experts``."""
    from repro.checkpoint.nvfp4 import NVFP4Experts

    w = NVFP4Experts(E, out_f, in_f, parts, dtype, device)
    w.q.copy_(torch.randint(0, 256, w.q.shape, generator=generator, device=device, dtype=torch.int32)
              .to(torch.uint8))
    sc = torch.empty(w.s.shape, device=device).uniform_(0.5, 2.0, generator=generator) * 64.0
    w.s.copy_(sc.to(torch.float8_e4m3fn).view(torch.uint8))
    # rms of a uniform random e2m1 code ≈ 3.0, mean block scale ≈ 80: rms of the values ≈ std
    w.g.copy_(torch.empty(w.g.shape, device=device).uniform_(0.9, 1.1, generator=generator) * (std / 240.0))
    return w


def check_w4_tiles(block_k: int, k_total: int) -> None:
    """Raise ValueError unless a BLOCK_K fits the 4-bit K loop: even halves of >= 16 (dot widths), whole
    16-element scale groups (at least two: the scale tile is [BLOCK_K/16, BLOCK_N]), dividing the reduction."""
    if block_k < 32 or block_k % 32 or k_total % block_k:
        raise ValueError(f"nvfp4-w4a16 kernels need BLOCK_K a multiple of 32 dividing {k_total}, got {block_k}")


if HAS_TRITON:
    from .moe_w4_hop import _hop_tile, _hop_word_tile

    @triton.jit
    def _e2m1_pair(q):
        """Packed bytes (int32 tensor) -> (low-nibble, high-nibble) E2M1 values as fp32, exactly, with integer
        and/shift/add plus fp32 selects only (no int->float conversion, no subnormals): the 3 magnitude bits
        (e1 e0 m) go into the fp32 exponent/mantissa with exponent bias 126, which reads 2^(e-1)·(1 + m/2) —
        the E2M1 value for e >= 1; for e = 0 it reads 0.5·(1 + m/2) ∈ {0.5, 0.75} and 2f - 1 maps that to the
        E2M1 values {0, 0.5}. Bit 3 of a nibble is the sign."""
        lo = (((q << 22) & 0x01C00000) + 0x3F000000).to(tl.float32, bitcast=True)
        hi = (((q << 18) & 0x01C00000) + 0x3F000000).to(tl.float32, bitcast=True)
        lo = tl.where(lo < 1.0, lo * 2.0 - 1.0, lo)
        hi = tl.where(hi < 1.0, hi * 2.0 - 1.0, hi)
        return tl.where((q & 0x08) != 0, -lo, lo), tl.where((q & 0x80) != 0, -hi, hi)

    @triton.jit
    def _e4m3_to_f32(b):
        """Non-negative FP8 E4M3 ("e4m3fn", bias 7) bits (int tensor; ModelOpt block scales are >= 0) -> fp32,
        exactly and without subnormals: exponent bias 120 reads 2^(E-7)·(1 + m/8) (the value for E >= 1); for
        E = 0 it reads 2^-7·(1 + m/8) and (f - 2^-7)·2 = m·2^-9 is the subnormal value."""
        f = (((b & 0x7F) << 20) + 0x3C000000).to(tl.float32, bitcast=True)
        return tl.where(f < 0.015625, (f - 0.0078125) * 2.0, f)

    @triton.jit
    def _e2m1_pair_subnormal(q):
        """Packed bytes (int32 tensor) -> (low, high) E2M1 values · 2^-126 as fp32 bit patterns: the 3 magnitude bits
        go unbiased into exponent/mantissa (e = 0 lands in the fp32 subnormals: 0.5 · 2^-126 is exact there) and
        the sign bit into bit 31 — four integer operations per value, no select. Exact only where the multiply
        that follows keeps subnormal inputs (no flush-to-zero); the kernel tests check every code on the GPU."""
        lo = ((q << 22) & 0x01C00000) | ((q << 28) & -2147483648)
        hi = ((q << 18) & 0x01C00000) | ((q << 24) & -2147483648)
        return lo.to(tl.float32, bitcast=True), hi.to(tl.float32, bitcast=True)

    # ---- the lookup-table decode (W4_DECODE 2 / 3 / 4; experts in NVFP4Experts layout "lut") ------------------
    # Per 16-weight block: the 8 magnitudes T[c] = bf16(fl32(e2m1(c) · s32)), s32 = fl32(e4m3 · g) — the very
    # products and the one rounding of dequantize-at-load — as four byte tables (low bytes of T[0..3], high bytes
    # of T[0..3], low / high bytes of T[4..7]; bf16 only). Per 8 weights (one 32-bit word, nvfp4.to_lut_layout): 1 and
    # (selectors), 1 shift, 4 byte-permute lookups (PRMT), 3 ops for the signs, 4 PRMT interleaving low and
    # high bytes into bf16 pairs = 13 integer instructions, ≈ 1.6 per weight (the old exact decode: ≈ 6 plus
    # the fp32 multiply and the conversion). PRMT: PTX ISA, "prmt"; decoding several packed values per 32-bit
    # instruction follows the mixed-precision Marlin kernels (Frantar et al., arXiv:2408.11743).
    _LUT_TABLE_ASM = """{
    .reg .f32 h, a, d, t, f, x;
    .reg .b32 p01, p23, p45, p67;
    mul.rn.f32 h, $4, 0f3F000000;
    mul.rn.f32 a, $4, 0f3FC00000;
    mul.rn.f32 d, $4, 0f40000000;
    mul.rn.f32 t, $4, 0f40400000;
    mul.rn.f32 f, $4, 0f40800000;
    mul.rn.f32 x, $4, 0f40C00000;
    CVT p01, h, 0f00000000;
    CVT p23, a, $4;
    CVT p45, t, d;
    CVT p67, x, f;
    prmt.b32 $0, p01, p23, 0x6420;
    prmt.b32 $1, p01, p23, 0x7531;
    prmt.b32 $2, p45, p67, 0x6420;
    prmt.b32 $3, p45, p67, 0x7531;
    }"""
    _LUT_TABLE_BF16 = tl.constexpr(_LUT_TABLE_ASM.replace("CVT", "cvt.rn.bf16x2.f32"))
    # decode 4: the same four tables from P = (B, A) = (bf16(fl32(1.5 s)), bf16(s)) alone: (B/2, A/2), (2B, 2A),
    # (4B, 4A) by exact bf16x2 multiplies (mul.rn.bf16x2, sm_90: PTX ISA, "mul (half precision)"), T0 = +0 as the
    # replicated sign bit of A's high byte (s >= 0; selector nibble 0xD); valid for g in DERIVED_G_RANGE.
    _LUT_TABLE_DERIVED = tl.constexpr("""{
    .reg .f32 a;
    .reg .b32 p, q, p2, p4, c;
    mul.rn.f32 a, $4, 0f3FC00000;
    cvt.rn.bf16x2.f32 p, a, $4;
    mov.b32 c, 0x3F003F00;
    mul.rn.bf16x2 q, p, c;
    mov.b32 c, 0x40004000;
    mul.rn.bf16x2 p2, p, c;
    mov.b32 c, 0x40804080;
    mul.rn.bf16x2 p4, p, c;
    prmt.b32 $0, q, p, 0x640D;
    prmt.b32 $1, q, p, 0x751D;
    prmt.b32 $2, p2, p4, 0x6420;
    prmt.b32 $3, p2, p4, 0x7531;
    }""")
    # pack=4: $4 = 4 packed bytes (one word), $5/$9/$13/$17 = the block's four tables (one register per element)
    _LUT_DECODE_ASM = """{
    .reg .b32 i, j, l0, h0, l1, h1, s;
    and.b32 i, $4, 0x77777777;
    shr.u32 j, i, 16;
    prmt.b32 l0, $5, $13, i;
    prmt.b32 h0, $9, $17, i;
    prmt.b32 l1, $5, $13, j;
    prmt.b32 h1, $9, $17, j;
    and.b32 s, $4, 0x80808080;
    or.b32 h0, h0, s;
    shl.b32 s, $4, 4;
    and.b32 s, s, 0x80808080;
    or.b32 h1, h1, s;
    prmt.b32 $0, l0, h0, 0x5140;
    prmt.b32 $1, l0, h0, 0x7362;
    prmt.b32 $2, l1, h1, 0x5140;
    prmt.b32 $3, l1, h1, 0x7362;
    }"""
    _LUT_DECODE_ASM = tl.constexpr(_LUT_DECODE_ASM)
    _LUT_DECODE_CONSTRAINTS = tl.constexpr("=r,=r,=r,=r," + ",".join(["r"] * 17))

    @triton.jit
    def _bcast_rows(t, HK: tl.constexpr, BN: tl.constexpr):
        """[HK/8, BN] -> [HK, BN]: each block row repeated for its 8 byte rows."""
        return tl.reshape(tl.broadcast_to(t[:, None, :], (HK // 8, 8, BN)), (HK, BN))

    @triton.jit
    def _lut_tile(q_ptrs, s_ptrs, gs, dtype: tl.constexpr, HK: tl.constexpr, BN: tl.constexpr,
                  DECODE: tl.constexpr):
        """(even, odd) input rows ([BK/2, BN] each, in ``dtype``) of one packed tile in the "lut" layout: byte
        rows [BK/2, BN] (4 consecutive bytes = one word = inputs 8t..8t+7), scale bytes [BK/16, BN].

        DECODE 3 / 4 (bf16 on the GPU): the per-block tables (4: derived, see above) and the word decode in
        inline PTX.
        DECODE 2: the pure-Triton twin (runs under the interpreter, any dtype): each byte row reads its whole
        word back (4 byte loads), takes its two codes and signs from the "lut" bit positions and computes
        fl32(e2m1 · s32) rounded once to ``dtype`` — the same values, bit for bit."""
        if DECODE >= 3:
            # E4M3 -> fp16 -> fp32 by the hardware conversions (both exact), then fl32(e4m3 · g)
            sb = tl.load(s_ptrs, eviction_policy="evict_first").to(tl.float8e4nv, bitcast=True)
            s32 = sb.to(tl.float32) * gs  # [BK/16, BN]
            q = tl.load(q_ptrs, eviction_policy="evict_first")
            if DECODE == 3:
                t0, t1, t2, t3 = tl.inline_asm_elementwise(_LUT_TABLE_BF16, "=r,=r,=r,=r,r", [s32],
                                                           dtype=(tl.int32, tl.int32, tl.int32, tl.int32),
                                                           is_pure=True, pack=1)
            else:
                t0, t1, t2, t3 = tl.inline_asm_elementwise(_LUT_TABLE_DERIVED, "=r,=r,=r,=r,r", [s32],
                                                           dtype=(tl.int32, tl.int32, tl.int32, tl.int32),
                                                           is_pure=True, pack=1)
            tabs = [q, _bcast_rows(t0, HK, BN), _bcast_rows(t1, HK, BN), _bcast_rows(t2, HK, BN),
                    _bcast_rows(t3, HK, BN)]
            return tl.inline_asm_elementwise(_LUT_DECODE_ASM, _LUT_DECODE_CONSTRAINTS, tabs,
                                             dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)
        else:
            s32 = _e4m3_to_f32(tl.load(s_ptrs, eviction_policy="evict_first").to(tl.int32)) * gs  # fl32(e4m3 · g)
            r = tl.arange(0, HK)[:, None]
            i = r % 4
            base = q_ptrs - i
            w = tl.load(base).to(tl.int32)
            w = w | (tl.load(base + 1).to(tl.int32) << 8)
            w = w | (tl.load(base + 2).to(tl.int32) << 16)
            w = w | (tl.load(base + 3).to(tl.int32) << 24)
            sc = _bcast_rows(s32, HK, BN)
            ce = ((w >> (4 * i)) & 7) | (((w >> (8 * i + 7)) & 1) << 3)
            co = ((w >> (16 + 4 * i)) & 7) | (((w >> (8 * i + 3)) & 1) << 3)
            ve, vo = _e2m1_pair(ce | (co << 4))
            return (ve * sc).to(dtype), (vo * sc).to(dtype)

    @triton.jit
    def _fp4_tile(q_ptrs, s_ptrs, gs, dtype: tl.constexpr, HK: tl.constexpr, BN: tl.constexpr,
                  DECODE: tl.constexpr = 1):
        """Load one packed tile (bytes [BK/2, BN]; scale bytes [BK/16, BN]) and dequantize it to the even and odd
        input rows ([BK/2, BN] each, in ``dtype``): e2m1 · (e4m3 · gs) in fp32, one rounding. DECODE 2 / 3 / 4:
        the lookup-table decode of :func:`_lut_tile` (layout "lut"; 4 is the default on the GPU). DECODE 0 / 1
        (layout "modelopt"): each block scale decoded once and broadcast to its 8 byte rows; 1:
        :func:`_e2m1_pair_subnormal`, then (v · 2^63) · (scale · 2^63): the first product is exact (a power of
        two), so the second rounds e2m1 · scale once; 0: :func:`_e2m1_pair` (biased exponent + selects, no
        subnormals) for a compiler that flushes subnormals."""
        if DECODE >= 5:
            return _hop_tile(q_ptrs, s_ptrs, dtype, BN, HK, DECODE, 0)
        if DECODE >= 2:
            return _lut_tile(q_ptrs, s_ptrs, gs, dtype, HK, BN, DECODE)
        q = tl.load(q_ptrs, eviction_policy="evict_first").to(tl.int32)
        sb = tl.load(s_ptrs, eviction_policy="evict_first").to(tl.int32)
        sg = _e4m3_to_f32(sb) * gs  # [BK/16, BN]
        if DECODE == 1:
            sg = sg * 9.223372036854775808e18  # 2^63, exact
        sc = _bcast_rows(sg, HK, BN)
        if DECODE == 1:
            lo, hi = _e2m1_pair_subnormal(q)
            lo = lo * 9.223372036854775808e18
            hi = hi * 9.223372036854775808e18
        else:
            lo, hi = _e2m1_pair(q)
        return (lo * sc).to(dtype), (hi * sc).to(dtype)

    @triton.jit
    def _fp4_ptrs(offs_n, K: tl.constexpr, BLOCK_K: tl.constexpr):
        """Offsets of a [BLOCK_K/2, BLOCK_N] tile of packed bytes (rows offs_n of K inputs each, k0 = 0) and of
        its [BLOCK_K/16, BLOCK_N] tile of scale bytes, in one expert's [rows, K/2] / [rows, K/16] arrays."""
        return (offs_n[None, :] * (K // 2) + tl.arange(0, BLOCK_K // 2)[:, None],
                offs_n[None, :] * (K // 16) + tl.arange(0, BLOCK_K // 16)[:, None])

    @triton.jit
    def _w4_dot(acc, ae, ao, q_ptrs, s_ptrs, gs, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr,
                DECODE: tl.constexpr = 1):
        """acc += [a_even | a_odd] · W over one K tile, W from the packed tile at (q_ptrs, s_ptrs): two dots, the
        even and the odd input elements (ae, ao [BM, BK/2] in the activation dtype)."""
        we, wo = _fp4_tile(q_ptrs, s_ptrs, gs, ae.dtype, BLOCK_K // 2, BLOCK_N, DECODE)
        return tl.dot(ao, wo, tl.dot(ae, we, acc))

    @triton.jit
    def _w4_dot_swap(acc, a, qw_ptrs, s_ptrs, BLOCK_K: tl.constexpr, R: tl.constexpr, DECODE: tl.constexpr):
        """Swapped operands (decodes 5 / 6): accᵀ [R, BM] += W · aᵀ over one K tile (a [BM, BLOCK_K]), W [R,
        BLOCK_K] decoded from the packed words at (qw_ptrs [R, BLOCK_K/8] int32, s_ptrs [R, BLOCK_K/16]) as the
        MMA's operand A (M = R weight rows, wgmma on Hopper), the tokens operand B (N = BM)."""
        w = _hop_word_tile(qw_ptrs, s_ptrs, a.dtype, R, BLOCK_K, DECODE)
        return tl.dot(w, tl.trans(a), acc)

    @triton.jit
    def _hop_unit(dtype: tl.constexpr):
        """2^SHIFT of decodes 5 / 6 (``moe_w4_hop.hop_shift``): the accumulator is multiplied by g · 2^SHIFT."""
        if dtype == tl.bfloat16:
            return 256.0
        else:
            return 1.0

    @triton.jit
    def _interleave_rows(a, b, BLOCK_K: tl.constexpr):
        """[a0, b0, a1, b1, ...] (two [n] row-index vectors -> [2n]). For BLOCK_K >= 64 built with ``tl.join``:
        Triton (3.6) then takes the packed operand for a 4-bit one and gives the dot operand kWidth 8, so a thread
        holds both words of a scale block and builds each block's tables once (docs/perf_history.md, session 4); for
        smaller tiles by index arithmetic (kWidth 4): with the join at BLOCK_K 32 (dots of K 16, under the 32
        inputs a kWidth-8 row spans) the kernels gave wrong results on the H200; BLOCK_K 64 (dots of K 32):
        docs/perf_history.md, session 4, round 2."""
        if BLOCK_K >= 64:
            return tl.reshape(tl.join(a, b), (2 * a.shape[0],))
        else:
            j = tl.arange(0, 2 * a.shape[0])
            a0 = tl.min(a, axis=0)
            b0 = tl.min(b, axis=0)
            return tl.where(j % 2 == 0, a0 + j // 2, b0 + j // 2)

    @triton.jit
    def _w4_gate_up_acc(x_ptr, tok, stride_xt, mmask, q_ptr, s_ptr, g_ptr, e, offs_n, H: tl.constexpr,
                        N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        DECODE: tl.constexpr, SWAP: tl.constexpr = False):
        """(gate, up) fp32 accumulators [BLOCK_M, BLOCK_N] of token rows ``tok`` against output rows ``offs_n`` of
        packed expert e (w13: 2N rows, gate then up). The gate and up rows are interleaved into one
        [BLOCK_K/2, 2·BLOCK_N] packed tile per K step (column 2j = gate row n_j, 2j+1 = up row n_j, each column
        with its own global scale), so a K step is one decode and two dots (even / odd inputs), not two of each.
        The activations are loaded as one contiguous [BLOCK_M, BLOCK_K] tile and split into even / odd inputs
        in registers (strided even / odd loads cost a register regrouping per MMA operand).

        Decodes 5 / 6 ("hop" layout): the global scales multiply the accumulator (``moe_w4_hop``); SWAP (5 / 6
        only): the weights are the MMA's operand A — one [2·BLOCK_N, BLOCK_K/2] packed tile, gate rows then up
        rows — and the tokens operand B (:func:`_w4_dot_swap`)."""
        if SWAP:
            tl.static_assert(DECODE >= 5, "SWAP needs W4_DECODE 5 or 6 (layout hop)")
            j = tl.arange(0, 2 * BLOCK_N)
            n0 = tl.min(offs_n, axis=0)
            rows_s = tl.where(j < BLOCK_N, n0 + j, N + n0 + j - BLOCK_N)
            a_ptrs = x_ptr + tok[:, None] * stride_xt + tl.arange(0, BLOCK_K)[None, :]
            qw = (q_ptr + e.to(tl.int64) * (N * H)).to(tl.pointer_type(tl.int32)) \
                + rows_s[:, None] * (H // 8) + tl.arange(0, BLOCK_K // 8)[None, :]  # 32-bit words
            sb = s_ptr + e.to(tl.int64) * (N * H // 8) + rows_s[:, None] * (H // 16) + tl.arange(0, BLOCK_K // 16)[None, :]
            acct = tl.zeros((2 * BLOCK_N, BLOCK_M), dtype=tl.float32)
            for k0 in range(0, H, BLOCK_K):
                a = tl.load(a_ptrs + k0, mask=mmask[:, None], other=0.0)
                acct = _w4_dot_swap(acct, a, qw + k0 // 8, sb + k0 // 16, BLOCK_K, 2 * BLOCK_N, DECODE)
            unit = _hop_unit(x_ptr.dtype.element_ty)
            acc_t = tl.trans(acct)  # [BLOCK_M, 2·BLOCK_N]: gate columns, then up
            gu = tl.permute(tl.reshape(acc_t, (BLOCK_M, 2, BLOCK_N)), (0, 2, 1))
            acc_g, acc_u = tl.split(gu)
            return acc_g * (tl.load(g_ptr + 2 * e) * unit), acc_u * (tl.load(g_ptr + 2 * e + 1) * unit)
        col = tl.arange(0, 2 * BLOCK_N)
        rows = _interleave_rows(offs_n, offs_n + N, BLOCK_K)
        gsv = tl.where(col % 2 == 0, tl.load(g_ptr + 2 * e), tl.load(g_ptr + 2 * e + 1))[None, :]
        a_ptrs = x_ptr + tok[:, None] * stride_xt + tl.arange(0, BLOCK_K)[None, :]
        qoff, soff = _fp4_ptrs(rows, H, BLOCK_K)
        qb = q_ptr + e.to(tl.int64) * (N * H) + qoff  # 2N rows of H/2 bytes per expert
        sb = s_ptr + e.to(tl.int64) * (N * H // 8) + soff
        acc = tl.zeros((BLOCK_M, 2 * BLOCK_N), dtype=tl.float32)
        for k0 in range(0, H, BLOCK_K):
            a = tl.load(a_ptrs + k0, mask=mmask[:, None], other=0.0)
            ae, ao = tl.split(tl.reshape(a, (BLOCK_M, BLOCK_K // 2, 2)))
            acc = _w4_dot(acc, ae, ao, qb + k0 // 2, sb + k0 // 16, gsv, BLOCK_K, 2 * BLOCK_N, DECODE)
        if DECODE >= 5:
            acc = acc * (gsv * _hop_unit(x_ptr.dtype.element_ty))
        return tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N, 2)))

    @triton.jit
    def _w4_down_acc(inter_ptr, p, mmask, q_ptr, s_ptr, g_ptr, e, offs_n, H: tl.constexpr, N: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DECODE: tl.constexpr,
                     SWAP: tl.constexpr = False):
        """fp32 [BLOCK_M, BLOCK_N] = inter[p] · W[offs_n]ᵀ for packed expert e of w2 ([H, N] per expert); the
        activations split in registers, decodes 5 / 6 and SWAP as in :func:`_w4_gate_up_acc`."""
        a_ptrs = inter_ptr + p[:, None] * N + tl.arange(0, BLOCK_K)[None, :]
        if SWAP:
            tl.static_assert(DECODE >= 5, "SWAP needs W4_DECODE 5 or 6 (layout hop)")
            qw = (q_ptr + e.to(tl.int64) * (H * N // 2)).to(tl.pointer_type(tl.int32)) \
                + offs_n[:, None] * (N // 8) + tl.arange(0, BLOCK_K // 8)[None, :]  # 32-bit words
            ss = s_ptr + e.to(tl.int64) * (H * N // 16) + offs_n[:, None] * (N // 16) + tl.arange(0, BLOCK_K // 16)[None, :]
            acct = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            for k0 in range(0, N, BLOCK_K):
                a = tl.load(a_ptrs + k0, mask=mmask[:, None], other=0.0)
                acct = _w4_dot_swap(acct, a, qw + k0 // 8, ss + k0 // 16, BLOCK_K, BLOCK_N, DECODE)
            return tl.trans(acct) * (tl.load(g_ptr + e) * _hop_unit(inter_ptr.dtype.element_ty))
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        half = tl.arange(0, BLOCK_N // 2)
        n0 = tl.min(offs_n, axis=0)  # offs_n = n0 + arange(BLOCK_N)
        rows = _interleave_rows(n0 + half, n0 + BLOCK_N // 2 + half, BLOCK_K)  # column 2j: n0+j, 2j+1: n0+BN/2+j
        qoff, soff = _fp4_ptrs(rows, N, BLOCK_K)
        qd = q_ptr + e.to(tl.int64) * (H * N // 2) + qoff
        sd = s_ptr + e.to(tl.int64) * (H * N // 16) + soff
        gs = tl.load(g_ptr + e + 0 * offs_n)[None, :]  # as a [1, BLOCK_N] row: the decode then keeps the dot's layout
        for k0 in range(0, N, BLOCK_K):
            a = tl.load(a_ptrs + k0, mask=mmask[:, None], other=0.0)
            ae, ao = tl.split(tl.reshape(a, (BLOCK_M, BLOCK_K // 2, 2)))
            acc = _w4_dot(acc, ae, ao, qd + k0 // 2, sd + k0 // 16, gs, BLOCK_K, BLOCK_N, DECODE)
        if DECODE >= 5:
            acc = acc * (gs * _hop_unit(inter_ptr.dtype.element_ty))
        lo, hi = tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N // 2, 2)))
        return tl.reshape(tl.permute(tl.join(lo, hi), (0, 2, 1)), (BLOCK_M, BLOCK_N))
