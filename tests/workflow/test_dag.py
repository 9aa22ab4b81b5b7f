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


def test_paper_suite_dag_lists_every_stage_for_every_model_and_benchmark(tmp_path):
    stats, out = dry_run("-p", "--config", "suite=paper", f"work_dir={tmp_path}")
    assert '"reported": true' in out and "repro/tables/reported.json" in out  # the paper's rows, cited
    assert stats["download_checkpoint"] == 3 and stats["verify_checkpoint"] == 3  # base, ORL, ORL NVFP4
    assert stats["prepare_problems"] == 4 and stats["prepare_generation_problems"] == 4
    assert stats["render_decoder"] == 12
    # the paper suite groups benchmarks (config.yaml `group_benchmarks: true`): one generation job per model ×
    # shard over all 4 benchmarks (the model loaded once per job), not one per model × benchmark × shard (48)
    assert stats["generate_group"] == 3 * 4 and "generate_shard" not in stats
    assert stats["merge_shards"] == 12 and stats["score"] == 12
    # the paper suite generates at batch 32 (config.yaml), so its records time requests inside a batch: the speed
    # probe (a generation job at batch 1 over the first 32 problems, no --group-index) adds one job per model ×
    # `speed_benchmarks` (GSM8K, HumanEval: 3 × 2) for the speed table's single-request columns
    assert stats["speed_probe"] == 6
    lines = out.splitlines()
    jobs = [l for l in lines if "repro.backends.generation_job" in l and "--limit " not in l]
    assert len(jobs) == 12 and all("--benchmark gsm8k math500 humaneval mbpp --decoder " in l and "--group-index " in l
                                   and "--batch-size 32 " in l for l in jobs)
    probes = [l for l in lines if "repro.backends.generation_job" in l and "--limit " in l]
    assert len(probes) == 6 and all("--limit 32 " in l and "--batch-size 1 " in l and "--shard 0 --num-shards 1 " in l
                                    for l in probes)
    assert {re.search(r"--out \S+/paper/speed/(\S+)\.jsonl", l).group(1) for l in probes} == {
        f"{m}/{b}" for m in ("llada", "llada-orl", "llada-orl-nvfp4") for b in ("gsm8k", "humaneval")}
    # GPU memory: the batch's 32 KV caches (5120 positions each) on top of the weights; the probe at batch 1
    blocks = [re.match(r"(\w+):", b).group(1) + " " + b for b in re.split(r"^rule ", out, flags=re.M)[1:]]
    res = {(b.split()[0], int(m.group(1))) for b in blocks for m in [re.search(r"gpu_mem_mb=(\d+)", b)] if m}
    assert res == {("generate_group", 45000), ("generate_group", 21000), ("speed_probe", 38000),
                   ("speed_probe", 14000)}, res
    assert stats["write_table"] == 1 and stats["main_table"] == 1
    for model in ("llada", "llada-orl", "llada-orl-nvfp4"):
        for bench in ("gsm8k", "math500", "humaneval", "mbpp"):
            assert f"/paper/scores/{model}/{bench}/seed12345.summary.json" in out


def test_smoke_suite_dag(tmp_path):
    stats, out = dry_run("-p", "--config", f"work_dir={tmp_path}")
    assert '"reported": false' in out and "reported.json" not in out  # no paper rows beside random weights
    # tiny, tiny-orl, tiny-orl-nvfp4 generate; `reference` is replayed
    assert stats["generate_shard"] == 12 and stats["score"] == 16 and stats["download_checkpoint"] == 3
    assert stats["replay_samples"] == 4  # the `reference` row: replayed, never generated (no checkpoint)
    assert "speed_probe" not in stats  # batch 1: the generation records measure single-request speed themselves


def test_model_adapter_map_reaches_its_generation_jobs_only(tmp_path):
    """config.yaml `models.<m>.adapter_map` (docs/adapter_map.md) is an input of that model's generation jobs
    and passed as --adapter-map; other models' jobs get none."""
    amap = tmp_path / "adapter_map.json"
    amap.write_text('{"type": "linear", "tensors": {"down": "a.weight", "up": "b.weight"}}')
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(f"models: {{tiny-orl: {{adapter_map: {amap}}}}}\n")
    _, out = dry_run("-p", "--configfile", str(REPO_ROOT / "config.yaml"), str(overlay), "--config",
                     f"work_dir={tmp_path / 'work'}")
    jobs = [l for l in out.splitlines() if "repro.backends.generation_job" in l]
    mapped = [l for l in jobs if f"--adapter-map {amap}" in l]
    assert len(jobs) == 12 and len(mapped) == 4, out[-3000:]  # tiny-orl × 4 benchmarks
    assert all("--model tiny-orl " in l for l in mapped)


def test_paper_suite_under_sglang_dequantizes_the_nvfp4_model_only(tmp_path):
    """backend sglang: the NVFP4 model's checkpoint is dequantized to BF16 once and verified, and its generation
    jobs read that copy; the BF16 models' jobs read their checkpoints (the engine backend: no copy at all)."""
    stats, out = dry_run("-p", "--config", "suite=paper", "backend=sglang", f"work_dir={tmp_path}")
    assert stats["dequantize_checkpoint"] == 1 and stats["verify_dequantized_checkpoint"] == 1
    # the paper suite groups benchmarks: one generation job per model × shard (3 × 4), each over 4 benchmarks
    assert stats["dequantized_source"] == 1 and stats["generate_group"] == 12 and "generate_shard" not in stats
    assert f"--src {tmp_path}/hf/llada-orl-nvfp4 --out {tmp_path}/dequantized/llada-orl-nvfp4" in out
    jobs = [l for l in out.splitlines() if "repro.backends.generation_job" in l]
    nvfp4 = [l for l in jobs if "--model llada-orl-nvfp4 " in l]
    assert len(nvfp4) == 4 and all(f"--model-dir {tmp_path}/dequantized/llada-orl-nvfp4 " in l and
                                    f"--verified {tmp_path}/verified/dequantized/llada-orl-nvfp4.json" in l
                                    for l in nvfp4)
    assert all(f"--model-dir {tmp_path}/hf/" in l for l in jobs if l not in nvfp4)


def test_speed_probes_get_the_site_gpu_settings_of_generation(tmp_path):
    """The speed probe is a GPU job like generation: a site profile's set-resources for generate_shard (README)
    give it the same partition and GPU model, and it requests one GPU."""
    import yaml

    site = tmp_path / "site"
    site.mkdir()
    (site / "config.yaml").write_text(yaml.safe_dump({
        "default-resources": {"slurm_account": "acct", "slurm_partition": "cpu"},
        "set-resources": {"generate_shard": {"slurm_partition": "gpu", "gpu_model": "h200"}}}))
    _, out = dry_run("--config", "suite=paper", f"work_dir={tmp_path / 'work'}", "--workflow-profile",
                     str(REPO_ROOT / "workflow" / "profiles" / "slurm"), "--profile", str(site))
    probes = [b for b in re.split(r"^rule ", out, flags=re.M) if b.startswith("speed_probe:")]
    assert len(probes) == 6
    assert all(re.search(r"resources: .*\bgpu=1\b", b) and "slurm_partition=gpu" in b and "gpu_model=h200" in b
               for b in probes), probes[0]
