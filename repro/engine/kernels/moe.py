"""Grouped expert GEMMs of the fused MoE for small token counts (a 32-token block x top-8 of 256 experts),
beside their torch references (:func:`moe_reference`, :func:`moe_naive_loop`: :mod:`.moe_ref`, re-exported).

Each expert is SwiGLU ``down(silu(gate(x)) * up(x))``, the routed experts weighted by the routing weights
of :mod:`.route` (which also holds :class:`MoEWorkspace`, the router and the token-expert alignment); the
shared expert (weight 1) is added.

Weight layout used by the kernels (stack once at load time with :func:`stack_experts`):

* ``w13`` [E1, 2N, H] (bf16/fp16/fp32): rows ``0..N-1`` = gate_proj, rows ``N..2N-1`` = up_proj of expert e.
* ``w2``  [E1, H, N]: down_proj of expert e.
* ``E1 = E`` (no shared expert) or ``E + 1``: index ``E`` is the shared expert, treated as a 257th expert
  that every token selects with weight 1, so one grouped GEMM launch covers routed and shared experts.

Kernels (after routing + alignment in :mod:`.route`; all on device, no host sync, static shapes ->
CUDA-graph capturable). The two grouped GEMMs (steps 1-2) live in :mod:`.moe_gemm` (one shared expert-slot
prologue, ``_expert_slot``: which expert, output tile and token rows a program owns; idle programs exit after one
or two scalar loads; with a tile table in the workspace, :func:`.route.moe_tiles`, many rows per round: the
batched forward, both launch over (tiles in use, n-tiles) instead of (E1, n-tiles, m-blocks), with the same tile
code) and are re-exported here, as the torch references of :mod:`.moe_ref`; this module holds the top-k sum, the L2 prefetch, the
whole-block entry point :func:`fused_moe` and the engine seam adapter:

1. ``_moe_gate_up_kernel``: grid (E1, N/BLOCK_N, cdiv(T_PAD, BLOCK_M)); each program streams one
   [2 x BLOCK_N, H] tile of its expert's w13 once, gathers only that expert's token rows, and writes
   ``silu(gate)*up*routing_weight`` to ``inter[p]``. So each touched expert's weights are read once per
   layer (twice only for an expert with more than BLOCK_M tokens, e.g. the shared expert at BLOCK_M=16:
   the second read usually hits L2).
2. ``_moe_down_kernel``: same grid over (E1, H/BLOCK_N, m-blocks); ``pair_out[p] = inter[p]·w2[e]ᵀ`` (fp32 sums,
   stored in pair_out's dtype: the activation dtype by default, :class:`~.route.MoEWorkspace`).
3. ``_moe_sum_kernel``: ``out[t] = Σ_k pair_out[t*top_k+k] + pair_out[T*top_k+t]`` in fp32 (deterministic order;
   the engine's fast path fuses this sum with the residual add and the next RMSNorm, see ``norm.py``).

Source: the grouped GEMM over per-expert token lists follows the idea of vLLM/SGLang ``fused_moe_kernel``
(own code).
"""
from __future__ import annotations

import torch

from ._triton import HAS_TRITON, gdc_launch_dependents, gdc_wait, pdl, tl, triton
from .moe_gemm import expert_gemms_reference, expert_slots, linear_rows, moe_down, moe_gate_up
from .moe_ref import moe_naive_loop, moe_reference
from .route import DEFAULT_CONFIGS, MoEWorkspace, _cfg, moe_align, moe_route_align, moe_tiles, route_reference
from .route_fused import moe_route_align_fused

if HAS_TRITON:  # the kernels themselves, for tools that compile them (scripts/sass_count.py, the tuner)
    from .moe_gemm import _moe_down_kernel, _moe_gate_up_kernel  # noqa: F401

__all__ = [
    "moe_reference",
    "moe_naive_loop",
    "stack_experts",
    "moe_gate_up",
    "moe_down",
    "expert_gemms_reference",
    "moe_experts",
    "expert_slots",
    "moe_sum",
    "fused_moe",
    "linear_rows",
    "l2_prefetch",
    # routing and alignment (kernels/route.py), re-exported: one import for the whole MoE block
    "route_reference",
    "MoEWorkspace",
    "moe_route_align",
    "moe_route_align_fused",
    "moe_align",
    "moe_tiles",
    "DEFAULT_CONFIGS",
]

# --------------------------------------------------------------------------------------------------
# Weight layout (the torch references: moe_ref.py)
# --------------------------------------------------------------------------------------------------


def stack_experts(gate_projs, up_projs, down_projs, shared=None):
    """Stack HF-style per-expert Linear weights into the kernel layout.

    gate_projs/up_projs: sequences of [N, H]; down_projs: sequence of [H, N];
    shared: optional (gate [N, H], up [N, H], down [H, N]) appended as expert index E.
    Returns (w13 [E1, 2N, H], w2 [E1, H, N]), contiguous, dtype of the inputs.
    """
    g = list(gate_projs)
    u = list(up_projs)
    d = list(down_projs)
    if shared is not None:
        g.append(shared[0])
        u.append(shared[1])
        d.append(shared[2])
    w13 = torch.stack([torch.cat([a, b], 0) for a, b in zip(g, u)], 0).contiguous()
    w2 = torch.stack(d, 0).contiguous()
    return w13, w2


# --------------------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------------------

if HAS_TRITON:
    @triton.jit
    def _l2_prefetch_kernel(p0, n0, p1, n1, p2, n2, dummy_ptr, BLOCK: tl.constexpr, ITERS: tl.constexpr):
        """Read up to three int32 arrays once with evict_last (pull them into L2 for a later kernel).

        Program i covers words [i·BLOCK·ITERS, (i+1)·BLOCK·ITERS) of the concatenation; a word-sum is
        stored to dummy[i] so the loads are not dead code.
        """
        pid = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        acc = tl.zeros((BLOCK,), dtype=tl.int32)
        for it in tl.static_range(ITERS):
            w = (pid * ITERS + it) * BLOCK + offs
            acc += tl.load(p0 + w, mask=w < n0, other=0, eviction_policy="evict_last")
            w1 = w - n0
            acc += tl.load(p1 + w1, mask=(w1 >= 0) & (w1 < n1), other=0, eviction_policy="evict_last")
            w2 = w1 - n1
            acc += tl.load(p2 + w2, mask=(w2 >= 0) & (w2 < n2), other=0, eviction_policy="evict_last")
        tl.store(dummy_ptr + pid, tl.sum(acc, axis=0))

    @triton.jit
    def _moe_sum_kernel(
        pair_ptr, out_ptr, T, H: tl.constexpr, TOPK: tl.constexpr, HAS_SHARED: tl.constexpr,
        BLOCK_H: tl.constexpr, USE_PDL: tl.constexpr = False,
    ):
        """out[t, h] = Σ_k pair[t*TOPK+k, h] (+ pair[T*TOPK+t, h]); the rows (any float dtype) summed in fp32, cast
        to out dtype."""
        if USE_PDL:
            gdc_launch_dependents()
            gdc_wait()
        t = tl.program_id(0)
        offs = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
        acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
        for k in tl.static_range(TOPK):
            acc += tl.load(pair_ptr + (t * TOPK + k) * H + offs).to(tl.float32)
        if HAS_SHARED:
            acc += tl.load(pair_ptr + (T * TOPK + t) * H + offs).to(tl.float32)
        tl.store(out_ptr + t * H + offs, acc.to(out_ptr.dtype.element_ty))


# --------------------------------------------------------------------------------------------------
# Host wrappers
# --------------------------------------------------------------------------------------------------


def l2_prefetch(tensors, dummy, block=2048, iters=4):
    """Pull up to three contiguous tensors into L2 (evict_last), e.g. the next layer's weights.

    dummy: int32 scratch with at least cdiv(total_words, block·iters) elements. Run it on a side stream
    while a bandwidth-bound kernel streams other data with evict_first.
    """
    views = [t.view(torch.int32).reshape(-1) for t in tensors]
    while len(views) < 3:
        views.append(views[0][:0])
    n = [v.numel() for v in views]
    grid = triton.cdiv(sum(n), block * iters)
    assert dummy.numel() >= grid
    _l2_prefetch_kernel[(grid,)](views[0], n[0], views[1], n[1], views[2], n[2], dummy, BLOCK=block,
                                 ITERS=iters, num_warps=4)


def moe_experts(x, w13, w2, ws: MoEWorkspace, top_k, configs=None, norm_w=None, eps=1e-6):
    """Kernels 3-4: grouped gate+up (SiLU·mul·weight fused) and down into ``ws.pair_out`` (its dtype). A kernel whose
    tiles say ``IMPL: "ws"`` runs a warp-specialised Gluon GEMM instead of the Triton one: :mod:`.moe_w4_ws` for
    4-bit experts (layout "hop"), :mod:`.moe_ws` for bf16 experts (a Hopper GPU, bf16 activations; the tiles are
    that module's keys). Raises ValueError for ``IMPL: "ws"`` with ``norm_w`` (the Gluon gate+up takes normalised
    rows) or another IMPL, and what the Gluon wrappers raise (RuntimeError without Gluon 3.6 or a Hopper GPU)."""
    gc, dc = ((configs or {}).get(k) or {} for k in ("gate_up", "down"))
    for name, c in (("gate_up", gc), ("down", dc)):
        if c.get("IMPL", "triton") not in ("triton", "ws"):
            raise ValueError(f"moe_experts: tiles of {name}: IMPL = {c['IMPL']!r}; want 'triton' or 'ws'")
    if gc.get("IMPL") == "ws" or dc.get("IMPL") == "ws":  # the Gluon kernels (Hopper only)
        if isinstance(w13, torch.Tensor):
            from .moe_ws import moe_down_ws16 as moe_down_ws
            from .moe_ws import moe_gate_up_ws16 as moe_gate_up_ws
        else:
            from .moe_w4_ws import moe_down_ws, moe_gate_up_ws
    if gc.get("IMPL") == "ws":
        if norm_w is not None:
            raise ValueError("moe_experts: IMPL 'ws' (the Gluon gate+up) takes normalised rows: norm_w must be None")
        moe_gate_up_ws(x, w13, ws, top_k, tiles=gc)
    else:
        moe_gate_up(x, w13, ws, top_k, configs, norm_w, eps)
    if dc.get("IMPL") == "ws":
        moe_down_ws(w2, ws, tiles=dc)
    else:
        moe_down(w2, ws, configs)


def moe_sum(ws: MoEWorkspace, E, E1, top_k, configs=None):
    """Kernel 5: ``ws.out[t] = Σ_k pair_out[t,k] (+ shared)`` in fp32, stored in ws.out's dtype."""
    T, H = ws.out.shape
    sc = _cfg("sum", configs, H, ws.inter.shape[1], E1, T)
    bh = min(sc["BLOCK_H"], H)
    _moe_sum_kernel[(T, H // bh)](
        ws.pair_out, ws.out, T, H=H, TOPK=top_k, HAS_SHARED=E1 == E + 1, BLOCK_H=bh,
        num_warps=sc["num_warps"],
        **pdl(),
    )
    return ws.out


def fused_moe(
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
    ws: MoEWorkspace | None = None,
    configs: dict | None = None,
) -> torch.Tensor:
    """Fused MoE block (routed + shared expert) for small T; returns [T, H] in x.dtype.

    x [T, H] (bf16 on GPU; fp32/fp16 under the interpreter), gate_w [E, H] fp32 (router weight),
    expert_bias [E] fp32 or None, w13 [E1, 2N, H], w2 [E1, H, N] (see module doc; E1 = E or E+1), or both
    :class:`~repro.checkpoint.nvfp4.NVFP4Experts` (weights-only 4-bit experts, :mod:`.moe_w4`).
    Pass a persistent ``ws`` (``MoEWorkspace.create``) for CUDA-graph capture; the returned tensor is
    then ``ws.out`` (overwritten by the next call). Intended for T <= 128 (one program routes all tokens).
    """
    T, H = x.shape
    E = gate_w.shape[0]
    E1, twoN = expert_slots(w13), w13.shape[1]
    assert E1 in (E, E + 1), (E1, E)
    if ws is None:
        split = _cfg("router", configs, H, twoN // 2, E1, T)["SPLIT_K"]
        ws = MoEWorkspace.create(T, H, twoN // 2, E, E1, top_k, x.dtype, x.device, split_k=split)
    moe_route_align(x, gate_w, expert_bias, ws, E1, top_k, n_group, topk_group, scaling,
                    renormalize, configs)
    moe_experts(x, w13, w2, ws, top_k, configs)
    return moe_sum(ws, E, E1, top_k, configs)


# --------------------------------------------------------------------------------------------------
# Adapter for the engine model's MoE seam (repro/engine/layers/moe.py)
# --------------------------------------------------------------------------------------------------

_SEAM_WS: dict = {}


def moe_forward_triton(x, w_gate_up, w_down, weights, ids):
    """Contract of ``repro.engine.layers.moe.moe_forward_torch`` (routed experts only, no shared expert).

    x [n, D] model dtype; w_gate_up [E, 2I, D]; w_down [E, D, I] (or both NVFP4Experts, shared None: then
    the 4-bit kernels with BLOCK_K 32); weights [n, k] fp32; ids [n, k] int64.
    Returns [n, D] in x.dtype. Uses the Triton alignment + grouped GEMMs for n <= 128 on CUDA (or under
    the interpreter); otherwise falls back to the torch implementation of the seam.
    """
    from ._triton import kernels_usable

    n, D = x.shape
    E, twoI, _ = w_gate_up.shape
    k = ids.shape[1]
    dense = isinstance(w_gate_up, torch.Tensor)
    fits = (w_gate_up.is_contiguous() and w_down.is_contiguous()) if dense else (D % 32 == 0 and twoI % 64 == 0)
    if n > 128 or k & (k - 1) or not kernels_usable(x) or not fits:
        from repro.engine.layers.moe import moe_forward_torch

        return moe_forward_torch(x, w_gate_up, w_down, weights, ids)
    key = (n, D, twoI // 2, E, k, x.dtype, str(x.device))
    ws = _SEAM_WS.get(key)
    if ws is None:
        ws = _SEAM_WS[key] = MoEWorkspace(n, D, twoI // 2, E, E, k, x.dtype, x.device, split_k=1)
    x = x.contiguous()
    moe_align(ids, weights.float(), ws)
    cfg = None if dense else {"gate_up": dict(BLOCK_K=32), "down": dict(BLOCK_K=32)}
    moe_experts(x, w_gate_up, w_down, ws, k, cfg)
    return moe_sum(ws, E, E, k).clone()


def register_with_seam(select: bool = True) -> None:
    """Register :func:`moe_forward_triton` as MoE impl "triton" in the engine seam (and select it)."""
    from repro.engine.layers import moe as seam

    seam.register_moe_impl("triton", moe_forward_triton)
    if select:
        seam.set_moe_impl("triton")
