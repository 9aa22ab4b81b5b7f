"""A model's `tensor_parallel_size` in config.yaml: validated, passed to that model's generation jobs only (as
--tensor-parallel-size N, absent at 1 so existing outputs keep their params), and each such job requests N GPUs."""

import copy
import subprocess
import sys

import pytest
import yaml

from repro.config import REPO_ROOT, ConfigError, validate_config

sys.path.insert(0, str(REPO_ROOT / "tests" / "plumbing"))


def _cfg():
    return yaml.safe_load((REPO_ROOT / "config.yaml").read_text())


def test_tensor_parallel_size_is_validated():
    cfg = _cfg()
    cfg["models"]["tiny"]["tensor_parallel_size"] = 2
    assert validate_config(copy.deepcopy(cfg))["models"]["tiny"]["tensor_parallel_size"] == 2
    cfg["models"]["tiny"]["tensor_parallel_size"] = 0
    with pytest.raises(ConfigError, match="tensor_parallel_size"):
        validate_config(copy.deepcopy(cfg))
    cfg["models"]["tiny"]["tensor_parallel_size"] = 2
    cfg["backend"] = "sglang"
    with pytest.raises(ConfigError, match=r"models.tiny.tensor_parallel_size = 2 needs backend: engine"):
        validate_config(cfg)


def test_generation_jobs_of_that_model_get_the_flag(tmp_path):
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text("models: {tiny-orl: {tensor_parallel_size: 2}}\n")
    r = subprocess.run([sys.executable, "-m", "snakemake", "-n", "-p", "main_table", "--configfile",
                        str(REPO_ROOT / "config.yaml"), str(overlay), "--config", f"work_dir={tmp_path / 'work'}"],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:] + r.stdout[-2000:]
    jobs = [l for l in r.stdout.splitlines() if "repro.backends.generation_job" in l]
    tp = [l for l in jobs if "--tensor-parallel-size 2" in l]
    assert len(jobs) == 12 and len(tp) == 4, r.stdout[-3000:]  # tiny-orl × 4 benchmarks
    assert all("--model tiny-orl " in l for l in tp)
    assert not any("--tensor-parallel-size 1" in l for l in jobs)


def test_a_gpu_job_of_that_model_requests_n_gpus_on_slurm(tmp_path):
    from fake_slurm import flags
    from test_cluster import site_profile, slurm_run

    site = site_profile(tmp_path / "site", {"default-resources": {"slurm_account": "testacct", "slurm_partition": "gpu"}})
    extra = tmp_path / "tp.yaml"
    extra.write_text("models: {tiny: {tensor_parallel_size: 2}}\n")
    r, jobs = slurm_run(tmp_path, tmp_path / "work", "--profile", site, "--configfile", str(REPO_ROOT / "config.yaml"),
                        str(tmp_path / "gpu_suite.yaml"), str(extra))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    gen = [flags(j["argv"]) for j in jobs if j["rule"] == "generate_shard"]
    assert gen and all(f["--gpus"] == "2" and f["--cpus-per-gpu"] == "8" for f in gen), gen
