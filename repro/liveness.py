"""Is a Snakemake run, or one of its generation jobs, alive now? Read from files and the process table only.

Contract (no side effects: nothing here removes, locks for long, or starts anything but ``squeue``):

* :func:`probe_flock` -- the state of a claim file another process may hold an flock on: ``"held"`` (a live
  process holds it), ``"free"`` (nobody does: its process is gone), ``"gone"`` (no such file), ``"other-user"``
  (not readable: another user's, taken as held) or ``"unknown"`` (the file system has no file locks). The workflow
  makes every Snakemake hold such a claim for its lifetime in ``<work>/.repro-runs/<pid>.lock`` (JSON: ``pid``,
  ``directory`` -- the folder whose ``.snakemake/locks`` it holds --, ``host``; workflow/run_claims.py).
* :func:`live_runs` -- the :class:`Run` of every claim in a work directory whose Snakemake is alive: its flock is
  held; where the file system cannot tell (no file locks), its pid is alive on this host (a claim from another
  host then counts as alive: nothing here can tell otherwise).
* :func:`job_alive` -- whether the generation job described by a sessions file's ``job`` facts (``pid``, ``host``,
  ``slurm_job_id``; repro/backends/generation_job.py) still runs: a Slurm job is asked of ``squeue`` (pending,
  running or completing counts as alive); a local one by its pid on this host, whose command line must still be a
  generation job's (a pid reused by another program is not it). None when it cannot be told (another host
  without a Slurm job id, no ``squeue`` here, no facts).

``repro.status`` uses these to say "running" only of a live run and "stopped (rerun to resume)" otherwise.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

RUNS_FOLDER = ".repro-runs"  # <work>/.repro-runs/<pid>.lock: one claim per live Snakemake (workflow/run_claims.py)
JOB_MODULE = "repro.backends.generation_job"  # in a generation job's command line
_SLURM_ALIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING",
                "SIGNALING", "STAGE_OUT", "REQUEUE_HOLD", "REQUEUE_FED"}


@dataclass(frozen=True)
class Run:
    """A live Snakemake holding a claim: its ``pid``, the ``directory`` it runs in (its ``.snakemake``), the
    ``host`` (None when the claim does not say)."""

    pid: str
    directory: str
    host: str | None = None


def hostname() -> str:
    return socket.gethostname()


def probe_flock(path: Path) -> str:
    """``"held"``, ``"free"``, ``"gone"``, ``"other-user"`` or ``"unknown"`` (module docstring). Takes the lock
    for an instant only when it is free (then releases it)."""
    try:
        fd = os.open(path, os.O_RDONLY)  # flock works on a read-only descriptor
    except FileNotFoundError:
        return "gone"
    except PermissionError:
        return "other-user"
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return "held"
    except OSError:  # no file locks on this file system
        return "unknown"
    else:
        return "free"
    finally:
        os.close(fd)


def pid_alive(pid: int, needle: str | None = None) -> bool:
    """Whether process ``pid`` exists on this host (and, with ``needle``, its command line contains it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    except (OverflowError, ValueError):
        return False
    if needle is None:
        return True
    try:
        return needle in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return True  # no /proc to read (or not allowed): the pid exists, take it as the job


def _claim(path: Path) -> dict:
    try:
        info = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def live_runs(work: str | os.PathLike) -> list[Run]:
    """Every live Snakemake claiming ``work`` (module docstring), in pid order."""
    folder = Path(work) / RUNS_FOLDER
    out = []
    for path in sorted(folder.glob("*.lock")) if folder.is_dir() else []:
        state = probe_flock(path)
        info = _claim(path)
        pid, host = str(info.get("pid", path.stem)), info.get("host")
        if state == "unknown":  # no file locks: judge by the pid where the claim was made here
            alive = not host or host != hostname() or (pid.isdigit() and pid_alive(int(pid)))
        else:
            alive = state in ("held", "other-user")
        if alive:
            out.append(Run(pid, str(info.get("directory", "?")), host))
    return out


def slurm_job_alive(job_id: str) -> bool | None:
    """Whether Slurm job ``job_id`` is pending or running, asked of ``squeue``; None when it cannot be asked."""
    squeue = shutil.which("squeue")
    if squeue is None:
        return None
    try:
        r = subprocess.run([squeue, "-h", "-j", str(job_id), "-o", "%T"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    if r.returncode != 0:
        return False if "invalid job id" in r.stderr.lower() else None  # gone from squeue after its end
    states = {s.strip().split("|")[-1].upper() for s in r.stdout.splitlines() if s.strip()}
    return bool(states & _SLURM_ALIVE)


def job_alive(facts: dict | None) -> bool | None:
    """Whether the generation job with these ``job`` facts still runs (module docstring); None: cannot tell."""
    if not isinstance(facts, dict):
        return None
    if facts.get("slurm_job_id"):
        return slurm_job_alive(str(facts["slurm_job_id"]))
    pid, host = facts.get("pid"), facts.get("host")
    if not isinstance(pid, int) or (host and host != hostname()):
        return None
    if not host:  # written before jobs named their host: only a pid alive here running a generation job counts
        return True if pid_alive(pid, JOB_MODULE) else None
    return pid_alive(pid, JOB_MODULE)
