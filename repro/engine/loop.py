"""The one engine loop: every request — single, batched, served, split over ranks — is advanced here.

Where things stand: :class:`EngineLoop` is the only place requests are decoded. ``LLM.generate``,
``LLM.generate_batch`` (and through it the pipeline's generation jobs and ``bench suite``), the server's worker
and the rank followers all submit :class:`Request`\\ s to a loop; the helpers ``generate_ids``,
``generate_batch`` and ``generate_batch_graph`` drive a private loop on the calling thread. Like SGLang's
scheduler event loop, each iteration is **receive → next batch → run → process**:

1. receive: take the requests submitted since the last iteration (thread-safe inbox) and the cancellations;
2. next batch: each :class:`Scheduler` (one executor and its slots) admits waiting requests into its free
   slots — at the next iteration, never later; a new request's program (:func:`repro.engine.request.decode`)
   starts and runs until its first op (its KV cache or slot is allocated there; a failure fails that request
   only);
3. run: each scheduler with active requests runs **one round**: its executor runs the pending op of every
   active request together (one batched forward, one CUDA-graph replay, or one backend call);
4. process: each request whose op completed is resumed with the result until its next op or its end.

A request is plain state (:class:`Request`: prompt, decoder, budget, hooks, its program and pending op); no
thread per request. An :class:`LLM <repro.engine.llm.LLM>` owns one loop on one thread (started on first use,
ended after ``idle_s`` seconds without work, started again on the next request), so one thread owns the model
and the GPU: graph capture and replays of every caller happen there, one after the other (a capture never
meets another thread's GPU work, which a CUDA graph capture forbids). Schedulers are visited in creation order;
a scheduler's requests in admission order.

Executors (duck-typed): ``model``, ``slots`` (None: unbounded), ``kind`` (``BatchStats.engine``),
``start(req, op)`` → the op's reply at once, or :data:`PENDING` (it runs in the next round);
``round(reqs)`` sets ``req.reply`` for each request (:data:`PENDING` to keep a multi-round op going, an
:class:`OpError` for that request's failure); ``rows(req)``; ``release(req)``. They live in
:mod:`repro.engine.batch` (eager batched forward), :mod:`repro.engine.batch_graph` (batched CUDA graph) and
:mod:`repro.engine.decode_loop` (one backend: the single-request graph path, the reference).

Errors: a request's own failure (bad prompt, allocation, its hook raising) ends that request; a round that
fails as a whole (a graph replay) fails the requests of that round. Under tensor parallelism (``sync``, rank 0:
:class:`repro.engine.ranks.RankSync`) each iteration's cancellations and admissions are broadcast before the
rounds, followers run :meth:`EngineLoop.follow` in step, and any failure after a request was shared closes the
group (every request fails with its error).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from repro.engine.request import Cancelled, GenerationResult, Prefill, decode

log = logging.getLogger("repro.engine")

PENDING = object()
"""An op (or a multi-round op) that is not done yet: it runs in the next round."""


class OpError:
    """A round's failure for one request only (``error``: the exception); the others go on."""

    def __init__(self, error: BaseException):
        self.error = error


@dataclass
class BatchStats:
    """What the rounds of a group of requests (one ``generate_batch`` call) did: ``rounds`` (rounds with at
    least one of its requests), ``rows`` (token rows over those rounds), ``max_active`` (most of its requests in
    one round), ``wall_s`` (seconds, whole call), ``round_s`` (seconds per round, list), ``admitted_at_round``
    (per request, the round it joined), ``engine`` (``"eager"``, ``"cuda-graph"``, ``"graph-path eager"`` or
    ``"single"``), ``capture_s`` (seconds spent capturing CUDA graphs for this call; 0 when reused or eager),
    ``round_prefill`` (per round, whether it ran a prompt-prefill op)."""

    rounds: int = 0
    rows: int = 0
    max_active: int = 0
    wall_s: float = 0.0
    round_s: list[float] = field(default_factory=list)
    admitted_at_round: list[int] = field(default_factory=list)
    engine: str = "eager"
    capture_s: float = 0.0
    round_prefill: list[bool] = field(default_factory=list)


def cancelled_result() -> GenerationResult:
    """The result of a request cancelled before it started."""
    return GenerationResult([], [], {"prefill": 0, "denoise": 0, "commit": 0}, "cancelled")


@dataclass(eq=False)
class Request:
    """One request's plain state. Inputs: ``prompt_ids`` (ints), ``decoder`` (DecoderConfig or dict),
    ``max_new_tokens`` / ``seed`` (overrides), ``on_block(ids) -> bool`` (streaming hook, called on the loop's
    thread), ``on_start(req)`` / ``on_done(req)`` (called on the loop's thread when it takes a slot / ends),
    ``stats`` + ``index`` (the group's :class:`BatchStats` and this request's place in it).
    Outputs: ``state`` (``new`` | ``waiting`` | ``running`` | ``done``), ``result``
    (:class:`~repro.engine.request.GenerationResult`), ``error``, ``wall_s`` (admission to end, seconds)."""

    prompt_ids: list[int]
    decoder: object
    max_new_tokens: int | None = None
    seed: int | None = None
    on_block: object = None
    on_start: object = None
    on_done: object = None
    stats: BatchStats | None = None
    index: int = 0
    id: int = -1
    state: str = "new"
    result: GenerationResult | None = None
    error: BaseException | None = None
    wall_s: float = 0.0
    cancelled: bool = False
    shared: bool = False  # announced to the other ranks (tensor parallelism): its failures are the group's
    scheduler: "Scheduler | None" = None
    gen: object = None
    op: object = None
    reply: object = PENDING
    t0: float = 0.0
    _event: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def done(self) -> bool:
        """True once the request ended (result or error)."""
        return self.state == "done"

    def cancel(self) -> None:
        """Stop this request (any thread): a waiting one leaves its queue, a running one ends at the next round
        with its committed blocks (finish ``"cancelled"``). No effect once done."""
        self.cancelled = True
        if self.scheduler is not None and not self.done:
            self.scheduler.loop.cancel(self)

    def wait(self, timeout: float | None = None) -> GenerationResult:
        """Block until done; returns the result or raises the request's error (TimeoutError past ``timeout``)."""
        if not self._event.wait(timeout):
            raise TimeoutError(f"request not done within {timeout} s")
        if self.error is not None:
            raise self.error
        return self.result


class Scheduler:
    """One executor (built on the loop's thread by ``build()`` on first use), its ``slots`` (None: as many as
    wait), the requests waiting for a slot and those decoding. Made by :meth:`EngineLoop.scheduler`; public
    factories: :meth:`repro.engine.llm.LLM.scheduler` (the server's) and the generate helpers."""

    def __init__(self, loop: "EngineLoop", build, slots: int | None, mask_id: int, eos_id: int, sid: int,
                 name: str = ""):
        self.loop, self._build, self.slots, self.mask_id, self.eos_id = loop, build, slots, mask_id, eos_id
        self.id, self.name = sid, name
        self.executor = None
        self.waiting: deque[Request] = deque()
        self.active: list[Request] = []
        self.retired = False
        self.spec = None  # what the owner built it for (LLM: batch size, decoder settings, positions)

    @property
    def kind(self) -> str | None:
        """The executor's kind (``"eager"``, ``"cuda-graph"``, ...), None before it is built."""
        return getattr(self.executor, "kind", None)

    def submit(self, req: Request) -> Request:
        """Queue ``req`` (any thread); returns it."""
        return self.loop.submit(self, req)

    def ready(self):
        """Build the executor now, on the loop's thread (CUDA graphs are captured there), and return it."""
        return self.loop.call(self._ensure)

    def retire(self) -> None:
        """Take no new requests; the loop drops this scheduler (and frees its executor) once it is empty."""
        with self.loop._cond:
            self.retired = True
            self.loop._cond.notify_all()

    def _ensure(self):
        if self.executor is None:
            self.executor = self._build()
        return self.executor


class _Call:
    """A function to run on the loop's thread, and its outcome."""

    def __init__(self, fn):
        self.fn, self.value, self.error, self.event = fn, None, None, threading.Event()

    def run(self) -> None:
        try:
            self.value = self.fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            self.error = e
        self.event.set()


class EngineLoop:
    """The loop (module docstring). ``threaded``: run on a thread of its own (an LLM's loop) instead of the
    caller's (:meth:`run`); ``device``: its CUDA device (set on that thread); ``sync``: rank 0's broadcaster
    under tensor parallelism; ``idle_s``: seconds the thread waits for work before it ends."""

    def __init__(self, threaded: bool = False, device=None, sync=None, idle_s: float = 5.0,
                 name: str = "repro-engine"):
        self.threaded, self.device, self.sync, self.idle_s, self.name = threaded, device, sync, idle_s, name
        self._cond = threading.Condition()
        self._inbox: list[Request] = []
        self._cancels: list[Request] = []
        self._calls: list[_Call] = []
        self._scheds: dict[int, Scheduler] = {}
        self._running: dict[int, Request] = {}
        self._next_sched = 0
        self._next_req = 0
        self._finished_now: list[Request] = []
        self._closed: BaseException | None = None
        self.thread: threading.Thread | None = None

    # ------------------------------------------------------------------ public, any thread
    def scheduler(self, build, slots: int | None, mask_id: int, eos_id: int, name: str = "") -> Scheduler:
        """A new :class:`Scheduler` over the executor ``build()`` returns (built on first use)."""
        with self._cond:
            s = Scheduler(self, build, slots, mask_id, eos_id, self._next_sched, name)
            self._scheds[s.id] = s
            self._next_sched += 1
        return s

    def submit(self, sched: Scheduler, req: Request) -> Request:
        """Queue ``req`` for ``sched``; it takes a free slot at the next iteration. A closed loop fails it at once."""
        req.scheduler = sched
        with self._cond:
            closed = self._closed
            if closed is None:
                req.id, self._next_req = self._next_req, self._next_req + 1
                req.state = "waiting"
                self._inbox.append(req)
                self._wake()
        if closed is not None:
            req.state, req.error = "done", closed
            req._event.set()
            if req.on_done is not None:
                req.on_done(req)
        return req

    def cancel(self, req: Request) -> None:
        """Cancel ``req`` at the next iteration (:meth:`Request.cancel`)."""
        with self._cond:
            self._cancels.append(req)
            self._wake()

    def call(self, fn):
        """Run ``fn()`` on the loop's thread between iterations and return its result (raise its error)."""
        if not self.threaded or threading.current_thread() is self.thread:
            return fn()
        c = _Call(fn)
        with self._cond:
            self._calls.append(c)
            self._wake()
        c.event.wait()
        if c.error is not None:
            raise c.error
        return c.value

    def close(self, error: BaseException | None = None) -> None:
        """Refuse new requests, fail the queued and running ones with ``error`` (default: "engine loop closed"),
        drop every scheduler; waits for the loop's thread (a few seconds at most)."""
        err = error or RuntimeError("the engine loop is closed")

        def shut():
            self._fail_everything(err)
            for s in list(self._scheds.values()):
                self._drop(s)

        with self._cond:
            if self._closed is not None:
                return
            self._closed = err
        try:
            self.call(shut) if self.thread is not None else shut()
        finally:
            t = self.thread
            if t is not None and t is not threading.current_thread():
                t.join(5.0)

    def run(self, until) -> None:
        """Drive the loop on this thread until ``until()`` is true (a non-threaded loop: the generate helpers).
        ``until`` may raise to stop early (its error propagates)."""
        with torch.inference_mode():
            while not until():
                if not self._iterate():
                    raise RuntimeError("the engine loop has nothing to run, but the requests are not done")

    # ------------------------------------------------------------------ the loop's thread
    def _wake(self) -> None:
        """(Lock held.) Notify the thread, starting it if it is not running."""
        self._cond.notify_all()
        if self.threaded and self.thread is None:
            self.thread = threading.Thread(target=self._main, name=self.name, daemon=True)
            self.thread.start()

    def _work(self) -> bool:
        """(Lock held.) Anything to do: submissions, cancellations, calls, waiting or running requests."""
        return bool(self._inbox or self._cancels or self._calls) or any(
            s.waiting or s.active or (s.retired and s.executor is not None) for s in self._scheds.values())

    def _main(self) -> None:
        dev = torch.device(self.device) if self.device is not None else None
        if dev is not None and dev.type == "cuda" and dev.index is not None:
            torch.cuda.set_device(dev)  # the current device is per thread (Triton launches on it)
        with torch.inference_mode():
            while True:
                with self._cond:
                    while not self._work():
                        if self._closed is not None or (not self._cond.wait(self.idle_s) and not self._work()):
                            self.thread = None
                            return
                try:
                    self._iterate()
                except BaseException as e:  # noqa: BLE001 - a fault of the loop itself: fail what it holds
                    log.exception("engine loop iteration failed")
                    self._fail_everything(e)

    # ------------------------------------------------------------------ one iteration
    def _ordered(self) -> list[Scheduler]:
        with self._cond:
            return [self._scheds[k] for k in sorted(self._scheds)]

    def _iterate(self) -> bool:
        """receive → next batch → run → process (module docstring); False when there was nothing to do."""
        with self._cond:
            inbox, cancels, calls = self._inbox, self._cancels, self._calls
            self._inbox, self._cancels, self._calls = [], [], []
        for c in calls:
            c.run()
        for req in inbox:
            req.scheduler.waiting.append(req)
        self._finished_now = []
        stopping: list[Request] = []
        for req in cancels:
            if req.state == "waiting" and req in req.scheduler.waiting:
                req.scheduler.waiting.remove(req)
                self._finish(req, cancelled_result())
            elif req.state == "running" and req not in stopping:
                stopping.append(req)
        admitted: list[Request] = []
        for s in self._ordered():
            if s.retired and not s.waiting and not s.active:
                self._drop(s)
            else:
                admitted += self._admit(s)
        ran = False
        try:
            for req in stopping:
                self._stop(req)
            for req in admitted:
                self._start(req)
            if self.sync is not None:
                shared = [r for r in admitted if r.state == "running"]
                for r in shared:
                    r.shared = True
                if stopping or shared or any(s.active for s in self._scheds.values()):
                    self.sync.round([r.id for r in stopping], shared)
            for s in self._ordered():
                if s.active:
                    self._round(s)
                    ran = True
            if self.sync is not None and any(r.shared for r in self._finished_now):
                self.sync.finished([r for r in self._finished_now if r.shared])
        except BaseException as e:  # noqa: BLE001 - only under tensor parallelism: the group is gone
            if self.sync is None:
                raise
            err = self.sync.fail(e)
            self._fail_everything(err)
            with self._cond:
                self._closed = self.sync.closed_error()
            return True
        return ran or bool(inbox or cancels or calls or admitted)

    def follow(self, stops: list[int], admits: list[tuple[int, Request]], build) -> list[Request]:
        """A follower rank's iteration (:mod:`repro.engine.ranks`): stop the requests ``stops`` (ids), start
        ``admits`` (``(scheduler id, request)``, ids as rank 0 gave them; ``build(scheduler id)`` makes a
        :class:`Scheduler` it has not seen), run the same rounds as rank 0; returns the requests that ended."""
        self._finished_now = []
        with torch.inference_mode():
            for rid in stops:
                self._stop(self._running[rid])
            for sid, req in admits:
                s = self._scheds.get(sid)
                if s is None:
                    s = self._scheds[sid] = build(sid)
                req.scheduler, req.shared, req.state = s, True, "waiting"
                s._ensure()
                self._start(req)
            for s in self._ordered():
                if s.active:
                    self._round(s)
        return self._finished_now

    def _admit(self, s: Scheduler) -> list[Request]:
        """The waiting requests of ``s`` that take its free slots now (its executor built first)."""
        if not s.waiting:
            return []
        try:
            s._ensure()
        except BaseException as e:  # noqa: BLE001 - e.g. no memory for a graph engine: its requests fail
            log.exception("building the engine of scheduler %s failed", s.name or s.id)
            while s.waiting:
                self._finish(s.waiting.popleft(), None, e)
            return []
        free = len(s.waiting) if s.slots is None else max(0, s.slots - len(s.active))
        return [s.waiting.popleft() for _ in range(min(free, len(s.waiting)))]

    def _start(self, req: Request) -> None:
        """``req`` takes its slot: its program starts and runs to its first op that needs a round."""
        s = req.scheduler
        req.state, req.t0 = "running", time.perf_counter()
        s.active.append(req)
        self._running[req.id] = req
        if req.cancelled and not req.shared:
            return self._finish(req, cancelled_result())
        if req.stats is not None:
            st = req.stats
            st.engine = s.kind or st.engine
            if req.index < len(st.admitted_at_round):
                st.admitted_at_round[req.index] = st.rounds
        try:
            if req.on_start is not None:
                req.on_start(req)
            hook = req.on_block
            if self.sync is not None:
                hook = self.sync.hook(hook)
            req.gen = decode(s.executor.model, req.prompt_ids, req.decoder, mask_id=s.mask_id, eos_id=s.eos_id,
                             max_new_tokens=req.max_new_tokens, seed=req.seed, on_block=hook)
        except BaseException as e:  # noqa: BLE001 - this request's own failure
            return self._finish(req, None, e)
        self._advance(req, None)

    def _advance(self, req: Request, value) -> None:
        """Resume ``req``'s program with ``value`` until it waits for a round or ends."""
        ex = req.scheduler.executor
        try:
            while True:
                op = req.gen.send(value)
                value = ex.start(req, op)
                if value is PENDING:
                    req.op = op
                    return
        except StopIteration as stop:
            self._finish(req, stop.value)
        except BaseException as e:  # noqa: BLE001 - this request's own failure (unless the ranks share it)
            if req.shared:
                raise
            self._finish(req, None, e)

    def _stop(self, req: Request) -> None:
        """End a running request now (:class:`~repro.engine.request.Cancelled` thrown into its program)."""
        if req.state != "running":
            return
        try:
            req.gen.throw(Cancelled())
        except StopIteration as stop:
            return self._finish(req, stop.value)
        except BaseException as e:  # noqa: BLE001
            return self._finish(req, None, e)
        self._finish(req, None, RuntimeError("the request's program went on after it was cancelled"))

    def _round(self, s: Scheduler) -> None:
        """One round of ``s``'s executor over its active requests, then resume those whose op completed."""
        reqs = list(s.active)
        ops = [r.op for r in reqs]
        ex = s.executor
        t0 = time.perf_counter()
        try:
            ex.round(reqs)
        except BaseException as e:  # noqa: BLE001 - the round as a whole failed: its requests fail
            if self.sync is not None:
                raise
            log.error("a round of scheduler %s failed: %s: %s", s.name or s.id, type(e).__name__, e)
            for r in reqs:
                r.reply = PENDING
                self._finish(r, None, e)
            return
        dt = time.perf_counter() - t0
        groups: dict[int, tuple[BatchStats, list]] = {}
        for r, op in zip(reqs, ops):
            if r.stats is not None:
                groups.setdefault(id(r.stats), (r.stats, []))[1].append((r, op))
        for st, members in groups.values():
            st.rounds += 1
            st.round_s.append(dt)
            st.max_active = max(st.max_active, len(members))
            st.rows += sum(ex.rows(r) for r, _ in members)
            st.round_prefill.append(any(isinstance(op, Prefill) for _, op in members))
        for r in reqs:
            value, r.reply = r.reply, PENDING
            if value is PENDING or r.state != "running":
                continue
            if isinstance(value, OpError):
                if r.shared:
                    raise value.error
                self._finish(r, None, value.error)
                continue
            self._advance(r, value)

    def _finish(self, req: Request, result: GenerationResult | None, error: BaseException | None = None) -> None:
        """``req`` ended: free its slot, record the outcome, tell its owner."""
        s = req.scheduler
        if req in s.active:
            s.active.remove(req)
        if s.executor is not None:
            s.executor.release(req)
        self._running.pop(req.id, None)
        if req.t0:
            req.wall_s = time.perf_counter() - req.t0
        req.result, req.error, req.state = result, error, "done"
        req.op, req.reply = None, PENDING
        gen, req.gen = req.gen, None
        if gen is not None:
            gen.close()
        self._finished_now.append(req)
        req._event.set()
        if req.on_done is not None:
            try:
                req.on_done(req)
            except Exception:  # noqa: BLE001 - an owner's callback must not stop the loop
                log.exception("on_done callback of request %s failed", req.id)

    def _fail_everything(self, err: BaseException) -> None:
        """Fail every request the loop holds (queued, waiting, running) with ``err``."""
        with self._cond:
            inbox, self._inbox = self._inbox, []
        for req in inbox:
            req.scheduler.waiting.append(req)
        for s in list(self._scheds.values()):
            for req in list(s.active) + list(s.waiting):
                if req in s.waiting:
                    s.waiting.remove(req)
                if req.state != "done":
                    self._finish(req, None, err)

    def _drop(self, s: Scheduler) -> None:
        """Forget scheduler ``s`` and its executor (memory is freed with it)."""
        with self._cond:
            self._scheds.pop(s.id, None)
        had = s.executor is not None
        s.executor, s.retired = None, True
        if had and torch.cuda.is_available():
            torch.cuda.empty_cache()
