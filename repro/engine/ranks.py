"""Launch and drive the ranks of one tensor-parallel request (``LLM(..., tensor_parallel_size=N)``).

Launch (docs/engine.md §15): the process that builds the :class:`~repro.engine.llm.LLM` is rank 0 and owns
every request; it starts ranks 1..N-1 itself, each a fresh ``python -m repro.engine.ranks`` process holding one
end of a pipe (so the caller's script is not re-imported and needs no ``if __name__ == "__main__"`` guard), and
one command starts all of them — no ``torchrun``. Each rank loads the checkpoint, keeps its slices
(:class:`repro.engine.parallel.ShardedModel`) on its device (``cuda:r`` on GPUs, the CPU otherwise) and joins a
``torch.distributed`` group (NCCL on GPUs, gloo on the CPU) whose rendezvous is a TCP store on 127.0.0.1.

Control and data are separate: rank 0 sends each request (prompt ids, decoder settings, budget, seed) to the
followers over a pipe — a follower waits for requests there, without a collective timeout; then every rank runs
:func:`repro.engine.decode_loop.generate_ids` on the same inputs in lockstep: the same forwards in the same order,
the same decisions (every reduced value is bit-identical on every rank, :mod:`repro.engine.parallel`). An
``on_block`` hook runs on rank 0 and its stop answer is broadcast (one flag per block). After the request each
follower reports its forward counts and tokens, which must equal rank 0's.

Failures (each a :class:`TensorParallelError` on rank 0, no hang): a follower that fails to load says why; a
rank that dies mid-request breaks the next collective (gloo/NCCL report the closed peer) or, if it hangs, the
collective times out after ``timeout_s``; rank 0 then names the dead rank and its exit code, stops the others
and refuses further requests. Nothing is written by a rank: results exist only once rank 0 returns them.
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


def backend_for(model, cfg, mask_id: int):
    """The decode-loop backend every rank uses for ``cfg``: the on-device step (greedy) or the host decoders."""
    from repro.engine.decode_loop import CachedBackend, EagerStepBackend
    from repro.engine.decoders.device import supported

    return EagerStepBackend(model, mask_id) if supported(cfg) else CachedBackend(model)


def run_request(model, req: dict, on_block=None):
    """``generate_ids`` of request ``req`` (``ids``, ``decoder`` dict, ``max_new_tokens``, ``seed``,
    ``mask_id``, ``eos_id``, ``hook``) on this rank; with ``hook`` the stop flag is rank 0's (broadcast)."""
    from repro.engine.decode_loop import generate_ids
    from repro.engine.decoders import DecoderConfig

    cfg = DecoderConfig.from_dict(req["decoder"])
    hook = None
    if req["hook"]:
        def hook(ids):
            return model.comm.broadcast_flag(bool(on_block(ids)) if on_block is not None else None)
    with torch.inference_mode():
        return generate_ids(backend_for(model, cfg, req["mask_id"]), req["ids"], cfg, mask_id=req["mask_id"],
                            eos_id=req["eos_id"], max_new_tokens=req["max_new_tokens"], seed=req["seed"],
                            on_block=hook)


def _follower(rank: int, n: int, port: int, spec: dict, conn, timeout_s: float) -> None:
    """Rank ``rank``'s process: load, join, then run each request rank 0 sends until ``stop`` or EOF."""
    try:
        torch.set_num_threads(spec.get("threads", 1))
        select_kernels(spec.get("kernels", "torch"))
        model = load_rank(spec, rank, n)
        conn.send(("loaded",))
        init_group(rank, n, port, spec["device"], timeout_s)
        while True:
            try:
                cmd, req = conn.recv()
            except EOFError:  # rank 0 is gone
                break
            if cmd == "stop":
                break
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


class _Watch:
    """While a request runs, print one stderr line as soon as a follower exits. With gloo the next collective
    raises anyway; with NCCL a lost peer is noticed only by its watchdog after the timeout, which by default
    (``TORCH_NCCL_ASYNC_ERROR_HANDLING``) ends the process — this line is then what names the rank."""

    def __init__(self, procs):
        self._done = threading.Event()
        self._t = threading.Thread(target=self._run, args=(list(procs),), daemon=True)
        self._t.start()

    def _run(self, procs):
        while not self._done.wait(1.0):
            for r, p in enumerate(procs, 1):
                if p.poll() is not None:
                    print(f"tensor parallel: rank {r} (pid {p.pid}) exited with code {p.returncode} during a "
                          "request", file=sys.stderr, flush=True)
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

    def generate(self, req: dict, on_block=None):
        """Run request ``req`` (:func:`run_request`'s fields) on all ranks; returns rank 0's GenerationResult.
        Raises TensorParallelError (and closes the group) when a rank fails, dies, hangs or diverges."""
        req = dict(req, hook=on_block is not None)
        res, others = self.call("repro.engine.ranks:run_request", req, on_block)
        for r, (forwards, raw) in enumerate(others, 1):
            if forwards != res.forwards or raw != res.raw_ids:
                self.broken = f"rank {r} diverged"
                self.close()
                raise TensorParallelError(f"rank {r} diverged from rank 0 (forwards {forwards} vs {res.forwards}); "
                                          "the ranks are stopped")
        return res

    def call(self, fn: str, req: dict, *local_args):
        """Run ``fn(model, req)`` (``"module:function"``) on every rank in lockstep; returns (rank 0's result,
        [each follower's :func:`_summary`]). ``local_args`` go to rank 0's call only. Raises
        TensorParallelError (and closes the group) when a rank fails, dies or hangs."""
        if self.broken:
            raise TensorParallelError(f"this tensor-parallel LLM is closed ({self.broken}); build a new LLM")
        watch = _Watch(self.procs)  # names a rank that exits while rank 0 waits inside a collective
        try:
            for c in self.conns:
                c.send((fn, req))
            res = _handler(fn)(self.model, req, *local_args)
            return res, [self._expect(r, "done", self.timeout_s)[1] for r in range(1, self.n)]
        except BaseException as e:
            dead = self._dead(wait_s=3.0)
            why = "; ".join(dead) if dead else (
                f"no rank exited, but a collective failed (a rank hung past the {self.timeout_s:g} s collective "
                f"timeout, or the transport broke): {type(e).__name__}: {str(e).strip().splitlines()[0][:300]}")
            self.broken = why
            self.close()
            if isinstance(e, TensorParallelError) and not dead:
                raise
            raise TensorParallelError(f"tensor-parallel request abandoned, nothing returned: {why}. The ranks are "
                                      "stopped; build a new LLM to continue") from e
        finally:
            watch.stop()

    def close(self) -> None:
        """Stop the followers (``stop``, then terminate after 10 s) and leave the group. Idempotent."""
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
