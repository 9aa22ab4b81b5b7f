"""Which Snakemake runs are alive on this workflow's directories, and what a new run does about them.

Contract (called once per Snakemake, by its main process, from ``workflow/rules/common.smk``; nothing here runs
inside a job):

* :func:`claim_run_and_clear_stale_locks` -- recovery after Snakemake itself was killed. A ``kill -9`` of
  Snakemake leaves its locks (``.snakemake/locks``) behind, and the next run would stop with "Directory cannot be
  locked" until ``--unlock``. Every Snakemake started on this workflow holds an flock on its own file in
  ``.snakemake/repro-runs/`` for as long as it lives (the kernel drops it when the process dies, however it dies).
  If no other such file is still locked, no Snakemake of this workflow is alive here and any lock left is stale:
  it is removed, saying so (incomplete outputs of the killed run are re-run: the default workflow profile,
  ``profiles/default``, sets rerun-incomplete). If one is alive, a note says that Snakemake may refuse the lock
  and that ``--unlock`` is not the fix; ``--unlock`` itself is refused then (exit 1, naming the run) unless
  ``--force`` is given too.
* :func:`claim_work_and_results_dirs` -- two Snakemake directories on one work directory. Snakemake's locks live in
  the directory it runs in, but the work and results directories need not: ``--directory DIR`` moves
  ``.snakemake`` to DIR while ``work/`` and ``results/`` stay the checkout's, and two checkouts can share one
  ``ORL_EVAL_WORK``. Two such runs cannot see each other's locks and write the same shards (seen: "3 problem(s)
  missing after generation" in one, "Missing files after 5 seconds" in the other). So every run also holds an
  flock on a file of its own, ``<root>/.repro-runs/<pid>.lock`` (JSON: ``pid``, ``directory``, ``host``), in each root; a
  live run there from another directory stops this one at start-up (exit 1, one line per other run naming its
  directory and pid). Runs from the same directory are left to Snakemake's own locks: on different outputs they
  run side by side (docs/workflow.md §7.2).

A dry run (``dry_run``: ``-n`` or any command that runs no job) claims nothing, removes nothing and only says
what a real run would do; ``no_run`` names it in the notes ("dry run", "--unlock (runs no job)", ...).

A file system without file locks (``flock`` fails with another error than "held": Lustre mounted without ``-o
flock``, some FUSE and NFS set-ups) gets one note and no claims there: the checks above are skipped for that
folder, never a start-up traceback, and never a claim read as alive or as stale.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import os
import shutil
import sys
from pathlib import Path

from repro.liveness import hostname, probe_flock

_HELD: list[int] = []  # the descriptors whose flocks mark this run alive: open for the process's lifetime


def _hold(path: Path, content: str = "") -> bool:
    """Create ``path`` holding ``content`` under an exclusive flock kept until this process ends (written and
    locked under a temporary name, then renamed: another run never reads it empty); removed at exit. Returns False,
    with one note and nothing left behind, when the file system has no file locks (module docstring)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.stem}.tmp"
    fd = os.open(tmp, os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError as exc:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        print(f"note: {path.parent} is on a file system without file locks ({exc.strerror or exc}): runs of this "
              "workflow started from other directories on it cannot be detected (do not start two at once), and "
              "locks a killed Snakemake left here are not removed for you (use --unlock once none runs)",
              file=sys.stderr)
        return False
    os.write(fd, content.encode())
    os.replace(tmp, path)
    _HELD.append(fd)
    atexit.register(path.unlink, missing_ok=True)
    return True


def live_claims(folder: Path, mine: Path | None = None, remove_stale: bool = True) -> list[tuple[str, str]]:
    """``[(pid, directory)]`` of the runs holding a claim in ``folder`` now (their flock is held; ``directory``
    is ``"?"`` when the claim does not say, or belongs to another user); claims whose run is gone are removed
    when ``remove_stale``. (repro.liveness.probe_flock tells held from free; ``python -m repro.status`` reads the
    same claims to tell a live run from a stopped one.)"""
    live = []
    for other in sorted(Path(folder).glob("*.lock")) if Path(folder).is_dir() else []:
        if mine is not None and other == mine:
            continue
        state = probe_flock(other)
        if state == "other-user":  # another user's run: treat as alive
            live.append((other.stem, "?"))
        elif state == "held":
            try:
                info = json.loads(other.read_text() or "{}")
            except (OSError, ValueError):
                info = {}
            live.append((str(info.get("pid", other.stem)), str(info.get("directory", "?"))))
        elif state == "free" and remove_stale:
            other.unlink(missing_ok=True)  # its Snakemake is gone
        # "gone": removed meanwhile; "unknown": no file locks here, nothing can be told of this claim
    return live


def claim_run_and_clear_stale_locks(dry_run: bool, no_run: str, unlock: bool = False, force: bool = False) -> None:
    """Claim ``.snakemake/repro-runs/<pid>.lock`` (current directory: Snakemake's) and remove the locks a killed
    Snakemake left; see the module docstring. ``unlock`` (the command is ``--unlock``): while another Snakemake
    of this workflow runs here its locks are live, so the command stops (exit 1, one line naming the run)
    unless ``force`` (``--unlock --force``)."""
    runs = Path(".snakemake/repro-runs")
    mine = runs / f"{os.getpid()}.lock"
    if not dry_run and not _hold(mine):
        return  # no file locks: whether a Snakemake is alive here cannot be told, so no lock is removed
    alive = [pid for pid, _ in live_claims(runs, mine, remove_stale=not dry_run)]
    locks = Path(".snakemake/locks")
    if not (locks.is_dir() and any(locks.iterdir())):
        return
    if alive and unlock and not force:
        print(f"Error: --unlock refused: a Snakemake of this workflow is running here (pid {', '.join(alive)}) and "
              f"holds these locks; unlocking would let a second run write the same files (its jobs then fail with no "
              "reason in the shared log). Wait for it to end (its locks go with it; no --unlock is needed then), "
              "stop it, or, if you know it writes nothing this run needs, add --force", file=sys.stderr)
        sys.exit(1)
    if alive and unlock:
        print(f"note: --unlock --force: removing the locks of the Snakemake running here (pid {', '.join(alive)})",
              file=sys.stderr)
    elif alive:
        print(f"note: another Snakemake of this workflow is running here (pid {', '.join(alive)}); if this run "
              "needs files it is making, Snakemake stops below with 'Directory cannot be locked': wait for it to "
              "end and run again. Snakemake's message then suggests --unlock: do not use it while pid "
              f"{', '.join(alive)} runs (both runs would write the same files); after it ends no --unlock is "
              "needed", file=sys.stderr)
    elif dry_run:
        print(f"note: {no_run}: {locks.resolve()} holds the locks of a Snakemake that was killed (no Snakemake of "
              "this workflow is running here), so Snakemake's dry run below may stop with 'Directory cannot be "
              "locked' and list no jobs. To see the plan: run the same command without -n (it removes those "
              "locks, saying so, and resumes the killed run), or remove them first with the same command plus "
              "--unlock; the dry run removes nothing", file=sys.stderr)
    else:
        shutil.rmtree(locks, ignore_errors=True)
        print(f"note: removed the locks left in {locks.resolve()} by a Snakemake that was killed (no Snakemake "
              "of this workflow is running here); its unfinished jobs are re-run", file=sys.stderr)


def claim_work_and_results_dirs(roots: list[tuple[str, str]], dry_run: bool, no_run: str) -> None:
    """Claim ``<root>/.repro-runs/<pid>.lock`` in each ``(what, root)`` of ``roots`` and stop (exit 1) when a
    live run from another Snakemake directory holds one; see the module docstring."""
    here = os.path.realpath(os.getcwd())
    by_run: dict[tuple[str, str], list[str]] = {}
    for what, root in roots:
        folder = Path(root) / ".repro-runs"
        mine = folder / f"{os.getpid()}.lock"
        claim = {"pid": os.getpid(), "directory": here, "host": hostname()}
        if not dry_run and not _hold(mine, json.dumps(claim)):
            continue
        for pid, d in live_claims(folder, mine, remove_stale=not dry_run):
            if d != here:  # one line per other run, naming each directory it holds
                by_run.setdefault((pid, d), []).append(f"the {what} {root}")
    for (pid, d), held in by_run.items():
        held_txt, verb = " and ".join(held), "are" if len(held) > 1 else "is"
        if dry_run:
            print(f"note: {no_run}: {held_txt} {verb} in use by a Snakemake running in {d} (pid {pid}); a real run "
                  "would stop here until it ends", file=sys.stderr)
        else:
            print(f"Error: {held_txt} {verb} in use by a Snakemake running in {d} (pid {pid}), whose locks this run "
                  f"in {here} cannot see (each directory keeps its own .snakemake/locks), so both would write the "
                  "same files; wait for it to end and run again, run this command from that directory, or give this "
                  "run its own work and results directories (ORL_EVAL_WORK / work_dir, results_dir)",
                  file=sys.stderr)
    if by_run and not dry_run:
        sys.exit(1)
