"""Math-Verify in worker processes with a hard per-item wall-clock timeout, callable from any thread.

Why: Math-Verify's timeouts use SIGALRM, which raises "signal only works in main thread" in worker
threads (Math-Verify #50/#55, scoring case math500-05), and a pathological expression can make sympy
run for minutes. Here each check is sent as one JSON line to a long-lived worker *process*
(``python -m repro.scoring.graders.worker``: :func:`repro.scoring.math.equivalent` for a ``{"gold", "pred"}``
request, the independent graders for one that names them); the calling thread waits on the pipe with ``select`` and,
past ``timeout`` seconds, kills the worker's process group and starts a fresh one. No signals are used
in the caller, so ``VerifyPool.check`` works from any thread or process. A worker that dies while
checking is restarted and the item retried once; a second failure is reported as ``error``.

Contract: ``VerifyPool(size, timeout).check(gold, pred) -> {"status": "ok"|"timeout"|"error",
"equal": bool, "detail": str, "gold_parsed", "pred_parsed"}``. ``get_pool(size, preload=())`` returns *the*
process-wide pool (closed at interpreter exit): our Math-Verify verdicts and the independent graders share its
workers, so Math-Verify, sympy and the ANTLR parser's learned decisions are paid for once per worker, not once
per pool, and a gold or answer parsed for our verdict is found in the worker's parse cache by the Math-Verify
grader (``graders/worker.py``). Its workers run with :data:`ANTLR_DIR` (antlr4-python3-runtime 4.11: sympy's
``parse_latex``, used by the Minerva grader, requires it; Math-Verify's parser ships its grammar generated for
4.9.3, 4.11 and 4.13.2 and loads the one of the runtime it finds) first on their ``PYTHONPATH``; the graders
named in ``preload`` are imported before a new pool's workers report ready (:data:`PRELOAD_ENV`). Imports nothing
of the scorers: the worker process runs :mod:`repro.scoring.graders.worker`, which imports
:mod:`repro.scoring.math` (so the scorer may import this pool).
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

__all__ = ["VerifyPool", "get_pool", "DEFAULT_TIMEOUT_S", "WORKER_MODULE", "ANTLR_DIR", "PRELOAD_ENV"]

#: wall-clock seconds for one Math-Verify check of ours; past it the worker is killed (the item: "timeout")
DEFAULT_TIMEOUT_S = 10.0
#: what the workers run: our Math-Verify check and the independent graders (module docstring)
WORKER_MODULE = "repro.scoring.graders.worker"
#: antlr4-python3-runtime 4.11, first on the workers' PYTHONPATH (``python -m repro.scoring.graders install``)
ANTLR_DIR = os.environ.get("REPRO_ANTLR4_11_DIR") or os.path.join(sys.prefix, "share", "repro", "antlr4-4.11")
#: comma-separated grader names a new pool's workers import before they report ready
PRELOAD_ENV = "REPRO_GRADERS_PRELOAD"
_STARTUP_TIMEOUT_S = 120.0
_REPO_ROOT = str(Path(__file__).resolve().parents[2])


class _Worker:
    def __init__(self, module: str = WORKER_MODULE, path_first: tuple[str, ...] = (),
                 extra_env: dict | None = None) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
        env["PYTHONPATH"] = os.pathsep.join([*path_first, _REPO_ROOT])
        env.update(extra_env or {})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            cwd=_REPO_ROOT,
            start_new_session=True,
        )
        self._buf = b""
        self.ready = False

    def _read_line(self, timeout: float) -> bytes | None:
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise EOFError("math-verify worker exited")
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line

    def ask(self, request: dict, timeout: float) -> dict | None:
        """Send one request; the answer dict, or None on timeout (worker killed) / raise on death."""
        if not self.ready:  # the worker announces itself once math_verify/sympy are imported
            if self._read_line(_STARTUP_TIMEOUT_S) is None:
                raise EOFError(f"math-verify worker did not start within {_STARTUP_TIMEOUT_S:g} s")
            self.ready = True
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()
        line = self._read_line(timeout)
        return None if line is None else json.loads(line)

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover
            pass
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass


class VerifyPool:
    """Up to ``size`` worker processes shared by all calling threads (see module docstring). ``timeout``: the
    default of :meth:`check`, seconds; ``module``: what the workers run; ``path_first``: directories put before the
    checkout on their ``PYTHONPATH``; ``extra_env``: variables set in their environment."""

    def __init__(self, size: int = 1, timeout: float = DEFAULT_TIMEOUT_S, module: str = WORKER_MODULE,
                 path_first: tuple[str, ...] = (ANTLR_DIR,), extra_env: dict | None = None) -> None:
        if size < 1:
            raise ValueError(f"VerifyPool size must be >= 1, got {size}")
        self.size = size
        self.timeout = timeout
        self.module, self.path_first, self.extra_env = module, tuple(path_first), dict(extra_env or {})
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._slots = threading.Semaphore(size)
        self._all: list[_Worker] = []
        self._lock = threading.Lock()

    def _spawn(self) -> _Worker:
        w = _Worker(self.module, self.path_first, self.extra_env)
        with self._lock:
            self._all.append(w)
        return w

    def start(self) -> "VerifyPool":
        """Start every worker now (their imports then overlap the caller's work); returns the pool."""
        with self._lock:
            missing = self.size - len(self._all)
        for _ in range(max(0, missing)):
            self._idle.put(self._spawn())
        return self

    def check(self, gold: str, pred: str, timeout: float | None = None, **extra) -> dict:
        """One request ``{"gold", "pred", **extra}`` answered by a worker (see module docstring)."""
        timeout = self.timeout if timeout is None else timeout
        with self._slots:
            try:
                w = self._idle.get_nowait()
            except queue.Empty:
                w = self._spawn()
            for attempt in (1, 2):
                try:
                    ans = w.ask({"gold": gold, "pred": pred, **extra}, timeout)
                except (EOFError, BrokenPipeError, OSError, ValueError) as exc:
                    w.kill()
                    w = self._spawn()
                    if attempt == 2:
                        self._idle.put(w)
                        return {"status": "error", "equal": False, "detail": f"worker died twice: {exc}",
                                "gold_parsed": None, "pred_parsed": None}
                    continue
                if ans is None:
                    self._idle.put(self._spawn())
                    return {"status": "timeout", "equal": False,
                            "detail": f"math-verify exceeded {timeout:g} s; worker killed",
                            "gold_parsed": None, "pred_parsed": None}
                self._idle.put(w)
                return ans
        raise AssertionError("unreachable")  # pragma: no cover

    def close(self) -> None:
        with self._lock:
            workers, self._all = self._all, []
        for w in workers:
            w.kill()


_POOL: VerifyPool | None = None
_POOL_LOCK = threading.Lock()


def get_pool(size: int, preload=()) -> VerifyPool:
    """The process-wide pool with at least ``size`` slots (recreated when a larger one is needed); a new pool's
    workers import the graders named in ``preload`` before they report ready. A pool is made once per size: a
    later ``preload`` does not restart it (those graders load at their first request)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL.size < size:
            if _POOL is not None:
                _POOL.close()
            _POOL = VerifyPool(size, extra_env={PRELOAD_ENV: ",".join(preload)})
        return _POOL


@atexit.register
def _close_pool() -> None:
    if _POOL is not None:
        _POOL.close()
