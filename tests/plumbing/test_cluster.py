"""Slurm submissions through the real workflow, the real `slurm` workflow profile, a site profile and the real
Snakemake Slurm executor plugin, with recording stand-ins for sbatch/sacct/srun (fake_slurm.py).

One tiny GPU suite (the smoke suite with ``device: cuda``), target one generation shard: the checkpoint
verification job really runs through the fake sbatch and the plugin's job step; a generation job (no GPU
here) is recorded and completes by writing its output. ~25 s for the first run, ~8 s for each further one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fake_slurm import env_path, flags, install, submitted
from plumbing_util import ROOT, env_with_repo, run_py

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
SLURM_PROFILE = str(ROOT / "workflow" / "profiles" / "slurm")
SHARD = "smoke/generations/tiny/gsm8k/seed12345/shard0of1.jsonl"


def site_profile(path: Path, body: dict) -> str:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.yaml").write_text(yaml.safe_dump(body))
    return str(path)


def slurm_run(tmp: Path, work: Path, *args: str, cancel="", timeout=240, **extra_env):
    state = tmp / "slurm-state"
    install(tmp / "bin", state)
    overlay = tmp / "gpu_suite.yaml"
    overlay.write_text("suites:\n  smoke:\n    device: cuda\n    precision: bf16\n    limit: 2\n")
    (work / SHARD).unlink(missing_ok=True)
    env = env_with_repo(PATH=env_path(tmp / "bin"), ORL_EVAL_WORK=str(work), FAKE_SLURM_RUN="1",
                        FAKE_SLURM_CANCEL=cancel, FAKE_SLURM_TOUCH_RULE="generate_shard",
                        FAKE_SLURM_TOUCH=str(work / SHARD), **extra_env)
    env.pop("ORL_EVAL_DATA", None)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    r = subprocess.run([SNAKEMAKE, str(work / SHARD), "--workflow-profile", SLURM_PROFILE,
                        "--configfile", str(ROOT / "config.yaml"), str(overlay),
                        "--slurm-init-seconds-before-status-checks", "1", *args],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    return r, submitted(state)


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """Site profile: account + CPU partition + a GPU model for all jobs (default-resources); the GPU
    partition and model for generation only (set-resources). The first generation job is cancelled
    (sacct: `CANCELLED by 0`)."""
    tmp = tmp_path_factory.mktemp("slurm1")
    site = site_profile(tmp / "site", {
        "default-resources": {"slurm_account": "testacct", "slurm_partition": "cpu", "gpu_model": "a100"},
        "set-resources": {"generate_shard": {"slurm_partition": "gpu", "gpu_model": "h200"}},
    })
    r, jobs = slurm_run(tmp, tmp / "work", "--profile", site, cancel="rule_generate_shard")
    return tmp, r, jobs


def test_site_profile_partition_and_gpu_model_reach_generation_only(first_run):
    _, r, jobs = first_run
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    gen = [flags(j["argv"]) for j in jobs if j["rule"] == "generate_shard"]
    ver = [flags(j["argv"]) for j in jobs if j["rule"] == "verify_checkpoint"]
    assert gen and ver
    for f in gen:
        assert f["-p"] == "gpu" and f["-A"] == "testacct"
        assert f["--gpus"] == "h200:1" and f["--cpus-per-gpu"] == "8"
        assert "--gres" not in f and "--cpus-per-task" not in f
    for f in ver:  # the site-wide gpu_model (a100) never turns a CPU job into a GPU request
        assert f["-p"] == "cpu" and f["-A"] == "testacct"
        assert "--gpus" not in f and "--gres" not in f


def test_cancelled_job_is_reported_and_retried_with_more_memory(first_run):
    tmp, r, jobs = first_run
    gen = [j for j in jobs if j["rule"] == "generate_shard"]
    assert [j["state"] for j in gen] == ["CANCELLED by 0", "COMPLETED"], r.stderr[-3000:]
    out = r.stdout + r.stderr
    assert f"SLURM-job '{gen[0]['id']}' failed" in out and "CANCELLED" in out
    assert r.returncode == 0 and (tmp / "work" / SHARD).is_file()  # the retry ran; the run finished
    # an out-of-memory or timed-out job's retry asks for more
    assert [int(flags(j["argv"])["--mem"]) for j in gen] == [64000, 128000]
    assert [int(flags(j["argv"])["-t"]) for j in gen] == [60, 120]


@pytest.mark.parametrize("how", ["profile", "command line"])
def test_gres_site_gets_gres_only(first_run, tmp_path, how):
    """A site that only accepts --gres: `gres` in the site profile or on the command line replaces --gpus,
    and --cpus-per-gpu stays (generation only; the checkpoint was verified by the first run)."""
    tmp, _, _ = first_run
    base = {"default-resources": {"slurm_account": "testacct", "slurm_partition": "cpu", "gpu_model": "a100"}}
    if how == "profile":
        base["set-resources"] = {"generate_shard": {"slurm_partition": "gpu", "gres": "gpu:1"}}
        args = ["--profile", site_profile(tmp_path / "site", base)]
    else:
        args = ["--profile", site_profile(tmp_path / "site", base), "--set-resources", "generate_shard:gres=gpu:1"]
    r, jobs = slurm_run(tmp_path, tmp / "work", *args)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert [j["rule"] for j in jobs] == ["generate_shard"]
    f = flags(jobs[0]["argv"])
    assert f["--gres"] == "gpu:1" and "--gpus" not in f and f["--cpus-per-gpu"] == "8"


def test_site_memory_per_cpu_and_overridden_site_values(first_run, tmp_path):
    """A site's `mem_mb_per_cpu` for all jobs never replaces the memory a job declares (the plugin would send
    --mem-per-cpu and drop --mem: plugin #75); a site value the workflow profile replaces (latency-wait) and a
    --set-resources on the command line that drops the site's set-resources are each named at start-up."""
    tmp, _, _ = first_run
    site = site_profile(tmp_path / "site", {
        "default-resources": {"slurm_account": "testacct", "slurm_partition": "cpu", "mem_mb_per_cpu": 1000},
        "set-resources": {"verify_checkpoint": {"runtime": 10}},
        "latency-wait": 300,
    })
    r, jobs = slurm_run(tmp_path, tmp / "work", "--profile", site, "--set-resources",
                        "generate_shard:slurm_partition=gpu")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    f = flags(jobs[0]["argv"])
    assert jobs[0]["rule"] == "generate_shard" and f["--mem"] == "64000" and "--mem-per-cpu" not in f
    assert f["-A"] == "testacct" and f["-p"] == "gpu"
    warn = [l for l in r.stderr.splitlines() if l.startswith("Warning: ")]
    assert any("sets latency-wait: 60, which replaces latency-wait: 300" in l and "--latency-wait 300" in l
               for l in warn), r.stderr[-3000:]
    assert any("--set-resources on the command line replaces" in l and "verify_checkpoint:runtime=10" in l
               for l in warn), r.stderr[-3000:]
    # what the run keeps is not reported: no warning once the command line repeats the site's values
    from repro import cluster

    argv = ["snakemake", "--workflow-profile", SLURM_PROFILE, "--profile", site, "--latency-wait", "300",
            "--default-resources", "slurm_account=testacct", "slurm_partition=cpu", "mem_mb_per_cpu=1000"]
    assert cluster.profile_warnings(argv, {}, ROOT) == []
    lost = cluster.profile_warnings(argv[:-2] + ["mem_mb=100"], {}, ROOT)
    assert len(lost) == 1 and "loses mem_mb_per_cpu=1000, slurm_partition=cpu." in lost[0]


def test_slurm_without_accounting_polls_with_squeue_or_stops(first_run, tmp_path):
    """sacct fails without slurmdbd and the plugin would poll it forever (plugin #38): the run switches to
    squeue when MinJobAge keeps finished jobs visible long enough, else it stops at once naming the fix."""
    tmp, _, _ = first_run
    site = site_profile(tmp_path / "site", {"default-resources": {"slurm_account": "testacct"}})
    r, jobs = slurm_run(tmp_path, tmp / "work", "--profile", site, timeout=120, FAKE_SLURM_NO_ACCOUNTING="1")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "Note: Slurm accounting is disabled" in r.stderr and [j["rule"] for j in jobs] == ["generate_shard"]
    calls = [json.loads(l)["tool"] for l in (tmp_path / "slurm-state" / "calls.jsonl").read_text().splitlines()]
    assert "squeue" in calls
    r, jobs = slurm_run(tmp_path / "stop", tmp / "work", "--profile", site, timeout=120,
                        FAKE_SLURM_NO_ACCOUNTING="1", FAKE_SLURM_MIN_JOB_AGE="2")
    err = [l for l in r.stderr.splitlines() if l.startswith("Error: ")]
    assert r.returncode != 0 and not jobs and len(err) == 1, r.stderr[-3000:]
    assert "snakemake-executor-plugin-slurm/issues/38" in err[0] and "lower --slurm-init-seconds-before-status-checks to 0" in err[0]


def test_snakemake7_profile_says_what_replaced_it(tmp_path):
    old = site_profile(tmp_path / "old", {"cluster": "sbatch -p gpu --mem {resources.mem_mb}", "jobs": 10})
    env = env_with_repo(ORL_EVAL_WORK=str(tmp_path / "work"))
    r = subprocess.run([SNAKEMAKE, "-n", "--profile", old], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=120)
    err = r.stdout + r.stderr
    assert r.returncode != 0 and "MissingRuleException" not in err
    assert "`cluster:` is a Snakemake 7 profile key" in err and "executor: slurm" in err
    # with a target, Snakemake's argument parser stops first: the scripts check profiles before calling it
    r = run_py(["-m", "repro.cluster", "check-profile", old, SLURM_PROFILE])
    assert r.returncode == 2 and r.stderr.count("Profile error:") == 1 and "executor: slurm" in r.stderr
    assert run_py(["-m", "repro.cluster", "check-profile", SLURM_PROFILE]).returncode == 0
    # a profile that does not exist (folder, file, or a folder without config.yaml): one line, exit 2
    (tmp_path / "empty").mkdir()
    for missing, says in ((tmp_path / "nonexist", "no such profile file or folder"),
                          (tmp_path / "nonexist.yaml", "no such profile file or folder"),
                          (tmp_path / "empty", "this folder holds no config.yaml")):
        r = run_py(["-m", "repro.cluster", "check-profile", str(missing)])
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"Profile error: {missing}: {says}"), r.stderr
    # the wrapper scripts' shared run(): stops before calling Snakemake (`true` stands in for it here)
    script = f'source {ROOT}/scripts/_snakemake_common.sh; run true main_table --profile {old}; echo started'
    r = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Profile error:" in r.stderr and "started" not in r.stdout


def test_gpu_requirement_from_the_checkpoint(tmp_path):
    """The real model's shape and weight size (a sparse 32.6 GB file): ~37.9 GB; a 24 GB card and a card
    without bf16 are refused with the numbers, an 80 GB H100 accepted."""
    from repro import cluster

    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 20, "num_key_value_heads": 4,
                                                      "head_dim": 128, "max_position_embeddings": 32768}))
    with open(tmp_path / "model.safetensors", "wb") as f:
        f.truncate(32_600_000_000)
    need = cluster.gpu_need_bytes(tmp_path)
    assert 37.5e9 < need < 38.5e9
    assert need / 1e6 <= cluster.gpu_memory_need_mb({"type": "hf"}, "bf16") == 38_000  # what the rule declares
    assert cluster.gpu_memory_need_mb({"type": "hf"}, "nvfp4-w4a16") == 14_000
    # the NVFP4 checkpoint (10.6 GB of files): ~14 GB kept in 4 bits, ~38 GB dequantized to bf16 at load
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "quantization_config": {"quant_algo": "NVFP4"}}))
    with open(tmp_path / "model.safetensors", "wb") as f:
        f.truncate(10_600_000_000)
    assert 13e9 < cluster.gpu_need_bytes(tmp_path, "nvfp4-w4a16") < 14e9
    assert 37.5e9 < cluster.gpu_need_bytes(tmp_path, "bf16") < 38.5e9
    assert cluster.gpu_problem("NVIDIA H100 80GB HBM3", 80 * 2**30, (9, 0), need, "bf16") is None
    small = cluster.gpu_problem("NVIDIA A10", 24 * 10**9, (8, 6), need, "bf16")
    assert "24.0 GB" in small and "37.9 GB" in small and "at least 38 GB" in small
    assert ">= 8.0, bf16" in cluster.gpu_problem("Tesla V100-SXM2-32GB", 80 * 10**9, (7, 0), need, "bf16")
    assert cluster.gpu_problem("Tesla V100", 80 * 10**9, (7, 0), need, "fp32") is None
    assert ">= 10.0, native FP4" in cluster.gpu_problem("NVIDIA H200", 141 * 10**9, (9, 0), need, "nvfp4")


def test_binds_env_and_states(tmp_path):
    from repro import cluster

    real = tmp_path / "scratch" / "work"
    real.mkdir(parents=True)
    (tmp_path / "work").symlink_to(real)
    specs = cluster.bind_specs([tmp_path / "work", tmp_path / "work" / "sub", tmp_path / "results"])
    assert specs == [str(tmp_path / "results"), f"{real}:{tmp_path / 'work'}"]
    args = cluster.add_binds("--nv --bind /a", ["/a", "/b"])
    assert args == "--nv --bind /a --bind /b" and cluster.add_binds(args, ["/a", "/b"]) == args
    # a space or a comma in a path: shell-quoted, --mount with CSV fields for the comma (and for a colon)
    odd = tmp_path / "a b" / "c,d"
    odd.mkdir(parents=True)
    spaced = cluster.bind_args([tmp_path / "a b"])
    assert spaced == [f"--bind '{tmp_path / 'a b'}'"]
    assert cluster.bind_args([odd]) == [f"""--mount 'type=bind,"src={odd}","dst={odd}"'"""]
    args = cluster.add_binds("--nv", spaced + cluster.bind_args([odd]))
    assert cluster.add_binds(args, spaced + cluster.bind_args([odd])) == args  # the job step adds nothing
    import shlex

    assert shlex.split(args)[1:] == ["--bind", str(tmp_path / "a b"), "--mount", f'type=bind,"src={odd}","dst={odd}"']
    env = {"CUDA_VISIBLE_DEVICES": "1", "HF_HOME": "/h", "PATH": "/x", "HF_HUB_OFFLINE": ""}
    assert cluster.container_env(env, "/usr/bin/apptainer") == {"APPTAINERENV_CUDA_VISIBLE_DEVICES": "1",
                                                                "APPTAINERENV_HF_HOME": "/h"}
    assert "SINGULARITYENV_CUDA_VISIBLE_DEVICES" in cluster.container_env(env, "/opt/bin/singularity")
    assert [cluster.normalise_slurm_state(s) for s in ("CANCELLED by 0", "RUNNING", "COMPLETED", "")] == \
        ["CANCELLED", "RUNNING", "COMPLETED", ""]
    argv = ["snakemake", "-n", "--profile", "old", "--workflow-profile=wf"]
    assert cluster.profiles_from_argv(argv, {"SNAKEMAKE_PROFILE": "env"}) == ["env", "old", "wf"]


def test_status_patch_normalises_states_and_warns_when_the_plugin_changed(monkeypatch, capsys):
    """The wrapper reduces every state the plugin's status query returns to its keyword; a plugin release
    without that query is not patched silently: one warning line says what may hang and the fix."""
    import asyncio
    import types

    from repro import cluster

    async def query_job_status(command, logger):
        return {"7": "CANCELLED by 0", "8": "RUNNING", "9": "COMPLETED+"}, 0.1

    fake = types.ModuleType("snakemake_executor_plugin_slurm")
    fake.query_job_status = query_job_status
    monkeypatch.setitem(sys.modules, "snakemake_executor_plugin_slurm", fake)
    assert cluster.patch_slurm_status_query() and cluster.patch_slurm_status_query()  # idempotent
    states, _ = asyncio.run(fake.query_job_status("sacct ...", None))
    assert states == {"7": "CANCELLED", "8": "RUNNING", "9": "COMPLETED"}
    assert capsys.readouterr().err == ""
    changed = types.ModuleType("snakemake_executor_plugin_slurm")
    changed.__version__ = "9.9.9"
    monkeypatch.setitem(sys.modules, "snakemake_executor_plugin_slurm", changed)
    assert cluster.patch_slurm_status_query() is False
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "9.9.9 has no query_job_status" in err[0] and "pin the release" in err[0]
    # the installed plugin (the pinned release) is patched, without a warning
    r = run_py(["-c", "from repro import cluster; raise SystemExit(0 if cluster.patch_slurm_status_query() else 1)"])
    assert r.returncode == 0 and r.stderr == "", r.stderr
