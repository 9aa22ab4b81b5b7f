"""Cluster and container plumbing for the workflow: site profiles, GPU requests, container env and binds.

Used by ``workflow/rules/cluster.smk`` and ``workflow/rules/images.smk`` (at workflow parse time, in the main
Snakemake process and again in each Slurm job step) and by the scripts, which check site profiles first::

    python -m repro.cluster check-profile DIR_OR_YAML [...]   # exit 2 + one line per Snakemake-7 key or
                                                             # per profile that does not exist

Contract
--------
* Site profiles (the Snakemake 7 keys, profile look-up, the start-up warnings): :mod:`repro.site_profiles`,
  whose names are re-exported here.
* ``normalise_slurm_state("CANCELLED by 0") == "CANCELLED"``: sacct prints who cancelled a job; the Slurm
  executor plugin (<= 2.8.0, the newest release) compares the whole string with its list of failed states,
  does not match, and waits for the job forever. ``patch_slurm_status_query()`` wraps the plugin's status
  query so every state is reduced to its first word (idempotent; a no-op without the plugin).
* ``slurm_status_decision(...)`` (at start-up, Slurm executor only): with Slurm accounting disabled, ``sacct``
  fails and the plugin would poll it forever (plugin #38): ``("squeue", note)`` when MinJobAge lets squeue see
  finished jobs (the workflow switches the plugin's status command), else ``("stop", line naming the fix)``.
* ``site_resource(settings, rule, name)``: the raw value a site profile / command line gives a resource
  for ``rule`` (``set-resources``) or for all rules (``default-resources``), else None. Generation asks it
  for ``gres``: a site that asks for GPUs with ``gres`` gets ``--gres`` only, never ``--gres`` and
  ``--gpus`` together.
* ``gpu_memory_need_mb(source, precision, batch_size=1, positions=5120)``: GPU memory a generation job declares
  (resource ``gpu_mem_mb``), in MB (10^6 bytes), before the checkpoint exists: the real LLaDA2.1-mini checkpoints
  in bf16 at batch 1 38,000 (32.6 GB of weights + 1.34 GB KV cache for a 32K-token context, 20 layers x 2 x 4 KV
  heads x 128 x 2 B = 40,960 B/token from the model's config, :data:`LLADA2_MINI_CONFIG`,
  https://huggingface.co/inclusionAI/LLaDA2.1-mini/blob/main/config.json, + ~3.9 GB working memory, an
  estimate, not measured); the NVFP4 checkpoint in nvfp4-w4a16 14,000 (10.6 GB of weights); the tiny random
  model 1,000. At ``batch_size`` S > 1 the batched engine adds one KV cache per slot of ``positions`` rows and
  the slots' logits (:func:`batch_kv_bytes`: S x 40,960 B x positions + S x 32 x 157,184 x 2 B; S = 32 at 5,120
  positions: 6.71 + 0.32 GB, docs/perf_history.md "Batched graph forward"): 45,000 for the paper suite's batch 32 in
  bf16. ``positions``: :func:`slot_positions` of the longest generation (prompt allowance + max new tokens,
  rounded up to 1,024 as the batched graph engine allocates on a GPU).
* ``check_gpu(model_dir, precision, batch_size=1, positions=5120)`` (in the generation job, on the GPU it landed
  on): the same sum from the checkpoint itself (``gpu_need_bytes``: its weight files, scaled up when a 4-bit
  checkpoint is dequantized to bf16 at load, its config.json's shape for the KV caches) against the GPU's
  memory, and the compute capability the precision needs (bf16 / nvfp4-w4a16: 8.0, nvfp4: 10.0); RuntimeError
  naming the GPU, what it has and what is needed.
* ``container_env(environ, binary)``: ``{APPTAINERENV_X: value}`` (``SINGULARITYENV_`` for a
  ``singularity`` binary) for each variable of ``FORWARDED_ENV`` that is set, so ``--cleanenv`` keeps the
  GPU selection (``CUDA_VISIBLE_DEVICES`` from Slurm or the user) and the cache settings.
* ``bind_specs(paths)``: ``--bind`` specs for the paths the container jobs use: the path itself, or
  ``realpath:path`` when it goes through a symlink (so the path in the command resolves inside); nested
  paths are dropped when their parent is bound the same way. ``bind_args(paths)``: the same as shell-quoted
  options (``--bind '<spec>'``; ``--mount`` with CSV-quoted fields for a path holding ``,`` or ``:``), so a work
  directory with a space or a comma does not break the job's ``apptainer exec`` line.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

import yaml

from repro.site_profiles import (LEGACY_KEYS, ProfileError, legacy_profile_problems,  # noqa: F401 - re-exported
                                 profile_file, profile_layers, profile_missing, profile_warnings, profiles_from_argv)

# Variables the container jobs need from the host even under `apptainer exec --cleanenv`
# REPRO_SNAKEMAKE_PID: the Snakemake a generation job must die with (repro/backends/lifeline.py), also in a container
FORWARDED_ENV = ("CUDA_VISIBLE_DEVICES", "ORL_EVAL_GPU_LOCKS", "HF_HOME", "HF_HUB_OFFLINE", "TRITON_CACHE_DIR",
                 "REPRO_SNAKEMAKE_PID")

# Real LLaDA2.1-mini checkpoints: weights on the GPU (GB) per precision (bf16: 32.6 GB; the NVFP4 checkpoint
# kept in 4 bits: 10.6 GB), + 1.34 GB KV cache (32K tokens) + working memory (12% of the weights, >= 0.5 GB)
WEIGHTS_GB = {"bf16": 32.6, "fp32": 65.2, "nvfp4-w4a16": 10.6, "nvfp4": 10.6}
KV_GB = 1.342
TINY_MODEL_GPU_MB = 1_000
# The shape facts of LLaDA2.1-mini's config.json that size its KV caches and logits (used before the checkpoint
# is downloaded; the job itself reads the checkpoint's config.json):
# https://huggingface.co/inclusionAI/LLaDA2.1-mini/blob/main/config.json
LLADA2_MINI_CONFIG = {"num_hidden_layers": 20, "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 157_184,
                      "max_position_embeddings": 32_768}
# Tokens a batch slot reserves for the prompt when the prompts are not known yet (the paper suite's prompts,
# few-shot included, stay under 1,024 tokens), and the multiple the batched graph engine rounds a slot's
# positions up to on a GPU (repro/engine/batch_graph.py, generate_batch_graph).
PROMPT_ALLOWANCE = 1_024
SLOT_ROUND = 1_024
BLOCK_TOKENS = 32  # tokens of a denoising block (paper_decoding.json engine.block_size): rows of logits per slot
# compute capability each precision needs: bf16 arithmetic from 8.0 (Ampere: A100/A10/L4/L40S; H100/H200
# are 9.0), the bound torch.cuda.is_bf16_supported() applies; native FP4 from 10.0 (Blackwell)
MIN_CAPABILITY = {"bf16": (8, 0), "nvfp4-w4a16": (8, 0), "nvfp4": (10, 0)}


def normalise_slurm_state(state: str) -> str:
    """Reduce a sacct/squeue state to its keyword: ``'CANCELLED by 0'`` -> ``'CANCELLED'``,
    ``'RUNNING'`` -> ``'RUNNING'`` (sacct appends ``by <uid>``; some versions mark states with ``+``)."""
    s = str(state).strip()
    return s.split(None, 1)[0].rstrip("+") if s else s


def patch_slurm_status_query() -> bool:
    """Make the Slurm executor plugin see ``CANCELLED`` for ``CANCELLED by N`` (see module docstring).
    Returns True when the patch is in place (also when it already was), False without the plugin, and False
    with one warning line on stderr when the installed plugin has no ``query_job_status`` (a release this
    was not written for: a cancelled job may then hang the workflow)."""
    try:
        import snakemake_executor_plugin_slurm as plugin
    except ImportError:
        return False
    orig = getattr(plugin, "query_job_status", None)
    if orig is None:
        import sys

        version = getattr(plugin, "__version__", None) or "of unknown version"
        print(f"warning: snakemake-executor-plugin-slurm {version} has no query_job_status: a Slurm job cancelled "
              "with scancel ('CANCELLED by <uid>') may not be seen as failed; pin the release in pyproject.toml "
              "(2.8.0 is tested) or update repro/cluster.py", file=sys.stderr)
        return False
    if getattr(orig, "_repro_normalised", False):
        return True

    async def query_job_status(command, logger):
        status_of_jobs, duration = await orig(command, logger)
        if status_of_jobs:
            status_of_jobs = {k: normalise_slurm_state(v) for k, v in status_of_jobs.items()}
        return status_of_jobs, duration

    query_job_status._repro_normalised = True
    plugin.query_job_status = query_job_status
    return True


ACCOUNTING_OFF = "accounting storage is disabled"


def slurm_status_decision(status_command: str, init_seconds: int, run=None, min_job_age=None) -> tuple[str, str] | None:
    """What the run must do when Slurm accounting is disabled, or None when ``sacct`` answers (or the plugin
    already polls with ``squeue``). Without accounting ``sacct`` fails ("Slurm accounting storage is disabled")
    and the Slurm executor plugin, which polls with it by default, waits forever (plugin #38; docs/cluster.md
    §2 item 4). The plugin falls back from ``squeue`` to ``sacct`` when Slurm's ``MinJobAge`` is under
    3 x ``slurm-init-seconds-before-status-checks`` (finished jobs would leave squeue before it looks), so:
    ``("squeue", note)`` when MinJobAge allows squeue (the workflow then sets the plugin's status command), else
    ``("stop", one line naming the fix)``. ``run``: a ``subprocess.run`` stand-in; ``min_job_age()``: seconds or
    None (default: the plugin's own ``get_min_job_age``, which reads ``scontrol show config``)."""
    import subprocess

    run = run or subprocess.run
    try:
        r = run(["sacct", "-X", "--noheader", "--format=JobIdRaw", "--starttime", "now"], capture_output=True,
                text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None  # no sacct at all: the plugin itself switches to squeue
    said = f"{r.stdout}\n{r.stderr}"
    if r.returncode == 0 or ACCOUNTING_OFF not in said.lower():
        return None
    if min_job_age is None:
        from snakemake_executor_plugin_slurm.job_status_query import get_min_job_age as min_job_age
    age, need = min_job_age(), 3 * int(init_seconds)
    if age is not None and age >= need:
        how = "" if status_command == "squeue" else " (as --slurm-status-command squeue would)"
        return ("squeue", f"Slurm accounting is disabled on this cluster (sacct: '{ACCOUNTING_OFF}'): job states are "
                          f"read with squeue instead{how}; MinJobAge = {age} s keeps finished jobs visible long enough")
    fix = (f"lower --slurm-init-seconds-before-status-checks to {age // 3} or less"
           if age else "ask the cluster's admins for Slurm accounting (slurmdbd) or a MinJobAge of at least "
                       f"{need} s")
    return ("stop", f"Slurm accounting is disabled on this cluster (sacct: '{ACCOUNTING_OFF}'), so the Slurm executor "
                    f"cannot poll job states with sacct and would wait forever (github.com/snakemake/snakemake-executor-plugin-slurm/issues/38), and squeue sees a "
                    f"finished job only for MinJobAge = {age if age is not None else 'unknown'} s, under the "
                    f"{need} s it needs; {fix}")


def _raw(resource) -> object:
    """The value a Snakemake ``Resource`` (or a plain value) was given as."""
    raw = getattr(resource, "raw", resource)
    return raw


def site_resource(resource_settings, rule: str, name: str):
    """Raw value of resource ``name`` for ``rule`` from ``set-resources`` (wins) or ``default-resources``
    (profiles and command line), or None. ``resource_settings`` is ``workflow.resource_settings``."""
    over = getattr(resource_settings, "overwrite_resources", None) or {}
    rule_over = over.get(rule) or {}
    if name in rule_over:
        return _raw(rule_over[name])
    defaults = getattr(resource_settings, "default_resources", None) or {}
    if hasattr(defaults, "get") and name in defaults:
        return _raw(defaults[name])
    return None


def kv_bytes_per_position(cfg: dict) -> int:
    """Bytes of bf16 KV cache per position of one request: layers x 2 (K and V) x KV heads x head_dim x 2 B,
    from a model config (config.json keys; missing keys: LLaDA2.1-mini's, :data:`LLADA2_MINI_CONFIG`).
    LLaDA2.1-mini: 20 x 2 x 4 x 128 x 2 = 40,960."""
    c = {**LLADA2_MINI_CONFIG, **(cfg or {})}
    return c["num_hidden_layers"] * 2 * c["num_key_value_heads"] * c["head_dim"] * 2


def slot_positions(max_new_tokens: int, prompt_tokens: int = PROMPT_ALLOWANCE) -> int:
    """KV rows one batch slot holds: prompt + ``max_new_tokens`` rounded up to :data:`SLOT_ROUND` (the batched
    graph engine's allocation on a GPU). 4,096 new tokens (paper_decoding.json) -> 5,120. ValueError for a
    negative count."""
    if max_new_tokens < 0 or prompt_tokens < 0:
        raise ValueError(f"token counts must be >= 0, got max_new_tokens={max_new_tokens}, "
                         f"prompt_tokens={prompt_tokens}")
    return -(-(prompt_tokens + max_new_tokens) // SLOT_ROUND) * SLOT_ROUND


def batch_kv_bytes(cfg: dict, batch_size: int, positions: int) -> int:
    """Bytes the batched engine adds at ``batch_size`` S > 1 (0 at S = 1, the single-request path): S slots'
    bf16 KV caches of ``positions`` rows (:func:`kv_bytes_per_position`) + S x block x vocab x 2 B of logits
    (docs/perf_history.md, "Batched graph forward": 6.7 GB + 322 MB at S = 32 x 5,120 positions). ValueError for
    S < 1."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if batch_size == 1:
        return 0
    c = {**LLADA2_MINI_CONFIG, **(cfg or {})}
    return batch_size * (kv_bytes_per_position(c) * positions + BLOCK_TOKENS * c["vocab_size"] * 2)


def gpu_memory_need_mb(source: dict, precision: str = "bf16", batch_size: int = 1,
                       positions: int = 5_120) -> int:
    """GPU memory (MB, rounded up to 1,000) a generation job declares for a model whose config ``source`` and
    ``precision`` are given, decoding ``batch_size`` requests together with ``positions`` KV rows per slot:
    38,000 in bf16 at batch 1, 14,000 for the NVFP4 checkpoint in nvfp4-w4a16, 1,000 for the tiny model;
    + :func:`batch_kv_bytes` at batch > 1 (module docstring; 45,000 in bf16, 21,000 in nvfp4-w4a16 at 32 x 5,120)."""
    if source.get("type") == "tiny":
        return TINY_MODEL_GPU_MB
    w = WEIGHTS_GB.get(precision, WEIGHTS_GB["bf16"])
    batch_gb = batch_kv_bytes(LLADA2_MINI_CONFIG, batch_size, positions) / 1e9
    return math.ceil(w + KV_GB + batch_gb + max(0.5, 0.12 * w)) * 1000


def gpu_need_bytes(model_dir: str | os.PathLike, precision: str = "bf16", batch_size: int = 1,
                   positions: int = 5_120) -> int:
    """Bytes of GPU memory generation needs for the checkpoint in ``model_dir`` run at ``precision``: its
    ``*.safetensors`` weights as stored (an NVFP4 checkpoint, config.json with ``quantization_config``, run
    at bf16 is dequantized at load: x 32.6/10.6, the two model cards' sizes; fp32 doubles bf16) + a bf16 KV
    cache for its full context (config.json: num_hidden_layers x 2 x
    num_key_value_heads x head_dim x 2 B x max_position_embeddings; LLaDA2.1-mini: 40,960 B/token x 32,768 =
    1.34 GB) + at ``batch_size`` > 1 the slots' KV caches of ``positions`` rows and logits (:func:`batch_kv_bytes`
    from the same config) + working memory (activations, CUDA graphs, kernel workspaces: an estimate, 12% of the
    weights, at least 0.5 GB). LLaDA2.1-mini: 32.6 + 1.34 + 3.9 = 37.9 GB; at 32 x 5,120: + 7.0 GB."""
    d = Path(model_dir)
    weights = sum(f.stat().st_size for f in d.glob("*.safetensors"))
    cfg = yaml.safe_load((d / "config.json").read_text()) if (d / "config.json").is_file() else {}
    kv = kv_bytes_per_position(cfg) * cfg.get("max_position_embeddings", 32_768)
    if cfg.get("quantization_config") and not precision.startswith("nvfp4"):
        weights = int(weights * WEIGHTS_GB["bf16"] / WEIGHTS_GB["nvfp4"])
    if precision == "fp32":
        weights *= 2
    return weights + kv + batch_kv_bytes(cfg, batch_size, positions) + max(500_000_000, weights * 12 // 100)


def gpu_problem(name: str, total_bytes: int, capability: tuple[int, int], need_bytes: int,
                precision: str) -> str | None:
    """Why the GPU (``name``, ``total_bytes`` of memory, compute ``capability``) cannot run the job, or None.
    bf16 needs compute capability >= 8.0 (Ampere), the bound ``torch.cuda.is_bf16_supported()`` applies."""
    gb = 1e9
    need_cc = MIN_CAPABILITY.get(precision)
    if need_cc and tuple(capability) < need_cc:
        kind = "native FP4 (Blackwell)" if precision == "nvfp4" else "bf16 (A100, A10, L4, L40S, H100, H200)"
        return (f"GPU {name} (compute capability {capability[0]}.{capability[1]}) cannot run precision "
                f"{precision}: it needs compute capability >= {need_cc[0]}.{need_cc[1]}, {kind}; request such a "
                "GPU (README 'On a Slurm cluster')")
    if total_bytes < need_bytes:
        return (f"GPU {name} has {total_bytes / gb:.1f} GB but generation needs {need_bytes / gb:.1f} GB (bf16 "
                "weights + KV caches: a 32K-token context, and one per batch slot + working memory); request a GPU with at least "
                f"{math.ceil(need_bytes / gb)} GB (README 'On a Slurm cluster')")
    return None


def check_gpu(model_dir: str | os.PathLike, precision: str, batch_size: int = 1, positions: int = 5_120) -> None:
    """Raise RuntimeError naming the GPU, its memory and the requirement when the visible GPU 0 cannot hold
    the model in ``model_dir`` decoding ``batch_size`` requests of ``positions`` KV rows (``gpu_problem``,
    ``gpu_need_bytes``). Call after CUDA is known to be available."""
    import torch

    p = torch.cuda.get_device_properties(0)
    problem = gpu_problem(p.name, p.total_memory, (p.major, p.minor),
                          gpu_need_bytes(model_dir, precision, batch_size, positions), precision)
    if problem:
        raise RuntimeError(problem)


#: the rules whose jobs decode on the suite's device (workflow/rules/generate.smk)
GPU_RULES = ("generate_shard", "generate_group", "speed_probe")
#: set to 1 to start GPU jobs on a machine where :func:`cuda_here` sees no GPU (e.g. one visible only in a container)
SKIP_GPU_CHECK_ENV = "REPRO_SKIP_GPU_CHECK"


def cuda_here() -> bool:
    """Whether this machine has a CUDA GPU for the jobs it runs: ``torch.cuda.is_available()``, or else an
    ``nvidia-smi -L`` that lists a GPU (a GPU host whose venv holds a CPU build of torch, the jobs then running in
    an image with ``--nv``). Never raises."""
    try:
        import torch

        if torch.cuda.is_available():
            return True
    except Exception:  # noqa: BLE001 - no torch, a broken CUDA install: ask nvidia-smi
        pass
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def gpu_preflight_problem(gpu_jobs: list[str], local_exec: bool, have_gpu, environ=os.environ,
                          suite: str | None = None) -> str | None:
    """Why a run must not start, or None: ``gpu_jobs`` (one ``"rule (suite ...)"`` line per job of
    :data:`GPU_RULES` on a CUDA suite that the run will execute) run on this machine (``local_exec``: no cluster
    executor) and ``have_gpu()`` (:func:`cuda_here`) is False. Checked before any job starts, so a paper run on a
    laptop stops before the checkpoint downloads (tens of GB) instead of at its first generation job.
    ``environ[SKIP_GPU_CHECK_ENV] == "1"`` skips the check. ``suite``: the run's suite (config ``suite``), for the
    way out on the CPU (its ``device`` key; the smoke suite runs there as shipped)."""
    if not gpu_jobs or not local_exec or environ.get(SKIP_GPU_CHECK_ENV) == "1" or have_gpu():
        return None
    more = f" (and {len(gpu_jobs) - 1} more)" if len(gpu_jobs) > 1 else ""
    if suite is None:
        cpu_way = "run a CPU suite (--config suite=smoke)"
    elif suite == "smoke":
        cpu_way = "set suites.smoke.device back to cpu in config.yaml (as shipped) to run the smoke suite on the CPU"
    else:
        cpu_way = (f"run the CPU smoke suite (--config suite=smoke; suites.{suite}.device in config.yaml is what "
                   "puts this suite on the GPU)")
    return (f"this run would execute {len(gpu_jobs)} GPU job(s) on this machine, e.g. {gpu_jobs[0]}{more}, and this "
            f"machine has no CUDA GPU (torch.cuda.is_available() is False and nvidia-smi lists none). Nothing was "
            f"started, so no checkpoint was downloaded. Run on a GPU machine, submit the jobs to a cluster "
            f"(--workflow-profile workflow/profiles/slurm --profile <your site>, docs/cluster.md), or {cpu_way}. "
            f"If the GPU is only visible inside the image, set {SKIP_GPU_CHECK_ENV}=1.")


def container_env(environ, binary: str | None) -> dict[str, str]:
    """``{PREFIX + X: value}`` for each set variable of FORWARDED_ENV (module docstring)."""
    prefix = "SINGULARITYENV_" if binary and os.path.basename(binary) == "singularity" else "APPTAINERENV_"
    return {prefix + k: environ[k] for k in FORWARDED_ENV if environ.get(k) not in (None, "")}


def _bind_pairs(paths) -> list[tuple[str, str]]:
    """``(source, destination)`` per path (module docstring: ``bind_specs``)."""
    specs: list[tuple[str, str]] = []
    for p in paths:
        if not p:
            continue
        dst = os.path.abspath(os.path.expanduser(str(p)))
        src = os.path.realpath(dst)
        if (src, dst) not in specs:
            specs.append((src, dst))
    specs.sort(key=lambda sd: sd[1])
    kept: list[tuple[str, str]] = []
    for src, dst in specs:
        covered = any(dst.startswith(kd.rstrip("/") + "/") and src == os.path.join(ks, os.path.relpath(dst, kd))
                      for ks, kd in kept)
        if not covered:
            kept.append((src, dst))
    return kept


def bind_specs(paths) -> list[str]:
    """``--bind`` specs (``path`` or ``realpath:path``) for the given paths, parents first, nested ones
    dropped when their parent is bound without remapping (module docstring)."""
    return [dst if src == dst else f"{src}:{dst}" for src, dst in _bind_pairs(paths)]


def _csv_field(text: str) -> str:
    return '"' + text.replace('"', '""') + '"' if any(c in text for c in ',"') else text


def bind_args(paths) -> list[str]:
    """Shell-quoted apptainer options binding ``paths`` (as :func:`bind_specs`): ``--bind '/a b/work'``, or,
    for a path holding ``,`` or ``:`` (which ``--bind`` takes as separators), ``--mount 'type=bind,"src=/a,b",
    "dst=/a,b"'`` (Apptainer's --mount fields are CSV; apptainer docs, "Bind Paths and Mounts"). Snakemake
    puts ``--apptainer-args`` into the job's shell command as written, so an unquoted path with a space
    breaks it (snakemake PR #2190 quoted only its own binds)."""
    import shlex

    out = []
    for src, dst in _bind_pairs(paths):
        if any(c in src + dst for c in ",:"):
            spec = ",".join(["type=bind", _csv_field(f"src={src}"), _csv_field(f"dst={dst}")])
            out.append(f"--mount {shlex.quote(spec)}")
        else:
            out.append(f"--bind {shlex.quote(dst if src == dst else f'{src}:{dst}')}")
    return out


def _option_pairs(args: str) -> set[tuple[str, str]]:
    import shlex

    try:
        tokens = shlex.split(args)
    except ValueError:  # unbalanced quotes: compare the raw words
        tokens = args.split()
    pairs = {(t, tokens[i + 1]) for i, t in enumerate(tokens[:-1]) if t in ("--bind", "-B", "--mount")}
    pairs |= {tuple(t.split("=", 1)) for t in tokens if t.startswith(("--bind=", "--mount="))}
    return {("--bind" if o == "-B" else o, v) for o, v in pairs}


def add_binds(apptainer_args: str, binds: list[str]) -> str:
    """``apptainer_args`` with each of ``binds`` (:func:`bind_args` options, or bare ``--bind`` specs)
    appended unless the same bind is already there (the Slurm job step parses the workflow again with the
    main process's arguments)."""
    import shlex

    present = _option_pairs(apptainer_args)
    extra = []
    for b in binds:
        arg = b if b.startswith("--") else f"--bind {shlex.quote(b)}"
        if not (_option_pairs(arg) <= present):
            extra.append(arg)
            present |= _option_pairs(arg)
    return " ".join([apptainer_args.strip(), *extra]).strip()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m repro.cluster", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check-profile", help="exit 2 naming each Snakemake 7 key of the given profiles")
    c.add_argument("profiles", nargs="+")
    a = ap.parse_args(argv)
    problems = [line for p in a.profiles
                for line in ([profile_missing(p)] if profile_missing(p) else legacy_profile_problems(p))]
    for line in problems:
        print(f"Profile error: {line}", file=sys.stderr)
    return 2 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
