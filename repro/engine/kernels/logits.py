"""Decode statistics of a block's logits on the device (argmax, max probability, entropy), beside the torch
reference :func:`logits_stats_reference`.

Two kernels, no host sync: ``_logits_partial_stats_kernel`` (grid (T, NCHUNK)) reduces one vocabulary chunk
of a row to (max, first argmax, Σ e^(x-max), Σ e^(x-max)·x) in fp32; ``_logits_stats_combine_kernel``
(grid (T,)) merges the chunks: conf = 1 / Σ_c e^(m_c - M)·s_c, entropy = M + log S - W/S (nats), the
log-sum-exp identity H = log Σe^x - Σ p·x.
"""
from __future__ import annotations

import torch

from ._triton import HAS_TRITON, gdc_launch_dependents, gdc_wait, pdl, tl, triton  # noqa: F401

__all__ = ["logits_stats", "logits_stats_reference"]

if HAS_TRITON:

    @triton.jit
    def _logits_partial_stats_kernel(
        x_ptr, part_ptr, V, stride_x, EXCLUDE, NCHUNK: tl.constexpr, BLOCK_V: tl.constexpr,
        USE_PDL: tl.constexpr = False,
    ):
        """Row t, vocab chunk c: (max, first argmax, Σ e^(x-max), Σ e^(x-max)·x) in fp32 -> part[t, c, 4];
        column ``EXCLUDE`` (when in [0, V)) counts as −inf: it is neither the argmax nor in the sums."""
        if USE_PDL:
            gdc_launch_dependents()
            gdc_wait()
        t = tl.program_id(0)
        c = tl.program_id(1)
        per = tl.cdiv(tl.cdiv(V, NCHUNK), BLOCK_V) * BLOCK_V
        lo = c * per
        hi = tl.minimum(lo + per, V)
        offs = tl.arange(0, BLOCK_V)
        mv = tl.full((BLOCK_V,), float("-inf"), tl.float32)
        iv = tl.zeros((BLOCK_V,), dtype=tl.int32)
        for v0 in range(lo, hi, BLOCK_V):
            o = v0 + offs
            x = tl.load(x_ptr + t * stride_x + o, mask=o < hi, other=float("-inf")).to(tl.float32)
            x = tl.where(o == EXCLUDE, float("-inf"), x)
            up = x > mv
            iv = tl.where(up, o, iv)
            mv = tl.where(up, x, mv)
        m = tl.max(mv, axis=0)
        idx = tl.min(tl.where(mv == m, iv, 2147483647), axis=0)
        sv = tl.zeros((BLOCK_V,), dtype=tl.float32)
        wv = tl.zeros((BLOCK_V,), dtype=tl.float32)
        for v0 in range(lo, hi, BLOCK_V):
            o = v0 + offs
            msk = (o < hi) & (o != EXCLUDE)
            x = tl.load(x_ptr + t * stride_x + o, mask=msk, other=0.0).to(tl.float32)
            e = tl.where(msk, tl.exp(x - m), 0.0)
            sv += e
            wv += e * x
        base = part_ptr + (t * NCHUNK + c) * 4
        tl.store(base, m)
        tl.store(base + 1, idx.to(tl.float32))
        tl.store(base + 2, tl.sum(sv, axis=0))
        tl.store(base + 3, tl.sum(wv, axis=0))

    @triton.jit
    def _logits_stats_combine_kernel(
        part_ptr, pred_ptr, conf_ptr, ent_ptr, NCHUNK: tl.constexpr, USE_PDL: tl.constexpr = False,
    ):
        if USE_PDL:
            gdc_launch_dependents()
            gdc_wait()
        t = tl.program_id(0)
        c = tl.arange(0, NCHUNK)
        base = part_ptr + (t * NCHUNK + c) * 4
        m = tl.load(base)
        idx = tl.load(base + 1)
        s = tl.load(base + 2)
        w = tl.load(base + 3)
        M = tl.max(m, axis=0)
        sc = tl.exp(m - M)
        S = tl.sum(s * sc, axis=0)
        Wt = tl.sum(w * sc, axis=0)
        best = tl.min(tl.where(m == M, idx, 3.0e38), axis=0)
        tl.store(pred_ptr + t, best.to(tl.int64))
        tl.store(conf_ptr + t, 1.0 / S)
        tl.store(ent_ptr + t, M + tl.log(S) - Wt / S)


def logits_stats(logits, part, pred, conf, entropy, nchunk=16, block_v=1024, num_warps=4, exclude: int = -1):
    """Decode statistics of logits [T, V] (bf16/fp32) in fp32, two kernels, no host sync.

    part [T, nchunk, 4] fp32 scratch; pred [T] int64 argmax (first on ties); conf [T] fp32 max softmax
    probability; entropy [T] fp32 in nats. ``exclude``: a column taken as −inf (the decoders'
    ``exclude_mask_token``: the ``<|mask|>`` id), -1 for none. Each row is reduced by its own programs in a fixed
    order, so a row's results do not depend on T. Reference: :func:`logits_stats_reference`.
    """
    T, V = logits.shape
    _logits_partial_stats_kernel[(T, nchunk)](logits, part, V, logits.stride(0), exclude, NCHUNK=nchunk,
                                              BLOCK_V=block_v, num_warps=num_warps, **pdl())
    _logits_stats_combine_kernel[(T,)](part, pred, conf, entropy, NCHUNK=nchunk, num_warps=1, **pdl())


def logits_stats_reference(logits, exclude: int = -1):
    """(pred int64, conf fp32, entropy fp32) of logits [T, V] computed in fp32 with torch; column ``exclude``
    (if ≥ 0) at −inf."""
    lf = logits.float()
    if exclude >= 0:
        lf = lf.clone()
        lf[:, exclude] = float("-inf")
    lp = torch.log_softmax(lf, -1)
    return lf.argmax(-1), lp.max(-1).values.exp(), -(lp.exp() * lp).nan_to_num(0.0).sum(-1)  # 0·(−inf) := 0

