"""Weights-only 4-bit routed experts (precision ``nvfp4-w4a16``): NVFP4 weight tiles dequantized in registers
for the grouped expert GEMMs of :mod:`.moe`, beside their torch reference :func:`moe_w4_reference`.

Format (NVIDIA ModelOpt NVFP4 export, :mod:`repro.checkpoint.nvfp4`; NVIDIA TensorRT Model Optimizer docs,
"NVFP4"): per expert projection ``W [out, in]``: packed e2m1 codes ``q`` uint8 ``[out, in/2]`` (element 2j in
the low nibble), E4M3 block scales ``s`` ``[out, in/16]`` (one per 16 inputs, passed as their uint8 bits),
a per-tensor fp32 global scale ``g``. Value: ``W[n, k] = e2m1(code) · (e4m3(s[n, k/16]) · g)``, computed in
fp32 in that order and rounded once to the activation dtype: exactly the values of dequantize-at-load
(``nvfp4.dequantize`` in fp32, then ``.to(dtype)``). The GEMMs accumulate in fp32.

Kernel layout (:class:`repro.checkpoint.nvfp4.NVFP4Experts`): ``w13`` q ``[E, 2N, H/2]``, s ``[E, 2N, H/16]``,
g ``[E, 2]`` (gate, up); ``w2`` q ``[E, H, N/2]``, s ``[E, H, N/16]``, g ``[E, 1]``; the shared expert stays in
the activation dtype (``.shared``) and is expert index E of the same launch (a runtime branch per program).

The K loop takes a ``[BLOCK_K/2, BLOCK_N]`` tile of packed bytes and splits it into the even and the odd
input elements: two dots, ``a[:, 0::2] · W_even + a[:, 1::2] · W_odd``, so no register shuffle interleaves
the nibbles. Bytes streamed per weight: 0.5 + 1/16 (scales) instead of 2 — the round's floor drops ~3×.
"""
from __future__ import annotations

import torch

from ._triton import HAS_TRITON, tl, triton

__all__ = ["moe_w4_reference", "random_nvfp4_experts", "check_w4_tiles"]


def moe_w4_reference(x, gate_w, expert_bias, w13, w2, top_k=8, n_group=8, topk_group=4, scaling=2.5,
                     renormalize=True, topk=None):
    """fp32 MoE block over NVFP4 experts: dequantize (``NVFP4Experts.dequantize``, the dequantize-at-load values
    in the experts' dtype), stack the shared expert as index E, then :func:`.moe.moe_reference`.

    x [T, H]; w13, w2: :class:`~repro.checkpoint.nvfp4.NVFP4Experts` ([E, 2N, H] / [E, H, N], shared expert
    in ``.shared`` or None). Returns [T, H] fp32."""
    from .moe import moe_reference

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
    16-element scale groups, and dividing the reduction length."""
    if block_k < 32 or block_k % 32 or k_total % block_k:
        raise ValueError(f"nvfp4-w4a16 kernels need BLOCK_K a multiple of 32 dividing {k_total}, got {block_k}")


if HAS_TRITON:

    @triton.jit
    def _e2m1_to_f32(c):
        """FP4 E2M1 codes (int, low 4 bits; bit 3 = sign) -> fp32: magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6."""
        idx = c & 7
        ex = idx >> 1
        m = idx & 1
        twice = tl.where(ex == 0, m, (2 + m) << tl.maximum(ex - 1, 0))  # 2·|value|, an integer 0..12
        mag = twice.to(tl.float32) * 0.5
        return tl.where((c & 8) != 0, -mag, mag)

    @triton.jit
    def _e4m3_to_f32(b):
        """FP8 E4M3 (OCP "e4m3fn", bias 7, no infinities) bits (int 0..255) -> fp32, exactly."""
        ex = (b >> 3) & 15
        m = b & 7
        normal = ((ex + 120) << 23) | (m << 20)  # fp32 bits: exponent ex - 7 + 127
        mag = tl.where(ex == 0, m.to(tl.float32) * 0.001953125, normal.to(tl.float32, bitcast=True))
        return tl.where((b & 128) != 0, -mag, mag)

    @triton.jit
    def _fp4_tile(q_ptrs, s_ptrs, gs, dtype: tl.constexpr):
        """Load one packed tile (bytes [BK/2, BN], scales gathered to the same shape) and dequantize it to the
        even and odd input rows ([BK/2, BN] each, in ``dtype``): e2m1 · (e4m3 · gs) in fp32, one rounding."""
        q = tl.load(q_ptrs, eviction_policy="evict_first").to(tl.int32)
        sc = _e4m3_to_f32(tl.load(s_ptrs, eviction_policy="evict_first").to(tl.int32)) * gs
        return (_e2m1_to_f32(q & 15) * sc).to(dtype), (_e2m1_to_f32(q >> 4) * sc).to(dtype)

    @triton.jit
    def _fp4_ptrs(offs_n, K: tl.constexpr, BLOCK_K: tl.constexpr):
        """Offsets of a [BLOCK_K/2, BLOCK_N] tile of packed bytes (rows offs_n of K inputs each, k0 = 0) and of the
        scale byte of each of its elements, in one expert's [rows, K/2] / [rows, K/16] arrays."""
        offs_j = tl.arange(0, BLOCK_K // 2)
        return (offs_n[None, :] * (K // 2) + offs_j[:, None],
                offs_n[None, :] * (K // 16) + (offs_j // 8)[:, None])

    @triton.jit
    def _w4_dot(acc, ae, ao, q_ptrs, s_ptrs, gs):
        """acc += [a_even | a_odd] · W over one K tile, W from the packed tile at (q_ptrs, s_ptrs): two dots, the
        even and the odd input elements (ae, ao [BM, BK/2] in the activation dtype)."""
        we, wo = _fp4_tile(q_ptrs, s_ptrs, gs, ae.dtype)
        return tl.dot(ao, wo, tl.dot(ae, we, acc))
