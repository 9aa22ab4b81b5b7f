"""A run whose GPU jobs would execute on a machine without a CUDA GPU stops before any job starts (so before the
paper suite's checkpoint downloads, tens of GB) with one line naming the way out (repro/cluster.py:
gpu_preflight_problem, workflow/rules/cluster.smk: onstart)."""

import os
import re
import subprocess
import sys

import pytest

from repro import cluster
from repro.config import REPO_ROOT

JOBS = ["generate_group (suite paper)", "generate_group (suite paper)", "speed_probe (suite paper)"]


def test_refused_only_for_local_gpu_jobs_without_a_gpu():
    no_gpu, gpu = (lambda: False), (lambda: True)
    msg = cluster.gpu_preflight_problem(JOBS, True, no_gpu, environ={})
    assert "3 GPU job(s) on this machine, e.g. generate_group (suite paper) (and 2 more)" in msg
    assert "no checkpoint was downloaded" in msg and "--workflow-profile workflow/profiles/slurm" in msg
    assert "suite=smoke" in msg and "REPRO_SKIP_GPU_CHECK=1" in msg
    # every path the message names exists in the repository (it once named profiles/slurm, which does not)
    named = re.findall(r"(?:workflow/profiles/\w+|docs/\w+\.md)", msg)
    assert named and all((REPO_ROOT / p).exists() for p in named), named
    assert cluster.gpu_preflight_problem(JOBS, True, gpu, environ={}) is None  # a GPU here
    assert cluster.gpu_preflight_problem(JOBS, False, no_gpu, environ={}) is None  # a cluster executor runs them
    assert cluster.gpu_preflight_problem([], True, no_gpu, environ={}) is None  # CPU suite, or nothing to generate
    assert cluster.gpu_preflight_problem(JOBS, True, no_gpu, environ={"REPRO_SKIP_GPU_CHECK": "1"}) is None
    # the way out on the CPU fits the run's suite (a fresh user's smoke suite set to cuda was told to run
    # --config suite=smoke)
    msg = cluster.gpu_preflight_problem(JOBS, True, no_gpu, environ={}, suite="smoke")
    assert "set suites.smoke.device back to cpu in config.yaml" in msg and "suite=smoke" not in msg
    msg = cluster.gpu_preflight_problem(JOBS, True, no_gpu, environ={}, suite="paper")
    assert "run the CPU smoke suite (--config suite=smoke; suites.paper.device in config.yaml" in msg
    asked = []
    cluster.gpu_preflight_problem([], True, lambda: asked.append(1) or False, environ={})
    assert not asked  # the GPU is looked for only when GPU jobs would run here


@pytest.mark.skipif(cluster.cuda_here(), reason="this machine has a GPU: the run would start")
def test_paper_run_on_a_cpu_machine_stops_before_any_job(tmp_path):
    work, results = tmp_path / "work", tmp_path / "results"
    env = {k: v for k, v in os.environ.items() if k != "REPRO_SKIP_GPU_CHECK"}
    r = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", "main_table", "--config", "suite=paper",
                        f"work_dir={work}", f"results_dir={results}"], cwd=REPO_ROOT, capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 1, r.stderr[-2000:]
    err = [line for line in r.stderr.splitlines() if line.startswith("Error: ")]
    assert len(err) == 1 and "GPU job(s) on this machine" in err[0] and "Traceback" not in r.stderr
    # nothing ran: no checkpoint download started, no job output anywhere
    assert not any(p.is_file() for p in work.rglob("*") if ".repro-runs" not in p.parts and ".snakemake" not in p.parts)
    assert not results.exists() or not any(p.is_file() for p in results.rglob("*") if ".repro-runs" not in p.parts)
