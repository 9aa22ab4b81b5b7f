"""Router GEMM and route/align in ONE launch, beside the two-kernel path of :mod:`.route`.

:func:`moe_route_align_fused` has the contract of :func:`.route.moe_route_align` (same arguments, same results in
the :class:`~.route.MoEWorkspace`: ids, weights, per-expert pair lists, active list, normalised rows, tile table)
and computes the same numbers: the split-K partial logits come from the same code with the same tiles
(``route._router_partial``, the router config's BLOCK_E x SPLIT_K x BLOCK_K x ROWS), they are added in split order
0, 1, ... from 0 as ``_route_select_kernel`` adds them, r = rsqrt(mean h² + eps) and the normalised rows come from
the same helper (``route._rms_row``), and every later step is either elementwise (x r, sigmoid, + bias) or exact
(max, the one-hot gathers), except the renormalising sum of the TOPK weights (``tl.sum`` over [.., TOPK] as the
select kernel's). So the routing ids are bit-identical to the two-kernel path and the weights are too under the
interpreter (tested); on the GPU the two reductions over a row (Σh², Σ weights) may take another tree when the
fused kernel's warps differ from the select kernel's (a last-bit change, as between any two router tiles).

One launch, grid (E / BLOCK_E, SPLIT_K, row blocks), three phases chained by ticket counters (``tl.atomic_add`` with
``sem="acq_rel"`` after a CTA barrier; the program that takes the last ticket continues, and resets the counter to
0 for the next launch, so graph replays need no memset). No program ever waits for another, so nothing can
deadlock and the interpreter (programs run one after another) runs it as is.

1. Every program: its router partial [ROWS, BLOCK_E] for split pid_k, stored as the router kernel stores it. With
   the RMSNorm folded in (``norm_w``), the programs of each *unit* also compute r of the unit's rows (one row each,
   in turn) from the full row of h; unit 0 also writes the normalised rows (``norm_out``).
2. A *unit* is U = max(BLOCK_E, E / n_group) experts: whole groups and whole expert tiles. The last of its
   SPLIT_K·U/BLOCK_E programs sums the unit's partials in split order, scales by r, takes sigmoid and bias, and per
   group and row writes the group score (sum of the two largest biased scores) and the group's CAND = min(top_k,
   group size) best experts (int64 keys of ``route._desc_key``: biased score descending, then expert index
   ascending), and the unit's unbiased scores.
3. The last unit of a row block selects for its rows: top ``topk_group`` groups by score, then the top_k keys
   among the kept groups' candidates (the top_k of all kept experts are among them: a group holds at most top_k
   of them, and its candidates are its best CAND), renormalises x scale, stores ids / weights and appends the
   pairs to the per-expert lists (relaxed atomics). With ``tile_block_m`` the last row block also writes the tile
   table (``route._fill_tiles``).

Results never depend on which program finishes last: every sum is read back from memory in a fixed order.
Measured figures and the choice between the paths: docs/perf.md "Router + route in one launch, attention in one launch"; the path is chosen by the router
config's ``FUSED`` key (``BlockForward.fused_route`` / ``BatchedBlockForward.fused_route``).
"""
from __future__ import annotations

import math

import torch

from ._triton import HAS_TRITON, gdc_launch_dependents, gdc_wait, next_pow2, pdl, tl, triton  # noqa: F401
from .route import MoEWorkspace, _clear_counts, _router_tiles, _tile_buffer

if HAS_TRITON:
    from .route import _append_pairs, _desc_key, _fill_tiles, _rms_row, _router_partial

__all__ = ["moe_route_align_fused", "FusedRouteBuffers"]

if HAS_TRITON:

    @triton.jit
    def _unit_candidates(part_ptr, bias_ptr, rbuf_ptr, gsc_ptr, ckey_ptr, sc_ptr, u, offs_t, T,
                         E: tl.constexpr, T_PAD: tl.constexpr, SPLIT_K: tl.constexpr, U: tl.constexpr,
                         N_GROUP: tl.constexpr, CAND: tl.constexpr, ROWS: tl.constexpr, HAS_BIAS: tl.constexpr,
                         NORM: tl.constexpr, RTOT: tl.constexpr, SPLIT_CHUNK: tl.constexpr):
        """Phase 2 for unit u and the rows ``offs_t`` [ROWS]: logits = Σ_s part[s] (split order, from 0), x r, sigmoid
        (``sc[t, e]``, the unbiased scores the weights are gathered from), + bias; per group of the unit and row the
        group score m1 + m2 (``gsc[t, g]``) and the keys of its CAND best experts in key order (``ckey[t, g·CAND +
        i]``; each step one max). Partials and r are read at L2 (``.cg``: other programs wrote them)."""
        GS: tl.constexpr = E // N_GROUP
        UG: tl.constexpr = U // GS
        NEG: tl.constexpr = float("-inf")
        KEY_MIN: tl.constexpr = -(2139095041 << 32) - 1  # below the key of -inf (_desc_key) at any index
        NC: tl.constexpr = N_GROUP * CAND
        ucols = u * U + tl.arange(0, U)
        rm = (offs_t < T_PAD)[:, None]
        logits = tl.zeros((ROWS, U), dtype=tl.float32)
        SCH: tl.constexpr = SPLIT_K if SPLIT_K < SPLIT_CHUNK else SPLIT_CHUNK
        for s0 in range(0, SPLIT_K, SCH):  # SCH splits' loads in flight at a time (registers), added in order
            for s1 in tl.static_range(SCH):
                logits += tl.load(part_ptr + (s0 + s1) * (T_PAD * E) + offs_t[:, None] * E + ucols[None, :], mask=rm,
                                  other=0.0, cache_modifier=".cg")
        if NORM:
            r = tl.load(rbuf_ptr + u * RTOT + offs_t, mask=offs_t < T, other=1.0, cache_modifier=".cg")
            logits = logits * r[:, None]
        scores = tl.sigmoid(logits)
        tl.store(sc_ptr + offs_t[:, None] * E + ucols[None, :], scores)
        if HAS_BIAS:
            biased = scores + tl.load(bias_ptr + ucols)[None, :]
        else:
            biased = scores
        b3 = tl.reshape(biased, (ROWS, UG, GS))
        m1 = tl.max(b3, axis=2)
        is1 = b3 == m1[:, :, None]
        n1 = tl.sum(is1.to(tl.int32), axis=2)
        m2 = tl.where(n1 > 1, m1, tl.max(tl.where(is1, NEG, b3), axis=2))  # drop one occurrence of the largest
        gcols = u * UG + tl.arange(0, UG)
        tl.store(gsc_ptr + offs_t[:, None] * N_GROUP + gcols[None, :], m1 + m2)
        key3 = tl.reshape(_desc_key(biased, ucols[None, :], E), (ROWS, UG, GS))
        cbase = offs_t[:, None] * NC + gcols[None, :] * CAND
        for i in tl.static_range(CAND):
            km = tl.max(key3, axis=2)
            tl.store(ckey_ptr + cbase + i, km)
            key3 = tl.where(key3 == km[:, :, None], KEY_MIN, key3)

    @triton.jit
    def _select_rows(gsc_ptr, ckey_ptr, sc_ptr, offs_t, E: tl.constexpr, N_GROUP: tl.constexpr,
                     TOPK_GROUP: tl.constexpr, TOPK: tl.constexpr, CAND: tl.constexpr, ROWS: tl.constexpr,
                     SCALE: tl.constexpr, RENORM: tl.constexpr):
        """Phase 3 for the rows ``offs_t``: (ids [ROWS, TOPK] int32, weights [ROWS, TOPK] fp32) from the group scores
        and candidates of phase 2, with the select kernel's rules (groups and experts by int64 key maxima; ties to
        the lower index) and its renormalisation x SCALE. Each top-k step is one max: the candidates' keys carry
        their position c instead of the expert (same order: equal scores fall in one group sorted by expert, or in
        groups ordered like their experts); the experts and their scores are gathered after the loop."""
        KEY_MIN: tl.constexpr = -(2139095041 << 32) - 1
        HIGH: tl.constexpr = -(1 << 32)  # the value bits of a key
        NC: tl.constexpr = N_GROUP * CAND
        gidx = tl.arange(0, N_GROUP)
        cidx = tl.arange(0, NC)
        gkey = _desc_key(tl.load(gsc_ptr + offs_t[:, None] * N_GROUP + gidx[None, :], cache_modifier=".cg"),
                         gidx[None, :], N_GROUP)
        ck = tl.load(ckey_ptr + offs_t[:, None] * NC + cidx[None, :], cache_modifier=".cg")
        keep = tl.zeros((ROWS, N_GROUP), dtype=tl.int32)
        for _ in tl.static_range(TOPK_GROUP):
            hit = gkey == tl.max(gkey, axis=1)[:, None]
            keep = tl.where(hit, 1, keep)
            gkey = tl.where(hit, KEY_MIN, gkey)
        keepc = tl.reshape(tl.broadcast_to(keep[:, :, None], (ROWS, N_GROUP, CAND)), (ROWS, NC))
        key = tl.where(keepc != 0, (ck & HIGH) | (NC - 1 - cidx[None, :]).to(tl.int64), KEY_MIN)
        kidx = tl.arange(0, TOPK)[None, :]
        pos = tl.zeros((ROWS, TOPK), dtype=tl.int32)
        for i in tl.static_range(TOPK):
            km = tl.max(key, axis=1)
            pos = tl.where(kidx == i, (NC - 1) - (km & (NC - 1)).to(tl.int32)[:, None], pos)
            key = tl.where(key == km[:, None], KEY_MIN, key)
        ids = (E - 1) - (tl.load(ckey_ptr + offs_t[:, None] * NC + pos, cache_modifier=".cg") & (E - 1)).to(tl.int32)
        wts = tl.load(sc_ptr + offs_t[:, None] * E + ids, cache_modifier=".cg")
        if RENORM:
            wts = wts / (tl.sum(wts, axis=1)[:, None] + 1e-20)
        return ids, wts * SCALE

    @triton.jit
    def _fused_route_kernel(
        x_ptr, w_ptr, part_ptr, nw_ptr, bias_ptr, normed_ptr, rbuf_ptr, gsc_ptr, ckey_ptr, sc_ptr, cnt1_ptr, cnt2_ptr,
        ids_ptr, topw_ptr, pairw_ptr, counts_ptr, pairs_ptr, next_counts_ptr, active_ptr, ticket_ptr, tiles_ptr,
        T, stride_xt, stride_nt, eps, MAXT,
        H: tl.constexpr, E: tl.constexpr, T_PAD: tl.constexpr, BLOCK_E: tl.constexpr, SPLIT_K: tl.constexpr,
        BLOCK_K: tl.constexpr, PREC: tl.constexpr, ROWS: tl.constexpr, U: tl.constexpr, NRB: tl.constexpr,
        TOPK: tl.constexpr, N_GROUP: tl.constexpr, TOPK_GROUP: tl.constexpr, CAND: tl.constexpr,
        SCALE: tl.constexpr, RENORM: tl.constexpr, HAS_BIAS: tl.constexpr, MAXC: tl.constexpr,
        NACT_IDX: tl.constexpr, ZERO_NEXT: tl.constexpr, NORM: tl.constexpr, WRITE_NORMED: tl.constexpr,
        BLOCK_H: tl.constexpr, ACTIVE: tl.constexpr, TILES: tl.constexpr, E1: tl.constexpr, E1P: tl.constexpr,
        TILE_M: tl.constexpr, SPLIT_CHUNK: tl.constexpr = 8, SEL_ROWS: tl.constexpr = 32,
        USE_PDL: tl.constexpr = False,
    ):
        """Program (expert tile pid_e, split pid_k, row block rb): the three phases of the module doc.

        Buffers: part [SPLIT_K, T_PAD, E] fp32; rbuf [E/U, NRB·ROWS] fp32 (r per unit and row); gsc [NRB·ROWS,
        N_GROUP] fp32; ckey [NRB·ROWS, N_GROUP·CAND] int64; sc [NRB·ROWS, E] fp32; cnt1 [NRB, E/U], cnt2 [NRB],
        ticket [1] int32 (0 on entry, 0 again on exit). The rest as ``_route_select_kernel`` (ZERO_NEXT: program
        (0, 0, 0) clears the next layer's counts row). With PDL and one K step per split the weight tile is loaded
        before the wait (PRE). SPLIT_CHUNK / SEL_ROWS: phase 2's partial tiles in flight, phase 3's rows per step."""
        pid_e = tl.program_id(0)
        pid_k = tl.program_id(1)
        rb = tl.program_id(2)
        K_PER: tl.constexpr = H // SPLIT_K
        PRE: tl.constexpr = USE_PDL and K_PER == BLOCK_K  # one K step: its weight tile before the PDL wait
        if USE_PDL:
            gdc_launch_dependents()
            if PRE:  # the router weights are never written by an earlier launch: their HBM latency overlaps it
                kk = pid_k * K_PER + tl.arange(0, BLOCK_K)
                wpre = tl.load(w_ptr + (pid_e * BLOCK_E + tl.arange(0, BLOCK_E))[None, :] * H + kk[:, None])
                wpre = wpre.to(tl.float32)
            gdc_wait()
        TPU: tl.constexpr = U // BLOCK_E  # expert tiles per unit
        NPU: tl.constexpr = SPLIT_K * TPU  # programs per (unit, row block)
        NU: tl.constexpr = E // U
        RTOT: tl.constexpr = NRB * ROWS
        SR: tl.constexpr = ROWS if ROWS < SEL_ROWS else SEL_ROWS  # phase 3's rows per step (registers)
        u = pid_e // TPU
        j = pid_k * TPU + pid_e % TPU  # the program's index inside its unit: rows j, j + NPU, ... of the row block
        offs_t = rb * ROWS + tl.arange(0, ROWS)
        if ZERO_NEXT:
            if (pid_e == 0) & (pid_k == 0) & (rb == 0):
                oe = tl.arange(0, E)
                tl.store(next_counts_ptr + oe, tl.zeros((E,), dtype=tl.int32))
                tl.store(next_counts_ptr + NACT_IDX, 0)
        if NORM:  # the first row's load issues before the GEMM's, so that both latencies overlap
            offs_h = tl.arange(0, BLOCK_H)
            mh = offs_h < H
            t0 = rb * ROWS + j
            xv = tl.load(x_ptr + t0 * stride_xt + offs_h, mask=offs_h < tl.where((t0 < T) & (j < ROWS), H, 0),
                         other=0.0)
        # ---- phase 1: the router partial of this program (the router kernel's code and store)
        if PRE:
            acc, _ = _router_partial(x_ptr, w_ptr, nw_ptr, offs_t, T, stride_xt, pid_e, pid_k, H, BLOCK_E, SPLIT_K,
                                     BLOCK_K, PREC, NORM, False, ROWS, wpre, True)
        else:
            acc, _ = _router_partial(x_ptr, w_ptr, nw_ptr, offs_t, T, stride_xt, pid_e, pid_k, H, BLOCK_E, SPLIT_K,
                                     BLOCK_K, PREC, NORM, False, ROWS)
        offs_e = pid_e * BLOCK_E + tl.arange(0, BLOCK_E)
        tl.store(part_ptr + pid_k * (T_PAD * E) + offs_t[:, None] * E + offs_e[None, :], acc,
                 mask=(offs_t < T_PAD)[:, None])
        if NORM:  # r of the unit's rows (each unit its own copy: its phase 2 reads only what its programs wrote)
            nwv = tl.load(nw_ptr + offs_h, mask=mh, other=0.0).to(tl.float32)
            if (j < ROWS) & (t0 < T):
                r, y = _rms_row(xv, nwv, eps, H)
                tl.store(rbuf_ptr + u * RTOT + t0, r)
                if WRITE_NORMED:
                    if u == 0:
                        tl.store(normed_ptr + t0 * stride_nt + offs_h, y.to(normed_ptr.dtype.element_ty), mask=mh)
            for i in range(j + NPU, ROWS, NPU):
                t = rb * ROWS + i
                if t < T:
                    xi = tl.load(x_ptr + t * stride_xt + offs_h, mask=mh, other=0.0)
                    ri, yi = _rms_row(xi, nwv, eps, H)
                    tl.store(rbuf_ptr + u * RTOT + t, ri)
                    if WRITE_NORMED:
                        if u == 0:
                            tl.store(normed_ptr + t * stride_nt + offs_h, yi.to(normed_ptr.dtype.element_ty),
                                     mask=mh)
        # every thread's stores of this program precede the (release) ticket: a CTA barrier first
        tl.debug_barrier()
        c1 = cnt1_ptr + rb * NU + u
        if tl.atomic_add(c1, 1, sem="acq_rel") == NPU - 1:
            # ---- phase 2: the last program of (unit, row block)
            tl.atomic_xchg(c1, 0, sem="relaxed")
            _unit_candidates(part_ptr, bias_ptr, rbuf_ptr, gsc_ptr, ckey_ptr, sc_ptr, u, offs_t, T, E, T_PAD,
                             SPLIT_K, U, N_GROUP, CAND, ROWS, HAS_BIAS, NORM, RTOT, SPLIT_CHUNK)
            tl.debug_barrier()
            c2 = cnt2_ptr + rb
            if tl.atomic_add(c2, 1, sem="acq_rel") == NU - 1:
                # ---- phase 3: the last unit of the row block
                tl.atomic_xchg(c2, 0, sem="relaxed")
                kidx = tl.arange(0, TOPK)[None, :]
                for r0 in range(0, ROWS, SR):
                    offs_s = rb * ROWS + r0 + tl.arange(0, SR)
                    ids, wts = _select_rows(gsc_ptr, ckey_ptr, sc_ptr, offs_s, E, N_GROUP, TOPK_GROUP, TOPK, CAND,
                                            SR, SCALE, RENORM)
                    p = offs_s[:, None] * TOPK + kidx
                    pm = (offs_s < T)[:, None] & (kidx < TOPK)
                    tl.store(ids_ptr + p, ids, mask=pm)
                    tl.store(topw_ptr + p, wts, mask=pm)
                    tl.store(pairw_ptr + p, wts, mask=pm)
                    _append_pairs(counts_ptr, pairs_ptr, active_ptr, ids, p, pm, MAXC, NACT_IDX, ACTIVE)
                if TILES:
                    tl.debug_barrier()
                    if tl.atomic_add(ticket_ptr, 1, sem="acq_rel") == NRB - 1:
                        _fill_tiles(counts_ptr, tiles_ptr, MAXT, E1, E1P, TILE_M)
                        tl.atomic_xchg(ticket_ptr, 0, sem="relaxed")


class FusedRouteBuffers:
    """The fused kernel's scratch for one (rows, units, groups, candidates, experts) layout: rbuf [NU, R] fp32, gsc
    [R, NG] fp32, ckey [R, NG·CAND] int64, sc [R, E] fp32 with R = row blocks x ROWS; counters cnt1 [NRB, NU] and
    cnt2 [NRB] int32 (zeros; each launch leaves them at zero)."""

    def __init__(self, nrb, rows, nu, n_group, cand, E, device):
        R = nrb * rows
        f32 = dict(dtype=torch.float32, device=device)
        self.key = (nrb, rows, nu, n_group, cand, E)
        self.rbuf = torch.ones(nu, R, **f32)
        self.gsc = torch.zeros(R, n_group, **f32)
        self.ckey = torch.zeros(R, n_group * cand, dtype=torch.int64, device=device)
        self.sc = torch.zeros(R, E, **f32)
        self.cnt1 = torch.zeros(nrb, nu, dtype=torch.int32, device=device)
        self.cnt2 = torch.zeros(nrb, dtype=torch.int32, device=device)


def _buffers(ws: MoEWorkspace, nrb, rows, nu, n_group, cand, E) -> FusedRouteBuffers:
    """``ws.fused_route`` for this layout, allocated on the first call or when the layout changes (so never inside a
    graph capture once the forward has run, like the tile table)."""
    key = (nrb, rows, nu, n_group, cand, E)
    fb = getattr(ws, "fused_route", None)
    if fb is None or fb.key != key:
        fb = ws.fused_route = FusedRouteBuffers(nrb, rows, nu, n_group, cand, E, ws.part.device)
    return fb


def _split_chunk(rc: dict, split: int, rows: int, U: int, warps: int) -> int:
    """Phase 2's partial tiles in flight: the router config's ``SPLIT_CHUNK``, else as many [rows, U] fp32 tiles as
    fit about 64 registers a thread (8 at 32 x 32 with 4 warps, 2 at 64 x 64); a power of two dividing SPLIT_K.
    Raises ValueError for a ``SPLIT_CHUNK`` that does not divide SPLIT_K."""
    if "SPLIT_CHUNK" in rc:
        chunk = int(rc["SPLIT_CHUNK"])
        if chunk < 1 or split % chunk:
            raise ValueError(f"moe_route_align_fused: SPLIT_CHUNK {chunk} does not divide SPLIT_K {split}")
        return chunk
    per_tile = max(1, rows * U // (32 * warps))
    chunk = 1 << max(0, (64 // per_tile).bit_length() - 1)
    return math.gcd(split, chunk)


def moe_route_align_fused(x, gate_w, expert_bias, ws: MoEWorkspace, E1, top_k=8, n_group=8, topk_group=4,
                          scaling=2.5, renormalize=True, configs=None, slot=None, norm_w=None, eps=1e-6,
                          norm_out=None, row_block=None, tile_block_m=None):
    """:func:`.route.moe_route_align` (same arguments, shapes, dtypes and results in ``ws``) in one launch (module
    doc). The router config's tiles (BLOCK_E, SPLIT_K = ``ws.part.shape[0]``, BLOCK_K, PREC, ROWS / ``row_block``,
    num_stages) are the two-kernel path's, so the partial logits and their split order are the same; num_warps is
    the router config's (``FUSED_WARPS`` overrides it). Register knobs that leave the numbers unchanged:
    ``SPLIT_CHUNK`` partial tiles loaded at a time in phase 2 (default: :func:`_split_chunk`), ``SEL_ROWS``
    (default 32) rows per selection step in phase 3. Offline sm_90a compile (Triton 3.9, 4 warps): 127 registers at
    BLOCK_E 16 x SPLIT_K 32 (the router kernel alone: 119; both give 4 programs per SM), 168 at 32 x 8 (router: 217),
    255 at the batched 64 x 8 x 64 rows (router: 255). With ``norm_w`` but no ``norm_out``, r is computed from the
    whole row (the numerics of the ``norm_out`` case; the two-kernel path sums the router's split Σh² instead).
    Needs E / n_group experts per group, BLOCK_E and the group size powers of two, and top_k within the kept
    groups (topk_group x group size >= top_k). Raises ValueError as ``moe_route_align``."""
    T, H = x.shape
    E = gate_w.shape[0]
    rc, split, be, bk, rows = _router_tiles(x, gate_w, ws, E1, n_group, top_k, configs, norm_w, norm_out, row_block,
                                            "moe_route_align_fused")
    gs = E // n_group
    assert be & (be - 1) == 0 and topk_group * gs >= top_k
    U = max(be, gs)
    cand = min(top_k, gs)
    nrb = triton.cdiv(ws.T_PAD, rows)
    fb = _buffers(ws, nrb, rows, E // U, n_group, cand, E)
    nxt = _clear_counts(ws, slot)
    tiles = dict(TILES=False, ticket_ptr=ws.ticket, tiles_ptr=ws.ticket, MAXT=1, E1=1, E1P=1, TILE_M=16)
    if tile_block_m is not None:
        table = _tile_buffer(ws, int(tile_block_m))
        tiles = dict(TILES=True, ticket_ptr=ws.ticket, tiles_ptr=table, MAXT=table.shape[0], E1=ws.E1,
                     E1P=next_pow2(ws.E1), TILE_M=int(tile_block_m))
    no = norm_out if norm_out is not None else x
    warps = int(rc.get("FUSED_WARPS") or rc["num_warps"])
    chunk = _split_chunk(rc, split, rows, U, warps)
    _fused_route_kernel[(E // be, split, nrb)](
        x, gate_w, ws.part, norm_w if norm_w is not None else x, expert_bias if expert_bias is not None else ws.part,
        no, fb.rbuf, fb.gsc, fb.ckey, fb.sc, fb.cnt1, fb.cnt2, ws.topk_ids, ws.topk_w, ws.pair_w, ws.counts,
        ws.pairs, nxt, ws.active, tiles.pop("ticket_ptr"), tiles.pop("tiles_ptr"),
        T, x.stride(0), no.stride(0), eps, tiles.pop("MAXT"),
        H=H, E=E, T_PAD=ws.T_PAD, BLOCK_E=be, SPLIT_K=split, BLOCK_K=bk, PREC=rc.get("PREC", "ieee"), ROWS=rows,
        U=U, NRB=nrb, TOPK=top_k, N_GROUP=n_group, TOPK_GROUP=topk_group, CAND=cand, SCALE=float(scaling),
        RENORM=bool(renormalize), HAS_BIAS=expert_bias is not None, MAXC=ws.T_PAD, NACT_IDX=E1,
        ZERO_NEXT=slot is not None, NORM=norm_w is not None, WRITE_NORMED=norm_out is not None,
        BLOCK_H=next_pow2(H), ACTIVE=bool(ws.compact or slot is None), **tiles,
        SPLIT_CHUNK=chunk, SEL_ROWS=int(rc.get("SEL_ROWS", 32)), num_warps=warps, num_stages=rc["num_stages"], **pdl(),
    )
