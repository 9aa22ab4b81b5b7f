"""Batched, batch-invariant generation: many requests decode together, one forward per round.

Contract:

* :func:`generate_batch` decodes a list of :class:`BatchRequest` with up to ``batch_size`` of them active at
  once. Each active request keeps its own prompt length, prefix KV cache (:class:`~repro.engine.cache.KVCache`),
  decoder state and forward counts; every **round** runs one forward
  (:meth:`~repro.engine.model.LLaDA2Model.forward_chunks`) over the chunk each active request needs next — its
  prompt prefill, a denoising forward of its current block, or its block's commit forward.
* Continuous batching: when a request finishes, the next waiting request takes its slot before the next
  round (a slot never idles while work waits); results come back in input order.
* Same decoding as one request at a time: each request runs the unchanged
  :func:`repro.engine.decode_loop.generate_ids` (the decoders' block functions, stopping rules, forward
  counting, stall warnings, ``on_block``) in a worker thread whose backend (:class:`_SlotBackend`) hands its
  forwards to the scheduler instead of running them. Worker threads only prepare inputs and step their
  decoder; every forward runs on the calling thread, one per round.
* Batch invariance: with greedy decoding each request's token ids and forward counts are bit-identical
  alone (batch 1) or in any batch, because ``forward_chunks`` is row-invariant on the torch path (fixed GEMM
  row tiles, :mod:`repro.engine.layers.linear`; attention per request over its own cache). Sampling
  (``temperature > 0``) draws from each request's own seeded generator, so it too does not depend on the
  batch. Tested on the tiny checkpoint over real problems (``tests/engine/test_batch.py``).
* Paths: this engine runs the eager forward (torch layer functions, or whatever implementations are
  selected in the layer seams); on a GPU with the Triton seams selected, invariance holds only as far as those
  kernels' tiling does not depend on the number of rows (``docs/perf.md`` "Batched generation"). The CUDA-graph
  form — one replay per round over all slots with the on-device decoder step — is
  :mod:`repro.engine.batch_graph`, which reuses this scheduler through its hooks (``_backend``, ``_admit``,
  ``_release``, ``_round``).

Timing: a request's ``wall_s`` runs from its admission to its last forward (its latency inside the batch);
:class:`BatchStats` gives the batch's rounds, forward rows and wall time (aggregate tokens/s).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import torch

from repro.engine.decode_loop import GenerationResult, generate_ids
from repro.engine.decoders import DecoderConfig
from repro.engine.model import Chunk, LLaDA2Model


@dataclass
class BatchRequest:
    """One request: prompt ids ``[P]`` (ints), decoder settings, optional ``max_new_tokens`` / ``seed``
    overrides and ``on_block`` streaming hook (as :func:`repro.engine.decode_loop.generate_ids`)."""

    prompt_ids: list[int]
    decoder: DecoderConfig | dict
    max_new_tokens: int | None = None
    seed: int | None = None
    on_block: object = None


@dataclass
class BatchStats:
    """What a :func:`generate_batch` call did: ``rounds`` (forwards run), ``rows`` (token rows over all
    rounds), ``max_active`` (most requests in one round), ``wall_s`` (seconds, whole call),
    ``round_s`` (seconds per round, list), ``admitted_at_round`` (per request, the round it joined),
    ``engine`` (``"eager"`` or ``"cuda-graph"``: :mod:`repro.engine.batch_graph`), ``capture_s`` (seconds
    spent capturing CUDA graphs in this call; 0 when reused or eager), ``round_prefill`` (graph path: per
    round, whether it ran a prompt-prefill block)."""

    rounds: int = 0
    rows: int = 0
    max_active: int = 0
    wall_s: float = 0.0
    round_s: list[float] = field(default_factory=list)
    admitted_at_round: list[int] = field(default_factory=list)
    engine: str = "eager"
    capture_s: float = 0.0
    round_prefill: list[bool] = field(default_factory=list)


class _Aborted(Exception):
    """Raised inside a worker thread when the batch is being torn down after another request failed."""


CONTINUE = object()
"""What :meth:`_Scheduler._round` returns for a slot whose pending forward is a multi-round job that is not done
(the graph path's :class:`repro.engine.batch_graph.StepJob`): the slot stays waiting and its worker is not woken."""


class _Slot:
    """A request in flight: its thread, its pending forward, its result or error."""

    def __init__(self, index: int):
        self.index = index
        self.state = "running"  # running | waiting (pending forward) | done
        self.pending: Chunk | None = None
        self.output = None
        self.event = threading.Event()
        self.result: GenerationResult | None = None
        self.error: BaseException | None = None
        self.wall_s = 0.0


class _SlotBackend:
    """:class:`repro.engine.decode_loop.ForwardBackend` of one request: its own KV cache; every forward is
    handed to the scheduler (:meth:`_Scheduler.submit`), which runs it inside the round's batched forward."""

    def __init__(self, sched: "_Scheduler", slot: _Slot):
        self.sched, self.slot, self.model = sched, slot, sched.model
        self.cache = None

    def begin(self, capacity: int, block_size: int) -> None:
        """Allocate this request's KV cache for ``capacity`` positions."""
        self.cache = self.model.new_cache(capacity)
        self.block_size = block_size

    def prefill(self, ids: torch.Tensor) -> None:
        """Full prompt blocks, block-causal, K/V kept (no logits)."""
        self.sched.submit(self.slot, Chunk(0, self.cache, self.block_size, ids=ids, logits=False))

    def denoise(self, ids, start, embeds):
        """Logits ``[B, V]`` fp32 of the block at ``start``."""
        return self.sched.submit(self.slot, Chunk(start, self.cache, self.block_size, ids=ids, embeds=embeds))

    def commit_block(self, ids, start, run_forward):
        """The commit forward (K/V of the final tokens) when needed."""
        if run_forward:
            self.sched.submit(self.slot, Chunk(start, self.cache, self.block_size, ids=ids, logits=False))


class _Scheduler:
    """Rounds over the active slots (module docstring). Worker threads call :meth:`submit`; the calling
    thread runs :meth:`run`."""

    def __init__(self, model: LLaDA2Model, mask_id: int, eos_id: int):
        self.model, self.mask_id, self.eos_id = model, mask_id, eos_id
        self.cond = threading.Condition()
        self.abort = False

    def submit(self, slot: _Slot, chunk: Chunk):
        """Called from a worker: queue ``chunk`` for the next round and wait for its output."""
        with self.cond:
            if self.abort:
                raise _Aborted()
            slot.pending, slot.state = chunk, "waiting"
            self.cond.notify_all()
        slot.event.wait()
        slot.event.clear()
        if self.abort:
            raise _Aborted()
        out, slot.output = slot.output, None
        return out

    # ------------------------------------------------------------------ hooks (the graph path overrides them)
    def _backend(self, slot: _Slot):
        """The forward backend a worker's ``generate_ids`` runs on."""
        return _SlotBackend(self, slot)

    def _admit(self, slot: _Slot) -> None:
        """A request joins (before its thread starts)."""

    def _release(self, slot: _Slot) -> None:
        """A request left (finished or failed)."""

    def _round(self, active: list[_Slot], stats: BatchStats) -> list:
        """Run one round over the pending forwards of ``active``; returns each slot's output, in order
        (:data:`CONTINUE` for a slot whose pending job needs more rounds)."""
        chunks = [s.pending for s in active]
        with torch.inference_mode():
            outs = self.model.forward_chunks(chunks)
        if self.model.device.type == "cuda":
            torch.cuda.synchronize(self.model.device)
        stats.rows += sum(int((c.embeds if c.embeds is not None else c.ids).shape[0]) for c in chunks)
        return outs

    def _worker(self, slot: _Slot, req: BatchRequest) -> None:
        dev = self.model.device
        try:
            if dev.type == "cuda" and dev.index is not None:
                torch.cuda.set_device(dev)
            t0 = time.perf_counter()
            with torch.inference_mode():  # thread-local: enter it in the worker too
                slot.result = generate_ids(self._backend(slot), req.prompt_ids, req.decoder,
                                           mask_id=self.mask_id, eos_id=self.eos_id,
                                           max_new_tokens=req.max_new_tokens, seed=req.seed, on_block=req.on_block)
            slot.wall_s = time.perf_counter() - t0
        except _Aborted:
            pass
        except BaseException as e:  # noqa: BLE001 — handed to the calling thread and re-raised there
            slot.error = e
        finally:
            with self.cond:
                slot.state = "done"
                self.cond.notify_all()

    def run(self, requests: list[BatchRequest], batch_size: int, stats: BatchStats,
            on_result=None) -> list[tuple[GenerationResult, float]]:
        """Decode the fixed list ``requests`` (:func:`generate_batch`); the first request error is re-raised."""
        results: list = [None] * len(requests)
        queue = list(range(len(requests)))
        queue.reverse()
        stats.admitted_at_round = [0] * len(requests)

        def take(idle: bool):
            if not queue:
                return None
            i = queue.pop()
            stats.admitted_at_round[i] = stats.rounds
            return i, requests[i]

        def finished(i, result, wall_s, error):
            if error is not None:
                raise error
            results[i] = (result, wall_s)
            if on_result is not None:
                on_result(i, result, wall_s)

        self.serve(take, batch_size, stats, finished)
        return results

    def serve(self, take, batch_size: int, stats: BatchStats, finished) -> None:
        """The round loop over requests that arrive while it runs (:func:`run` feeds it a fixed list; the server
        its queue). ``take(idle)`` → ``(key, BatchRequest)`` or None: called while a slot is free, with
        ``idle`` True when no request is active (it may then block until one arrives; None then ends the
        loop). ``finished(key, result, wall_s, error)`` is called on this thread as each request leaves
        (``error``: the exception its ``generate_ids`` raised, else None); an exception it raises stops
        every other request and propagates."""
        active: list[_Slot] = []
        threads: dict[int, threading.Thread] = {}
        keys: dict[int, object] = {}
        n = 0
        try:
            while True:
                while len(active) < batch_size:  # continuous batching: fill free slots
                    got = take(not active)
                    if got is None:
                        break
                    key, req = got
                    slot = _Slot(n)
                    keys[n] = key
                    n += 1
                    self._admit(slot)
                    active.append(slot)
                    threads[slot.index] = threading.Thread(target=self._worker, args=(slot, req), daemon=True,
                                                           name=f"repro-batch-{slot.index}")
                    threads[slot.index].start()
                if not active:
                    return
                with self.cond:
                    self.cond.wait_for(lambda: all(s.state != "running" for s in active))
                done = [s for s in active if s.state == "done"]
                if done:
                    for s in done:
                        threads.pop(s.index).join()
                        active.remove(s)
                        self._release(s)
                        finished(keys.pop(s.index), s.result, s.wall_s, s.error)
                    continue  # admit waiting requests first: they join this round
                t0 = time.perf_counter()
                outs = self._round(active, stats)
                stats.round_s.append(time.perf_counter() - t0)
                stats.rounds += 1
                stats.max_active = max(stats.max_active, len(active))
                with self.cond:
                    for s, o in zip(active, outs):
                        if o is CONTINUE:  # the slot's pending job runs on in the next round, its thread asleep
                            continue
                        s.output, s.pending, s.state = o, None, "running"
                        s.event.set()
        finally:
            if threads:  # an error: release every waiting worker, then wait for them
                with self.cond:
                    self.abort = True
                for s in active:
                    s.event.set()
                for t in threads.values():
                    t.join()


def generate_batch(model: LLaDA2Model, requests: list[BatchRequest], *, mask_id: int, eos_id: int,
                   batch_size: int = 8, on_result=None, stats: BatchStats | None = None
                   ) -> list[tuple[GenerationResult, float]]:
    """Decode ``requests`` with up to ``batch_size`` active at once (module docstring); returns, in input
    order, ``(GenerationResult, wall_s)`` per request. ``on_result(index, result, wall_s)``, if given, is
    called on the calling thread as each request finishes (in finishing order: write records as they come).
    ``stats``: a :class:`BatchStats` to fill. Raises ValueError for ``batch_size < 1``; the first error of
    any request (as :func:`~repro.engine.decode_loop.generate_ids` raises it) after stopping the others.
    """
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer ≥ 1, got {batch_size!r}")
    stats = stats if stats is not None else BatchStats()
    t0 = time.perf_counter()
    out = _Scheduler(model, mask_id, eos_id).run(list(requests), batch_size, stats, on_result)
    stats.wall_s = time.perf_counter() - t0
    return out
