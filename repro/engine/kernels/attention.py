"""Attention of one diffusion block (T<=128 queries) over [cached prefix | block], with references.

Model facts (docs/engine.md §2 "Attention", §4): fused QKV projection output [T, (NQ + 2·NKV)·D] with rows
ordered [q heads | k heads | v heads]; QK-norm (per-head RMSNorm over D=128, eps 1e-6) *before* RoPE;
partial NeoX RoPE on the first ROT=64 channels of each head (pairs (c, c+32), ``inv_freq[j] =
theta^(-2j/64)``, theta 600000), positions absolute; GQA (KV head j serves query heads
j·G..j·G+G-1, G = NQ/NKV = 4); scale 1/sqrt(D); the block attends bidirectionally to itself and fully
to the cached prefix (no mask inside [0, cache_len + T)).

KV cache layout: per layer ``k_cache``/``v_cache`` [NKV, MAXLEN, D] (model dtype); the cache length is
a device int32 tensor ``cache_len`` [1] (the prefix length P), so one CUDA graph serves every P.
Slot axis (batched forward, ``fastpath_batch.py``): caches [S, NKV, MAXLEN, D], ``cache_len`` [S] (P_s per slot),
query/qkv rows ``s·T + t``; every program works inside one slot (grid axis + slot stride), so a slot's results
and its split layout depend only on its own rows, cache and P_s: with S = 1 the kernels compute exactly what
they compute without the slot axis, and slot s of any S computes what it computes alone. (The batched forward
runs :mod:`.attention_slots` by default, whose chunks are folded in a fixed order so that one program per slot can
replace the split + combine at many slots; this slot axis serves its ``IMPL: "single"`` A/B setting.)
The block's K/V are written in place at rows [P, P+T) (overwritten by the next round; the commit
forward leaves the final values there and the caller then advances ``cache_len`` by T).

Kernels:

* ``qk_norm_rope_kv``: grid (T, NQ + 2·NKV); QK-norm + RoPE in fp32 (one rounding), writes q [T, NQ, D]
  and the K/V rows into the cache. cos/sin come from tables built exactly like the reference.
* ``block_attention``: flash-decoding split over the keys, grid (NKV, NSPLIT); each program takes the
  G·T_PAD query rows of one KV head (GQA rows share K/V tiles, K/V never repeated), keeps an online
  softmax (exp2, fp32), writes partial (acc, max, sum); ``_attn_combine_kernel`` (grid (NQ, T)) merges
  the splits into o [T, NQ·D]. Bytes read ≈ (P+T)·NKV·D·2·2 per layer: 41 kB/token over 20 layers.
* The three launches above in one: :mod:`.attention_fused` (``block_attention_fused``; QK-norm + RoPE in the
  split programs, the combine by the last program of each (KV head, row block) in a fixed chunk order). Its
  first version (here until the deterministic fold) merged the other splits serially into the last one's own state (H200, µs
  per layer at P = 0 / 1024 / 4096: 5.3 / 36.6 / 64.2 against 8.3 / 11.4 / 15.4 unfused).
"""
from __future__ import annotations

import math

import torch

from ._triton import HAS_TRITON, gdc_launch_dependents, gdc_wait, pdl, next_pow2, tl, triton

__all__ = [
    "rope_tables",
    "qk_norm_rope_reference",
    "attention_reference",
    "qk_norm_rope_kv",
    "AttnWorkspace",
    "block_attention",
]


def rope_tables(max_len: int, rot_dim: int = 64, theta: float = 600000.0, device=None):
    """cos, sin tables [max_len, rot_dim/2] fp32: ``cos(pos · inv_freq)``, inv_freq as HF computes it."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, rot_dim, 2, dtype=torch.int64).float().to(device) / rot_dim))
    pos = torch.arange(max_len, device=device, dtype=torch.float32)
    f = torch.outer(pos, inv_freq)
    return torch.cos(f).contiguous(), torch.sin(f).contiguous()


def qk_norm_rope_reference(qkv, q_w, k_w, pos0, cos, sin, nq, nkv, d=128, rot=64, eps=1e-6):
    """fp32 reference: qkv [T, (nq+2nkv)·d] -> (q [T,nq,d], k [T,nkv,d], v [T,nkv,d]) fp32."""
    T = qkv.shape[0]
    x = qkv.float().view(T, nq + 2 * nkv, d)
    q, k, v = x[:, :nq], x[:, nq:nq + nkv], x[:, nq + nkv:]

    def norm(t, w):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps) * w.float()

    q, k = norm(q, q_w), norm(k, k_w)
    half = rot // 2
    c = cos[pos0:pos0 + T].float()[:, None, :]
    s = sin[pos0:pos0 + T].float()[:, None, :]

    def rope(t):
        x1, x2, rest = t[..., :half], t[..., half:rot], t[..., rot:]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s, rest], -1)

    return rope(q), rope(k), v


def attention_reference(q, k, v, scale=None):
    """q [T, NQ, D]; k, v [NKV, L, D] (all L keys visible). Returns o [T, NQ·D] fp32."""
    T, NQ, D = q.shape
    NKV = k.shape[0]
    g = NQ // NKV
    scale = scale if scale is not None else 1.0 / math.sqrt(D)
    kf = k.float().repeat_interleave(g, 0)  # [NQ, L, D]
    vf = v.float().repeat_interleave(g, 0)
    s = torch.einsum("thd,hld->htl", q.float(), kf) * scale
    p = torch.softmax(s, -1)
    o = torch.einsum("htl,hld->thd", p, vf)
    return o.reshape(T, NQ * D)


if HAS_TRITON:

    @triton.jit
    def _qk_norm_rope_kv_kernel(
        qkv_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, len_ptr, q_ptr, kc_ptr, vc_ptr, stride_qkv, eps, stride_cs,
        NQ: tl.constexpr, NKV: tl.constexpr, D: tl.constexpr, ROT: tl.constexpr, MAXLEN: tl.constexpr,
        TB: tl.constexpr = 1, USE_PDL: tl.constexpr = False,
    ):
        """Program (row rw = slot·TB + t, head hd); slot s's cache at kc/vc + s·stride_cs, position P_s + t."""
        if USE_PDL:
            gdc_launch_dependents()
            gdc_wait()
        rw = tl.program_id(0)
        hd = tl.program_id(1)
        slot = rw // TB
        t = rw % TB
        HALF: tl.constexpr = ROT // 2
        REST: tl.constexpr = D - ROT
        pos = tl.load(len_ptr + slot) + t
        base = qkv_ptr + rw * stride_qkv + hd * D
        oh = tl.arange(0, HALF)
        orr = tl.arange(0, REST)
        if hd < NQ + NKV:
            x1 = tl.load(base + oh).to(tl.float32)
            x2 = tl.load(base + HALF + oh).to(tl.float32)
            xr = tl.load(base + ROT + orr).to(tl.float32)
            ss = tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0) + tl.sum(xr * xr, axis=0)
            r = tl.rsqrt(ss / D + eps)
            is_q = hd < NQ
            w1 = tl.where(is_q, tl.load(qw_ptr + oh), tl.load(kw_ptr + oh)).to(tl.float32)
            w2 = tl.where(is_q, tl.load(qw_ptr + HALF + oh), tl.load(kw_ptr + HALF + oh)).to(tl.float32)
            wr = tl.where(is_q, tl.load(qw_ptr + ROT + orr), tl.load(kw_ptr + ROT + orr)).to(tl.float32)
            x1 = x1 * r * w1
            x2 = x2 * r * w2
            xr = xr * r * wr
            c = tl.load(cos_ptr + pos * HALF + oh)
            s = tl.load(sin_ptr + pos * HALF + oh)
            o1 = x1 * c - x2 * s
            o2 = x2 * c + x1 * s
            if is_q:
                dst = q_ptr + (rw * NQ + hd) * D
            else:
                dst = kc_ptr + slot * stride_cs + ((hd - NQ) * MAXLEN + pos) * D
            ty = q_ptr.dtype.element_ty
            tl.store(dst + oh, o1.to(ty))
            tl.store(dst + HALF + oh, o2.to(ty))
            tl.store(dst + ROT + orr, xr.to(ty))
        else:
            od = tl.arange(0, D)
            v = tl.load(base + od)
            tl.store(vc_ptr + slot * stride_cs + ((hd - NQ - NKV) * MAXLEN + pos) * D + od,
                     v.to(vc_ptr.dtype.element_ty))

    @triton.jit
    def _num_splits(kv_len, NSPLIT: tl.constexpr, MIN_KEYS: tl.constexpr):
        """Key splits in use for kv_len keys: min(NSPLIT, max(1, cdiv(kv_len, MIN_KEYS)))."""
        return tl.minimum(tl.maximum(tl.cdiv(kv_len, MIN_KEYS), 1), NSPLIT)

    @triton.jit
    def _split_range(len_ptr, T, NSPLIT: tl.constexpr, MIN_KEYS: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_M: tl.constexpr, T_PAD: tl.constexpr, USE_PDL: tl.constexpr, NRB: tl.constexpr = 1):
        """The program prologue shared by the split and fused kernels: the PDL hand-off (USE_PDL: let the
        next launch start, then wait for the previous one), the program's (KV head h, split sp, slot, row block
        rb) (grid axis 2 = slot·NRB + rb, NRB row blocks per slot), and its key range and query rows.

        Splits in use at this length (P = cache_len[slot]): nsp = min(NSPLIT, max(1, cdiv(P + T, MIN_KEYS)));
        split sp covers keys [start, end) in BLOCK_N-aligned pieces; rows = rb·BLOCK_M + [0, BLOCK_M) of the G·T_PAD query rows
        (GQA group g = row // T_PAD, token t = row % T_PAD). Returns (h, sp, rb, P, nsp, start, end, rows, g,
        t, slot); the caller returns at once when sp >= nsp.
        """
        h, sp, slot, rb = _split_program(NRB, USE_PDL)
        P = tl.load(len_ptr + slot)
        kv_len = P + T
        nsp = _num_splits(kv_len, NSPLIT, MIN_KEYS)
        per = tl.cdiv(tl.cdiv(kv_len, nsp), BLOCK_N) * BLOCK_N
        start = sp * per
        end = tl.minimum(start + per, kv_len)
        rows = rb * BLOCK_M + tl.arange(0, BLOCK_M)
        return h, sp, rb, P, nsp, start, end, rows, rows // T_PAD, rows % T_PAD, slot

    @triton.jit
    def _split_program(NRB: tl.constexpr, USE_PDL: tl.constexpr):
        """The PDL hand-off (USE_PDL), then (h, split, slot, row block) of a program over the grid (NKV, NSPLIT,
        S·NRB); shared by the split kernels here and :mod:`.attention_slots`' chunk kernel."""
        if USE_PDL:
            gdc_launch_dependents()
            gdc_wait()
        h = tl.program_id(0)
        sp = tl.program_id(1)
        slot = tl.program_id(2) // NRB
        rb = tl.program_id(2) % NRB
        return h, sp, slot, rb

    @triton.jit
    def _empty_state(BLOCK_M: tl.constexpr, D: tl.constexpr):
        """(m, l, acc) of an online softmax before its first key: -inf [BLOCK_M], 0 [BLOCK_M], 0 [BLOCK_M, D], fp32."""
        return (tl.full((BLOCK_M,), float("-inf"), tl.float32), tl.zeros((BLOCK_M,), dtype=tl.float32),
                tl.zeros((BLOCK_M, D), dtype=tl.float32))

    @triton.jit
    def _kv_bases(kc_ptr, vc_ptr, slot, h, stride_cs, stride_kh):
        """(K, V) base pointers of KV head h in one slot's caches."""
        return kc_ptr + slot * stride_cs + h * stride_kh, vc_ptr + slot * stride_cs + h * stride_kh

    @triton.jit
    def _online_softmax(s, v, m_i, l_i, acc):
        """One key tile of the online softmax (exp2 domain, fp32): scores s [M, N] (already scaled by
        log2(e)/sqrt(D), -inf at masked keys), values v [N, D]; returns the updated (m_i, l_i, acc).
        Source: FlashAttention-2 (Dao, 2023, arXiv 2307.08691), Algorithm 1."""
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        return m_new, l_i, acc

    @triton.jit
    def _store_partials(po_ptr, pm_ptr, pl_ptr, pbase, rows, acc, m_i, l_i, D: tl.constexpr):
        """Partial (acc, max, sum) of one split for ``_attn_combine_kernel`` (or the fused kernel's ticket merge)."""
        od = tl.arange(0, D)
        tl.store(po_ptr + (pbase + rows[:, None]) * D + od[None, :], acc)
        tl.store(pm_ptr + pbase + rows, m_i)
        tl.store(pl_ptr + pbase + rows, l_i)

    @triton.jit
    def _attn_split_kernel(
        q_ptr, kc_ptr, vc_ptr, len_ptr, po_ptr, pm_ptr, pl_ptr, T, qk_scale, stride_kh, stride_ks, stride_cs,
        NQ: tl.constexpr, D: tl.constexpr, G: tl.constexpr, T_PAD: tl.constexpr, MAXLEN: tl.constexpr,
        NSPLIT: tl.constexpr, BLOCK_N: tl.constexpr, MIN_KEYS: tl.constexpr, BLOCK_M: tl.constexpr,
        USE_PDL: tl.constexpr = False, NRB: tl.constexpr = 1, NKV: tl.constexpr = 1,
    ):
        """Program (h, split, slot·NRB + row block): BLOCK_M of the G·T_PAD query rows of KV head h of one slot
        (query rows slot·T + t, cache at + slot·stride_cs, partials of (slot, h) at row slot·NKV + h) over one
        key range."""
        M: tl.constexpr = G * T_PAD
        h, sp, rb, P, nsp, start, end, rows, g, t, slot = _split_range(len_ptr, T, NSPLIT, MIN_KEYS, BLOCK_N,
                                                                       BLOCK_M, T_PAD, USE_PDL, NRB)
        if sp >= nsp:
            return
        od = tl.arange(0, D)
        q = tl.load(q_ptr + ((slot * T + t[:, None]) * NQ + h * G + g[:, None]) * D + od[None, :],
                    mask=(t < T)[:, None], other=0.0)
        m_i, l_i, acc = _empty_state(BLOCK_M, D)
        kbase, vbase = _kv_bases(kc_ptr, vc_ptr, slot, h, stride_cs, stride_kh)
        for n0 in range(start, end, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            nm = offs_n < end
            k = tl.load(kbase + offs_n[None, :] * stride_ks + od[:, None], mask=nm[None, :], other=0.0)
            s = tl.where(nm[None, :], tl.dot(q, k) * qk_scale, float("-inf"))
            v = tl.load(vbase + offs_n[:, None] * stride_ks + od[None, :], mask=nm[:, None], other=0.0)
            m_i, l_i, acc = _online_softmax(s, v, m_i, l_i, acc)
        _store_partials(po_ptr, pm_ptr, pl_ptr, ((slot * NKV + h) * NSPLIT + sp) * M, rows, acc, m_i, l_i, D)

    @triton.jit
    def _attn_combine_kernel(
        po_ptr, pm_ptr, pl_ptr, o_ptr, len_ptr, T,
        NQ: tl.constexpr, D: tl.constexpr, G: tl.constexpr, T_PAD: tl.constexpr, NSPLIT: tl.constexpr,
        MIN_KEYS: tl.constexpr, USE_PDL: tl.constexpr = False, NKV: tl.constexpr = 1,
    ):
        """Program (query head qh, row r = slot·T + t): merges the splits of (slot, qh // G) into o[r]."""
        if USE_PDL:
            gdc_launch_dependents()
            gdc_wait()
        qh = tl.program_id(0)
        r = tl.program_id(1)
        slot = r // T
        t = r % T
        h = slot * NKV + qh // G
        g = qh % G
        M: tl.constexpr = G * T_PAD
        row = g * T_PAD + t
        sidx = tl.arange(0, NSPLIT)
        od = tl.arange(0, D)
        base = (h * NSPLIT + sidx) * M + row
        nsp = _num_splits(tl.load(len_ptr + slot) + T, NSPLIT, MIN_KEYS)
        sm = sidx < nsp
        m = tl.load(pm_ptr + base, mask=sm, other=float("-inf"))
        l = tl.load(pl_ptr + base, mask=sm, other=0.0)
        mx = tl.max(m, axis=0)
        wgt = tl.exp2(m - mx)  # empty splits: exp2(-inf) = 0
        den = tl.sum(wgt * l, axis=0)
        acc = tl.load(po_ptr + base[:, None] * D + od[None, :], mask=sm[:, None], other=0.0)
        o = tl.sum(acc * wgt[:, None], axis=0) / den
        tl.store(o_ptr + r * (NQ * D) + qh * D + od, o.to(o_ptr.dtype.element_ty))

    @triton.jit
    def _norm_rope_rows(row_ptr, rmask, pos, w_ptr, cos_ptr, sin_ptr, eps, D: tl.constexpr, ROT: tl.constexpr):
        """RMSNorm (weight w_ptr [D]) + partial NeoX RoPE at positions ``pos`` [R] of the R rows starting at
        ``row_ptr`` [R], in fp32 as three column pieces: [R, ROT/2] x2 (the rotated halves) and [R, D-ROT];
        rows with ``rmask`` False give 0. Same operation order as ``_qk_norm_rope_kv_kernel``."""
        HALF: tl.constexpr = ROT // 2
        oh = tl.arange(0, HALF)
        orr = tl.arange(0, D - ROT)
        m = rmask[:, None]
        x1 = tl.load(row_ptr[:, None] + oh[None, :], mask=m, other=0.0).to(tl.float32)
        x2 = tl.load(row_ptr[:, None] + HALF + oh[None, :], mask=m, other=0.0).to(tl.float32)
        xr = tl.load(row_ptr[:, None] + ROT + orr[None, :], mask=m, other=0.0).to(tl.float32)
        ss = tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1) + tl.sum(xr * xr, axis=1)
        r = tl.rsqrt(ss / D + eps)[:, None]
        x1 = x1 * r * tl.load(w_ptr + oh).to(tl.float32)[None, :]
        x2 = x2 * r * tl.load(w_ptr + HALF + oh).to(tl.float32)[None, :]
        xr = xr * r * tl.load(w_ptr + ROT + orr).to(tl.float32)[None, :]
        tab = pos[:, None] * HALF + oh[None, :]
        c = tl.load(cos_ptr + tab, mask=m, other=1.0)
        sn = tl.load(sin_ptr + tab, mask=m, other=0.0)
        return x1 * c - x2 * sn, x2 * c + x1 * sn, xr


def _slots(k_cache, v_cache, rows: int, cache_len, what: str):
    """(S, T, slot stride) of caches [NKV, MAXLEN, D] (S = 1, stride 0) or [S, NKV, MAXLEN, D] for ``rows``
    query rows (S·T); raises ValueError when rows, caches and cache_len [>= S] do not fit together."""
    S = k_cache.shape[0] if k_cache.dim() == 4 else 1
    if (k_cache.dim() not in (3, 4) or k_cache.shape != v_cache.shape or rows % S
            or cache_len.numel() < S or cache_len.dtype != torch.int32):
        raise ValueError(f"{what}: {rows} query rows, caches {tuple(k_cache.shape)} / {tuple(v_cache.shape)} and "
                         f"cache_len {tuple(cache_len.shape)} {cache_len.dtype} do not fit (want caches [NKV, "
                         f"MAXLEN, D] or [S, NKV, MAXLEN, D], S·T rows, int32 cache_len [S])")
    return S, rows // S, (k_cache.stride(0) if k_cache.dim() == 4 else 0)


def qk_norm_rope_kv(qkv, q_w, k_w, cos, sin, cache_len, q_out, k_cache, v_cache, nq, nkv, rot=64, eps=1e-6):
    """qkv [T, (nq+2nkv)·D]; writes q_out [T, nq, D], k_cache/v_cache [nkv, MAXLEN, D] rows [P, P+T).

    Slot axis: qkv [S·T, …], q_out [S·T, nq, D], caches [S, nkv, MAXLEN, D], cache_len [S]: slot s's K/V rows
    go to rows [P_s, P_s + T) of its cache. Raises ValueError when the shapes do not fit together."""
    D = q_out.shape[-1]
    S, T, stride_cs = _slots(k_cache, v_cache, qkv.shape[0], cache_len, "qk_norm_rope_kv")
    assert qkv.stride(1) == 1 and k_cache.is_contiguous() and v_cache.is_contiguous()
    _qk_norm_rope_kv_kernel[(S * T, nq + 2 * nkv)](
        qkv, q_w, k_w, cos, sin, cache_len, q_out, k_cache, v_cache, qkv.stride(0), eps, stride_cs,
        NQ=nq, NKV=nkv, D=D, ROT=rot, MAXLEN=k_cache.shape[-2], TB=T, num_warps=1,
        **pdl(),
    )
    return q_out


class AttnWorkspace:
    """Split-KV partials for T queries: o [NKV, NSPLIT, G·T_PAD, D] fp32, m/l [NKV, NSPLIT, G·T_PAD] (with
    ``slots`` S > 1: [S·NKV, …], row s·NKV + h for KV head h of slot s); for
    :func:`.attention_fused.block_attention_fused`, int32 ticket counters ``tickets`` [NKV, G·T_PAD / block_m]
    (zeros) and ``fused_combine``: "ticket" (combine inside the fused kernel, one launch; default) or "kernel"
    (the fused kernel stores partials and ``_attn_combine_kernel`` merges them, two launches).

    At run time the number of splits in use is min(NSPLIT, cdiv(P + T, min_keys)) (device-side), so short
    caches use few programs and little partial traffic; the rest of the grid exits at once.
    """

    def __init__(self, T, nq, nkv, d, device, nsplit=32, block_n=64, num_warps=8, num_stages=2, min_keys=256,
                 block_m=None, slots=1):
        self.T, self.T_PAD, self.slots = T, max(16, next_pow2(T)), slots
        self.min_keys = min_keys
        self.block_m = block_m or (nq // nkv) * self.T_PAD
        self.nsplit, self.block_n, self.num_warps, self.num_stages = nsplit, block_n, num_warps, num_stages
        M = (nq // nkv) * self.T_PAD
        self.po = torch.zeros(slots * nkv, nsplit, M, d, dtype=torch.float32, device=device)
        self.pm = torch.zeros(slots * nkv, nsplit, M, dtype=torch.float32, device=device)
        self.pl = torch.zeros(slots * nkv, nsplit, M, dtype=torch.float32, device=device)
        # block_attention_fused: per-(KV head, row block) split counters; zero between calls (the last split resets)
        self.tickets = torch.zeros(nkv, M // self.block_m, dtype=torch.int32, device=device)
        self.fused_combine = "ticket"  # or "kernel": block_attention_fused combines with _attn_combine_kernel


def block_attention(q, k_cache, v_cache, cache_len, out, ws: AttnWorkspace, scale=None, seq_major=False):
    """q [T, NQ, D]; caches [NKV, MAXLEN, D] (or [MAXLEN, NKV, D] with seq_major, same strides for k and v;
    the last dim contiguous); cache_len int32 [1] (device); out [T, NQ·D] (written).

    Slot axis: q [S·T, NQ, D], caches [S, NKV, MAXLEN, D], cache_len [S], out [S·T, NQ·D], ``ws`` built with
    ``slots >= S``: slot s's queries attend to keys [0, P_s + T) of its own cache, split by its own P_s.
    Raises ValueError when the shapes or the workspace do not fit."""
    NQ, D = q.shape[1], q.shape[2]
    if seq_major:
        MAXLEN, NKV, _ = k_cache.shape
        shd, ssq = k_cache.stride(1), k_cache.stride(0)
        S, T, scs = 1, q.shape[0], 0
    else:
        S, T, scs = _slots(k_cache, v_cache, q.shape[0], cache_len, "block_attention")
        NKV, MAXLEN, _ = k_cache.shape[-3:]
        shd, ssq = k_cache.stride(-3), k_cache.stride(-2)
    if S > ws.slots or T > ws.T_PAD or ws.po.shape[0] < S * NKV:
        raise ValueError(f"block_attention: workspace for {ws.slots} slot(s) of T={ws.T}, not {S} of T={T}")
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1 and q.is_contiguous()
    G = NQ // NKV
    nrb = (G * ws.T_PAD) // ws.block_m
    scale = scale if scale is not None else 1.0 / math.sqrt(D)
    _attn_split_kernel[(NKV, ws.nsplit, S * nrb)](
        q, k_cache, v_cache, cache_len, ws.po, ws.pm, ws.pl, T, scale * 1.4426950408889634, shd, ssq, scs,
        NQ=NQ, D=D, G=G, T_PAD=ws.T_PAD, MAXLEN=MAXLEN, NSPLIT=ws.nsplit, BLOCK_N=ws.block_n,
        MIN_KEYS=ws.min_keys, BLOCK_M=ws.block_m, NRB=nrb, NKV=NKV, num_warps=ws.num_warps,
        num_stages=ws.num_stages, **pdl(),
    )
    _attn_combine_kernel[(NQ, S * T)](ws.po, ws.pm, ws.pl, out, cache_len, T, NQ=NQ, D=D, G=G, T_PAD=ws.T_PAD,
                                      NSPLIT=ws.nsplit, MIN_KEYS=ws.min_keys, NKV=NKV, num_warps=4, **pdl())
    return out


# --------------------------------------------------------------------------------------------------
# Adapter for the engine model's attention seam (repro/engine/layers/attention.py)
# --------------------------------------------------------------------------------------------------

_SEAM_WS: dict = {}


def attention_forward_triton(q, k, v, q_start: int, block_size: int):
    """Contract of ``repro.engine.layers.attention.attention_torch`` (block-causal GQA, fp32 softmax).

    q [n, Hq, d]; k, v [S, Hkv, d] at positions 0..S-1. Uses the split-KV kernel when every key is visible
    to every query (one chunk of at most one block starting on a block boundary, S == q_start + n: the
    denoising/commit forwards) on CUDA (or under the interpreter); otherwise (multi-block prefill) the
    torch implementation. Returns [n, Hq, d] in q's dtype.
    """
    from ._triton import kernels_usable

    n, hq, d = q.shape
    S, hkv, _ = k.shape
    full_visible = q_start % block_size == 0 and n <= block_size and S == q_start + n
    if (not full_visible or not kernels_usable(q) or k.stride(2) != 1 or k.stride() != v.stride()
            or hq % hkv or d & (d - 1)):
        from repro.engine.layers.attention import attention_torch

        return attention_torch(q, k, v, q_start, block_size)
    # inference-mode tensors cannot be updated in place outside inference mode (and vice versa): one
    # workspace per mode
    key = (n, hq, hkv, d, str(q.device), torch.is_inference_mode_enabled())
    ws = _SEAM_WS.get(key)
    if ws is None:
        ws = _SEAM_WS[key] = AttnWorkspace(n, hq, hkv, d, q.device, nsplit=32, block_n=min(64, max(16, d // 2)),
                                           num_warps=4, num_stages=2, min_keys=64, block_m=None)
        ws.cl = torch.zeros(1, dtype=torch.int32, device=q.device)
    cl = ws.cl.fill_(q_start)  # a fill kernel with a scalar argument: no host<->device copy or sync
    out = torch.empty(n, hq * d, dtype=q.dtype, device=q.device)
    block_attention(q.contiguous(), k, v, cl, out, ws, seq_major=True)
    return out.view(n, hq, d)


def register_with_seam(select: bool = True) -> None:
    """Register :func:`attention_forward_triton` as attention impl "triton" in the engine seam (and select it)."""
    from repro.engine.layers import attention as seam

    seam.register_attention_impl("triton", attention_forward_triton)
    if select:
        seam.set_attention_impl("triton")
