"""Batched, batch-invariant forward of S diffusion blocks (one T-token block per request slot) as one CUDA graph.

:class:`BatchedBlockForward` is :class:`~repro.engine.kernels.fastpath.BlockForward` over S request slots: the
same kernels, the same layer order (docs/engine.md §2), all static buffers, one CUDA-graph replay per round.
Slot s holds one request's block: its token ids (or self-conditioning input embeddings), its own prefix KV cache
and its own prefix length P_s (a device int32 tensor, so one graph serves every mix of lengths).

**Row invariance** (docs/perf_history.md "Batched graph forward"): for any S and any contents of the other slots, slot
s's logits / pred / conf / entropy and the K/V it writes are bit-identical to running it alone with S = 1.
Every kernel here computes a row with a launch configuration that does not depend on S:

* QKV, O and lm_head: :func:`rows_linear`, a fixed-tile Triton GEMM (no cuBLAS, whose kernel choice depends on
  the row count M; no split-K): a row's output element is one K loop of fixed BLOCK_K dots (tiles loaded by
  pointer or, with the tile key ``TMA``, by tensor descriptor: the same dots).
* QK-norm + RoPE + KV write and attention: :mod:`.attention_slots` (a program works inside one slot; a slot's key
  chunks depend only on its own P_s and are folded in a fixed order, so its "split" launch, used below
  ``WHOLE_MIN_SLOTS`` slots, and its "whole" launch, one program per (slot, KV head, row block) from there on,
  give the same bits). ``configs["attn"]["IMPL"] = "single"`` runs :mod:`.attention`'s kernels instead (A/B).
* MoE: the router GEMM in fixed row tiles (``moe_route_align(row_block=...)``: ``ROWS`` of the router config,
  else one 32-row block; SPLIT_K of the config), routing and alignment per token, the grouped expert GEMMs with
  fixed tiles (a pair's row is computed independently of the others in its BLOCK_M group), launched over a tile
  table (``route.moe_tiles``, one small launch after routing, or with ``tiles_in_select`` the route-select
  kernel's last program: one program per (expert, m-block) in use and n-tile, so the grid grows with the pairs
  routed, not with E1 x cdiv(S·T, BLOCK_M)); the dense layer 0 is one expert with S·T rows. Router/route launch
  configs: the batched tile file's ``moe_router`` / ``moe_route`` where it has them; with ``fused_route`` (the
  router config's ``FUSED`` key) router and route are one launch (:mod:`.route_fused`: the same bits, same tiles).
* RMSNorms: ``NORM_WARPS`` warps and ``configs["norm"]["rows"]`` rows per program (0: one row per program; >= 1:
  rows in turn with a prefetch of the next, the same per-row arithmetic for any grid), one setting for every S;
  embeddings, the top-k sum and the decode statistics are one row per program.

All tile configs are looked up once for T-token blocks (``fastpath.kernel_configs(..., T)``, the MoE ones
pinned through ``moe._cfg(..., T)``), never for S·T rows; where the device has a batched tile file
(``configs/batched_*.json``, :func:`batched_tiles`: tiles chosen for S = 8-32 rounds, docs/perf_history.md "Batched graph
round: where the time goes and tiles") its entries replace the single-request ones, still one set for every S
except a GEMM's ``"by_slots"`` entries (:func:`for_slots`): tiles by slot count, within the keys that leave a row's
numbers unchanged (:data:`SLOT_KEYS`, :data:`SLOT_KEYS_W4`; docs/perf_history.md "Session 8: tiles by slot count").
S = 1 differs from ``BlockForward`` only in the GEMMs (Triton tiles here, cuBLAS there): same math, other
rounding order.
"""
from __future__ import annotations

import torch

from . import attention as A
from . import attention_slots as AS
from . import logits as Lg
from . import moe as M
from . import norm as Nm
from ._triton import HAS_TRITON, gdc_launch_dependents, gdc_wait, next_pow2, pdl, tl, triton
from .configs import load_config
from .fastpath import GraphCapture, ModelShape, _Stats, kernel_configs, round_bytes
from .moe_gemm import _weight_descriptor, tma_available

__all__ = ["BatchedBlockForward", "rows_linear", "rows_linear_reference", "batched_round_bytes", "LM_HEAD_TILES",
           "batched_tiles", "for_slots"]

#: lm_head tiles where the device has no batched tile file (:func:`batched_tiles`; the QKV/O ones then come from
#: the tuned single-request "linear" configs): BLOCK_M = 32 rows = one block, so a
#: weight tile read once serves a whole block; m is the fastest grid axis, so the S blocks' programs that read
#: the same weight tile run together and the 644 MB head is streamed from HBM about once per round.
LM_HEAD_TILES = dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=3)

#: warps of the RMSNorm programs (one row each; ``configs["norm"]["num_warps"]`` overrides): docs/perf_history.md "Session 5:
#: attention at many slots"
NORM_WARPS = 16

if HAS_TRITON:

    @triton.jit
    def _rows_linear_kernel(x_ptr, w_ptr, out_ptr, R, stride_x, K: tl.constexpr, N: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                            ADD: tl.constexpr = False, USE_PDL: tl.constexpr = False, TMA: tl.constexpr = 0):
        """Program (m-block, n-tile): out[rows, cols] = x[rows]·w[cols]ᵀ (ADD: out + x·wᵀ, the sum in fp32), fp32
        accumulation over K in BLOCK_K steps, stored in out's dtype; rows >= R masked (never read or written).
        TMA >= 1: ``w_ptr`` is a tensor descriptor over w [N, K] with block [BLOCK_N, BLOCK_K]; TMA 2: ``x_ptr``
        too, over x [R, K] with block [BLOCK_M, BLOCK_K] (rows >= R read as zeros, as the masked load); the same
        tiles and dots."""
        if USE_PDL:
            gdc_launch_dependents()
            gdc_wait()
        offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        mm = offs_m < R
        if TMA < 2:
            a_ptrs = x_ptr + offs_m[:, None] * stride_x + offs_k[None, :]
        if TMA == 0:
            w_ptrs = w_ptr + offs_n[None, :].to(tl.int64) * K + offs_k[:, None]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            if TMA == 2:
                a = x_ptr.load([tl.program_id(0) * BLOCK_M, k0])
            else:
                a = tl.load(a_ptrs + k0, mask=mm[:, None], other=0.0)
            if TMA > 0:
                w = w_ptr.load([tl.program_id(1) * BLOCK_N, k0]).T
            else:
                w = tl.load(w_ptrs + k0)
            acc = tl.dot(a, w, acc)
        o_ptrs = out_ptr + offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
        if ADD:
            acc += tl.load(o_ptrs, mask=mm[:, None], other=0.0).to(tl.float32)
        tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mm[:, None])


def rows_linear(x, w, out, cfg, add: bool = False):
    """out = x·wᵀ (``add``: out += x·wᵀ, i.e. ``out.addmm_(x, w.t())``) through one fixed-tile Triton GEMM: x [R, K]
    (unit stride along K), w [N, K] contiguous, out [R, N] contiguous, not overlapping x (fp32 or the model dtype;
    accumulation in fp32, the addend added in fp32, one rounding at the store).

    Grid (cdiv(R, BLOCK_M), N / BLOCK_N), m fastest; no split-K, so row r's result depends on x[r] and w only,
    not on R (row invariance). ``cfg``: BLOCK_M/N/K, num_warps, num_stages (BLOCK_N, BLOCK_K capped at N, K), and
    optionally ``TMA`` (1: the weight tiles loaded by tensor descriptor; 2: the x tiles too; the same arithmetic).
    Raises ValueError when N or K is not a multiple of its tile or the strides do not fit. Reference:
    :func:`rows_linear_reference`.
    """
    R, K = x.shape
    N = w.shape[0]
    bn, bk = min(cfg["BLOCK_N"], N), min(cfg["BLOCK_K"], K)
    if (w.shape[1] != K or tuple(out.shape) != (R, N) or N % bn or K % bk or x.stride(1) != 1
            or not w.is_contiguous() or not out.is_contiguous()):
        raise ValueError(f"rows_linear: x {tuple(x.shape)}, w {tuple(w.shape)}, out {tuple(out.shape)} with tiles "
                         f"{bn}x{bk} (N, K must be multiples of the tiles; w, out contiguous)")
    tma = int(cfg.get("TMA") or 0)
    if tma not in (0, 1, 2):
        raise ValueError(f"rows_linear: tile key TMA={cfg['TMA']!r}; want 0 (pointer loads), 1 (weights by tensor "
                         f"descriptor) or 2 (weights and x)")
    w_arg = _weight_descriptor(w, (bn, bk), "rows_linear") if tma else w
    x_arg = _weight_descriptor(x, (cfg["BLOCK_M"], bk), "rows_linear") if tma == 2 else x
    _rows_linear_kernel[(triton.cdiv(R, cfg["BLOCK_M"]), N // bn)](
        x_arg, w_arg, out, R, x.stride(0), K=K, N=N, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=bn, BLOCK_K=bk, ADD=bool(add),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], TMA=tma, **pdl())
    return out


#: tile keys of a 16-bit GEMM (expert, dense, QKV / O / lm_head) that may follow the slot count S (``"by_slots"``,
#: :func:`for_slots`). Row invariance allows it because these kernels' K loop is one fp32 accumulator carried through
#: ``tl.dot`` in K order, 16 inputs per MMA, whatever the tile: a row's numbers do not depend on BLOCK_M / N / K, the
#: warps, the pipeline depth, TMA or pointer loads, or mma.sync against wgmma. Measured on the H200 (docs/perf.md,
#: "Session 8: tiles by slot count"): eight tile sets spanning these keys gave bit-identical logits over the full
#: 20-layer model; the GPU test ``test_batched_bf16_slots_bit_identical`` checks the tile file's own choices.
SLOT_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages", "TMA")
#: the same for the 4-bit expert kernels (``moe_w4``): only the row tile within mma.sync (BLOCK_M 16 / 32 gave the same
#: bits; BLOCK_M 64 takes wgmma and did not) and the pipeline depth; BLOCK_K sets the order of the even / odd input
#: halves in the K loop, so it stays one setting
SLOT_KEYS_W4 = ("BLOCK_M", "num_stages")
W4_SLOT_BLOCK_M = (16, 32)


def _slot_count(lo) -> int:
    """A ``by_slots`` key as a slot count: an int or a string of decimal digits, >= 1; else ValueError."""
    if isinstance(lo, bool) or not isinstance(lo, (int, str)) or (isinstance(lo, str) and not lo.strip().isdigit()):
        raise ValueError(f"'by_slots' key {lo!r} is not a slot count (want e.g. \"8\")")
    if int(lo) < 1:
        raise ValueError(f"'by_slots' key {lo!r}: want a slot count >= 1")
    return int(lo)


def _check_slot_value(key: str, v) -> None:
    """One ``by_slots`` tile value: BLOCK_* a power of two >= 16 (the MMA's smallest tile side), num_warps a power
    of two in 1..16, num_stages an int >= 1, TMA 0 / 1 / 2 (:func:`rows_linear`). ValueError naming the key."""
    ok = isinstance(v, int) and not isinstance(v, bool)
    if ok and key.startswith("BLOCK_"):
        ok = v >= 16 and v & (v - 1) == 0
        want = "a power of two >= 16"
    elif ok and key == "num_warps":
        ok = v in (1, 2, 4, 8, 16)
        want = "1, 2, 4, 8 or 16"
    elif ok and key == "num_stages":
        ok = v >= 1
        want = "an integer >= 1"
    elif ok and key == "TMA":
        ok = v in (0, 1, 2)
        want = "0, 1 or 2"
    else:
        want = "an integer"
    if not ok:
        raise ValueError(f"'by_slots' {key}={v!r}: want {want}")


def for_slots(cfg: dict, slots: int, w4: bool = False) -> dict:
    """``cfg`` (one GEMM's tiles) for a round of ``slots`` slots: its ``"by_slots"`` entry ``{min_slots: {key: value}}``
    applied in ascending order of ``min_slots`` for every ``min_slots <= slots``, the entry itself dropped, e.g.
    ``{"BLOCK_M": 16, "num_stages": 4, "by_slots": {"16": {"BLOCK_M": 64}, "32": {"num_stages": 3}}}`` -> BLOCK_M 64
    from 16 slots on, 3 stages from 32 on. ``w4``: the tiles of a 4-bit expert kernel (:data:`SLOT_KEYS_W4`).

    The whole entry is checked whatever ``slots`` is (a tile file is wrong or right for every S). Raises ValueError,
    naming the entry, for: ``by_slots`` not a dict; a ``min_slots`` that is not a positive integer (or given twice,
    e.g. ``"8"`` and ``8``); a step that is not a dict; a key outside :data:`SLOT_KEYS` (:data:`SLOT_KEYS_W4` with
    ``w4``); a value of the wrong kind (:func:`_check_slot_value`); with ``w4``, a BLOCK_M outside
    :data:`W4_SLOT_BLOCK_M` in a step or, when any step sets BLOCK_M, in the base tiles."""
    out = {k: v for k, v in cfg.items() if k != "by_slots"}
    if "by_slots" not in cfg:
        return out
    base = {k: v for k, v in cfg.items() if k != "by_slots"}
    by = cfg["by_slots"]
    if not isinstance(by, dict):
        raise ValueError(f"tiles {base}: 'by_slots' must map a slot count to tile keys, e.g. "
                         f"{{\"32\": {{\"num_stages\": 3}}}}; got {by!r}")
    keys = SLOT_KEYS_W4 if w4 else SLOT_KEYS
    steps: dict[int, dict] = {}
    try:
        for lo, over in by.items():
            n = _slot_count(lo)
            if n in steps:
                raise ValueError(f"'by_slots' has slot count {n} twice")
            if not isinstance(over, dict):
                raise ValueError(f"'by_slots' step {lo!r} must be a dict of tile keys, got {over!r}")
            bad = sorted(set(over) - set(keys))
            if bad:
                raise ValueError(f"'by_slots' may set only {list(keys)} from a slot count >= 1 (got {lo!r}: {bad}); "
                                 f"other keys change a row's numbers and must be one setting for every S (row "
                                 f"invariance)")
            for k, v in over.items():
                _check_slot_value(k, v)
            if w4 and "BLOCK_M" in over and over["BLOCK_M"] not in W4_SLOT_BLOCK_M:
                raise ValueError(f"a 4-bit expert kernel's 'by_slots' BLOCK_M must be one of {list(W4_SLOT_BLOCK_M)} "
                                 f"(BLOCK_M 64 takes wgmma, which changes a row's numbers), got {over['BLOCK_M']!r}")
            steps[n] = over
        if w4 and any("BLOCK_M" in o for o in steps.values()) and base.get("BLOCK_M") not in W4_SLOT_BLOCK_M:
            raise ValueError(f"4-bit tiles with a 'by_slots' BLOCK_M need the base BLOCK_M in "
                             f"{list(W4_SLOT_BLOCK_M)} too, got {base.get('BLOCK_M')!r}")
    except ValueError as e:
        raise ValueError(f"tiles {base}: {e}") from None
    for n in sorted(steps):
        if slots >= n:
            out.update(steps[n])
    return out


#: the kernels of each tile family that may carry ``"by_slots"`` (the GEMMs; router / route launch configs may not)
SLOT_GEMMS = {"moe": ("gate_up", "down"), "dense": ("gate_up", "down"), "linear": ("qkv", "o", "lm_head")}


def _apply_by_slots(fam: dict, slots: int, family: str, w4: bool = False) -> None:
    """Replace each GEMM's tiles in ``fam`` (``{kernel: tiles}`` of tile family ``family``, a key of
    :data:`SLOT_GEMMS`) by :func:`for_slots` of them, in place. ``w4``: the MoE family's experts are packed 4-bit.
    Raises ValueError naming the kernel for a ``by_slots`` on a kernel that is not one of the family's GEMMs (e.g.
    the router, whose split-K launch sets a row's summation order)."""
    for k, v in list(fam.items()):
        if isinstance(v, dict) and "by_slots" in v:
            if k not in SLOT_GEMMS[family]:
                raise ValueError(f"tiles of {family} kernel {k!r}: 'by_slots' is allowed only on "
                                 f"{list(SLOT_GEMMS[family])} (a GEMM whose tiles leave a row's numbers unchanged)")
            fam[k] = for_slots(v, slots, w4=w4 and family == "moe")


def rows_linear_reference(x, w, out=None):
    """x [R, K] · w [N, K]ᵀ in fp32 (torch), plus ``out`` (upcast) when given: [R, N] fp32."""
    y = x.float() @ w.float().t()
    return y if out is None else y + out.float()


#: kernels of the batched tile file: (family in ``configs``, kernel) -> its name in the file
BATCHED_KERNELS = {("moe", "gate_up"): "moe_gate_up", ("moe", "down"): "moe_down",
                   ("dense", "gate_up"): "dense_gate_up", ("dense", "down"): "dense_down",
                   ("linear", "qkv"): "qkv", ("linear", "o"): "o", ("linear", "lm_head"): "lm_head"}
#: the MoE entries for packed NVFP4 experts (the same kernels with the 4-bit K loop; docs/perf_history.md "Session 5: the
#: 4-bit experts in the batched round"); a kernel without one keeps ``moe_w4.W4_TILES_DEFAULT``
BATCHED_W4_KERNELS = {"gate_up": "moe_w4_gate_up", "down": "moe_w4_down"}


def batched_tiles(W, shape: ModelShape, T: int, configs: dict | None = None, device=None) -> dict:
    """``configs`` completed with this device's batched tiles: for each kernel of :data:`BATCHED_KERNELS` that
    ``configs`` does not set (``configs[family][kernel]``), the entry of ``configs/batched_E=…_N=…_H=…_T=….json``
    (written from the sweep of docs/perf_history.md "Batched graph round: where the time goes and tiles"), if the file has
    one for this device. Packed NVFP4 experts take the file's 4-bit entries instead of the BF16 ones
    (:data:`BATCHED_W4_KERNELS`; the other 4-bit kernel, if the file has one only, keeps
    ``moe_w4.W4_TILES_DEFAULT``). The file's ``TMA`` keys are dropped on a Triton without tensor descriptors
    (:func:`~.moe_gemm.tma_available`). The file's ``attn`` entry (keys of the split-attention config, e.g. BLOCK_M,
    num_warps; merged under the caller's ``configs["attn"]`` keys) applies to the batched path only. Returns a new
    dict in
    :func:`~repro.engine.kernels.fastpath.kernel_configs`' ``configs`` form; with
    no file or no entry, ``configs`` unchanged (e.g. on the CPU)."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in (configs or {}).items()}
    packed = any(not isinstance(L["w13"], torch.Tensor) for L in W["layers"])
    key = dict(E=shape.experts + 1, N=shape.moe_inter, H=shape.hidden, T=T)
    for (fam, kern), name in BATCHED_KERNELS.items():
        if fam == "moe" and packed:
            name = BATCHED_W4_KERNELS[kern]
        if kern in (out.get(fam) or {}):
            continue
        if fam == "dense" and (configs or {}).get("dense"):
            continue  # a caller's dense dict is taken whole (kernel_configs does not merge it with others)
        cfg = load_config("batched", name, {}, device=device, **key)
        if not tma_available():
            cfg.pop("TMA", None)  # the file's tiles on a Triton without tensor descriptors: pointer loads, same bits
            for over in (cfg.get("by_slots") or {}).values():
                if isinstance(over, dict):
                    over.pop("TMA", None)
        if cfg:
            if out.get(fam) is None:
                out[fam] = {}
            out[fam][kern] = cfg
    if packed and out.get("moe") and not (configs or {}).get("moe"):
        from .moe_w4 import W4_TILES_DEFAULT  # a half-filled 4-bit pair: the other kernel keeps its own tiles

        out["moe"] = {**W4_TILES_DEFAULT, **out["moe"]}
    if "dense" in out and set(out["dense"]) != {"gate_up", "down"}:
        out.pop("dense")  # kernel_configs wants both dense kernels or none
    attn = load_config("batched", "attn", {}, device=device, **key)  # attention launch keys of the batched path
    if attn:
        out["attn"] = {**attn, **(out.get("attn") or {})}  # the caller's keys win
    return out


def batched_round_bytes(shape: ModelShape, distinct: list[int], prefixes: list[int], T: int = 32, wbytes: int = 2,
                        expert_bytes: float | None = None) -> dict:
    """Bytes one batched round must read: every weight once (``distinct``: routed experts touched by any slot,
    per MoE layer), each slot's KV rows [0, P_s + T) once, S·T embedding rows; docs/perf_history.md "The two numbers".
    ``prefixes``: P_s per slot. Returns the dict of :func:`~repro.engine.kernels.fastpath.round_bytes` with
    ``kv_cache`` and ``embed_rows`` summed over the slots and ``total`` recomputed."""
    b = round_bytes(shape, distinct, 0, T, wbytes, expert_bytes)
    b["embed_rows"] *= len(prefixes)
    b["kv_cache"] = sum(shape.layers * 2 * shape.nkv * shape.head_dim * wbytes * (P + T) for P in prefixes)
    b["total"] = sum(v for k, v in b.items() if k != "total")
    return b


class BatchedBlockForward(GraphCapture):
    """Static-buffer forward of S blocks of T tokens, slot s over its own KV cache of ``max_len`` rows.

    Inputs (write them in place; the captured graph reads these buffers):
    ``ids`` [S, T] int64 block tokens; ``embeds_in`` [S, T, H] model dtype and ``use_embeds`` [S] bool (slot s
    takes ``embeds_in[s]`` as its layer-0 input instead of ``E[ids[s]]``: ORL self-conditioning); ``cache_len``
    [S] int32, P_s = slot s's prefix length (block start): its K/V are written at rows [P_s, P_s + T) and it
    attends to [0, P_s + T). A slot with nothing to do gets ``cache_len = max_len - T`` (a scratch region; the
    initial value) — its attention then reads the slot's whole cache (5120 positions: 200 MB a round); a slot
    that holds no request can take ``cache_len = 0`` instead (it writes rows [0, T) of its own unused cache and
    reads only those). Needs P_s + T <= max_len (not checked on the device).
    KV cache: ``kv`` [L, 2, S, NKV, max_len, D] model dtype (slot s's cache is ``kv[:, :, s]``; 2·L·NKV·D·2
    bytes per position and slot in bf16: 40 kB, so S = 32 slots of 5120 positions take 6.7 GB).
    Outputs after :meth:`forward` or a replay: ``logits`` [S, T, V] model dtype, ``pred`` [S, T] int64 (argmax),
    ``conf`` [S, T] fp32 (max probability), ``entropy`` [S, T] fp32 (nats).

    ``configs`` as in :func:`~repro.engine.kernels.fastpath.kernel_configs` (plus ``linear["lm_head"]`` tiles),
    completed by :func:`batched_tiles` (this device's batched tile file) where they leave a GEMM open; every
    config is the one of a T-token block (never looked up for S·T rows); only a GEMM's ``"by_slots"`` steps
    (:func:`for_slots`) follow S. :meth:`forward` makes no host sync and no
    allocation (CUDA-graph capturable; :meth:`capture` / :meth:`warmup` as ``BlockForward``); it always
    computes all S slots. Raises ValueError for slots < 1 or max_len < T.
    """

    def __init__(self, W, shape: ModelShape, max_len: int, slots: int, T: int = 32, device="cuda",
                 configs: dict | None = None):
        if slots < 1 or max_len < T:
            raise ValueError(f"BatchedBlockForward: slots={slots} must be >= 1 and max_len={max_len} >= T={T}")
        self.W, self.s, self.T, self.S, self.max_len, self.device = W, shape, T, slots, max_len, device
        S, R = slots, slots * T
        dt = self.dtype = W["embed"].dtype
        H, D = shape.hidden, shape.head_dim
        self.configs = batched_tiles(W, shape, T, configs)
        kc = kernel_configs(W, shape, T, self.configs)
        self.ids = torch.full((S, T), shape.mask_id, dtype=torch.long, device=device)
        self.embeds_in = torch.zeros(S, T, H, dtype=dt, device=device)
        self.use_embeds = torch.zeros(S, dtype=torch.bool, device=device)
        self.cache_len = torch.full((S,), max_len - T, dtype=torch.int32, device=device)
        self.kv = torch.zeros(shape.layers, 2, S, shape.nkv, max_len, D, dtype=dt, device=device)
        self.h = torch.zeros(R, H, dtype=dt, device=device)
        self.a = torch.zeros(R, H, dtype=dt, device=device)
        self.qkv = torch.zeros(R, shape.qkv_out, dtype=dt, device=device)
        self.q = torch.zeros(R, shape.nq, D, dtype=dt, device=device)
        self.o = torch.zeros(R, shape.nq * D, dtype=dt, device=device)
        self.attn32 = torch.zeros(R, H, dtype=torch.float32, device=device)
        self.cos, self.sin = A.rope_tables(max_len, shape.rot_dim, shape.rope_theta, device)
        ac = kc["attn"]
        self.aws = A.AttnWorkspace(T, shape.nq, shape.nkv, D, device, nsplit=ac["NSPLIT"], block_n=ac["BLOCK_N"],
                                   num_warps=ac["num_warps"], num_stages=ac["num_stages"],
                                   min_keys=ac.get("MIN_KEYS", 256), block_m=ac.get("BLOCK_M"), slots=S)
        # attention kernels: "slots" (attention_slots: row-blocked QK-norm, split or whole mode by S, one result) or
        # "single" (BlockForward's kernels; the batched path before session 5, kept for A/B runs)
        self.attn_impl = ac.get("IMPL", "slots")
        if self.attn_impl not in ("slots", "single"):
            raise ValueError(f"BatchedBlockForward: configs['attn']['IMPL'] = {self.attn_impl!r}; want 'slots' or "
                             f"'single'")
        self.attn_whole_min = int(ac.get("WHOLE_MIN_SLOTS", AS.WHOLE_MIN_SLOTS))
        self.qkn_rows = int(ac.get("QKN_ROWS", AS.QKN_ROWS))
        nc = self.configs.get("norm") or {}  # RMSNorm launch: warps, rows per program (one setting for every S)
        self.norm_kw = dict(num_warps=int(nc.get("num_warps", NORM_WARPS)), rows=int(nc.get("rows", 0)))
        E, N = shape.experts, shape.moe_inter
        # MoE tiles pinned to the T-token block's (a full dict: moe._cfg never looks a config up by S·T rows)
        self.moe_cfg = {k: M._cfg(k, kc["moe"], H, N, E + 1, T) for k in M.DEFAULT_CONFIGS}
        for k in ("router", "route"):  # the batched tile file's router/route entries (any expert precision)
            if k not in ((configs or {}).get("moe") or {}):
                self.moe_cfg[k].update(load_config("batched", "moe_" + k, {}, E=E + 1, N=N, H=H, T=T))
        # router GEMM tile rows, whatever S: the batched router config's ROWS, else one block's T_PAD
        self.router_rows = int(self.moe_cfg["router"].get("ROWS", max(16, next_pow2(T))))
        n_moe = shape.layers - shape.first_dense
        moe_w13 = [L["w13"] for L in W["layers"] if "router" in L]
        E1 = M.expert_slots(moe_w13[0]) if moe_w13 else E + 1  # E + 1 with a shared expert (index E), else E
        self.ws = M.MoEWorkspace(R, H, N, E, E1, shape.top_k, dt, device,
                                 split_k=self.moe_cfg["router"]["SPLIT_K"], n_slots=max(n_moe, 1))
        # dense layer 0 as one always-selected expert over all S·T rows (top_k=1, no shared): static routing
        self.dws = M.MoEWorkspace.create(R, H, shape.dense_inter, 1, 1, 1, dt, device, split_k=1)
        self.dws.counts.fill_(R)
        self.dws.pairs[0, :R] = torch.arange(R, device=device, dtype=torch.int32)
        self.dws.pair_w.fill_(1.0)
        self.dense_cfg = {k: dict(v) if isinstance(v, dict) else v for k, v in kc["dense"].items()}  # copies: the caller's configs stay as given
        packed = any(not isinstance(L["w13"], torch.Tensor) for L in W["layers"] if "router" in L)
        _apply_by_slots(self.moe_cfg, S, "moe", w4=packed)  # this S's tiles, before the tile tables read BLOCK_M
        _apply_by_slots(self.dense_cfg, S, "dense")
        # expert GEMMs over (expert, m-block) tile tables (moe_tiles) when gate+up and down share BLOCK_M: the grid
        # then grows with the pairs routed, not with E1 x cdiv(S·T, BLOCK_M); same tiles, same results
        self.tiles = {}
        for name, w, cfg in (("moe", self.ws, self.moe_cfg), ("dense", self.dws, self.dense_cfg)):
            if cfg["gate_up"]["BLOCK_M"] == cfg["down"]["BLOCK_M"]:
                self.tiles[name] = cfg["gate_up"]["BLOCK_M"]
                M.moe_tiles(w, self.tiles[name], static=name == "dense")
        # the MoE tile table written by the route-select kernel's last program instead of its own launch (kernel 4);
        # off: measured slower on the H200 (docs/perf_history.md "Session 5: router and route at batch 1 and many slots")
        self.tiles_in_select = False
        # router GEMM + route/align in one launch (route_fused): the same bits; the batched router config's
        # ``FUSED`` key (off unless a tile file sets it)
        self.fused_route = bool(self.moe_cfg["router"].get("FUSED", False))
        self.lin_cfg = dict(kc["linear"])
        self.lin_cfg.setdefault("lm_head", dict(LM_HEAD_TILES))
        _apply_by_slots(self.lin_cfg, S, "linear")
        self.logits = torch.zeros(S, T, shape.vocab, dtype=dt, device=device)
        self.pred = torch.zeros(S, T, dtype=torch.long, device=device)
        self.conf = torch.zeros(S, T, dtype=torch.float32, device=device)
        self.entropy = torch.zeros(S, T, dtype=torch.float32, device=device)
        self.stat_nchunk = 16
        self.stat_part = torch.zeros(R, self.stat_nchunk, 4, dtype=torch.float32, device=device)
        self.graph = None

    # ------------------------------------------------------------------------------------------
    def _embed(self):
        """h [S·T, H] = E[ids], then per slot ``embeds_in[s]`` where ``use_embeds[s]`` (elementwise select)."""
        torch.index_select(self.W["embed"], 0, self.ids.view(-1), out=self.h)
        h3 = self.h.view(self.S, self.T, -1)
        torch.where(self.use_embeds[:, None, None], self.embeds_in, h3, out=h3)

    def forward(self, head: bool = True, stats: _Stats | None = None):
        """One forward of all S slots (module doc); ``head=False`` skips lm_head + statistics (K/V only)."""
        s, W, R = self.s, self.W, self.S * self.T
        self._embed()
        prev = None  # (workspace, top_k, shared) of the previous FFN: its top-k sum is fused into the next norm
        for li, L in enumerate(W["layers"]):
            kc, vc = self.kv[li, 0], self.kv[li, 1]  # [S, NKV, max_len, D]
            if prev is None:
                Nm.add_rmsnorm(self.h, L["attn_norm"], self.a, eps=s.eps, **self.norm_kw)
            else:
                Nm.add_rmsnorm(self.h, L["attn_norm"], self.a, pairs=prev[0].pair_out, top_k=prev[1],
                               shared=prev[2], eps=s.eps, **self.norm_kw)
            rows_linear(self.a, L["wqkv"], self.qkv, self.lin_cfg["qkv"])
            self._attention(L, kc, vc)
            if "router" not in L:
                rows_linear(self.o, L["wo"], self.attn32, self.lin_cfg["o"])
                Nm.add_rmsnorm(self.h, L["mlp_norm"], self.a, delta=self.attn32, eps=s.eps, **self.norm_kw)
                M.moe_experts(self.a, L["w13"], L["w2"], self.dws, 1, self.dense_cfg)
                prev = (self.dws, 1, False)
                continue
            # MoE layer: the O projection adds into h in place; the router GEMM folds the RMSNorm weight in and
            # the route-select kernel writes a = RMSNorm(h)·w for the experts (BlockForward's ``norm_in_route``)
            rows_linear(self.o, L["wo"], self.h, self.lin_cfg["o"], add=True)
            E1 = M.expert_slots(L["w13"])
            route = M.moe_route_align_fused if self.fused_route else M.moe_route_align
            route(self.h, L["router"], L["expert_bias"], self.ws, E1, s.top_k, s.n_group, s.topk_group, s.scaling,
                  s.renormalize, self.moe_cfg, slot=self._count_row(li), eps=s.eps, norm_w=L["mlp_norm"],
                  norm_out=self.a, row_block=self.router_rows,
                  tile_block_m=self.tiles.get("moe") if self.tiles_in_select else None)
            if stats is not None:
                stats.counts.append(self.ws.counts[: s.experts].clone())
            if "moe" in self.tiles and not self.tiles_in_select:
                M.moe_tiles(self.ws, self.tiles["moe"])
            M.moe_experts(self.a, L["w13"], L["w2"], self.ws, s.top_k, self.moe_cfg)
            prev = (self.ws, s.top_k, E1 == s.experts + 1)
        Nm.add_rmsnorm(self.h, W["final_norm"], self.a, pairs=prev[0].pair_out, top_k=prev[1], shared=prev[2],
                       eps=s.eps, **self.norm_kw)
        if head:
            logits = self.logits.view(R, -1)
            rows_linear(self.a, W["lm_head"], logits, self.lin_cfg["lm_head"])
            Lg.logits_stats(logits, self.stat_part, self.pred.view(-1), self.conf.view(-1), self.entropy.view(-1),
                            nchunk=self.stat_nchunk)

    def _attention(self, L, kc, vc):
        """QK-norm + RoPE + K/V write, then attention of every slot into ``o`` (``attn_impl``, see __init__)."""
        s = self.s
        if self.attn_impl == "single":
            A.qk_norm_rope_kv(self.qkv, L["q_norm"], L["k_norm"], self.cos, self.sin, self.cache_len, self.q,
                              kc, vc, s.nq, s.nkv, rot=s.rot_dim, eps=s.eps)
            A.block_attention(self.q, kc, vc, self.cache_len, self.o, self.aws)
            return
        AS.slot_qk_norm_rope_kv(self.qkv, L["q_norm"], L["k_norm"], self.cos, self.sin, self.cache_len, self.q, kc,
                                vc, s.nq, s.nkv, rot=s.rot_dim, eps=s.eps, rows=self.qkn_rows)
        AS.slot_attention(self.q, kc, vc, self.cache_len, self.o, self.aws, whole_min_slots=self.attn_whole_min)

    def _count_row(self, li: int):
        """Counts row of MoE layer ``li`` (each layer's select kernel clears the next layer's row); None (clear
        its own row with a memset) when there is only one MoE layer, whose "next" row would be its own."""
        n_moe = self.s.layers - self.s.first_dense
        return li - self.s.first_dense if n_moe > 1 else None

    def distinct_experts(self) -> list[int]:
        """Run one eager forward (no head) and return the routed experts touched by any slot, per MoE layer
        (host sync; for :func:`batched_round_bytes`)."""
        st = _Stats()
        self.forward(head=False, stats=st)
        return [int((c > 0).sum().item()) for c in st.counts]
