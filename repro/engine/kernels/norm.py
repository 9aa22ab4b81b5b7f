"""Residual add + RMSNorm (one row per program, or ``rows`` with a prefetch) with the MoE top-k sum fused in; reference.

RMSNorm as in LLaDA2 (docs/engine.md §2): ``y = w * (x.float() * rsqrt(mean(x²) + eps)).to(x.dtype)``,
eps 1e-6. The residual stream ``h`` stays in the model dtype (bf16), as in the HF code: ``h = h + delta``
is rounded to the dtype before the norm.

Modes of :func:`add_rmsnorm` (all update ``h`` in place and write ``normed``):

* ``delta=None, pairs=None``: ``normed = rmsnorm(h)`` (no add; used after the embedding).
* ``delta`` [T, H]: ``h += delta`` (attention output).
* ``pairs`` [P1, H] (``MoEWorkspace.pair_out``, bf16 or fp32): ``h += (Σ_k pairs[t*K+k] (+ pairs[T*K+t])).to(dtype)``
  with the sum in fp32, i.e. the MoE top-k sum + shared expert fused with the residual add and the next norm.
"""
from __future__ import annotations

import torch

from ._triton import HAS_TRITON, gdc_launch_dependents, gdc_wait, pdl, next_pow2, tl, triton

__all__ = ["rmsnorm_reference", "add_rmsnorm", "add_rmsnorm_reference"]


def rmsnorm_reference(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """[..., H] -> [..., H] in x.dtype (HF LLaDA2 RMSNorm)."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * y.to(x.dtype)


def add_rmsnorm_reference(h, w, delta=None, pairs=None, top_k=1, shared=False, eps=1e-6):
    """Reference for :func:`add_rmsnorm`; returns (new_h, normed) without modifying ``h``."""
    T = h.shape[0]
    if delta is not None:
        h = (h.float() + delta.float()).to(h.dtype)
    elif pairs is not None:
        s = pairs[: T * top_k].view(T, top_k, -1).float().sum(1)
        if shared:
            s = s + pairs[T * top_k: T * top_k + T].float()
        h = (h.float() + s.to(h.dtype).float()).to(h.dtype)
    return h, rmsnorm_reference(h, w, eps)


if HAS_TRITON:

    @triton.jit
    def _add_rmsnorm_row(h_ptr, d_ptr, w_ptr, y_ptr, t, hlim, T, eps, H: tl.constexpr, BLOCK_H: tl.constexpr,
                         MODE: tl.constexpr, TOPK: tl.constexpr, HAS_SHARED: tl.constexpr):
        """Row t, columns < ``hlim`` (H; 0 for a row past the end: nothing read or written), every mode."""
        offs = tl.arange(0, BLOCK_H)
        msk = offs < hlim
        hv = tl.load(h_ptr + t * H + offs, mask=msk, other=0.0)
        dt = hv.dtype
        h = hv.to(tl.float32)
        if MODE == 1:
            h = (h + tl.load(d_ptr + t * H + offs, mask=msk, other=0.0).to(tl.float32)).to(dt).to(tl.float32)
            tl.store(h_ptr + t * H + offs, h.to(dt), mask=msk)
        if MODE == 2:
            s = tl.zeros((BLOCK_H,), dtype=tl.float32)
            for k in tl.static_range(TOPK):
                s += tl.load(d_ptr + (t * TOPK + k) * H + offs, mask=msk, other=0.0).to(tl.float32)
            if HAS_SHARED:
                s += tl.load(d_ptr + (T * TOPK + t) * H + offs, mask=msk, other=0.0).to(tl.float32)
            h = (h + s.to(dt).to(tl.float32)).to(dt).to(tl.float32)
            tl.store(h_ptr + t * H + offs, h.to(dt), mask=msk)
        _norm_store(h, dt, w_ptr, y_ptr, t, offs, msk, eps, H)

    @triton.jit
    def _norm_store(h, dt, w_ptr, y_ptr, t, offs, msk, eps, H: tl.constexpr):
        """The row tail of every mode: y[t] = (h·rsqrt(mean h² + eps)).to(dt)·w for the fp32 row h (columns
        ``offs``, ``msk``), stored in y's dtype."""
        r = tl.rsqrt(tl.sum(h * h, axis=0) / H + eps)
        w = tl.load(w_ptr + offs, mask=msk, other=0.0).to(tl.float32)
        y = (h * r).to(dt).to(tl.float32) * w
        tl.store(y_ptr + t * H + offs, y.to(y_ptr.dtype.element_ty), mask=msk)

    @triton.jit
    def _row_inputs(h_ptr, d_ptr, t, hlim, T, H: tl.constexpr, BLOCK_H: tl.constexpr, MODE: tl.constexpr,
                    TOPK: tl.constexpr, HAS_SHARED: tl.constexpr):
        """The loads of row t (columns < hlim): h [BLOCK_H], the addend (MODE 1: [BLOCK_H]; MODE 2: the top-k pair
        rows [TOPK, BLOCK_H] in pairs' dtype; MODE 0: h again) and the shared expert's row (MODE 2 with HAS_SHARED,
        else h)."""
        offs = tl.arange(0, BLOCK_H)
        msk = offs < hlim
        hv = tl.load(h_ptr + t * H + offs, mask=msk, other=0.0)
        d = hv
        sh = hv
        if MODE == 1:
            d = tl.load(d_ptr + t * H + offs, mask=msk, other=0.0)
        if MODE == 2:
            ok = tl.arange(0, TOPK)
            d = tl.load(d_ptr + (t * TOPK + ok[:, None]) * H + offs[None, :], mask=msk[None, :], other=0.0)
            if HAS_SHARED:
                sh = tl.load(d_ptr + (T * TOPK + t) * H + offs, mask=msk, other=0.0)
        return hv, d, sh

    @triton.jit
    def _row_finish(h_ptr, w_ptr, y_ptr, hv, d, sh, t, hlim, eps, H: tl.constexpr, BLOCK_H: tl.constexpr,
                    MODE: tl.constexpr, HAS_SHARED: tl.constexpr):
        """Row t from the values of :func:`_row_inputs`: h += addend (MODE 2: the pair rows summed over k, then the
        shared row), stored; the RMSNorm of h times w stored into y."""
        offs = tl.arange(0, BLOCK_H)
        msk = offs < hlim
        dt = hv.dtype
        h = hv.to(tl.float32)
        if MODE == 1:
            h = (h + d.to(tl.float32)).to(dt).to(tl.float32)
            tl.store(h_ptr + t * H + offs, h.to(dt), mask=msk)
        if MODE == 2:
            s = tl.sum(d.to(tl.float32), axis=0)
            if HAS_SHARED:
                s += sh.to(tl.float32)
            h = (h + s.to(dt).to(tl.float32)).to(dt).to(tl.float32)
            tl.store(h_ptr + t * H + offs, h.to(dt), mask=msk)
        _norm_store(h, dt, w_ptr, y_ptr, t, offs, msk, eps, H)

    @triton.jit
    def _add_rmsnorm_kernel(
        h_ptr, d_ptr, w_ptr, y_ptr, T, eps,
        H: tl.constexpr, BLOCK_H: tl.constexpr, MODE: tl.constexpr, TOPK: tl.constexpr,
        HAS_SHARED: tl.constexpr, USE_PDL: tl.constexpr = False, ROWS: tl.constexpr = 0,
    ):
        """ROWS 0: program t = row t (:func:`_add_rmsnorm_row`). ROWS >= 1: program p takes rows p·ROWS + [0, ROWS)
        one after another and issues the loads of the next row before the arithmetic of this one (a register
        prefetch: memory stays busy while a row is reduced and stored); the same per-row arithmetic for every ROWS
        >= 1 (the pair rows summed as one [TOPK, H] tile: other roundings than ROWS 0)."""
        if USE_PDL:
            gdc_launch_dependents()
            gdc_wait()
        if ROWS == 0:
            _add_rmsnorm_row(h_ptr, d_ptr, w_ptr, y_ptr, tl.program_id(0), H, T, eps, H, BLOCK_H, MODE, TOPK,
                             HAS_SHARED)
        else:
            t0 = tl.program_id(0) * ROWS
            tend = tl.minimum(t0 + ROWS, T)
            hv, d, sh = _row_inputs(h_ptr, d_ptr, t0, tl.where(t0 < tend, H, 0), T, H, BLOCK_H, MODE, TOPK,
                                    HAS_SHARED)
            for i in range(ROWS):
                t = t0 + i
                hv2, d2, sh2 = _row_inputs(h_ptr, d_ptr, t + 1, tl.where(t + 1 < tend, H, 0), T, H, BLOCK_H, MODE,
                                           TOPK, HAS_SHARED)
                _row_finish(h_ptr, w_ptr, y_ptr, hv, d, sh, t, tl.where(t < tend, H, 0), eps, H, BLOCK_H, MODE,
                            HAS_SHARED)
                hv, d, sh = hv2, d2, sh2


def add_rmsnorm(h, w, normed, delta=None, pairs=None, top_k=1, shared=False, eps=1e-6, num_warps=8, rows=0):
    """h [T, H] (updated in place), w [H], normed [T, H] output; see module doc for delta/pairs.

    ``rows`` 0 (default): one program per row. ``rows`` >= 1: each program takes ``rows`` rows in turn, loading the
    next row while it finishes one (grid cdiv(T, rows)); with ``pairs`` ``top_k`` must then be a power of two. A
    row's arithmetic is the same for every ``rows`` >= 1, so ``rows`` may change with T without changing a bit
    (not with ``num_warps``: the reduction layout); rows 0 and rows >= 1 round the top-k sum differently."""
    T, H = h.shape
    assert h.is_contiguous() and normed.is_contiguous()
    mode = 1 if delta is not None else (2 if pairs is not None else 0)
    d = delta if delta is not None else (pairs if pairs is not None else h)
    if rows and mode == 2 and top_k & (top_k - 1):
        raise ValueError(f"add_rmsnorm: rows={rows} needs top_k a power of two, not {top_k} (or rows=0)")
    _add_rmsnorm_kernel[(triton.cdiv(T, rows) if rows else T,)](
        h, d, w, normed, T, eps, H=H, BLOCK_H=next_pow2(H), MODE=mode, TOPK=top_k,
        HAS_SHARED=bool(shared), ROWS=int(rows), num_warps=num_warps,
        **pdl(),
    )
    return h, normed
