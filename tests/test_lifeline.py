"""A generation job dies with the Snakemake that started it (repro.backends.lifeline): a stand-in "Snakemake"
process runs the job through `bash -c` (as Snakemake does) and is killed with SIGKILL; the job, whose direct
parent (bash) lives on, must notice within seconds and exit, saying why."""

import os
import signal
import subprocess
import sys
import textwrap
import time

from repro.config import REPO_ROOT


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def test_job_exits_when_snakemake_is_killed(tmp_path):
    job = tmp_path / "job.py"
    job.write_text(textwrap.dedent("""
        import os, sys, time
        from repro.backends.lifeline import die_with_parent
        print(die_with_parent(poll_s=0.1), os.getpid(), flush=True)
        time.sleep(60)
    """))
    log = tmp_path / "job.log"
    # "Snakemake": exports its pid like the workflow does and runs the job in `bash -c ... || ...`
    parent = textwrap.dedent(f"""
        import os, subprocess, sys, time
        os.environ["REPRO_SNAKEMAKE_PID"] = str(os.getpid())
        subprocess.Popen(["bash", "-c", "{sys.executable} {job} > {log} 2>&1 || true"])
        time.sleep(60)
    """)
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    snakemake = subprocess.Popen([sys.executable, "-c", parent], env=env, start_new_session=True)
    try:
        deadline = time.time() + 30
        while time.time() < deadline and not (log.exists() and log.read_text().strip()):
            time.sleep(0.05)
        watched, job_pid = map(int, log.read_text().split()[:2])
        assert watched == snakemake.pid and alive(job_pid)
        os.kill(snakemake.pid, signal.SIGKILL)  # Snakemake alone; bash and the job are left running
        snakemake.wait()
        deadline = time.time() + 10
        while alive(job_pid) and time.time() < deadline:
            time.sleep(0.05)
        assert not alive(job_pid)
        assert f"Snakemake (pid {snakemake.pid}) has exited: stopping this job" in log.read_text()
    finally:
        try:
            os.killpg(snakemake.pid, signal.SIGKILL)  # whatever is left of this test's process group
        except ProcessLookupError:
            pass



def test_a_job_run_by_hand_is_left_alone(monkeypatch):
    """No $REPRO_SNAKEMAKE_PID (not started by the workflow, e.g. under nohup): nothing is set up."""
    from repro.backends import lifeline

    calls = []
    monkeypatch.setattr(lifeline.ctypes, "CDLL", lambda *a, **k: calls.append(a))
    for value in (None, "", "not-a-pid", "1"):
        if value is None:
            monkeypatch.delenv(lifeline.ENV_VAR, raising=False)
        else:
            monkeypatch.setenv(lifeline.ENV_VAR, value)
        assert lifeline.die_with_parent() is None
    assert calls == []  # no death signal requested
