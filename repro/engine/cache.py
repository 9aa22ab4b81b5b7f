"""Preallocated prefix KV cache for block-diffusion decoding (docs/engine.md §4 "Prefix KV caching").

One buffer per K and V of shape ``[layers, capacity, n_kv_heads, head_dim]`` (model dtype), allocated once
per request for ``ceil((prompt + max_new_tokens) / block) · block`` positions; the decoding loop never
reallocates. Every forward writes its chunk's K/V at its absolute positions; attention reads positions
``0 .. start + n``. A denoising forward of block b therefore leaves provisional K/V in block b's slots,
which the next forward of the same block overwrites; the prefix ``< b·B`` only ever holds K/V computed
from final tokens (prompt prefill or a block's commit / final unchanged forward).
"""

from __future__ import annotations

import torch


class KVCache:
    """K/V buffers ``[L, capacity, Hkv, hd]``; positions are absolute token indices."""

    def __init__(self, n_layers: int, capacity: int, n_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str):
        self.capacity = capacity
        self.k = torch.zeros(n_layers, capacity, n_kv_heads, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store ``k, v`` ``[n, Hkv, hd]`` at positions ``start .. start+n-1`` of ``layer``.

        Raises ValueError if the chunk would exceed the preallocated capacity.
        """
        n = k.shape[0]
        if start < 0 or start + n > self.capacity:
            raise ValueError(f"KV write [{start}, {start + n}) outside capacity {self.capacity}")
        self.k[layer, start:start + n] = k
        self.v[layer, start:start + n] = v

    def view(self, layer: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V of positions ``0 .. end-1`` of ``layer`` (views, no copy), each ``[end, Hkv, hd]``."""
        return self.k[layer, :end], self.v[layer, :end]
