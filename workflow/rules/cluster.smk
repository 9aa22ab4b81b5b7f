# Cluster behaviour that does not depend on the site: Snakemake-7 profiles stop with one line, cancelled
# Slurm jobs are reported failed (and retried), GPU requests reach only GPU jobs. Include after common.smk.
# Helpers and their sources: repro/cluster.py.
from repro import cluster as _cluster

# A Snakemake-7 site profile (`cluster: sbatch ...`): Snakemake 9 turns the key into a target or rejects it;
# say what replaced it instead of "No rule to produce --cluster=sbatch ...". (When the command line also
# names a target, Snakemake's own argument parser stops first; the scripts check profiles before that.)
_legacy = [line for p in _cluster.profiles_from_argv(sys.argv) for line in _cluster.legacy_profile_problems(p)]
if _legacy:
    print(f"Profile error: {_legacy[0]}", file=sys.stderr)
    sys.exit(1)

# Site settings a command line silently loses (repro/cluster.py: profile_warnings): a --default-resources /
# --set-resources that replaces the site profile's whole mapping, a workflow-profile key over the site's value.
if workflow.is_main_process:
    for _line in _cluster.profile_warnings(sys.argv, os.environ, workflow.basedir):
        print(f"Warning: {_line}", file=sys.stderr)

# sacct reports `CANCELLED by <uid>`, which the Slurm executor plugin (<= 2.8.0) does not recognise: it
# would wait for a cancelled job forever. Normalise the states it reads (no-op without the plugin).
_cluster.patch_slurm_status_query()


def site_gres(rule):
    """The `gres` a site profile or --set-resources/--default-resources gives `rule`, or None."""
    return _cluster.site_resource(workflow.resource_settings, rule, "gres")


def _gen_site(name):
    """A site resource of the generation jobs: generate_group's own when set there, else generate_shard's
    (a site profile names generate_shard; grouped jobs run on the same GPUs)."""
    over = (getattr(workflow.resource_settings, "overwrite_resources", None) or {}).get("generate_group") or {}
    which = "generate_group" if name in over else "generate_shard"
    return _cluster.site_resource(workflow.resource_settings, which, name)


def model_tp(wildcards):
    """Ranks per request of the job's model: its `tensor_parallel_size` (config.yaml), else 1."""
    return int(model_cfg(wildcards).get("tensor_parallel_size", 1))


def gpu_count(wildcards):
    """`gpu` resource of a generation job: the model's tensor_parallel_size (1 unless set; one task, so the
    GPUs are on one node) on GPU suites, 0 on CPU suites, and 0 when the site asks for the GPU through `gres`
    (the plugin would otherwise send both --gres and --gpus; a site gres must then name N GPUs itself)."""
    return model_tp(wildcards) if on_gpu(wildcards) and not _gen_site("gres") else 0


def job_flags(wildcards, input):
    """Optional flags of a generation job: ``--adapter-map FILE`` (docs/adapter_map.md) and, for a model with
    ``tensor_parallel_size`` N > 1, ``--tensor-parallel-size N`` (left out at 1, so the params of existing
    outputs do not change)."""
    flags = [f"--adapter-map {input.adapter_map}"] if input.adapter_map else []
    if model_tp(wildcards) > 1:
        flags.append(f"--tensor-parallel-size {model_tp(wildcards)}")
    return " ".join(flags)


def gpu_model_for(wildcards):
    """`gpu_model` of a generation job: the site's (default-resources) on GPU suites, "" (none) on CPU
    suites, so a site-wide gpu_model never turns a CPU job into a GPU request. set-resources still wins."""
    if not on_gpu(wildcards) or _gen_site("gres"):
        return ""  # CPU suite, or the site asks through gres (which then carries any GPU type)
    return str(_gen_site("gpu_model") or "")


def gres_for(wildcards):
    """`gres` of a generation job: the site's on GPU suites, "" on CPU suites."""
    return str(_gen_site("gres") or "") if on_gpu(wildcards) else ""


# A site profile's `set-resources: generate_shard: {...}` (partition, account, qos, constraint, ...) applies to
# the grouped generation jobs and the speed probes too: forwarded as their own resources, so a key set for
# generate_group itself still wins (set-resources override a rule's). The keys the rule computes itself are
# left out: the GPU keys read _gen_site, key by key, the same way; runtime, mem_mb, cpus_per_gpu and gpu_mem_mb
# follow each rule's own formula (a site sets them for generate_group / speed_probe by name: docs/workflow.md §7.5).
_COMPUTED = {"gpu", "gpu_model", "gres", "cpus_per_gpu", "gpu_mem_mb", "runtime", "mem_mb"}
_SHARD_SITE = (getattr(workflow.resource_settings, "overwrite_resources", None) or {}).get("generate_shard") or {}
GROUP_SITE_RESOURCES = {k: _cluster._raw(v) for k, v in _SHARD_SITE.items() if k not in _COMPUTED}


_PAPER_DECODING = {}  # the packaged paper_decoding.json, read once per Snakemake process


def slot_positions_for(wildcards):
    """KV rows per batch slot of a generation job (repro.cluster.slot_positions): the longest ``max_new_tokens``
    of the model's decoders over the suite's benchmarks (the suite's override, else the packaged
    paper_decoding.json, which a checkpoint's own copy may change: the job checks again on its GPU) + the prompt
    allowance; 4,096 new tokens -> 5,120."""
    s = suite_cfg(wildcards)
    most = s.get("max_new_tokens")
    if not most:
        from repro.paper.decoding import PaperDecodingError, load_paper_decoding, resolve_decoder

        try:
            pd = _PAPER_DECODING.setdefault("packaged", load_paper_decoding())
            most = max(resolve_decoder(pd, s["decoder_suite"], model_cfg(wildcards)["decoder"], b, 0)
                       .get("max_new_tokens") or 4096 for b in s["benchmarks"])
        except (PaperDecodingError, KeyError):
            most = 4096  # its render_decoder job reports the problem
    return _cluster.slot_positions(int(most))


def gpu_mem_mb_at(wildcards, batch_size):
    """GPU memory (MB) a generation job decoding ``batch_size`` requests together needs: 0 on CPU suites, else
    repro.cluster.gpu_memory_need_mb (weights + KV caches, one per batch slot of :func:`slot_positions_for`
    rows, + working memory: 38,000 for the real checkpoints in bf16 at batch 1, 45,000 at batch 32; 14,000 /
    21,000 for the NVFP4 one in nvfp4-w4a16; 1,000 for the tiny model). Informational for the scheduler; the
    job itself checks the GPU it lands on (repro.backends.generation_job)."""
    if not on_gpu(wildcards):
        return 0
    return _cluster.gpu_memory_need_mb(model_cfg(wildcards)["source"], job_precision(wildcards), batch_size,
                                       slot_positions_for(wildcards))


def gpu_mem_mb(wildcards):
    """``gpu_mem_mb`` of a generation job (generate_shard / generate_group): at the suite's ``batch_size``."""
    return gpu_mem_mb_at(wildcards, suite_cfg(wildcards).get("batch_size", 1))


# Every rule that declares `mem_mb` also declares `mem_mb_per_cpu=0`: the Slurm plugin (2.8) sends
# `--mem-per-cpu` and drops `--mem` whenever a job has a non-zero mem_mb_per_cpu
# (github.com/snakemake/snakemake-executor-plugin-slurm/issues/75), so a site's
# `default-resources: {mem_mb_per_cpu: N}` would silently replace the 64 GB a generation job declares (and its
# growth on retry). A rule's own resource beats default-resources; a site's set-resources for the rule still wins.

# Resources of jobs that never need a GPU: a site-wide gpu_model / gres in default-resources must not
# reach them (the plugin turns gpu_model alone into --gpus=<model>:1).
CPU_ONLY = {"gpu": 0, "gpu_model": "", "gres": ""}


def write_status_plans(suites, regenerate=frozenset()):
    """Write each suite's plan for `python -m repro.status` (repro.status.write_plan): every generated model ×
    benchmark × seed of the config, with the records file of each shard, so progress counts a cell before its
    decoder config is rendered. Called at the start of a real run (onstart below) for the suites it
    generates; replayed models generate nothing and are left out. ``regenerate``: the records files (relative to
    the work directory; a grouped job's ``shard<K>of<N>.json``) of the generation jobs this run executes, so that
    status does not count a records file left from earlier inputs. A plan that cannot be written (a full disk) is a
    note, never a failed start."""
    from repro.status import write_plan

    for su in suites:
        s = suite_cfg(su)
        n, records = s["shards"], P.GROUP_SHARD if s.get("group_benchmarks") else P.SHARD
        try:
            cells = []
            for m in s["models"]:
                if is_replay(config, m):
                    continue
                for b in s["benchmarks"]:
                    recs = [records.format(suite=su, model=m, bench=b, seed=seed, shard=k, nshards=n)
                            for seed in s["seeds"] for k in range(n)]
                    redo = [r for r in recs if r in regenerate or os.path.dirname(r) + ".json" in regenerate]
                    cells.append({"model": m, "benchmark": b, "seeds": list(s["seeds"]), "records": recs,
                                  "regenerate": redo})
            write_plan(Path(WORK), su, cells)
        except OSError as e:  # a full disk, say: the run goes on (its jobs say what is wrong); status shows less
            print(f"note: the progress plan of suite {su} was not written ({e.strerror or e}); python -m "
                  "repro.status shows its cells once their decoder configs are rendered", file=sys.stderr)


# A run whose GPU jobs would execute on this machine (no cluster executor) on a machine without a CUDA GPU stops
# before any job, so before the checkpoint downloads, with one line (repro/cluster.py: gpu_preflight_problem).
# Not in dry runs (Snakemake runs onstart only when it executes).
onstart:
    _gpu_jobs = [f"{j.rule.name} (suite {j.wildcards.get('suite', '?')})" for j in workflow.dag.needrun_jobs()
                 if j.rule.name in _cluster.GPU_RULES and on_gpu(j.wildcards)]
    _problem = _cluster.gpu_preflight_problem(_gpu_jobs, workflow.local_exec, _cluster.cuda_here,
                                               suite=SUITE)
    if _problem:
        print(f"Error: {_problem}", file=sys.stderr)
        sys.exit(1)
    # Slurm without accounting: sacct fails and the plugin would poll it forever (repro/cluster.py)
    _es = workflow.executor_settings
    if not workflow.local_exec and hasattr(_es, "status_command") and hasattr(_es, "init_seconds_before_status_checks"):
        _decision = _cluster.slurm_status_decision(_es.status_command, _es.init_seconds_before_status_checks)
        if _decision and _decision[0] == "stop":
            print(f"Error: {_decision[1]}", file=sys.stderr)
            sys.exit(1)
        if _decision:
            _es.status_command = "squeue"
            print(f"Note: {_decision[1]}", file=sys.stderr)
    # where to watch generation (its jobs' bars go to their logs): repro/status.py, from any shell, also on Slurm;
    # it counts the cells of each generated suite's plan, written now (write_status_plans)
    _gen_jobs = [j for j in workflow.dag.needrun_jobs() if j.rule.name in ("generate_shard", "generate_group")]
    _generating = {j.wildcards["suite"] for j in _gen_jobs}
    if _generating:
        _work = os.path.abspath(WORK)
        write_status_plans(sorted(_generating), {os.path.relpath(os.path.abspath(str(f)), _work)
                                                 for j in _gen_jobs for f in j.output})
        import shlex

        _w = os.path.realpath(WORK) != os.path.realpath(os.path.join(workflow.basedir, "work"))
        _w = f" --work {shlex.quote(WORK)}" if _w else ""
        print(f"note: progress per model × benchmark (problems done, tokens/s, ETA): python -m repro.status --suite "
              f"{SUITE}{_w} (from the checkout, in another shell; also after a crash)", file=sys.stderr)
