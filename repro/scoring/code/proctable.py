"""Process-table helpers for the sandbox: find, kill and reap every process of a run.

Used by the fork server (``_zygote.py``) after each program and by ``sandbox.py`` on start-up and when a
fork server dies. A run's processes are those of its slot uid (root mode), of its session/process group,
and every descendant of the fork server -- which is a child subreaper, so daemons that ``setsid`` away
and orphans of a fork bomb are re-parented to it instead of escaping to PID 1. Linux ``/proc`` only.
Plain functions over ``/proc``; no third-party imports (the fork server runs with ``python -I -S``).
"""

import ctypes
import os
import signal
import time
PR_SET_CHILD_SUBREAPER = 36


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
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except OSError:  # pragma: no cover
        return False
