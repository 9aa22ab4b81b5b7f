"""QK-norm + RoPE + KV write + split-KV attention + combine of one block in ONE launch.

:func:`block_attention_fused` does what :func:`.attention.qk_norm_rope_kv` followed by
:func:`.attention.block_attention` (split + combine) do, in one launch over the split kernel's grid (KV head h,
chunk c, row block): model facts, cache layout and chunk layout as in :mod:`.attention` (chunks: ``n = min(NSPLIT,
max(1, cdiv(P + T, MIN_KEYS)))`` BLOCK_N-aligned pieces of the keys [0, P + T)).

Per program: QK-norm (fp32) + partial NeoX RoPE of its BLOCK_M query rows in registers (rounded to the cache dtype,
like the unfused q), the keys < P of its chunk from the cache and the block's own keys [P, P + T) computed from
``qkv`` the same way (V raw; row block 0 writes them into the cache rows [P, P + T): each block key lies in one
chunk, so it is written once). The first cached key tile is loaded with the query rows and the block's rows, so
those memory round trips overlap. The chunk's online softmax (exp2, fp32) runs from the empty state over its block
tile (if the chunk holds block keys), then its cached tiles in key order (:func:`_softmax_step`: QKᵀ as three dots
over the RoPE column pieces).

Combine ("ticket", one launch): with one chunk in use the program writes ``o = acc / l``. Otherwise every program
stores its chunk's (m, l, acc) in fp32 and takes a ticket on the counter of its (KV head, row block)
(``tl.atomic_add``, ``sem="acq_rel"``, after a CTA barrier); the program with the last ticket resets the counter to 0
and folds ALL the chunks of its rows from memory, in chunk order 0, 1, ..., n-1 (the left fold of
:mod:`.attention_slots`: ``_fold_rows``, explicit FMAs, FOLD_CHUNK chunks' loads in flight at a time), then writes
o. The result therefore never depends on which program finishes last (the earlier fused kernel merged the others
into its own state, in an order that did). ``ws.fused_combine = "kernel"``: the partials are merged by
``attention._attn_combine_kernel`` instead (two launches).

Numerics against the unfused path: the same math up to fp32 rounding (the three-dot QKᵀ, the order of the block and
cached tiles, the fold); not bit-identical, so the batched forward keeps :mod:`.attention_slots` (its row invariance
is bit-level) and this kernel serves ``BlockForward(fused_attn=True)``, with its own launch tiles (``attn`` tile
family, kernel ``fused``: :data:`FUSED_DEFAULT`). Measured figures: docs/perf.md "Router + route in one launch, attention in one launch".
"""
from __future__ import annotations

import math

from . import attention as A
from ._triton import HAS_TRITON, pdl, tl, triton

if HAS_TRITON:
    from .attention import _norm_rope_rows, _online_softmax, _split_range, _store_partials
    from .attention_slots import _fold_rows

__all__ = ["FUSED_DEFAULT", "block_attention_fused", "fused_workspace"]

#: launch tiles of the fused kernel where the device has no tuned ``attn``/``fused`` entry: small row blocks (16 of the
#: G·T_PAD = 128 query rows of a KV head: 8 row blocks) so that the fold of each (head, row block) reads few bytes
#: (chunks x 16 x 128 x 4 B); chunks of 128 keys, so that at P = 1k the 9 chunks x 4 heads x 8 row blocks = 288
#: programs fit the GPU at once (offline sm_90a compile: 163 registers, 3 programs of 4 warps per SM; with
#: ``PREFETCH`` 182, 2 per SM). FOLD_CHUNK: chunks' partial loads in flight during the fold.
FUSED_DEFAULT = dict(NSPLIT=32, BLOCK_N=64, BLOCK_M=16, MIN_KEYS=128, num_warps=4, num_stages=3, PREFETCH=0,
                     FOLD_CHUNK=4)

if HAS_TRITON:

    @triton.jit
    def _softmax_step(q1, q2, qr, k1, k2, kr, v, nm, m_i, l_i, acc, qk_scale):
        """Online-softmax update of (m_i, l_i, acc) with one key tile (keys with ``nm`` False ignored); Q and
        K as the column pieces of ``_norm_rope_rows`` (QK^T = a sum of three dots)."""
        s = tl.dot(q1, tl.trans(k1))
        s = tl.dot(q2, tl.trans(k2), s)
        s = tl.dot(qr, tl.trans(kr), s) * qk_scale
        return _online_softmax(tl.where(nm[None, :], s, float("-inf")), v, m_i, l_i, acc)

    @triton.jit
    def _load_keys(kbase, offs_n, nm, stride_ks, HALF: tl.constexpr, ROT: tl.constexpr, D: tl.constexpr):
        """Cached keys ``offs_n`` (rows with ``nm`` False read as 0) as the three RoPE column pieces."""
        oh = tl.arange(0, HALF)
        orr = tl.arange(0, D - ROT)
        krow = kbase + offs_n[:, None] * stride_ks
        k1 = tl.load(krow + oh[None, :], mask=nm[:, None], other=0.0)
        k2 = tl.load(krow + HALF + oh[None, :], mask=nm[:, None], other=0.0)
        kr = tl.load(krow + ROT + orr[None, :], mask=nm[:, None], other=0.0)
        return k1, k2, kr

    @triton.jit
    def _load_values(vbase, offs_n, nm, stride_ks, D: tl.constexpr):
        """Cached values ``offs_n`` [BLOCK_N, D] (rows with ``nm`` False read as 0)."""
        od = tl.arange(0, D)
        return tl.load(vbase + offs_n[:, None] * stride_ks + od[None, :], mask=nm[:, None], other=0.0)

    @triton.jit
    def _fold_chunks(po_ptr, pm_ptr, pl_ptr, h, rows, nsp, M: tl.constexpr, NSPLIT: tl.constexpr,
                     BLOCK_M: tl.constexpr, D: tl.constexpr, FOLD_CHUNK: tl.constexpr):
        """(L, ACC) of the left fold of chunks 0 .. nsp-1 of (KV head h, rows) from their stored (m, l, acc), in
        chunk order (``attention_slots._fold_rows``); FOLD_CHUNK chunks' loads issued at once (unrolled; registers).
        Read at L2 (``.cg``): other programs wrote them."""
        od = tl.arange(0, D)
        ar = tl.arange(0, BLOCK_M)
        Mx = tl.full((BLOCK_M,), float("-inf"), tl.float32)
        L = tl.zeros((BLOCK_M,), dtype=tl.float32)
        ACC = tl.zeros((BLOCK_M, D), dtype=tl.float32)
        FC: tl.constexpr = NSPLIT if NSPLIT < FOLD_CHUNK else FOLD_CHUNK
        for c0 in range(0, nsp, FC):
            for c1 in tl.static_range(FC):
                c = c0 + c1
                ok = c < nsp
                rm = ar < tl.where(ok, BLOCK_M, 0)
                b = (h * NSPLIT + c) * M + rows
                m = tl.load(pm_ptr + b, mask=rm, other=0.0, cache_modifier=".cg")
                l = tl.load(pl_ptr + b, mask=rm, other=0.0, cache_modifier=".cg")
                a = tl.load(po_ptr + b[:, None] * D + od[None, :], mask=rm[:, None], other=0.0,
                            cache_modifier=".cg")
                M2, L2, ACC2 = _fold_rows(Mx, L, ACC, m, l, a)
                Mx = tl.where(ok, M2, Mx)
                L = tl.where(ok, L2, L)
                ACC = tl.where(ok, ACC2, ACC)
        return L, ACC

    @triton.jit
    def _attn_fused_kernel(
        qkv_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, len_ptr, kc_ptr, vc_ptr, po_ptr, pm_ptr, pl_ptr, cnt_ptr, o_ptr,
        T, stride_qkv, stride_kh, stride_ks, qk_scale, eps,
        NQ: tl.constexpr, NKV: tl.constexpr, D: tl.constexpr, ROT: tl.constexpr, G: tl.constexpr,
        T_PAD: tl.constexpr, NSPLIT: tl.constexpr, BLOCK_N: tl.constexpr, MIN_KEYS: tl.constexpr,
        BLOCK_M: tl.constexpr, TICKET: tl.constexpr, FOLD_CHUNK: tl.constexpr = 4, PREFETCH: tl.constexpr = False,
        USE_PDL: tl.constexpr = False,
    ):
        """Program (h, chunk, row block) of ``block_attention_fused`` (module doc); the chunk/row layout of
        ``attention._attn_split_kernel``. TICKET: one launch (the last program of each (h, row block) folds the
        chunks, FOLD_CHUNK of them per step); else every program stores its partials for ``_attn_combine_kernel``."""
        M: tl.constexpr = G * T_PAD
        HALF: tl.constexpr = ROT // 2
        NRB: tl.constexpr = M // BLOCK_M
        h, sp, rb, P, nsp, start, end, rows, g, t, _ = _split_range(len_ptr, T, NSPLIT, MIN_KEYS, BLOCK_N, BLOCK_M,
                                                                    T_PAD, USE_PDL, NRB)
        if sp >= nsp:
            return
        tm = t < T
        od = tl.arange(0, D)
        oh = tl.arange(0, HALF)
        orr = tl.arange(0, D - ROT)
        kty = kc_ptr.dtype.element_ty
        kbase = kc_ptr + h * stride_kh
        vbase = vc_ptr + h * stride_kh
        cend = tl.minimum(end, P)  # cached keys of this chunk: [start, cend)
        # PREFETCH: the first cached key tile loaded with the query rows and the block's keys in this chunk ([b0, end),
        # at most T of them; none: all masked), no branch in between, so that their memory round trips overlap
        offs_n = start + tl.arange(0, BLOCK_N)
        nm0 = offs_n < cend
        if PREFETCH:
            k1, k2, kr = _load_keys(kbase, offs_n, nm0, stride_ks, HALF, ROT, D)
        b0 = tl.maximum(start, P)
        offs_b = b0 + tl.arange(0, T_PAD)
        bm = offs_b < end
        jb = offs_b - P
        q1, q2, qr = _norm_rope_rows(qkv_ptr + t * stride_qkv + (h * G + g) * D, tm, P + t, qw_ptr, cos_ptr, sin_ptr,
                                     eps, D, ROT)
        kb1, kb2, kbr = _norm_rope_rows(qkv_ptr + jb * stride_qkv + (NQ + h) * D, bm, offs_b, kw_ptr, cos_ptr,
                                        sin_ptr, eps, D, ROT)
        vb = tl.load(qkv_ptr + jb[:, None] * stride_qkv + (NQ + NKV + h) * D + od[None, :], mask=bm[:, None],
                     other=0.0)
        q1, q2, qr = q1.to(kty), q2.to(kty), qr.to(kty)
        kb1, kb2, kbr, vb = kb1.to(kty), kb2.to(kty), kbr.to(kty), vb.to(kty)
        if rb == 0:  # each block key lies in one chunk's range: written once over the grid
            krow = kbase + offs_b[:, None] * stride_ks
            tl.store(krow + oh[None, :], kb1, mask=bm[:, None])
            tl.store(krow + HALF + oh[None, :], kb2, mask=bm[:, None])
            tl.store(krow + ROT + orr[None, :], kbr, mask=bm[:, None])
            tl.store(vbase + offs_b[:, None] * stride_ks + od[None, :], vb, mask=bm[:, None])
        m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
        l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
        acc = tl.zeros((BLOCK_M, D), dtype=tl.float32)
        if b0 < end:  # the block's own keys first (their registers are free before the cached tiles')
            m_i, l_i, acc = _softmax_step(q1, q2, qr, kb1, kb2, kbr, vb, bm, m_i, l_i, acc, qk_scale)
        if start < cend:
            if not PREFETCH:
                k1, k2, kr = _load_keys(kbase, offs_n, nm0, stride_ks, HALF, ROT, D)
            v = _load_values(vbase, offs_n, nm0, stride_ks, D)
            m_i, l_i, acc = _softmax_step(q1, q2, qr, k1, k2, kr, v, nm0, m_i, l_i, acc, qk_scale)
        for n0 in range(start + BLOCK_N, cend, BLOCK_N):  # the chunk's other cached tiles, in key order
            offs_c = n0 + tl.arange(0, BLOCK_N)
            nm = offs_c < cend
            c1, c2, cr = _load_keys(kbase, offs_c, nm, stride_ks, HALF, ROT, D)
            cv = _load_values(vbase, offs_c, nm, stride_ks, D)
            m_i, l_i, acc = _softmax_step(q1, q2, qr, c1, c2, cr, cv, nm, m_i, l_i, acc, qk_scale)
        o_ptrs = o_ptr + t[:, None] * (NQ * D) + (h * G + g)[:, None] * D + od[None, :]
        pbase = (h * NSPLIT + sp) * M
        if TICKET:
            if nsp == 1:
                tl.store(o_ptrs, (acc / l_i[:, None]).to(o_ptr.dtype.element_ty), mask=tm[:, None])
            else:
                _store_partials(po_ptr, pm_ptr, pl_ptr, pbase, rows, acc, m_i, l_i, D)
                tl.debug_barrier()  # every thread's partial stores precede the (release) ticket
                cnt = cnt_ptr + h * NRB + rb
                if tl.atomic_add(cnt, 1, sem="acq_rel") == nsp - 1:
                    tl.atomic_xchg(cnt, 0, sem="relaxed")
                    L, ACC = _fold_chunks(po_ptr, pm_ptr, pl_ptr, h, rows, nsp, M, NSPLIT, BLOCK_M, D, FOLD_CHUNK)
                    tl.store(o_ptrs, (ACC / L[:, None]).to(o_ptr.dtype.element_ty), mask=tm[:, None])
        else:  # partials for _attn_combine_kernel
            _store_partials(po_ptr, pm_ptr, pl_ptr, pbase, rows, acc, m_i, l_i, D)


def fused_workspace(T, nq, nkv, d, device, cfg: dict) -> "A.AttnWorkspace":
    """An :class:`.attention.AttnWorkspace` for :func:`block_attention_fused` with the launch tiles ``cfg`` (keys of
    :data:`FUSED_DEFAULT`; missing ones from it; ``COMBINE``: "ticket" (default) or "kernel"), the kernel-only
    keys kept as ``ws.fused_opts``."""
    c = {**FUSED_DEFAULT, **cfg}
    ws = A.AttnWorkspace(T, nq, nkv, d, device, nsplit=c["NSPLIT"], block_n=c["BLOCK_N"], num_warps=c["num_warps"],
                         num_stages=c["num_stages"], min_keys=c["MIN_KEYS"], block_m=c["BLOCK_M"])
    ws.fused_combine = c.get("COMBINE", "ticket")
    ws.fused_opts = dict(PREFETCH=bool(c["PREFETCH"]), FOLD_CHUNK=int(c["FOLD_CHUNK"]))
    return ws


def block_attention_fused(qkv, q_w, k_w, cos, sin, cache_len, k_cache, v_cache, out, ws: "A.AttnWorkspace", nq, nkv,
                          rot=64, eps=1e-6, scale=None):
    """``qk_norm_rope_kv`` + ``block_attention`` (split + combine) in one kernel launch (two with
    ``ws.fused_combine == "kernel"``): the same math up to fp32 rounding (module doc), deterministic.

    qkv [T, (nq+2nkv)·D] (model dtype or fp32, last dim contiguous; row t: q heads | k heads | v heads);
    q_w, k_w [D] QK-norm weights; cos, sin [>= MAXLEN, rot/2] fp32 from :func:`.attention.rope_tables`; cache_len
    int32 [1] on device (P); k_cache, v_cache [nkv, MAXLEN, D] (same strides, last dim contiguous); out [T, nq·D]
    contiguous (any float dtype); ws an :class:`.attention.AttnWorkspace` built for (T, nq, nkv, D) (e.g.
    :func:`fused_workspace`): its NSPLIT, MIN_KEYS, BLOCK_N, BLOCK_M, warps, stages, partials and ``tickets``
    (zeros; each launch leaves them at zero). Writes out and the cache rows [P, P+T); reads keys [0, P) of the
    cache. No host sync and no allocation: CUDA-graph capturable. Returns ``out``.

    Raises ValueError when the shapes, strides or the workspace do not match, when rot/2 and D - rot are
    not powers of two (at least 16 on CUDA: they are dot operand widths), or for an unknown
    ``ws.fused_combine``.
    """
    T = qkv.shape[0]
    NKV, MAXLEN, D = k_cache.shape
    G = nq // nkv
    half, rest = rot // 2, D - rot
    if (nkv != NKV or nq != G * nkv or qkv.shape[1] != (nq + 2 * nkv) * D or rot % 2 or half < 1 or rest < 1
            or half & (half - 1) or rest & (rest - 1) or (qkv.is_cuda and min(half, rest) < 16)
            or cos.dim() != 2 or cos.shape[0] < MAXLEN or cos.shape[1] != half or cos.shape != sin.shape):
        raise ValueError(f"block_attention_fused: qkv {tuple(qkv.shape)}, caches {tuple(k_cache.shape)}, "
                         f"cos {tuple(cos.shape)} do not fit nq={nq}, nkv={nkv}, rot={rot}")
    if (qkv.stride(1) != 1 or k_cache.stride() != v_cache.stride() or k_cache.stride(2) != 1
            or not cos.is_contiguous() or not sin.is_contiguous() or not out.is_contiguous()
            or tuple(out.shape) != (T, nq * D)):
        raise ValueError("block_attention_fused: qkv/cache last dim, cos/sin and out [T, nq·D] must be contiguous")
    if ws.T_PAD < T or tuple(ws.po.shape[0::2]) != (nkv, G * ws.T_PAD) or ws.po.shape[3] != D:
        raise ValueError(f"block_attention_fused: workspace built for T={ws.T}, not for T={T}, nq={nq}, D={D}")
    if ws.fused_combine not in ("ticket", "kernel"):
        raise ValueError(f"block_attention_fused: fused_combine {ws.fused_combine!r} is not 'ticket' or 'kernel'")
    ticket = ws.fused_combine == "ticket"
    scale = scale if scale is not None else 1.0 / math.sqrt(D)
    _attn_fused_kernel[(NKV, ws.nsplit, (G * ws.T_PAD) // ws.block_m)](
        qkv, q_w, k_w, cos, sin, cache_len, k_cache, v_cache, ws.po, ws.pm, ws.pl, ws.tickets, out,
        T, qkv.stride(0), k_cache.stride(0), k_cache.stride(1), scale * 1.4426950408889634, eps,
        NQ=nq, NKV=nkv, D=D, ROT=rot, G=G, T_PAD=ws.T_PAD, NSPLIT=ws.nsplit, BLOCK_N=ws.block_n,
        MIN_KEYS=ws.min_keys, BLOCK_M=ws.block_m, TICKET=ticket, **getattr(ws, "fused_opts", {}),
        num_warps=ws.num_warps, num_stages=ws.num_stages, **pdl(),
    )
    if not ticket:
        A._attn_combine_kernel[(nq, T)](ws.po, ws.pm, ws.pl, out, cache_len, T, NQ=nq, D=D, G=G, T_PAD=ws.T_PAD,
                                        NSPLIT=ws.nsplit, MIN_KEYS=ws.min_keys, NKV=nkv, num_warps=4, **pdl())
    return out

