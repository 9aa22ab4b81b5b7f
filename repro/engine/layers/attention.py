"""Block-causal attention of one chunk of queries over the KV prefix — the attention dispatch seam.

Contract (docs/engine.md §2 "Attention", §4 "Mask"): a query at absolute position q may attend a key at
absolute position k iff ``k // block_size <= q // block_size`` (bidirectional inside a block, causal across
blocks). Grouped-query attention: KV head j serves query heads ``j·g .. j·g+g-1`` with
``g = n_heads / n_kv_heads``. Scale ``1/sqrt(head_dim)``; softmax in fp32.

Seam for GPU kernels: the model calls :func:`attention_forward` only. It dispatches to the implementation
selected with :func:`set_attention_impl` (default ``"torch"`` = :func:`attention_torch`). A Triton kernel
registers itself with :func:`register_attention_impl` and must match :func:`attention_torch` on the same
inputs (parity test against it).
"""

from __future__ import annotations

import math
from typing import Callable

import torch

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int, int], torch.Tensor]


def attention_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_start: int,
                    block_size: int) -> torch.Tensor:
    """Plain PyTorch block-causal GQA attention.

    q: ``[n, Hq, d]`` queries at absolute positions ``q_start .. q_start+n-1``;
    k, v: ``[S, Hkv, d]`` keys/values at absolute positions ``0 .. S-1`` (S ≥ q_start + n; in the engine,
    the cached prefix followed by this chunk's own K/V). Same dtype for all. Returns ``[n, Hq, d]`` in
    q's dtype. Scores and softmax in fp32. Raises ValueError on inconsistent shapes.
    """
    n, hq, d = q.shape
    s, hkv, _ = k.shape
    if hq % hkv or k.shape != v.shape or k.shape[-1] != d or s < q_start + n:
        raise ValueError(f"attention shapes: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, "
                         f"q_start {q_start}")
    g = hq // hkv
    kk = k.repeat_interleave(g, dim=1)
    vv = v.repeat_interleave(g, dim=1)
    scores = torch.einsum("nhd,shd->hns", q.float(), kk.float()) * (1.0 / math.sqrt(d))
    qb = (torch.arange(q_start, q_start + n, device=q.device) // block_size)[:, None]
    kb = (torch.arange(s, device=q.device) // block_size)[None, :]
    scores = scores.masked_fill(~(kb <= qb)[None], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hns,shd->nhd", probs.to(v.dtype), vv).to(q.dtype)


_IMPLS: dict[str, AttentionFn] = {"torch": attention_torch}
_ACTIVE: list[AttentionFn] = [attention_torch]


def register_attention_impl(name: str, fn: AttentionFn) -> None:
    """Make ``fn`` (same signature/contract as :func:`attention_torch`) selectable as ``name``."""
    _IMPLS[name] = fn


def set_attention_impl(name: str) -> None:
    """Select the attention implementation by name. Raises KeyError listing the registered names."""
    if name not in _IMPLS:
        raise KeyError(f"unknown attention impl {name!r}; registered: {sorted(_IMPLS)}")
    _ACTIVE[0] = _IMPLS[name]


def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_start: int,
                      block_size: int) -> torch.Tensor:
    """Dispatch to the selected implementation; contract of :func:`attention_torch`."""
    return _ACTIVE[0](q, k, v, q_start, block_size)
