"""``orl``: the ORL paper's decoder — joint threshold M2T + T2T with the self-conditioning residual.

Sources: ORL model card settings (threshold 0.85, edit threshold 0.5, 16 refine steps = ``max_post_steps``,
4096 new tokens, self-conditioning on), this module's ``DEFAULTS``; residual maths RCD (arXiv 2601.22954)
and ORL (arXiv 2610.20687), formulas in :mod:`repro.engine.adapter`.

Contract: the block loop is :mod:`joint_threshold`'s. With ``self_conditioning`` on, every forward's
candidate logits (full vocabulary unless ``exclude_mask_token``) give a residual ``z = w · pᵀE`` per block
position (``w`` = normalised entropy at
temperature T_res); the **next** forward of the same block feeds, at positions whose input is still
``<|mask|>``, ``ẽ = E[mask] + α·g(z)`` through the checkpoint's adapter g when the model has one loaded
(role ``orl``), else the RCD interpolation ``(1 − w)·E[mask] + w·Δ``. Cold start: a block's first forward has
no residual; the residual is reset at each new block. Non-mask positions use their token embeddings, so a
commit / final forward (no masks) is identical with or without self-conditioning.
T_res = ``residual_temperature`` if set, else the adapter's ``temperature``, else 1.0.
"""

from __future__ import annotations

import torch

from repro.engine.adapter import residual, residual_inputs
from repro.engine.decoders.joint_threshold import JointThreshold

#: ORL model card: threshold 0.85, edit threshold 0.5, 16 refine steps, 4096 new tokens, self-conditioning.
DEFAULTS = dict(threshold=0.85, edit_threshold=0.5, editing=True, max_post_steps=16, max_new_tokens=4096,
                self_conditioning=True)

#: The on-device step (:mod:`repro.engine.decoders.device`) implements this decoder's greedy rules.
ON_DEVICE = True


def residual_temperature(cfg, model) -> float:
    """T_res in effect for decoder settings ``cfg`` on ``model``: ``cfg.residual_temperature`` if set, else
    the loaded adapter's ``temperature``, else 1.0. Shared by :class:`ORLDecoder` and the on-device step."""
    if cfg.residual_temperature is not None:
        return cfg.residual_temperature
    if model.with_adapter:
        return model.cfg.adapter.temperature
    return 1.0


class ORLDecoder(JointThreshold):
    """Joint threshold + self-conditioning residual (module docstring)."""

    name = "orl"
    self_conditions = True

    def start_block(self) -> None:
        """Reset the post-edit counter and the residual (cold start)."""
        super().start_block()
        self.res = None

    def input_embeds(self, tokens, editable):
        """``[B, D]`` embeddings with the residual at still-masked positions, or None (no residual yet)."""
        if not self.cfg.self_conditioning or self.res is None:
            return None
        masked = self.masked(tokens, editable)
        if not bool(masked.any()):
            return None
        return self.embeds_from(tokens, masked)

    def embeds_from(self, tokens, masked):
        """``[B, D]``: residual inputs at ``masked`` rows, ``E[tokens]`` elsewhere. Computed for every row and
        then selected (row-independent maths, the same operations as the on-device step of
        :mod:`repro.engine.decoders.device`, so both give identical inputs)."""
        model = self.model
        z, w, delta = self.res
        e_mask = model.params["embed"][self.mask_id]
        adapter = model.cfg.adapter if model.with_adapter else None
        res = residual_inputs(e_mask, z, w, delta, adapter, model.params)
        return torch.where(masked[:, None], res, model.embed(tokens))

    def step(self, logits, tokens, editable, gen) -> bool:
        """Compute this forward's residual, then the joint M2T + T2T update."""
        lg = self.candidates(logits)
        if self.cfg.self_conditioning:
            m = self.model
            fn = residual if self.vocab is None else self.vocab.residual  # across ranks under tensor parallelism
            self.res = fn(lg, m.params["embed"], residual_temperature(self.cfg, m))
        return self.update(lg, tokens, editable, gen)


Decoder = ORLDecoder
