"""A generation job dies with the Snakemake that started it, so a ``kill -9`` of Snakemake leaves no orphans.

Contract
--------
``die_with_parent()`` (called first thing by ``python -m repro.backends.generation_job``), only when
``$REPRO_SNAKEMAKE_PID`` is set (a job started by the workflow; a job run by hand, e.g. under ``nohup``, is
left alone):

* sets ``PR_SET_PDEATHSIG`` to SIGTERM (Linux ``prctl(2)``): the job ends when its direct parent (the
  ``bash -c`` Snakemake runs every shell command in) dies;
* watches the Snakemake process named by ``$REPRO_SNAKEMAKE_PID`` (the workflow sets it to its own pid
  when it starts; a job under Slurm sees the pid of the Snakemake that runs that one job). Snakemake is not
  the job's direct parent, and a ``kill -9`` of Snakemake leaves the ``bash -c`` alive, waiting for this
  process; a daemon thread blocks on a pidfd of that process (``pidfd_open(2)``, Linux >= 5.3; else polls
  every ``poll_s`` seconds) and, once it has exited, prints one line and sends SIGTERM to this process.

A job killed this way loses nothing: each finished problem is already in its partial file, and the rerun
(the README's command) resumes from it. Returns the pid watched, or None (no or an invalid variable:
nothing is set up; that process already gone: only the death signal applies).
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
ENV_VAR = "REPRO_SNAKEMAKE_PID"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _wait_for_exit(pid: int, poll_s: float) -> None:
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    if fd is not None:
        select.select([fd], [], [])  # readable once the process has exited
        os.close(fd)
        return
    while _alive(pid):
        time.sleep(poll_s)


def die_with_parent(poll_s: float = 2.0) -> int | None:
    """Tie this process's life to its parent and to ``$REPRO_SNAKEMAKE_PID`` (see the module docstring)."""
    try:
        pid = int(os.environ.get(ENV_VAR, ""))
    except ValueError:
        return None
    if pid <= 1 or pid == os.getpid():
        return None
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if not _alive(pid):
        return None

    def watch() -> None:
        _wait_for_exit(pid, poll_s)
        print(f"Snakemake (pid {pid}) has exited: stopping this job; the problems it finished are kept and the "
              "rerun resumes from them", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="die-with-snakemake", daemon=True).start()
    return pid
