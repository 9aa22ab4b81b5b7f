# Generation: one job per shard (GPU jobs request gpu=1; the smoke suite is CPU by design), then a merge
# that checks every problem appears exactly once. Jobs resume from their partial file after a kill.


def nshards(wildcards):
    return config["suites"][wildcards.suite]["shards"]


rule generate_shard:
    input:
        verified=W(P.VERIFIED, model="{model}"),
        ckpt=W(P.CHECKPOINT, model="{model}"),
        decoder=W(P.DECODER, suite="{suite}", model="{model}", bench="{bench}", seed="{seed}"),
        problems=W(P.PROBLEMS, suite="{suite}", bench="{bench}"),
        image=image_input("generate"),
    output:
        W(P.SHARD, suite="{suite}", model="{model}", bench="{bench}", seed="{seed}", shard="{shard}", nshards="{nshards}"),
    params:
        backend=config["backend"],  # a param, so switching backend re-runs generation (params rerun trigger)
        role=lambda wc: config["models"][wc.model]["role"],
        device=lambda wc: config["suites"][wc.suite]["device"],
        precision=lambda wc: config["models"][wc.model].get("precision", config["suites"][wc.suite]["precision"]),
    log:
        W("logs/generate/{suite}/{model}/{bench}/seed{seed}/shard{shard}of{nshards}.log"),
    container: image_for("generate")
    threads: 1
    resources:
        gpu=lambda wc: 1 if config["suites"][wc.suite]["device"] == "cuda" else 0,
        runtime=lambda wc, attempt: 60 * attempt if config["suites"][wc.suite]["device"] == "cuda" else 30,
        mem_mb=lambda wc, attempt: 64000 if config["suites"][wc.suite]["device"] == "cuda" else 4000,
    shell:
        logged("OMP_NUM_THREADS={threads} {PY} -m repro.backends.generate --backend {params.backend} "
               "--model {wildcards.model} --model-dir {input.ckpt} --role {params.role} --verified {input.verified} "
               "--decoder {input.decoder} --problems {input.problems} --benchmark {wildcards.bench} "
               "--seed {wildcards.seed} --shard {wildcards.shard} --num-shards {wildcards.nshards} "
               "--device {params.device} --precision {params.precision} --out {output}", streams="2> {log}")


def shard_files(wildcards):
    n = nshards(wildcards)
    return [W(P.SHARD, suite=wildcards.suite, model=wildcards.model, bench=wildcards.bench, seed=wildcards.seed,
              shard=k, nshards=n) for k in range(n)]


rule merge_shards:
    input:
        problems=W(P.PROBLEMS, suite="{suite}", bench="{bench}"),
        shards=shard_files,
    output:
        W(P.GENERATIONS, suite="{suite}", model="{model}", bench="{bench}", seed="{seed}"),
    log:
        W("logs/merge/{suite}/{model}/{bench}/seed{seed}.log"),
    localrule: True
    shell:
        logged("{PY} -m repro.backends.merge --problems {input.problems} --out {output} {input.shards}")
