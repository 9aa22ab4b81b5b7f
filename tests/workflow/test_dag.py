"""The workflow's DAG: the paper suite is complete without running; targets resolve to every stage."""

import re
import subprocess
import sys

from repro.config import REPO_ROOT


def dry_run(*args, env=None):
    r = subprocess.run([sys.executable, "-m", "snakemake", "-n", "main_table", *args], cwd=REPO_ROOT,
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:] + r.stdout[-2000:]
    stats = dict(re.findall(r"^(\w+)\s+(\d+)$", r.stdout, re.M))
    return {k: int(v) for k, v in stats.items()}, r.stdout


def test_paper_suite_dag_lists_every_stage_for_both_models_and_benchmarks(tmp_path):
    stats, out = dry_run("--config", "suite=paper", f"work_dir={tmp_path}")
    assert stats["download_checkpoint"] == 2 and stats["verify_checkpoint"] == 2
    assert stats["prepare_problems"] == 4 and stats["prepare_generation_problems"] == 4
    assert stats["render_decoder"] == 8
    assert stats["generate_shard"] == 8 * 4 and stats["merge_shards"] == 8 and stats["score"] == 8
    assert stats["write_table"] == 1 and stats["main_table"] == 1
    for model in ("llada", "llada-orl"):
        for bench in ("gsm8k", "math500", "humaneval", "mbpp"):
            assert f"/paper/scores/{model}/{bench}/seed12345.summary.json" in out


def test_smoke_suite_dag(tmp_path):
    stats, _ = dry_run("--config", f"work_dir={tmp_path}")
    assert stats["generate_shard"] == 8 and stats["score"] == 12 and stats["download_checkpoint"] == 2
    assert stats["replay_samples"] == 4  # the `reference` row: replayed, never generated (no checkpoint)
