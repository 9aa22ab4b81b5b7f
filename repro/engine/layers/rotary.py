"""Partial NeoX ("rotate_half") rotary position embedding (docs/engine.md §2 "RoPE (partial)").

Rotary dim r = head_dim · partial_rotary_factor (64 of 128 for LLaDA2.1-mini); it rotates the **first**
r channels of each head with channel pairs (c, c + r/2); the remaining channels pass through.
``inv_freq[k] = theta^(-2k/r)``, k = 0..r/2-1; angles use absolute 0-based token positions.
"""

import torch


def rope_cos_sin(positions: torch.Tensor, rotary_dim: int, theta: float, dtype: torch.dtype):
    """cos, sin tables ``[n, rotary_dim]`` (``dtype``) for int64 ``positions`` ``[n]``.

    Built in fp32 as ``cat(freqs, freqs)`` with ``freqs = positions ⊗ inv_freq`` (HF default rope, scaling
    factor 1), then cast to ``dtype`` as HF does.
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, device=positions.device,
                                             dtype=torch.float32) / rotary_dim))
    freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``cos.shape[-1]`` channels of ``x`` ``[n, heads, head_dim]``; cos/sin ``[n, r]``.

    ``out_rot = x_rot·cos + rotate_half(x_rot)·sin`` with ``rotate_half([a, b]) = [-b, a]`` (NeoX).
    Returns a tensor of ``x``'s shape and dtype.
    """
    r = cos.shape[-1]
    xr, xp = x[..., :r], x[..., r:]
    x1, x2 = xr[..., : r // 2], xr[..., r // 2:]
    rot = torch.cat([-x2, x1], dim=-1)
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([xr * c + rot * s, xp], dim=-1)
