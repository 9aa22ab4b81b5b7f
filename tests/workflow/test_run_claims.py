"""workflow/run_claims.py on a file system without file locks (Lustre without ``-o flock``, some FUSE / NFS set-ups):
one note, no claim, no lock removed, never a start-up traceback; and with locks, a live claim from another directory
stops the run."""
import contextlib
import errno
import fcntl
import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workflow"))
import run_claims  # noqa: E402


@pytest.fixture
def no_locks(monkeypatch):
    def flock(fd, op):
        raise OSError(errno.ENOSYS, "Function not implemented")
    monkeypatch.setattr(run_claims.fcntl, "flock", flock)
    monkeypatch.setattr(run_claims, "_HELD", [])


def test_no_file_locks_keeps_snakemakes_locks_and_claims_nothing(tmp_path, monkeypatch, no_locks, capsys):
    monkeypatch.chdir(tmp_path)
    locks = tmp_path / ".snakemake" / "locks"
    locks.mkdir(parents=True)
    (locks / "0.output.lock").write_text("x")
    run_claims.claim_run_and_clear_stale_locks(dry_run=False, no_run="")
    assert (locks / "0.output.lock").is_file()  # whether a Snakemake is alive cannot be told: nothing removed
    assert not list((tmp_path / ".snakemake" / "repro-runs").glob("*"))  # no claim, no temporary file left
    assert "without file locks" in capsys.readouterr().err


def test_no_file_locks_on_the_work_directory_does_not_stop_the_run(tmp_path, no_locks, capsys):
    work, res = tmp_path / "work", tmp_path / "results"
    other = work / ".repro-runs"
    other.mkdir(parents=True)
    (other / "99999.lock").write_text(json.dumps({"pid": 99999, "directory": "/elsewhere"}))
    run_claims.claim_work_and_results_dirs([("work directory", str(work)), ("results directory", str(res))],
                                           dry_run=False, no_run="")
    err = capsys.readouterr().err
    assert err.count("without file locks") == 2 and "Error" not in err
    assert (other / "99999.lock").is_file()  # an unreadable claim is neither alive nor removed


class _OtherRun:
    """The open, flocked file descriptor of another run's claim; :meth:`end` closes it (that run is gone)."""

    def __init__(self, fd: int):
        self.fd = fd

    def end(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


@contextlib.contextmanager
def another_run(runs: Path, directory, monkeypatch):
    """Another live run (pid 4242) of ``directory`` holds a claim in the folder ``runs``: ``runs/4242.lock`` names
    it and is flocked, as that run holds it; run_claims' own held claims start empty. Yields an :class:`_OtherRun`;
    on exit its fd and every claim run_claims took meanwhile are closed."""
    monkeypatch.setattr(run_claims, "_HELD", [])
    runs.mkdir(parents=True, exist_ok=True)
    held = runs / "4242.lock"
    held.write_text(json.dumps({"pid": 4242, "directory": str(directory)}))
    run = _OtherRun(os.open(held, os.O_RDONLY))
    fcntl.flock(run.fd, fcntl.LOCK_EX)
    try:
        yield run
    finally:
        run.end()
        for fd in run_claims._HELD:
            os.close(fd)


def _snakemake_lock(root: Path) -> Path:
    """A lock file of Snakemake's own in ``root/.snakemake/locks`` (what a running Snakemake holds there)."""
    locks = root / ".snakemake" / "locks"
    locks.mkdir(parents=True)
    (locks / "0.output.lock").write_text("x")
    return locks / "0.output.lock"


def test_a_live_claim_from_another_directory_stops_the_run(tmp_path, monkeypatch, capsys):
    work = tmp_path / "work"
    with another_run(work / ".repro-runs", "/another/checkout", monkeypatch):
        with pytest.raises(SystemExit) as ex:
            run_claims.claim_work_and_results_dirs([("work directory", str(work))], dry_run=False, no_run="")
        assert ex.value.code == 1
        assert "/another/checkout (pid 4242)" in capsys.readouterr().err


def test_a_live_run_here_says_not_to_unlock_while_it_runs(tmp_path, monkeypatch, capsys):
    """Snakemake's 'Directory cannot be locked' ends with "It can be removed with the --unlock argument": the note
    before it names the live run and says --unlock is not the fix while it runs (a fresh user read the two as
    contradictory advice)."""
    monkeypatch.chdir(tmp_path)
    lock = _snakemake_lock(tmp_path)
    with another_run(tmp_path / ".snakemake" / "repro-runs", tmp_path, monkeypatch):
        run_claims.claim_run_and_clear_stale_locks(dry_run=False, no_run="")
        err = " ".join(capsys.readouterr().err.split())
        assert "running here (pid 4242)" in err and "do not use it while pid 4242 runs" in err
        assert lock.is_file()  # a live run's locks are never removed


def test_unlock_while_a_run_is_alive_is_refused_unless_forced(tmp_path, monkeypatch, capsys):
    """`--unlock` while another Snakemake of this workflow runs here would remove its live locks (a second run then
    fails jobs whose shared log shows no reason): refused with one line naming the run; `--force` unlocks."""
    monkeypatch.chdir(tmp_path)
    _snakemake_lock(tmp_path)
    with another_run(tmp_path / ".snakemake" / "repro-runs", tmp_path, monkeypatch) as other:
        with pytest.raises(SystemExit) as ex:
            run_claims.claim_run_and_clear_stale_locks(dry_run=True, no_run="--unlock (runs no job)", unlock=True)
        err = capsys.readouterr().err.strip().splitlines()
        assert ex.value.code == 1 and len(err) == 1 and err[0].startswith("Error: --unlock refused")
        assert "(pid 4242)" in err[0] and "--force" in err[0]
        run_claims.claim_run_and_clear_stale_locks(dry_run=True, no_run="--unlock (runs no job)", unlock=True,
                                                   force=True)
        assert "--unlock --force" in capsys.readouterr().err  # Snakemake's own --unlock then removes them
        other.end()
        run_claims.claim_run_and_clear_stale_locks(dry_run=True, no_run="--unlock (runs no job)", unlock=True)
        assert "Error" not in capsys.readouterr().err  # once the run is gone, --unlock goes ahead


def test_real_snakemake_unlock_is_refused_while_a_run_holds_the_directory(tmp_path, monkeypatch):
    """The same through Snakemake itself (`-d DIR --unlock`, a live run's claim held by this test): exit 1 and the
    locks stay; with `--force` Snakemake unlocks."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    lock = _snakemake_lock(tmp_path)
    env = dict(os.environ, ORL_EVAL_WORK=str(tmp_path / "work"), PYTHONPATH=str(root))
    cmd = [str(Path(sys.executable).with_name("snakemake")), "-s", str(root / "Snakefile"), "-d", str(tmp_path),
           "--unlock"]
    with another_run(tmp_path / ".snakemake" / "repro-runs", tmp_path, monkeypatch):
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 1 and "Error: --unlock refused" in r.stderr and "(pid 4242)" in r.stderr, r.stderr
        assert lock.is_file()
        r = subprocess.run(cmd + ["--force"], env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0 and "Unlocked working directory" in r.stdout + r.stderr, r.stderr
        assert not lock.exists()
