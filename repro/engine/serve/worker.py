"""The server's side of the engine loop: admission from a bounded queue, streaming of each request's committed
blocks to its handler, cancellation and shutdown.

Contract
--------
* :class:`EngineWorker` owns one scheduler of the LLM's engine loop (:meth:`repro.engine.llm.LLM.scheduler`,
  the public factory: ``max_batch`` slots; on the LLM's CUDA-graph path with a greedy default decoder the
  batched graph engine of :mod:`repro.engine.batch_graph`, captured when the worker starts, else the eager
  batched forward of :mod:`repro.engine.batch`; under tensor parallelism every rank runs it in step). The
  worker has no thread of its own: the loop's thread runs every request, the server's and any other caller's
  of the same LLM. Each request's tokens equal the same request alone on that engine (batch invariance).
* :meth:`EngineWorker.submit` admits a :class:`Job` or raises :class:`QueueFull` when ``max_queue`` jobs already
  wait **beyond the free slots**: a waiting job takes a free slot at the loop's next iteration, so a burst is
  never refused while a slot is free (``max_batch + max_queue`` requests are held at most).
* A request whose prompt plus budget needs more than ``slot_positions`` positions is refused before it starts
  (HTTP 400, on every engine: the limit bounds the KV cache a request may take; ``/health`` and ``/v1/models``
  say it). A request that fails in the engine (its allocation, its forward) fails alone.
* Events reach the job's handler on its asyncio loop (``loop.call_soon_threadsafe`` into ``job.events``):
  ``("block", text, n_tokens)`` once per committed block (``n_tokens``: its generated ids before the first
  EOS; ``text``: the new completion text, possibly "" while an incomplete UTF-8 character or a possible
  stop-string prefix is held back), then exactly one of
  ``("done", result_dict)`` (:func:`result_dict`; its ``tail`` is the held-back end of the text) or
  ``("error", message)``.
* :meth:`Job.cancel` (the client went away): a waiting job is answered and its queue place freed at once (the
  engine loop drops it); a running one stops after its current block and frees its slot (the ``on_block`` hook
  answers True); either way the handler gets ``("done", ...)`` with ``finish_reason`` ``"cancelled"``.
* :meth:`EngineWorker.abort` (shutdown past the grace period): every remaining job gets ``("error", reason)``
  and its request is cancelled in the engine loop (it ends at the next round); :meth:`EngineWorker.close` does
  that and retires the scheduler.
* Text: the completion is cut before the first ``<|endoftext|>`` (as :class:`~repro.engine.llm.GenerateOutput`
  does) and before the first occurrence of any stop string (then ``finish_reason`` is ``"stop"`` and decoding
  ends after that block). The streamed pieces always concatenate to the final ``text``.
* Log: one line when a request starts (queue wait, prompt tokens, budget), a progress line every
  ``progress_s`` seconds of a long request, one line when it ends (tokens, forwards, TPF, seconds, tokens/s,
  finish reason) — logger ``repro.serve``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

log = logging.getLogger("repro.serve")


class QueueFull(RuntimeError):
    """The bounded request queue is full (answered with HTTP 503)."""


class TextStream:
    """Incremental completion text of a growing id list: what may be sent now, and where a stop string cuts.

    ``decode``: ``ids -> str`` (the checkpoint tokenizer, special tokens skipped); ``eos_id``: ids from the
    first EOS on are dropped; ``stop``: stop strings (the text is cut before the first occurrence of any).
    Text already returned by :meth:`push` is never taken back: a trailing U+FFFD (an incomplete UTF-8
    character at a block edge) and a tail that could begin a stop string are held back until settled.
    """

    def __init__(self, decode, eos_id: int, stop: list[str] | None = None):
        self.decode, self.eos_id = decode, eos_id
        self.stop = [s for s in (stop or []) if s]
        self.ids: list[int] = []
        self.sent = ""
        self.eos = False
        self.stopped = False

    def push(self, ids: list[int]) -> str:
        """Add one block's generated ids; return the text that may be sent now ("" if nothing settled)."""
        if self.eos or self.stopped:
            return ""
        if self.eos_id in ids:
            ids = ids[: ids.index(self.eos_id)]
            self.eos = True
        self.ids.extend(ids)
        return self._advance(final=self.eos)

    def finish(self) -> str:
        """The rest of the text once no more ids will come (held-back characters included)."""
        return self._advance(final=True)

    @property
    def text(self) -> str:
        """Everything sent so far (the final text after :meth:`finish`)."""
        return self.sent

    def _advance(self, final: bool) -> str:
        full = self.decode(self.ids)
        if not full.startswith(self.sent):  # not prefix-stable (never seen with byte-level BPE): keep what was sent
            log.warning("detokenisation changed text already streamed; continuing after it")
            full = self.sent + full[len(self.sent):]
        settled = len(full)
        if not final:  # a trailing U+FFFD may be a character whose bytes the next block completes
            while settled > len(self.sent) and full[settled - 1] == "\ufffd":
                settled -= 1
        cut = self._stop_at(full[:settled])
        if cut is not None:
            self.stopped = True
            end = cut
        else:
            end = settled if final else settled - self._stop_prefix_len(full[:settled])
        new = full[len(self.sent):max(end, len(self.sent))]
        self.sent += new
        return new

    def _stop_at(self, full: str) -> int | None:
        start = max(0, len(self.sent) - max((len(s) for s in self.stop), default=0))
        hits = [i for i in (full.find(s, start) for s in self.stop) if i >= 0]
        return min(hits) if hits else None

    def _stop_prefix_len(self, text: str) -> int:
        """Length of the longest tail of ``text`` (after what was sent) that begins some stop string."""
        best = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(text) - len(self.sent)), best, -1):
                if s.startswith(text[len(text) - k:]):
                    best = k
                    break
        return best


@dataclass
class Job:
    """One admitted request. ``prompt``: chat-formatted prompt text (used as is); ``ids``: its token ids
    (``prompt_tokens`` of them); ``decoder``: :class:`~repro.engine.decoders.DecoderConfig`; ``max_new_tokens``;
    ``stop``: stop strings; ``events``: asyncio queue of the handler's loop (module docstring)."""

    id: str
    prompt: str
    prompt_tokens: int
    decoder: object
    max_new_tokens: int
    loop: asyncio.AbstractEventLoop
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    endpoint: str = ""
    ids: list[int] | None = None
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    created: float = field(default_factory=time.perf_counter)
    cancelled: threading.Event = field(default_factory=threading.Event)
    queue_s: float = 0.0

    worker: "EngineWorker | None" = None
    request: object = None  # its repro.engine.loop.Request once submitted
    state: str = "new"  # new | waiting | running | dropped | ended (guarded by the worker's lock)
    answered: bool = False  # its final event was sent (shutdown answers before the engine ends it)
    stream: "TextStream | None" = None  # the completion text so far
    blocks: int = 0  # committed blocks streamed
    tokens: int = 0  # their generated ids before the first EOS

    __hash__ = object.__hash__  # jobs are kept in the worker's set of running jobs (by identity)

    def cancel(self) -> None:
        """Ask the worker to drop (waiting: its queue place is freed at once) or stop (running) this job; safe
        from any thread."""
        self.cancelled.set()
        if self.worker is not None:
            self.worker._cancel(self)

    def emit(self, *event) -> None:
        """Deliver an event to the handler's loop (ignored if that loop is gone)."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # loop closed: the server is shutting down
            pass


def result_dict(job: Job, out, text: str, finish: str, blocks: int, tail: str = "") -> dict:
    """The ``done`` payload: ``text`` (the whole completion), ``tail`` (its end not yet sent in a block event),
    ``finish_reason`` (``"eos"`` | ``"length"`` | ``"stop"`` | ``"cancelled"``),
    ``blocks`` (committed blocks streamed) and ``usage`` = ``{prompt_tokens, generated_tokens, forwards, tpf,
    wall_s, tokens_per_s, queue_s}`` (counts and TPF as :class:`~repro.engine.llm.GenerateOutput`; ``wall_s``
    the engine's decode time in seconds; ``queue_s`` seconds waited before decoding began)."""
    usage = {"prompt_tokens": job.prompt_tokens,
             "generated_tokens": out.generated_tokens if out else 0,
             "forwards": dict(out.forwards) if out else {"prefill": 0, "denoise": 0, "commit": 0},
             "tpf": out.tpf if out else None,
             "wall_s": round(out.wall_s, 6) if out else 0.0,
             "tokens_per_s": round(out.request_tps, 3) if out else 0.0,
             "queue_s": round(job.queue_s, 6)}
    return {"id": job.id, "text": text, "tail": tail, "finish_reason": finish, "blocks": blocks, "usage": usage}


class EngineWorker:
    """Runs admitted :class:`Job`\\ s on a scheduler of ``llm``'s engine loop (module docstring).

    ``max_queue``: jobs allowed to wait beyond the free slots (≥ 1); ``max_batch``: slots, the most requests
    decoded together (≥ 1); ``slot_positions``: positions (prompt + completion, rounded up to whole blocks) one
    request may use, on every engine (None: the model's context); ``progress_s``: seconds between progress log
    lines of one request; ``block_hook(job, ids)``: called on the engine loop's thread after each committed
    block was handed to its client (tests pace requests or simulate a device fault with it; an exception it
    raises fails that request only — on one rank). Counters in :meth:`stats`. Raises ValueError for a bad
    ``max_queue`` / ``max_batch`` / ``slot_positions``.
    """

    def __init__(self, llm, max_queue: int = 64, progress_s: float = 10.0, max_batch: int = 8,
                 slot_positions: int | None = None, block_hook=None):
        if max_queue < 1:
            raise ValueError(f"max_queue must be ≥ 1, got {max_queue}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be ≥ 1, got {max_batch}")
        context = int(llm.config.max_position_embeddings)
        if slot_positions is not None and not 1 <= slot_positions <= context:
            raise ValueError(f"slot_positions must be in [1, {context}] (the model's context), got {slot_positions}")
        self.llm, self.max_queue, self.progress_s, self.max_batch = llm, max_queue, progress_s, max_batch
        self.block_hook = block_hook
        B = llm.default_decoder().block_size
        #: positions one request may use (whole blocks): the KV cache a request may take, on every engine
        self.slot_positions = min(context, -(-(slot_positions or context) // B) * B)
        t0 = time.perf_counter()
        self.scheduler = llm.scheduler(max_batch, self.slot_positions)
        self.engine = "cuda-graph" if self.scheduler.kind == "cuda-graph" else "eager"
        if self.engine == "cuda-graph":
            log.info("batched CUDA-graph engine: %d slots of %d positions, captured in %.1f s", max_batch,
                     self.scheduler.executor.engine.max_len, time.perf_counter() - t0)
        self._lock = threading.Lock()
        self._waiting = 0
        self._running: set[Job] = set()
        self._jobs: set[Job] = set()  # every job not yet ended (waiting or running)
        self._closing = False
        self.counts = {"served": 0, "cancelled": 0, "failed": 0, "rejected": 0}

    @property
    def running(self) -> Job | None:
        """One running job (None when none runs)."""
        with self._lock:
            return next(iter(self._running), None)

    def stats(self) -> dict:
        """``{"waiting", "running" (requests decoding now), "max_queue", "max_batch", "engine",
        "max_request_positions", "served", "cancelled", "failed", "rejected"}``."""
        with self._lock:
            return {"waiting": self._waiting, "running": len(self._running), "max_queue": self.max_queue,
                    "max_batch": self.max_batch, "engine": f"batched {self.engine}",
                    "max_request_positions": self.slot_positions, **self.counts}

    def submit(self, job: Job) -> None:
        """Queue ``job``; raises :class:`QueueFull` when ``max_queue`` jobs already wait beyond the free slots
        (or the server is shutting down)."""
        from repro.engine.loop import Request

        ids = job.ids if job.ids is not None else self.llm.tokenizer_.encode(job.prompt)
        with self._lock:
            free = max(0, self.max_batch - len(self._running))
            if self._closing or self._waiting >= self.max_queue + free:
                self.counts["rejected"] += 1
                why = "the server is shutting down" if self._closing else (
                    f"{self._waiting} requests already wait for {free} free slot(s) (--max-queue {self.max_queue}, "
                    f"--max-batch {self.max_batch})")
                raise QueueFull(why)
            self._waiting += 1
            self._jobs.add(job)
            job.worker, job.state = self, "waiting"
            job.stream = TextStream(self.llm.tokenizer_.decode, self.llm.eos_id, job.stop)
            job.request = Request(ids, job.decoder, job.max_new_tokens, job.seed, on_block=self._hook(job),
                                  on_start=lambda r: self._started(job), on_done=lambda r: self._done(job, r))
        self.scheduler.submit(job.request)

    def _cancel(self, job: Job) -> None:
        """The job's client went away: a waiting job is answered now (its queue place freed) and the engine loop
        drops it; a running one stops after its current block (its ``on_block`` answers True)."""
        with self._lock:
            dropped = job.state == "waiting"
            if dropped:
                job.state = "dropped"
                self._waiting -= 1
                self._jobs.discard(job)
                self.counts["cancelled"] += 1
        if dropped:
            job.request.cancel()
            job.queue_s = time.perf_counter() - job.created
            log.info("%s dropped before it started: client disconnected (waited %.2f s)", job.id, job.queue_s)
            self._answer(job, ("done", result_dict(job, None, "", "cancelled", 0)))

    def abort(self, reason: str) -> int:
        """Shutdown: every remaining job gets ``("error", reason)`` now and is cancelled in the engine; no new
        job is admitted. Returns how many were answered."""
        with self._lock:
            self._closing = True
            jobs = list(self._jobs)
        for job in jobs:
            self._answer(job, ("error", reason))
            job.cancel()
            job.request.cancel()  # a running one too: it ends at the next round, not at its next block
        if jobs:
            log.warning("shutdown: %d request(s) still open; each gets an error event and is cancelled", len(jobs))
        return len(jobs)

    def close(self) -> None:
        """Stop: answer and cancel what remains (:meth:`abort`), retire the scheduler. Quick (no join)."""
        self.abort("the server shut down before this request finished")
        self.scheduler.retire()

    # ------------------------------------------------------------------ called on the engine loop's thread
    def _started(self, job: Job) -> None:
        """The job's request took a slot."""
        with self._lock:
            if job.state != "waiting":  # dropped while it waited: the loop ends it at once
                return
            self._waiting -= 1
            job.state = "running"
            self._running.add(job)
        job.queue_s = time.perf_counter() - job.created
        log.info("%s start %s: prompt %d tokens, max_new_tokens %d, waited %.2f s, %d waiting, %d running",
                 job.id, job.endpoint, job.prompt_tokens, job.max_new_tokens, job.queue_s, self._waiting,
                 len(self._running))

    def _hook(self, job: Job):
        """The request's ``on_block``: stream the block's settled text; True (stop) on a stop string or cancel."""
        job.blocks, job.tokens, last_log = 0, 0, [time.perf_counter()]

        def on_block(ids: list[int]) -> bool:
            stream = job.stream
            job.blocks += 1
            kept = len(stream.ids)
            text = stream.push(ids)
            kept = len(stream.ids) - kept  # the block's ids before the first EOS
            job.tokens += kept
            if not job.answered:
                job.emit("block", text, kept)
            now = time.perf_counter()
            if now - last_log[0] >= self.progress_s:
                last_log[0] = now
                log.info("%s progress: %d blocks, %d tokens", job.id, job.blocks, job.tokens)
            if self.block_hook is not None:
                self.block_hook(job, ids)
            return stream.stopped or job.cancelled.is_set()

        return on_block

    def _answer(self, job: Job, ev: tuple) -> None:
        """Send ``job``'s final event once."""
        with self._lock:
            if job.answered:
                return
            job.answered = True
        job.emit(*ev)

    def _done(self, job: Job, req) -> None:
        """The job's request ended (the loop's ``on_done``): count it, free its place, answer it."""
        with self._lock:
            if job.state in ("dropped", "ended"):  # answered and counted when its client left while it waited
                return
            was = job.state
            self._running.discard(job)
            if was == "waiting":
                self._waiting -= 1
            job.state = "ended"
            self._jobs.discard(job)
            kind = "failed" if req.error is not None else (
                "cancelled" if job.cancelled.is_set() or req.result.finish_reason == "cancelled" else "served")
            self.counts[kind] += 1
        if req.error is not None:
            err = req.error
            log.error("%s failed in the engine: %s: %s", job.id, type(err).__name__, err,
                      exc_info=(type(err), err, err.__traceback__))
            return self._answer(job, ("error", f"engine error: {type(err).__name__}: {err}"))
        res, wall_s = req.result, req.wall_s
        stream = job.stream
        tail = stream.finish()
        out = SimpleNamespace(generated_tokens=res.generated_tokens, forwards=res.forwards, tpf=res.tpf,
                              wall_s=wall_s, request_tps=res.generated_tokens / wall_s if wall_s > 0 else 0.0)
        finish = res.finish_reason
        if job.cancelled.is_set() or finish == "cancelled":  # the client went away, or the server shut down
            finish = "cancelled"
        elif stream.stopped:
            finish = "stop"
        r = result_dict(job, out, stream.text, finish, job.blocks, tail)
        u = r["usage"]
        log.info("%s done: %d tokens, forwards %s (prefill/denoise/commit), TPF %s, %.3f s, %.1f tokens/s, "
                 "finish %s; %d waiting", job.id, u["generated_tokens"],
                 "/".join(str(v) for v in u["forwards"].values()), "-" if u["tpf"] is None else f"{u['tpf']:.2f}",
                 u["wall_s"], u["tokens_per_s"], finish, self._waiting)
        self._answer(job, ("done", r))
