"""The server's engine worker: one thread runs requests in the continuous-batching engine, admitted in arrival
order from a bounded queue, and streams each request's committed blocks back to its handler.

Contract
--------
* :meth:`EngineWorker.submit` admits a :class:`Job` or raises :class:`QueueFull` when ``max_queue`` jobs
  already wait for a slot (running jobs are not counted).
* Every request, at every concurrency (1 included), decodes in the continuous-batching engine: one engine
  thread runs :meth:`repro.engine.batch._Scheduler.serve`, which takes waiting jobs in arrival order whenever
  one of its ``max_batch`` slots is free, and runs one forward per round over all running requests — on the
  LLM's CUDA-graph path with a greedy default decoder (32-token blocks) the batched graph engine
  (:mod:`repro.engine.batch_graph`, ``max_batch`` slots of ``slot_positions`` positions, captured when the
  worker starts), otherwise the eager batched forward (:mod:`repro.engine.batch`). Each request's tokens
  equal the same request alone on that engine (batch invariance, :mod:`repro.engine.batch`; on the CPU also
  equal to :meth:`~repro.engine.llm.LLM.generate`). The scheduler still drives one thread per request
  (``generate_ids`` unchanged); an error of one request fails that request only, an error of a round fails
  the requests of that round and the worker starts a fresh scheduler.
* Events reach the job's handler on its asyncio loop (``loop.call_soon_threadsafe`` into ``job.events``):
  ``("block", text, n_tokens)`` once per committed block (``n_tokens``: its generated ids before the first
  EOS; ``text``: the new completion text, possibly "" while an incomplete UTF-8 character or a possible
  stop-string prefix is held back), then exactly one of
  ``("done", result_dict)`` (:func:`result_dict`; its ``tail`` is the held-back end of the text) or
  ``("error", message)``.
* :meth:`Job.cancel` (the client went away): a waiting job is answered and its queue place freed at once (it is
  skipped when it reaches the front), a running one stops after its current block and frees its slot (the
  ``on_block`` hook of :func:`repro.engine.decode_loop.generate_ids` returns True); either way the handler gets ``("done", ...)`` with ``finish_reason`` ``"cancelled"``.
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
import queue
import threading
import time
from collections import deque
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
    """One admitted request. ``prompt``: chat-formatted prompt text (used as is); ``prompt_tokens``: its length
    in tokens; ``decoder``: :class:`~repro.engine.decoders.DecoderConfig`; ``max_new_tokens``; ``stop``:
    stop strings; ``events``: asyncio queue of the handler's loop (module docstring)."""

    id: str
    prompt: str
    prompt_tokens: int
    decoder: object
    max_new_tokens: int
    loop: asyncio.AbstractEventLoop
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    endpoint: str = ""
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    created: float = field(default_factory=time.perf_counter)
    cancelled: threading.Event = field(default_factory=threading.Event)
    queue_s: float = 0.0

    worker: "EngineWorker | None" = None
    state: str = "new"  # new | waiting | running | dropped (guarded by the worker's lock)
    stream: "TextStream | None" = None  # the completion text so far (set when the job joins the batch)
    blocks: int = 0  # committed blocks streamed
    tokens: int = 0  # their generated ids before the first EOS

    __hash__ = object.__hash__  # jobs are kept in the worker's set of running jobs (by identity)

    def cancel(self) -> None:
        """Ask the worker to drop (waiting: its queue place is freed at once) or stop (running) this job; safe
        from any thread."""
        self.cancelled.set()
        if self.worker is not None:
            self.worker._drop_waiting(self)

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
    """Runs admitted :class:`Job`\\ s on ``llm``'s continuous-batching engine from one daemon thread (module
    docstring).

    ``max_queue``: jobs allowed to wait (≥ 1); ``max_batch``: slots, the most requests decoded together (≥ 1);
    ``slot_positions``: positions (prompt + completion, rounded up to whole blocks) of one slot of the batched
    CUDA-graph engine (None: the model's context; unused on the eager engine, where each request allocates its
    own cache); ``progress_s``: seconds between progress log lines of one request; ``block_hook(job, ids)``:
    called in the request's thread after each committed block was handed to its client (tests pace requests
    or simulate a device fault with it; an exception it raises fails that request only). Counters in
    :meth:`stats`. Raises ValueError for a bad ``max_queue`` / ``max_batch`` / ``slot_positions``.
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
        self.engine = self._engine_kind()
        # positions one request may use: a graph slot's (whole blocks), else the context
        self.slot_positions = context
        if self.engine == "cuda-graph":
            B = llm.default_decoder().block_size
            self.slot_positions = min(context, -(-(slot_positions or context) // B) * B)
        self._q: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._waiting = 0
        self._running: set[Job] = set()
        self._closing = False
        self.counts = {"served": 0, "cancelled": 0, "failed": 0, "rejected": 0}
        self._thread = threading.Thread(target=self._run, name="repro-engine", daemon=True)
        self._thread.start()

    @property
    def running(self) -> Job | None:
        """One running job (None when none runs)."""
        with self._lock:
            return next(iter(self._running), None)

    def _engine_kind(self) -> str:
        """``"cuda-graph"`` (:mod:`repro.engine.batch_graph`: the LLM runs CUDA graphs and its default decoder
        is greedy with 32-token blocks) or ``"eager"`` (:mod:`repro.engine.batch`)."""
        from repro.engine.decoders.device import supported

        cfg = self.llm.default_decoder()
        ok = self.llm.engine_path == "cuda-graph" and supported(cfg) and cfg.block_size == 32
        return "cuda-graph" if ok else "eager"

    def stats(self) -> dict:
        """``{"waiting", "running" (requests decoding now), "max_queue", "max_batch", "engine", "served",
        "cancelled", "failed", "rejected"}``."""
        with self._lock:
            return {"waiting": self._waiting, "running": len(self._running), "max_queue": self.max_queue,
                    "max_batch": self.max_batch, "engine": f"batched {self.engine}", **self.counts}

    def submit(self, job: Job) -> None:
        """Queue ``job``; raises :class:`QueueFull` when ``max_queue`` jobs already wait."""
        with self._lock:
            if self._waiting >= self.max_queue:
                self.counts["rejected"] += 1
                raise QueueFull(f"{self._waiting} requests already wait (--max-queue {self.max_queue})")
            self._waiting += 1
            job.worker, job.state = self, "waiting"
        self._q.put(job)

    def _drop_waiting(self, job: Job) -> None:
        """A waiting job was cancelled: free its queue place now (it is skipped when it reaches the front) and
        answer it (its handler, if still there, ends at once)."""
        with self._lock:
            if job.state != "waiting":
                return
            job.state = "dropped"
            self._waiting -= 1
            self.counts["cancelled"] += 1
        job.queue_s = time.perf_counter() - job.created
        log.info("%s dropped before it started: client disconnected (waited %.2f s)", job.id, job.queue_s)
        job.emit("done", result_dict(job, None, "", "cancelled", 0))

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread once the queue is drained and the running requests ended (jobs whose clients are
        gone are dropped at once); waits at most ``timeout`` seconds (the thread is a daemon)."""
        self._q.put(None)
        self._thread.join(timeout)

    # ------------------------------------------------------------------ the engine thread
    def _scheduler(self):
        """A fresh round scheduler over the batched engine (built once per worker on the graph path)."""
        from repro.engine.batch import _Scheduler

        llm = self.llm
        if self.engine == "cuda-graph":
            from repro.engine.batch_graph import BatchGraphEngine, _GraphScheduler

            if getattr(self, "_graph", None) is None:
                t0 = time.perf_counter()
                max_len = -(-self.slot_positions // 1024) * 1024
                self._graph = BatchGraphEngine(llm.model, llm.mask_id, llm.default_decoder(), self.max_batch, max_len)
                self._graph.capture()
                log.info("batched CUDA-graph engine: %d slots of %d positions, captured in %.1f s", self.max_batch,
                         max_len, time.perf_counter() - t0)
            return _GraphScheduler(llm.model, llm.mask_id, llm.eos_id, self._graph)
        return _Scheduler(llm.model, llm.mask_id, llm.eos_id)

    def _run(self) -> None:
        import torch

        from repro.engine.batch import BatchStats

        dev = getattr(getattr(self.llm, "model", None), "device", None)
        if dev is not None and dev.type == "cuda" and dev.index is not None:
            torch.cuda.set_device(dev.index)  # the current CUDA device is per thread (Triton launches on it)
        while not self._closing:
            stats = BatchStats()  # a server runs for days: keep only the last rounds' times
            stats.round_s, stats.round_prefill = deque(maxlen=4096), deque(maxlen=4096)
            try:
                with torch.inference_mode():
                    sched = self._scheduler()
            except Exception:  # noqa: BLE001 - e.g. no memory for the graph engine's slots: serve eagerly
                log.exception("cannot build the batched CUDA-graph engine; serving on the eager batched engine")
                self.engine, self._graph = "eager", None
                continue
            try:
                with torch.inference_mode():
                    sched.serve(self._take, self.max_batch, stats, self._finished)
            except Exception as e:  # noqa: BLE001 - a round failed: its requests fail, the server keeps serving
                log.exception("the batched engine failed; failing its %d running requests", len(self._running))
                with self._lock:
                    jobs, self._running = list(self._running), set()
                    self.counts["failed"] += len(jobs)
                for job in jobs:
                    job.emit("error", f"engine error: {type(e).__name__}: {e}")

    def _take(self, idle: bool):
        """The scheduler's source (:meth:`repro.engine.batch._Scheduler.serve`): the next job to admit as
        ``(job, BatchRequest)``; blocks while ``idle``; None when none waits, or (idle) at shutdown."""
        from repro.engine.batch import BatchRequest

        while not self._closing:
            if idle:
                job = self._q.get()
            else:
                try:
                    job = self._q.get_nowait()
                except queue.Empty:
                    return None
            if job is None:
                self._closing = True
                break
            with self._lock:
                if job.state == "dropped":  # cancelled while waiting: already answered and counted
                    continue
                self._waiting -= 1
                job.state = "running"
                self._running.add(job)
            job.queue_s = time.perf_counter() - job.created
            if job.cancelled.is_set():
                log.info("%s dropped before it started: client disconnected (waited %.2f s)", job.id, job.queue_s)
                self._end(job, ("done", result_dict(job, None, "", "cancelled", 0)))
                continue
            try:
                ids = self.llm.tokenizer_.encode(job.prompt)
            except Exception as e:  # noqa: BLE001 - answered as a 500, the server keeps serving
                log.exception("%s failed before decoding", job.id)
                self._end(job, ("error", f"engine error: {type(e).__name__}: {e}"))
                continue
            log.info("%s start %s: prompt %d tokens, max_new_tokens %d, waited %.2f s, %d waiting, %d running",
                     job.id, job.endpoint, job.prompt_tokens, job.max_new_tokens, job.queue_s, self._waiting,
                     len(self._running))
            return job, BatchRequest(ids, job.decoder, job.max_new_tokens, job.seed, on_block=self._hook(job))
        return None

    def _hook(self, job: Job):
        """The request's ``on_block``: stream the block's settled text; True (stop) on a stop string or cancel."""
        job.stream = TextStream(self.llm.tokenizer_.decode, self.llm.eos_id, job.stop)
        job.blocks, job.tokens, last_log = 0, 0, [time.perf_counter()]

        def on_block(ids: list[int]) -> bool:
            stream = job.stream
            job.blocks += 1
            kept = len(stream.ids)
            text = stream.push(ids)
            kept = len(stream.ids) - kept  # the block's ids before the first EOS
            job.tokens += kept
            job.emit("block", text, kept)
            now = time.perf_counter()
            if now - last_log[0] >= self.progress_s:
                last_log[0] = now
                log.info("%s progress: %d blocks, %d tokens", job.id, job.blocks, job.tokens)
            if self.block_hook is not None:
                self.block_hook(job, ids)
            return stream.stopped or job.cancelled.is_set()

        return on_block

    def _end(self, job: Job, ev: tuple) -> None:
        """Count ``job``'s outcome and free its place (before the client hears it), then answer it."""
        with self._lock:
            self._running.discard(job)
            kind = "failed" if ev[0] == "error" else (
                "cancelled" if ev[1]["finish_reason"] == "cancelled" else "served")
            self.counts[kind] += 1
        job.emit(*ev)

    def _finished(self, job: Job, res, wall_s: float, error) -> None:
        """A request left the batch (the scheduler's ``finished``): answer it (module docstring)."""
        if error is not None:
            log.error("%s failed in the engine", job.id, exc_info=error)
            return self._end(job, ("error", f"engine error: {type(error).__name__}: {error}"))
        stream = job.stream
        tail = stream.finish()
        out = SimpleNamespace(generated_tokens=res.generated_tokens, forwards=res.forwards, tpf=res.tpf,
                              wall_s=wall_s, request_tps=res.generated_tokens / wall_s if wall_s > 0 else 0.0)
        finish = res.finish_reason
        if job.cancelled.is_set():  # the client went away (the engine stopped after that block, or just ended)
            finish = "cancelled"
        elif stream.stopped:
            finish = "stop"
        r = result_dict(job, out, stream.text, finish, job.blocks, tail)
        u = r["usage"]
        log.info("%s done: %d tokens, forwards %s (prefill/denoise/commit), TPF %s, %.3f s, %.1f tokens/s, "
                 "finish %s; %d waiting", job.id, u["generated_tokens"],
                 "/".join(str(v) for v in u["forwards"].values()), "-" if u["tpf"] is None else f"{u['tpf']:.2f}",
                 u["wall_s"], u["tokens_per_s"], finish, self._waiting)
        self._end(job, ("done", r))
