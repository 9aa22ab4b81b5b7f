# Generation: one job per shard (GPU jobs request gpu=1; the smoke suite is CPU by design), then a merge
# that checks every problem appears exactly once. Jobs resume from their partial file after a kill, and
# die with the Snakemake that started them.
#
# A suite with `group_benchmarks: true` runs one job per (model, seed, shard) over all its benchmarks
# (generate_group): the model is loaded, and its graphs captured, once per job instead of once per benchmark.
# Its only output is an index; the per-benchmark shards beside it survive a re-run of the job, and a benchmark
# whose inputs did not change keeps its records (repro/backends/generation_job.py). Otherwise one job per
# (model, benchmark, seed, shard) (generate_shard).


rule generate_shard:
    input:
        # the checkpoint (its BF16 copy for SGLang on an NVFP4 model): stamp and folder ancient(), what it
        # holds in `source` (checkpoints.smk: generation_checkpoint)
        verified=generation_checkpoint("verified"),
        source=generation_checkpoint("source"),
        ckpt=generation_checkpoint("dir"),
        decoder=W(P.DECODER, suite="{suite}", model="{model}", bench="{bench}", seed="{seed}"),
        problems=W(P.GENERATION_PROBLEMS, suite="{suite}", bench="{bench}"),  # re-prepared only for new prompts
        image=image_input("generate"),
        adapter_map=lambda wc: model_cfg(wc).get("adapter_map") or [],  # docs/adapter_map.md
    output:
        W(P.SHARD, suite="{suite}", model="{model}", bench="{bench}", seed="{seed}", shard="{shard}", nshards="{nshards}"),
    params:
        backend=config["backend"],  # a param, so switching backend re-runs generation (params rerun trigger)
        role=lambda wc: model_cfg(wc)["role"],
        device=lambda wc: suite_cfg(wc)["device"],
        precision=job_precision,  # the model's own, else the suite's (checkpoints.smk)
        batch_size=lambda wc: suite_cfg(wc).get("batch_size", 1),  # engine: requests decoded together
        code=code_version("generate"),  # engine (engine backend), backends, prompt templates
        flags=job_flags,  # --adapter-map FILE, --tensor-parallel-size N (> 1 only): cluster.smk
    log:
        W("logs/generate/{suite}/{model}/{bench}/seed{seed}/shard{shard}of{nshards}.log"),
    container: image_for("generate")
    threads: 1
    resources:
        # GPU request (cluster.smk): --gpus=1 or --gpus=<gpu_model>:1, or the site's --gres; none on CPU suites
        gpu=gpu_count,
        gpu_model=gpu_model_for,
        gres=gres_for,
        cpus_per_gpu=lambda wc: 8 if on_gpu(wc) else 0,  # GPU jobs: --cpus-per-gpu=8
        gpu_mem_mb=gpu_mem_mb,  # needed on the device (bf16 weights + KV); the job checks its GPU
        runtime=lambda wc, attempt: (60 if on_gpu(wc) else 30) * attempt,
        mem_mb=lambda wc, attempt: (64000 if on_gpu(wc) else 4000) * attempt,  # an OOM retry asks for more
        mem_mb_per_cpu=0,  # --mem, never a site's --mem-per-cpu (cluster.smk)
    shell:
        logged("OMP_NUM_THREADS={threads} {PY_IMAGE} -m repro.backends.generation_job --backend {params.backend} "
               "--model {wildcards.model} --model-dir {input.ckpt} --role {params.role} --verified {input.verified} "
               "--decoder {input.decoder} --problems {input.problems} --benchmark {wildcards.bench} "
               "--seed {wildcards.seed} --shard {wildcards.shard} --num-shards {wildcards.nshards} "
               "--device {params.device} --precision {params.precision} --batch-size {params.batch_size} "
               "{params.flags} --out {output}",
               streams="2> {log}")


rule generate_group:
    input:
        # as generate_shard: the checkpoint, or its BF16 copy for SGLang on an NVFP4 model
        verified=generation_checkpoint("verified"),
        source=generation_checkpoint("source"),
        ckpt=generation_checkpoint("dir"),
        decoders=group_decoders,  # every benchmark's: a change to one re-runs the job, which keeps the others
        problems=group_problems,
        image=image_input("generate"),
        adapter_map=lambda wc: model_cfg(wc).get("adapter_map") or [],
    output:
        W(P.GROUP, suite="{suite}", model="{model}", seed="{seed}", shard="{shard}", nshards="{nshards}"),
    params:
        backend=config["backend"],
        role=lambda wc: model_cfg(wc)["role"],
        device=lambda wc: suite_cfg(wc)["device"],
        precision=job_precision,
        batch_size=lambda wc: suite_cfg(wc).get("batch_size", 1),
        code=code_version("generate"),
        flags=job_flags,  # --adapter-map FILE, --tensor-parallel-size N (> 1 only): cluster.smk
        benchmarks=lambda wc: " ".join(suite_cfg(wc)["benchmarks"]),  # in the order of decoders and problems
    log:
        W("logs/generate/{suite}/{model}/seed{seed}/shard{shard}of{nshards}.log"),
    container: image_for("generate")
    threads: 1
    resources:
        gpu=gpu_count,
        gpu_model=gpu_model_for,
        gres=gres_for,
        cpus_per_gpu=lambda wc: 8 if on_gpu(wc) else 0,
        gpu_mem_mb=gpu_mem_mb,
        # the per-benchmark job's limit for each benchmark it serves
        runtime=lambda wc, attempt: (60 if on_gpu(wc) else 30) * len(suite_cfg(wc)["benchmarks"]) * attempt,
        mem_mb=lambda wc, attempt: (64000 if on_gpu(wc) else 4000) * attempt,
        mem_mb_per_cpu=0,  # --mem, never a site's --mem-per-cpu (cluster.smk)
        **GROUP_SITE_RESOURCES,  # a site profile's set-resources for generate_shard (cluster.smk)
    shell:
        logged("OMP_NUM_THREADS={threads} {PY_IMAGE} -m repro.backends.generation_job --backend {params.backend} "
               "--model {wildcards.model} --model-dir {input.ckpt} --role {params.role} --verified {input.verified} "
               "--seed {wildcards.seed} --shard {wildcards.shard} --num-shards {wildcards.nshards} "
               "--device {params.device} --precision {params.precision} --batch-size {params.batch_size} "
               "{params.flags} --benchmark {params.benchmarks} --decoder {input.decoders} "
               "--problems {input.problems} --group-index {output}",
               streams="2> {log}")


rule merge_shards:
    input:
        problems=W(P.GENERATION_PROBLEMS, suite="{suite}", bench="{bench}"),  # ids and order only
        shards=shard_files,  # a grouped suite's: the jobs' indexes
    output:
        W(P.GENERATIONS, suite="{suite}", model="{model}", bench="{bench}", seed="{seed}"),
    params:
        group=merge_group_args,
        code=code_version("merge"),  # a merge fix re-merges (and re-scores); old merges gain their sha256
    log:
        W("logs/merge/{suite}/{model}/{bench}/seed{seed}.log"),
    localrule: True
    shell:
        logged("{PY} -m repro.backends.merge --problems {input.problems} --out {output} {params.group} {input.shards}")


# Speed probe (suites generated batched, `batch_size` > 1): the model cards report "tokens/s for a single
# request", which a batched job's records cannot give (a record's wall_s is its latency inside the batch). Per
# model x benchmark of the suite's `speed_benchmarks` (default GSM8K and HumanEval, as the paper reports), one GPU
# job runs the first SPEED_SUBSET problems one request at a time at batch 1 on the engine's single-request path
# (CUDA graphs on a GPU), with the same checkpoint, decoder config and problems as generation and the generation
# job's own code (`--limit`); the speed table reads its records for "tokens/s (1 req.)" and "ms/forward (1 req.)".
# At batch 1 the generation records measure it already: no probe.
rule speed_probe:
    input:
        verified=generation_checkpoint("verified"),
        source=generation_checkpoint("source"),
        ckpt=generation_checkpoint("dir"),
        decoder=lambda wc: W(P.DECODER, suite=wc.suite, model=wc.model, bench=wc.bench, seed=probe_seed(wc)),
        problems=W(P.GENERATION_PROBLEMS, suite="{suite}", bench="{bench}"),
        image=image_input("generate"),
        adapter_map=lambda wc: model_cfg(wc).get("adapter_map") or [],
    output:
        W(P.SPEED_PROBE, suite="{suite}", model="{model}", bench="{bench}"),
    params:
        backend=config["backend"],
        role=lambda wc: model_cfg(wc)["role"],
        device=lambda wc: suite_cfg(wc)["device"],
        precision=job_precision,
        seed=probe_seed,
        limit=P.SPEED_SUBSET,
        code=code_version("generate"),
        flags=job_flags,  # --adapter-map FILE, --tensor-parallel-size N (> 1 only): cluster.smk
    log:
        W("logs/speed/{suite}/{model}/{bench}.log"),
    container: image_for("generate")
    threads: 1
    resources:
        gpu=gpu_count,
        gpu_model=gpu_model_for,
        gres=gres_for,
        cpus_per_gpu=lambda wc: 8 if on_gpu(wc) else 0,
        gpu_mem_mb=lambda wc: gpu_mem_mb_at(wc, 1),  # one request at a time: no batch KV caches
        runtime=lambda wc, attempt: (60 if on_gpu(wc) else 30) * attempt,
        mem_mb=lambda wc, attempt: (64000 if on_gpu(wc) else 4000) * attempt,
        mem_mb_per_cpu=0,  # --mem, never a site's --mem-per-cpu (cluster.smk)
        **GROUP_SITE_RESOURCES,  # a site profile's set-resources for generate_shard (partition, account, ...)
    shell:
        logged("OMP_NUM_THREADS={threads} {PY_IMAGE} -m repro.backends.generation_job --backend {params.backend} "
               "--model {wildcards.model} --model-dir {input.ckpt} --role {params.role} --verified {input.verified} "
               "--decoder {input.decoder} --problems {input.problems} --benchmark {wildcards.bench} "
               "--seed {params.seed} --shard 0 --num-shards 1 --limit {params.limit} "
               "--device {params.device} --precision {params.precision} --batch-size 1 "
               "{params.flags} --out {output}",
               streams="2> {log}")
