"""Residual add + RMSNorm (one row per program, or ``rows`` in a loop) with the MoE top-k sum fused in; reference.

RMSNorm as in LLaDA2 (docs/engine.md §2): ``y = w * (x.float() * rsqrt(mean(x²) + eps)).to(x.dtype)``,
eps 1e-6. The residual stream ``h`` stays in the model dtype (bf16), as in the HF code: ``h = h + delta``
is rounded to the dtype before the norm.

Modes of :func:`add_rmsnorm` (all update ``h`` in place and write ``normed``):

* ``delta=None, pairs=None``: ``normed = rmsnorm(h)`` (no add; used after the embedding).
* ``delta`` [T, H]: ``h += delta`` (attention output).
* ``pairs`` [P1, H] fp32 (``MoEWorkspace.pair_out``): ``h += (Σ_k pairs[t*K+k] (+ pairs[T*K+t])).to(dtype)``,
  i.e. the MoE top-k sum + shared expert fused with the residual add and the next norm.
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
        s = pairs[: T * top_k].view(T, top_k, -1).sum(1)
        if shared:
            s = s + pairs[T * top_k: T * top_k + T]
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
                s += tl.load(d_ptr + (t * TOPK + k) * H + offs, mask=msk, other=0.0)
            if HAS_SHARED:
                s += tl.load(d_ptr + (T * TOPK + t) * H + offs, mask=msk, other=0.0)
            h = (h + s.to(dt).to(tl.float32)).to(dt).to(tl.float32)
            tl.store(h_ptr + t * H + offs, h.to(dt), mask=msk)
        r = tl.rsqrt(tl.sum(h * h, axis=0) / H + eps)
        w = tl.load(w_ptr + offs, mask=msk, other=0.0).to(tl.float32)
        y = (h * r).to(dt).to(tl.float32) * w
        tl.store(y_ptr + t * H + offs, y.to(y_ptr.dtype.element_ty), mask=msk)

    @triton.jit
    def _add_rmsnorm_kernel(
        h_ptr, d_ptr, w_ptr, y_ptr, T, eps,
        H: tl.constexpr, BLOCK_H: tl.constexpr, MODE: tl.constexpr, TOPK: tl.constexpr,
        HAS_SHARED: tl.constexpr, USE_PDL: tl.constexpr = False, ROWS: tl.constexpr = 1,
    ):
        """Program p: rows p·ROWS + [0, ROWS) one after another (ROWS > 1: a loop the compiler can pipeline)."""
        if USE_PDL:
            gdc_launch_dependents()
            gdc_wait()
        if ROWS == 1:
            _add_rmsnorm_row(h_ptr, d_ptr, w_ptr, y_ptr, tl.program_id(0), H, T, eps, H, BLOCK_H, MODE, TOPK,
                             HAS_SHARED)
        else:
            for i in range(ROWS):
                t = tl.program_id(0) * ROWS + i
                _add_rmsnorm_row(h_ptr, d_ptr, w_ptr, y_ptr, t, tl.where(t < T, H, 0), T, eps, H, BLOCK_H, MODE, TOPK,
                                 HAS_SHARED)


def add_rmsnorm(h, w, normed, delta=None, pairs=None, top_k=1, shared=False, eps=1e-6, num_warps=8, rows=1,
                num_stages=2):
    """h [T, H] (updated in place), w [H], normed [T, H] output; see module doc for delta/pairs.

    ``rows``: rows per program (grid cdiv(T, rows); ``num_stages`` pipelines the loads of the next row when rows > 1);
    a row's arithmetic is the same for every ``rows`` (not for every ``num_warps``: the reduction layout)."""
    T, H = h.shape
    assert h.is_contiguous() and normed.is_contiguous()
    mode = 1 if delta is not None else (2 if pairs is not None else 0)
    d = delta if delta is not None else (pairs if pairs is not None else h)
    _add_rmsnorm_kernel[(triton.cdiv(T, rows),)](
        h, d, w, normed, T, eps, H=H, BLOCK_H=next_pow2(H), MODE=mode, TOPK=top_k,
        HAS_SHARED=bool(shared), ROWS=rows, num_warps=num_warps, **(dict(num_stages=num_stages) if rows > 1 else {}),
        **pdl(),
    )
    return h, normed
