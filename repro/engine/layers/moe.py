"""Sigmoid group-limited router and routed-expert computation — the MoE dispatch seam.

Routing (docs/engine.md §2 "MoE block", HF ``LLaDA2MoeGate`` / SGLang ``biased_grouped_topk``), all fp32:
``s = sigmoid(x·Wᵀ)``; selection uses biased scores ``b = s + expert_bias``: experts split into ``n_group``
contiguous groups, group score = sum of the group's two largest ``b``; keep the ``topk_group`` best groups;
take the top-``k`` experts by ``b`` inside kept groups. Combine weights are the **unbiased** ``s`` of the
chosen experts, renormalised to sum 1 (``/ (sum + 1e-20)``, when ``norm_topk_prob``), times
``routed_scaling_factor``.

Seam for GPU kernels: the model calls :func:`route` then :func:`moe_forward`; ``moe_forward`` dispatches to
the implementation chosen with :func:`set_moe_impl` (default ``"torch"`` = :func:`moe_forward_torch`).
A Triton grouped-GEMM kernel registers with :func:`register_moe_impl` and must match
:func:`moe_forward_torch`. The shared expert is not part of this seam (the model adds it, weight 1).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from repro.engine.layers.linear import linear


def route(x: torch.Tensor, router_w: torch.Tensor, expert_bias: torch.Tensor | None, top_k: int,
          n_group: int, topk_group: int, scaling: float, norm_topk_prob: bool = True):
    """Group-limited sigmoid top-k routing.

    x: ``[n, D]`` (any float dtype, cast to fp32); router_w: ``[E, D]`` fp32; expert_bias: ``[E]`` fp32 or
    None. Returns ``(weights [n, top_k] fp32, ids [n, top_k] int64)``; ids are expert indices 0..E-1.
    """
    n = x.shape[0]
    e = router_w.shape[0]
    s = torch.sigmoid(linear(x.float(), router_w.float()))  # row-invariant (layers/linear.py)
    b = s + expert_bias.float() if expert_bias is not None else s
    grp = b.view(n, n_group, e // n_group).topk(2, dim=-1).values.sum(-1)
    keep = grp.topk(topk_group, dim=-1).indices
    gmask = torch.zeros_like(grp, dtype=torch.bool).scatter_(1, keep, True)
    emask = gmask[:, :, None].expand(n, n_group, e // n_group).reshape(n, e)
    ids = b.masked_fill(~emask, float("-inf")).topk(top_k, dim=-1).indices
    w = s.gather(1, ids)
    if norm_topk_prob:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    return w * scaling, ids


def moe_forward_torch(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor,
                      weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Routed experts: ``Σ_j weights[t, j] · SwiGLU_{ids[t, j]}(x[t])`` for each token t.

    x: ``[n, D]`` model dtype; w_gate_up: ``[E, 2I, D]`` (per expert rows 0..I-1 gate, I..2I-1 up);
    w_down: ``[E, D, I]``; weights: ``[n, k]`` fp32; ids: ``[n, k]`` int64. Experts run in ascending index
    order over their assigned tokens; contributions accumulate in fp32. Returns ``[n, D]`` in x's dtype.
    Row-invariant: token t's output depends only on ``x[t]`` and its routing, whatever other tokens
    share the call (products of :func:`repro.engine.layers.linear.linear`; per token, experts add up in
    ascending index order).
    """
    out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32, device=x.device)
    for e in torch.unique(ids).tolist():
        tok, slot = torch.nonzero(ids == e, as_tuple=True)
        h = linear(x[tok], w_gate_up[e])  # fixed row tiles: a token's bits do not depend on the others
        g, u = h.chunk(2, dim=-1)
        y = linear(F.silu(g) * u, w_down[e])
        out.index_add_(0, tok, y.float() * weights[tok, slot][:, None])
    return out.to(x.dtype)


MoeFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
_IMPLS: dict[str, MoeFn] = {"torch": moe_forward_torch}
_ACTIVE: list[MoeFn] = [moe_forward_torch]
_ACTIVE_NAME: list[str] = ["torch"]

#: Implementations whose kernel configuration (or fast case) depends on the number of rows: calls go to
#: them in groups of exactly this many rows, so every call has the same shape and a token's result does
#: not depend on the batch (:mod:`repro.engine.batch`). "triton": ``kernels/moe.py``
#: ``moe_forward_triton`` runs its grouped GEMMs for n ≤ 128 and the torch loop above that; its workspace
#: is sized by n. Pad rows repeat row 0's experts with weight 0 (no extra expert is read).
ROW_GROUPS: dict[str, int] = {"triton": 128}


def register_moe_impl(name: str, fn: MoeFn) -> None:
    """Make ``fn`` (same signature/contract as :func:`moe_forward_torch`) selectable as ``name``."""
    _IMPLS[name] = fn


def set_moe_impl(name: str) -> None:
    """Select the routed-expert implementation by name. Raises KeyError listing registered names."""
    if name not in _IMPLS:
        raise KeyError(f"unknown MoE impl {name!r}; registered: {sorted(_IMPLS)}")
    _ACTIVE[0] = _IMPLS[name]
    _ACTIVE_NAME[0] = name


def moe_forward(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor,
                weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Dispatch to the selected implementation; contract of :func:`moe_forward_torch`. Implementations
    listed in :data:`ROW_GROUPS` get fixed-size row groups (batch invariance)."""
    group = ROW_GROUPS.get(_ACTIVE_NAME[0])
    fn = _ACTIVE[0]
    if group is None or x.shape[0] == group:
        return fn(x, w_gate_up, w_down, weights, ids)
    n = x.shape[0]
    pad = (-n) % group
    if pad:
        x = torch.cat([x, x.new_zeros(pad, x.shape[1])])
        ids = torch.cat([ids, ids[:1].expand(pad, -1)])
        weights = torch.cat([weights, weights.new_zeros(pad, weights.shape[1])])
    outs = [fn(x[i:i + group], w_gate_up, w_down, weights[i:i + group], ids[i:i + group])
            for i in range(0, n + pad, group)]
    return torch.cat(outs)[:n]
