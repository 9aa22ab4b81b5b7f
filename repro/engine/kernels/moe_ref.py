"""Plain-PyTorch references of the MoE block (routing + routed experts + shared expert), no Triton:
:func:`moe_reference` (fp32, what the kernels are checked against) and :func:`moe_naive_loop` (the model's
remote-code style, the benchmarks' baseline). Re-exported by :mod:`.moe`; kept apart so that the 4-bit kernels'
reference (:func:`.moe_w4.moe_w4_reference`) reads it without importing the kernels that import the 4-bit ones
(imports only downward: ``moe`` -> ``moe_gemm`` -> ``moe_w4`` -> ``moe_ref`` -> ``route``).

Weight layout: as :mod:`.moe` (``w13`` [E1, 2N, H], rows ``0..N-1`` gate_proj and ``N..2N-1`` up_proj; ``w2``
[E1, H, N]; index ``E`` the shared expert when ``E1 = E + 1``).
"""
from __future__ import annotations

import torch

from .route import route_reference

__all__ = ["moe_reference", "moe_naive_loop"]


def moe_reference(
    x: torch.Tensor,
    gate_w: torch.Tensor,
    expert_bias: torch.Tensor | None,
    w13: torch.Tensor,
    w2: torch.Tensor,
    top_k: int = 8,
    n_group: int = 8,
    topk_group: int = 4,
    scaling: float = 2.5,
    renormalize: bool = True,
    topk: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """MoE block in fp32 (upcast inputs): routed experts + shared expert (if ``w13`` has E+1 experts).

    x [T, H]; w13 [E1, 2N, H]; w2 [E1, H, N]. ``topk`` = (ids, weights) to reuse a routing decision.
    Returns [T, H] fp32.
    """
    E = gate_w.shape[0]
    E1, twoN, H = w13.shape
    N = twoN // 2
    ids, wts = topk if topk is not None else route_reference(
        x, gate_w, expert_bias, top_k, n_group, topk_group, scaling, renormalize
    )
    xf = x.float()
    out = torch.zeros(x.shape[0], H, dtype=torch.float32, device=x.device)
    for e in torch.unique(ids).tolist():
        tok, slot = (ids == e).nonzero(as_tuple=True)
        w = w13[e].float()
        g = xf[tok] @ w[:N].t()
        u = xf[tok] @ w[N:].t()
        y = (torch.nn.functional.silu(g) * u) @ w2[e].float().t()
        out.index_add_(0, tok, y * wts[tok, slot, None])
    if E1 == E + 1:
        w = w13[E].float()
        out += (torch.nn.functional.silu(xf @ w[:N].t()) * (xf @ w[N:].t())) @ w2[E].float().t()
    return out


def moe_naive_loop(x, gate_w, expert_bias, w13, w2, top_k=8, n_group=8, topk_group=4, scaling=2.5):
    """The model's remote-code style (bf16 per-expert loop with host syncs); the benchmark's baseline.

    x [T, H] bf16. Loops over all E experts, ``nonzero`` per expert (one device->host sync each).
    Returns [T, H] in x.dtype.
    """
    E = gate_w.shape[0]
    N = w13.shape[1] // 2
    ids, wts = route_reference(x, gate_w, expert_bias, top_k, n_group, topk_group, scaling)
    wts = wts.to(x.dtype)
    out = torch.zeros_like(x)
    for e in range(E):
        tok, slot = torch.where(ids == e)
        if tok.numel() == 0:
            continue
        xe = x[tok]
        h = torch.nn.functional.silu(xe @ w13[e, :N].t()) * (xe @ w13[e, N:].t())
        out.index_add_(0, tok, (h @ w2[e].t()) * wts[tok, slot, None])
    if w13.shape[0] == E + 1:
        h = torch.nn.functional.silu(x @ w13[E, :N].t()) * (x @ w13[E, N:].t())
        out = out + h @ w2[E].t()
    return out
