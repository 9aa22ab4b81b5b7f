"""The server's engine worker: one thread runs requests through :meth:`repro.engine.llm.LLM.generate`, one at a
time in arrival order, from a bounded queue, and streams each request's committed blocks back to its handler.

Contract
--------
* :meth:`EngineWorker.submit` admits a :class:`Job` or raises :class:`QueueFull` when ``max_queue`` jobs
  already wait (the running job is not counted). Requests run one after another through
  :meth:`~repro.engine.llm.LLM.generate` (the CUDA-graph path on a GPU); each keeps its own stream. The batched
  engine (:mod:`repro.engine.batch`) decodes a fixed list of prompts on the eager path and takes no requests
  while it runs, so the server does not use it yet.
* Events reach the job's handler on its asyncio loop (``loop.call_soon_threadsafe`` into ``job.events``):
  ``("block", text, n_tokens)`` once per committed block (``n_tokens``: its generated ids before the first
  EOS; ``text``: the new completion text, possibly "" while an incomplete UTF-8 character or a possible
  stop-string prefix is held back), then exactly one of
  ``("done", result_dict)`` (:func:`result_dict`; its ``tail`` is the held-back end of the text) or
  ``("error", message)``.
* :meth:`Job.cancel` (the client went away): a waiting job is answered and its queue place freed at once (it is
  skipped when it reaches the front), a running one
  stops after its current block (the ``on_block`` hook of :func:`repro.engine.decode_loop.generate_ids` returns
  True); either way the handler gets ``("done", ...)`` with ``finish_reason`` ``"cancelled"``.
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
from dataclasses import dataclass, field

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
    """Runs admitted :class:`Job`\\ s on ``llm`` in one daemon thread (module docstring).

    ``max_queue``: jobs allowed to wait (≥ 1); ``progress_s``: seconds between progress log lines of one
    request. Counters in :meth:`stats`.
    """

    def __init__(self, llm, max_queue: int = 64, progress_s: float = 10.0):
        if max_queue < 1:
            raise ValueError(f"max_queue must be ≥ 1, got {max_queue}")
        self.llm, self.max_queue, self.progress_s = llm, max_queue, progress_s
        self._q: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._waiting = 0
        self.running: Job | None = None
        self.counts = {"served": 0, "cancelled": 0, "failed": 0, "rejected": 0}
        self._thread = threading.Thread(target=self._run, name="repro-engine", daemon=True)
        self._thread.start()

    def stats(self) -> dict:
        """``{"waiting", "running", "max_queue", "served", "cancelled", "failed", "rejected"}``."""
        with self._lock:
            return {"waiting": self._waiting, "running": self.running is not None, "max_queue": self.max_queue,
                    **self.counts}

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
        """Stop the thread once the queue is drained (jobs whose clients are gone are dropped at once); waits
        at most ``timeout`` seconds (the thread is a daemon)."""
        self._q.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        dev = getattr(getattr(self.llm, "model", None), "device", None)
        if dev is not None and dev.type == "cuda" and dev.index is not None:
            import torch  # the current CUDA device is per thread (Triton launches on it): make it the model's

            torch.cuda.set_device(dev.index)
        while True:
            job = self._q.get()
            if job is None:
                break
            with self._lock:
                if job.state == "dropped":  # cancelled while waiting: already answered and counted
                    continue
                self._waiting -= 1
                job.state = "running"
                self.running = job
            ev = ("error", "engine error: the worker failed (see the server log)")
            try:
                ev = self._execute(job)
            finally:
                with self._lock:  # counters and state are final before the client hears the outcome
                    self.running = None
                    kind = "failed" if ev[0] == "error" else (
                        "cancelled" if ev[1]["finish_reason"] == "cancelled" else "served")
                    self.counts[kind] += 1
                job.emit(*ev)

    def _execute(self, job: Job) -> tuple:
        """Run ``job``; return its final event (``("done", result)`` or ``("error", message)``)."""
        job.queue_s = time.perf_counter() - job.created
        if job.cancelled.is_set():
            log.info("%s dropped before it started: client disconnected (waited %.2f s)", job.id, job.queue_s)
            return ("done", result_dict(job, None, "", "cancelled", 0))
        llm = self.llm
        stream = TextStream(llm.tokenizer_.decode, llm.eos_id, job.stop)
        st = {"blocks": 0, "tokens": 0, "last_log": time.perf_counter()}
        log.info("%s start %s: prompt %d tokens, max_new_tokens %d, waited %.2f s, %d waiting", job.id,
                 job.endpoint, job.prompt_tokens, job.max_new_tokens, job.queue_s, self.stats()["waiting"])

        def on_block(ids: list[int]) -> bool:
            st["blocks"] += 1
            kept = len(stream.ids)
            text = stream.push(ids)
            kept = len(stream.ids) - kept  # the block's ids before the first EOS
            st["tokens"] += kept
            job.emit("block", text, kept)
            now = time.perf_counter()
            if now - st["last_log"] >= self.progress_s:
                st["last_log"] = now
                log.info("%s progress: %d blocks, %d tokens", job.id, st["blocks"], st["tokens"])
            return stream.stopped or job.cancelled.is_set()

        try:
            out = llm.generate(job.prompt, decoder=job.decoder, max_new_tokens=job.max_new_tokens, seed=job.seed,
                               on_block=on_block)
        except Exception as e:  # noqa: BLE001 - reported to the client as a 500, logged with its traceback here
            log.exception("%s failed in the engine", job.id)
            return ("error", f"engine error: {type(e).__name__}: {e}")
        tail = stream.finish()
        finish = out.finish_reason
        if job.cancelled.is_set():  # the client went away (the engine stopped after that block, or just ended)
            finish = "cancelled"
        elif stream.stopped:
            finish = "stop"
        res = result_dict(job, out, stream.text, finish, st["blocks"], tail)
        u = res["usage"]
        log.info("%s done: %d tokens, forwards %s (prefill/denoise/commit), TPF %s, %.3f s, %.1f tokens/s, "
                 "finish %s; %d waiting", job.id, u["generated_tokens"],
                 "/".join(str(v) for v in u["forwards"].values()), "-" if u["tpf"] is None else f"{u['tpf']:.2f}",
                 u["wall_s"], u["tokens_per_s"], finish, self._waiting)
        return ("done", res)
