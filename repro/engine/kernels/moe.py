"""Grouped expert GEMMs of the fused MoE for small token counts (a 32-token block x top-8 of 256 experts),
beside their torch references (:func:`moe_reference`, :func:`moe_naive_loop`).

Each expert is SwiGLU ``down(silu(gate(x)) * up(x))``, the routed experts weighted by the routing weights
of :mod:`.route` (which also holds :class:`MoEWorkspace`, the router and the token-expert alignment); the
shared expert (weight 1) is added.

Weight layout used by the kernels (stack once at load time with :func:`stack_experts`):

* ``w13`` [E1, 2N, H] (bf16/fp16/fp32): rows ``0..N-1`` = gate_proj, rows ``N..2N-1`` = up_proj of expert e.
* ``w2``  [E1, H, N]: down_proj of expert e.
* ``E1 = E`` (no shared expert) or ``E + 1``: index ``E`` is the shared expert, treated as a 257th expert
  that every token selects with weight 1, so one grouped GEMM launch covers routed and shared experts.

Kernels (after routing + alignment in :mod:`.route`; all on device, no host sync, static shapes ->
CUDA-graph capturable). Both GEMMs start with the same prologue, ``_expert_slot`` (which expert, output
tile and token rows a program owns; idle programs exit after one or two scalar loads). With a tile table in the
workspace (:func:`.route.moe_tiles`, many rows per round: the batched forward) both launch over (tiles in use,
n-tiles) instead of (E1, n-tiles, m-blocks), with the same tile code:

1. ``_moe_gate_up_kernel``: grid (E1, N/BLOCK_N, cdiv(T_PAD, BLOCK_M)); each program streams one
   [2 x BLOCK_N, H] tile of its expert's w13 once, gathers only that expert's token rows, and writes
   ``silu(gate)*up*routing_weight`` to ``inter[p]``. So each touched expert's weights are read once per
   layer (twice only for an expert with more than BLOCK_M tokens, e.g. the shared expert at BLOCK_M=16:
   the second read usually hits L2).
2. ``_moe_down_kernel``: same grid over (E1, H/BLOCK_N, m-blocks); ``pair_out[p] = inter[p]·w2[e]ᵀ`` (fp32).
3. ``_moe_sum_kernel``: ``out[t] = Σ_k pair_out[t*top_k+k] + pair_out[T*top_k+t]`` (deterministic order;
   the engine's fast path fuses this sum with the residual add and the next RMSNorm, see ``norm.py``).

Source: the grouped GEMM over per-expert token lists follows the idea of vLLM/SGLang ``fused_moe_kernel``
(own code).
"""
from __future__ import annotations

import torch

from ._triton import HAS_TRITON, gdc_launch_dependents, gdc_wait, pdl, tl, triton
from .moe_w4 import check_w4_tiles, pick_decode
from .route import DEFAULT_CONFIGS, MoEWorkspace, _cfg, moe_align, moe_route_align, moe_tiles, route_reference

__all__ = [
    "moe_reference",
    "moe_naive_loop",
    "stack_experts",
    "moe_gate_up",
    "moe_down",
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
    "moe_align",
    "moe_tiles",
    "DEFAULT_CONFIGS",
]

# --------------------------------------------------------------------------------------------------
# Plain PyTorch references
# --------------------------------------------------------------------------------------------------


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
    from .moe_w4 import _w4_down_acc, _w4_gate_up_acc

    @triton.jit
    def _expert_slot(counts_ptr, active_ptr, pairs_ptr, BLOCK_M: tl.constexpr, MAXC: tl.constexpr,
                     ACTIVE: tl.constexpr, NACT_IDX: tl.constexpr, SH: tl.constexpr, E_SH: tl.constexpr,
                     TILES: tl.constexpr = False, tiles_ptr=None):
        """Prologue shared by the grouped expert GEMMs: which expert, output tile and token rows this program owns.

        Grid (E1, n-tiles, m-blocks), or with ACTIVE (n-tiles, SH + E, m-blocks) over the active list
        (slot 0 = the shared expert E_SH when SH = 1, then ``active[:counts[NACT_IDX]]``), or with TILES
        (tiles, n-tiles, 1) over the tile table of :func:`.route.moe_tiles` (tile j = (expert, m-block) or (-1, 0)).
        Returns (e, pid_n, offs_m [BLOCK_M], mmask [BLOCK_M], p [BLOCK_M] pair indices, idle): ``idle`` is
        True for a program with no rows (an untouched expert, an m-block past its count, a slot past the
        active list); the caller returns at once then. Pair rows past the count are masked (p = 0).
        """
        if TILES:
            pid_n = tl.program_id(1)
            e_raw = tl.load(tiles_ptr + 2 * tl.program_id(0))
            pid_m = tl.load(tiles_ptr + 2 * tl.program_id(0) + 1)
            e = tl.maximum(e_raw, 0)
            cnt = tl.load(counts_ptr + e, mask=e_raw >= 0, other=0)
        elif ACTIVE:
            pid_n = tl.program_id(0)
            jj = tl.program_id(1) - SH
            pid_m = tl.program_id(2)
            in_list = jj < tl.load(counts_ptr + NACT_IDX)
            e = tl.where(jj < 0, E_SH, tl.load(active_ptr + tl.maximum(jj, 0)))
            cnt = tl.load(counts_ptr + e, mask=in_list, other=0)
        else:
            e = tl.program_id(0)
            pid_n = tl.program_id(1)
            pid_m = tl.program_id(2)
            cnt = tl.load(counts_ptr + e)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        mmask = offs_m < cnt
        p = tl.load(pairs_ptr + e * MAXC + offs_m, mask=mmask, other=0)
        return e, pid_n, offs_m, mmask, p, pid_m * BLOCK_M >= cnt

    @triton.jit
    def _gate_up_acc(x_ptr, tok, stride_xt, mmask, w_ptr, q_ptr, s_ptr, g_ptr, e, offs_n, nw_ptr,
                     H: tl.constexpr, N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, NORM: tl.constexpr, W4: tl.constexpr, DECODE: tl.constexpr = 1):
        """(gate, up) fp32 accumulators [BLOCK_M, BLOCK_N] of the token rows ``tok`` against output rows
        ``offs_n`` of one expert, and Σx² per row (NORM). W4: expert e of the packed (q, s, g) stacks
        (:mod:`.moe_w4`); else the weight rows at ``w_ptr`` ([2N, H], gate rows then up rows)."""
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        ssv = tl.zeros((BLOCK_M,), dtype=tl.float32)
        if W4:
            acc_g, acc_u = _w4_gate_up_acc(x_ptr, tok, stride_xt, mmask, q_ptr, s_ptr, g_ptr, e, offs_n, H, N,
                                           BLOCK_M, BLOCK_N, BLOCK_K, DECODE)
        else:
            offs_k = tl.arange(0, BLOCK_K)
            x_ptrs = x_ptr + tok[:, None] * stride_xt + offs_k[None, :]
            wg_ptrs = w_ptr + offs_n[None, :] * H + offs_k[:, None]
            wu_ptrs = wg_ptrs + N * H
            for k0 in range(0, H, BLOCK_K):
                a = tl.load(x_ptrs + k0, mask=mmask[:, None], other=0.0)
                if NORM:  # RMSNorm folded in: dot with h·nw, rows scaled by rsqrt(mean h² + eps) after the loop
                    af = a.to(tl.float32)
                    ssv += tl.sum(af * af, axis=1)
                    a = (af * tl.load(nw_ptr + k0 + offs_k).to(tl.float32)[None, :]).to(a.dtype)
                wg = tl.load(wg_ptrs + k0, eviction_policy="evict_first")  # streamed once: keep L2 for others
                wu = tl.load(wu_ptrs + k0, eviction_policy="evict_first")
                acc_g = tl.dot(a, wg, acc_g)
                acc_u = tl.dot(a, wu, acc_u)
        return acc_g, acc_u, ssv

    @triton.jit
    def _down_acc(inter_ptr, p, mmask, w_ptr, q_ptr, s_ptr, g_ptr, e, offs_n, H: tl.constexpr, N: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, W4: tl.constexpr,
                  DECODE: tl.constexpr = 1):
        """fp32 [BLOCK_M, BLOCK_N] = inter[p] · W[offs_n]ᵀ for one expert; W4: packed expert e, else rows at
        ``w_ptr`` ([H, N])."""
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if W4:
            acc = _w4_down_acc(inter_ptr, p, mmask, q_ptr, s_ptr, g_ptr, e, offs_n, H, N, BLOCK_M, BLOCK_N, BLOCK_K,
                               DECODE)
        else:
            offs_k = tl.arange(0, BLOCK_K)
            a_ptrs = inter_ptr + p[:, None] * N + offs_k[None, :]
            w_ptrs = w_ptr + offs_n[None, :] * N + offs_k[:, None]
            for k0 in range(0, N, BLOCK_K):
                a = tl.load(a_ptrs + k0, mask=mmask[:, None], other=0.0)
                w = tl.load(w_ptrs + k0, eviction_policy="evict_first")
                acc = tl.dot(a, w, acc)
        return acc

    @triton.jit
    def _moe_gate_up_kernel(
        x_ptr, w13_ptr, counts_ptr, pairs_ptr, pairw_ptr, inter_ptr, nw_ptr, eps, T, stride_xt,
        H: tl.constexpr, N: tl.constexpr, TOPK: tl.constexpr, MAXC: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NORM: tl.constexpr = False,
        ACTIVE: tl.constexpr = False, active_ptr=None,
        NACT_IDX: tl.constexpr = 0, SH: tl.constexpr = 0, E_SH: tl.constexpr = 0, USE_PDL: tl.constexpr = False,
        W4: tl.constexpr = False, q_ptr=None, s_ptr=None, g_ptr=None, W4_DECODE: tl.constexpr = 1,
        TILES: tl.constexpr = False, tiles_ptr=None,
    ):
        """inter[p, n] = silu(x[t]·w13[e, n]) * (x[t]·w13[e, N+n]) * pair_w[p] for the pairs p=(t,e).

        W4: routed experts from the packed NVFP4 stacks (q, s, g), the shared expert E_SH from ``w13_ptr``
        ([2N, H], activation dtype)."""
        if USE_PDL:
            gdc_launch_dependents()
            gdc_wait()
        e, pid_n, offs_m, mmask, p, idle = _expert_slot(counts_ptr, active_ptr, pairs_ptr, BLOCK_M, MAXC, ACTIVE,
                                                        NACT_IDX, SH, E_SH, TILES, tiles_ptr)
        if idle:
            return
        tok = tl.where(p < T * TOPK, p // TOPK, p - T * TOPK)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        if W4:
            if e == E_SH:
                acc_g, acc_u, ssv = _gate_up_acc(x_ptr, tok, stride_xt, mmask, w13_ptr, q_ptr, s_ptr, g_ptr, e,
                                                 offs_n, nw_ptr, H, N, BLOCK_M, BLOCK_N, BLOCK_K, NORM, False)
            else:
                acc_g, acc_u, ssv = _gate_up_acc(x_ptr, tok, stride_xt, mmask, w13_ptr, q_ptr, s_ptr, g_ptr, e,
                                                 offs_n, nw_ptr, H, N, BLOCK_M, BLOCK_N, BLOCK_K, NORM, True, W4_DECODE)
        else:
            acc_g, acc_u, ssv = _gate_up_acc(x_ptr, tok, stride_xt, mmask, w13_ptr + e.to(tl.int64) * (2 * N * H),
                                             q_ptr, s_ptr, g_ptr, e, offs_n, nw_ptr, H, N, BLOCK_M, BLOCK_N, BLOCK_K,
                                             NORM, False)
        if NORM:
            r = tl.rsqrt(ssv / H + eps)
            acc_g = acc_g * r[:, None]
            acc_u = acc_u * r[:, None]
        pw = tl.load(pairw_ptr + p, mask=mmask, other=0.0)
        h = acc_g * tl.sigmoid(acc_g) * acc_u * pw[:, None]
        tl.store(inter_ptr + p[:, None] * N + offs_n[None, :],
                 h.to(inter_ptr.dtype.element_ty), mask=mmask[:, None])

    @triton.jit
    def _moe_down_kernel(
        inter_ptr, w2_ptr, counts_ptr, pairs_ptr, out_ptr,
        H: tl.constexpr, N: tl.constexpr, MAXC: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ACTIVE: tl.constexpr = False, active_ptr=None,
        NACT_IDX: tl.constexpr = 0, SH: tl.constexpr = 0, E_SH: tl.constexpr = 0, USE_PDL: tl.constexpr = False,
        W4: tl.constexpr = False, q_ptr=None, s_ptr=None, g_ptr=None, W4_DECODE: tl.constexpr = 1,
        TILES: tl.constexpr = False, tiles_ptr=None,
    ):
        """pair_out[p, h] = Σ_n inter[p, n] * w2[e, h, n] (fp32) for the pairs p of expert e (W4: as gate+up)."""
        if USE_PDL:
            gdc_launch_dependents()
            gdc_wait()
        e, pid_n, offs_m, mmask, p, idle = _expert_slot(counts_ptr, active_ptr, pairs_ptr, BLOCK_M, MAXC, ACTIVE,
                                                        NACT_IDX, SH, E_SH, TILES, tiles_ptr)
        if idle:
            return
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        if W4:
            if e == E_SH:
                acc = _down_acc(inter_ptr, p, mmask, w2_ptr, q_ptr, s_ptr, g_ptr, e, offs_n, H, N, BLOCK_M, BLOCK_N,
                                BLOCK_K, False)
            else:
                acc = _down_acc(inter_ptr, p, mmask, w2_ptr, q_ptr, s_ptr, g_ptr, e, offs_n, H, N, BLOCK_M, BLOCK_N,
                                BLOCK_K, True, W4_DECODE)
        else:
            acc = _down_acc(inter_ptr, p, mmask, w2_ptr + e.to(tl.int64) * (H * N), q_ptr, s_ptr, g_ptr, e, offs_n,
                            H, N, BLOCK_M, BLOCK_N, BLOCK_K, False)
        tl.store(out_ptr + p[:, None] * H + offs_n[None, :], acc, mask=mmask[:, None])

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
        """out[t, h] = Σ_k pair[t*TOPK+k, h] (+ pair[T*TOPK+t, h]); fp32 sum, cast to out dtype."""
        if USE_PDL:
            gdc_launch_dependents()
            gdc_wait()
        t = tl.program_id(0)
        offs = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
        acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
        for k in tl.static_range(TOPK):
            acc += tl.load(pair_ptr + (t * TOPK + k) * H + offs)
        if HAS_SHARED:
            acc += tl.load(pair_ptr + (T * TOPK + t) * H + offs)
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


def expert_slots(w) -> int:
    """E1 of stacked expert weights: ``w.shape[0]`` of a tensor [E1, out, in]; for NVFP4Experts the routed
    experts plus the shared expert when attached."""
    return w.shape[0] + int(getattr(w, "shared", None) is not None)


def _expert_operand(w, ws: MoEWorkspace, kernel: str, block_k: int, decode: int | None = None,
                    tile: tuple[int, int] = (64, 4)):
    """(E1, out, in, weight argument, W4 launch kwargs) of stacked expert weights ``w``: a tensor [E1, out, in]
    in the activation dtype, or a :class:`~repro.checkpoint.nvfp4.NVFP4Experts` (routed experts packed, the
    shared expert in ``.shared``). ``decode``: the 4-bit decode (``moe_w4.pick_decode``; None = the default
    for the experts' layout and the tile, ``tile`` = (BLOCK_N, num_warps)). Raises ValueError when the packed
    stack does not fit the workspace, the tiles or the decode."""
    from repro.checkpoint.nvfp4 import NVFP4Experts

    if not isinstance(w, NVFP4Experts):
        assert w.is_contiguous()
        return (*w.shape, w, {})
    E, out_f, in_f = w.shape
    E1 = E + (w.shared is not None)
    if E != ws.E or E1 != ws.E1:
        raise ValueError(f"{kernel}: NVFP4 experts for E={E} (shared: {w.shared is not None}), workspace for "
                         f"E={ws.E}, E1={ws.E1}")
    check_w4_tiles(min(block_k, in_f), in_f)
    decode = pick_decode(w.layout, ws.inter, decode, kernel, (min(block_k, in_f), min(tile[0], out_f), tile[1]),
                         w.derived_tables_ok() if w.layout == "lut" and ws.inter.is_cuda else None)
    # the shared expert's rows (never read without one: then any tensor of the activation dtype will do)
    dense = w.shared.contiguous() if w.shared is not None else ws.inter
    return E1, out_f, in_f, dense, dict(W4=True, q_ptr=w.q, s_ptr=w.s, g_ptr=w.g, W4_DECODE=decode)


def moe_gate_up(x, w13, ws: MoEWorkspace, top_k, configs=None, norm_w=None, eps=1e-6):
    """Kernel 3: grouped gate+up GEMM with SiLU·mul·routing weight fused -> ``ws.inter`` [P1, N].

    w13: [E1, 2N, H] in x's dtype, or NVFP4Experts [E, 2N, H] (+ shared) for the weights-only 4-bit mode
    (needs BLOCK_K a multiple of 32; no norm_w; tile key ``W4_DECODE`` picks the decode of
    ``moe_w4._fp4_tile``, default ``moe_w4.pick_decode``). norm_w [H]: x is the un-normalised residual and
    RMSNorm(x)·norm_w is folded into the GEMM. Raises ValueError for norm_w with 4-bit experts.
    """
    T, H = x.shape
    gc = _cfg("gate_up", configs, H, w13.shape[1] // 2, ws.E1, T)
    E1, twoN, _, w_arg, w4 = _expert_operand(w13, ws, "moe_gate_up", gc["BLOCK_K"], gc.get("W4_DECODE"),
                                             (gc["BLOCK_N"], gc.get("num_warps", 4)))
    N = twoN // 2
    if w4 and norm_w is not None:
        raise ValueError("moe_gate_up: the RMSNorm fold (norm_w) is not implemented for 4-bit experts")
    assert x.stride(1) == 1
    bn, bk = min(gc["BLOCK_N"], N), min(gc["BLOCK_K"], H)
    sh = int(ws.E1 == ws.E + 1)
    grid = ((N // bn, E1, triton.cdiv(ws.T_PAD, gc["BLOCK_M"])) if ws.compact
            else (E1, N // bn, triton.cdiv(ws.T_PAD, gc["BLOCK_M"])))
    tiles = _tiles_launch(ws, gc["BLOCK_M"], N // bn, "moe_gate_up")
    if tiles:
        grid = tiles.pop("grid")
    _moe_gate_up_kernel[grid](
        x, w_arg, ws.counts, ws.pairs, ws.pair_w, ws.inter, norm_w if norm_w is not None else x, eps, T,
        x.stride(0), H=H, N=N, TOPK=top_k, MAXC=ws.T_PAD, BLOCK_M=gc["BLOCK_M"], BLOCK_N=bn, BLOCK_K=bk,
        NORM=norm_w is not None, ACTIVE=ws.compact, active_ptr=ws.active, NACT_IDX=ws.E1, SH=sh, E_SH=ws.E,
        num_warps=gc["num_warps"], num_stages=gc["num_stages"], **w4, **tiles, **pdl(),
    )


def moe_down(w2, ws: MoEWorkspace, configs=None):
    """Kernel 4: grouped down GEMM ``ws.pair_out[p] = ws.inter[p]·w2[e]ᵀ`` (fp32); w2 [E1, H, N] or
    NVFP4Experts [E, H, N] (+ shared), as in :func:`moe_gate_up`."""
    T = ws.T
    dc = _cfg("down", configs, w2.shape[1], w2.shape[2], ws.E1, T)
    E1, H, N, w_arg, w4 = _expert_operand(w2, ws, "moe_down", dc["BLOCK_K"], dc.get("W4_DECODE"),
                                          (dc["BLOCK_N"], dc.get("num_warps", 4)))
    assert ws.inter.shape[1] == N
    bn, bk = min(dc["BLOCK_N"], H), min(dc["BLOCK_K"], N)
    sh = int(ws.E1 == ws.E + 1)
    grid = ((H // bn, E1, triton.cdiv(ws.T_PAD, dc["BLOCK_M"])) if ws.compact
            else (E1, H // bn, triton.cdiv(ws.T_PAD, dc["BLOCK_M"])))
    tiles = _tiles_launch(ws, dc["BLOCK_M"], H // bn, "moe_down")
    if tiles:
        grid = tiles.pop("grid")
    _moe_down_kernel[grid](
        ws.inter, w_arg, ws.counts, ws.pairs, ws.pair_out, H=H, N=N, MAXC=ws.T_PAD,
        BLOCK_M=dc["BLOCK_M"], BLOCK_N=bn, BLOCK_K=bk, ACTIVE=ws.compact, active_ptr=ws.active,
        NACT_IDX=ws.E1, SH=sh, E_SH=ws.E,
        num_warps=dc["num_warps"], num_stages=dc["num_stages"], **w4, **tiles, **pdl(),
    )


def _tiles_launch(ws: MoEWorkspace, block_m: int, n_tiles: int, kernel: str) -> dict:
    """Launch kwargs (with ``grid``) of the tile-table mode when ``ws`` has a table (:func:`moe_tiles`), else {}.
    Raises ValueError when the kernel's BLOCK_M differs from the table's."""
    if ws.tiles is None:
        return {}
    if block_m != ws.tiles_block_m:
        raise ValueError(f"{kernel}: BLOCK_M {block_m} but the tile table was built for {ws.tiles_block_m}")
    return dict(grid=(ws.tiles.shape[0], n_tiles, 1), TILES=True, tiles_ptr=ws.tiles)


def linear_rows(x, w, out, counts, pairs, cfg):
    """out[t] = x[t]·wᵀ (fp32) for a small row count through the grouped down-proj kernel (one "expert").

    x [T, K] (bf16), w [N_out, K] contiguous, out [T, N_out] fp32; counts [1] = T and pairs [1, MAXC] =
    0..T-1 (static, e.g. the dense-layer workspace). A split-free skinny GEMM: grid N_out/BLOCK_N programs
    each streaming a [BLOCK_N, K] weight tile once. Used for the QKV and O projections (variant).
    """
    T, K = x.shape
    N_out = w.shape[0]
    maxc = pairs.shape[-1]
    bn, bk = min(cfg["BLOCK_N"], N_out), min(cfg["BLOCK_K"], K)
    assert x.is_contiguous() and w.is_contiguous() and out.is_contiguous() and N_out % bn == 0 and K % bk == 0
    _moe_down_kernel[(1, N_out // bn, triton.cdiv(maxc, cfg["BLOCK_M"]))](
        x, w, counts, pairs, out, H=N_out, N=K, MAXC=maxc, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=bn, BLOCK_K=bk,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **pdl(),
    )
    return out


def moe_experts(x, w13, w2, ws: MoEWorkspace, top_k, configs=None, norm_w=None, eps=1e-6):
    """Kernels 3-4: grouped gate+up (SiLU·mul·weight fused) and down into ``ws.pair_out`` (fp32)."""
    moe_gate_up(x, w13, ws, top_k, configs, norm_w, eps)
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
