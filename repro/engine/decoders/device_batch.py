"""The on-device decoder step for many requests at once: :class:`BatchedDeviceStep` over ``[S, B]`` buffers.

:class:`BatchedDeviceStep` is :class:`repro.engine.decoders.device.DeviceStep` for ``S`` slots (one request
each) sharing one greedy :class:`~repro.engine.decoders.base.DecoderConfig`: the same rules
(:func:`~repro.engine.decoders.base.candidate_logits`, :func:`~repro.engine.decoders.base.m2t_set`,
:func:`~repro.engine.decoders.base.t2t_set`, the ORL residual of :mod:`repro.engine.adapter` at
:func:`~repro.engine.decoders.orl.residual_temperature`) applied to every slot whose ``step_mask`` is set;
the other slots' state is left untouched. Per slot it computes exactly what a ``DeviceStep`` computes from the
same logits (tested: ``tests/engine/test_batch_graph.py``), and a slot's result never depends on the other
slots (batch invariance):

* the greedy proposals (argmax x̂ and its softmax probability p of the candidate logits): on CUDA one launch pair
  over all ``S·B`` rows of :func:`repro.engine.kernels.logits.logits_stats` (each row reduced by its own
  programs in a fixed order — its result does not depend on ``S``; p in another summation order than torch's
  softmax, i.e. equal to the last bits or so), on the CPU per slot with torch as ``DeviceStep`` does;
* the other vocabulary-wide reductions (the ORL residual's softmax and entropy) run per slot on ``[B, V]`` views —
  the shapes of the single-request step, so a reduction kernel never sees a different number of rows;
* the residual's ``p @ E`` GEMM runs once over all slots through :func:`repro.engine.layers.linear.linear`
  (fixed row tiles: a row's result does not depend on the other rows; reading the embedding table once
  per tile, not once per slot); the adapter's GEMMs run per slot;
* everything else is element-wise or a per-row reduction over ``B`` positions.

State (static tensors, all ``S`` rows): ``tokens`` ``[S, B]`` int64 (the batched forward's ``ids``),
``embeds`` ``[S, B, D]`` (its ``embeds_in``), ``editable`` ``[S, B]`` bool, ``last_input`` ``[S, B]``,
``post`` ``[S]`` int32, ``final`` ``[S]`` bool, ``stepped`` ``[S]`` bool, ``step_mask`` ``[S]`` bool (set by
the caller before a round), and ``flags`` ``[2, S]`` bool (``final`` and "the block's last forward saw exactly
its final tokens", :meth:`BatchedDeviceStep.reuse`), refreshed at the end of every :meth:`step` so that the
host reads one ``[2, S]`` tensor per round. :meth:`view` gives the per-slot object the generate loop drives.
"""

from __future__ import annotations

import torch

from repro.engine.adapter import normalized_entropy, residual_inputs
from repro.engine.decoders.base import DecoderConfig, algorithms, candidate_logits, t2t_set
from repro.engine.decoders.device import device_step_problem
from repro.engine.decoders.orl import residual_temperature
from repro.engine.layers.linear import linear


class BatchedDeviceStep:
    """Sync-free decoder step over ``S`` slots (module docstring).

    ``fused_stats``: the greedy proposals (x̂, p) of all rows by :func:`repro.engine.kernels.logits.logits_stats`
    (default on CUDA; the same function as the torch path — argmax and max softmax probability of the candidate
    logits — in another fp32 summation order, so p may differ from it in the last bits); otherwise torch, slot by
    slot (the CPU path).

    ``cfg``: greedy :class:`DecoderConfig` shared by all slots; ``mask_id``: the ``<|mask|>`` id; ``model``:
    the :class:`~repro.engine.model.LLaDA2Model` (embedding table, adapter); ``tokens``: the ``[S, B]`` int64
    buffer the forward reads; ``embeds``: the ``[S, B, D]`` buffer it reads for self-conditioning (unused
    otherwise). Raises ValueError (one line) for settings the on-device step does not implement
(:func:`~repro.engine.decoders.device.device_step_problem`: sampling, a decoder that declares no on-device step).
    """

    STAT_CHUNKS = 16  # vocabulary chunks per row of the fused proposals (a constant: a row's order never varies)

    def __init__(self, cfg: DecoderConfig, mask_id: int, model, tokens: torch.Tensor, embeds: torch.Tensor | None,
                 fused_stats: bool | None = None):
        why = device_step_problem(cfg)
        if why is not None:
            raise ValueError(f"BatchedDeviceStep cannot run this decoder: {why}")
        self.cfg, self.mask_id, self.model = cfg, mask_id, model
        S, B = tokens.shape
        dev = tokens.device
        self.S, self.B = S, B
        self.tokens, self.embeds = tokens, embeds
        self.editable = torch.zeros_like(tokens, dtype=torch.bool)
        self.last_input = torch.zeros_like(tokens)
        self.post = torch.zeros(S, dtype=torch.int32, device=dev)
        self.final = torch.zeros(S, dtype=torch.bool, device=dev)
        self.stepped = torch.zeros(S, dtype=torch.bool, device=dev)
        self.step_mask = torch.zeros(S, dtype=torch.bool, device=dev)
        self.flags = torch.zeros(2, S, dtype=torch.bool, device=dev)
        # per-slot proposals of the current step (vocabulary-wide parts, written slot by slot)
        self._p = torch.zeros(S, B, dtype=torch.float32, device=dev)
        self._x = torch.zeros(S, B, dtype=torch.long, device=dev)
        # the proposals of all S·B rows in one launch pair (kernels/logits.py: one row's fixed-order reduction,
        # whatever S) instead of S slot-by-slot torch softmaxes over the vocabulary; default on CUDA
        self.fused_stats = dev.type == "cuda" if fused_stats is None else fused_stats
        if self.fused_stats:
            self._part = torch.zeros(S * B, self.STAT_CHUNKS, 4, dtype=torch.float32, device=dev)
            self._ent = torch.zeros(S * B, dtype=torch.float32, device=dev)
        self.self_conditioning = cfg.self_conditioning
        if self.self_conditioning:
            E = model.params["embed"]
            self.t_res = residual_temperature(cfg, model)
            self.adapter = model.cfg.adapter if model.with_adapter else None
            self._probs = torch.zeros(S * B, E.shape[0], dtype=E.dtype, device=dev)
            self._w = torch.zeros(S, B, dtype=torch.float32, device=dev)
        self.can_edit = algorithms()[cfg.algorithm].Decoder.can_edit
        self.editing = cfg.edits

    def view(self, slot: int) -> "SlotStepper":
        """The per-slot stepper of row ``slot`` (what a :class:`~repro.engine.request.Steps` op drives)."""
        return SlotStepper(self, slot)

    # ------------------------------------------------------------------ block start (one slot, outside the graph)
    def start_block(self, slot: int, tokens: torch.Tensor, editable: torch.Tensor) -> None:
        """Load slot ``slot``'s block tokens ``[B]`` and editable mask ``[B]``; reset its per-block state and
        evaluate its "final before any forward?" check into ``final[slot]``. Other rows untouched; no sync."""
        s = slot
        self.tokens[s].copy_(tokens)
        self.editable[s].copy_(editable)
        self.post[s] = 0
        self.stepped[s] = False
        if self.self_conditioning:
            self.embeds[s].copy_(self.model.embed(self.tokens[s]))
        # row s only (other workers start their blocks concurrently): DeviceStep._before_forward of one row
        any_mask = ((self.tokens[s] == self.mask_id) & self.editable[s]).any()
        if not self.editing:
            fin = ~any_mask
        else:
            self.post[s:s + 1].add_((~any_mask).to(torch.int32))
            fin = ~any_mask & (self.post[s] > self.cfg.max_post_steps)
        self.final[s:s + 1].copy_(fin)
        self.flags[0, s:s + 1].copy_(fin)
        self.flags[1, s:s + 1].fill_(False)

    def _masked(self) -> torch.Tensor:
        return (self.tokens == self.mask_id) & self.editable

    def _before_forward(self, rows: torch.Tensor, after: torch.Tensor | None = None) -> None:
        """(In a round, all rows at once.) ``final`` of the rows in ``rows`` [S] bool = the decoders'
        ``before_forward`` (their post counter advanced as they do); ``after`` [S]: the step already declared
        the block final (DeviceStep's rule)."""
        any_mask = self._masked().any(-1)
        if not self.editing:
            fin = ~any_mask
        else:
            bump = (~any_mask & rows).to(torch.int32)
            if after is not None:
                bump = bump * (~after).to(torch.int32)
            self.post.add_(bump)
            fin = ~any_mask & (self.post > self.cfg.max_post_steps)
        if after is not None:
            fin = after | fin
        self.final.copy_(torch.where(rows, fin, self.final))

    # ------------------------------------------------------------------ one round (capturable)
    def step(self, logits: torch.Tensor) -> None:
        """Update the slots in ``step_mask`` from this forward's ``logits`` ``[S, B, V]`` (any float dtype);
        then refresh ``flags``. No host sync."""
        cfg, S, B = self.cfg, self.S, self.B
        rows = self.step_mask
        tokens = self.tokens
        old = tokens.clone()
        if self.fused_stats:  # x̂ = first argmax, p = 1 / Σ e^(l - max) over the candidate logits, per row
            from repro.engine.kernels import logits as Lg

            Lg.logits_stats(logits.reshape(S * B, -1), self._part, self._x.view(-1), self._p.view(-1), self._ent,
                            nchunk=self.STAT_CHUNKS, exclude=self.mask_id if cfg.exclude_mask_token else -1)
        for s in range(S) if (self.self_conditioning or not self.fused_stats) else ():
            # vocabulary-wide: the single-request shapes, slot by slot
            lg = candidate_logits(logits[s], self.mask_id, cfg.exclude_mask_token)
            if not self.fused_stats:
                p, x = torch.softmax(lg, dim=-1).max(dim=-1)
                self._p[s].copy_(p)
                self._x[s].copy_(x)
            if self.self_conditioning:  # adapter.residual, split: softmax and entropy per slot, p @ E tiled
                self._probs[s * B:(s + 1) * B].copy_(torch.softmax(lg.float(), dim=-1))
                self._w[s].copy_(normalized_entropy(lg, self.t_res))
        p, x = self._p, self._x
        masked = self._masked()
        had_mask = masked.any(-1)
        change = _m2t_rows(masked, p, cfg.threshold, cfg.num_to_transfer)
        step_final = None
        if self.can_edit:
            step_final = ~had_mask
            if self.editing:
                edit = t2t_set(self.editable, masked, tokens, x, p, cfg.edit_threshold)
                change = change | edit
                step_final = step_final & ~edit.any(-1)
        new = torch.where(change, x, tokens)
        tokens.copy_(torch.where(rows[:, None], new, tokens))
        self.last_input.copy_(torch.where(rows[:, None], old, self.last_input))
        self.stepped.copy_(self.stepped | rows)
        if self.self_conditioning:
            E = self.model.params["embed"]
            delta = linear(self._probs, E.t()).float().view(S, B, -1)
            z = self._w[..., None] * delta
            e_mask = E[self.mask_id]
            now_masked = self._masked()
            for s in range(S):
                res = residual_inputs(e_mask, z[s], self._w[s], delta[s], self.adapter, self.model.params)
                emb = torch.where(now_masked[s][:, None], res, self.model.embed(tokens[s]))
                self.embeds[s].copy_(torch.where(rows[s], emb, self.embeds[s]))
        self._before_forward(rows, step_final)
        self.flags[0].copy_(self.final)
        self.flags[1].copy_(self.reuse())

    def reuse(self) -> torch.Tensor:
        """Device bool ``[S]``: each slot's last forward saw exactly its final tokens (then no commit forward)."""
        return self.stepped & (self.last_input == self.tokens).all(-1)


def _m2t_rows(masked: torch.Tensor, p: torch.Tensor, threshold: float, num_to_transfer: int) -> torch.Tensor:
    """:func:`repro.engine.decoders.base.m2t_set` for each row of ``masked`` / ``p`` ``[S, B]`` (the same rule:
    masked positions with ``p > threshold``, else the ``num_to_transfer`` most confident masked ones)."""
    sel = masked & (p > threshold)
    conf = torch.where(masked, p, torch.full_like(p, -1.0))
    k = min(num_to_transfer, masked.shape[-1])
    fallback = torch.zeros_like(masked).scatter_(-1, conf.topk(k, dim=-1).indices, True) & masked
    return torch.where((sel.sum(-1) < num_to_transfer)[:, None], fallback, sel)


class SlotStepper:
    """One slot of a :class:`BatchedDeviceStep`, with the interface of
    :class:`~repro.engine.decoders.device.DeviceStep` that a :class:`~repro.engine.request.Steps` op uses:
    ``start_block``, ``final`` (a host bool), ``tokens`` (the slot's ``[B]`` row), ``reuse()`` (host bool),
    ``self_conditioning``. ``final`` / ``reuse`` are host copies the batched scheduler sets after each round
    from the one ``[2, S]`` flags read (:meth:`set_flags`); after :meth:`start_block` the first read of
    ``final`` copies the slot's flag (one small read per block)."""

    def __init__(self, step: BatchedDeviceStep, slot: int):
        self.step_, self.slot = step, slot
        self.self_conditioning = step.self_conditioning
        self._final: bool | None = False
        self._reuse = False

    @property
    def tokens(self) -> torch.Tensor:
        """The slot's block tokens ``[B]`` int64 (a view of the batched buffer)."""
        return self.step_.tokens[self.slot]

    @property
    def final(self) -> bool:
        """Host bool: the block is final (no further denoising forward)."""
        if self._final is None:
            self._final = bool(self.step_.final[self.slot])
        return self._final

    def start_block(self, tokens: torch.Tensor, editable: torch.Tensor) -> None:
        """:meth:`BatchedDeviceStep.start_block` for this slot."""
        self.step_.start_block(self.slot, tokens, editable)
        self._final, self._reuse = None, False

    def set_flags(self, final: bool, reuse: bool) -> None:
        """Host copies of this slot's flags after a round (the scheduler's one read)."""
        self._final, self._reuse = final, reuse

    def reuse(self) -> bool:
        """Host bool: the block's last forward saw exactly its final tokens."""
        return self._reuse
