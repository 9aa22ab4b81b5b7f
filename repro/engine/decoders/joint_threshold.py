"""``joint_threshold``: LLaDA2.1 mask-to-token (M2T) plus token-to-token editing (T2T).

Sources: the LLaDA2.1 reference ``generate`` (Hugging Face remote code of ``inclusionAI/LLaDA2.1-mini``;
report arXiv 2602.08676 Eqs. 1–3: Γ = {masked, p > τ_mask}, Δ = {x ≠ v, p > τ_edit}, update on Γ ∪ Δ) and
SGLang ``JointThreshold`` (``python/sglang/srt/dllm/algorithm/joint_threshold.py``), whose defaults
(threshold 0.5, edit threshold 0, 16 post-edit steps) are this module's ``DEFAULTS``.
Per block, ``post = 0``; loop:

1. if the block has no masks: with ``editing`` off the block is final (no forward); else ``post += 1`` and
   the block is final (no forward) once ``post > max_post_steps`` (checked before the forward, as the
   reference generate does);
2. forward; proposals ``x̂, p`` over the full vocabulary (``<|mask|>`` included unless
   ``exclude_mask_token``);
3. M2T (if masks remain): masked positions with ``p > threshold``, else the top-``num_to_transfer``; a
   proposal ``<|mask|>`` there leaves the position masked (a no-op fill);
4. T2T (if ``editing``): non-mask generation positions with ``x̂ ≠ current`` and ``p > edit_threshold``
   (``edit_threshold = 0`` edits every disagreement — SGLang/official convention; ``editing = False`` is
   the explicit off switch); a proposal ``<|mask|>`` there re-masks the position;
5. both applied at once; if the input had no masks and nothing was edited, the block is final and the
   forward just run already saw the final tokens (its K/V is kept; no commit forward).
Prompt positions are never edited. Bounded by :meth:`DecoderConfig.max_denoise_forwards`.
"""

from __future__ import annotations

import torch

from repro.engine.decoders.base import BlockDecoder, m2t_set, t2t_set

#: SGLang ``JointThreshold`` defaults (threshold 0.5, edit_threshold 0, max_post_edit_steps 16) = LLaDA2.1
#: Speed mode (model card); editing on.
DEFAULTS = dict(threshold=0.5, edit_threshold=0.0, editing=True, max_post_steps=16, self_conditioning=False)

#: The on-device step (:mod:`repro.engine.decoders.device`) implements this decoder's greedy rules.
ON_DEVICE = True


class JointThreshold(BlockDecoder):
    """M2T + T2T with post-edit steps (settings: threshold, edit_threshold, editing, max_post_steps)."""

    name = "joint_threshold"
    can_edit = True

    def start_block(self) -> None:
        """Reset the post-edit step counter."""
        self.post_steps = 0

    def before_forward(self, tokens, editable) -> bool:
        """Step 1 of the module docstring."""
        if bool(self.masked(tokens, editable).any()):
            return False
        if not self.cfg.editing:
            return True
        self.post_steps += 1
        return self.post_steps > self.cfg.max_post_steps

    def update(self, lg: torch.Tensor, tokens, editable, gen) -> bool:
        """Steps 2–5 on candidate logits ``lg``; returns True when final."""
        cfg = self.cfg
        x, p = self.propose(lg, gen)
        masked = self.masked(tokens, editable)
        change = m2t_set(masked, p, cfg.threshold, cfg.num_to_transfer)
        edit = t2t_set(editable, masked, tokens, x, p, cfg.edit_threshold) if cfg.editing else None
        if edit is not None:
            change = change | edit
        tokens[change] = x[change]
        return not bool(masked.any()) and (edit is None or not bool(edit.any()))

    def step(self, logits, tokens, editable, gen) -> bool:
        """One joint M2T + T2T update."""
        return self.update(self.candidates(logits), tokens, editable, gen)


Decoder = JointThreshold
