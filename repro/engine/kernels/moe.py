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
2. ``_route_select_kernel`` (one program per token): sums the partials, sigmoid, bias, group-limited
   top-k, renormalisation x scale, then the token-expert alignment by atomics: for every expert e its
   count ``counts[e]`` and the list of pair indices ``pairs[e, :counts[e]]`` (order not fixed; each
   pair's result row is computed independently, so the output does not depend on it).
   Pair index ``p = t*top_k + k`` for routed pairs, ``T*top_k + t`` for the shared expert.
   With the RMSNorm folded into the router (``norm_w``), it can also write the normalised rows that the
   expert GEMMs read (``norm_out``), replacing the separate add+RMSNorm launch.
3. ``_moe_gate_up_kernel``: grid (E1, N/BLOCK_N, cdiv(T_PAD, BLOCK_M)); each program streams one
   [2 x BLOCK_N, H] tile of its expert's w13 once, gathers only that expert's token rows, and writes
   ``silu(gate)*up*routing_weight`` to ``inter[p]``. Programs of untouched experts exit after one load,
   so each touched expert's weights are read once per layer (twice only for an expert with more than
   BLOCK_M tokens, e.g. the shared expert at BLOCK_M=16: second read usually hits L2).
4. ``_moe_down_kernel``: same grid over (E1, H/BLOCK_N, m-blocks); ``pair_out[p] = inter[p]·w2[e]ᵀ`` (fp32).
5. ``_moe_sum_kernel``: ``out[t] = Σ_k pair_out[t*top_k+k] + pair_out[T*top_k+t]`` (deterministic order;
   the engine's fast path fuses this sum with the residual add and the next RMSNorm, see ``norm.py``).

Sources: the alignment follows the idea of vLLM/SGLang ``moe_align_block_size`` + ``fused_moe_kernel``
(own code; per-expert lists filled by atomics instead of a padded sort, since T*top_k is tiny); routing semantics from
SGLang ``biased_grouped_topk`` (masked groups get -inf).
"""
from __future__ import annotations

import torch

from ._triton import HAS_TRITON, gdc_launch_dependents, gdc_wait, pdl, next_pow2, tl, triton
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
    "router": dict(BLOCK_E=16, SPLIT_K=8, BLOCK_K=64, num_warps=4, num_stages=2, PREC="ieee"),
    "route": dict(num_warps=4),
    "gate_up": dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=4),
    "down": dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=4),
    "sum": dict(BLOCK_H=512, num_warps=4),
}

if HAS_TRITON:

    @triton.jit
    def _router_logits_kernel(
        x_ptr, w_ptr, part_ptr, nw_ptr, ss_ptr, T, stride_xt,
        H: tl.constexpr, E: tl.constexpr, T_PAD: tl.constexpr,
        BLOCK_E: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_K: tl.constexpr, PREC: tl.constexpr,
        NORM: tl.constexpr = False, WRITE_SS: tl.constexpr = True, USE_PDL: tl.constexpr = False,
    ):
        """part[s, t, e] = Σ_{k in split s} x[t, k] * w[e, k] in fp32 (PREC "ieee" or "tf32x3"); rows t >= T are 0.

        NORM: x is the raw residual h; the kernel uses h·nw (RMSNorm weight) and, with WRITE_SS, also writes
        the split's Σh² to ss[s, t] (programs of the first expert tile), so the select kernel applies
        rsqrt(mean h² + eps) (without WRITE_SS the select kernel sums h² of its row itself).
        """
        if USE_PDL:
            gdc_launch_dependents()
            gdc_wait()
        pid_e = tl.program_id(0)
        pid_k = tl.program_id(1)
        offs_t = tl.arange(0, T_PAD)
        offs_e = pid_e * BLOCK_E + tl.arange(0, BLOCK_E)
        offs_k = tl.arange(0, BLOCK_K)
        K_PER: tl.constexpr = H // SPLIT_K
        acc = tl.zeros((T_PAD, BLOCK_E), dtype=tl.float32)
        ssv = tl.zeros((T_PAD,), dtype=tl.float32)
        for k0 in range(0, K_PER, BLOCK_K):
            kk = pid_k * K_PER + k0 + offs_k
            xv = tl.load(x_ptr + offs_t[:, None] * stride_xt + kk[None, :],
                         mask=offs_t[:, None] < T, other=0.0).to(tl.float32)
            if NORM:
                if WRITE_SS:
                    ssv += tl.sum(xv * xv, axis=1)
                xv = xv * tl.load(nw_ptr + kk).to(tl.float32)[None, :]
            wv = tl.load(w_ptr + offs_e[None, :] * H + kk[:, None]).to(tl.float32)
            acc = tl.dot(xv, wv, acc, input_precision=PREC)
        tl.store(part_ptr + pid_k * (T_PAD * E) + offs_t[:, None] * E + offs_e[None, :], acc)
        if NORM and WRITE_SS:
            if pid_e == 0:
                tl.store(ss_ptr + pid_k * T_PAD + offs_t, ssv)

    @triton.jit
    def _route_select_kernel(
        part_ptr, bias_ptr, ids_ptr, topw_ptr, pairw_ptr, counts_ptr, pairs_ptr, next_counts_ptr, ss_ptr, eps,
        x_ptr, nw_ptr, normed_ptr, stride_xt, stride_nt,
        active_ptr, NACT_IDX: tl.constexpr, E: tl.constexpr, T_PAD: tl.constexpr, TOPK: tl.constexpr, N_GROUP: tl.constexpr,
        TOPK_GROUP: tl.constexpr, SPLIT_K: tl.constexpr, SCALE: tl.constexpr,
        RENORM: tl.constexpr, HAS_BIAS: tl.constexpr, MAXC: tl.constexpr, ZERO_NEXT: tl.constexpr,
        NORM: tl.constexpr = False, H: tl.constexpr = 1, WRITE_NORMED: tl.constexpr = False,
        BLOCK_H: tl.constexpr = 1, USE_PDL: tl.constexpr = False,
    ):
        """One program per token t: routing of t, then its pairs appended to the experts' lists.

        slot = atomic_add(counts[e], 1) (counts[:E] must be 0 on entry); pairs[e, slot] = t*TOPK + k.
        The order inside an expert's list is not fixed, but every pair's result row is computed
        independently, so outputs do not depend on it. ZERO_NEXT: program 0 also clears
        ``next_counts[:E]`` (the counts buffer of the next MoE layer; see fastpath).
        NORM: the partial logits are of the raw residual h (times the norm weight); they are scaled by
        r = rsqrt(mean h² + eps), with Σh² from the router's ss partials, or, with WRITE_NORMED, from row t of h
        (x, loaded first so that its latency overlaps the partials' loads), which is then also written as
        ``normed[t] = (x[t]·r).to(x.dtype)·nw`` in normed's dtype (the RMSNorm of ``norm.add_rmsnorm``).
        """
        if USE_PDL:
            gdc_launch_dependents()
            gdc_wait()
        t = tl.program_id(0)
        offs_e = tl.arange(0, E)
        if WRITE_NORMED:
            offs_h = tl.arange(0, BLOCK_H)
            mh = offs_h < H
            xv = tl.load(x_ptr + t * stride_xt + offs_h, mask=mh, other=0.0)
            nwv = tl.load(nw_ptr + offs_h, mask=mh, other=0.0).to(tl.float32)
        logits = tl.zeros((E,), dtype=tl.float32)
        for s in tl.static_range(SPLIT_K):
            logits += tl.load(part_ptr + s * (T_PAD * E) + t * E + offs_e)
        if WRITE_NORMED:
            xf = xv.to(tl.float32)
            r = tl.rsqrt(tl.sum(xf * xf, axis=0) / H + eps)
            logits = logits * r
            y = (xf * r).to(xv.dtype).to(tl.float32) * nwv
            tl.store(normed_ptr + t * stride_nt + offs_h, y.to(normed_ptr.dtype.element_ty), mask=mh)
        elif NORM:
            ss = tl.load(ss_ptr + tl.arange(0, SPLIT_K) * T_PAD + t)
            logits = logits * tl.rsqrt(tl.sum(ss, axis=0) / H + eps)
        scores = tl.sigmoid(logits)
        if HAS_BIAS:
            biased = scores + tl.load(bias_ptr + offs_e)
        else:
            biased = scores
        GS: tl.constexpr = E // N_GROUP
        NEG: tl.constexpr = float("-inf")
        g2 = tl.reshape(biased, (N_GROUP, GS))
        gi = tl.arange(0, GS)[None, :]
        m1 = tl.max(g2, axis=1)
        a1 = tl.argmax(g2, axis=1)
        m2 = tl.max(tl.where(gi == a1[:, None], NEG, g2), axis=1)
        gwork = m1 + m2
        gidx = tl.arange(0, N_GROUP)
        keep = tl.zeros((N_GROUP,), dtype=tl.int32)
        for _ in tl.static_range(TOPK_GROUP):
            ag = tl.argmax(gwork, axis=0)
            keep = tl.where(gidx == ag, 1, keep)
            gwork = tl.where(gidx == ag, NEG, gwork)
        keep2 = tl.reshape(tl.broadcast_to(keep[:, None], (N_GROUP, GS)), (E,))
        work = tl.where(keep2 != 0, biased, NEG)
        kidx = tl.arange(0, TOPK)
        ids = tl.zeros((TOPK,), dtype=tl.int32)
        wts = tl.zeros((TOPK,), dtype=tl.float32)
        for i in tl.static_range(TOPK):
            a = tl.argmax(work, axis=0)
            sel = offs_e == a
            wi = tl.sum(tl.where(sel, scores, 0.0), axis=0)
            work = tl.where(sel, NEG, work)
            ids = tl.where(kidx == i, a, ids)
            wts = tl.where(kidx == i, wi, wts)
        if RENORM:
            wts = wts / (tl.sum(wts, axis=0) + 1e-20)
        wts = wts * SCALE
        p = t * TOPK + kidx
        tl.store(ids_ptr + p, ids)
        tl.store(topw_ptr + p, wts)
        tl.store(pairw_ptr + p, wts)
        slot = tl.atomic_add(counts_ptr + ids, tl.full((TOPK,), 1, tl.int32))
        tl.store(pairs_ptr + ids * MAXC + slot, p)
        # first pair of an expert appends the expert to the active list (counts[NACT_IDX] = its length)
        first = slot == 0
        pos = tl.atomic_add(counts_ptr + NACT_IDX + 0 * ids, tl.full((TOPK,), 1, tl.int32), mask=first)
        tl.store(active_ptr + pos, ids, mask=first)
        if ZERO_NEXT:
            if t == 0:
                tl.store(next_counts_ptr + offs_e, tl.zeros((E,), dtype=tl.int32))
                tl.store(next_counts_ptr + NACT_IDX, 0)

    @triton.jit
    def _align_kernel(
        ids_ptr, w_ptr, pairw_ptr, counts_ptr, pairs_ptr, active_ptr,
                      TOPK: tl.constexpr, MAXC: tl.constexpr, NACT_IDX: tl.constexpr, USE_PDL: tl.constexpr = False,
    ):
        """Alignment of given routing (ids [T, TOPK] int64/int32, w [T, TOPK] fp32); one program per token."""
        if USE_PDL:
            gdc_launch_dependents()
            gdc_wait()
        t = tl.program_id(0)
        kidx = tl.arange(0, TOPK)
        p = t * TOPK + kidx
        ids = tl.load(ids_ptr + p).to(tl.int32)
        tl.store(pairw_ptr + p, tl.load(w_ptr + p).to(tl.float32))
        slot = tl.atomic_add(counts_ptr + ids, tl.full((TOPK,), 1, tl.int32))
        tl.store(pairs_ptr + ids * MAXC + slot, p)
        first = slot == 0
        pos = tl.atomic_add(counts_ptr + NACT_IDX + 0 * ids, tl.full((TOPK,), 1, tl.int32), mask=first)
        tl.store(active_ptr + pos, ids, mask=first)

    @triton.jit
    def _logits_partial_stats_kernel(
        x_ptr, part_ptr, V, stride_x, NCHUNK: tl.constexpr, BLOCK_V: tl.constexpr, USE_PDL: tl.constexpr = False,
    ):
        """Row t, vocab chunk c: (max, first argmax, Σ e^(x-max), Σ e^(x-max)·x) in fp32 -> part[t, c, 4]."""
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
            up = x > mv
            iv = tl.where(up, o, iv)
            mv = tl.where(up, x, mv)
        m = tl.max(mv, axis=0)
        idx = tl.min(tl.where(mv == m, iv, 2147483647), axis=0)
        sv = tl.zeros((BLOCK_V,), dtype=tl.float32)
        wv = tl.zeros((BLOCK_V,), dtype=tl.float32)
        for v0 in range(lo, hi, BLOCK_V):
            o = v0 + offs
            msk = o < hi
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

    @triton.jit
    def _moe_gate_up_kernel(
        x_ptr, w13_ptr, counts_ptr, pairs_ptr, pairw_ptr, inter_ptr, nw_ptr, eps, T, stride_xt,
        H: tl.constexpr, N: tl.constexpr, TOPK: tl.constexpr, MAXC: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NORM: tl.constexpr = False,
        ACTIVE: tl.constexpr = False, active_ptr=None,
        NACT_IDX: tl.constexpr = 0, SH: tl.constexpr = 0, E_SH: tl.constexpr = 0, USE_PDL: tl.constexpr = False,
    ):
        """inter[p, n] = silu(x[t]·w13[e, n]) * (x[t]·w13[e, N+n]) * pair_w[p] for the pairs p=(t,e)."""
        if USE_PDL:
            gdc_launch_dependents()
            gdc_wait()
        if ACTIVE:  # grid (n-tiles, active slots, m-blocks): slot 0 = shared expert, then the active list
            pid_n = tl.program_id(0)
            jj = tl.program_id(1) - SH
            pid_m = tl.program_id(2)
            nact = tl.load(counts_ptr + NACT_IDX)
            ea = tl.load(active_ptr + tl.maximum(jj, 0))
            e = tl.where(jj < 0, E_SH, ea)
            if jj >= nact:
                return
        else:
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
        ssv = tl.zeros((BLOCK_M,), dtype=tl.float32)
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
    ):
        """pair_out[p, h] = Σ_n inter[p, n] * w2[e, h, n] (fp32) for the pairs p of expert e."""
        if USE_PDL:
            gdc_launch_dependents()
            gdc_wait()
        if ACTIVE:  # grid (n-tiles, active slots, m-blocks): slot 0 = shared expert, then the active list
            pid_n = tl.program_id(0)
            jj = tl.program_id(1) - SH
            pid_m = tl.program_id(2)
            nact = tl.load(counts_ptr + NACT_IDX)
            ea = tl.load(active_ptr + tl.maximum(jj, 0))
            e = tl.where(jj < 0, E_SH, ea)
            if jj >= nact:
                return
        else:
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
            w = tl.load(w_ptrs + k0, eviction_policy="evict_first")
            acc = tl.dot(a, w, acc)
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


class MoEWorkspace:
    """Preallocated buffers for one token count T (static addresses -> CUDA-graph capturable).

    part [SPLIT_K, T_PAD, E] fp32 (router partial logits); topk_ids [T, K] int32; topk_w [T, K] fp32;
    pair_w [P1] fp32; counts_all [n_slots, E1] int32 (one row per MoE layer in the fast path, so that each
    layer's select kernel can clear the next layer's row; ``counts`` is the row in use); pairs [E1, T_PAD]
    int32; inter [P1, N] dtype; pair_out [P1, H] fp32; out [T, H] dtype, with P1 = T*K (+T with a shared
    expert). The shared expert's row (index E) is constant: count T, pairs T*K + t, weight 1.
    """

    def __init__(self, T, H, N, E, E1, top_k, dtype, device, split_k=4, n_slots=1):
        self.T, self.E, self.E1, self.top_k = T, E, E1, top_k
        self.T_PAD = T_PAD = max(16, next_pow2(T))
        P1 = T * top_k + (T if E1 == E + 1 else 0)
        f32 = dict(dtype=torch.float32, device=device)
        i32 = dict(dtype=torch.int32, device=device)
        self.part = torch.zeros(split_k, T_PAD, E, **f32)
        self.ss = torch.zeros(split_k, T_PAD, **f32)
        self.topk_ids = torch.zeros(T, top_k, **i32)
        self.topk_w = torch.zeros(T, top_k, **f32)
        self.pair_w = torch.zeros(P1, **f32)
        self.counts_all = torch.zeros(n_slots, E1 + 1, **i32)  # [:, E1] = number of active routed experts
        self.active = torch.zeros(max(E, 1), **i32)  # active routed experts of the current layer
        self.compact = False  # launch the expert GEMMs over (active list) instead of all E1 experts
        self.pairs = torch.zeros(E1, T_PAD, **i32)
        self.inter = torch.zeros(P1, N, dtype=dtype, device=device)
        self.pair_out = torch.zeros(P1, H, **f32)
        self.out = torch.zeros(T, H, dtype=dtype, device=device)
        self.slot = 0
        if E1 == E + 1:
            self.counts_all[:, E] = T
            self.pairs[E, :T] = torch.arange(T * top_k, T * top_k + T, device=device, dtype=torch.int32)
            self.pair_w[T * top_k:] = 1.0

    @classmethod
    def create(cls, T, H, N, E, E1, top_k, dtype, device, split_k=4, n_slots=1):
        return cls(T, H, N, E, E1, top_k, dtype, device, split_k, n_slots)

    @property
    def counts(self) -> torch.Tensor:
        """Counts row [E1 + 1] of the slot in use (index E1: length of the active list)."""
        return self.counts_all[self.slot]


def _cfg(kernel, configs, H, N, E1, T):
    if configs and kernel in configs:
        c = dict(DEFAULT_CONFIGS[kernel])
        c.update(configs[kernel])
        return c
    return load_config("moe", kernel, DEFAULT_CONFIGS[kernel], E=E1, N=N, H=H, T=T)


def moe_route_align(x, gate_w, expert_bias, ws: MoEWorkspace, E1, top_k=8, n_group=8, topk_group=4,
                    scaling=2.5, renormalize=True, configs=None, slot=None, norm_w=None, eps=1e-6, norm_out=None):
    """Kernels 1-2: router logits + per-token selection/alignment into ``ws``.

    x [T, H] (bf16 on GPU; fp32/fp16 under the interpreter), unit stride along H; gate_w [E, H] fp32
    contiguous; expert_bias [E] fp32 or None. Results in ``ws`` (topk_ids, topk_w, pair_w, counts, pairs, active).
    norm_w [H] (x.dtype): x is the un-normalised residual h; RMSNorm(h)·norm_w is folded into the router GEMM.
    norm_out [T, H] (x.dtype, unit stride along H; needs norm_w): the select kernel also writes
    ``norm_out = RMSNorm(h)·norm_w`` there with the numerics of ``norm.add_rmsnorm`` (Σh² of the row in one
    fp32 reduction, ``(h·r).to(dtype)·w`` rounded to the dtype; only the reduction order on the GPU may
    differ, by a last-bit change of r), and scales the logits by the same r. Rows >= T are not touched.
    This replaces the separate add+RMSNorm launch when the O projection adds into h in place.
    slot=None (standalone): uses counts row 0 and clears it first (one memset). slot=l (fast path): uses
    row l, expects it cleared, and clears row (l+1) % n_slots for the next MoE layer (no memset).
    Raises ValueError for norm_out without norm_w, or not of x's shape with unit stride along H.
    """
    T, H = x.shape
    E = gate_w.shape[0]
    if norm_out is not None and (norm_w is None or norm_out.shape != x.shape or norm_out.stride(1) != 1):
        raise ValueError("norm_out needs norm_w and the shape [T, H] of x with unit stride along H")
    assert x.stride(1) == 1 and gate_w.is_contiguous() and gate_w.shape[1] == H
    assert E & (E - 1) == 0 and n_group & (n_group - 1) == 0 and top_k & (top_k - 1) == 0
    rc = _cfg("router", configs, H, ws.inter.shape[1], E1, T)
    split = ws.part.shape[0]
    be = min(rc["BLOCK_E"], E)
    bk = min(rc["BLOCK_K"], H // split)
    assert H % (split * bk) == 0 and E % be == 0
    _router_logits_kernel[(E // be, split)](
        x, gate_w, ws.part, norm_w if norm_w is not None else gate_w, ws.ss, T, x.stride(0), H=H, E=E, T_PAD=ws.T_PAD, BLOCK_E=be, SPLIT_K=split,
        BLOCK_K=bk, PREC=rc.get("PREC", "ieee"), NORM=norm_w is not None, WRITE_SS=norm_out is None,
        num_warps=rc["num_warps"],
        num_stages=rc["num_stages"],
        **pdl(),
    )
    if slot is None:
        ws.slot = 0
        ws.counts_all[0, :E].zero_()
        ws.counts_all[0, E1:].zero_()
        nxt = ws.counts_all[0]
    else:
        ws.slot = slot
        nxt = ws.counts_all[(slot + 1) % ws.counts_all.shape[0]]
    ac = _cfg("route", configs, H, ws.inter.shape[1], E1, T)
    no = norm_out if norm_out is not None else x
    _route_select_kernel[(T,)](
        ws.part, expert_bias if expert_bias is not None else ws.part, ws.topk_ids, ws.topk_w,
        ws.pair_w, ws.counts, ws.pairs, nxt, ws.ss, eps, x, norm_w if norm_w is not None else x, no, x.stride(0),
        no.stride(0), ws.active, NACT_IDX=E1, E=E, T_PAD=ws.T_PAD, TOPK=top_k, N_GROUP=n_group,
        TOPK_GROUP=topk_group, SPLIT_K=split, SCALE=float(scaling), RENORM=bool(renormalize),
        HAS_BIAS=expert_bias is not None, MAXC=ws.T_PAD, ZERO_NEXT=slot is not None,
        NORM=norm_w is not None, H=H, WRITE_NORMED=norm_out is not None, BLOCK_H=next_pow2(H),
        num_warps=ac["num_warps"],
        **pdl(),
    )


def moe_align(ids, weights, ws: MoEWorkspace):
    """Alignment of a given routing decision (ids [T, K] int, weights [T, K] fp32) into ``ws`` (row 0)."""
    T, K = ids.shape
    ws.slot = 0
    ws.counts_all[0, : ws.E].zero_()
    ws.counts_all[0, ws.E1:].zero_()
    _align_kernel[(T,)](ids.contiguous(), weights.contiguous(), ws.pair_w, ws.counts, ws.pairs, ws.active, TOPK=K,
                        MAXC=ws.T_PAD, NACT_IDX=ws.E1, num_warps=1, **pdl())


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


def logits_stats(logits, part, pred, conf, entropy, nchunk=16, block_v=1024, num_warps=4):
    """Decode statistics of logits [T, V] (bf16/fp32) in fp32, two kernels, no host sync.

    part [T, nchunk, 4] fp32 scratch; pred [T] int64 argmax (first on ties); conf [T] fp32 max softmax
    probability; entropy [T] fp32 in nats. Reference: :func:`logits_stats_reference`.
    """
    T, V = logits.shape
    _logits_partial_stats_kernel[(T, nchunk)](logits, part, V, logits.stride(0), NCHUNK=nchunk, BLOCK_V=block_v,
                                              num_warps=num_warps, **pdl())
    _logits_stats_combine_kernel[(T,)](part, pred, conf, entropy, NCHUNK=nchunk, num_warps=1, **pdl())


def logits_stats_reference(logits):
    """(pred int64, conf fp32, entropy fp32) of logits [T, V] computed in fp32 with torch."""
    lf = logits.float()
    lp = torch.log_softmax(lf, -1)
    return lf.argmax(-1), lp.max(-1).values.exp(), -(lp.exp() * lp).sum(-1)


def moe_gate_up(x, w13, ws: MoEWorkspace, top_k, configs=None, norm_w=None, eps=1e-6):
    """Kernel 3: grouped gate+up GEMM with SiLU·mul·routing weight fused -> ``ws.inter`` [P1, N].

    norm_w [H]: x is the un-normalised residual and RMSNorm(x)·norm_w is folded into the GEMM.
    """
    T, H = x.shape
    E1, twoN, _ = w13.shape
    N = twoN // 2
    assert w13.is_contiguous() and x.stride(1) == 1
    gc = _cfg("gate_up", configs, H, N, E1, T)
    bn, bk = min(gc["BLOCK_N"], N), min(gc["BLOCK_K"], H)
    sh = int(ws.E1 == ws.E + 1)
    grid = ((N // bn, E1, triton.cdiv(ws.T_PAD, gc["BLOCK_M"])) if ws.compact
            else (E1, N // bn, triton.cdiv(ws.T_PAD, gc["BLOCK_M"])))
    _moe_gate_up_kernel[grid](
        x, w13, ws.counts, ws.pairs, ws.pair_w, ws.inter, norm_w if norm_w is not None else x, eps, T,
        x.stride(0), H=H, N=N, TOPK=top_k, MAXC=ws.T_PAD, BLOCK_M=gc["BLOCK_M"], BLOCK_N=bn, BLOCK_K=bk,
        NORM=norm_w is not None, ACTIVE=ws.compact, active_ptr=ws.active, NACT_IDX=ws.E1, SH=sh, E_SH=ws.E,
        num_warps=gc["num_warps"], num_stages=gc["num_stages"], **pdl(),
    )


def moe_down(w2, ws: MoEWorkspace, configs=None):
    """Kernel 4: grouped down GEMM ``ws.pair_out[p] = ws.inter[p]·w2[e]ᵀ`` (fp32)."""
    E1, H, N = w2.shape
    T = ws.T
    assert w2.is_contiguous() and ws.inter.shape[1] == N
    dc = _cfg("down", configs, H, N, E1, T)
    bn, bk = min(dc["BLOCK_N"], H), min(dc["BLOCK_K"], N)
    sh = int(ws.E1 == ws.E + 1)
    grid = ((H // bn, E1, triton.cdiv(ws.T_PAD, dc["BLOCK_M"])) if ws.compact
            else (E1, H // bn, triton.cdiv(ws.T_PAD, dc["BLOCK_M"])))
    _moe_down_kernel[grid](
        ws.inter, w2, ws.counts, ws.pairs, ws.pair_out, H=H, N=N, MAXC=ws.T_PAD,
        BLOCK_M=dc["BLOCK_M"], BLOCK_N=bn, BLOCK_K=bk, ACTIVE=ws.compact, active_ptr=ws.active,
        NACT_IDX=ws.E1, SH=sh, E_SH=ws.E,
        num_warps=dc["num_warps"], num_stages=dc["num_stages"], **pdl(),
    )


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


# --------------------------------------------------------------------------------------------------
# Adapter for the engine model's MoE seam (repro/engine/layers/moe.py)
# --------------------------------------------------------------------------------------------------

_SEAM_WS: dict = {}


def moe_forward_triton(x, w_gate_up, w_down, weights, ids):
    """Contract of ``repro.engine.layers.moe.moe_forward_torch`` (routed experts only, no shared expert).

    x [n, D] model dtype; w_gate_up [E, 2I, D]; w_down [E, D, I]; weights [n, k] fp32; ids [n, k] int64.
    Returns [n, D] in x.dtype. Uses the Triton alignment + grouped GEMMs for n <= 128 on CUDA (or under
    the interpreter); otherwise falls back to the torch implementation of the seam.
    """
    from ._triton import kernels_usable

    n, D = x.shape
    E, twoI, _ = w_gate_up.shape
    k = ids.shape[1]
    if n > 128 or k & (k - 1) or not kernels_usable(x) or not w_gate_up.is_contiguous() or not w_down.is_contiguous():
        from repro.engine.layers.moe import moe_forward_torch

        return moe_forward_torch(x, w_gate_up, w_down, weights, ids)
    key = (n, D, twoI // 2, E, k, x.dtype, str(x.device))
    ws = _SEAM_WS.get(key)
    if ws is None:
        ws = _SEAM_WS[key] = MoEWorkspace(n, D, twoI // 2, E, E, k, x.dtype, x.device, split_k=1)
    x = x.contiguous()
    moe_align(ids, weights.float(), ws)
    moe_experts(x, w_gate_up, w_down, ws, k)
    return moe_sum(ws, E, E, k).clone()


def register_with_seam(select: bool = True) -> None:
    """Register :func:`moe_forward_triton` as MoE impl "triton" in the engine seam (and select it)."""
    from repro.engine.layers import moe as seam

    seam.register_moe_impl("triton", moe_forward_triton)
    if select:
        seam.set_moe_impl("triton")
