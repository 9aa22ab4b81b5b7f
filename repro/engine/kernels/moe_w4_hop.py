"""The shift-and-mask 4-bit decode of the expert GEMMs (``W4_DECODE`` 5 / 6, experts in ``NVFP4Experts`` layout
"hop"), beside its torch reference :func:`hop_decode_reference`.

Numeric contract (docs/engine.md, "4-bit experts"): a weight enters the MMA as the bf16 block product
``w' = e2m1(code) · e4m3(s) · 2^-8`` — exact (a 2-bit times a 4-bit significand; normal for every E4M3 scale) —
and the per-tensor global scale is applied to the fp32 accumulator (``acc · g · 2^8``), not to each weight as
dequantize-at-load does (``bf16(fl32(e2m1 · s · g))``). The two differ by the bf16 rounding of each weight.

Decode 5 (bf16 activations on the GPU): per 32-bit word of the "hop" layout (8 weights, :func:`repro.checkpoint.
nvfp4.to_hop_layout`: the bit interleave of OpenAI triton_kernels' Hopper value layout, ``hopper_value.py``)
three ``and`` / ``shl+and`` put each code's sign and magnitude bits into a bf16's bits 15 and 8..6 — the bf16
reads ``e2m1 · 2^-126`` (exponent field = e, subnormal for e = 0) — and one ``mul.rn.bf16x2`` per pair by the
block scale pre-multiplied by 2^118 (``bf16(e4m3 · 2^118)``, exact) gives ``w'``: 13 integer and 4 bf16x2
instructions per 8 weights (inline PTX, 4 bytes = one word per call). Decode 6: its pure-Triton twin (any dtype,
runs under the interpreter; ``w' = e2m1 · e4m3 · 2^-SHIFT`` in fp32, rounded once, exactly the same values for
bf16, SHIFT = 0 for other dtypes).
"""
from __future__ import annotations

import torch

from ._triton import HAS_TRITON, tl, triton

__all__ = ["hop_decode_reference", "hop_shift", "HOP_WORD_PTX"]

#: one "hop" word ($8) and its block's scale pair bf16x2(e4m3 · 2^118) ($9) -> the 8 inputs' w' as 8 bf16 ($0..$7 =
#: inputs 0..7): the instructions of _HOP_DECODE_ASM, each bf16x2 result split into its halves (no-ops for ptxas);
#: inline PTX of the Triton kernels here and of the Gluon ones (moe_w4_ws)
HOP_WORD_PTX = """{
    .reg .b32 a, b, c, r;
    and.b32 r, $8, 0x81C081C0;
    mul.rn.bf16x2 r, r, $9;
    mov.b32 {$0, $2}, r;
    shl.b32 a, $8, 3;
    and.b32 r, a, 0x81C081C0;
    mul.rn.bf16x2 r, r, $9;
    mov.b32 {$4, $6}, r;
    shl.b32 a, $8, 6;
    and.b32 r, a, 0x81C081C0;
    mul.rn.bf16x2 r, r, $9;
    mov.b32 {$1, $3}, r;
    shl.b32 a, $8, 1;
    and.b32 a, a, 0x80008000;
    shr.u32 b, $8, 3;
    and.b32 b, b, 0x01800180;
    or.b32 a, a, b;
    shr.u32 c, $8, 7;
    and.b32 c, c, 0x00400040;
    or.b32 r, a, c;
    mul.rn.bf16x2 r, r, $9;
    mov.b32 {$5, $7}, r;
    }"""


def hop_shift(dtype: torch.dtype) -> int:
    """The power of two SHIFT of ``w' = e2m1 · e4m3 · 2^-SHIFT`` for activations in ``dtype`` (8 for bf16, the
    factor the asm decode folds in; 0 otherwise: fp16 would lose the smallest products to subnormals)."""
    return 8 if dtype == torch.bfloat16 else 0


def hop_decode_reference(q: torch.Tensor, s: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """torch reference of decode 5 / 6: packed codes ``q`` uint8 ``[..., in/2]`` in the "hop" layout, E4M3 block
    scale bits ``s`` uint8 ``[..., in/16]`` -> ``w'`` ``[..., in]`` in ``dtype`` (``e2m1 · e4m3 · 2^-hop_shift``,
    computed by bit placement into bf16 and one bf16 multiply, as the inline PTX does, for bf16; in fp32
    otherwise). The global scale is not applied."""
    from repro.checkpoint.nvfp4 import E2M1_VALUES, GROUP, from_hop_layout

    if dtype == torch.bfloat16:
        w = (q.reshape(*q.shape[:-1], -1, 4).long() << torch.tensor([0, 8, 16, 24], device=q.device)).sum(-1)
        m = 0x81C081C0
        outs = [w & m, (w << 3) & m, (w << 6) & m,
                ((w << 1) & 0x80008000) | ((w >> 3) & 0x01800180) | ((w >> 7) & 0x00400040)]
        sp = (s.view(torch.float8_e4m3fn).float() * 2.0 ** 118).to(torch.bfloat16).float()  # [..., in/16]
        vals = []
        for o in outs:  # o: bf16 pairs of inputs (0, 2), (4, 6), (1, 3), (5, 7) of each word
            lo = ((o & 0xFFFF).to(torch.int32).to(torch.int16)).view(torch.bfloat16).float()
            hi = (((o >> 16) & 0xFFFF).to(torch.int32).to(torch.int16)).view(torch.bfloat16).float()
            vals.append((lo, hi))
        order = [vals[0][0], vals[2][0], vals[0][1], vals[2][1], vals[1][0], vals[3][0], vals[1][1], vals[3][1]]
        v = torch.stack(order, -1).reshape(*q.shape[:-1], -1)  # [..., in] e2m1 · 2^-126 (exact in fp32)
        sc = sp.repeat_interleave(GROUP, dim=-1)
        return (v * sc).to(torch.bfloat16)  # one bf16 multiply of exact operands, exact product
    qm = from_hop_layout(q)
    code = torch.stack([qm & 0xF, qm >> 4], -1).reshape(*q.shape[:-1], -1).long()
    vals = E2M1_VALUES.to(q.device)[code & 7] * torch.where(code >= 8, -1.0, 1.0)
    sc = s.view(torch.float8_e4m3fn).float().repeat_interleave(GROUP, dim=-1)
    return (vals * sc * 2.0 ** -hop_shift(dtype)).to(dtype)


if HAS_TRITON:
    # $4 = 4 packed bytes (one "hop" word), $5..$8 = the block's scale pair bf16x2(e4m3 · 2^118) (one per byte,
    # all equal: a word lies in one 16-input block); outputs $0 $1 = even inputs (0, 2), (4, 6), $2 $3 = odd
    # inputs (1, 3), (5, 7) as bf16 pairs (element j of each output tensor belongs to byte j)
    _HOP_DECODE_ASM = tl.constexpr("""{
    .reg .b32 a, b, c;
    and.b32 $0, $4, 0x81C081C0;
    mul.rn.bf16x2 $0, $0, $5;
    shl.b32 a, $4, 3;
    and.b32 $1, a, 0x81C081C0;
    mul.rn.bf16x2 $1, $1, $5;
    shl.b32 a, $4, 6;
    and.b32 $2, a, 0x81C081C0;
    mul.rn.bf16x2 $2, $2, $5;
    shl.b32 a, $4, 1;
    and.b32 a, a, 0x80008000;
    shr.u32 b, $4, 3;
    and.b32 b, b, 0x01800180;
    or.b32 a, a, b;
    shr.u32 c, $4, 7;
    and.b32 c, c, 0x00400040;
    or.b32 $3, a, c;
    mul.rn.bf16x2 $3, $3, $5;
    }""")

    @triton.jit
    def _bcast_k(t, R: tl.constexpr, HK: tl.constexpr, KAXIS: tl.constexpr):
        """A per-block tile ([HK/8, R] for KAXIS 0, [R, HK/8] for KAXIS 1) repeated for the 8 bytes of its block
        along K -> [HK, R] / [R, HK]."""
        if KAXIS == 0:
            return tl.reshape(tl.broadcast_to(t[:, None, :], (HK // 8, 8, R)), (HK, R))
        else:
            return tl.reshape(tl.broadcast_to(t[:, :, None], (R, HK // 8, 8)), (R, HK))

    @triton.jit
    def _hop_field(h, F: tl.constexpr):
        """e2m1 code (sign bit 3) of field F of 16-bit halves ``h`` (int32) of "hop" words."""
        if F == 0:
            return ((h >> 6) & 7) | (((h >> 15) & 1) << 3)
        elif F == 1:
            return ((h >> 3) & 7) | (((h >> 12) & 1) << 3)
        elif F == 2:
            return (h & 7) | (((h >> 9) & 1) << 3)
        else:
            return (((h >> 10) & 3) << 1) | ((h >> 13) & 1) | (((h >> 14) & 1) << 3)

    @triton.jit
    def _e2m1_f32(c):
        """e2m1 code (int32, sign bit 3) -> fp32 value, exactly (bias-126 exponent, 2f - 1 for e = 0)."""
        f = (((c & 7) << 22) + 0x3F000000).to(tl.float32, bitcast=True)
        f = tl.where(f < 1.0, f * 2.0 - 1.0, f)
        return tl.where((c & 8) != 0, -f, f)

    @triton.jit
    def _hop_tile(q_ptrs, s_ptrs, dtype: tl.constexpr, R: tl.constexpr, HK: tl.constexpr, DECODE: tl.constexpr,
                  KAXIS: tl.constexpr):
        """(even, odd) input elements of one packed tile in the "hop" layout as ``w'`` in ``dtype``: bytes
        [HK, R] (KAXIS 0) or [R, HK] (KAXIS 1), 4 consecutive bytes along K = one word = inputs 8t..8t+7; scale
        bytes [HK/8, R] / [R, HK/8]. DECODE 5: the inline PTX (bf16); 6: the pure-Triton twin."""
        sf = tl.load(s_ptrs, eviction_policy="evict_first").to(tl.float8e4nv, bitcast=True).to(tl.float32)
        if DECODE == 5:
            sb = (sf * 3.3230699894622895e35).to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
            sp = _bcast_k(sb | (sb << 16), R, HK, KAXIS)  # bf16x2(e4m3 · 2^118) per byte
            q = tl.load(q_ptrs, eviction_policy="evict_first")
            return tl.inline_asm_elementwise(_HOP_DECODE_ASM, "=r,=r,=r,=r,r,r,r,r,r", [q, sp],
                                             dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)
        else:
            if dtype == tl.bfloat16:
                unit: tl.constexpr = 0.00390625  # 2^-8
            else:
                unit: tl.constexpr = 1.0
            sc = _bcast_k(sf * unit, R, HK, KAXIS)
            if KAXIS == 0:
                i = tl.arange(0, HK)[:, None] % 4
            else:
                i = tl.arange(0, HK)[None, :] % 4
            base = q_ptrs - i
            w = tl.load(base).to(tl.int32)
            w = w | (tl.load(base + 1).to(tl.int32) << 8)
            w = w | (tl.load(base + 2).to(tl.int32) << 16)
            w = w | (tl.load(base + 3).to(tl.int32) << 24)
            # byte i of a word: even input 2i = field A (i < 2) / B of half i % 2; odd input 2i+1 = field C / D
            h = (w >> (16 * (i % 2))) & 0xFFFF
            ce = tl.where(i < 2, _hop_field(h, 0), _hop_field(h, 1))
            co = tl.where(i < 2, _hop_field(h, 2), _hop_field(h, 3))
            return (_e2m1_f32(ce) * sc).to(dtype), (_e2m1_f32(co) * sc).to(dtype)

    _HOP_WORD_ASM = tl.constexpr(HOP_WORD_PTX)  # decode 5 of one word, 8 bf16 out (module-level HOP_WORD_PTX)

    @triton.jit
    def _join8(v0, v1, v2, v3, v4, v5, v6, v7):
        """8 tensors [R, W] -> [R, 8·W], element 8j + i = v_i[:, j]."""
        t = tl.join(tl.join(tl.join(v0, v4), tl.join(v2, v6)), tl.join(tl.join(v1, v5), tl.join(v3, v7)))
        return tl.reshape(t, (v0.shape[0], 8 * v0.shape[1]))

    @triton.jit
    def _hop_word_tile(qw_ptrs, s_ptrs, dtype: tl.constexpr, R: tl.constexpr, BK: tl.constexpr,
                       DECODE: tl.constexpr):
        """``w'`` [R, BK] in ``dtype`` of one packed tile read as 32-bit "hop" words (``qw_ptrs`` [R, BK/8], int32
        pointers) with scale bytes [R, BK/16]: each word decoded whole (8 outputs per element, so the result does
        not depend on how the compiler lays the tile out over threads), the 8 values joined along K. DECODE 5: the
        inline PTX (bf16), 6: the pure-Triton twin."""
        sf = tl.load(s_ptrs, eviction_policy="evict_first").to(tl.float8e4nv, bitcast=True).to(tl.float32)
        w = tl.load(qw_ptrs, eviction_policy="evict_first")
        if DECODE == 5:
            sb = (sf * 3.3230699894622895e35).to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
            sp = tl.reshape(tl.broadcast_to((sb | (sb << 16))[:, :, None], (R, BK // 16, 2)), (R, BK // 8))
            v0, v1, v2, v3, v4, v5, v6, v7 = tl.inline_asm_elementwise(
                _HOP_WORD_ASM, "=h,=h,=h,=h,=h,=h,=h,=h,r,r", [w, sp],
                dtype=(tl.bfloat16, tl.bfloat16, tl.bfloat16, tl.bfloat16, tl.bfloat16, tl.bfloat16, tl.bfloat16,
                       tl.bfloat16), is_pure=True, pack=1)
            return _join8(v0, v1, v2, v3, v4, v5, v6, v7)
        else:
            if dtype == tl.bfloat16:
                unit: tl.constexpr = 0.00390625  # 2^-8
            else:
                unit: tl.constexpr = 1.0
            sc = tl.reshape(tl.broadcast_to((sf * unit)[:, :, None], (R, BK // 16, 2)), (R, BK // 8))
            lo = w & 0xFFFF
            hi = (w >> 16) & 0xFFFF
            return _join8((_e2m1_f32(_hop_field(lo, 0)) * sc).to(dtype), (_e2m1_f32(_hop_field(lo, 2)) * sc).to(dtype),
                          (_e2m1_f32(_hop_field(hi, 0)) * sc).to(dtype), (_e2m1_f32(_hop_field(hi, 2)) * sc).to(dtype),
                          (_e2m1_f32(_hop_field(lo, 1)) * sc).to(dtype), (_e2m1_f32(_hop_field(lo, 3)) * sc).to(dtype),
                          (_e2m1_f32(_hop_field(hi, 1)) * sc).to(dtype), (_e2m1_f32(_hop_field(hi, 3)) * sc).to(dtype))
