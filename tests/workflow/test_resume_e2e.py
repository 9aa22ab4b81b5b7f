"""End to end through Snakemake on the tiny model: kill -9 of Snakemake mid-generation leaves no orphaned
generation process, and the same command again gives every problem exactly once; a finished DAG reruns nothing; deleting one generation output re-runs only it and its
downstream jobs. Real problems (GSM8K) from the shared data directory."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from repro.config import REPO_ROOT

pytestmark = pytest.mark.slow


def snakemake(work, overlay, *args, check=True, timeout=600):
    # --directory keeps Snakemake's metadata and locks in the test's own folder, not the checkout's
    cmd = [sys.executable, "-m", "snakemake", *args, "--cores", "2", "--snakefile", str(REPO_ROOT / "Snakefile"),
           "--directory", str(work.parent), "--configfile", str(REPO_ROOT / "config.yaml"), str(overlay),
           "--config", f"work_dir={work}"]
    r = subprocess.run(cmd, cwd=work.parent, capture_output=True, text=True, timeout=timeout)
    if check:
        assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    return r


@pytest.fixture
def setup(tmp_path, data_dir):
    work = tmp_path / "work"
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(json.dumps({
        "data_dir": str(data_dir), "results_dir": str(tmp_path / "results"),
        "suites": {"smoke": {"models": ["tiny-orl"], "benchmarks": ["gsm8k"], "limit": 6,
                             "max_new_tokens": 256}}}))
    gen = work / "smoke/generations/tiny-orl/gsm8k/seed12345.jsonl"
    shard = work / "smoke/generations/tiny-orl/gsm8k/seed12345/shard0of1.jsonl"
    return work, overlay, gen, shard


def generation_processes(shard: Path) -> list[int]:
    """Pids of live generation jobs writing ``shard`` (any parent)."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if "repro.backends.generation_job" in cmd and str(shard) in cmd:
                pids.append(int(d.name))
    return pids


def test_kill9_of_snakemake_then_the_same_command_recovers(setup):
    """kill -9 of Snakemake alone (not its jobs): the generation job dies with it, and rerunning the very
    same command (no --unlock, no --rerun-incomplete) finishes with every problem exactly once."""
    work, overlay, gen, shard = setup
    target = str(gen)
    cmd = [sys.executable, "-m", "snakemake", target, "--cores", "2", "--snakefile", str(REPO_ROOT / "Snakefile"),
           "--directory", str(work.parent), "--configfile", str(REPO_ROOT / "config.yaml"), str(overlay),
           "--config", f"work_dir={work}"]
    p = subprocess.Popen(cmd, cwd=work.parent, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    partial = Path(str(shard) + ".partial.jsonl")
    deadline = time.time() + 300
    killed = False
    try:
        while time.time() < deadline and p.poll() is None:
            if partial.exists() and len(partial.read_text().splitlines()) >= 2:
                assert generation_processes(shard)
                os.kill(p.pid, signal.SIGKILL)  # Snakemake only: its job processes are left to themselves
                killed = True
                break
            time.sleep(0.05)
        p.wait()
        if not killed:
            pytest.skip("generation finished before it could be killed (machine too fast for this check)")
        # no orphans: the generation job notices within a few seconds and stops
        gone = time.time() + 20
        while generation_processes(shard) and time.time() < gone:
            time.sleep(0.2)
        assert generation_processes(shard) == []
    finally:
        for pid in generation_processes(shard):  # never leave a process behind, even on failure
            os.kill(pid, signal.SIGKILL)
    assert not shard.exists() and (work.parent / ".snakemake" / "locks").exists()
    log = work / "logs/generate/smoke/tiny-orl/gsm8k/seed12345/shard0of1.log"
    assert f"Snakemake (pid {p.pid}) has exited: stopping this job" in log.read_text()
    # the same command again: stale locks removed, the incomplete output re-run, resumed from the partial file
    out = snakemake(work, overlay, target).stderr
    assert "removed the locks left" in out, out[-3000:]
    ids = [json.loads(l)["id"] for l in gen.read_text().splitlines()]
    assert ids == [f"gsm8k/{i}" for i in range(6)]


def test_rerun_is_noop_and_deleting_one_output_reruns_only_downstream(setup):
    work, overlay, gen, shard = setup
    snakemake(work, overlay, "main_table")
    again = snakemake(work, overlay, "main_table")
    assert "Nothing to be done" in again.stdout + again.stderr
    shard.unlink()
    dry = snakemake(work, overlay, "-n", "main_table")
    stats = dict(re.findall(r"^(\w+)\s+(\d+)$", dry.stdout + dry.stderr, re.M))
    assert stats == {"generate_shard": "1", "merge_shards": "1", "score": "1", "write_table": "1", "speed_table": "1",
                     "main_table": "1", "total": "6"}
