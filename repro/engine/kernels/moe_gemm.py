"""The grouped expert GEMMs of the fused MoE (gate+up with SiLU·mul·routing weight fused, and down), beside their
torch reference :func:`expert_gemms_reference`; the MoE block around them (routing, the top-k sum, the engine seam)
is :mod:`.moe`, the 4-bit weight tiles :mod:`.moe_w4`.

Contract (kernel layout of :mod:`.moe`: ``w13`` [E1, 2N, H], ``w2`` [E1, H, N] in the activation dtype, or both
:class:`~repro.checkpoint.nvfp4.NVFP4Experts` with the shared expert in ``.shared``; the routing already aligned in
a :class:`~.route.MoEWorkspace` ``ws``: ``counts`` [E1 (+1)], ``pairs`` [E1, T_PAD], ``pair_w`` [P1] fp32):

* :func:`moe_gate_up`: ``ws.inter[p]`` [P1, N] (activation dtype) = silu(x[t]·w13[e, :N]ᵀ) · (x[t]·w13[e, N:]ᵀ) ·
  pair_w[p] for every pair p = (token t, expert e), fp32 accumulation (optionally RMSNorm(x)·norm_w folded in);
* :func:`moe_down`: ``ws.pair_out[p]`` [P1, H] = inter[p]·w2[e]ᵀ, fp32 accumulation, stored in pair_out's dtype
  (:class:`~.route.MoEWorkspace`: the activation dtype by default);
* :func:`linear_rows`: the down kernel as a skinny GEMM over one "expert" (the QKV / O projections, variant).

Both kernels start with one shared prologue, ``_expert_slot`` (which expert, output tile and token rows a program
owns, over the grid (E1, n-tiles, m-blocks), the compact active-expert list or a tile table; idle programs exit after
one or two scalar loads), and run one K loop per program: BF16 tiles, or the packed 4-bit tiles of
:mod:`.moe_w4` (``W4``; the shared expert's 16-bit branch taken per program). BF16 weight tiles come in by
pointer loads, or with the tile key ``TMA`` by tensor descriptor (:func:`_weight_descriptor`; the same tiles,
dots and K order, so the same results). All on device, no host sync, static
shapes: CUDA-graph capturable. Errors: ValueError for 4-bit experts that do not fit the workspace, the tiles or
the decode, for the RMSNorm fold with 4-bit experts, and for a BLOCK_M other than the tile table's.

Source: the grouped GEMM over per-expert token lists follows the idea of vLLM/SGLang ``fused_moe_kernel``
(own code).
"""
from __future__ import annotations

import torch

from ._triton import HAS_TRITON, compiled, gdc_launch_dependents, gdc_wait, pdl, tl, triton
from .moe_w4 import check_w4_tiles, derived_tables_ok, pick_decode
from .route import MoEWorkspace, _cfg

__all__ = ["moe_gate_up", "moe_down", "linear_rows", "expert_slots", "expert_gemms_reference", "experts_derived_ok"]


def expert_gemms_reference(x, w13, w2, ids, weights):
    """fp32 torch reference of the two grouped GEMMs for explicit pairs: x [T, H]; w13 [E1, 2N, H], w2 [E1, H, N]
    (tensors, or NVFP4Experts: dequantized, shared expert appended as index E); ids [T, k] int64 expert per pair,
    weights [T, k] (routing weights; 1 for the shared expert). Returns ``(inter [T, k, N], pair_out [T, k, H])``
    fp32, with inter rounded to x's dtype first as the kernel stores it (pair_out = that inter · w2[e]ᵀ, in fp32:
    round it to the workspace's ``pair_dtype`` to compare with ``ws.pair_out``)."""
    from repro.checkpoint.nvfp4 import NVFP4Experts

    def dense(w):
        if not isinstance(w, NVFP4Experts):
            return w.float()
        d = w.dequantize().float()
        return d if w.shared is None else torch.cat([d, w.shared[None].float()], 0)

    a, b = dense(w13), dense(w2)
    N = a.shape[1] // 2
    h = torch.einsum("th,tknh->tkn", x.float(), a[ids])  # [T, k, 2N]
    inter = (torch.nn.functional.silu(h[..., :N]) * h[..., N:] * weights.float()[..., None]).to(x.dtype).float()
    return inter, torch.einsum("tkn,tkhn->tkh", inter, b[ids])


# --------------------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------------------

if HAS_TRITON:
    from .moe_w4 import _w4_down_acc, _w4_gate_up_acc

    @triton.jit
    def _expert_slot(counts_ptr, active_ptr, pairs_ptr, BLOCK_M: tl.constexpr, MAXC: tl.constexpr,
                     ACTIVE: tl.constexpr, NACT_IDX: tl.constexpr, SH: tl.constexpr, E_SH: tl.constexpr,
                     TILES: tl.constexpr = False, tiles_ptr=None, USE_PDL: tl.constexpr = False):
        """Prologue shared by the grouped expert GEMMs: which expert, output tile and token rows this program owns
        (first, with USE_PDL, the programmatic-dependent-launch handshake: nothing before it reads a tensor).

        Grid (E1, n-tiles, m-blocks), or with ACTIVE (n-tiles, SH + E, m-blocks) over the active list
        (slot 0 = the shared expert E_SH when SH = 1, then ``active[:counts[NACT_IDX]]``), or with TILES
        (tiles, n-tiles, 1) over the tile table of :func:`.route.moe_tiles` (tile j = (expert, m-block) or (-1, 0)).
        Returns (e, pid_n, offs_m [BLOCK_M], mmask [BLOCK_M], p [BLOCK_M] pair indices, idle): ``idle`` is
        True for a program with no rows (an untouched expert, an m-block past its count, a slot past the
        active list); the caller returns at once then. Pair rows past the count are masked (p = 0).
        """
        if USE_PDL:
            gdc_launch_dependents()
            gdc_wait()
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
                     BLOCK_K: tl.constexpr, NORM: tl.constexpr, W4: tl.constexpr, DECODE: tl.constexpr = 1,
                     TMA: tl.constexpr = False, w_row=0, SWAP: tl.constexpr = False):
        """(gate, up) fp32 accumulators [BLOCK_M, BLOCK_N] of the token rows ``tok`` against output rows
        ``offs_n`` of one expert, and Σx² per row (NORM). W4: expert e of the packed (q, s, g) stacks
        (:mod:`.moe_w4`); TMA: ``w_ptr`` is a tensor descriptor over all experts' rows ([E1·2N, H], block
        [BLOCK_N, BLOCK_K]) and the gate rows start at ``w_row`` (the up rows N further); else the weight rows at
        ``w_ptr`` ([2N, H], gate rows then up rows). TMA or not, the same tiles, dots and K order."""
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        ssv = tl.zeros((BLOCK_M,), dtype=tl.float32)
        if W4:
            acc_g, acc_u = _w4_gate_up_acc(x_ptr, tok, stride_xt, mmask, q_ptr, s_ptr, g_ptr, e, offs_n, H, N,
                                           BLOCK_M, BLOCK_N, BLOCK_K, DECODE, SWAP)
        else:
            offs_k = tl.arange(0, BLOCK_K)
            x_ptrs = x_ptr + tok[:, None] * stride_xt + offs_k[None, :]
            if not TMA:
                wg_ptrs = w_ptr + offs_n[None, :] * H + offs_k[:, None]
                wu_ptrs = wg_ptrs + N * H
            for k0 in range(0, H, BLOCK_K):
                a = tl.load(x_ptrs + k0, mask=mmask[:, None], other=0.0)
                if NORM:  # RMSNorm folded in: dot with h·nw, rows scaled by rsqrt(mean h² + eps) after the loop
                    af = a.to(tl.float32)
                    ssv += tl.sum(af * af, axis=1)
                    a = (af * tl.load(nw_ptr + k0 + offs_k).to(tl.float32)[None, :]).to(a.dtype)
                if TMA:  # [BLOCK_N, BLOCK_K] tiles by the copy engine, used transposed
                    wg = w_ptr.load([w_row, k0]).T
                    wu = w_ptr.load([w_row + N, k0]).T
                else:
                    wg = tl.load(wg_ptrs + k0, eviction_policy="evict_first")  # streamed once: keep L2 for others
                    wu = tl.load(wu_ptrs + k0, eviction_policy="evict_first")
                acc_g = tl.dot(a, wg, acc_g)
                acc_u = tl.dot(a, wu, acc_u)
        return acc_g, acc_u, ssv

    @triton.jit
    def _down_acc(inter_ptr, p, mmask, w_ptr, q_ptr, s_ptr, g_ptr, e, offs_n, H: tl.constexpr, N: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, W4: tl.constexpr,
                  DECODE: tl.constexpr = 1, TMA: tl.constexpr = False, w_row=0, SWAP: tl.constexpr = False):
        """fp32 [BLOCK_M, BLOCK_N] = inter[p] · W[offs_n]ᵀ for one expert; W4: packed expert e; TMA: ``w_ptr`` a
        tensor descriptor over all experts' rows ([E1·H, N], block [BLOCK_N, BLOCK_K]), this tile's rows from
        ``w_row``; else rows at ``w_ptr`` ([H, N])."""
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if W4:
            acc = _w4_down_acc(inter_ptr, p, mmask, q_ptr, s_ptr, g_ptr, e, offs_n, H, N, BLOCK_M, BLOCK_N, BLOCK_K,
                               DECODE, SWAP)
        else:
            offs_k = tl.arange(0, BLOCK_K)
            a_ptrs = inter_ptr + p[:, None] * N + offs_k[None, :]
            if not TMA:
                w_ptrs = w_ptr + offs_n[None, :] * N + offs_k[:, None]
            for k0 in range(0, N, BLOCK_K):
                a = tl.load(a_ptrs + k0, mask=mmask[:, None], other=0.0)
                if TMA:
                    w = w_ptr.load([w_row, k0]).T
                else:
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
        TILES: tl.constexpr = False, tiles_ptr=None, TMA: tl.constexpr = False, W4_SWAP: tl.constexpr = False,
    ):
        """inter[p, n] = silu(x[t]·w13[e, n]) * (x[t]·w13[e, N+n]) * pair_w[p] for the pairs p=(t,e).

        W4: routed experts from the packed NVFP4 stacks (q, s, g), the shared expert E_SH from ``w13_ptr``
        ([2N, H], activation dtype). TMA (BF16 experts): ``w13_ptr`` is a tensor descriptor over [E1·2N, H]."""
        e, pid_n, offs_m, mmask, p, idle = _expert_slot(counts_ptr, active_ptr, pairs_ptr, BLOCK_M, MAXC, ACTIVE,
                                                        NACT_IDX, SH, E_SH, TILES, tiles_ptr, USE_PDL)
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
                                                 offs_n, nw_ptr, H, N, BLOCK_M, BLOCK_N, BLOCK_K, NORM, True, W4_DECODE,
                                                 SWAP=W4_SWAP)
        elif TMA:
            acc_g, acc_u, ssv = _gate_up_acc(x_ptr, tok, stride_xt, mmask, w13_ptr, q_ptr, s_ptr, g_ptr, e, offs_n,
                                             nw_ptr, H, N, BLOCK_M, BLOCK_N, BLOCK_K, NORM, False, 1, True,
                                             e * (2 * N) + pid_n * BLOCK_N)
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
        TILES: tl.constexpr = False, tiles_ptr=None, TMA: tl.constexpr = False, W4_SWAP: tl.constexpr = False,
    ):
        """pair_out[p, h] = Σ_n inter[p, n] * w2[e, h, n] (fp32 sum, stored in out's dtype) for the pairs p of
        expert e (W4: as gate+up; TMA: ``w2_ptr`` a tensor descriptor over [E1·H, N])."""
        e, pid_n, offs_m, mmask, p, idle = _expert_slot(counts_ptr, active_ptr, pairs_ptr, BLOCK_M, MAXC, ACTIVE,
                                                        NACT_IDX, SH, E_SH, TILES, tiles_ptr, USE_PDL)
        if idle:
            return
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        if W4:
            if e == E_SH:
                acc = _down_acc(inter_ptr, p, mmask, w2_ptr, q_ptr, s_ptr, g_ptr, e, offs_n, H, N, BLOCK_M, BLOCK_N,
                                BLOCK_K, False)
            else:
                acc = _down_acc(inter_ptr, p, mmask, w2_ptr, q_ptr, s_ptr, g_ptr, e, offs_n, H, N, BLOCK_M, BLOCK_N,
                                BLOCK_K, True, W4_DECODE, SWAP=W4_SWAP)
        elif TMA:
            acc = _down_acc(inter_ptr, p, mmask, w2_ptr, q_ptr, s_ptr, g_ptr, e, offs_n, H, N, BLOCK_M, BLOCK_N,
                            BLOCK_K, False, 1, True, e * H + pid_n * BLOCK_N)
        else:
            acc = _down_acc(inter_ptr, p, mmask, w2_ptr + e.to(tl.int64) * (H * N), q_ptr, s_ptr, g_ptr, e, offs_n,
                            H, N, BLOCK_M, BLOCK_N, BLOCK_K, False)
        tl.store(out_ptr + p[:, None] * H + offs_n[None, :], acc.to(out_ptr.dtype.element_ty), mask=mmask[:, None])


# --------------------------------------------------------------------------------------------------
# Host wrappers
# --------------------------------------------------------------------------------------------------


def expert_slots(w) -> int:
    """E1 of stacked expert weights: ``w.shape[0]`` of a tensor [E1, out, in]; for NVFP4Experts the routed
    experts plus the shared expert when attached."""
    return w.shape[0] + int(getattr(w, "shared", None) is not None)


def w4_decode_tile(block_k: int, tile: tuple[int, int], in_f: int, out_f: int, parts: int) -> tuple[int, int, int]:
    """(BLOCK_K, packed columns, num_warps) of one K step's packed tile, the tile ``moe_w4.pick_decode`` sizes a
    thread's bytes by. ``tile`` = (BLOCK_N, num_warps); gate+up (``parts`` 2) interleaves its gate and up rows
    into one tile of 2·BLOCK_N columns (``moe_w4._w4_gate_up_acc``), down (``parts`` 1) reads BLOCK_N; both
    clamped to the weight's ``out_f`` rows (2N for gate+up), BLOCK_K to ``in_f``."""
    return min(block_k, in_f), min(parts * tile[0], out_f), tile[1]


def experts_derived_ok(w) -> bool | None:
    """Whether the derived-table decode (``W4_DECODE`` 4) is exact for the global scales of
    :class:`~repro.checkpoint.nvfp4.NVFP4Experts` ``w`` (:func:`repro.engine.kernels.moe_w4.derived_tables_ok`),
    cached on ``w`` per version of ``w.g`` (a changed ``g`` is checked again; the copies ``with_shared`` makes keep
    the cache); None when it is not known and cannot be read now (first asked inside CUDA-graph capture, where
    reading ``g`` would sync: the kernels then take decode 3). Kept here, not on the format's class: the checkpoint
    format knows nothing of the kernels."""
    key = (w.g.data_ptr(), w.g._version)
    hit = w.__dict__.get("_derived_ok")
    if hit is not None and hit[0] == key:
        return hit[1]
    if w.g.is_cuda and torch.cuda.is_current_stream_capturing():
        return None
    ok = derived_tables_ok(w.g)
    w._derived_ok = (key, ok)
    return ok


def _expert_operand(w, ws: MoEWorkspace, kernel: str, block_k: int, decode: int | None = None,
                    tile: tuple[int, int] = (64, 4), parts: int = 1, swap: bool = False):
    """(E1, out, in, weight argument, W4 launch kwargs) of stacked expert weights ``w``: a tensor [E1, out, in]
    in the activation dtype, or a :class:`~repro.checkpoint.nvfp4.NVFP4Experts` (routed experts packed, the
    shared expert in ``.shared``). ``decode``: the 4-bit decode (``moe_w4.pick_decode``; None = the default
    for the experts' layout and the tile, ``tile`` = (BLOCK_N, num_warps)). Raises ValueError when the packed
    stack does not fit the workspace, the tiles, the decode or the kernel's global scales per expert (``parts``:
    gate+up 2, down 1). ``swap`` (tile key ``W4_SWAP``): the weights as the MMA's operand A
    (``moe_w4._w4_dot_swap``; decodes 5 / 6, layout "hop" only, else ValueError)."""
    from repro.checkpoint.nvfp4 import NVFP4Experts

    if not isinstance(w, NVFP4Experts):
        assert w.is_contiguous()
        return (*w.shape, w, {})
    E, out_f, in_f = w.shape
    E1 = E + (w.shared is not None)
    if E != ws.E or E1 != ws.E1:
        raise ValueError(f"{kernel}: NVFP4 experts for E={E} (shared: {w.shared is not None}), workspace for "
                         f"E={ws.E}, E1={ws.E1}")
    if w.parts != parts:
        raise ValueError(f"{kernel}: NVFP4 experts with {w.parts} global scale(s) per expert, the kernel reads "
                         f"{parts} (gate+up: gate and up; down: one; build them with NVFP4Experts(..., parts={parts}))")
    check_w4_tiles(min(block_k, in_f), in_f)
    decode = pick_decode(w.layout, ws.inter, decode, kernel, w4_decode_tile(block_k, tile, in_f, out_f, parts),
                         experts_derived_ok(w) if w.layout == "lut" and compiled(ws.inter) else None)
    # the shared expert's rows (never read without one: then any tensor of the activation dtype will do)
    dense = w.shared.contiguous() if w.shared is not None else ws.inter
    if swap and decode < 5:
        raise ValueError(f"{kernel}: the tile key W4_SWAP needs experts in layout 'hop' (W4_DECODE 5 / 6), these "
                         f"decode with {decode} (convert with NVFP4Experts.with_layout('hop'), or drop W4_SWAP)")
    return E1, out_f, in_f, dense, dict(W4=True, q_ptr=w.q, s_ptr=w.s, g_ptr=w.g, W4_DECODE=decode,
                                        **(dict(W4_SWAP=True) if swap else {}))


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
                                             (gc["BLOCK_N"], gc.get("num_warps", 4)), parts=2,
                                             swap=bool(gc.get("W4_SWAP")))
    N = twoN // 2
    if w4 and norm_w is not None:
        raise ValueError("moe_gate_up: the RMSNorm fold (norm_w) is not implemented for 4-bit experts")
    assert x.stride(1) == 1
    grid, w_arg, kw = _launch(ws, E1, gc, N, H, w_arg, w4, "moe_gate_up")
    _moe_gate_up_kernel[grid](
        x, w_arg, ws.counts, ws.pairs, ws.pair_w, ws.inter, norm_w if norm_w is not None else x, eps, T,
        x.stride(0), H=H, N=N, TOPK=top_k, MAXC=ws.T_PAD, NORM=norm_w is not None, **kw)


def moe_down(w2, ws: MoEWorkspace, configs=None):
    """Kernel 4: grouped down GEMM ``ws.pair_out[p] = ws.inter[p]·w2[e]ᵀ`` (fp32 sums, stored in pair_out's dtype);
    w2 [E1, H, N] or NVFP4Experts [E, H, N] (+ shared), as in :func:`moe_gate_up`."""
    T = ws.T
    dc = _cfg("down", configs, w2.shape[1], w2.shape[2], ws.E1, T)
    E1, H, N, w_arg, w4 = _expert_operand(w2, ws, "moe_down", dc["BLOCK_K"], dc.get("W4_DECODE"),
                                          (dc["BLOCK_N"], dc.get("num_warps", 4)), swap=bool(dc.get("W4_SWAP")))
    assert ws.inter.shape[1] == N
    grid, w_arg, kw = _launch(ws, E1, dc, H, N, w_arg, w4, "moe_down")
    _moe_down_kernel[grid](ws.inter, w_arg, ws.counts, ws.pairs, ws.pair_out, H=H, N=N, MAXC=ws.T_PAD, **kw)


def tma_available() -> bool:
    """True when this Triton has host tensor descriptors (``triton.tools.tensor_descriptor``, triton >= 3.4), which
    the ``TMA`` tile key needs."""
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: F401
    except Exception:  # noqa: BLE001 - older triton, or none
        return False
    return True


def _weight_descriptor(w, block: tuple[int, int], kernel: str):
    """Host tensor descriptor (TMA) over stacked weights ``w`` [E1, out, in] (contiguous) viewed as [E1·out, in], or a
    2-D operand [rows, in] with unit stride along ``in`` (``fastpath_batch.rows_linear``'s weights and x), block
    ``block`` (rows, BLOCK_K): the ``TMA`` tile key of the GEMMs. Rows past the end read as zeros. Raises ValueError
    when the start or the row stride is not 16-byte aligned or ``in`` is not a multiple of BLOCK_K (a TMA tile never
    crosses a row)."""
    if not tma_available():
        raise RuntimeError(f"{kernel}: the TMA tile key needs triton >= 3.4 (triton.tools.tensor_descriptor); "
                           f"upgrade triton or drop the key")
    from triton.tools.tensor_descriptor import TensorDescriptor

    w2d = w.reshape(-1, w.shape[-1]) if w.dim() == 3 else w
    if (w.stride(-1) != 1 or (w.dim() == 3 and not w.is_contiguous()) or w.data_ptr() % 16 or w.shape[-1] % block[1]
            or any((st * w.element_size()) % 16 for st in w2d.stride()[:-1])):
        raise ValueError(f"{kernel}: TMA needs contiguous rows, 16-byte aligned (start and row stride), a multiple "
                         f"of BLOCK_K={block[1]} long (got {tuple(w.shape)}, strides {tuple(w.stride())}, {w.dtype}); "
                         f"drop the TMA tile key")
    return TensorDescriptor.from_tensor(w2d, list(block))


def _launch(ws: MoEWorkspace, E1: int, cfg: dict, n_out: int, k_in: int, w_arg, w4: dict, kernel: str):
    """``(grid, weight argument, launch kwargs)`` of a grouped expert GEMM with tiles ``cfg`` over ``n_out``
    output columns and ``k_in`` reduction length: BLOCK_N / BLOCK_K capped at them, the grid of
    :func:`_launch_grid`, the active-list / shared-expert / 4-bit (``w4``) / PDL arguments, and with the tile key
    ``TMA`` (BF16 experts) the weights as a tensor descriptor (:func:`_weight_descriptor`)."""
    bn, bk = min(cfg["BLOCK_N"], n_out), min(cfg["BLOCK_K"], k_in)
    grid, tiles = _launch_grid(ws, E1, cfg["BLOCK_M"], n_out // bn, kernel)
    if cfg.get("TMA") and not w4:
        w_arg, tiles = _weight_descriptor(w_arg, (bn, bk), kernel), dict(tiles, TMA=True)
    return grid, w_arg, dict(BLOCK_M=cfg["BLOCK_M"], BLOCK_N=bn, BLOCK_K=bk, ACTIVE=ws.compact, active_ptr=ws.active,
                             NACT_IDX=ws.E1, SH=int(ws.E1 == ws.E + 1), E_SH=ws.E, num_warps=cfg["num_warps"],
                             num_stages=cfg["num_stages"], **w4, **tiles, **pdl())


def _launch_grid(ws: MoEWorkspace, E1: int, block_m: int, n_tiles: int, kernel: str) -> tuple[tuple, dict]:
    """``(grid, kwargs)`` of a grouped expert GEMM launch: over the tile table when ``ws`` has one
    (:func:`moe_tiles`: (tiles, n-tiles, 1), kwargs TILES + tiles_ptr), else over (expert slot, n-tile, m-block)
    — n-tile first when ``ws.compact``. Raises ValueError when the kernel's BLOCK_M differs from the table's."""
    m_blocks = triton.cdiv(ws.T_PAD, block_m)
    if ws.tiles is None:
        return ((n_tiles, E1, m_blocks) if ws.compact else (E1, n_tiles, m_blocks)), {}
    if block_m != ws.tiles_block_m:
        raise ValueError(f"{kernel}: BLOCK_M {block_m} but the tile table was built for {ws.tiles_block_m}")
    return (ws.tiles.shape[0], n_tiles, 1), dict(TILES=True, tiles_ptr=ws.tiles)


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
