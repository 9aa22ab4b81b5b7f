"""``low_confidence``: commit every masked position whose confidence passes the threshold, else the single
most confident one; committed tokens are never revised.

Source: SGLang ``LowConfidence`` (engine_spec.md §6.4) = the LLaDA2.0 reference generate with threshold and
top-1 fallback (§6.1), dInfer ``ThresholdParallelDecoder`` (§6.8).
Contract: a block is final when its input has no ``<|mask|>`` left — checked before the forward, so the
forwards of a block are its unmasking steps plus one commit forward (SGLang: "steps + 1"). Each step
commits ≥ 1 position, so a block of B masks needs at most B denoising forwards.
Settings used: ``threshold``, ``num_to_transfer``, ``temperature``.
"""

from __future__ import annotations

import torch

from repro.engine.decoders.base import BlockDecoder, commit_masked, exclude_mask, propose


class LowConfidence(BlockDecoder):
    """Threshold M2T with top-``num_to_transfer`` fallback; no editing."""

    name = "low_confidence"

    def before_forward(self, tokens: torch.Tensor, editable: torch.Tensor) -> bool:
        """Final when no generation position is masked."""
        return not bool(self.masked(tokens, editable).any())

    def step(self, logits, tokens, editable, gen) -> bool:
        """One M2T update; never final by itself (the next ``before_forward`` decides)."""
        x, p = propose(exclude_mask(logits, self.mask_id), self.cfg.temperature, gen)
        commit_masked(tokens, self.masked(tokens, editable), x, p, self.cfg.threshold, self.cfg.num_to_transfer)
        return False


Decoder = LowConfidence
