"""Launch the ranks of a tensor-parallel LLM and keep them in step with rank 0's engine loop.

Launch (docs/engine.md §15): the process that builds the :class:`~repro.engine.llm.LLM` is rank 0 and owns
every request; it starts ranks 1..N-1 itself, each a fresh ``python -m repro.engine.ranks`` process holding one
end of a pipe (so the caller's script is not re-imported and needs no ``if __name__ == "__main__"`` guard), and
one command starts all of them — no ``torchrun``. Each rank loads the checkpoint, keeps its slices
(:class:`repro.engine.parallel.ShardedModel`) on its device (``cuda:r`` on GPUs, the CPU otherwise) and joins a
``torch.distributed`` group (NCCL on GPUs, gloo on the CPU) whose rendezvous is a TCP store on 127.0.0.1.

In step (as SGLang's rank 0 broadcasts each round's admitted requests): rank 0's engine loop
(:mod:`repro.engine.loop`) holds every request — ``generate``, ``generate_batch``, the server's. At each
iteration that runs anything, :class:`RankSync` sends every follower, over its pipe, the iteration's
cancellations and admissions (prompt ids, decoder settings, budget, seed, scheduler); each follower runs the
same iteration (:meth:`~repro.engine.loop.EngineLoop.follow`) on the same inputs: the same rounds, the same
forwards in the same order, the same decisions (every reduced value is bit-identical on every rank,
:mod:`repro.engine.parallel`). Every rank runs the eager batched forward with the on-device step for greedy
decoders. A request's ``on_block`` hook runs on rank 0 and its stop answer is broadcast (one flag per block).
When requests end, each follower reports their forward counts and tokens, which must equal rank 0's. A follower
waits for the next iteration on its pipe, without a collective timeout.

Failures (each a :class:`TensorParallelError` on rank 0, no hang): a follower that fails to load says why; a
rank that dies mid-request breaks the next collective or pipe write (gloo/NCCL report the closed peer) or, if it
hangs, the collective times out after ``timeout_s``; rank 0 then names the dead rank and its exit code, fails
every request it holds, stops the others and refuses further requests. Nothing is written by a rank: results
exist only once rank 0 returns them.
"""

from __future__ import annotations

import atexit
import json
import multiprocessing as mp
import socket
import subprocess
import sys
import threading
import time
import traceback
from datetime import timedelta
from multiprocessing.connection import Connection

import torch
import torch.distributed as dist

#: Seconds a collective may wait for the other ranks before it fails (a hung rank); a forward of the full
#: model takes milliseconds, the first one (kernel compilation) seconds.
DEFAULT_TIMEOUT_S = 300.0
#: Seconds a follower may take to load its checkpoint slices (a 32 GB checkpoint read from a slow disk);
#: a follower that exits while loading is reported at once.
LOAD_TIMEOUT_S = 1800.0


class TensorParallelError(RuntimeError):
    """A rank failed to start, died or diverged; the tensor-parallel LLM is closed."""


def check_devices(device: str, n: int, available: int | None = None) -> None:
    """Raise ValueError unless ``n`` ranks have a device each: on CUDA, ``n`` GPUs from ``device``'s index on
    (``available``: the GPU count, default ``torch.cuda.device_count()``); on the CPU every rank is a process."""
    dev = str(device)
    if not dev.startswith("cuda"):
        return
    base = int(dev[5:]) if dev.startswith("cuda:") else 0
    have = torch.cuda.device_count() if available is None else available
    if base + n > have:
        raise ValueError(f"tensor_parallel_size {n} on {dev} needs GPUs cuda:{base}..cuda:{base + n - 1}, but "
                         f"{have} GPU(s) are visible; lower tensor_parallel_size or use a machine with more GPUs")


def rank_device(device: str, rank: int) -> str:
    """The device of ``rank``: ``cuda:(base + rank)`` on GPUs, ``cpu`` otherwise."""
    dev = str(device)
    if not dev.startswith("cuda"):
        return "cpu"
    return f"cuda:{(int(dev[5:]) if dev.startswith('cuda:') else 0) + rank}"


def select_kernels(kernels: str) -> None:
    """Put this rank's layer seams on ``kernels`` (``"triton"`` or ``"torch"``), the implementation rank 0 chose."""
    from repro.engine.layers import attention, moe

    if kernels == "triton":
        from repro.engine.kernels import register_with_seams

        register_with_seams(select=True)
    else:
        moe.set_moe_impl("torch")
        attention.set_attention_impl("torch")


def load_rank(spec: dict, rank: int, n: int):
    """This rank's :class:`~repro.engine.parallel.ShardedModel` from ``spec`` (``path``, ``role``, ``precision``,
    ``device``, ``adapter_map``): the checkpoint is read on the CPU, sliced, and the slices moved to the device
    (``nvfp4-w4a16``: the routed experts stay packed, split by expert; the rest in the precision's dtype there).
    With ``config`` (a config.json dict) and ``seed`` instead of ``path``: random slices in those shapes
    (:meth:`~repro.engine.parallel.ShardedModel.random`, benchmarks)."""
    from repro.engine.config import LLaDA2Config
    from repro.engine.model import LLaDA2Model
    from repro.engine.parallel import Comm, ShardedModel, ShardPlan

    if "config" in spec:
        cfg = LLaDA2Config.from_dict(spec["config"])
        return ShardedModel.random(cfg, ShardPlan(cfg, n, rank), Comm(rank, n), rank_device(spec["device"], rank),
                                   spec["precision"], spec.get("seed", 0))
    cfg = LLaDA2Config.from_file(spec["path"], spec.get("adapter_map"))
    full = LLaDA2Model.from_pretrained(spec["path"], "cpu", spec["precision"], with_adapter=spec["role"] == "orl",
                                       cfg=cfg)
    model = ShardedModel(full, ShardPlan(cfg, n, rank), Comm(rank, n), rank_device(spec["device"], rank))
    del full
    return model


def init_group(rank: int, n: int, port: int, device: str, timeout_s: float) -> None:
    """Join the group (TCP store on 127.0.0.1:``port``; NCCL on CUDA, gloo on the CPU)."""
    backend = "nccl" if str(device).startswith("cuda") else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(rank_device(device, rank))
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n,
                            timeout=timedelta(seconds=timeout_s))


def _follower(rank: int, n: int, port: int, spec: dict, conn, timeout_s: float) -> None:
    """Rank ``rank``'s process: load, join, then follow rank 0's loop (``round`` messages) and run the handler
    calls it sends (:meth:`Ranks.call`) until ``stop`` or EOF."""
    try:
        torch.set_num_threads(spec.get("threads", 1))
        select_kernels(spec.get("kernels", "torch"))
        model = load_rank(spec, rank, n)
        conn.send(("loaded",))
        init_group(rank, n, port, spec["device"], timeout_s)
        follower = _Follower(model)
        while True:
            try:
                cmd, req = conn.recv()
            except EOFError:  # rank 0 is gone
                break
            if cmd == "stop":
                break
            if cmd == "round":
                ended = follower.round(req)
                if ended:
                    conn.send(("finished", ended))
                continue
            conn.send(("done", _summary(_handler(cmd)(model, req))))
    except BaseException as e:  # noqa: BLE001 - reported to rank 0, which raises
        try:
            conn.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"))
        except Exception:
            pass
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _handler(name: str):
    """The function ``"module:function"`` every rank runs for a command (``fn(model, req)``)."""
    import importlib

    mod, fn = name.split(":")
    return getattr(importlib.import_module(mod), fn)


def _summary(res):
    """What a follower reports: a generation's (forwards, raw ids), else the handler's (picklable) result."""
    return (res.forwards, res.raw_ids) if hasattr(res, "raw_ids") else res


class _Follower:
    """A follower's engine loop (:meth:`~repro.engine.loop.EngineLoop.follow`), driven by rank 0's messages."""

    def __init__(self, model):
        from repro.engine.loop import EngineLoop

        self.model, self.loop = model, EngineLoop()

    def round(self, msg: dict) -> dict:
        """One iteration as rank 0 ran it; returns ``{request id: (forwards, raw ids) or None}`` of the requests
        that ended in it."""
        from repro.engine.batch import EagerExecutor
        from repro.engine.loop import Request, Scheduler

        model, comm = self.model, self.model.comm
        admits, masks = [], {}
        for a in msg["admit"]:
            hook = (lambda ids: comm.broadcast_flag(None)) if a["hook"] else None
            req = Request(a["ids"], a["decoder"], a["max_new_tokens"], a["seed"], on_block=hook, id=a["id"])
            admits.append((a["scheduler"], req))
            masks[a["scheduler"]] = (a["mask_id"], a["eos_id"])

        def build(sid):
            mask_id, eos_id = masks[sid]
            return Scheduler(self.loop, lambda: EagerExecutor(model, mask_id, device_steps=True, isolate=False), None,
                             mask_id, eos_id, sid)

        ended = self.loop.follow(msg["stop"], admits, build)
        return {r.id: (None if r.result is None else (r.result.forwards, r.result.raw_ids)) for r in ended}


class RankSync:
    """Rank 0's side of the engine loop under tensor parallelism (the ``sync`` of
    :class:`~repro.engine.loop.EngineLoop`; module docstring)."""

    def __init__(self, ranks: "Ranks"):
        self.ranks = ranks

    def hook(self, on_block):
        """A shared request's ``on_block``: rank 0's answer broadcast to every rank (None when it has none)."""
        if on_block is None:
            return None
        comm = self.ranks.model.comm
        return lambda ids: comm.broadcast_flag(bool(on_block(ids)))

    def round(self, stops: list[int], admits: list) -> None:
        """Send the iteration's cancellations and admissions to every follower (before its rounds run)."""
        r = self.ranks
        if r.broken:
            raise TensorParallelError(f"this tensor-parallel LLM is closed ({r.broken}); build a new LLM")
        from repro.engine.decoders import DecoderConfig

        msg = {"stop": stops, "admit": [
            {"id": q.id, "scheduler": q.scheduler.id, "ids": list(q.prompt_ids),
             "decoder": DecoderConfig.coerce(q.decoder).to_dict(), "max_new_tokens": q.max_new_tokens,
             "seed": q.seed, "mask_id": q.scheduler.mask_id, "eos_id": q.scheduler.eos_id,
             "hook": q.on_block is not None} for q in admits]}
        for c in r.conns:
            c.send(("round", msg))

    def finished(self, reqs: list) -> None:
        """Check each follower's report on the shared requests that ended in this iteration (TensorParallelError
        when a rank's forwards or tokens differ from rank 0's)."""
        r = self.ranks
        for k in range(1, r.n):
            got = r._expect(k, "finished", r.timeout_s)[1]
            for q in reqs:
                if q.id not in got:
                    r.broken = f"rank {k} diverged"
                    raise TensorParallelError(f"rank {k} did not end request {q.id} when rank 0 did")
                mine = None if q.result is None else (q.result.forwards, q.result.raw_ids)
                if got[q.id] != mine:
                    r.broken = f"rank {k} diverged"
                    raise TensorParallelError(f"rank {k} diverged from rank 0 on request {q.id} (forwards "
                                              f"{None if got[q.id] is None else got[q.id][0]} vs "
                                              f"{None if mine is None else mine[0]})")

    def fail(self, e: BaseException) -> BaseException:
        """The error every request gets once the group failed mid-iteration (the ranks are stopped)."""
        return self.ranks.abandon(e)

    def closed_error(self) -> BaseException:
        """The error of a request submitted after the group closed."""
        return TensorParallelError(f"this tensor-parallel LLM is closed ({self.ranks.broken}); build a new LLM")


class _Watch:
    """While the group lives (one thread per group, not per request), print one stderr line as soon as a
    follower exits. With gloo the next collective raises anyway; with NCCL a lost peer is noticed only by its
    watchdog after the timeout, which by default (``TORCH_NCCL_ASYNC_ERROR_HANDLING``) ends the process — this
    line is then what names the rank."""

    def __init__(self, procs):
        self._done = threading.Event()
        self._t = threading.Thread(target=self._run, args=(list(procs),), daemon=True)
        self._t.start()

    def _run(self, procs):
        while not self._done.wait(1.0):
            for r, p in enumerate(procs, 1):
                if p.poll() is not None:
                    print(f"tensor parallel: rank {r} (pid {p.pid}) exited with code {p.returncode}",
                          file=sys.stderr, flush=True)
                    return

    def stop(self) -> None:
        self._done.set()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Ranks:
    """Rank 0's handle on a started group (module docstring). ``spec``: what each rank loads; ``n``: ranks;
    ``timeout_s``: collective timeout. Attributes: ``model`` (rank 0's ShardedModel), ``procs`` (followers)."""

    def __init__(self, spec: dict, n: int, timeout_s: float = DEFAULT_TIMEOUT_S):
        if dist.is_initialized():
            raise ValueError("a torch.distributed group already exists in this process; one tensor-parallel LLM "
                             "per process (close() the other first)")
        self.n, self.timeout_s, self.broken = n, timeout_s, None
        port = _free_port()
        spec = dict(spec, threads=torch.get_num_threads())
        self.procs, self.conns = [], []
        for r in range(1, n):
            a, b = mp.Pipe()
            args = json.dumps(dict(rank=r, n=n, port=port, spec=spec, fd=b.fileno(), timeout_s=timeout_s))
            self.procs.append(subprocess.Popen([sys.executable, "-m", "repro.engine.ranks", args],
                                               pass_fds=[b.fileno()]))
            b.close()
            self.conns.append(a)
        # a script that never calls close() still leaves the group before the interpreter tears down: a live
        # gloo/NCCL group at exit aborts the process ("terminate called without an active exception")
        atexit.register(self.close)
        try:
            self.model = load_rank(spec, 0, n)
            for r in range(1, n):
                self._expect(r, "loaded", LOAD_TIMEOUT_S)
            init_group(0, n, port, spec["device"], timeout_s)
            self._watch = _Watch(self.procs)  # names a follower that exits while rank 0 waits in a collective
        except BaseException as e:
            self.close()
            if isinstance(e, TensorParallelError):
                raise
            raise TensorParallelError(f"starting {n} ranks failed: {type(e).__name__}: {e}") from e

    @property
    def pids(self) -> list[int]:
        """Process ids of ranks 1..N-1."""
        return [p.pid for p in self.procs]

    def _dead(self, wait_s: float = 0.0) -> list[str]:
        """Lines naming the followers that exited; waits up to ``wait_s`` for one to show (a killed rank's sockets
        close, and break a collective, a moment before its exit can be collected)."""
        end = time.monotonic() + wait_s
        while time.monotonic() < end and all(p.poll() is None for p in self.procs):
            time.sleep(0.05)
        return [f"rank {i + 1} (pid {p.pid}) exited with code {p.returncode}" for i, p in enumerate(self.procs)
                if p.poll() is not None]

    def _expect(self, rank: int, what: str, timeout_s: float):
        """The next message of ``rank``, which must be ``what``; TensorParallelError if it errs, dies or is silent."""
        c, p = self.conns[rank - 1], self.procs[rank - 1]
        waited = 0.0
        while not c.poll(0.5):
            waited += 0.5
            if p.poll() is not None and not c.poll(0):
                raise TensorParallelError(f"rank {rank} (pid {p.pid}) exited with code {p.returncode} before "
                                          f"reporting '{what}'")
            if waited >= timeout_s:
                raise TensorParallelError(f"rank {rank} sent nothing for {timeout_s:.0f} s (waiting for '{what}')")
        try:
            msg = c.recv()
        except EOFError:
            raise TensorParallelError(f"rank {rank} (pid {p.pid}) closed its pipe before reporting '{what}'") from None
        if msg[0] == "error":
            raise TensorParallelError(f"rank {rank} failed: {msg[1]}")
        if msg[0] != what:
            raise TensorParallelError(f"rank {rank} sent {msg[0]!r}, expected {what!r}")
        return msg

    def abandon(self, e: BaseException) -> "TensorParallelError":
        """After a failure of the group (``e``): name the dead ranks (or the collective that failed), stop every
        rank, and return the TensorParallelError every pending request gets."""
        if isinstance(e, TensorParallelError) and self.broken and not self._dead():
            self.close()
            return e
        dead = self._dead(wait_s=3.0)
        why = "; ".join(dead) if dead else (
            f"no rank exited, but a collective failed (a rank hung past the {self.timeout_s:g} s collective "
            f"timeout, or the transport broke): {type(e).__name__}: {str(e).strip().splitlines()[0][:300]}")
        self.broken = why
        self.close()
        if isinstance(e, TensorParallelError) and not dead:
            return e
        err = TensorParallelError(f"tensor-parallel request abandoned, nothing returned: {why}. The ranks are "
                                  "stopped; build a new LLM to continue")
        err.__cause__ = e
        return err

    def call(self, fn: str, req: dict, *local_args):
        """Run ``fn(model, req)`` (``"module:function"``) on every rank in lockstep, outside the engine loop
        (benchmarks, teacher-forced checks; not while the LLM decodes); returns (rank 0's result, [each
        follower's :func:`_summary`]). ``local_args`` go to rank 0's call only. Raises TensorParallelError (and
        closes the group) when a rank fails, dies or hangs."""
        if self.broken:
            raise TensorParallelError(f"this tensor-parallel LLM is closed ({self.broken}); build a new LLM")
        try:
            for c in self.conns:
                c.send((fn, req))
            res = _handler(fn)(self.model, req, *local_args)
            return res, [self._expect(r, "done", self.timeout_s)[1] for r in range(1, self.n)]
        except BaseException as e:
            err = self.abandon(e)
            if err is e:
                raise
            raise err from e

    def close(self) -> None:
        """Stop the followers (``stop``, then terminate after 10 s) and leave the group. Idempotent."""
        watch = getattr(self, "_watch", None)
        if watch is not None:
            watch.stop()
        for c in self.conns:
            try:
                c.send(("stop", None))
            except (OSError, ValueError):
                pass
        for p in self.procs:
            try:
                p.wait(10 if not self.broken else 2)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        for c in self.conns:
            c.close()
        self.conns, self.broken = [], self.broken or "closed"
        atexit.unregister(self.close)
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":  # a follower rank, started by Ranks
    _a = json.loads(sys.argv[1])
    _follower(_a["rank"], _a["n"], _a["port"], _a["spec"], Connection(_a["fd"]), _a["timeout_s"])
