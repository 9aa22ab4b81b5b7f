"""Batched, batch-invariant generation on the eager forward: many requests decode together, one forward per round.

Where things stand: :class:`EagerExecutor` is the engine loop's executor over the eager forward
(:meth:`~repro.engine.model.LLaDA2Model.forward_chunks`); every round runs **one** forward over the op each
active request needs next — a chunk of its prompt prefill, a denoising forward of its current block, its
block's commit forward, or (with ``device_steps``) a forward + on-device step of its block. Each request keeps
its own prompt length, prefix KV cache (:class:`~repro.engine.cache.KVCache`), decoder state and forward counts.
It runs ``LLM.generate`` and ``LLM.generate_batch`` on the CPU (and on a GPU when no graph path applies:
sampling, other block sizes), the server's eager scheduler, and every rank under tensor parallelism (there with
the on-device step for greedy decoders, as every rank must take the same decisions without a host round trip).
:func:`generate_batch` decodes a fixed list on a private loop (:mod:`repro.engine.loop`) on the calling thread.

* Continuous batching: a waiting request takes a free slot at the next round; results in input order.
* Batch invariance: with greedy decoding each request's token ids and forward counts are bit-identical alone
  (batch 1) or in any batch, because ``forward_chunks`` is row-invariant on the torch path (fixed GEMM row
  tiles, :mod:`repro.engine.layers.linear`; attention per request over its own cache), and a prompt's prefill
  chunks (:data:`repro.engine.request.PREFILL_CHUNK`) do not depend on the batch. Sampling draws from each
  request's own seeded generator. Tested on the tiny checkpoint (``tests/engine/test_batch.py``). On a GPU with
  the Triton seams, invariance holds as far as those kernels' tiling does not depend on the number of rows.
* Isolation: when a round's forward fails (e.g. an allocation), each op of that round is run again alone
  (the same bits: row-invariance), so only the requests whose own op fails, fail.

Timing: a request's ``wall_s`` runs from its admission to its end (its latency inside the batch);
:class:`BatchStats` gives the batch's rounds, forward rows and wall time (aggregate tokens/s).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from repro.engine.decoders import DecoderConfig
from repro.engine.decoders.device import DeviceStep, supported
from repro.engine.loop import PENDING, BatchStats, EngineLoop, OpError, Request
from repro.engine.model import Chunk, LLaDA2Model
from repro.engine.request import Begin, Commit, Denoise, GenerationResult, Steps, steps_reply

__all__ = ["BatchRequest", "BatchStats", "EagerExecutor", "GenerationResult", "generate_batch", "run_requests"]


@dataclass
class BatchRequest:
    """One request: prompt ids ``[P]`` (ints), decoder settings, optional ``max_new_tokens`` / ``seed``
    overrides and ``on_block`` streaming hook (as :func:`repro.engine.request.decode`)."""

    prompt_ids: list[int]
    decoder: DecoderConfig | dict
    max_new_tokens: int | None = None
    seed: int | None = None
    on_block: object = None


class _State:
    """A request's KV cache, block size and (device steps) its DeviceStep with its round count."""

    def __init__(self, cache, block_size: int, stepper):
        self.cache, self.B, self.stepper, self.n = cache, block_size, stepper, 0


class EagerExecutor:
    """Executor of the eager batched forward (module docstring). ``model``: a loaded
    :class:`~repro.engine.model.LLaDA2Model` (a rank's ShardedModel under tensor parallelism); ``mask_id``;
    ``device_steps``: greedy decoders run as forward + :class:`~repro.engine.decoders.device.DeviceStep` rounds
    (one flag read per request and round) instead of the host decoders; ``isolate``: retry a failed round op by
    op (off under tensor parallelism, where every rank must run the same forwards)."""

    kind = "eager"
    slots = None
    capture_s = 0.0

    def __init__(self, model: LLaDA2Model, mask_id: int, device_steps: bool = False, isolate: bool = True):
        self.model, self.mask_id, self.device_steps, self.isolate = model, mask_id, device_steps, isolate
        self._st: dict = {}

    def start(self, req, op):
        """``Begin`` allocates the request's KV cache (and DeviceStep); a commit without forward and a block
        final before any round answer at once; other ops wait for the round (:data:`PENDING`)."""
        if isinstance(op, Begin):
            m = self.model
            stepper = None
            if self.device_steps and supported(op.decoder):
                ids = torch.zeros(op.block_size, dtype=torch.long, device=m.device)
                emb = torch.zeros(op.block_size, m.cfg.hidden_size, dtype=m.dtype, device=m.device)
                stepper = DeviceStep(op.decoder, self.mask_id, m, ids, emb)
            self._st[req] = _State(m.new_cache(op.capacity), op.block_size, stepper)
            return stepper is not None
        if isinstance(op, Commit) and not op.run_forward:
            return None
        if isinstance(op, Steps):
            st = self._st[req]
            st.stepper.start_block(op.tokens, op.editable)
            st.n = 0
            done = steps_reply(st.stepper, 0, op.cap)
            return PENDING if done is None else done
        return PENDING

    def _chunk(self, req) -> Chunk:
        op, st = req.op, self._st[req]
        if isinstance(op, Steps):
            sp = st.stepper
            return Chunk(op.start, st.cache, st.B, ids=sp.tokens, embeds=sp.embeds if sp.self_conditioning else None)
        if isinstance(op, Denoise):
            return Chunk(op.start, st.cache, st.B, ids=op.ids, embeds=op.embeds)
        return Chunk(op.start, st.cache, st.B, ids=op.ids, logits=False)  # Prefill, Commit

    def _forward(self, chunks: list[Chunk]) -> list:
        outs = self.model.forward_chunks(chunks)
        if self.model.device.type == "cuda":
            torch.cuda.synchronize(self.model.device)
        return outs

    def round(self, reqs: list) -> None:
        """One forward over every request's op; then each DeviceStep steps on its logits."""
        chunks = [self._chunk(r) for r in reqs]
        try:
            outs = self._forward(chunks)
        except Exception:
            if not self.isolate or len(chunks) == 1:
                raise
            outs = []
            for c in chunks:  # the same bits alone (row-invariance): only a request whose own op fails, fails
                try:
                    outs.append(self._forward([c])[0])
                except Exception as e:  # noqa: BLE001 - that request's failure
                    outs.append(OpError(e))
        for r, out in zip(reqs, outs):
            op = r.op
            if isinstance(out, OpError):
                r.reply = out
            elif isinstance(op, Steps):
                st = self._st[r]
                st.stepper.step(out)
                st.n += 1
                done = steps_reply(st.stepper, st.n, op.cap)
                r.reply = PENDING if done is None else done
            else:
                r.reply = out if isinstance(op, Denoise) else None

    def rows(self, req) -> int:
        """Token rows of the request's op in this round."""
        op = req.op
        return int(op.tokens.shape[0]) if isinstance(op, Steps) else int(op.ids.shape[0])

    def release(self, req) -> None:
        """The request left: its cache is freed with its state."""
        self._st.pop(req, None)


def run_requests(loop: EngineLoop, sched, requests: list[BatchRequest], stats: BatchStats,
                 on_result=None) -> list[tuple[GenerationResult, float]]:
    """Submit ``requests`` to ``sched`` of the (non-threaded) ``loop`` and drive it on this thread until all are
    done; returns ``(GenerationResult, wall_s)`` in input order. ``on_result(index, result, wall_s)`` is called
    on this thread as each finishes (finishing order). The first request error cancels the others and is
    raised once they stopped."""
    finished: list[Request] = []
    reqs = [Request(list(r.prompt_ids), r.decoder, r.max_new_tokens, r.seed, on_block=r.on_block, stats=stats,
                    index=i, on_done=finished.append) for i, r in enumerate(requests)]
    stats.admitted_at_round = [0] * len(reqs)
    out: list = [None] * len(reqs)
    error: list = []

    def until() -> bool:
        while finished:
            r = finished.pop(0)
            if r.error is not None and not error:
                error.append(r.error)
                for other in reqs:
                    other.cancel()
            elif not error and r.result is not None:
                out[r.index] = (r.result, r.wall_s)
                if on_result is not None:
                    on_result(r.index, r.result, r.wall_s)
        return all(r.done for r in reqs)

    for r in reqs:
        sched.submit(r)
    loop.run(until)
    until()
    if error:
        raise error[0]
    return out


def generate_batch(model: LLaDA2Model, requests: list[BatchRequest], *, mask_id: int, eos_id: int,
                   batch_size: int = 8, on_result=None, stats: BatchStats | None = None
                   ) -> list[tuple[GenerationResult, float]]:
    """Decode ``requests`` with up to ``batch_size`` active at once on the eager forward (module docstring);
    returns, in input order, ``(GenerationResult, wall_s)`` per request. ``on_result(index, result, wall_s)``,
    if given, is called on the calling thread as each request finishes (in finishing order). ``stats``: a
    :class:`BatchStats` to fill. Raises ValueError for ``batch_size < 1``; the first error of any request (as
    :func:`~repro.engine.request.decode` raises it) after stopping the others."""
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer ≥ 1, got {batch_size!r}")
    stats = stats if stats is not None else BatchStats()
    t0 = time.perf_counter()
    loop = EngineLoop()
    sched = loop.scheduler(lambda: EagerExecutor(model, mask_id), slots=batch_size, mask_id=mask_id, eos_id=eos_id)
    out = run_requests(loop, sched, list(requests), stats, on_result)
    stats.wall_s = time.perf_counter() - t0
    return out
