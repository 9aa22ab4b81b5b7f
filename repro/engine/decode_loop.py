"""Forward backends and :func:`generate_ids`: one request on one backend, through the engine loop.

Where things stand: the block-diffusion program of a request (layout, prefill in chunks, stopping, bounded
blocks, forward counts, TPF) is :func:`repro.engine.request.decode`; the loop that advances it is
:mod:`repro.engine.loop`. This module holds what runs one request's ops on one **backend** (a
:class:`ForwardBackend`): :class:`CachedBackend` (the engine: prefix KV cache),
:class:`EagerStepBackend` (its rounds as forward + on-device step), :class:`repro.engine.graph.GraphBackend`
(every forward a CUDA-graph replay: the single-request graph path of ``LLM.generate`` on a GPU) and
:class:`repro.engine.reference.ReferenceBackend` (no cache, naive) — and :class:`BackendExecutor`, the loop's
executor over one backend (one request at a time, one backend call per round).

:func:`generate_ids` decodes one request on a backend by driving a private loop on the calling thread, so
tests and benchmarks run exactly the program every other caller runs. Decoder steps: greedy decoding on a
backend with ``device_stepper`` (the CUDA-graph engine) runs each block's rounds as forward + on-device step
(:mod:`repro.engine.decoders.device`) and reads one device flag per round; otherwise the host-driven decoders
run (identical results, tested).
"""

from __future__ import annotations

from typing import Protocol

import torch

from repro.engine.decoders import DecoderConfig
from repro.engine.loop import PENDING, EngineLoop, Request
from repro.engine.model import LLaDA2Model
from repro.engine.request import Begin, Commit, Denoise, GenerationResult, Prefill, Steps, steps_reply

__all__ = ["BackendExecutor", "CachedBackend", "EagerStepBackend", "ForwardBackend", "GenerationResult",
           "generate_ids"]


class ForwardBackend(Protocol):
    """What the loop needs from a model implementation (positions are absolute token indices)."""

    model: LLaDA2Model

    def begin(self, capacity: int, block_size: int) -> None:
        """Prepare a request whose canvas has ``capacity`` positions (allocate caches here, once)."""

    def prefill(self, ids: torch.Tensor, start: int = 0) -> None:
        """Process full prompt blocks ``ids`` ``[n]`` (n a multiple of B) at positions start..start+n-1 (the
        prefix before ``start`` already prefilled; :data:`repro.engine.request.PREFILL_CHUNK` per call)."""

    def denoise(self, ids: torch.Tensor, start: int, embeds: torch.Tensor | None) -> torch.Tensor:
        """Logits ``[B, V]`` fp32 for the block at ``start`` given the final prefix ``< start``."""

    def commit_block(self, ids: torch.Tensor, start: int, run_forward: bool) -> None:
        """Block at ``start`` is final with tokens ``ids``; ``run_forward`` → run the commit forward."""


class CachedBackend:
    """The engine: one preallocated :class:`~repro.engine.cache.KVCache` per request (docs/engine.md §4)."""

    def __init__(self, model: LLaDA2Model):
        self.model = model
        self.cache = None

    def begin(self, capacity: int, block_size: int) -> None:
        """Allocate the KV cache for ``capacity`` positions."""
        self.cache = self.model.new_cache(capacity)
        self.block_size = block_size

    def prefill(self, ids: torch.Tensor, start: int = 0) -> None:
        """One block-causal forward over full prompt blocks at ``start``, K/V kept."""
        self.model.forward(ids, start, self.cache, self.block_size, logits=False)

    def denoise(self, ids, start, embeds):
        """Block forward against the cached prefix; its provisional K/V land in the block's slots."""
        return self.model.forward(ids, start, self.cache, self.block_size, embeds=embeds)

    def commit_block(self, ids, start, run_forward):
        """Commit forward (K/V of the final tokens) when needed; otherwise the last forward's K/V stay."""
        if run_forward:
            self.model.forward(ids, start, self.cache, self.block_size, logits=False)


class EagerStepBackend(CachedBackend):
    """:class:`CachedBackend` whose rounds run as forward + on-device step (:mod:`repro.engine.decoders.device`)
    eagerly, without CUDA graphs: the on-device step's decisions on any device (tests compare it with the
    host decoders on CPU). ``mask_id``: the ``<|mask|>`` id; ``rounds`` counts forward + step rounds."""

    def __init__(self, model: LLaDA2Model, mask_id: int):
        super().__init__(model)
        self.mask_id, self.rounds = mask_id, 0

    def device_stepper(self, cfg: DecoderConfig):
        """A DeviceStep over this backend's own ``[B]`` ids / ``[B, D]`` embeds buffers; None when sampling."""
        from repro.engine.decoders.device import DeviceStep, supported

        if not supported(cfg):
            return None
        m = self.model
        self.ids = torch.zeros(self.block_size, dtype=torch.long, device=m.device)
        self.emb = torch.zeros(self.block_size, m.cfg.hidden_size, dtype=m.dtype, device=m.device)
        return DeviceStep(cfg, self.mask_id, m, self.ids, self.emb)

    def denoise_step(self, st, start: int) -> None:
        """One round: block forward from the step's buffers, then its on-device step."""
        self.rounds += 1
        st.step(self.model.forward(st.tokens, start, self.cache, self.block_size,
                                   embeds=st.embeds if st.self_conditioning else None))


class BackendExecutor:
    """The loop's executor over one :class:`ForwardBackend` (:mod:`repro.engine.loop`): one request at a time
    (``slots`` 1), each round one backend call — a prefill chunk, a denoising forward, a commit forward, or one
    forward + on-device step of a :class:`~repro.engine.request.Steps` block (then one device flag read).
    ``kind``: ``"single"`` (``BatchStats.engine``)."""

    kind = "single"
    slots = 1

    def __init__(self, backend: ForwardBackend):
        self.backend, self.model = backend, backend.model
        self.stepper, self.n = None, 0

    @property
    def capture_s(self) -> float:
        """Seconds the backend spent capturing CUDA graphs (0 for backends without graphs)."""
        return float(getattr(self.backend, "capture_s", 0.0))

    def start(self, req, op):
        """The reply of ``op`` when it needs no round (``Begin``, a commit without forward, a block final before
        any round), else :data:`~repro.engine.loop.PENDING`."""
        b = self.backend
        if isinstance(op, Begin):
            b.begin(op.capacity, op.block_size)
            make = getattr(b, "device_stepper", None)  # backends with an on-device decoder step
            self.stepper = make(op.decoder) if make is not None else None
            return self.stepper is not None
        if isinstance(op, Commit) and not op.run_forward:
            b.commit_block(op.ids, op.start, False)
            return None
        if isinstance(op, Steps):
            self.stepper.start_block(op.tokens, op.editable)
            self.n = 0
            done = steps_reply(self.stepper, 0, op.cap)
            return PENDING if done is None else done
        return PENDING

    def round(self, reqs: list) -> None:
        """The one request's pending op, as one backend call."""
        (req,) = reqs
        op, b = req.op, self.backend
        if isinstance(op, Prefill):
            b.prefill(op.ids, op.start)
            req.reply = None
        elif isinstance(op, Denoise):
            req.reply = b.denoise(op.ids, op.start, op.embeds)
        elif isinstance(op, Commit):
            b.commit_block(op.ids, op.start, True)
            req.reply = None
        else:  # Steps: one forward + on-device step
            b.denoise_step(self.stepper, op.start)
            self.n += 1
            done = steps_reply(self.stepper, self.n, op.cap)
            req.reply = PENDING if done is None else done

    def rows(self, req) -> int:
        """Token rows of the request's current op."""
        op = req.op
        return int(op.ids.shape[0]) if isinstance(op, (Prefill, Denoise, Commit)) else int(op.tokens.shape[0])

    def release(self, req) -> None:
        """The request left."""
        self.stepper = None


def generate_ids(backend: ForwardBackend, prompt_ids: list[int], decoder: DecoderConfig | dict, *,
                 mask_id: int, eos_id: int, max_new_tokens: int | None = None,
                 seed: int | None = None, on_block=None) -> GenerationResult:
    """Decode a completion of ``prompt_ids`` with ``decoder`` on ``backend``: the program of
    :func:`repro.engine.request.decode` (its arguments, rules and errors) run by a private
    :class:`~repro.engine.loop.EngineLoop` on this thread over a :class:`BackendExecutor`. ``on_block`` is
    called on this thread. Raises what the program raises (ValueError for an empty prompt, an id outside the
    vocabulary, a missing budget); a block stopped at the forward cap is warned about (RuntimeWarning)."""
    loop = EngineLoop()
    sched = loop.scheduler(lambda: BackendExecutor(backend), slots=1, mask_id=mask_id, eos_id=eos_id)
    req = sched.submit(Request(list(prompt_ids), decoder, max_new_tokens, seed, on_block=on_block))
    loop.run(lambda: req.done)
    return req.wait()
