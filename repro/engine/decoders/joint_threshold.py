"""``joint_threshold``: LLaDA2.1 mask-to-token (M2T) plus token-to-token editing (T2T).

Source: LLaDA2.1 reference generate (engine_spec.md §6.2; report Eqs. 1–3: Γ = {masked, p > τ_mask},
Δ = {x ≠ v, p > τ_edit}, update on Γ ∪ Δ) and SGLang ``JointThreshold`` (§6.5).
Per block, ``post = 0``; loop:

1. if the block has no masks: with ``editing`` off the block is final (no forward); else ``post += 1`` and
   the block is final (no forward) once ``post > max_post_steps`` (check before the forward, §6.2 step 2);
2. forward; proposals ``x̂, p``;
3. M2T (if masks remain): masked positions with ``p > threshold``, else the top-``num_to_transfer``;
4. T2T (if ``editing``): non-mask generation positions with ``x̂ ≠ current`` and ``p > edit_threshold``
   (``edit_threshold = 0`` edits every disagreement — SGLang/official convention; ``editing = False`` is
   the explicit off switch, §6.6);
5. both applied at once; if the input had no masks and nothing was edited, the block is final and the
   forward just run already saw the final tokens (its K/V is kept; no commit forward, §6.5).
Prompt positions are never edited.
"""

from __future__ import annotations

import torch

from repro.engine.decoders.base import BlockDecoder, commit_masked, exclude_mask, propose


class JointThreshold(BlockDecoder):
    """M2T + T2T with post-edit steps (settings: threshold, edit_threshold, editing, max_post_steps)."""

    name = "joint_threshold"

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
        """Steps 2–5 on mask-excluded logits ``lg``; returns True when final."""
        x, p = propose(lg, self.cfg.temperature, gen)
        masked = self.masked(tokens, editable)
        had_mask = bool(masked.any())
        edit = torch.zeros_like(masked)
        if self.cfg.editing:
            edit = editable & ~masked & (x != tokens) & (p > self.cfg.edit_threshold)
        if had_mask:
            commit_masked(tokens, masked, x, p, self.cfg.threshold, self.cfg.num_to_transfer)
        tokens[edit] = x[edit]
        return not had_mask and not bool(edit.any())

    def step(self, logits, tokens, editable, gen) -> bool:
        """One joint M2T + T2T update."""
        return self.update(exclude_mask(logits, self.mask_id), tokens, editable, gen)


Decoder = JointThreshold
