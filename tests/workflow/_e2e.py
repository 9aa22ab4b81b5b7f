"""Scaffolding of the end-to-end workflow tests (real Snakemake, the tiny model, real benchmark problems).

* :class:`Workflow`: a run of this checkout's Snakefile in a folder of its own (``--directory``: Snakemake's
  metadata and locks stay there, not in the checkout), with the suite's benchmark files copied from the shared
  data into ``root/data`` (a test may edit them) and an overlay config that puts data, work and results under
  ``root``; ``run(*args)`` runs Snakemake and returns its output, ``kill_mid_generation(...)`` starts it and
  kills it with SIGKILL while it generates, ``interrupt_mid_generation(...)`` sends it a Ctrl-C (SIGINT to its
  process group) then.
  ``copy_to(dest)`` copies such a run as ``cp -a`` does (the shared smoke run of conftest.py is handed out so).
* :func:`checkout_copy`: a checkout of the workflow of a test's own (entries linked or copied), for a test that
  runs Snakemake in it or changes its files.
* :func:`generation_processes`: the live generation jobs writing a given file.
* :func:`job_counts`: the job table of a dry run (``{"rule": count, ..., "total": n}``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from repro.config import REPO_ROOT

#: the suite of the shared smoke run (conftest.py ``smoke_run``): the tiny model, one GSM8K and one HumanEval
#: problem, 8 new tokens
SMOKE_SUITE = {"models": ["tiny"], "benchmarks": ["gsm8k", "humaneval"], "limit": 1, "max_new_tokens": 8}


def checkout_copy(root: Path, link: tuple[str, ...] = (), copy: tuple[str, ...] = ()) -> Path:
    """``root``/checkout, made for a test: each entry of ``link`` a symlink to this checkout's, each of ``copy``
    a copy (a folder without ``__pycache__``). Returns the new checkout's path."""
    dest = Path(root) / "checkout"
    dest.mkdir()
    for name in link:
        os.symlink(REPO_ROOT / name, dest / name)
    for name in copy:
        if (REPO_ROOT / name).is_dir():
            shutil.copytree(REPO_ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy(REPO_ROOT / name, dest / name)
    return dest


def generation_processes(marker: Path) -> list[int]:
    """Pids of live generation jobs (``repro.backends.generation_job``, any parent) whose command line names
    ``marker`` (a shard file, or a grouped job's index)."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if "repro.backends.generation_job" in cmd and str(marker) in cmd:
                pids.append(int(d.name))
    return pids


def job_counts(out: str) -> dict[str, int]:
    """The job table Snakemake prints (a dry run's ``rule  count`` lines, ``total`` included)."""
    return {k: int(v) for k, v in re.findall(r"^(\w+)\s+(\d+)$", out, re.M)}


class Workflow:
    """This checkout's workflow run in ``root`` (module docstring). ``suite``: the smoke suite's settings for
    this test (models, benchmarks, limit, ...); the benchmark files it names are copied from ``data_dir``.
    ``target``: what a run without arguments builds (Snakemake's default target when None). ``extra``: more
    top-level keys of the overlay (e.g. ``models``)."""

    def __init__(self, root: Path, data_dir: Path, suite: dict, target: str | Path | None = None,
                 extra: dict | None = None):
        self.root = Path(root)
        self.data, self.work, self.results = self.root / "data", self.root / "work", self.root / "results"
        self.data.mkdir(exist_ok=True)
        for b in suite["benchmarks"]:
            (self.data / f"{b}.jsonl").write_bytes((Path(data_dir) / f"{b}.jsonl").read_bytes())
        self.overlay = self.root / "overlay.json"
        self.suite, self.extra = suite, extra
        self.configure(suite, extra)
        self.target = [str(target)] if target is not None else []
        self.env = dict(os.environ, OMP_NUM_THREADS="1")

    @classmethod
    def existing(cls, root: Path, suite: dict, target: str | Path | None = None,
                 extra: dict | None = None) -> "Workflow":
        """The workflow already set up in ``root`` (its data files kept as they are; the overlay rewritten)."""
        wf = cls.__new__(cls)
        wf.root = Path(root)
        wf.data, wf.work, wf.results = wf.root / "data", wf.root / "work", wf.root / "results"
        wf.overlay = wf.root / "overlay.json"
        wf.suite, wf.extra = suite, extra
        wf.configure(suite, extra)
        wf.target = [str(target)] if target is not None else []
        wf.env = dict(os.environ, OMP_NUM_THREADS="1")
        return wf

    def copy_to(self, dest: Path) -> "Workflow":
        """A copy of this run in ``dest`` (data, work and results, mtimes kept, as ``cp -a``; not Snakemake's own
        ``.snakemake`` folder, whose records name this run's absolute paths), its overlay naming the copy's
        folders. The job records kept inside the work and results folders travel with it, so the copy is up to
        date but for the tables (a table's record names the work directory it read, which moved)."""
        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=True)
        for name in ("data", "work", "results"):
            shutil.copytree(self.root / name, dest / name, symlinks=True)
        target = self.target[0] if self.target else None
        return Workflow.existing(dest, self.suite, target=target, extra=self.extra)

    def configure(self, suite: dict, extra: dict | None = None) -> None:
        """(Re)write the overlay: the smoke suite's settings ``suite``, ``extra`` top-level keys, and data, work
        and results under ``root`` (the next run reads it; the data files are left as they are)."""
        self.overlay.write_text(json.dumps({
            **(extra or {}), "data_dir": str(self.data), "results_dir": str(self.results), "work_dir": str(self.work),
            "suites": {"smoke": suite}}))

    def cmd(self, *args: str) -> list[str]:
        """The Snakemake command line: the default target (if any), ``args``, two cores, this checkout's
        Snakefile and config.yaml + the overlay, ``root`` as the working directory."""
        return [sys.executable, "-m", "snakemake", *self.target, *args, "--cores", "2",
                "--snakefile", str(REPO_ROOT / "Snakefile"), "--directory", str(self.root),
                "--configfile", str(REPO_ROOT / "config.yaml"), str(self.overlay)]

    def run(self, *args: str, check: bool = True, timeout: int = 600) -> str:
        """Run Snakemake to the end; its stdout + stderr (its exit status in ``self.returncode``). ``check``:
        assert it succeeded (the assertion shows the output's last 3,000 characters)."""
        r = subprocess.run(self.cmd(*args), cwd=self.root, capture_output=True, text=True, timeout=timeout,
                           env=self.env)
        out, self.returncode = r.stdout + r.stderr, r.returncode
        if check:
            assert r.returncode == 0, out[-3000:]
        return out

    def interrupt_mid_generation(self, partial: Path, records: int, *args: str, timeout: float = 300) -> str:
        """Start Snakemake (with ``args``, as :meth:`cmd`) in a session of its own; once ``partial`` holds ``records``
        complete records, send SIGINT to its whole process group, as a terminal's Ctrl-C does. Returns its output
        (stdout + stderr) once it has ended; skips the test when generation finished first."""
        p = subprocess.Popen(self.cmd(*args), cwd=self.root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True, env=self.env)
        deadline, sent = time.time() + timeout, False
        try:
            while time.time() < deadline and p.poll() is None:
                if partial.exists() and partial.read_text().count("\n") >= records:
                    os.killpg(p.pid, signal.SIGINT)
                    sent = True
                    break
                time.sleep(0.05)
            out, _ = p.communicate(timeout=120)
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        if not sent:
            pytest.skip("generation finished before it could be interrupted (machine too fast for this check)")
        self.returncode = p.returncode
        return out

    def kill_mid_generation(self, partial: Path, records: int, marker: Path, *args: str,
                            timeout: float = 300, before_kill=None) -> int:
        """Start Snakemake (with ``args``, as :meth:`cmd`); once ``partial`` holds ``records`` complete records,
        while a generation job naming ``marker`` runs, SIGKILL Snakemake alone (its jobs are left to themselves:
        they must die with it, repro.backends.lifeline). Asserts that no such job is left 20 s later (any left
        is killed, also when the test fails); skips the test when generation finished before the kill.
        ``before_kill()``, when given, is called once the records are there, Snakemake and the job still alive.
        Returns the killed Snakemake's pid."""
        p = subprocess.Popen(self.cmd(*args), cwd=self.root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True, env=self.env)
        deadline, killed = time.time() + timeout, False
        try:
            while time.time() < deadline and p.poll() is None:
                if partial.exists() and partial.read_text().count("\n") >= records:
                    assert generation_processes(marker)
                    if before_kill is not None:
                        before_kill()
                    os.kill(p.pid, signal.SIGKILL)
                    killed = True
                    break
                time.sleep(0.05)
            p.wait()
            if not killed:
                pytest.skip("generation finished before it could be killed (machine too fast for this check)")
            gone = time.time() + 20  # the job notices within a few seconds that its Snakemake is gone
            while generation_processes(marker) and time.time() < gone:
                time.sleep(0.2)
            assert generation_processes(marker) == []
        finally:  # never leave a process behind, even on failure
            if p.poll() is None:
                p.kill()
                p.wait()
            for pid in generation_processes(marker):
                os.kill(pid, signal.SIGKILL)
        return p.pid
