"""Workflow profiles: Snakemake 9 format; dry runs show GPU requests on generation jobs only.

These dry runs use the real Snakefile (so they also fail when the DAG does); ~3 s each.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from plumbing_util import ROOT, env_with_repo

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
PROFILES = ROOT / "workflow" / "profiles"


def _walk(obj):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield k
            yield from _walk(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _walk(v)


@pytest.mark.parametrize("name", ["local", "slurm"])
def test_profile_format(name):
    prof = yaml.safe_load((PROFILES / name / "config.yaml").read_text())
    keys = set(_walk(prof))
    # Snakemake-7 keys are errors in 9; GPU flags never go through slurm_extra
    assert not keys & {"cluster", "cluster-config", "slurm_extra", "gres"}
    if name == "slurm":
        assert prof["executor"] == "slurm"
        # either key would replace a site profile's whole key (account/partition, GPU partition and model)
        assert "default-resources" not in prof and "set-resources" not in prof
    else:
        assert prof["resources"]["gpu"] >= 1  # local GPU jobs are capped, never unbounded


def dry_run(tmp_path, *args):
    env = env_with_repo(ORL_EVAL_WORK=str(tmp_path / "work"))
    env.pop("ORL_EVAL_DATA", None)
    r = subprocess.run([SNAKEMAKE, "-n", "main_table", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    jobs = []
    for block in re.split(r"\n(?=(?:local)?rule \w+:)", r.stdout + r.stderr):
        m = re.match(r"(?:local)?rule (\w+):", block)
        res = re.search(r"^\s+resources: (.*)$", block, re.M)
        if m:
            jobs.append((m.group(1), dict(kv.split("=", 1) for kv in res.group(1).split(", ")) if res else {}))
    return jobs


def test_slurm_profile_paper_suite_gpu_jobs(tmp_path):
    jobs = dry_run(tmp_path, "--config", "suite=paper", "--workflow-profile", str(PROFILES / "slurm"))
    gen = [res for rule, res in jobs if rule == "generate_group"]  # the paper suite groups benchmarks per job
    assert len(gen) == 12
    assert all(res.get("gpu") == "1" and res.get("cpus_per_gpu") == "8" for res in gen)
    cpu_rules = {"score", "merge_shards", "render_decoder", "verify_checkpoint", "main_table"}
    cpu = [(rule, res) for rule, res in jobs if rule in cpu_rules]
    assert {r for r, _ in cpu} >= {"score", "merge_shards"}
    assert all(res.get("gpu", "0") == "0" for _, res in cpu)


def test_slurm_profile_smoke_suite_is_cpu(tmp_path):
    jobs = dry_run(tmp_path, "--workflow-profile", str(PROFILES / "slurm"))
    gen = [res for rule, res in jobs if rule == "generate_shard"]
    assert gen and all(res.get("gpu") == "0" for res in gen)  # CPU by design: no --gpus in sbatch


def test_site_settings_for_generate_shard_reach_grouped_jobs(tmp_path):
    """A site profile names `generate_shard` (README); the paper suite's grouped jobs (`generate_group`) get
    the same partition, GPU model and QOS, and CPU jobs none of it. A key set for generate_group itself wins."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "config.yaml").write_text(yaml.safe_dump({
        "default-resources": {"slurm_account": "acct", "slurm_partition": "cpu"},
        "set-resources": {"generate_shard": {"slurm_partition": "gpu", "gpu_model": "h200", "qos": "long"}}}))
    jobs = dry_run(tmp_path, "--config", "suite=paper", "--workflow-profile", str(PROFILES / "slurm"),
                   "--profile", str(site))
    gen = [res for rule, res in jobs if rule == "generate_group"]
    assert len(gen) == 12 and all(r.get("slurm_partition") == "gpu" and r.get("gpu_model") == "h200"
                                  and r.get("qos") == "long" and r.get("gpu") == "1" for r in gen), gen[:1]
    merges = [res for rule, res in jobs if rule == "merge_shards"]
    assert merges and all(r.get("slurm_partition", "cpu") == "cpu" for r in merges)
    (site / "config.yaml").write_text(yaml.safe_dump({  # (a --set-resources option would replace the key)
        "default-resources": {"slurm_account": "acct", "slurm_partition": "cpu"},
        "set-resources": {"generate_shard": {"slurm_partition": "gpu", "gpu_model": "h200", "qos": "long"},
                          "generate_group": {"slurm_partition": "gpu2"}}}))
    jobs = dry_run(tmp_path, "--config", "suite=paper", "--workflow-profile", str(PROFILES / "slurm"),
                   "--profile", str(site))
    gen = [res for rule, res in jobs if rule == "generate_group"]
    assert gen and all(r.get("slurm_partition") == "gpu2" and r.get("qos") == "long" and r.get("gpu_model") == "h200"
                       for r in gen), gen[:1]
