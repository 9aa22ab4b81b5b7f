"""Warp-specialised 16-bit expert GEMMs (gate+up, down) in Gluon for Hopper (sm_90a): the BF16 sibling of
:mod:`.moe_w4_ws`, for the batched round, whose 16-bit expert GEMMs at 32 slots stream their weights at ≈ 74 % of
the copy bandwidth with the Triton kernels of :mod:`.moe_gemm` (docs/perf.md, "Where the time goes"). Their torch
reference is :func:`.moe_gemm.expert_gemms_reference`. A variant, not the engine's default.

Contract (the BF16 launches of :func:`.moe_gemm.moe_gate_up` / :func:`.moe_gemm.moe_down`: same inputs, same
output buffers). Gate+up: x [T, H] bf16; w13 [E1, 2N, H] bf16 contiguous (gate rows, then up rows; the shared
expert, if any, at index E = E1 - 1); a :class:`~.route.MoEWorkspace` ``ws`` after the routing (counts, pairs, pair_w,
optionally the tile table of :func:`.route.moe_tiles`). For every pair p = (token t, expert e): ``ws.inter[p, n]``
(bf16 [P1, N]) = bf16(silu(a_g) · a_u · pair_w[p]), a_g = Σ_k x[t, k] · w13[e, n, k] and a_u over row N + n, fp32
accumulation. Down: w2 [E1, H, N] bf16; ``ws.pair_out[p, h]`` ([P1, H], its dtype) = Σ_n inter[p, n] · w2[e, h, n],
summed in fp32 and rounded once at the store.

Numbers: the wgmma accumulates in fp32 in K order, BLOCK_K inputs per step, 16 per MMA, as the Triton kernels' K
loop does; the operands are swapped (weights are operand A, M = 128 weight rows; the pairs are N). A pair's numbers
do not depend on BLOCK_M (GPU test); against the Triton kernels they are checked to the bf16 rounding of inter, not
bit for bit, so ``IMPL`` is one setting for every slot count.

Pipeline (per program: one expert, R = 128 weight rows — gate+up: BLOCK_N = 64 gate rows and the same 64 up rows;
down: BLOCK_N = 128 output rows — and up to BLOCK_M pairs): ``gl.warp_specialize`` forks a loader partition
(``LOADER_WARPS`` warps, ``LOADER_REGS`` registers) that ``cp.async``-copies the weight tile [R, BLOCK_K] and the
activation rows [BLOCK_M, BLOCK_K] (gathered by token for gate+up, by pair for down; rows past the count zero-filled)
of each K step into ring slot k % STAGES (128-byte swizzled, wgmma's shared layout), up to STAGES steps ahead,
completion arriving on ``ready[slot]``; and the consumer warpgroup, which issues the wgmma of step k with both
operands in shared memory, keeps one in flight, and hands the slot of step k-1 back on ``empty``. Epilogue as the
4-bit kernels' (gate+up through shared memory; down from the accumulator). The program prologue (which expert,
tile and pairs) is :func:`.moe_w4_ws._ws_slot`.

Where it stands: both kernels build ahead of time for sm_90a on Triton 3.6 (:func:`aot_build`,
tests/kernels/test_moe_ws.py) and pass their GPU tests on an H100, where they are slower than the Triton kernels
(32 slots: gate+up 413.5 against 381.1 µs, down 250.3 against 242.9 µs; batch 32 BF16 7,801 against 8,671 tok/s;
docs/perf.md). Errors: RuntimeError without Triton 3.6's Gluon or off Hopper;
ValueError for weights that are not bf16 [E1, out, in] contiguous, a compact active-list workspace, or tiles it does
not take.
"""
from __future__ import annotations

import torch

from ._triton import triton
from .moe_w4_ws import HAS_GLUON

__all__ = ["moe_gate_up_ws16", "moe_down_ws16", "aot_build", "real_case16", "WS16_TILES_DEFAULT"]

#: tiles: BLOCK_N (gate+up 64: R = 128 MMA rows; down 128), BLOCK_M pairs (the MMA's N: 16 / 32 / 64), BLOCK_K
#: inputs per K step (64: one 128-byte swizzle row of bf16), STAGES ring slots (each R·BLOCK_K·2 + BLOCK_M·BLOCK_K·2
#: bytes: 24 KB at BLOCK_M 64), the loader partition's warps and registers, MAXNREG registers per thread at launch
_WS16 = dict(BLOCK_M=64, BLOCK_K=64, STAGES=4, LOADER_WARPS=4, LOADER_REGS=40, MAXNREG=80)
WS16_TILES_DEFAULT = {"gate_up": dict(_WS16, BLOCK_N=64), "down": dict(_WS16, BLOCK_N=128)}

if HAS_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                                  warpgroup_mma_wait)

    from .moe_w4_ws import _ws_barriers, _ws_loader_rows, _ws_slot, _ws_weight_rows

    @gluon.jit
    def _ws16_loader(a_ptr, w_ptr, counts_ptr, pairs_ptr, tiles_ptr, T, stride_at, w_ring, a_ring, ready, empty,
                     K: gl.constexpr, ROWS: gl.constexpr, HALF: gl.constexpr, TOPK: gl.constexpr, MAXC: gl.constexpr,
                     BLOCK_M: gl.constexpr, R: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr,
                     TILES: gl.constexpr, LOADER_WARPS: gl.constexpr):
        """Worker partition: cp.async of the weight tile and the activation rows of every K step into ring slot
        k % STAGES. Weight rows of the program's expert (ROWS rows of K inputs): with HALF > 0 (gate+up) R/2 rows from
        pid_n · R/2 and the same R/2 rows HALF further, else R rows from pid_n · R. Activation rows: with TOPK > 0
        the pair's token (a_ptr = x), else the pair itself (inter)."""
        LX: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (BLOCK_K // 8), BLOCK_K // 8], [LOADER_WARPS, 1], [1, 0])
        e, pid_n, mmask, arow = _ws_loader_rows(counts_ptr, pairs_ptr, tiles_ptr, T, TOPK, MAXC, BLOCK_M, TILES,
                                                gl.SliceLayout(1, LX))
        rows = _ws_weight_rows(pid_n, R, HALF, gl.SliceLayout(1, LX))
        cols = gl.expand_dims(gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, LX)), 0)
        wbase = w_ptr + e.to(gl.int64) * (ROWS * K)
        w_off = gl.expand_dims(rows * K, 1) + cols
        a_off = gl.expand_dims(arow * stride_at, 1) + cols
        am = gl.expand_dims(mmask, 1)
        for k in range(K // BLOCK_K):
            slot = k % STAGES
            mbarrier.wait(empty.index(slot), ((k // STAGES) & 1) ^ 1, pred=k >= STAGES)
            k0 = k * BLOCK_K
            async_copy.async_copy_global_to_shared(w_ring.index(slot), wbase + w_off + k0,
                                                   eviction_policy="evict_first")
            async_copy.async_copy_global_to_shared(a_ring.index(slot), a_ptr + a_off + k0, mask=am)
            async_copy.mbarrier_arrive(ready.index(slot), increment_count=False)

    @gluon.jit
    def _ws16_consumer(w_ring, a_ring, ready, empty, BLOCK_M: gl.constexpr, R: gl.constexpr, BLOCK_K: gl.constexpr,
                       K: gl.constexpr, STAGES: gl.constexpr):
        """Default partition (one warpgroup): the wgmma of step k (both operands in shared memory) while the loader
        fills later slots; one MMA in flight. Returns the fp32 accumulator [R, BLOCK_M] (weight rows x pairs)."""
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, BLOCK_M, 16])
        acc = gl.zeros((R, BLOCK_M), dtype=gl.float32, layout=mma)
        for k in range(K // BLOCK_K):
            slot = k % STAGES
            mbarrier.wait(ready.index(slot), (k // STAGES) & 1)
            fence_async_shared()  # cp.async wrote through the generic proxy; wgmma reads through the async one
            acc = warpgroup_mma(w_ring.index(slot), a_ring.index(slot).permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
            gl.thread_barrier()  # every warp is past the wgmma of step k-1 before slot k-1 is handed back
            mbarrier.arrive(empty.index((k + STAGES - 1) % STAGES), pred=k > 0)
        return (warpgroup_mma_wait(num_outstanding=0, deps=(acc,)),)  # a tuple: warp_specialize flattens it

    @gluon.jit
    def _ws16_mainloop(a_ptr, w_ptr, counts_ptr, pairs_ptr, tiles_ptr, T, stride_at, K: gl.constexpr,
                       ROWS: gl.constexpr, HALF: gl.constexpr, TOPK: gl.constexpr, MAXC: gl.constexpr,
                       BLOCK_M: gl.constexpr, R: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr,
                       TILES: gl.constexpr, LOADER_WARPS: gl.constexpr, LOADER_REGS: gl.constexpr):
        """The rings, their barriers and the warp-specialised K loop; returns the accumulator [R, BLOCK_M]."""
        sl: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        w_ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES, R, BLOCK_K], sl)
        a_ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_M, BLOCK_K], sl)
        ready, empty = _ws_barriers(STAGES, LOADER_WARPS)
        return gl.warp_specialize([
            (_ws16_consumer, (w_ring, a_ring, ready, empty, BLOCK_M, R, BLOCK_K, K, STAGES)),
            (_ws16_loader, (a_ptr, w_ptr, counts_ptr, pairs_ptr, tiles_ptr, T, stride_at, w_ring, a_ring, ready,
                            empty, K, ROWS, HALF, TOPK, MAXC, BLOCK_M, R, BLOCK_K, STAGES, TILES, LOADER_WARPS)),
        ], [LOADER_WARPS], [LOADER_REGS])[0]

    @gluon.jit
    def _ws16_gate_up(x_ptr, w_ptr, counts_ptr, pairs_ptr, pairw_ptr, inter_ptr, tiles_ptr, T, stride_xt,
                      H: gl.constexpr, N: gl.constexpr, TOPK: gl.constexpr, MAXC: gl.constexpr, BLOCK_M: gl.constexpr,
                      BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr, TILES: gl.constexpr,
                      LOADER_WARPS: gl.constexpr, LOADER_REGS: gl.constexpr):
        """inter[p, n] = silu(a_g) · a_u · pair_w[p] over every expert's pairs (module docstring)."""
        gl.static_assert(BLOCK_K % 64 == 0, "BLOCK_K must be a multiple of 64")
        gl.static_assert(2 * BLOCK_N == 128, "one warpgroup of 128 MMA rows: BLOCK_N 64")
        R: gl.constexpr = 2 * BLOCK_N
        EL: gl.constexpr = gl.BlockedLayout([2, 1], [32, 1], [1, 4], [0, 1])  # [BLOCK_N, BLOCK_M], n fastest
        e, pid_n, mmask, p, idle = _ws_slot(counts_ptr, pairs_ptr, tiles_ptr, BLOCK_M, MAXC, TILES,
                                            gl.SliceLayout(0, EL))
        if idle:
            return
        acc = _ws16_mainloop(x_ptr, w_ptr, counts_ptr, pairs_ptr, tiles_ptr, T, stride_xt, H, 2 * N, N, TOPK, MAXC,
                             BLOCK_M, R, BLOCK_K, STAGES, TILES, LOADER_WARPS, LOADER_REGS)
        acc_s = gl.allocate_shared_memory(gl.float32, [R, BLOCK_M], gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0]))
        acc_s.store(acc)
        gl.thread_barrier()
        a_g = acc_s.slice(0, BLOCK_N).load(EL)
        a_u = acc_s.slice(BLOCK_N, BLOCK_N).load(EL)
        pw = gl.load(pairw_ptr + p, mask=mmask, other=0.0)
        h = a_g * (1 / (1 + gl.exp(-a_g))) * a_u * gl.expand_dims(pw, 0)  # as tl.sigmoid
        offs_n = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, EL))
        gl.store(inter_ptr + gl.expand_dims(p, 0) * N + gl.expand_dims(offs_n, 1), h.to(gl.bfloat16),
                 mask=gl.expand_dims(mmask, 0))

    @gluon.jit
    def _ws16_down(inter_ptr, w_ptr, counts_ptr, pairs_ptr, out_ptr, tiles_ptr, H: gl.constexpr, N: gl.constexpr,
                   MAXC: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                   STAGES: gl.constexpr, TILES: gl.constexpr, LOADER_WARPS: gl.constexpr,
                   LOADER_REGS: gl.constexpr):
        """pair_out[p, h] = Σ_n inter[p, n] · w2[e, h, n] (fp32 sum, stored in out's dtype), BLOCK_N = 128 rows h
        per program."""
        gl.static_assert(BLOCK_K % 64 == 0, "BLOCK_K must be a multiple of 64")
        gl.static_assert(BLOCK_N == 128, "one warpgroup of 128 MMA rows: BLOCK_N 128")
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, BLOCK_M, 16])
        e, pid_n, mmask, p, idle = _ws_slot(counts_ptr, pairs_ptr, tiles_ptr, BLOCK_M, MAXC, TILES,
                                            gl.SliceLayout(0, mma))
        if idle:
            return
        acc = _ws16_mainloop(inter_ptr, w_ptr, counts_ptr, pairs_ptr, tiles_ptr, 0, N, N, H, 0, 0, MAXC, BLOCK_M,
                             BLOCK_N, BLOCK_K, STAGES, TILES, LOADER_WARPS, LOADER_REGS)
        offs_h = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, mma))
        gl.store(out_ptr + gl.expand_dims(p, 0) * H + gl.expand_dims(offs_h, 1), acc.to(out_ptr.dtype.element_ty),
                 mask=gl.expand_dims(mmask, 0))


def _check(name: str, act: torch.Tensor, w, ws, c: dict) -> None:
    if not HAS_GLUON:
        raise RuntimeError(f"{name}: needs triton.experimental.gluon with the Triton 3.6 API")
    if not (act.is_cuda and torch.cuda.get_device_capability(act.device)[0] == 9):
        raise RuntimeError(f"{name}: needs a Hopper GPU (sm_90a)")
    if not (isinstance(w, torch.Tensor) and w.dtype == torch.bfloat16 == act.dtype and w.dim() == 3
            and w.is_contiguous()):
        raise ValueError(f"{name}: needs bf16 experts [E1, out, in], contiguous, and bf16 activations (got "
                         f"{type(w).__name__} {getattr(w, 'dtype', '')}); 4-bit experts: moe_w4_ws")
    if ws.compact:
        raise ValueError(f"{name}: the compact active-list grid is not implemented")
    if c["BLOCK_M"] not in (16, 32, 64) or c["BLOCK_K"] % 64:
        raise ValueError(f"{name}: tiles {c}: BLOCK_M must be 16, 32 or 64 and BLOCK_K a multiple of 64")


def _kwargs(c: dict, kw: dict) -> dict:
    return dict(BLOCK_M=c["BLOCK_M"], BLOCK_N=c["BLOCK_N"], BLOCK_K=c["BLOCK_K"], STAGES=c["STAGES"],
                TILES=bool(kw.get("TILES")), LOADER_WARPS=c["LOADER_WARPS"], LOADER_REGS=c["LOADER_REGS"],
                num_warps=4, **({"maxnreg": c["MAXNREG"]} if c.get("MAXNREG") else {}))


def _tiles(kernel: str, tiles: dict | None) -> dict:
    extra = set(tiles or {}) - set(WS16_TILES_DEFAULT[kernel]) - {"IMPL", "num_warps", "num_stages", "TMA"}
    if extra:
        raise ValueError(f"moe_{kernel}_ws16: tile keys {sorted(extra)} are not this kernel's; it takes "
                         f"{sorted(WS16_TILES_DEFAULT[kernel])} (num_warps / num_stages / TMA are the Triton kernels')")
    return {**WS16_TILES_DEFAULT[kernel], **{k: v for k, v in (tiles or {}).items() if k in WS16_TILES_DEFAULT[kernel]}}


def moe_gate_up_ws16(x: torch.Tensor, w13: torch.Tensor, ws, top_k: int, tiles: dict | None = None) -> None:
    """The Gluon gate+up over every expert's pairs (grid of :func:`.moe_gemm._launch_grid`); writes ``ws.inter``.
    x [T, H] bf16 (rows of stride ``x.stride(0)``, unit column stride), w13 [E1, 2N, H] bf16. Raises as the module
    says."""
    from .moe_gemm import _launch_grid

    c = _tiles("gate_up", tiles)
    _check("moe_gate_up_ws16", x, w13, ws, c)
    T, H = x.shape
    E1, twoN, _ = w13.shape
    N = twoN // 2
    if x.stride(1) != 1 or H % c["BLOCK_K"] or N % c["BLOCK_N"]:
        raise ValueError(f"moe_gate_up_ws16: x [T, H] with unit column stride, H % BLOCK_K == 0 and N % BLOCK_N == 0 "
                         f"(H {H}, N {N}, tiles {c})")
    grid, kw = _launch_grid(ws, E1, c["BLOCK_M"], N // c["BLOCK_N"], "moe_gate_up_ws16")
    _ws16_gate_up[grid](x, w13, ws.counts, ws.pairs, ws.pair_w, ws.inter, kw.get("tiles_ptr", ws.counts), T,
                        x.stride(0), H=H, N=N, TOPK=top_k, MAXC=ws.T_PAD, **_kwargs(c, kw))


def moe_down_ws16(w2: torch.Tensor, ws, tiles: dict | None = None) -> None:
    """The Gluon down over every expert's pairs; writes ``ws.pair_out`` ([P1, H], its dtype) from ``ws.inter``. w2
    [E1, H, N] bf16. Raises as the module says."""
    from .moe_gemm import _launch_grid

    c = _tiles("down", tiles)
    _check("moe_down_ws16", ws.inter, w2, ws, c)
    E1, H, N = w2.shape
    if ws.inter.shape[1] != N or N % c["BLOCK_K"] or H % c["BLOCK_N"]:
        raise ValueError(f"moe_down_ws16: inter [P1, {N}], N % BLOCK_K == 0 and H % BLOCK_N == 0 (H {H}, N {N}, "
                         f"tiles {c})")
    grid, kw = _launch_grid(ws, E1, c["BLOCK_M"], H // c["BLOCK_N"], "moe_down_ws16")
    _ws16_down[grid](ws.inter, w2, ws.counts, ws.pairs, ws.pair_out, kw.get("tiles_ptr", ws.counts), H=H, N=N,
                     MAXC=ws.T_PAD, **_kwargs(c, kw))


#: LLaDA2.1-mini's shapes at 32 slots of a 32-token block (T_PAD 1024) for the ahead-of-time build
AOT_SHAPES = dict(H=2048, N=512, TOPK=8, MAXC=1024)


def aot_build(kernel: str = "gate_up", cc: tuple[int, int] = (9, 0), tiles: dict | None = None, **shapes):
    """Compile ``kernel`` ("gate_up" / "down") for ``cc`` without a GPU (``GluonASTSource``, ptxas included) at
    :data:`AOT_SHAPES` (overridden by ``shapes``) and ``tiles``; returns the compiled kernel. RuntimeError without
    Triton 3.6's Gluon."""
    if not HAS_GLUON:
        raise RuntimeError("aot_build: needs triton.experimental.gluon with the Triton 3.6 API")
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    fn = {"gate_up": _ws16_gate_up, "down": _ws16_down}[kernel]
    c = {**WS16_TILES_DEFAULT[kernel], "TILES": False, **(tiles or {})}
    const = {k: v for k, v in dict(AOT_SHAPES, **shapes).items() if k in fn.arg_names}
    const.update({k: c[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "STAGES", "TILES", "LOADER_WARPS",
                                    "LOADER_REGS")})
    ptrs = dict(x_ptr="*bf16", inter_ptr="*bf16", w_ptr="*bf16", counts_ptr="*i32", pairs_ptr="*i32",
                pairw_ptr="*fp32", out_ptr="*bf16", tiles_ptr="*i32", T="i32", stride_xt="i32")
    sig = {n: ptrs.get(n, "constexpr") for n in fn.arg_names}
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in sig
             if n.endswith("_ptr") or n == "stride_xt"}
    opts = dict(num_warps=4, **({"maxnreg": c["MAXNREG"]} if c.get("MAXNREG") else {}))
    return triton.compile(GluonASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", cc[0] * 10 + cc[1], 32),
                          options=opts)


def real_case16(slots: int, block_m: int = 64, seed: int = 0, device="cuda", pair_dtype=None):
    """``(x, w13, w2, ws, top_k)`` of the batched round's expert GEMMs at ``slots`` requests of a 32-token block (T =
    32 · slots), LLaDA2.1-mini's shapes: random bf16 experts w13 [257, 1024, 2048], w2 [257, 2048, 512] (the shared
    expert at index 256), random top-8 routing with random weights aligned into a workspace with its tile table
    (``block_m``), ``ws.inter`` filled with random bf16 rows, ``ws.pair_out`` in ``pair_dtype`` (default bf16). For the
    GPU tests and ``scripts/bench_ws16.py``."""
    from .route import MoEWorkspace, moe_align, moe_tiles

    H, N, E, k = 2048, 512, 256, 8
    T = 32 * slots
    g = torch.Generator(device=device).manual_seed(seed)
    w13 = (torch.randn(E + 1, 2 * N, H, device=device, generator=g) * 0.02).to(torch.bfloat16)
    w2 = (torch.randn(E + 1, H, N, device=device, generator=g) * 0.02).to(torch.bfloat16)
    x = torch.randn(T, H, device=device, generator=g).to(torch.bfloat16)
    gc = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=gc)[:k] for _ in range(T)]).to(device)
    ws = MoEWorkspace(T, H, N, E, E + 1, k, torch.bfloat16, device, split_k=1, pair_dtype=pair_dtype)
    moe_align(ids, torch.rand(T, k, generator=gc).to(device), ws)
    moe_tiles(ws, block_m, static=True)
    ws.inter.copy_(torch.randn(ws.inter.shape, device=device, generator=g).to(torch.bfloat16))
    return x, w13, w2, ws, k
