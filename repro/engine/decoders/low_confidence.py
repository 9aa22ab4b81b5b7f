"""``low_confidence``: commit every masked position whose confidence passes the threshold, else the single
most confident one; committed tokens are never revised.

Source: SGLang ``LowConfidence`` (``python/sglang/srt/dllm/algorithm/low_confidence.py``) = the LLaDA2.0
reference generate with threshold and top-1 fallback (Hugging Face remote code of
``inclusionAI/LLaDA2.0-mini``), dInfer ``ThresholdParallelDecoder``.
Contract: a block is final when its input has no ``<|mask|>`` left — checked before the forward, so the
forwards of a block are its unmasking steps plus one commit forward (SGLang: "steps + 1"). Proposals are
over the full vocabulary (module :mod:`repro.engine.decoders.base`): a fill whose proposal is ``<|mask|>``
leaves the position masked, so a step may make no progress; the loop's cap bounds the block: ``block_size``
denoising forwards (:meth:`LowConfidence.max_forwards`), the LLaDA2.0 reference generate's ``steps`` per
block (32 with block 32: "up to ``steps`` iterations, stop if no masks remain"), the pipeline the LLaDA2.0
report evaluated with. SGLang's loop allows more (a first forward, then up to ``max_steps = block_size + 1``
step-and-forward rounds: 34 forwards for a stalled block of 32); tokens are the same either way, since a
stalled block writes ``<|mask|>`` back, but forward counts and TPF follow the reference (docs/engine.md §6.4).
With ``exclude_mask_token`` each step commits ≥ 1 position and a block of B masks needs at most B forwards.
Settings used: ``threshold``, ``num_to_transfer``, ``temperature``, ``exclude_mask_token``.
"""

from __future__ import annotations

import torch

from repro.engine.decoders.base import BlockDecoder, commit_masked

#: SGLang ``LowConfidence`` reads ``threshold`` with default 0.95; no editing.
DEFAULTS = dict(threshold=0.95, editing=False, self_conditioning=False)

#: The on-device step (:mod:`repro.engine.decoders.device`) implements this decoder's greedy rules.
ON_DEVICE = True


class LowConfidence(BlockDecoder):
    """Threshold M2T with top-``num_to_transfer`` fallback; no editing."""

    name = "low_confidence"

    @staticmethod
    def max_forwards(cfg) -> int:
        """Denoising forwards a block may take: ``cfg.block_size`` (the LLaDA2.0 reference's ``steps``)."""
        return cfg.block_size

    def before_forward(self, tokens: torch.Tensor, editable: torch.Tensor) -> bool:
        """Final when no generation position is masked."""
        return not bool(self.masked(tokens, editable).any())

    def step(self, logits, tokens, editable, gen) -> bool:
        """One M2T update; never final by itself (the next ``before_forward`` decides)."""
        x, p = self.propose(self.candidates(logits), gen)
        commit_masked(tokens, self.masked(tokens, editable), x, p, self.cfg.threshold, self.cfg.num_to_transfer)
        return False


Decoder = LowConfidence
