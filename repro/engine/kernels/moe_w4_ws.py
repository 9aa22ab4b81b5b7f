"""Warp-specialised 4-bit expert GEMMs (gate+up, down) in Gluon (Triton's low-level dialect) for Hopper (sm_90a),
beside their torch references :func:`gate_up_ws_reference`, :func:`down_ws_reference`. A variant, not wired into the
engine's default path.

Contract (the hop-layout launches of :func:`.moe_gemm.moe_gate_up` / :func:`.moe_gemm.moe_down`: same inputs, same
output buffers, so each can stand in for its launch). Gate+up: x [T, H] bf16; w13 an
:class:`~repro.checkpoint.nvfp4.NVFP4Experts` [E, 2N, H] in layout "hop" (q uint8 [E, 2N, H/2], s uint8
[E, 2N, H/16] E4M3 bits, g fp32 [E, 2] gate / up), the shared expert in ``.shared`` ([2N, H] bf16, index E); a
:class:`~.route.MoEWorkspace` ``ws`` after the routing (counts [E1+1], pairs [E1, T_PAD], pair_w [P1] fp32, optionally
the tile table of :func:`.route.moe_tiles`). For every pair p = (token t, expert e): ``ws.inter[p, n]`` (bf16
[P1, N]) = bf16(silu(a_g) · a_u · pair_w[p]), ``a_g = (Σ_k x[t, k] · w'[e, n, k]) · g[e, 0] · 2^8``, ``a_u`` the same
over rows N + n with g[e, 1]. Down: w2 [E, H, N] (g [E, 1]); ``ws.pair_out[p, h]`` ([P1, H], its dtype) =
(Σ_n inter[p, n] · w'[e, h, n]) · g[e, 0] · 2^8, computed in fp32 and rounded once at the store.

Numeric contract (decode 5 of :mod:`.moe_w4_hop`): each weight enters the MMA as the exact bf16 block product
``w' = e2m1(code) · e4m3(s) · 2^-8`` (:func:`.moe_w4_hop.hop_decode_reference`), the MMA accumulates in fp32, the
global scale g · 2^8 multiplies the fp32 accumulator. The K order is the Triton swap-AB kernels' (``W4_SWAP``:
BLOCK_K steps in order, wgmma with the weights as operand A), so the two should agree bit for bit; the default
(non-swap) decode-5 kernels split K into even / odd inputs and agree to fp32 rounding only.

Pipeline (per program: one expert, R = 128 weight rows — gate+up: BLOCK_N = 64 gate rows and the same 64 up rows;
down: BLOCK_N = 128 output rows — and up to BLOCK_M = 16 pairs): ``gl.warp_specialize`` forks

* a loader partition (``LOADER_WARPS`` = 4 warps, ``LOADER_REGS`` = 24 registers): for each K step, up to ``STAGES`` ahead,
  ``cp.async`` of the packed words [R, BK/8] int32 (16-byte copies), the scale bytes [R, BK/16] (4-byte copies) and
  the activation rows [BLOCK_M, BK] bf16 (gathered by token for gate+up, by pair for down; rows past the count
  zero-filled) into ring slot k % STAGES; their completion arrives on ``ready[slot]`` (``cp.async.mbarrier.arrive
  .noinc``, one arrival per loader thread). It waits on ``empty[slot]`` before refilling a slot.
* the default partition (one warpgroup): waits on ``ready``, fences (cp.async writes through the generic proxy, wgmma
  reads through the async one), reads the words and scales of step k into registers in a layout whose rows sit where
  operand A has them (:func:`_word_layout`), decodes whole words (inline PTX, decode 5: 13 integer and 4
  ``mul.rn.bf16x2`` per 8 weights), moves the tile into operand A [R, BK] with a warp-local transpose (st.shared +
  ldmatrix, no CTA barrier), issues the wgmma (swap-AB: M = R weight rows, N = BLOCK_M pairs, B = the activation
  tile in shared memory) asynchronously and keeps one in flight (``warpgroup_mma_wait(1)``): the decode of step k+1
  runs while the MMA of step k does. It then hands back the slot of step k-1 (one ``bar.sync`` of the warpgroup,
  then one arrival). Epilogue: gate+up through shared memory (split into gate / up, scaled, SiLU · up · pair_w, bf16);
  down straight from the accumulator (scaled, fp32).

Programs: the grid of :func:`.moe_gemm._launch_grid` (plain (E1, n-tiles, m-blocks) or the tile table; not the
compact active list). The shared expert (bf16): by default its programs exit and the wrappers run it through the
Triton kernel over a static tile table of its m-blocks (one more launch per GEMM; the Triton kernels do it in the same
launch, as they do here with the tile key ``SH_IN``: operand A its bf16 rows, loaded by the consumer; not bit-equal
to the Triton kernel's shared rows, whose MMA shapes differ).

Where it stands: both kernels build ahead of time for sm_90a on Triton 3.6 (:func:`aot_build`,
tests/kernels/test_moe_w4_ws.py: 8 warps per program, 64 registers per thread at launch, 28.7 KB of shared memory
at STAGES 4: 4 programs per SM). On an H100 their GPU tests pass (bit-identical to the Triton swap-AB decode-5
kernels) and they are slower than the Triton decode-5 kernels (one slot: gate+up 158.9 against 117.6 µs; the 4-bit
round at P = 1k 5.223 against 4.359 ms; docs/perf.md). ``HAS_GLUON`` is False (and the module still imports) without
``triton.experimental.gluon`` or with a Gluon whose ``warp_specialize`` is not 3.6's (a list of (function, args)
pairs, then the worker warps and registers).
"""
from __future__ import annotations

import inspect

import torch

from ._triton import HAS_TRITON, triton
from .moe_w4_hop import HOP_WORD_PTX

__all__ = ["HAS_GLUON", "gate_up_ws_reference", "down_ws_reference", "moe_gate_up_ws", "moe_down_ws", "aot_build",
           "WS_TILES_DEFAULT"]

#: tiles of the Gluon kernels: BLOCK_N (gate+up: 64 gate rows, R = 2·BLOCK_N = 128 MMA rows over one warpgroup;
#: down: BLOCK_N = R = 128 output rows), BLOCK_M pairs (the MMA's N), BLOCK_K inputs per K step (a multiple of 64:
#: a row's scale bytes per step are >= 4 bytes, the smallest cp.async), STAGES ring slots, the loader partition's
#: warps and registers, MAXNREG the registers per thread at launch (the program has 8 warps: 4 consumer, the loader
#: warpgroup; Triton's setmaxnreg then gives the consumer (8·MAXNREG − 4·LOADER_REGS) / 4, here 104: without a cap a
#: program takes 255 registers per thread, one per SM; at 64, 4 per SM; no spills in ptxas -v at these values)
#: SH_IN: the shared expert's programs in the same launch (operand A its bf16 rows, loaded from global memory by the
#: consumer) instead of a second launch of the Triton kernel
_WS = dict(BLOCK_M=16, BLOCK_K=64, STAGES=4, LOADER_WARPS=4, LOADER_REGS=24, MAXNREG=64, SH_IN=False)
WS_TILES_DEFAULT = {"gate_up": dict(_WS, BLOCK_N=64), "down": dict(_WS, BLOCK_N=128)}

HAS_GLUON = False
if HAS_TRITON:
    try:  # pragma: no cover - depends on the installed Triton
        from triton.experimental import gluon
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon.language.nvidia.ampere import async_copy
        from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                                      warpgroup_mma_wait)

        HAS_GLUON = "worker_num_regs" in inspect.signature(gl.warp_specialize).parameters and \
            "functions_and_args" in inspect.signature(gl.warp_specialize).parameters
    except Exception:  # noqa: BLE001 - no Gluon, or another API
        HAS_GLUON = False


def gate_up_ws_reference(x, w13, ids, weights):
    """torch reference of the contract for explicit pairs: x [T, H] bf16; w13 NVFP4Experts [E, 2N, H] in layout "hop"
    (shared expert in ``.shared`` as index E, bf16 weights as they are); ids [T, k] int64, weights [T, k] fp32.
    Returns inter [T, k, N] bf16: w' = hop_decode_reference (exact bf16 products), fp32 matmul, g · 2^8 on the
    accumulator, SiLU(gate) · up · weight in fp32, one rounding."""
    from .moe_w4_hop import hop_decode_reference, hop_shift

    assert w13.layout == "hop" and w13.parts == 2
    E, twoN, H = w13.shape
    N = twoN // 2
    xf = x.float()
    out = torch.empty(*ids.shape, N, dtype=x.dtype, device=x.device)
    unit = 2.0 ** hop_shift(x.dtype)
    for e in ids.unique().tolist():
        sel = ids == e
        t = sel.nonzero()[:, 0]
        if e == E:
            acc = xf[t] @ w13.shared.float().t()
            a_g, a_u = acc[:, :N], acc[:, N:]
        else:
            w = hop_decode_reference(w13.q[e], w13.s[e], x.dtype).float()  # [2N, H]
            acc = xf[t] @ w.t()
            a_g = acc[:, :N] * (w13.g[e, 0] * unit)
            a_u = acc[:, N:] * (w13.g[e, 1] * unit)
        h = a_g * (1.0 / (1.0 + torch.exp(-a_g))) * a_u * weights.float()[sel][:, None]
        out[sel] = h.to(x.dtype)
    return out


def down_ws_reference(inter, w2, ids):
    """torch reference of the down kernel's contract for explicit pairs: inter [T, k, N] (bf16, as stored), w2
    NVFP4Experts [E, H, N] in layout "hop" (shared expert as index E); ids [T, k]. Returns pair_out [T, k, H] fp32 =
    (inter · w'ᵀ) · g · 2^8 (the shared expert: inter · Wᵀ)."""
    from .moe_w4_hop import hop_decode_reference, hop_shift

    assert w2.layout == "hop" and w2.parts == 1
    E, H, N = w2.shape
    out = torch.empty(*ids.shape, H, dtype=torch.float32, device=inter.device)
    for e in ids.unique().tolist():
        sel = ids == e
        a = inter[sel].float()
        if e == E:
            out[sel] = a @ w2.shared.float().t()
        else:
            w = hop_decode_reference(w2.q[e], w2.s[e], inter.dtype).float()
            out[sel] = (a @ w.t()) * (w2.g[e, 0] * 2.0 ** hop_shift(inter.dtype))
    return out


if HAS_GLUON:
    # decode 5 of one "hop" word (moe_w4_hop.HOP_WORD_PTX)
    _HOP_WORD_ASM = gl.constexpr(HOP_WORD_PTX)

    @gluon.jit
    def _ws_slot(counts_ptr, pairs_ptr, tiles_ptr, BLOCK_M: gl.constexpr, MAXC: gl.constexpr, TILES: gl.constexpr,
                 layout: gl.constexpr):
        """(e, pid_n, mmask, p, idle) of this program, as ``moe_gemm._expert_slot`` (plain grid or tile table)."""
        if TILES:
            pid_n = gl.program_id(1)
            e_raw = gl.load(tiles_ptr + 2 * gl.program_id(0))
            pid_m = gl.load(tiles_ptr + 2 * gl.program_id(0) + 1)
            e = gl.maximum(e_raw, 0)
            cnt = gl.load(counts_ptr + e)
            cnt = gl.where(e_raw >= 0, cnt, 0)
        else:
            e = gl.program_id(0)
            pid_n = gl.program_id(1)
            pid_m = gl.program_id(2)
            cnt = gl.load(counts_ptr + e)
        offs_m = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=layout)
        mmask = offs_m < cnt
        p = gl.load(pairs_ptr + e * MAXC + offs_m, mask=mmask, other=0)
        return e, pid_n, mmask, p, pid_m * BLOCK_M >= cnt

    @gluon.jit
    def _ws_loader_rows(counts_ptr, pairs_ptr, tiles_ptr, T, TOPK: gl.constexpr, MAXC: gl.constexpr,
                        BLOCK_M: gl.constexpr, TILES: gl.constexpr, layout: gl.constexpr):
        """(e, pid_n, mmask, activation row) of a loader partition's program: with TOPK > 0 the pair's token (the
        routed pairs t·TOPK + j, then the shared expert's T·TOPK + t), else the pair itself."""
        e, pid_n, mmask, p, _ = _ws_slot(counts_ptr, pairs_ptr, tiles_ptr, BLOCK_M, MAXC, TILES, layout)
        if TOPK > 0:
            arow = gl.where(p < T * TOPK, p // TOPK, p - T * TOPK)
        else:
            arow = p
        return e, pid_n, mmask, arow

    @gluon.jit
    def _ws_weight_rows(pid_n, R: gl.constexpr, HALF: gl.constexpr, layout: gl.constexpr):
        """The R weight rows of a program (1-D, ``layout``): with HALF > 0 (gate+up) R/2 rows from pid_n · R/2 and
        the same R/2 rows HALF further, else R rows from pid_n · R."""
        r = gl.arange(0, R, layout=layout)
        if HALF > 0:
            return gl.where(r < R // 2, pid_n * (R // 2) + r, HALF + pid_n * (R // 2) + r - R // 2)
        return pid_n * R + r

    @gluon.jit
    def _ws_barriers(STAGES: gl.constexpr, LOADER_WARPS: gl.constexpr):
        """(ready, empty) mbarriers of a ring of STAGES slots: ready counts one cp.async arrival per loader thread,
        empty the consumer's one arrival."""
        gl.static_assert(STAGES >= 2, "the consumer hands a slot back one step late: STAGES >= 2")
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=32 * LOADER_WARPS)
            mbarrier.init(empty.index(i), count=1)
        return ready, empty

    @gluon.jit
    def _ws_loader(a_ptr, q_ptr, s_ptr, counts_ptr, pairs_ptr, tiles_ptr, T, stride_at, q_ring, s_ring, a_ring,
                   ready, empty, K: gl.constexpr, ROWS: gl.constexpr, HALF: gl.constexpr, TOPK: gl.constexpr,
                   MAXC: gl.constexpr, BLOCK_M: gl.constexpr, R: gl.constexpr, BLOCK_K: gl.constexpr,
                   STAGES: gl.constexpr, TILES: gl.constexpr, LOADER_WARPS: gl.constexpr, E_SH: gl.constexpr):
        """Worker partition: cp.async of the packed words, scale bytes and activation rows of every K step into ring
        slot k % STAGES, STAGES steps ahead of the consumer. Weight rows of the program's expert (ROWS rows of K
        inputs): with HALF > 0 (gate+up) R/2 rows from pid_n · R/2 and the same R/2 rows HALF further, else R rows
        from pid_n · R. Activation rows: with TOPK > 0 the pair's token (a_ptr = x), else the pair itself (inter)."""
        HB: gl.constexpr = BLOCK_K // 16
        LQ: gl.constexpr = gl.BlockedLayout([1, 4], [32 // (BLOCK_K // 32), BLOCK_K // 32], [LOADER_WARPS, 1], [1, 0])
        LS: gl.constexpr = gl.BlockedLayout([1, HB], [32, 1], [LOADER_WARPS, 1], [1, 0])
        LX: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (BLOCK_K // 8), BLOCK_K // 8], [LOADER_WARPS, 1], [1, 0])
        e, pid_n, mmask, arow = _ws_loader_rows(counts_ptr, pairs_ptr, tiles_ptr, T, TOPK, MAXC, BLOCK_M, TILES,
                                                gl.SliceLayout(1, LX))
        # the packed bytes as [R, BK/8] int32 words per K step, the scale bytes [R, BK/16]
        rows_q = _ws_weight_rows(pid_n, R, HALF, gl.SliceLayout(1, LQ))
        rows_s = _ws_weight_rows(pid_n, R, HALF, gl.SliceLayout(1, LS))
        qbase = q_ptr.to(gl.pointer_type(gl.int32), bitcast=True) + e.to(gl.int64) * (ROWS * K // 8)
        q_off = gl.expand_dims(rows_q * (K // 8), 1) + gl.expand_dims(gl.arange(0, BLOCK_K // 8,
                                                                               layout=gl.SliceLayout(0, LQ)), 0)
        s_off = gl.expand_dims(rows_s * (K // 16), 1) + gl.expand_dims(gl.arange(0, HB, layout=gl.SliceLayout(0, LS)), 0)
        sbase = s_ptr + e.to(gl.int64) * (ROWS * K // 16)
        a_off = gl.expand_dims(arow * stride_at, 1) + gl.expand_dims(gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, LX)), 0)
        am = gl.expand_dims(mmask, 1)
        for k in range(K // BLOCK_K):
            slot = k % STAGES
            mbarrier.wait(empty.index(slot), ((k // STAGES) & 1) ^ 1, pred=k >= STAGES)
            k0 = k * BLOCK_K
            if e != E_SH:  # the shared expert's rows are bf16, read by the consumer
                async_copy.async_copy_global_to_shared(q_ring.index(slot), qbase + q_off + k0 // 8,
                                                       eviction_policy="evict_first")
                async_copy.async_copy_global_to_shared(s_ring.index(slot), sbase + s_off + k0 // 16,
                                                       eviction_policy="evict_first")
            async_copy.async_copy_global_to_shared(a_ring.index(slot), a_ptr + a_off + k0, mask=am)
            async_copy.mbarrier_arrive(ready.index(slot), increment_count=False)

    @gluon.constexpr_function
    def _word_layout(R, HB):
        """Layout of the packed words [R, HB, 2] (row, 16-input block, word) in the consumer warpgroup: rows on the
        warps, lanes and registers exactly as in the wgmma's operand A (row r: warp (r % 64) // 16, lane group r % 8,
        registers for r // 8 % 2 and r // 64), the blocks on the lanes of a quad (and registers beyond 4 blocks), both
        words of a block in one thread. The decoded tile then differs from operand A only in which lane of a quad
        holds which inputs: the conversion stays inside each warp (no shared memory, no barrier)."""
        reg = [[0, 0, 1]] + [[0, 4 << i, 0] for i in range((HB // 4).bit_length() - 1)] + [[8, 0, 0]]
        reg += [[64 << i, 0, 0] for i in range((R // 64).bit_length() - 1)]
        return gl.DistributedLinearLayout(reg_bases=reg, lane_bases=[[0, 1, 0], [0, 2, 0], [1, 0, 0], [2, 0, 0],
                                                                     [4, 0, 0]],
                                          warp_bases=[[16, 0, 0], [32, 0, 0]], block_bases=[], shape=[R, HB, 2])

    @gluon.jit
    def _ws_decode(qw, sb):
        """w' [R, BK] bf16 of packed words qw [R, BK/16, 2] int32 and scale bytes sb [R, BK/16] uint8 (decode 5)."""
        sf = sb.to(gl.float8e4nv, bitcast=True).to(gl.float32)
        sv = (sf * 3.3230699894622895e35).to(gl.bfloat16).to(gl.int16, bitcast=True).to(gl.int32) & 0xFFFF
        sp = gl.expand_dims(sv | (sv << 16), 2)  # bf16x2(e4m3 · 2^118), one per word
        sp = gl.broadcast(sp, qw)[0]
        v0, v1, v2, v3, v4, v5, v6, v7 = gl.inline_asm_elementwise(
            _HOP_WORD_ASM, "=h,=h,=h,=h,=h,=h,=h,=h,r,r", [qw, sp],
            dtype=(gl.bfloat16, gl.bfloat16, gl.bfloat16, gl.bfloat16, gl.bfloat16, gl.bfloat16, gl.bfloat16,
                   gl.bfloat16), is_pure=True, pack=1)
        t = gl.join(gl.join(gl.join(v0, v4), gl.join(v2, v6)), gl.join(gl.join(v1, v5), gl.join(v3, v7)))
        return gl.reshape(t, (qw.shape[0], 16 * qw.shape[1]))

    @gluon.jit
    def _ws_consumer(q_ring, s_ring, x_ring, ready, empty, wsh_ptr, pid_n, is_sh, BLOCK_M: gl.constexpr,
                     R: gl.constexpr, BLOCK_K: gl.constexpr, K: gl.constexpr, HALF: gl.constexpr,
                     STAGES: gl.constexpr, SH_IN: gl.constexpr):
        """Default partition (one warpgroup): decode step k into operand A while the wgmma of step k-1 runs; returns
        the fp32 accumulator [R, BLOCK_M] (weight rows x tokens) of the K inputs. SH_IN and ``is_sh``: operand A is
        the shared expert's bf16 rows (``wsh_ptr``, rows of K inputs as the loader's), loaded from global memory."""
        HB: gl.constexpr = BLOCK_K // 16
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, BLOCK_M, 16])
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
        LQ: gl.constexpr = _word_layout(R, HB)
        acc = gl.zeros((R, BLOCK_M), dtype=gl.float32, layout=mma)
        if SH_IN:
            LW: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (BLOCK_K // 8), BLOCK_K // 8], [4, 1], [1, 0])
            rw = gl.arange(0, R, layout=gl.SliceLayout(1, LW))
            if HALF > 0:
                rw = gl.where(rw < R // 2, pid_n * (R // 2) + rw, HALF + pid_n * (R // 2) + rw - R // 2)
            else:
                rw = pid_n * R + rw
            w_off = gl.expand_dims(rw * K, 1) + gl.expand_dims(gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, LW)), 0)
        for k in range(K // BLOCK_K):
            slot = k % STAGES
            mbarrier.wait(ready.index(slot), (k // STAGES) & 1)
            fence_async_shared()  # cp.async wrote through the generic proxy; wgmma reads through the async one
            if SH_IN and is_sh:
                w = gl.convert_layout(gl.load(wsh_ptr + w_off + k * BLOCK_K), a_layout)
            else:
                qw = q_ring.index(slot).reshape([R, HB, 2]).load(LQ)
                sb = s_ring.index(slot).load(gl.SliceLayout(2, LQ))
                w = gl.convert_layout(_ws_decode(qw, sb), a_layout)
            acc = warpgroup_mma(w, x_ring.index(slot).permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
            gl.thread_barrier()  # every warp is past the wgmma of step k-1 before slot k-1 is handed back
            mbarrier.arrive(empty.index((k + STAGES - 1) % STAGES), pred=k > 0)
        return (warpgroup_mma_wait(num_outstanding=0, deps=(acc,)),)  # a tuple: warp_specialize flattens it

    @gluon.jit
    def _ws_mainloop(a_ptr, q_ptr, s_ptr, counts_ptr, pairs_ptr, tiles_ptr, T, stride_at, wsh_ptr, pid_n, is_sh,
                     K: gl.constexpr, ROWS: gl.constexpr, HALF: gl.constexpr, TOPK: gl.constexpr, MAXC: gl.constexpr,
                     BLOCK_M: gl.constexpr, R: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr,
                     TILES: gl.constexpr, LOADER_WARPS: gl.constexpr, LOADER_REGS: gl.constexpr,
                     E_SH: gl.constexpr, SH_IN: gl.constexpr):
        """The rings, their barriers and the warp-specialised K loop (loader partition + consumer warpgroup); returns
        the fp32 accumulator [R, BLOCK_M] in the wgmma layout."""
        HB: gl.constexpr = BLOCK_K // 16
        # ring buffers [STAGES, tile]; the layouts are the tile's
        q_ring = gl.allocate_shared_memory(gl.int32, [STAGES, R, BLOCK_K // 8],
                                           gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0]))
        s_ring = gl.allocate_shared_memory(gl.uint8, [STAGES, R, HB], gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0]))
        a_ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_M, BLOCK_K],
                                           gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2))
        ready, empty = _ws_barriers(STAGES, LOADER_WARPS)
        return gl.warp_specialize([
            (_ws_consumer, (q_ring, s_ring, a_ring, ready, empty, wsh_ptr, pid_n, is_sh, BLOCK_M, R, BLOCK_K, K,
                            HALF, STAGES, SH_IN)),
            (_ws_loader, (a_ptr, q_ptr, s_ptr, counts_ptr, pairs_ptr, tiles_ptr, T, stride_at, q_ring, s_ring,
                          a_ring, ready, empty, K, ROWS, HALF, TOPK, MAXC, BLOCK_M, R, BLOCK_K, STAGES, TILES,
                          LOADER_WARPS, E_SH)),
        ], [LOADER_WARPS], [LOADER_REGS])[0]

    @gluon.jit
    def _w4_ws_gate_up(x_ptr, q_ptr, s_ptr, g_ptr, counts_ptr, pairs_ptr, pairw_ptr, inter_ptr, tiles_ptr, wsh_ptr,
                       T, stride_xt, H: gl.constexpr, N: gl.constexpr, TOPK: gl.constexpr, MAXC: gl.constexpr,
                       E_SH: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                       STAGES: gl.constexpr, TILES: gl.constexpr, LOADER_WARPS: gl.constexpr,
                       LOADER_REGS: gl.constexpr, SH_IN: gl.constexpr):
        """inter[p, n] = silu(a_g) · a_u · pair_w[p] over the routed experts' pairs (module docstring); programs of
        the shared expert E_SH exit, or with SH_IN compute it from its bf16 rows ``wsh_ptr`` ([2N, H], no g)."""
        gl.static_assert(BLOCK_K % 64 == 0, "BLOCK_K must be a multiple of 64")
        gl.static_assert(2 * BLOCK_N == 128, "one warpgroup of 128 MMA rows: BLOCK_N 64")
        R: gl.constexpr = 2 * BLOCK_N
        EL: gl.constexpr = gl.BlockedLayout([2, 1], [32, 1], [1, 4], [0, 1])  # [BLOCK_N, BLOCK_M], n fastest
        e, pid_n, mmask, p, idle = _ws_slot(counts_ptr, pairs_ptr, tiles_ptr, BLOCK_M, MAXC, TILES,
                                            gl.SliceLayout(0, EL))
        if idle:
            return
        if not SH_IN:
            if e == E_SH:
                return
        acc = _ws_mainloop(x_ptr, q_ptr, s_ptr, counts_ptr, pairs_ptr, tiles_ptr, T, stride_xt, wsh_ptr, pid_n,
                           e == E_SH, H, 2 * N, N, TOPK, MAXC, BLOCK_M, R, BLOCK_K, STAGES, TILES, LOADER_WARPS,
                           LOADER_REGS, E_SH, SH_IN)
        # epilogue: accumulator [R, BLOCK_M] through shared memory, gate rows 0..BN-1, up rows BN..R-1
        acc_s = gl.allocate_shared_memory(gl.float32, [R, BLOCK_M], gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0]))
        acc_s.store(acc)
        gl.thread_barrier()
        unit: gl.constexpr = 256.0  # 2^SHIFT of decode 5 (moe_w4_hop.hop_shift)
        if SH_IN:  # the shared expert's accumulator is not scaled
            eg = gl.minimum(e, E_SH - 1)
            sg = gl.where(e == E_SH, 1.0, gl.load(g_ptr + 2 * eg) * unit)
            su = gl.where(e == E_SH, 1.0, gl.load(g_ptr + 2 * eg + 1) * unit)
        else:
            sg = gl.load(g_ptr + 2 * e) * unit
            su = gl.load(g_ptr + 2 * e + 1) * unit
        a_g = acc_s.slice(0, BLOCK_N).load(EL) * sg
        a_u = acc_s.slice(BLOCK_N, BLOCK_N).load(EL) * su
        pw = gl.load(pairw_ptr + p, mask=mmask, other=0.0)
        h = a_g * (1 / (1 + gl.exp(-a_g))) * a_u * gl.expand_dims(pw, 0)  # as tl.sigmoid
        offs_n = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, EL))
        gl.store(inter_ptr + gl.expand_dims(p, 0) * N + gl.expand_dims(offs_n, 1), h.to(gl.bfloat16),
                 mask=gl.expand_dims(mmask, 0))


    @gluon.jit
    def _w4_ws_down(inter_ptr, q_ptr, s_ptr, g_ptr, counts_ptr, pairs_ptr, out_ptr, tiles_ptr, wsh_ptr,
                    H: gl.constexpr, N: gl.constexpr, MAXC: gl.constexpr, E_SH: gl.constexpr, BLOCK_M: gl.constexpr,
                    BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr, TILES: gl.constexpr,
                    LOADER_WARPS: gl.constexpr, LOADER_REGS: gl.constexpr, SH_IN: gl.constexpr):
        """pair_out[p, h] = (Σ_n inter[p, n] · w'[e, h, n]) · g[e] · 2^8 (fp32, stored in out's dtype) over the
        routed experts' pairs, rows h of BLOCK_N = 128 weight rows per program; programs of the shared expert E_SH
        exit, or with SH_IN compute it from its bf16 rows ``wsh_ptr`` ([H, N], no g)."""
        gl.static_assert(BLOCK_K % 64 == 0, "BLOCK_K must be a multiple of 64")
        gl.static_assert(BLOCK_N == 128, "one warpgroup of 128 MMA rows: BLOCK_N 128")
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, BLOCK_M, 16])
        e, pid_n, mmask, p, idle = _ws_slot(counts_ptr, pairs_ptr, tiles_ptr, BLOCK_M, MAXC, TILES,
                                            gl.SliceLayout(0, mma))
        if idle:
            return
        if not SH_IN:
            if e == E_SH:
                return
        acc = _ws_mainloop(inter_ptr, q_ptr, s_ptr, counts_ptr, pairs_ptr, tiles_ptr, 0, N, wsh_ptr, pid_n, e == E_SH,
                           N, H, 0, 0, MAXC, BLOCK_M, BLOCK_N, BLOCK_K, STAGES, TILES, LOADER_WARPS, LOADER_REGS,
                           E_SH, SH_IN)
        unit: gl.constexpr = 256.0  # 2^SHIFT of decode 5
        if SH_IN:
            sc = gl.where(e == E_SH, 1.0, gl.load(g_ptr + gl.minimum(e, E_SH - 1)) * unit)
        else:
            sc = gl.load(g_ptr + e) * unit
        offs_h = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, mma))
        gl.store(out_ptr + gl.expand_dims(p, 0) * H + gl.expand_dims(offs_h, 1),
                 (acc * sc).to(out_ptr.dtype.element_ty), mask=gl.expand_dims(mmask, 0))


_SHARED_TILES: dict = {}


def _shared_tiles(ws, block_m: int) -> torch.Tensor:
    """Static tile table [(E, m) for each m-block of the shared expert's T rows]: the Triton kernel's launch over it
    computes the shared expert alone."""
    key = (ws.E, ws.T, block_m, str(ws.pairs.device))
    t = _SHARED_TILES.get(key)
    if t is None:
        nb = triton.cdiv(ws.T, block_m)
        t = _SHARED_TILES[key] = torch.tensor([[ws.E, m] for m in range(nb)], dtype=torch.int32,
                                              device=ws.pairs.device)
    return t


def _check(name, act, w, ws, parts):
    from repro.checkpoint.nvfp4 import NVFP4Experts

    if not HAS_GLUON:
        raise RuntimeError(f"{name}: needs triton.experimental.gluon with the Triton 3.6 API")
    if not (act.is_cuda and torch.cuda.get_device_capability(act.device)[0] == 9):
        raise RuntimeError(f"{name}: needs a Hopper GPU (sm_90a)")
    if not isinstance(w, NVFP4Experts) or w.layout != "hop" or w.parts != parts or act.dtype != torch.bfloat16:
        raise ValueError(f"{name}: needs NVFP4Experts in layout 'hop' ({parts} global scale(s) per expert) and bf16 "
                         f"activations")
    if ws.compact:
        raise ValueError(f"{name}: the compact active-list grid is not implemented")


def _shared_launch(ws, run):
    """Run ``run()`` (a Triton launch) over the static tile table of the shared expert's m-blocks, BLOCK_M 16."""
    saved = (ws.tiles, ws.tiles_block_m)
    ws.tiles, ws.tiles_block_m = _shared_tiles(ws, 16), 16
    try:
        run()
    finally:
        ws.tiles, ws.tiles_block_m = saved


def _ws_kwargs(c: dict, kw: dict) -> dict:
    return dict(BLOCK_M=c["BLOCK_M"], BLOCK_N=c["BLOCK_N"], BLOCK_K=c["BLOCK_K"], STAGES=c["STAGES"],
                TILES=bool(kw.get("TILES")), LOADER_WARPS=c["LOADER_WARPS"], LOADER_REGS=c["LOADER_REGS"], num_warps=4,
                **({"maxnreg": c["MAXNREG"]} if c.get("MAXNREG") else {}))


def moe_gate_up_ws(x, w13, ws, top_k, tiles: dict | None = None, shared: bool = True):
    """The Gluon gate+up kernel's launch over the routed experts (grid of ``moe_gemm._launch_grid``) and, with
    ``shared`` and a shared expert, the Triton kernel over the shared expert's m-blocks; writes ``ws.inter``. Raises
    RuntimeError without Gluon 3.6 or a Hopper GPU, ValueError for experts or a workspace it does not take."""
    from .moe_gemm import _launch_grid, moe_gate_up

    _check("moe_gate_up_ws", x, w13, ws, 2)
    c = {**WS_TILES_DEFAULT["gate_up"], **(tiles or {})}
    T, H = x.shape
    E, twoN, _ = w13.shape
    N = twoN // 2
    assert x.stride(1) == 1 and H % c["BLOCK_K"] == 0 and N % c["BLOCK_N"] == 0
    grid, kw = _launch_grid(ws, E + (w13.shared is not None), c["BLOCK_M"], N // c["BLOCK_N"], "moe_gate_up_ws")
    sh_in = bool(c["SH_IN"]) and shared and w13.shared is not None
    _w4_ws_gate_up[grid](
        x, w13.q, w13.s, w13.g, ws.counts, ws.pairs, ws.pair_w, ws.inter, kw.get("tiles_ptr", ws.counts),
        w13.shared if sh_in else x, T, x.stride(0), H=H, N=N, TOPK=top_k, MAXC=ws.T_PAD,
        E_SH=E if w13.shared is not None else -1, SH_IN=sh_in, **_ws_kwargs(c, kw))
    if shared and w13.shared is not None and not sh_in:
        _shared_launch(ws, lambda: moe_gate_up(x, w13, ws, top_k, {"gate_up": dict(
            BLOCK_M=16, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=3)}))


def moe_down_ws(w2, ws, tiles: dict | None = None, shared: bool = True):
    """The Gluon down kernel's launch over the routed experts and, with ``shared`` and a shared expert, the Triton
    kernel over the shared expert's m-blocks; writes ``ws.pair_out`` (in its dtype). Errors as
    :func:`moe_gate_up_ws`."""
    from .moe_gemm import _launch_grid, moe_down

    _check("moe_down_ws", ws.inter, w2, ws, 1)
    c = {**WS_TILES_DEFAULT["down"], **(tiles or {})}
    E, H, N = w2.shape
    assert ws.inter.shape[1] == N and N % c["BLOCK_K"] == 0 and H % c["BLOCK_N"] == 0
    grid, kw = _launch_grid(ws, E + (w2.shared is not None), c["BLOCK_M"], H // c["BLOCK_N"], "moe_down_ws")
    sh_in = bool(c["SH_IN"]) and shared and w2.shared is not None
    _w4_ws_down[grid](
        ws.inter, w2.q, w2.s, w2.g, ws.counts, ws.pairs, ws.pair_out, kw.get("tiles_ptr", ws.counts),
        w2.shared if sh_in else ws.inter, H=H, N=N, MAXC=ws.T_PAD, E_SH=E if w2.shared is not None else -1,
        SH_IN=sh_in, **_ws_kwargs(c, kw))
    if shared and w2.shared is not None and not sh_in:
        _shared_launch(ws, lambda: moe_down(w2, ws, {"down": dict(BLOCK_M=16, BLOCK_N=128, BLOCK_K=64, num_warps=4,
                                                                  num_stages=3)}))


#: the real shapes' constexprs (LLaDA2.1-mini: H 2048, N 512, top-8 of 256 experts + the shared one at index 256,
#: a 32-token block: T_PAD 32) of the ahead-of-time build
AOT_SHAPES = dict(H=2048, N=512, TOPK=8, MAXC=32, E_SH=256)


def aot_build(kernel: str = "gate_up", cc: tuple[int, int] = (9, 0), tiles: dict | None = None, **shapes):
    """Compile the Gluon ``kernel`` ("gate_up" / "down") for compute capability ``cc`` (sm_90a) without a GPU, as
    ``repro.engine.aot.build`` does for the Triton kernels (``triton.compile`` on Gluon's ``GluonASTSource``, ptxas
    included), at :data:`AOT_SHAPES` (overridden by ``shapes``) and ``tiles`` (:data:`WS_TILES_DEFAULT` plus TILES).
    Returns the compiled kernel (``.asm["ptx"]``, ``["ttgir"]``, ``["cubin"]``, ``.metadata``). Needs Triton 3.6's
    Gluon (RuntimeError otherwise) and no TRITON_INTERPRET."""
    if not HAS_GLUON:
        raise RuntimeError("aot_build: needs triton.experimental.gluon with the Triton 3.6 API")
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    fn = {"gate_up": _w4_ws_gate_up, "down": _w4_ws_down}[kernel]
    c = {**WS_TILES_DEFAULT[kernel], "TILES": False, **(tiles or {})}
    const = {k: v for k, v in dict(AOT_SHAPES, **shapes).items() if k in fn.arg_names}
    const.update({k: c[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "STAGES", "TILES", "LOADER_WARPS", "LOADER_REGS",
                                    "SH_IN")})
    ptrs = dict(x_ptr="*bf16", inter_ptr="*bf16", wsh_ptr="*bf16", q_ptr="*u8", s_ptr="*u8", g_ptr="*fp32", counts_ptr="*i32",
                pairs_ptr="*i32", pairw_ptr="*fp32", out_ptr="*bf16", tiles_ptr="*i32", T="i32", stride_xt="i32")
    sig = {n: ptrs.get(n, "constexpr") for n in fn.arg_names}
    # the launch-time specialisation of 16-byte aligned pointers and the row stride (a multiple of 16 elements)
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in sig
             if n.endswith("_ptr") or n == "stride_xt"}
    opts = dict(num_warps=4, **({"maxnreg": c["MAXNREG"]} if c.get("MAXNREG") else {}))
    return triton.compile(GluonASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", cc[0] * 10 + cc[1], 32),
                          options=opts)


def real_gate_up_case(slots: int, seed: int = 0, device="cuda", pair_dtype=None):
    """``(x, w13, ws, top_k)`` of the batched round's gate+up at ``slots`` requests of a 32-token block (T = 32 ·
    slots), LLaDA2.1-mini's shapes: random hop-layout NVFP4 experts [256, 1024, 2048] plus a bf16 shared expert,
    random top-8 routing with random weights aligned into a workspace with its tile table (BLOCK_M 16), ``ws.pair_out``
    in ``pair_dtype`` (default bf16). For the GPU test and ``scripts/bench_w4_ws.py``."""
    from .moe_w4 import random_nvfp4_experts
    from .route import MoEWorkspace, moe_align, moe_tiles

    H, N, E, k = 2048, 512, 256, 8
    T = 32 * slots
    g = torch.Generator(device=device).manual_seed(seed)
    w13 = random_nvfp4_experts(E, 2 * N, H, 2, torch.bfloat16, device, g).with_layout("hop")
    w13 = w13.with_shared((torch.randn(2 * N, H, device=device, generator=g) * 0.02).to(torch.bfloat16))
    x = torch.randn(T, H, device=device, generator=g).to(torch.bfloat16)
    gc = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=gc)[:k] for _ in range(T)]).to(device)
    ws = MoEWorkspace(T, H, N, E, E + 1, k, torch.bfloat16, device, split_k=1, pair_dtype=pair_dtype)
    moe_align(ids, torch.rand(T, k, generator=gc).to(device), ws)
    moe_tiles(ws, 16, static=True)
    return x, w13, ws, k
