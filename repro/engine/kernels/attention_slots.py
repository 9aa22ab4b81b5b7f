"""Attention of S request blocks in one launch (the batched forward's slot axis), with results independent of S.

Same model facts and cache layout as :mod:`.attention` (docs/engine.md §2 "Attention"): caches [S, NKV, MAXLEN, D],
``cache_len`` [S] int32 (P_s), query rows ``s·T + t``; slot s's T queries attend to keys [0, P_s + T) of its own
cache; GQA group G = NQ / NKV; the G·T_PAD query rows of one KV head are processed together (BLOCK_M at a time).

**Fixed reduction order per slot.** The keys of slot s are cut into *chunks* whose layout depends on P_s alone
(:func:`chunk_layout`: ``n = min(NSPLIT, max(1, cdiv(P_s + T, MIN_KEYS)))`` pieces of ``per = BLOCK_N·cdiv(cdiv(P_s
+ T, n), BLOCK_N)`` keys, the same layout as :func:`.attention.block_attention`). Each chunk is an online softmax
over its BLOCK_N-key tiles started from the empty state (FlashAttention-2, Dao 2023, arXiv 2307.08691, Alg. 1),
and the chunk results are merged by a left fold in chunk order, ``(M, L, ACC) ⊕ (m, l, acc)`` with ``M' = max(M,
m)``, ``L = L·2^(M−M') + l·2^(m−M')``, ``ACC`` likewise (explicit fused multiply-adds, so the compiler cannot
contract them differently in the two kernels), and ``o = ACC / L``. Two launch modes compute exactly this:

* ``"split"`` (many programs; best when few slots fill the GPU): ``_slot_chunk_kernel``, grid (NKV, NSPLIT,
  S·row blocks), one program per chunk stores its (m, l, acc) in fp32; ``_slot_fold_kernel``, grid (NQ, S·T),
  folds the chunks of one (row, query head) in order.
* ``"whole"`` (one program per (slot, KV head, row block); best when many slots fill the GPU): ``_slot_whole_kernel``
  walks all of the slot's key tiles in one software-pipelined loop, restarts the chunk state at every chunk
  boundary after folding it into (M, L, ACC), and writes ``o``: no fp32 partials through memory (at P = 1024 and
  MIN_KEYS 64 those are 2× the K/V bytes, written and read back).

Both use the same tile step and fold code, tiles and warps, so a slot's output is bit-identical whichever mode
runs and whatever S is; the mode is chosen per launch from S (``whole_min_slots``). Measured choice and figures:
docs/perf_history.md "Session 5: attention at many slots".

``slot_qk_norm_rope_kv``: QK-norm + partial NeoX RoPE + K/V cache write as :func:`.attention.qk_norm_rope_kv`, but
one program per (block of ``rows`` query rows, head) instead of per (row, head) (S = 32, 8 rows: 3,072 programs
instead of 24,576); each row's arithmetic is the same whatever block it is in (``_norm_rope_rows``).

References: :func:`slot_attention_reference` (fp32 math, per slot), :func:`.attention.qk_norm_rope_reference`.
"""
from __future__ import annotations

import math

import torch

from . import attention as A
from ._triton import HAS_TRITON, gdc_launch_dependents, gdc_wait, pdl, tl, triton

__all__ = ["WHOLE_MIN_SLOTS", "QKN_ROWS", "chunk_layout", "slot_attention", "slot_attention_reference",
           "slot_qk_norm_rope_kv"]

#: "whole" mode from this many slots on (below: "split"); docs/perf_history.md "Session 5: attention at many slots"
WHOLE_MIN_SLOTS = 4
#: query rows per program of :func:`slot_qk_norm_rope_kv`
QKN_ROWS = 8


def chunk_layout(P: int, T: int, nsplit: int, min_keys: int, block_n: int) -> list[tuple[int, int]]:
    """Key ranges [start, end) of the chunks of a slot with prefix P and T block tokens, in fold order (host-side
    mirror of the kernels' ``_chunks``): n = min(nsplit, max(1, cdiv(P+T, min_keys))) pieces of ``per`` keys, per a
    multiple of block_n; empty pieces dropped. Depends on (P, T) and the constants only, never on S."""
    kv = P + T
    n = min(nsplit, max(1, -(-kv // min_keys)))
    per = -(-(-(-kv // n)) // block_n) * block_n
    return [(s, min(s + per, kv)) for s in range(0, kv, per)]


def slot_attention_reference(q, k_cache, v_cache, cache_len, scale=None):
    """fp32 reference: q [S·T, NQ, D], caches [S, NKV, MAXLEN, D], cache_len [S] -> o [S·T, NQ·D] fp32, slot s
    over keys [0, P_s + T) of its cache (:func:`.attention.attention_reference` per slot)."""
    S = k_cache.shape[0]
    T = q.shape[0] // S
    outs = []
    for s in range(S):
        L = int(cache_len[s]) + T
        outs.append(A.attention_reference(q[s * T:(s + 1) * T], k_cache[s, :, :L], v_cache[s, :, :L], scale))
    return torch.cat(outs)


if HAS_TRITON:

    @triton.jit
    def _chunks(P, T, NSPLIT: tl.constexpr, MIN_KEYS: tl.constexpr, BLOCK_N: tl.constexpr):
        """(kv_len, per, n): keys, chunk length (multiple of BLOCK_N), non-empty chunks (:func:`chunk_layout`)."""
        kv_len = P + T
        nsp = tl.minimum(tl.maximum(tl.cdiv(kv_len, MIN_KEYS), 1), NSPLIT)
        per = tl.cdiv(tl.cdiv(kv_len, nsp), BLOCK_N) * BLOCK_N
        return kv_len, per, tl.cdiv(kv_len, per)

    @triton.jit
    def _load_q(q_ptr, slot, h, rows, T, NQ: tl.constexpr, G: tl.constexpr, T_PAD: tl.constexpr, D: tl.constexpr):
        """Query rows ``rows`` (g = row // T_PAD, t = row % T_PAD) of KV head h of one slot: [BLOCK_M, D]."""
        t = rows % T_PAD
        od = tl.arange(0, D)
        return tl.load(q_ptr + ((slot * T + t[:, None]) * NQ + h * G + rows[:, None] // T_PAD) * D + od[None, :],
                       mask=(t < T)[:, None], other=0.0)

    @triton.jit
    def _tile_step(q, kbase, vbase, n0, end, stride_ks, qk_scale, m_i, l_i, acc, BLOCK_N: tl.constexpr,
                   D: tl.constexpr):
        """Online softmax over keys [n0, n0 + BLOCK_N) ∩ [.., end) (exp2 domain, fp32); FlashAttention-2 Alg. 1."""
        od = tl.arange(0, D)
        offs_n = n0 + tl.arange(0, BLOCK_N)
        nm = offs_n < end
        k = tl.load(kbase + offs_n[None, :] * stride_ks + od[:, None], mask=nm[None, :], other=0.0)
        s = tl.where(nm[None, :], tl.dot(q, k) * qk_scale, float("-inf"))
        v = tl.load(vbase + offs_n[:, None] * stride_ks + od[None, :], mask=nm[:, None], other=0.0)
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = tl.fma(l_i, alpha, tl.sum(p, axis=1))
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        return m_new, l_i, acc

    @triton.jit
    def _fold_weights(M, m):
        """(M', a, b) of one fold step: M' = max(M, m), a = 2^(M − M'), b = 2^(m − M')."""
        m_new = tl.maximum(M, m)
        return m_new, tl.exp2(M - m_new), tl.exp2(m - m_new)

    @triton.jit
    def _fold_rows(M, L, ACC, m, l, acc):
        """One left-fold step over BLOCK_M rows: (M, L, ACC [BLOCK_M, D]) ⊕ (m, l, acc) (module doc), explicit FMAs."""
        M2, a, b = _fold_weights(M, m)
        return M2, tl.fma(L, a, l * b), tl.fma(ACC, a[:, None], acc * b[:, None])

    @triton.jit
    def _slot_chunk_kernel(
        q_ptr, kc_ptr, vc_ptr, len_ptr, po_ptr, pm_ptr, pl_ptr, T, qk_scale, stride_kh, stride_ks, stride_cs,
        NQ: tl.constexpr, NKV: tl.constexpr, D: tl.constexpr, G: tl.constexpr, T_PAD: tl.constexpr,
        NSPLIT: tl.constexpr, BLOCK_N: tl.constexpr, MIN_KEYS: tl.constexpr, BLOCK_M: tl.constexpr,
        NRB: tl.constexpr, USE_PDL: tl.constexpr = False,
    ):
        """"split" mode, program (KV head h, chunk c, slot·NRB + row block): the chunk's (m, l, acc) of BLOCK_M
        query rows, stored at partial row ((slot·NKV + h)·NSPLIT + c)·G·T_PAD + row."""
        h, c, slot, rb = A._split_program(NRB, USE_PDL)
        rows = rb * BLOCK_M + tl.arange(0, BLOCK_M)
        kv_len, per, n = _chunks(tl.load(len_ptr + slot), T, NSPLIT, MIN_KEYS, BLOCK_N)
        if c >= n:
            return
        q = _load_q(q_ptr, slot, h, rows, T, NQ, G, T_PAD, D)
        kbase, vbase = A._kv_bases(kc_ptr, vc_ptr, slot, h, stride_cs, stride_kh)
        m_i, l_i, acc = A._empty_state(BLOCK_M, D)
        start = c * per
        end = tl.minimum(start + per, kv_len)
        for n0 in range(start, end, BLOCK_N):
            m_i, l_i, acc = _tile_step(q, kbase, vbase, n0, end, stride_ks, qk_scale, m_i, l_i, acc, BLOCK_N, D)
        pr = ((slot * NKV + h) * NSPLIT + c) * (G * T_PAD) + rows
        od = tl.arange(0, D)
        tl.store(po_ptr + pr[:, None] * D + od[None, :], acc)
        tl.store(pm_ptr + pr, m_i)
        tl.store(pl_ptr + pr, l_i)

    @triton.jit
    def _slot_fold_kernel(
        po_ptr, pm_ptr, pl_ptr, o_ptr, len_ptr, T,
        NQ: tl.constexpr, NKV: tl.constexpr, D: tl.constexpr, G: tl.constexpr, T_PAD: tl.constexpr,
        NSPLIT: tl.constexpr, BLOCK_N: tl.constexpr, MIN_KEYS: tl.constexpr, USE_PDL: tl.constexpr = False,
    ):
        """"split" mode, program (query head qh, row r = slot·T + t): left fold of the slot's chunks in order."""
        if USE_PDL:
            gdc_launch_dependents()
            gdc_wait()
        qh = tl.program_id(0)
        r = tl.program_id(1)
        slot = r // T
        kv_len, per, n = _chunks(tl.load(len_ptr + slot), T, NSPLIT, MIN_KEYS, BLOCK_N)
        row = (qh % G) * T_PAD + r % T
        od = tl.arange(0, D)
        M = tl.full((), float("-inf"), tl.float32)
        L = tl.zeros((), dtype=tl.float32)
        ACC = tl.zeros((D,), dtype=tl.float32)
        for c in tl.static_range(NSPLIT):  # unrolled: every chunk's loads issue at once
            pr = ((slot * NKV + qh // G) * NSPLIT + c) * (G * T_PAD) + row
            ok = c < n
            m = tl.load(pm_ptr + pr, mask=ok, other=0.0)
            lc = tl.load(pl_ptr + pr, mask=ok, other=0.0)
            a_c = tl.load(po_ptr + pr * D + od, mask=od < tl.where(ok, D, 0), other=0.0)
            m_new, a, b = _fold_weights(M, m)
            L = tl.where(ok, tl.fma(L, a, lc * b), L)
            ACC = tl.where(ok, tl.fma(ACC, a, a_c * b), ACC)
            M = tl.where(ok, m_new, M)
        tl.store(o_ptr + r * (NQ * D) + qh * D + od, (ACC / L).to(o_ptr.dtype.element_ty))

    @triton.jit
    def _slot_whole_kernel(
        q_ptr, kc_ptr, vc_ptr, len_ptr, o_ptr, T, qk_scale, stride_kh, stride_ks, stride_cs,
        NQ: tl.constexpr, NKV: tl.constexpr, D: tl.constexpr, G: tl.constexpr, T_PAD: tl.constexpr,
        NSPLIT: tl.constexpr, BLOCK_N: tl.constexpr, MIN_KEYS: tl.constexpr, BLOCK_M: tl.constexpr,
        NRB: tl.constexpr, USE_PDL: tl.constexpr = False,
    ):
        """"whole" mode, program ((slot·NKV + h)·NRB + row block): all chunks of the slot, folded in order, and o.
        The row blocks of one (slot, head) are neighbours in the grid, so their K/V reads meet in L2."""
        if USE_PDL:
            gdc_launch_dependents()
            gdc_wait()
        pid = tl.program_id(0)
        rows = (pid % NRB) * BLOCK_M + tl.arange(0, BLOCK_M)
        h = (pid // NRB) % NKV
        slot = pid // (NRB * NKV)
        kv_len, per, n = _chunks(tl.load(len_ptr + slot), T, NSPLIT, MIN_KEYS, BLOCK_N)
        q = _load_q(q_ptr, slot, h, rows, T, NQ, G, T_PAD, D)
        kbase, vbase = A._kv_bases(kc_ptr, vc_ptr, slot, h, stride_cs, stride_kh)
        M, L, ACC = A._empty_state(BLOCK_M, D)
        m_i, l_i, acc = A._empty_state(BLOCK_M, D)
        # chunks are BLOCK_N-aligned, so a tile never straddles two of them and "keys < kv_len" is its mask
        for n0 in range(0, kv_len, BLOCK_N):
            if (n0 > 0) & (n0 % per == 0):  # chunk boundary: fold the finished chunk, start the next one empty
                M, L, ACC = _fold_rows(M, L, ACC, m_i, l_i, acc)
                m_i, l_i, acc = A._empty_state(BLOCK_M, D)
            m_i, l_i, acc = _tile_step(q, kbase, vbase, n0, kv_len, stride_ks, qk_scale, m_i, l_i, acc, BLOCK_N, D)
        M, L, ACC = _fold_rows(M, L, ACC, m_i, l_i, acc)
        t = rows % T_PAD
        od = tl.arange(0, D)
        o = ACC / L[:, None]
        tl.store(o_ptr + (slot * T + t[:, None]) * (NQ * D) + (h * G + rows[:, None] // T_PAD) * D + od[None, :],
                 o.to(o_ptr.dtype.element_ty), mask=(t < T)[:, None])

    @triton.jit
    def _slot_qk_norm_rope_kernel(
        qkv_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, len_ptr, q_ptr, kc_ptr, vc_ptr, R, T, stride_qkv, eps, stride_cs,
        NQ: tl.constexpr, NKV: tl.constexpr, D: tl.constexpr, ROT: tl.constexpr, MAXLEN: tl.constexpr,
        ROWS: tl.constexpr, USE_PDL: tl.constexpr = False,
    ):
        """Program (row block, head hd): rows rb·ROWS + [0, ROWS) of R = S·T; slot = row // T at position P_s + t."""
        if USE_PDL:
            gdc_launch_dependents()
            gdc_wait()
        rw = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        hd = tl.program_id(1)
        rm = rw < R
        slot = rw // T
        pos = tl.load(len_ptr + slot, mask=rm, other=0) + rw % T
        HALF: tl.constexpr = ROT // 2
        oh = tl.arange(0, HALF)
        orr = tl.arange(0, D - ROT)
        od = tl.arange(0, D)
        src = qkv_ptr + rw * stride_qkv + hd * D
        m = rm[:, None]
        if hd >= NQ + NKV:  # V head: copied into the cache
            v = tl.load(src[:, None] + od[None, :], mask=m, other=0.0)
            tl.store(vc_ptr + (slot * stride_cs + ((hd - NQ - NKV) * MAXLEN + pos) * D)[:, None] + od[None, :],
                     v.to(vc_ptr.dtype.element_ty), mask=m)
            return
        if hd < NQ:
            o1, o2, o3 = A._norm_rope_rows(src, rm, pos, qw_ptr, cos_ptr, sin_ptr, eps, D, ROT)
            dst = q_ptr + (rw * NQ + hd) * D
        else:
            o1, o2, o3 = A._norm_rope_rows(src, rm, pos, kw_ptr, cos_ptr, sin_ptr, eps, D, ROT)
            dst = kc_ptr + slot * stride_cs + ((hd - NQ) * MAXLEN + pos) * D
        ty = q_ptr.dtype.element_ty
        tl.store(dst[:, None] + oh[None, :], o1.to(ty), mask=m)
        tl.store(dst[:, None] + HALF + oh[None, :], o2.to(ty), mask=m)
        tl.store(dst[:, None] + ROT + orr[None, :], o3.to(ty), mask=m)


def slot_qk_norm_rope_kv(qkv, q_w, k_w, cos, sin, cache_len, q_out, k_cache, v_cache, nq, nkv, rot=64, eps=1e-6,
                         rows=QKN_ROWS):
    """qkv [S·T, (nq+2nkv)·D] (model dtype or fp32, last dim contiguous); q_w, k_w [D]; cos, sin [>= MAXLEN,
    rot/2] fp32 (:func:`.attention.rope_tables`); cache_len int32 [S]; writes q_out [S·T, nq, D] and rows [P_s,
    P_s + T) of k_cache / v_cache [S, nkv, MAXLEN, D] (or [nkv, MAXLEN, D] for S = 1). The math of
    :func:`.attention.qk_norm_rope_kv` (QK-norm in fp32, eps; partial NeoX RoPE on the first ``rot`` channels;
    one rounding), ``rows`` query rows per program. Returns q_out; raises ValueError when the shapes do not fit
    or ``rows`` is not a power of two."""
    D = q_out.shape[-1]
    S, T, scs = A._slots(k_cache, v_cache, qkv.shape[0], cache_len, "slot_qk_norm_rope_kv")
    if (rows < 1 or rows & (rows - 1) or qkv.stride(1) != 1 or qkv.shape[1] != (nq + 2 * nkv) * D
            or not (q_out.is_contiguous() and k_cache.is_contiguous() and v_cache.is_contiguous())):
        raise ValueError(f"slot_qk_norm_rope_kv: qkv {tuple(qkv.shape)} (last dim contiguous, (nq+2nkv)·D wide), "
                         f"contiguous q_out / caches and rows a power of two (got {rows}) required")
    R = S * T
    _slot_qk_norm_rope_kernel[(triton.cdiv(R, rows), nq + 2 * nkv)](
        qkv, q_w, k_w, cos, sin, cache_len, q_out, k_cache, v_cache, R, T, qkv.stride(0), eps, scs,
        NQ=nq, NKV=nkv, D=D, ROT=rot, MAXLEN=k_cache.shape[-2], ROWS=rows, num_warps=4 if rows >= 32 else 2,
        **pdl(),
    )
    return q_out


def slot_attention(q, k_cache, v_cache, cache_len, out, ws: "A.AttnWorkspace", scale=None, mode=None,
                   whole_min_slots=WHOLE_MIN_SLOTS):
    """o = softmax(q·kᵀ·scale)·v per slot over keys [0, P_s + T), GQA; module doc.

    q [S·T, NQ, D] (model dtype, contiguous); caches [S, NKV, MAXLEN, D] (or [NKV, MAXLEN, D] for S = 1; same strides,
    last dim contiguous); cache_len int32 [S] on the device; out [S·T, NQ·D] (written, any float dtype); ``ws`` an
    :class:`.attention.AttnWorkspace` for (T, NQ, NKV, D) with ``slots >= S`` (its NSPLIT, MIN_KEYS, BLOCK_N,
    BLOCK_M, warps and stages; its partials are used in "split" mode only). ``mode``: "split", "whole" or None
    (= "whole" when S >= ``whole_min_slots``); the result is bit-identical in both. No host sync, no allocation.
    Returns ``out``; raises ValueError when the shapes, the workspace or ``mode`` do not fit."""
    NQ, D = q.shape[1], q.shape[2]
    S, T, scs = A._slots(k_cache, v_cache, q.shape[0], cache_len, "slot_attention")
    NKV = k_cache.shape[-3]
    if S > ws.slots or T > ws.T_PAD or ws.po.shape[0] < S * NKV or NQ % NKV or tuple(out.shape) != (S * T, NQ * D):
        raise ValueError(f"slot_attention: q {tuple(q.shape)}, out {tuple(out.shape)}, caches {tuple(k_cache.shape)} "
                         f"and a workspace for {ws.slots} slot(s) of T={ws.T} do not fit")
    mode = mode or ("whole" if S >= whole_min_slots else "split")
    if mode not in ("split", "whole"):
        raise ValueError(f"slot_attention: mode {mode!r} is not 'split' or 'whole'")
    if k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1 or not q.is_contiguous() \
            or not out.is_contiguous():
        raise ValueError("slot_attention: q, out contiguous; k/v caches with equal strides, last dim contiguous")
    G = NQ // NKV
    nrb = (G * ws.T_PAD) // ws.block_m
    qk_scale = (scale if scale is not None else 1.0 / math.sqrt(D)) * 1.4426950408889634
    common = dict(NQ=NQ, NKV=NKV, D=D, G=G, T_PAD=ws.T_PAD, NSPLIT=ws.nsplit, BLOCK_N=ws.block_n,
                  MIN_KEYS=ws.min_keys)
    tiles = dict(BLOCK_M=ws.block_m, NRB=nrb, num_warps=ws.num_warps, num_stages=ws.num_stages)
    shd, ssq = k_cache.stride(-3), k_cache.stride(-2)
    if mode == "whole":
        _slot_whole_kernel[(S * NKV * nrb,)](q, k_cache, v_cache, cache_len, out, T, qk_scale, shd, ssq, scs,
                                             **common, **tiles, **pdl())
        return out
    _slot_chunk_kernel[(NKV, ws.nsplit, S * nrb)](q, k_cache, v_cache, cache_len, ws.po, ws.pm, ws.pl, T, qk_scale,
                                                  shd, ssq, scs, **common, **tiles, **pdl())
    _slot_fold_kernel[(NQ, S * T)](ws.po, ws.pm, ws.pl, out, cache_len, T, **common, num_warps=4, **pdl())
    return out
