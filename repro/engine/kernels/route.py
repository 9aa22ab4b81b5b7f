"""MoE routing and token-expert alignment for small token counts (T <= 128), beside its torch reference.

Routing (LLaDA2.1-mini; SGLang ``python/sglang/srt/layers/moe/topk.py`` ``biased_grouped_topk``): router
``logits = x·Wᵀ`` in fp32 (W [E, H] fp32), ``s = sigmoid(logits)``; selection on ``s + expert_bias`` with
group-limited top-k (E experts in ``n_group`` groups; group score = sum of the group's two largest biased
scores; keep ``topk_group`` groups, masked groups get -inf; top-``top_k`` experts among them); combine
weights = the *unbiased* ``s`` of the chosen experts, renormalised to sum 1 (``/(sum+1e-20)``) and
multiplied by ``routed_scaling_factor``, all fp32. Reference: :func:`route_reference`.

Kernels (on device, no host sync, static shapes: CUDA-graph capturable):

1. ``_router_logits_kernel``: split-K fp32 GEMM (IEEE or tf32x3 dots), partial logits [SPLIT_K, T_PAD, E]; a
   program takes ROWS token rows x BLOCK_E experts x H/SPLIT_K of K.
2. ``_route_select_kernel`` (one program per token): sums the partials in split order, sigmoid, bias,
   group-limited top-k (each step one int64 max over value/index keys), renormalisation x scale, then the
   token-expert alignment by relaxed atomics: for every expert e its
   count ``counts[e]`` and the list of pair indices ``pairs[e, :counts[e]]`` (order not fixed; each
   pair's result row is computed independently, so the output does not depend on it), and the list of
   touched experts ``active`` (``counts[E1]`` long). Pair index ``p = t*top_k + k`` for routed pairs,
   ``T*top_k + t`` for the shared expert. With the RMSNorm folded into the router (``norm_w``), it can
   also write the normalised rows that the expert GEMMs read (``norm_out``); with ``tile_block_m`` its last
   program (a ticket counter) also writes the tile table of kernel 4.
3. ``_align_kernel``: the alignment alone, for a routing decision made elsewhere (the engine seam).
4. ``_tile_table_kernel`` (:func:`moe_tiles`, optional): the (expert, m-block) tiles of the aligned pairs, over
   which the expert GEMMs then launch (many rows: the batched forward); ``moe_route_align(tile_block_m=)`` has
   the select kernel write the same table instead (measured slower on the H200: an option).

Exact ties (equal fp32 biased scores or group scores) go to the lower index, in the kernel and in
:func:`route_reference`. docs/perf_history.md "Session 5: router and route at batch 1 and many slots" has the
counts and timings behind the launch configs.

The buffers live in :class:`MoEWorkspace`; the expert GEMMs that consume them are in :mod:`.moe`.
Source of the alignment idea: vLLM/SGLang ``moe_align_block_size`` (own code: per-expert lists filled by
atomics instead of a padded sort, since T*top_k is tiny).
"""
from __future__ import annotations

import torch

from ._triton import HAS_TRITON, gdc_launch_dependents, gdc_wait, next_pow2, pdl, tl, triton  # noqa: F401
from .configs import load_config

__all__ = ["route_reference", "MoEWorkspace", "moe_route_align", "moe_align", "moe_tiles", "DEFAULT_CONFIGS"]


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
    """Group-limited sigmoid routing in fp32 (module doc).

    x [T, H] any float dtype; gate_w [E, H]; expert_bias [E] or None.
    Returns (topk_ids [T, top_k] int64, sorted by descending biased score, exact ties by ascending expert index
    (also for the group choice); topk_weights [T, top_k] fp32).
    """
    logits = x.float() @ gate_w.float().t()
    scores = torch.sigmoid(logits)
    biased = scores + (expert_bias.float() if expert_bias is not None else 0.0)
    T, E = biased.shape
    gs = E // n_group
    group_scores = biased.view(T, n_group, gs).topk(2, dim=-1).values.sum(-1)
    # stable descending sorts: exact ties go to the lower index (torch.topk leaves their order open), the rule of
    # the select kernel
    group_idx = group_scores.sort(dim=-1, descending=True, stable=True).indices[:, :topk_group]
    group_mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, group_idx, True)
    score_mask = group_mask.unsqueeze(-1).expand(T, n_group, gs).reshape(T, E)
    masked = biased.masked_fill(~score_mask, float("-inf"))
    topk_ids = masked.sort(dim=-1, descending=True, stable=True).indices[:, :top_k]
    w = scores.gather(1, topk_ids)
    if renormalize:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    return topk_ids, w * scaling



DEFAULT_CONFIGS = {
    # tiles for the bandwidth-streaming regime (M ~ 1-2 rows per expert); tuned values in configs/*.json
    "router": dict(BLOCK_E=16, SPLIT_K=8, BLOCK_K=64, num_warps=4, num_stages=2, PREC="ieee"),
    "route": dict(num_warps=4),
    # gate_up: 3 stages (82,944 B of shared memory in bf16); 4 took 110,592 B, more than the 99 KB a block gets on
    # sm_89 (L40S, RTX 4090) and sm_120 (RTX 5090): repro/engine/aot.py failed there
    "gate_up": dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=3),
    "down": dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=4),
    "sum": dict(BLOCK_H=512, num_warps=4),
}

if HAS_TRITON:

    @triton.jit
    def _append_pairs(counts_ptr, pairs_ptr, active_ptr, ids, p, m, MAXC: tl.constexpr, NACT_IDX: tl.constexpr,
                      ACTIVE: tl.constexpr = True):
        """Append the pairs ``p`` (int32, any shape, e.g. [TOPK] of one token or [ROWS, TOPK]) where ``m`` is True
        to their experts' lists ``pairs[ids, slot]`` (slot by atomics on ``counts[ids]``); with ACTIVE, an
        expert's first pair also appends it to ``active`` (length ``counts[NACT_IDX]``; a second atomic that waits
        for the first). Relaxed atomics: only atomicity is needed inside the launch (the consumers are later
        launches), so no acquire/release fence per atomic."""
        one = ids * 0 + 1
        slot = tl.atomic_add(counts_ptr + ids, one, mask=m, sem="relaxed")
        tl.store(pairs_ptr + ids * MAXC + slot, p, mask=m)
        if ACTIVE:
            first = (slot == 0) & m
            pos = tl.atomic_add(counts_ptr + NACT_IDX + 0 * ids, one, mask=first, sem="relaxed")
            tl.store(active_ptr + pos, ids, mask=first)

    @triton.jit
    def _rms_row(xv, nwv, eps, H: tl.constexpr):
        """(r, y) of one row xv [BLOCK_H] (masked tail 0; nwv the RMSNorm weight in fp32): r = rsqrt(Σx²/H + eps) in
        fp32 (one reduction over the row) and the normalised row y = (x·r).to(x.dtype)·w in fp32 (the numerics of
        ``norm.add_rmsnorm``); shared by the select kernel and :mod:`.route_fused`, so both give the same bits."""
        xf = xv.to(tl.float32)
        r = tl.rsqrt(tl.sum(xf * xf, axis=0) / H + eps)
        return r, (xf * r).to(xv.dtype).to(tl.float32) * nwv

    @triton.jit
    def _router_partial(x_ptr, w_ptr, nw_ptr, offs_t, T, stride_xt, pid_e, pid_k, H: tl.constexpr,
                        BLOCK_E: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_K: tl.constexpr, PREC: tl.constexpr,
                        NORM: tl.constexpr, WRITE_SS: tl.constexpr, ROWS: tl.constexpr, wpre=None,
                        PRE: tl.constexpr = False):
        """(acc [ROWS, BLOCK_E], ss [ROWS]) of one router program: Σ_{k in split pid_k} x[t, k]·(nw[k])·w[e, k] over
        the rows ``offs_t`` (>= T read as 0) and the experts of tile pid_e, fp32 dots in BLOCK_K steps (ascending),
        and with NORM and WRITE_SS the split's Σx² per row. Shared by ``_router_logits_kernel`` and
        :mod:`.route_fused` (the same code, so the same partial logits). PRE (one K step: H / SPLIT_K = BLOCK_K):
        the weight tile [BLOCK_K, BLOCK_E] is ``wpre``, loaded by the caller (e.g. before its PDL wait)."""
        offs_e = pid_e * BLOCK_E + tl.arange(0, BLOCK_E)
        offs_k = tl.arange(0, BLOCK_K)
        K_PER: tl.constexpr = H // SPLIT_K
        acc = tl.zeros((ROWS, BLOCK_E), dtype=tl.float32)
        ssv = tl.zeros((ROWS,), dtype=tl.float32)
        for k0 in range(0, K_PER, BLOCK_K):
            kk = pid_k * K_PER + k0 + offs_k
            xv = tl.load(x_ptr + offs_t[:, None] * stride_xt + kk[None, :],
                         mask=offs_t[:, None] < T, other=0.0).to(tl.float32)
            if NORM:
                if WRITE_SS:
                    ssv += tl.sum(xv * xv, axis=1)
                xv = xv * tl.load(nw_ptr + kk).to(tl.float32)[None, :]
            if PRE:
                wv = wpre
            else:
                wv = tl.load(w_ptr + offs_e[None, :] * H + kk[:, None]).to(tl.float32)
            acc = tl.dot(xv, wv, acc, input_precision=PREC)
        return acc, ssv

    @triton.jit
    def _desc_key(v, idx, N: tl.constexpr):
        """int64 keys of fp32 ``v`` with indices ``idx`` (int32, in [0, N)): key order = v descending, then idx
        ascending, so ``max(key)`` is the first argmax (``tl.argmax``'s tie rule) in one integer reduction. The
        fp32 bits are made monotone as signed integers (negative values: the 31 low bits flipped)."""
        b = v.to(tl.int32, bitcast=True)
        b = b ^ ((b >> 31) & 0x7FFFFFFF)
        return (b.to(tl.int64) << 32) | (N - 1 - idx).to(tl.int64)

    @triton.jit
    def _fill_tiles(counts_ptr, tiles_ptr, MAXT, E1: tl.constexpr, E1P: tl.constexpr, BLOCK_M: tl.constexpr):
        """The tile table of :func:`moe_tiles` written by one program: expert e's tiles are entries
        excl[e] .. excl[e] + cdiv(counts[e], BLOCK_M) - 1 (excl = exclusive prefix sum, experts ascending),
        entry excl[e] + b = (e, b); entries from the total up to MAXT get (-1, 0). Counts are read at L2
        (``.cg``): they were written by other programs' atomics."""
        offs = tl.arange(0, E1P)
        c = tl.load(counts_ptr + offs, mask=offs < E1, other=0, cache_modifier=".cg")
        nt = (c + BLOCK_M - 1) // BLOCK_M
        excl = tl.cumsum(nt, axis=0) - nt
        total = tl.sum(nt, axis=0)
        zero = tl.zeros((E1P,), dtype=tl.int32)
        for b in range(0, tl.max(nt, axis=0)):
            m = nt > b
            tl.store(tiles_ptr + 2 * (excl + b), offs, mask=m)
            tl.store(tiles_ptr + 2 * (excl + b) + 1, zero + b, mask=m)
        for j0 in range(0, MAXT, E1P):
            j = j0 + offs
            m = (j >= total) & (j < MAXT)
            tl.store(tiles_ptr + 2 * j, zero - 1, mask=m)
            tl.store(tiles_ptr + 2 * j + 1, zero, mask=m)

    @triton.jit
    def _router_logits_kernel(
        x_ptr, w_ptr, part_ptr, nw_ptr, ss_ptr, T, stride_xt,
        H: tl.constexpr, E: tl.constexpr, T_PAD: tl.constexpr,
        BLOCK_E: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_K: tl.constexpr, PREC: tl.constexpr,
        NORM: tl.constexpr = False, WRITE_SS: tl.constexpr = True, USE_PDL: tl.constexpr = False,
        ROWS: tl.constexpr = 16,
    ):
        """part[s, t, e] = Σ_{k in split s} x[t, k] * w[e, k] in fp32 (PREC "ieee" or "tf32x3"); rows t >= T are 0.

        Grid (E/BLOCK_E, SPLIT_K, cdiv(T_PAD, ROWS)): each program takes ROWS token rows (ROWS = T_PAD: one row
        block), so with a fixed ROWS a row's logits do not depend on how many rows there are (the MMA computes a
        row the same way at any position of its tile; rows >= T are zeros). Inside a split the K
        order is fixed (BLOCK_K steps, ascending); the select kernel adds the SPLIT_K partials in split order.

        NORM: x is the raw residual h; the kernel uses h·nw (RMSNorm weight) and, with WRITE_SS, also writes
        the split's Σh² to ss[s, t] (programs of the first expert tile), so the select kernel applies
        rsqrt(mean h² + eps) (without WRITE_SS the select kernel sums h² of its row itself).
        """
        if USE_PDL:
            gdc_launch_dependents()
            gdc_wait()
        pid_e = tl.program_id(0)
        pid_k = tl.program_id(1)
        offs_t = tl.program_id(2) * ROWS + tl.arange(0, ROWS)
        offs_e = pid_e * BLOCK_E + tl.arange(0, BLOCK_E)
        acc, ssv = _router_partial(x_ptr, w_ptr, nw_ptr, offs_t, T, stride_xt, pid_e, pid_k, H, BLOCK_E, SPLIT_K,
                                   BLOCK_K, PREC, NORM, WRITE_SS, ROWS)
        tm = offs_t < T_PAD  # ROWS > T_PAD: one program, rows past the buffer not stored
        tl.store(part_ptr + pid_k * (T_PAD * E) + offs_t[:, None] * E + offs_e[None, :], acc, mask=tm[:, None])
        if NORM and WRITE_SS:
            if pid_e == 0:
                tl.store(ss_ptr + pid_k * T_PAD + offs_t, ssv, mask=tm)

    @triton.jit
    def _route_select_kernel(
        part_ptr, bias_ptr, ids_ptr, topw_ptr, pairw_ptr, counts_ptr, pairs_ptr, next_counts_ptr, ss_ptr, eps,
        x_ptr, nw_ptr, normed_ptr, stride_xt, stride_nt,
        active_ptr, NACT_IDX: tl.constexpr, E: tl.constexpr, T_PAD: tl.constexpr, TOPK: tl.constexpr, N_GROUP: tl.constexpr,
        TOPK_GROUP: tl.constexpr, SPLIT_K: tl.constexpr, SCALE: tl.constexpr,
        RENORM: tl.constexpr, HAS_BIAS: tl.constexpr, MAXC: tl.constexpr, ZERO_NEXT: tl.constexpr,
        NORM: tl.constexpr = False, H: tl.constexpr = 1, WRITE_NORMED: tl.constexpr = False,
        BLOCK_H: tl.constexpr = 1, USE_PDL: tl.constexpr = False,
        TILES: tl.constexpr = False, ticket_ptr=None, tiles_ptr=None, T=1, MAXT=1, E1: tl.constexpr = 1,
        E1P: tl.constexpr = 1, TILE_M: tl.constexpr = 16, ACTIVE: tl.constexpr = True,
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
        Selection: every top-k step is one int64 max over :func:`_desc_key` keys (the value and, for ties, the
        lower index: the rule of ``tl.argmax`` and of the reference's first-index order); a group's second
        largest score is the largest after one occurrence of the largest is dropped.
        ACTIVE: also the list of touched experts (:func:`_append_pairs`).
        TILES: the program that takes the last ticket (``ticket[0]``, acquire/release: every other program's
        pairs are counted by then) writes the tile table of :func:`moe_tiles` for TILE_M-row tiles
        (:func:`_fill_tiles`; T programs, MAXT entries) and resets the ticket to 0 — no separate launch.
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
            r, y = _rms_row(xv, nwv, eps, H)
            logits = logits * r
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
        KEY_MIN: tl.constexpr = -(2139095041 << 32) - 1  # below the key of -inf (_desc_key) at any index
        g2 = tl.reshape(biased, (N_GROUP, GS))
        m1 = tl.max(g2, axis=1)
        is1 = g2 == m1[:, None]
        n1 = tl.sum(is1.to(tl.int32), axis=1)
        m2 = tl.where(n1 > 1, m1, tl.max(tl.where(is1, NEG, g2), axis=1))  # drop one occurrence of the largest
        gidx = tl.arange(0, N_GROUP)
        gkey = _desc_key(m1 + m2, gidx, N_GROUP)
        keep = tl.zeros((N_GROUP,), dtype=tl.int32)
        for _ in tl.static_range(TOPK_GROUP):
            gm = tl.max(gkey, axis=0)
            keep = tl.where(gkey == gm, 1, keep)
            gkey = tl.where(gkey == gm, KEY_MIN, gkey)
        keep2 = tl.reshape(tl.broadcast_to(keep[:, None], (N_GROUP, GS)), (E,))
        key = tl.where(keep2 != 0, _desc_key(biased, offs_e, E), KEY_MIN)
        kidx = tl.arange(0, TOPK)
        ids = tl.zeros((TOPK,), dtype=tl.int32)
        wts = tl.zeros((TOPK,), dtype=tl.float32)
        for i in tl.static_range(TOPK):
            km = tl.max(key, axis=0)
            a = (E - 1) - (km & (E - 1)).to(tl.int32)
            sel = offs_e == a
            wi = tl.sum(tl.where(sel, scores, 0.0), axis=0)
            key = tl.where(sel, KEY_MIN, key)
            ids = tl.where(kidx == i, a, ids)
            wts = tl.where(kidx == i, wi, wts)
        if RENORM:
            wts = wts / (tl.sum(wts, axis=0) + 1e-20)
        wts = wts * SCALE
        p = t * TOPK + kidx
        tl.store(ids_ptr + p, ids)
        tl.store(topw_ptr + p, wts)
        tl.store(pairw_ptr + p, wts)
        _append_pairs(counts_ptr, pairs_ptr, active_ptr, ids, p, kidx < TOPK, MAXC, NACT_IDX, ACTIVE)
        if ZERO_NEXT:
            if t == 0:
                tl.store(next_counts_ptr + offs_e, tl.zeros((E,), dtype=tl.int32))
                tl.store(next_counts_ptr + NACT_IDX, 0)
        if TILES:
            # every thread's count increments of this program happen before its ticket (the ticket's release
            # orders only the issuing thread's own writes): a CTA barrier first, the threadfence-reduction pattern
            tl.debug_barrier()
            if tl.atomic_add(ticket_ptr, 1, sem="acq_rel") == T - 1:
                _fill_tiles(counts_ptr, tiles_ptr, MAXT, E1, E1P, TILE_M)
                tl.atomic_xchg(ticket_ptr, 0)

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
        _append_pairs(counts_ptr, pairs_ptr, active_ptr, ids, p, kidx < TOPK, MAXC, NACT_IDX)

    @triton.jit
    def _tile_table_kernel(counts_ptr, tiles_ptr, MAXT, E1: tl.constexpr, E1P: tl.constexpr, BLOCK_M: tl.constexpr,
                           NT: tl.constexpr, USE_PDL: tl.constexpr = False):
        """Tiles j of this program: tile j = (expert e, m-block j - first tile of e), experts in ascending order,
        cdiv(counts[e], BLOCK_M) tiles each; tiles past the last one get (-1, 0)."""
        if USE_PDL:
            gdc_launch_dependents()
            gdc_wait()
        offs_e = tl.arange(0, E1P)
        nt = (tl.load(counts_ptr + offs_e, mask=offs_e < E1, other=0) + BLOCK_M - 1) // BLOCK_M
        incl = tl.cumsum(nt, axis=0)
        j = tl.program_id(0) * NT + tl.arange(0, NT)
        e = tl.sum((incl[None, :] <= j[:, None]).to(tl.int32), axis=1)  # experts whose tiles end at or before j
        m = j - tl.sum(tl.where(offs_e[None, :] == e[:, None], (incl - nt)[None, :], 0), axis=1)
        jm = j < MAXT
        tl.store(tiles_ptr + 2 * j, tl.where(e < E1, e, -1), mask=jm)
        tl.store(tiles_ptr + 2 * j + 1, tl.where(e < E1, m, 0), mask=jm)


class MoEWorkspace:
    """Preallocated buffers for one token count T (static addresses -> CUDA-graph capturable).

    part [SPLIT_K, T_PAD, E] fp32 (router partial logits); topk_ids [T, K] int32; topk_w [T, K] fp32;
    pair_w [P1] fp32; counts_all [n_slots, E1] int32 (one row per MoE layer in the fast path, so that each
    layer's select kernel can clear the next layer's row; ``counts`` is the row in use); pairs [E1, T_PAD]
    int32; inter [P1, N] dtype; pair_out [P1, H] ``pair_dtype`` (default: dtype); out [T, H] dtype, with P1 = T*K
    (+T with a shared expert); tiles [MAXT, 2] int32 once :func:`moe_tiles` or ``moe_route_align(tile_block_m=)``
    made it. The shared expert's row (index E) is constant: count T, pairs T*K + t, weight 1.

    The expert GEMMs accumulate in fp32 and store each pair's output rounded to ``pair_dtype``; the top-k sum
    (:func:`.moe.moe_sum`, :func:`.norm.add_rmsnorm`) adds the rows in fp32 and rounds once. In the activation
    dtype (the default) a pair row is rounded where the HF LLaDA2 code rounds it (each expert's down_proj output
    is bf16 there) and as vLLM/SGLang ``fused_moe`` store it (``intermediate_cache3`` in the activation dtype), at
    half the bytes of fp32: at 32 slots the down GEMM writes 9,216 rows of H = 2,048 a layer, 37.7 MB in bf16
    against 75.5 MB in fp32. ``pair_dtype=torch.float32`` keeps the fp32 sums (the tests that compare the GEMMs'
    arithmetic use it).
    """

    def __init__(self, T, H, N, E, E1, top_k, dtype, device, split_k=4, n_slots=1, pair_dtype=None):
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
        self.pair_out = torch.zeros(P1, H, dtype=pair_dtype or dtype, device=device)
        self.out = torch.zeros(T, H, dtype=dtype, device=device)
        self.slot = 0
        self.tiles = None  # tile table [MAXT, 2] of moe_tiles (expert GEMMs launched over it), BLOCK_M it is for
        self.tiles_block_m = None
        self.ticket = torch.zeros(1, **i32)  # select programs done (moe_route_align(tile_block_m=)); 0 between launches
        if E1 == E + 1:
            self.counts_all[:, E] = T
            self.pairs[E, :T] = torch.arange(T * top_k, T * top_k + T, device=device, dtype=torch.int32)
            self.pair_w[T * top_k:] = 1.0

    @classmethod
    def create(cls, T, H, N, E, E1, top_k, dtype, device, split_k=4, n_slots=1, pair_dtype=None):
        return cls(T, H, N, E, E1, top_k, dtype, device, split_k, n_slots, pair_dtype=pair_dtype)

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



def _router_tiles(x, gate_w, ws: MoEWorkspace, E1, n_group, top_k, configs, norm_w, norm_out, row_block, what):
    """Checks of :func:`moe_route_align`'s arguments and the router launch tiles (rc, SPLIT_K, BLOCK_E, BLOCK_K,
    rows per program); shared with :func:`.route_fused.moe_route_align_fused`, which must split the GEMM alike.
    Raises ValueError for norm_out without norm_w or of the wrong shape / stride, or a row_block that is not a
    power of two."""
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
    rows = int(row_block or rc.get("ROWS") or ws.T_PAD)
    if rows < 1 or rows & (rows - 1):
        raise ValueError(f"{what}: row_block {row_block} is not a power of two (router rows per program)")
    return rc, split, be, bk, rows


def _clear_counts(ws: MoEWorkspace, slot):
    """The counts row for this routing (``ws.slot``) and the row its kernel clears for the next MoE layer: slot None
    (standalone) uses row 0, cleared here by a memset (and returned as the "next" row, cleared again harmlessly);
    slot l uses row l and the kernel clears row (l + 1) % n_slots."""
    if slot is None:
        ws.slot = 0
        ws.counts_all[0, :ws.E].zero_()
        ws.counts_all[0, ws.E1:].zero_()
        return ws.counts_all[0]
    ws.slot = slot
    return ws.counts_all[(slot + 1) % ws.counts_all.shape[0]]


def moe_route_align(x, gate_w, expert_bias, ws: MoEWorkspace, E1, top_k=8, n_group=8, topk_group=4,
                    scaling=2.5, renormalize=True, configs=None, slot=None, norm_w=None, eps=1e-6, norm_out=None,
                    row_block=None, tile_block_m=None):
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
    row_block (a power of two; None: the router config's ``ROWS`` if it has one, else all rows in one program):
    the router GEMM takes this many token rows per program (one program when it exceeds ``ws.T_PAD``), so that a
    row's logits are computed by the same tile whatever T is (the batched forward's row invariance).
    The list of touched experts (``ws.active``, ``counts[E1]`` long) is written for a standalone call and when
    the expert GEMMs read it (``ws.compact``), not in the fast paths' per-layer calls (one dependent atomic less).
    tile_block_m (int or None): also write the tile table of :func:`moe_tiles` for this BLOCK_M (``ws.tiles``,
    allocated on the first call), from inside the select kernel (its last program) instead of a third launch.
    Raises ValueError for norm_out without norm_w, or not of x's shape with unit stride along H, or for a
    row_block that is not a power of two.
    """
    T, H = x.shape
    E = gate_w.shape[0]
    rc, split, be, bk, rows = _router_tiles(x, gate_w, ws, E1, n_group, top_k, configs, norm_w, norm_out, row_block,
                                            "moe_route_align")
    _router_logits_kernel[(E // be, split, triton.cdiv(ws.T_PAD, rows))](
        x, gate_w, ws.part, norm_w if norm_w is not None else gate_w, ws.ss, T, x.stride(0), H=H, E=E, T_PAD=ws.T_PAD, BLOCK_E=be, SPLIT_K=split,
        BLOCK_K=bk, PREC=rc.get("PREC", "ieee"), NORM=norm_w is not None, WRITE_SS=norm_out is None,
        ROWS=rows, num_warps=rc["num_warps"],
        num_stages=rc["num_stages"],
        **pdl(),
    )
    nxt = _clear_counts(ws, slot)
    ac = _cfg("route", configs, H, ws.inter.shape[1], E1, T)
    no = norm_out if norm_out is not None else x
    tiles = {}
    if tile_block_m is not None:
        table = _tile_buffer(ws, int(tile_block_m))
        tiles = dict(TILES=True, ticket_ptr=ws.ticket, tiles_ptr=table, T=T, MAXT=table.shape[0], E1=ws.E1,
                     E1P=next_pow2(ws.E1), TILE_M=int(tile_block_m))
    _route_select_kernel[(T,)](
        ws.part, expert_bias if expert_bias is not None else ws.part, ws.topk_ids, ws.topk_w,
        ws.pair_w, ws.counts, ws.pairs, nxt, ws.ss, eps, x, norm_w if norm_w is not None else x, no, x.stride(0),
        no.stride(0), ws.active, NACT_IDX=E1, E=E, T_PAD=ws.T_PAD, TOPK=top_k, N_GROUP=n_group,
        TOPK_GROUP=topk_group, SPLIT_K=split, SCALE=float(scaling), RENORM=bool(renormalize),
        HAS_BIAS=expert_bias is not None, MAXC=ws.T_PAD, ZERO_NEXT=slot is not None,
        NORM=norm_w is not None, H=H, WRITE_NORMED=norm_out is not None, BLOCK_H=next_pow2(H),
        ACTIVE=bool(ws.compact or slot is None), num_warps=ac["num_warps"], **tiles,
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


def _tile_buffer(ws: MoEWorkspace, block_m: int) -> torch.Tensor:
    """``ws.tiles`` [cdiv(P1, block_m) + E1, 2] int32 for ``block_m``, allocated when missing or made for another
    BLOCK_M (so never inside a graph capture once the forward has run)."""
    maxt = triton.cdiv(ws.pair_w.shape[0], block_m) + ws.E1
    if ws.tiles is None or ws.tiles.shape[0] != maxt or ws.tiles_block_m != block_m:
        ws.tiles = torch.zeros(maxt, 2, dtype=torch.int32, device=ws.pair_w.device)
        ws.tiles_block_m = block_m
    return ws.tiles


def moe_tiles(ws: MoEWorkspace, block_m: int, static: bool = False):
    """Give ``ws`` a tile table and fill it: the expert GEMMs then launch over (tiles, n-tiles) instead of
    (E1, n-tiles, cdiv(T_PAD, BLOCK_M)).

    Tile j = (expert e, m-block b): rows b·block_m .. of expert e's pair list, experts in ascending order,
    cdiv(counts[e], block_m) tiles each; ``ws.tiles`` [MAXT, 2] int32 with MAXT = cdiv(P1, block_m) + E1 (an
    upper bound on the tiles in use; the rest hold (-1, 0) and exit at once). The grid then grows with the pairs
    actually routed, not with E1 x (the most rows one expert could get): with T = 1024 rows (32 blocks) and
    BLOCK_M 16 that is 833 tiles instead of 257 x 64 programs per n-tile. A pair's row is computed by the same
    tile code either way (same BLOCK_M / N / K, fixed K order), so results do not change.
    ``static``: fill the table once now from the current counts (a workspace whose counts never change, e.g.
    the dense layer's); else one launch of ``_tile_table_kernel`` after every routing (no host sync, capturable;
    ``moe_route_align(tile_block_m=)`` writes the same table without that launch).
    """
    maxt = _tile_buffer(ws, block_m).shape[0]
    if static:
        c = ws.counts[: ws.E1].tolist()
        rows = [(e, b) for e in range(ws.E1) for b in range(-(-c[e] // block_m))]
        rows += [(-1, 0)] * (maxt - len(rows))
        ws.tiles.copy_(torch.tensor(rows, dtype=torch.int32))
        return ws.tiles
    nt = 16
    _tile_table_kernel[(triton.cdiv(maxt, nt),)](ws.counts, ws.tiles, maxt, E1=ws.E1, E1P=next_pow2(ws.E1),
                                                 BLOCK_M=block_m, NT=nt, num_warps=4, **pdl())
    return ws.tiles
