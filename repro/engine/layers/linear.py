"""Row-invariant matrix product ``x · wᵀ``: every row's result is the same bits whatever else is in ``x``.

Why: batched generation (:mod:`repro.engine.batch`) stacks the blocks of many requests into one forward, and
greedy decoding must give each request bit-identical tokens alone or in any batch. A BLAS GEMM does not
promise that: its kernel (and so the reduction order of a row's dot products) may be chosen by the number
of rows M. Measured on this project's CPU build (torch 2.x, MKL 2024.2, fp32): rows of ``x[:m] @ W.T`` for
m = 1, 2, 3 differ in the last bits from the same rows computed with m ≥ 4 (small-M kernels), and routed
experts see 1–3 tokens routinely. cuBLAS picks its algorithm by shape in the same way.

Formulation: rows are processed in tiles of exactly :data:`ROW_TILE` rows (the last tile zero-padded), one
GEMM of the fixed shape ``[ROW_TILE, K] · [K, N]`` per tile. A fixed shape runs the same kernel with the same
reduction order, and a GEMM row never reads another row, so a row's bits depend only on the row and ``w``.
Cost: padding (a routed expert with one token computes ``ROW_TILE`` rows) and one GEMM call per tile; on the
tiny CPU model the eager engine is measured in ``docs/perf.md`` ("Batched generation"). The Triton kernels of
:mod:`repro.engine.kernels` do not use this function (their M-dependence is listed in ``docs/perf.md``).
"""

from __future__ import annotations

import torch

#: Rows per GEMM call on the CPU; 32 = the block size, so a denoising / commit block is exactly one tile.
ROW_TILE = 32
#: Rows per GEMM call on CUDA: a weight matrix is streamed once per tile, so tiles are larger there (8 blocks;
#: a batch-1 block pads to 256 rows, which a memory-bound skinny GEMM absorbs).
CUDA_ROW_TILE = 256


def row_tile(x: torch.Tensor) -> int:
    """Tile rows for ``x``'s device (:data:`ROW_TILE` on the CPU, :data:`CUDA_ROW_TILE` on CUDA)."""
    return CUDA_ROW_TILE if x.is_cuda else ROW_TILE


def linear(x: torch.Tensor, w: torch.Tensor, tile: int | None = None) -> torch.Tensor:
    """``x @ w.T`` computed in fixed tiles of ``tile`` rows (default :func:`row_tile`; module docstring).

    x: ``[n, K]``; w: ``[N, K]`` (the ``[out, in]`` layout of the checkpoint), same dtype and device.
    Returns ``[n, N]`` in that dtype; row i depends only on ``x[i]`` and ``w`` (bit-identical for any n).
    """
    n, tile = x.shape[0], tile or row_tile(x)
    wt = w.t()
    if n == tile:
        return x @ wt
    if n == 0:
        return x.new_zeros(0, w.shape[0])
    if n < tile:  # one padded tile
        xp = x.new_zeros(tile, x.shape[1])
        xp[:n] = x
        return (xp @ wt)[:n]
    pad = (-n) % tile
    if pad:
        x = torch.cat([x, x.new_zeros(pad, x.shape[1])])
    out = torch.cat([t @ wt for t in x.split(tile)])
    return out[:n] if pad else out
