"""The block decoders as one on-device step: no host sync inside a denoising round.

:class:`DeviceStep` runs the greedy (``temperature == 0``) form of ``low_confidence``, ``joint_threshold`` and
``orl`` — the decoders whose modules declare ``ON_DEVICE = True`` (:func:`device_step_problem`) — as tensor
operations on static buffers, so the step can be captured in the same CUDA graph as the
forward (:class:`repro.engine.graph.GraphBackend`). It computes exactly what the host-driven decoders
(:mod:`repro.engine.decoders.low_confidence`, :mod:`~repro.engine.decoders.joint_threshold`,
:mod:`~repro.engine.decoders.orl`) compute from the same logits — the same shared rules of
:mod:`repro.engine.decoders.base` (``candidate_logits``: full vocabulary, ``<|mask|>`` included unless
``exclude_mask_token``; ``m2t_set``; ``t2t_set``) and the ORL decoder's ``residual_temperature``, with the host
branches replaced by ``torch.where`` — and additionally evaluates the next round's "is the block final?"
check (their ``before_forward``) at the end of the step, into the device flag :attr:`DeviceStep.final`.
The executor running a block's :class:`~repro.engine.request.Steps` op reads that one flag per round; nothing
else syncs.

State per block (static tensors): ``tokens`` ``[B]`` int64 (the forward's input ids — the backend's own
buffer), ``editable`` ``[B]`` bool, ``last_input`` ``[B]`` (input of the latest forward), ``post`` (post-edit
steps, int32), ``final`` (bool), ``stepped`` (bool: a forward ran in this block), and for ORL with
self-conditioning ``embeds`` ``[B, D]`` (the next forward's input embeddings — the backend's buffer).
"""

from __future__ import annotations

import torch

from repro.engine.adapter import residual, residual_inputs
from repro.engine.decoders.base import DecoderConfig, algorithms, candidate_logits, m2t_set, t2t_set
from repro.engine.decoders.orl import residual_temperature


def device_step_problem(cfg: DecoderConfig) -> str | None:
    """Why :class:`DeviceStep` cannot run ``cfg`` (one line), or None when it implements it: the decoder's
    module must declare ``ON_DEVICE = True`` (a decoder the on-device step does not know never runs its rules
    without a word) and decoding must be greedy (sampling stays on the host decoders)."""
    if not getattr(algorithms()[cfg.algorithm], "ON_DEVICE", False):
        return (f"decoder {cfg.algorithm!r} has no on-device step (its module does not declare ON_DEVICE = True; "
                "the on-device step implements low_confidence, joint_threshold and orl)")
    if cfg.temperature > 0:
        return f"sampling (temperature {cfg.temperature}) runs on the host decoders (the on-device step is greedy)"
    return None


def supported(cfg: DecoderConfig) -> bool:
    """True when :class:`DeviceStep` implements ``cfg`` (:func:`device_step_problem` is None)."""
    return device_step_problem(cfg) is None


class DeviceStep:
    """Sync-free decoder step over static buffers (module docstring).

    ``cfg``: greedy :class:`DecoderConfig`; ``model``: the :class:`~repro.engine.model.LLaDA2Model` (embedding
    table, adapter); ``tokens``: the ``[B]`` int64 buffer the forward reads; ``embeds``: the ``[B, D]`` buffer
    the forward reads when :attr:`self_conditioning` (else unused). Raises ValueError for sampling settings.
    """

    def __init__(self, cfg: DecoderConfig, mask_id: int, model, tokens: torch.Tensor, embeds: torch.Tensor | None):
        why = device_step_problem(cfg)
        if why is not None:
            raise ValueError(f"DeviceStep cannot run this decoder: {why}")
        self.cfg, self.mask_id, self.model = cfg, mask_id, model
        dev = tokens.device
        self.tokens, self.embeds = tokens, embeds
        self.editable = torch.zeros_like(tokens, dtype=torch.bool)
        self.last_input = torch.zeros_like(tokens)
        self.post = torch.zeros((), dtype=torch.int32, device=dev)
        self.final = torch.zeros((), dtype=torch.bool, device=dev)
        self.stepped = torch.zeros((), dtype=torch.bool, device=dev)
        self.self_conditioning = cfg.self_conditioning  # validated: only algorithms that self-condition
        if self.self_conditioning:
            self.t_res = residual_temperature(cfg, model)
            self.adapter = model.cfg.adapter if model.with_adapter else None
        self.vocab = getattr(model, "vocab", None)  # logits are a vocabulary slice (repro.engine.parallel)
        self.can_edit = algorithms()[cfg.algorithm].Decoder.can_edit  # a step may end the block
        self.editing = cfg.edits

    # ------------------------------------------------------------------ block start (outside the graph)
    def start_block(self, tokens: torch.Tensor, editable: torch.Tensor) -> None:
        """Load a block's tokens ``[B]`` and editable mask ``[B]``; reset the per-block state and evaluate
        the first "final before any forward?" check (cold start: plain token embeddings). No host sync."""
        self.tokens.copy_(tokens)
        self.editable.copy_(editable)
        self.post.zero_()
        self.stepped.zero_()
        if self.self_conditioning:
            self.embeds.copy_(self.model.embed(self.tokens))
        self._before_forward()

    def _masked(self) -> torch.Tensor:
        return (self.tokens == self.mask_id) & self.editable

    def _before_forward(self, after: torch.Tensor | None = None) -> None:
        """final = the decoders' ``before_forward`` (post counter advanced as they do); ``after``: a step
        already declared the block final (then nothing else is evaluated, as the host loop breaks)."""
        any_mask = self._masked().any()
        if not self.editing:
            fin = ~any_mask
        else:
            bump = (~any_mask).to(torch.int32)
            if after is not None:
                bump = bump * (~after).to(torch.int32)
            self.post.add_(bump)
            fin = ~any_mask & (self.post > self.cfg.max_post_steps)
        self.final.copy_(fin if after is None else (after | fin))

    # ------------------------------------------------------------------ one round (capturable)
    def step(self, logits: torch.Tensor) -> None:
        """Update the state from this forward's ``logits`` ``[B, V]`` (any float dtype). No host sync."""
        cfg = self.cfg
        tokens = self.tokens
        self.last_input.copy_(tokens)
        self.stepped.fill_(True)
        vs = self.vocab
        if vs is None:
            lg = candidate_logits(logits, self.mask_id, cfg.exclude_mask_token)
            p, x = torch.softmax(lg, dim=-1).max(dim=-1)  # = base.propose at temperature 0
        else:  # tensor parallelism: the same values reduced across ranks on the device (repro.engine.parallel)
            lg = vs.candidates(logits, self.mask_id, cfg.exclude_mask_token)
            x, p = vs.propose(lg, 0.0, None)
        if self.self_conditioning:
            z, w, delta = (residual if vs is None else vs.residual)(lg, self.model.params["embed"], self.t_res)
        masked = self._masked()
        had_mask = masked.any()
        change = m2t_set(masked, p, cfg.threshold, cfg.num_to_transfer)  # empty when nothing is masked
        step_final = None  # without editing a step never ends the block by itself (low_confidence)
        if self.can_edit:
            step_final = ~had_mask
            if self.editing:
                edit = t2t_set(self.editable, masked, tokens, x, p, cfg.edit_threshold)
                change = change | edit
                step_final = step_final & ~edit.any()
        tokens.copy_(torch.where(change, x, tokens))
        if self.self_conditioning:
            e_mask = self.model.params["embed"][self.mask_id]
            res = residual_inputs(e_mask, z, w, delta, self.adapter, self.model.params)
            self.embeds.copy_(torch.where(self._masked()[:, None], res, self.model.embed(tokens)))
        self._before_forward(step_final)

    def reuse(self) -> torch.Tensor:
        """Device bool: the block's last forward saw exactly its final tokens (then no commit forward)."""
        return self.stepped & (self.last_input == self.tokens).all()
