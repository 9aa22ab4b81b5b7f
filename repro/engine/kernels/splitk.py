"""Split-K GEMM of a few rows (T <= 128) with a fixed-order reduction and fused epilogues, beside its references.

The single-request round's QKV and O projections are skinny GEMMs ``y = x · Wᵀ`` (x [T, K] with T = 32 rows,
W [N, K] in the model dtype): memory-bound (QKV 12.6 MB, O 8.4 MB at the LLaDA2.1-mini shape) but latency-bound at
these sizes (docs/perf.md "Session 6: the per-layer small kernels at batch 1"). Here the K axis is split over
``SPLIT`` programs per BLOCK_N-column tile, so that >= 132 programs each stream one (BLOCK_N x K/SPLIT) slice of W
with all of its loads in flight at once; every program stores its fp32 partial tile and takes a ticket on the
tile's counter; the program that takes the last ticket sums the SPLIT partials **in split order 0, 1, ...** (so the
result does not depend on which program finishes last: deterministic, run to run) and applies the epilogue, then
resets the counter to 0 (the next launch finds zeros: CUDA-graph safe, no memset). Source of the pattern: the
"threadfence reduction" of the CUDA samples (a CTA barrier, then a release/acquire ticket).

Epilogues (``EPI``):

* 0 ``store``: ``out = y.to(out.dtype)`` (a plain linear layer).
* 1 ``add``: ``out = (out.float() + y).to(out.dtype)`` (the residual add of the O projection into h, one rounding
  like ``torch.addmm_``); optionally (``router``) also the MoE router's partial logits of the new h, one K split
  per column tile (the router GEMM of ``route.moe_route_align`` folded into this epilogue).
* 2 ``qk_rope_kv`` (BLOCK_N = head_dim D: one head per column tile): y is rounded to the model dtype (the ``qkv``
  buffer of the unfused path), then QK-norm (RMSNorm over D, fp32) + partial NeoX RoPE on the first ROT channels
  at position P + t for q and k heads, written to ``q_out`` [T, NQ, D] and to the K cache rows [P, P+T); v heads go
  to the V cache as they are: the operation of :func:`.attention.qk_norm_rope_kv` with the same fp32 operation
  order, so the result differs from the unfused path (cuBLAS QKV + that kernel) only where the two GEMMs' fp32
  summation orders round y to different bf16 values.

References: :func:`splitk_linear_reference` (fp32 GEMM, one rounding) and :func:`splitk_qkv_reference`
(``attention.qk_norm_rope_reference`` of the rounded GEMM).
"""
from __future__ import annotations

import torch

from ._triton import HAS_TRITON, gdc_launch_dependents, gdc_wait, next_pow2, pdl, tl, triton

__all__ = ["SplitKWorkspace", "splitk_linear", "splitk_qkv_rope_kv", "splitk_linear_reference",
           "splitk_qkv_reference", "router_partials_reference", "DEFAULT_SPLITK", "SPLITK_TILES", "fit_tiles"]

#: launch configs at the LLaDA2.1-mini shape (K = 2048): QKV 24 head tiles x 8 splits = 192 programs, O 32 x 8 = 256
DEFAULT_SPLITK = {
    "qkv": dict(SPLIT=8, BLOCK_K=64, num_warps=4, num_stages=4),
    "o": dict(SPLIT=8, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=4),
}

#: named tile sets (the ``splitk_tiles`` option of ``fastpath.BlockForward``; timed by ``bench round``)
SPLITK_TILES = {
    "default": DEFAULT_SPLITK,
    "s16": {"qkv": dict(SPLIT=16, BLOCK_K=64, num_warps=4, num_stages=2),
            "o": dict(SPLIT=16, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=2)},
    "s4": {"qkv": dict(SPLIT=4, BLOCK_K=64, num_warps=4, num_stages=4),
           "o": dict(SPLIT=4, BLOCK_N=32, BLOCK_K=64, num_warps=4, num_stages=4)},
    # the whole K slice of a program in one load, issued before the PDL wait (pays with PDL on)
    "pre": {"qkv": dict(SPLIT=8, BLOCK_K=256, PRELOAD=True, num_warps=8, num_stages=1),
            "o": dict(SPLIT=8, BLOCK_N=64, BLOCK_K=256, PRELOAD=True, num_warps=4, num_stages=1)},
    # O in 16 column tiles (128 programs): 16 router partials with router_in_o, as many as the router GEMM's SPLIT_K
    "o128": {"qkv": DEFAULT_SPLITK["qkv"], "o": dict(SPLIT=8, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=4)},
}

_EPI = {"store": 0, "add": 1, "qk_rope_kv": 2}


def fit_tiles(cfg: dict, K: int, N: int) -> dict:
    """``cfg`` made to fit a (K, N) GEMM: BLOCK_N at most N, BLOCK_K halved (down to 16), then SPLIT halved, until
    SPLIT·BLOCK_K divides K (small test shapes reuse the full-size tiles this way); with PRELOAD, BLOCK_K = K / SPLIT.
    Returns a new dict."""
    c = dict(cfg)
    if "BLOCK_N" in c:
        c["BLOCK_N"] = min(int(c["BLOCK_N"]), next_pow2(N))
    while K % (c["SPLIT"] * c["BLOCK_K"]) and (c["BLOCK_K"] > 16 or c["SPLIT"] > 1):
        if c["BLOCK_K"] > 16:
            c["BLOCK_K"] //= 2
        else:
            c["SPLIT"] //= 2
    if c.get("PRELOAD"):  # one K step per program: BLOCK_K = K / SPLIT, at least 16 (fewer splits if needed)
        while c["SPLIT"] > 1 and K // c["SPLIT"] < 16:
            c["SPLIT"] //= 2
        c["BLOCK_K"] = K // c["SPLIT"]
    return c


def splitk_linear_reference(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None,
                            mode: str = "store") -> torch.Tensor:
    """``x`` [T, K] · ``w`` [N, K]ᵀ in fp32, plus ``out`` (mode "add"), rounded once to the output dtype
    (``out``'s, else x's). Returns a new tensor [T, N]."""
    y = x.float() @ w.float().t()
    if mode == "add":
        y = y + out.float()
    return y.to(out.dtype if out is not None else x.dtype)


def splitk_qkv_reference(x, wqkv, q_w, k_w, pos0, cos, sin, nq, nkv, rot, eps):
    """(q [T, nq, D], k [T, nkv, D], v [T, nkv, D]) fp32 of the fused QKV epilogue: the fp32 GEMM rounded to x's
    dtype, then :func:`.attention.qk_norm_rope_reference` at positions pos0 + t."""
    from .attention import qk_norm_rope_reference

    qkv = (x.float() @ wqkv.float().t()).to(x.dtype)
    return qk_norm_rope_reference(qkv, q_w, k_w, pos0, cos, sin, nq, nkv, d=wqkv.shape[0] // (nq + 2 * nkv),
                                  rot=rot, eps=eps)


class SplitKWorkspace:
    """fp32 partials ``part`` [max_split, T_PAD, n_max], int32 tile tickets ``tickets`` [n_max] (zeros; each
    launch leaves them at zero) and a scratch ``dummy`` (the router prefetch's sums) for skinny GEMMs of up to ``T`` rows and ``n_max`` output columns. Launches that use
    one workspace must run one after another on a stream (they share the buffers)."""

    def __init__(self, T: int, n_max: int, max_split: int, device):
        self.T, self.T_PAD, self.n_max, self.max_split = T, max(16, next_pow2(T)), n_max, max_split
        self.part = torch.zeros(max_split, self.T_PAD, n_max, dtype=torch.float32, device=device)
        self.tickets = torch.zeros(n_max, dtype=torch.int32, device=device)
        self.dummy = torch.zeros(n_max * max_split, dtype=torch.float32, device=device)  # router prefetch sums


if HAS_TRITON:

    @triton.jit
    def _sum_cols(part_ptr, rows, cols, N: tl.constexpr, T_PAD: tl.constexpr, SPLIT: tl.constexpr):
        """Σ_s part[s, rows, cols] in split order (fp32, read at L2: written by other programs)."""
        ptrs = part_ptr + rows[:, None] * N + cols[None, :]
        acc = tl.load(ptrs, cache_modifier=".cg")
        for s in tl.static_range(1, SPLIT):
            acc += tl.load(ptrs + s * (T_PAD * N), cache_modifier=".cg")
        return acc

    @triton.jit
    def _splitk_rows_kernel(
        x_ptr, w_ptr, part_ptr, cnt_ptr, out_ptr, T, stride_xt, stride_ot,
        qw_ptr, kw_ptr, cos_ptr, sin_ptr, len_ptr, kc_ptr, vc_ptr, eps, rw_ptr, nw_ptr, rpart_ptr,
        N: tl.constexpr, K: tl.constexpr, T_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        SPLIT: tl.constexpr, EPI: tl.constexpr, NQ: tl.constexpr = 1, NKV: tl.constexpr = 1, ROT: tl.constexpr = 2,
        MAXLEN: tl.constexpr = 1, ROUTER: tl.constexpr = False, E: tl.constexpr = 16, BLOCK_E: tl.constexpr = 16,
        PREC: tl.constexpr = "ieee", RPF: tl.constexpr = False, dummy_ptr=None, PRELOAD: tl.constexpr = False,
        USE_PDL: tl.constexpr = False,
    ):
        """Program (column tile n, split s): partial y[:, n-tile] over K range s; the last of the tile's SPLIT
        programs sums them in split order and runs epilogue EPI (module doc). EPI 2: out_ptr is q_out [T, NQ, D].
        ROUTER (EPI 1): also the router's partial logits of this column tile, rpart[n] = (out_new · nw[cols]) ·
        rw[:, cols]ᵀ in fp32 (PREC dots), for ``route.moe_route_select``; with RPF every split program first reads
        its E/SPLIT rows of that router tile (evict_last, a sum stored to ``dummy``), so that the last one finds the
        tile in L2. PRELOAD (BLOCK_K = K / SPLIT): the program's whole W slice is loaded in one piece before the
        PDL wait (weights are never written by an earlier launch), so with PDL its stream overlaps the previous
        kernel's tail; then one dot."""
        if USE_PDL:
            gdc_launch_dependents()
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        rows = tl.arange(0, T_PAD)
        rmask = rows < T
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        K_PER: tl.constexpr = K // SPLIT
        acc = tl.zeros((T_PAD, BLOCK_N), dtype=tl.float32)
        if ROUTER and RPF:  # issued before the K loop, consumed after it
            EP: tl.constexpr = E // SPLIT
            pe = pid_k * EP + tl.arange(0, EP)
            pw = tl.load(rw_ptr + pe[:, None] * N + cols[None, :], eviction_policy="evict_last")
        if PRELOAD:
            kk = pid_k * K_PER + offs_k
            b = tl.load(w_ptr + cols[None, :] * K + kk[:, None])
            if USE_PDL:
                gdc_wait()
            a = tl.load(x_ptr + rows[:, None] * stride_xt + kk[None, :], mask=rmask[:, None], other=0.0)
            acc = tl.dot(a, b.to(a.dtype), acc)
        else:
            if USE_PDL:
                gdc_wait()
            for k0 in range(0, K_PER, BLOCK_K):
                kk = pid_k * K_PER + k0 + offs_k
                a = tl.load(x_ptr + rows[:, None] * stride_xt + kk[None, :], mask=rmask[:, None], other=0.0)
                b = tl.load(w_ptr + cols[None, :] * K + kk[:, None])
                acc = tl.dot(a, b.to(a.dtype), acc)
        tl.store(part_ptr + pid_k * (T_PAD * N) + rows[:, None] * N + cols[None, :], acc)
        if ROUTER and RPF:
            tl.store(dummy_ptr + pid_n * SPLIT + pid_k, tl.sum(tl.sum(pw, axis=1), axis=0))
        tl.debug_barrier()  # every thread's partial stores precede the (release) ticket
        ticket = tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel")
        if ticket == SPLIT - 1:  # the other splits of this tile have stored theirs
            tl.atomic_xchg(cnt_ptr + pid_n, 0)
            if EPI == 2:
                D: tl.constexpr = BLOCK_N
                HALF: tl.constexpr = ROT // 2
                REST: tl.constexpr = D - ROT
                dt = x_ptr.dtype.element_ty
                oh = tl.arange(0, HALF)
                orr = tl.arange(0, REST)
                c0 = pid_n * D
                pos = tl.load(len_ptr) + rows
                m2 = rmask[:, None]
                if pid_n < NQ + NKV:
                    x1 = _sum_cols(part_ptr, rows, c0 + oh, N, T_PAD, SPLIT).to(dt).to(tl.float32)
                    x2 = _sum_cols(part_ptr, rows, c0 + HALF + oh, N, T_PAD, SPLIT).to(dt).to(tl.float32)
                    xr = _sum_cols(part_ptr, rows, c0 + ROT + orr, N, T_PAD, SPLIT).to(dt).to(tl.float32)
                    ss = tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1) + tl.sum(xr * xr, axis=1)
                    r = tl.rsqrt(ss / D + eps)[:, None]
                    is_q = pid_n < NQ
                    w1 = tl.where(is_q, tl.load(qw_ptr + oh), tl.load(kw_ptr + oh)).to(tl.float32)
                    w2 = tl.where(is_q, tl.load(qw_ptr + HALF + oh), tl.load(kw_ptr + HALF + oh)).to(tl.float32)
                    wr = tl.where(is_q, tl.load(qw_ptr + ROT + orr), tl.load(kw_ptr + ROT + orr)).to(tl.float32)
                    x1 = x1 * r * w1[None, :]
                    x2 = x2 * r * w2[None, :]
                    xr = xr * r * wr[None, :]
                    c = tl.load(cos_ptr + pos[:, None] * HALF + oh[None, :], mask=m2, other=0.0)
                    s = tl.load(sin_ptr + pos[:, None] * HALF + oh[None, :], mask=m2, other=0.0)
                    o1 = x1 * c - x2 * s
                    o2 = x2 * c + x1 * s
                    if pid_n < NQ:
                        dst = out_ptr + (rows[:, None] * NQ + pid_n) * D
                    else:
                        dst = kc_ptr + ((pid_n - NQ) * MAXLEN + pos[:, None]) * D
                    ty = out_ptr.dtype.element_ty
                    tl.store(dst + oh[None, :], o1.to(ty), mask=m2)
                    tl.store(dst + HALF + oh[None, :], o2.to(ty), mask=m2)
                    tl.store(dst + ROT + orr[None, :], xr.to(ty), mask=m2)
                else:
                    od = tl.arange(0, D)
                    v = _sum_cols(part_ptr, rows, c0 + od, N, T_PAD, SPLIT)
                    tl.store(vc_ptr + ((pid_n - NQ - NKV) * MAXLEN + pos[:, None]) * D + od[None, :],
                             v.to(vc_ptr.dtype.element_ty), mask=m2)
            else:
                y = _sum_cols(part_ptr, rows, cols, N, T_PAD, SPLIT)
                optr = out_ptr + rows[:, None] * stride_ot + cols[None, :]
                if EPI == 1:
                    y += tl.load(optr, mask=rmask[:, None], other=0.0).to(tl.float32)
                yo = y.to(out_ptr.dtype.element_ty)
                tl.store(optr, yo, mask=rmask[:, None])
                if ROUTER:  # rows >= T are zeros (masked loads above): their logits are 0
                    xs = tl.where(rmask[:, None], yo.to(tl.float32), 0.0) * tl.load(nw_ptr + cols).to(tl.float32)[None, :]
                    for e0 in tl.range(0, E, BLOCK_E, num_stages=1):  # not unrolled: that took 255 registers
                        offs_e = e0 + tl.arange(0, BLOCK_E)
                        wv = tl.load(rw_ptr + offs_e[None, :] * N + cols[:, None]).to(tl.float32)
                        lg = tl.dot(xs, wv, input_precision=PREC)
                        tl.store(rpart_ptr + pid_n * (T_PAD * E) + rows[:, None] * E + offs_e[None, :], lg)


def _check(x, w, ws: SplitKWorkspace, cfg: dict, block_n: int, what: str) -> tuple[int, int, int]:
    """(T, N, K) after checking shapes, strides, the workspace and the tiles; raises ValueError naming the misfit."""
    T, K = x.shape
    N = w.shape[0]
    split, bk = int(cfg["SPLIT"]), int(cfg["BLOCK_K"])
    if w.dim() != 2 or w.shape[1] != K or not w.is_contiguous() or x.stride(1) != 1:
        raise ValueError(f"{what}: x {tuple(x.shape)} (unit stride along K) and w [N, K] contiguous do not fit "
                         f"(w {tuple(w.shape)})")
    if split < 1 or K % (split * bk) or N % block_n or block_n & (block_n - 1) or bk & (bk - 1):
        raise ValueError(f"{what}: tiles SPLIT={split}, BLOCK_K={bk}, BLOCK_N={block_n} do not divide K={K}, N={N} "
                         f"(K must be a multiple of SPLIT·BLOCK_K and N of BLOCK_N, both tiles powers of two)")
    if cfg.get("PRELOAD") and bk * split != K:
        raise ValueError(f"{what}: PRELOAD loads the whole K slice at once: BLOCK_K must be K / SPLIT = {K // split}, "
                         f"not {bk}")
    if T > ws.T_PAD or N > ws.n_max or split > ws.max_split:
        raise ValueError(f"{what}: workspace for T<={ws.T_PAD}, N<={ws.n_max}, SPLIT<={ws.max_split}; got T={T}, "
                         f"N={N}, SPLIT={split} (build a larger SplitKWorkspace)")
    return T, N, K


def splitk_linear(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, ws: SplitKWorkspace, cfg: dict | None = None,
                  mode: str = "store", router: tuple | None = None, router_prefetch: bool = True) -> torch.Tensor:
    """``out`` [T, N] = x [T, K] · w [N, K]ᵀ (mode "store"), or ``out += x · wᵀ`` with one rounding (mode "add"),
    fp32 accumulation; x and w in the model dtype (fp32 under the interpreter), out any float dtype with unit stride
    along N. ``cfg``: SPLIT, BLOCK_N, BLOCK_K, num_warps, num_stages (default :data:`DEFAULT_SPLITK` ``"o"``).
    Deterministic (fixed split order).

    ``router`` (mode "add" only): ``(rw [E, N] fp32, nw [N], rpart [N / BLOCK_N, T_PAD, E] fp32, prec)``: the new
    ``out`` (the residual h) also goes through the MoE router as a K-split GEMM, one split per column tile:
    ``rpart[n] = (out · nw)[:, tile n] · rw[:, tile n]ᵀ`` (fp32, dots of precision ``prec``: "ieee" or "tf32x3";
    :func:`router_partials_reference`), the partial logits that ``route.moe_route_select(norm_w=nw, norm_out=...)``
    sums and scales by the RMSNorm factor — the router GEMM's launch saved. ``router_prefetch``: the split programs
    pull the router tile into L2 while they stream w (when E >= SPLIT). Raises ValueError for misfitting shapes,
    tiles, workspace, mode or router buffers."""
    cfg = {**DEFAULT_SPLITK["o"], **(cfg or {})}
    if mode not in ("store", "add"):
        raise ValueError(f"splitk_linear: mode {mode!r} is not 'store' or 'add'")
    T, N, K = _check(x, w, ws, cfg, int(cfg["BLOCK_N"]), "splitk_linear")
    if tuple(out.shape) != (T, N) or out.stride(1) != 1:
        raise ValueError(f"splitk_linear: out {tuple(out.shape)} is not [{T}, {N}] with unit stride along N")
    bn, split = int(cfg["BLOCK_N"]), int(cfg["SPLIT"])
    rkw, rw, nw, rpart = {}, x, x, ws.part
    if router is not None:
        rw, nw, rpart, prec = router
        E = rw.shape[0]
        if (mode != "add" or tuple(rw.shape) != (E, N) or not rw.is_contiguous() or rw.dtype != torch.float32
                or tuple(nw.shape) != (N,) or tuple(rpart.shape) != (N // bn, ws.T_PAD, E)
                or rpart.dtype != torch.float32 or not rpart.is_contiguous() or E & (E - 1) or E < 16
                or prec not in ("ieee", "tf32x3", "tf32")):
            raise ValueError(f"splitk_linear: router needs mode 'add', rw fp32 [E, {N}] (E a power of two >= 16), "
                             f"nw [{N}], rpart fp32 [{N // bn}, {ws.T_PAD}, E], prec ieee/tf32/tf32x3; got rw "
                             f"{tuple(rw.shape)} {rw.dtype}, rpart {tuple(rpart.shape)}, prec {prec!r}")
        rkw = dict(ROUTER=True, E=E, BLOCK_E=min(64, E), PREC=prec, RPF=bool(router_prefetch) and E >= split,
                   dummy_ptr=ws.dummy)
    _splitk_rows_kernel[(N // bn, split)](
        x, w, ws.part, ws.tickets, out, T, x.stride(0), out.stride(0),
        x, x, x, x, ws.tickets, x, x, 0.0, rw, nw, rpart,
        N=N, K=K, T_PAD=ws.T_PAD, BLOCK_N=bn, BLOCK_K=int(cfg["BLOCK_K"]), SPLIT=split, EPI=_EPI[mode],
        PRELOAD=bool(cfg.get("PRELOAD", False)), num_warps=int(cfg["num_warps"]), num_stages=int(cfg["num_stages"]),
        **rkw, **pdl(),
    )
    return out


def router_partials_reference(h: torch.Tensor, nw: torch.Tensor, rw: torch.Tensor, block_n: int) -> torch.Tensor:
    """Partial router logits [N / block_n, T, E] fp32 of ``splitk_linear(router=...)``: column tile n of
    (h.float() · nw) times rw[:, tile n]ᵀ, in fp32. Their sum over n, times rsqrt(mean h² + eps), are the router
    logits of RMSNorm(h)·nw (``route.route_reference``)."""
    xs = h.float() * nw.float()
    T, N = xs.shape
    return torch.einsum("tnb,enb->nte", xs.view(T, N // block_n, block_n), rw.float().view(-1, N // block_n, block_n))


def splitk_qkv_rope_kv(x, wqkv, ws: SplitKWorkspace, q_w, k_w, cos, sin, cache_len, q_out, k_cache, v_cache,
                       nq: int, nkv: int, rot: int, eps: float, cfg: dict | None = None):
    """The QKV projection with QK-norm + RoPE + KV write as its epilogue (EPI 2, module doc): the work of
    ``torch.mm(x, wqkv.t())`` + :func:`.attention.qk_norm_rope_kv` in one launch.

    x [T, H] (model dtype; the attention RMSNorm output); wqkv [(nq + 2·nkv)·D, H]; q_w, k_w [D]; cos, sin
    [>= MAXLEN, rot/2] fp32 (:func:`.attention.rope_tables`); cache_len int32 [1] on device (P); q_out [T, nq, D]
    contiguous (written); k_cache, v_cache [nkv, MAXLEN, D] contiguous (rows [P, P+T) written). ``cfg``: SPLIT,
    BLOCK_K, num_warps, num_stages (default :data:`DEFAULT_SPLITK` ``"qkv"``; BLOCK_N is D). Returns q_out.
    Raises ValueError when shapes, tiles or the workspace do not fit (rot/2 and D - rot must be powers of two)."""
    cfg = {**DEFAULT_SPLITK["qkv"], **(cfg or {})}
    D = q_out.shape[-1]
    T, N, K = _check(x, wqkv, ws, cfg, D, "splitk_qkv_rope_kv")
    half, rest = rot // 2, D - rot
    if (N != (nq + 2 * nkv) * D or tuple(q_out.shape) != (T, nq, D) or not q_out.is_contiguous()
            or tuple(k_cache.shape[::2]) != (nkv, D) or k_cache.shape != v_cache.shape
            or not (k_cache.is_contiguous() and v_cache.is_contiguous()) or rot % 2 or half < 1 or rest < 1
            or half & (half - 1) or rest & (rest - 1) or cos.shape != sin.shape or cos.shape[-1] != half
            or cos.shape[0] < k_cache.shape[1] or cache_len.dtype != torch.int32):
        raise ValueError(f"splitk_qkv_rope_kv: wqkv {tuple(wqkv.shape)}, q_out {tuple(q_out.shape)}, caches "
                         f"{tuple(k_cache.shape)}, cos {tuple(cos.shape)} do not fit nq={nq}, nkv={nkv}, rot={rot} "
                         f"(contiguous q_out [T, nq, D], caches [nkv, MAXLEN, D], int32 cache_len)")
    _splitk_rows_kernel[(N // D, int(cfg["SPLIT"]))](
        x, wqkv, ws.part, ws.tickets, q_out, T, x.stride(0), 0,
        q_w, k_w, cos, sin, cache_len, k_cache, v_cache, eps, x, x, x,
        N=N, K=K, T_PAD=ws.T_PAD, BLOCK_N=D, BLOCK_K=int(cfg["BLOCK_K"]), SPLIT=int(cfg["SPLIT"]), EPI=2,
        NQ=nq, NKV=nkv, ROT=rot, MAXLEN=k_cache.shape[1], PRELOAD=bool(cfg.get("PRELOAD", False)),
        num_warps=int(cfg["num_warps"]),
        num_stages=int(cfg["num_stages"]), **pdl(),
    )
    return q_out
