"""The ORL self-conditioning residual: RCD residual Δ = pᵀE, its entropy weight, and the adapter g.

Sources: RCD (arXiv 2601.22954, docs/engine.md §7) and the ORL project page (docs/engine.md §8). The ORL
adapter's exact form is not public; this project defines it in ``config.json`` under
``orl_residual_adapter`` (keys ``type``, ``tensors``, ``rank``, ``alpha``, ``temperature``; see
:class:`repro.engine.config.AdapterConfig`). Forms (``[out, in]`` weights, no biases, model dtype):

* ``mlp_silu``: ``g(z) = W_up · silu(W_down · z)``, ``W_down [r, D]``, ``W_up [D, r]``;
* ``linear``:   ``g(z) = W_proj · z``, ``W_proj [D, D]``.

Per denoising step at block positions i (all maths fp32, docs/engine.md §7):

* ``p_i = softmax(logits_i)`` (the untempered distribution, RCD Algorithm 2), ``Δ_i = p_iᵀ E`` with
  ``E`` = the input embedding codebook ``word_embeddings`` ``[V, D]``;
* weight ``w_i = H(softmax(logits_i / T_res)) / log V`` ∈ [0, 1] (normalised Shannon entropy, RCD);
* residual ``z_i = w_i · Δ_i`` (the "pre-adapter residual embedding" of ORL);
* next step's input at positions still ``<|mask|>``:
  with an adapter ``ẽ_i = E[mask] + α · g(z_i)`` (ORL, docs/engine.md §8);
  without one ``ẽ_i = (1 − w_i) · E[mask] + Δ_i · w_i`` (RCD highway interpolation, docs/engine.md §7).

Choices (docs/engine.md §13): cold start (no residual on a block's first step) and reset at each block.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from repro.engine.config import AdapterConfig


def normalized_entropy(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``H(softmax(logits / T)) / log V`` per row; logits ``[n, V]`` (−inf allowed), returns ``[n]`` fp32."""
    lp = torch.log_softmax(logits.float() / temperature, dim=-1)
    p = lp.exp()
    h = -torch.where(p > 0, p * lp, torch.zeros_like(p)).sum(-1)
    return h / math.log(logits.shape[-1])


def residual(logits: torch.Tensor, embed: torch.Tensor, temperature: float):
    """RCD residual for each row of ``logits`` ``[n, V]``: returns ``(z [n, D] fp32, w [n] fp32, Δ [n, D] fp32)``.

    ``embed`` ``[V, D]`` is the input embedding table (model dtype; the product runs in that dtype, output
    cast to fp32).
    """
    p = torch.softmax(logits.float(), dim=-1)
    delta = (p.to(embed.dtype) @ embed).float()
    w = normalized_entropy(logits, temperature)
    return w[:, None] * delta, w, delta


def adapter_g(adapter: AdapterConfig, params: dict[str, torch.Tensor], z: torch.Tensor) -> torch.Tensor:
    """Apply the configured adapter form to ``z`` ``[n, D]`` (cast to the weights' dtype); returns ``[n, D]``."""
    if adapter.type == "mlp_silu":
        down, up = params["adapter.down"], params["adapter.up"]
        return F.silu(z.to(down.dtype) @ down.t()) @ up.t()
    if adapter.type == "linear":
        w = params["adapter.proj"]
        return z.to(w.dtype) @ w.t()
    raise ValueError(f"unknown adapter type {adapter.type!r}")


def residual_inputs(mask_embed: torch.Tensor, z: torch.Tensor, w: torch.Tensor, delta: torch.Tensor,
                    adapter: AdapterConfig | None, params: dict[str, torch.Tensor]) -> torch.Tensor:
    """Input embeddings ``[n, D]`` (dtype of ``mask_embed``) for still-masked positions.

    mask_embed: ``E[<|mask|>]`` ``[D]``; z, delta: ``[n, D]`` fp32; w: ``[n]`` fp32. Formula in the module
    docstring (adapter: ORL additive form; no adapter: RCD interpolation).
    """
    if adapter is not None:
        return (mask_embed.float() + adapter.alpha * adapter_g(adapter, params, z).float()).to(mask_embed.dtype)
    wc = w[:, None]
    return ((1 - wc) * mask_embed.float() + wc * delta).to(mask_embed.dtype)
