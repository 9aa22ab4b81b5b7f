"""Fused MoE for small token counts (a 32-token diffusion block x top-8 of 256 experts), with references.

Model (LLaDA2.1-mini, engine_spec §2 "MoE block"): router ``logits = x·Wᵀ`` in fp32 (W [E, H] fp32),
``s = sigmoid(logits)``; selection on ``s + expert_bias`` with group-limited top-k (E experts in
``n_group`` groups; group score = sum of the group's two largest biased scores; keep ``topk_group``
groups; top-``top_k`` experts among them); combine weights = the *unbiased* ``s`` of the chosen experts,
renormalised to sum 1 (``/(sum+1e-20)``) and multiplied by ``routed_scaling_factor`` (2.5), all fp32.
Each expert is SwiGLU ``down(silu(gate(x)) * up(x))``; the shared expert (weight 1) is added.

Weight layout used by the kernels (stack once at load time with :func:`stack_experts`):

* ``w13`` [E1, 2N, H] (bf16/fp16/fp32): rows ``0..N-1`` = gate_proj, rows ``N..2N-1`` = up_proj of expert e.
* ``w2``  [E1, H, N]: down_proj of expert e.
* ``E1 = E`` (no shared expert) or ``E + 1``: index ``E`` is the shared expert, treated as a 257th expert
  that every token selects with weight 1, so one grouped GEMM launch covers routed and shared experts.

Kernel pipeline (all on device, no host sync, static shapes -> CUDA-graph capturable):

1. ``_router_logits_kernel``: split-K fp32 (IEEE) GEMM, partial logits [SPLIT_K, T_PAD, E].
2. ``_route_align_kernel`` (one program): sums the partials, sigmoid, bias, group-limited top-k,
   renormalisation x scale, then the token-expert alignment: for every expert e its count ``counts[e]``
   and the list of (token, slot) pair indices ``pairs[e, :counts[e]]`` in ascending pair order.
   Pair index ``p = t*top_k + k`` for routed pairs, ``T*top_k + t`` for the shared expert.
3. ``_moe_gate_up_kernel``: grid (E1, N/BLOCK_N, cdiv(T_PAD, BLOCK_M)); each program streams one
   [2 x BLOCK_N, H] tile of its expert's w13 once, gathers only that expert's token rows, and writes
   ``silu(gate)*up*routing_weight`` to ``inter[p]``. Programs of untouched experts exit after one load,
   so each touched expert's weights are read once per layer (twice only for an expert with more than
   BLOCK_M tokens, e.g. the shared expert at BLOCK_M=16: second read usually hits L2).
4. ``_moe_down_kernel``: same grid over (E1, H/BLOCK_N, m-blocks); ``pair_out[p] = inter[p]·w2[e]ᵀ`` (fp32).
5. ``_moe_sum_kernel``: ``out[t] = Σ_k pair_out[t*top_k+k] + pair_out[T*top_k+t]`` (deterministic order;
   the engine's fast path fuses this sum with the residual add and the next RMSNorm, see ``norm.py``).

Sources: the alignment follows the idea of vLLM/SGLang ``moe_align_block_size`` + ``fused_moe_kernel``
(own code; per-expert lists instead of a padded sort since T*top_k is tiny); routing semantics from
SGLang ``biased_grouped_topk`` (masked groups get -inf).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ._triton import HAS_TRITON, next_pow2, tl, triton
from .configs import load_config

__all__ = [
    "route_reference",
    "moe_reference",
    "moe_naive_loop",
    "stack_experts",
    "MoEWorkspace",
    "fused_moe",
    "moe_route_align",
    "DEFAULT_CONFIGS",
]

# --------------------------------------------------------------------------------------------------
# Plain PyTorch references
# --------------------------------------------------------------------------------------------------


def route_reference(
    x: torch.Tensor,
    gate_w: torch.Tensor,
    expert_bias: torch.Tensor | None,
    top_k: int = 8,
    n_group: int = 8,
    topk_group: int = 4,
    scaling: float = 2.5,
    renormalize: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-limited sigmoid routing in fp32.

    x [T, H] any float dtype; gate_w [E, H]; expert_bias [E] or None.
    Returns (topk_ids [T, top_k] int64, sorted by descending biased score; topk_weights [T, top_k] fp32).
    """
    logits = x.float() @ gate_w.float().t()
    scores = torch.sigmoid(logits)
    biased = scores + (expert_bias.float() if expert_bias is not None else 0.0)
    T, E = biased.shape
    gs = E // n_group
    group_scores = biased.view(T, n_group, gs).topk(2, dim=-1).values.sum(-1)
    group_idx = group_scores.topk(topk_group, dim=-1).indices
    group_mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, group_idx, True)
    score_mask = group_mask.unsqueeze(-1).expand(T, n_group, gs).reshape(T, E)
    masked = biased.masked_fill(~score_mask, float("-inf"))
    topk_ids = masked.topk(top_k, dim=-1).indices
    w = scores.gather(1, topk_ids)
    if renormalize:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    return topk_ids, w * scaling


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

DEFAULT_CONFIGS = {
    # tiles for the bandwidth-streaming regime (M ~ 1-2 rows per expert); tuned values in configs/*.json
    "router": dict(BLOCK_E=16, SPLIT_K=4, BLOCK_K=128, num_warps=4, num_stages=2),
    "route": dict(EC=32, num_warps=8),
    "gate_up": dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=4),
    "down": dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=4),
    "sum": dict(BLOCK_H=512, num_warps=4),
}

if HAS_TRITON:

    @triton.jit
    def _router_logits_kernel(
        x_ptr, w_ptr, part_ptr, T, stride_xt,
        H: tl.constexpr, E: tl.constexpr, T_PAD: tl.constexpr,
        BLOCK_E: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_K: tl.constexpr,
    ):
        """part[s, t, e] = Σ_{k in split s} x[t, k] * w[e, k] in fp32 (IEEE); rows t >= T are 0."""
        pid_e = tl.program_id(0)
        pid_k = tl.program_id(1)
        offs_t = tl.arange(0, T_PAD)
        offs_e = pid_e * BLOCK_E + tl.arange(0, BLOCK_E)
        offs_k = tl.arange(0, BLOCK_K)
        K_PER: tl.constexpr = H // SPLIT_K
        acc = tl.zeros((T_PAD, BLOCK_E), dtype=tl.float32)
        for k0 in range(0, K_PER, BLOCK_K):
            kk = pid_k * K_PER + k0 + offs_k
            xv = tl.load(x_ptr + offs_t[:, None] * stride_xt + kk[None, :],
                         mask=offs_t[:, None] < T, other=0.0).to(tl.float32)
            wv = tl.load(w_ptr + offs_e[None, :] * H + kk[:, None]).to(tl.float32)
            acc = tl.dot(xv, wv, acc, input_precision="ieee")
        tl.store(part_ptr + pid_k * (T_PAD * E) + offs_t[:, None] * E + offs_e[None, :], acc)

    @triton.jit
    def _route_align_kernel(
        part_ptr, bias_ptr, ids_ptr, topw_ptr, pairw_ptr, counts_ptr, pairs_ptr, T,
        E: tl.constexpr, T_PAD: tl.constexpr, TOPK: tl.constexpr, N_GROUP: tl.constexpr,
        TOPK_GROUP: tl.constexpr, SPLIT_K: tl.constexpr, SCALE: tl.constexpr,
        RENORM: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SHARED: tl.constexpr,
        MAXC: tl.constexpr, EC: tl.constexpr,
    ):
        """One program: routing for all T tokens, then per-expert pair lists (see module doc)."""
        offs_t = tl.arange(0, T_PAD)
        offs_e = tl.arange(0, E)
        logits = tl.zeros((T_PAD, E), dtype=tl.float32)
        for s in tl.static_range(SPLIT_K):
            logits += tl.load(part_ptr + s * (T_PAD * E) + offs_t[:, None] * E + offs_e[None, :])
        scores = tl.sigmoid(logits)
        if HAS_BIAS:
            biased = scores + tl.load(bias_ptr + offs_e)[None, :]
        else:
            biased = scores
        GS: tl.constexpr = E // N_GROUP
        NEG: tl.constexpr = float("-inf")
        # group score = sum of the two largest biased scores inside each group
        g3 = tl.reshape(biased, (T_PAD, N_GROUP, GS))
        idx3 = tl.arange(0, GS)[None, None, :]
        m1 = tl.max(g3, axis=2)
        a1 = tl.argmax(g3, axis=2)
        m2 = tl.max(tl.where(idx3 == a1[:, :, None], NEG, g3), axis=2)
        gwork = m1 + m2
        gidx = tl.arange(0, N_GROUP)[None, :]
        keep = tl.zeros((T_PAD, N_GROUP), dtype=tl.int32)
        for _ in tl.static_range(TOPK_GROUP):
            ag = tl.argmax(gwork, axis=1)
            hit = gidx == ag[:, None]
            keep = tl.where(hit, 1, keep)
            gwork = tl.where(hit, NEG, gwork)
        keep3 = tl.broadcast_to(keep[:, :, None], (T_PAD, N_GROUP, GS))
        keep2 = tl.reshape(keep3, (T_PAD, E))
        work = tl.where(keep2 != 0, biased, NEG)
        kcol = tl.arange(0, TOPK)[None, :]
        ids = tl.zeros((T_PAD, TOPK), dtype=tl.int32)
        wts = tl.zeros((T_PAD, TOPK), dtype=tl.float32)
        for i in tl.static_range(TOPK):
            a = tl.argmax(work, axis=1)
            sel = offs_e[None, :] == a[:, None]
            wi = tl.sum(tl.where(sel, scores, 0.0), axis=1)
            work = tl.where(sel, NEG, work)
            ids = tl.where(kcol == i, a[:, None], ids)
            wts = tl.where(kcol == i, wi[:, None], wts)
        if RENORM:
            wts = wts / (tl.sum(wts, axis=1)[:, None] + 1e-20)
        wts = wts * SCALE
        tmask = offs_t[:, None] < T
        pidx = offs_t[:, None] * TOPK + kcol
        tl.store(ids_ptr + pidx, ids, mask=tmask)
        tl.store(topw_ptr + pidx, wts, mask=tmask)
        tl.store(pairw_ptr + pidx, wts, mask=tmask)
        # alignment: per-expert ascending pair lists
        P: tl.constexpr = T_PAD * TOPK
        pflat = tl.arange(0, P)
        idsf = tl.reshape(ids, (P,))
        idsf = tl.where(pflat < T * TOPK, idsf, -1)
        for ec in tl.static_range(E // EC):
            ev = ec * EC + tl.arange(0, EC)
            hitm = (idsf[None, :] == ev[:, None]).to(tl.int32)
            cnt = tl.sum(hitm, axis=1)
            slot = tl.cumsum(hitm, axis=1) - 1
            tl.store(pairs_ptr + ev[:, None] * MAXC + slot, pflat[None, :] + 0 * slot, mask=hitm != 0)
            tl.store(counts_ptr + ev, cnt)
        if HAS_SHARED:
            tl.store(counts_ptr + E, T)
            tl.store(pairs_ptr + E * MAXC + offs_t, T * TOPK + offs_t, mask=offs_t < T)
            tl.store(pairw_ptr + T * TOPK + offs_t, tl.full((T_PAD,), 1.0, tl.float32), mask=offs_t < T)

    @triton.jit
    def _moe_gate_up_kernel(
        x_ptr, w13_ptr, counts_ptr, pairs_ptr, pairw_ptr, inter_ptr, T, stride_xt,
        H: tl.constexpr, N: tl.constexpr, TOPK: tl.constexpr, MAXC: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):
        """inter[p, n] = silu(x[t]·w13[e, n]) * (x[t]·w13[e, N+n]) * pair_w[p] for the pairs p=(t,e)."""
        e = tl.program_id(0)
        pid_n = tl.program_id(1)
        pid_m = tl.program_id(2)
        cnt = tl.load(counts_ptr + e)
        if pid_m * BLOCK_M >= cnt:
            return
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        mmask = offs_m < cnt
        p = tl.load(pairs_ptr + e * MAXC + offs_m, mask=mmask, other=0)
        tok = tl.where(p < T * TOPK, p // TOPK, p - T * TOPK)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        x_ptrs = x_ptr + tok[:, None] * stride_xt + offs_k[None, :]
        wbase = w13_ptr + e.to(tl.int64) * (2 * N * H)
        wg_ptrs = wbase + offs_n[None, :] * H + offs_k[:, None]
        wu_ptrs = wg_ptrs + N * H
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, H, BLOCK_K):
            a = tl.load(x_ptrs + k0, mask=mmask[:, None], other=0.0)
            wg = tl.load(wg_ptrs + k0)
            wu = tl.load(wu_ptrs + k0)
            acc_g = tl.dot(a, wg, acc_g)
            acc_u = tl.dot(a, wu, acc_u)
        pw = tl.load(pairw_ptr + p, mask=mmask, other=0.0)
        h = acc_g * tl.sigmoid(acc_g) * acc_u * pw[:, None]
        tl.store(inter_ptr + p[:, None] * N + offs_n[None, :],
                 h.to(inter_ptr.dtype.element_ty), mask=mmask[:, None])

    @triton.jit
    def _moe_down_kernel(
        inter_ptr, w2_ptr, counts_ptr, pairs_ptr, out_ptr,
        H: tl.constexpr, N: tl.constexpr, MAXC: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):
        """pair_out[p, h] = Σ_n inter[p, n] * w2[e, h, n] (fp32) for the pairs p of expert e."""
        e = tl.program_id(0)
        pid_n = tl.program_id(1)
        pid_m = tl.program_id(2)
        cnt = tl.load(counts_ptr + e)
        if pid_m * BLOCK_M >= cnt:
            return
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        mmask = offs_m < cnt
        p = tl.load(pairs_ptr + e * MAXC + offs_m, mask=mmask, other=0)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        a_ptrs = inter_ptr + p[:, None] * N + offs_k[None, :]
        w_ptrs = w2_ptr + e.to(tl.int64) * (H * N) + offs_n[None, :] * N + offs_k[:, None]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, N, BLOCK_K):
            a = tl.load(a_ptrs + k0, mask=mmask[:, None], other=0.0)
            w = tl.load(w_ptrs + k0)
            acc = tl.dot(a, w, acc)
        tl.store(out_ptr + p[:, None] * H + offs_n[None, :], acc, mask=mmask[:, None])

    @triton.jit
    def _moe_sum_kernel(
        pair_ptr, out_ptr, T, H: tl.constexpr, TOPK: tl.constexpr, HAS_SHARED: tl.constexpr,
        BLOCK_H: tl.constexpr,
    ):
        """out[t, h] = Σ_k pair[t*TOPK+k, h] (+ pair[T*TOPK+t, h]); fp32 sum, cast to out dtype."""
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


@dataclass
class MoEWorkspace:
    """Preallocated buffers for one token count T (static addresses -> CUDA-graph capturable).

    part [SPLIT_K, T_PAD, E] fp32; topk_ids [T, K] int32; topk_w [T, K] fp32; pair_w [P1] fp32;
    counts [E1] int32; pairs [E1, T_PAD] int32; inter [P1, N] dtype; pair_out [P1, H] fp32;
    out [T, H] dtype, with P1 = T*K (+T with a shared expert).
    """

    T: int
    T_PAD: int
    part: torch.Tensor
    topk_ids: torch.Tensor
    topk_w: torch.Tensor
    pair_w: torch.Tensor
    counts: torch.Tensor
    pairs: torch.Tensor
    inter: torch.Tensor
    pair_out: torch.Tensor
    out: torch.Tensor

    @classmethod
    def create(cls, T, H, N, E, E1, top_k, dtype, device, split_k=4):
        T_PAD = max(16, next_pow2(T))
        P1 = T * top_k + (T if E1 == E + 1 else 0)
        f32 = dict(dtype=torch.float32, device=device)
        i32 = dict(dtype=torch.int32, device=device)
        return cls(
            T=T,
            T_PAD=T_PAD,
            part=torch.zeros(split_k, T_PAD, E, **f32),
            topk_ids=torch.zeros(T, top_k, **i32),
            topk_w=torch.zeros(T, top_k, **f32),
            pair_w=torch.zeros(P1, **f32),
            counts=torch.zeros(E1, **i32),
            pairs=torch.zeros(E1, T_PAD, **i32),
            inter=torch.zeros(P1, N, dtype=dtype, device=device),
            pair_out=torch.zeros(P1, H, **f32),
            out=torch.zeros(T, H, dtype=dtype, device=device),
        )


def _cfg(kernel, configs, H, N, E1, T):
    if configs and kernel in configs:
        c = dict(DEFAULT_CONFIGS[kernel])
        c.update(configs[kernel])
        return c
    return load_config("moe", kernel, DEFAULT_CONFIGS[kernel], E=E1, N=N, H=H, T=T)


def moe_route_align(x, gate_w, expert_bias, ws: MoEWorkspace, E1, top_k=8, n_group=8, topk_group=4,
                    scaling=2.5, renormalize=True, configs=None):
    """Kernels 1-2: routing + alignment into ``ws`` (topk_ids, topk_w, pair_w, counts, pairs)."""
    T, H = x.shape
    E = gate_w.shape[0]
    assert x.stride(1) == 1 and gate_w.is_contiguous() and gate_w.shape[1] == H
    assert E & (E - 1) == 0 and n_group & (n_group - 1) == 0 and top_k & (top_k - 1) == 0
    rc = _cfg("router", configs, H, ws.inter.shape[1], E1, T)
    split = ws.part.shape[0]
    be = min(rc["BLOCK_E"], E)
    bk = min(rc["BLOCK_K"], H // split)
    assert H % (split * bk) == 0 and E % be == 0
    _router_logits_kernel[(E // be, split)](
        x, gate_w, ws.part, T, x.stride(0), H=H, E=E, T_PAD=ws.T_PAD, BLOCK_E=be, SPLIT_K=split,
        BLOCK_K=bk, num_warps=rc["num_warps"], num_stages=rc["num_stages"],
    )
    ac = _cfg("route", configs, H, ws.inter.shape[1], E1, T)
    ec = min(ac["EC"], E)
    _route_align_kernel[(1,)](
        ws.part, expert_bias if expert_bias is not None else ws.part, ws.topk_ids, ws.topk_w,
        ws.pair_w, ws.counts, ws.pairs, T, E=E, T_PAD=ws.T_PAD, TOPK=top_k, N_GROUP=n_group,
        TOPK_GROUP=topk_group, SPLIT_K=split, SCALE=float(scaling), RENORM=bool(renormalize),
        HAS_BIAS=expert_bias is not None, HAS_SHARED=E1 == E + 1, MAXC=ws.T_PAD, EC=ec,
        num_warps=ac["num_warps"],
    )


def moe_gate_up(x, w13, ws: MoEWorkspace, top_k, configs=None):
    """Kernel 3: grouped gate+up GEMM with SiLU·mul·routing weight fused -> ``ws.inter`` [P1, N]."""
    T, H = x.shape
    E1, twoN, _ = w13.shape
    N = twoN // 2
    assert w13.is_contiguous() and x.stride(1) == 1
    gc = _cfg("gate_up", configs, H, N, E1, T)
    bn, bk = min(gc["BLOCK_N"], N), min(gc["BLOCK_K"], H)
    _moe_gate_up_kernel[(E1, N // bn, triton.cdiv(ws.T_PAD, gc["BLOCK_M"]))](
        x, w13, ws.counts, ws.pairs, ws.pair_w, ws.inter, T, x.stride(0), H=H, N=N, TOPK=top_k,
        MAXC=ws.T_PAD, BLOCK_M=gc["BLOCK_M"], BLOCK_N=bn, BLOCK_K=bk,
        num_warps=gc["num_warps"], num_stages=gc["num_stages"],
    )


def moe_down(w2, ws: MoEWorkspace, configs=None):
    """Kernel 4: grouped down GEMM ``ws.pair_out[p] = ws.inter[p]·w2[e]ᵀ`` (fp32)."""
    E1, H, N = w2.shape
    T = ws.T
    assert w2.is_contiguous() and ws.inter.shape[1] == N
    dc = _cfg("down", configs, H, N, E1, T)
    bn, bk = min(dc["BLOCK_N"], H), min(dc["BLOCK_K"], N)
    _moe_down_kernel[(E1, H // bn, triton.cdiv(ws.T_PAD, dc["BLOCK_M"]))](
        ws.inter, w2, ws.counts, ws.pairs, ws.pair_out, H=H, N=N, MAXC=ws.T_PAD,
        BLOCK_M=dc["BLOCK_M"], BLOCK_N=bn, BLOCK_K=bk,
        num_warps=dc["num_warps"], num_stages=dc["num_stages"],
    )


def moe_experts(x, w13, w2, ws: MoEWorkspace, top_k, configs=None):
    """Kernels 3-4: grouped gate+up (SiLU·mul·weight fused) and down into ``ws.pair_out`` (fp32)."""
    moe_gate_up(x, w13, ws, top_k, configs)
    moe_down(w2, ws, configs)


def moe_sum(ws: MoEWorkspace, E, E1, top_k, configs=None):
    """Kernel 5: ``ws.out[t] = Σ_k pair_out[t,k] (+ shared)`` in fp32, stored in ws.out's dtype."""
    T, H = ws.out.shape
    sc = _cfg("sum", configs, H, ws.inter.shape[1], E1, T)
    bh = min(sc["BLOCK_H"], H)
    _moe_sum_kernel[(T, H // bh)](
        ws.pair_out, ws.out, T, H=H, TOPK=top_k, HAS_SHARED=E1 == E + 1, BLOCK_H=bh,
        num_warps=sc["num_warps"],
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
    expert_bias [E] fp32 or None, w13 [E1, 2N, H], w2 [E1, H, N] (see module doc; E1 = E or E+1).
    Pass a persistent ``ws`` (``MoEWorkspace.create``) for CUDA-graph capture; the returned tensor is
    then ``ws.out`` (overwritten by the next call). Intended for T <= 128 (one program routes all tokens).
    """
    T, H = x.shape
    E = gate_w.shape[0]
    E1, twoN, _ = w13.shape
    assert E1 in (E, E + 1), (E1, E)
    if ws is None:
        split = _cfg("router", configs, H, twoN // 2, E1, T)["SPLIT_K"]
        ws = MoEWorkspace.create(T, H, twoN // 2, E, E1, top_k, x.dtype, x.device, split_k=split)
    moe_route_align(x, gate_w, expert_bias, ws, E1, top_k, n_group, topk_group, scaling,
                    renormalize, configs)
    moe_experts(x, w13, w2, ws, top_k, configs)
    return moe_sum(ws, E, E1, top_k, configs)
