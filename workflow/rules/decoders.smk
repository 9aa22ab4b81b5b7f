# Decoder configs: rendered (jinja2) per model × benchmark × seed from the checkpoint's paper_decoding.json
# (the packaged default when the checkpoint ships none). Always the engine's keys: the SGLang backend maps
# them to its algorithm and YAML itself (repro.backends.sglang), since SGLang's file has no max_new_tokens.


def render_sets(wildcards):
    s = config["suites"][wildcards.suite]
    mnt = s.get("max_new_tokens")
    # a sweep point's suite (analysis.smk) carries its decoder overrides; nowhere else are they set
    sets = [f"--set max_new_tokens={mnt}"] if mnt else []
    sets += [f"--set {k}={v}" for k, v in sorted((s.get("_decoder_overrides") or {}).items())]
    return " ".join(sets)


rule render_decoder:
    input:
        ckpt=W(P.CHECKPOINT, model="{model}"),
        verified=W(P.VERIFIED, model="{model}"),
    output:
        W(P.DECODER, suite="{suite}", model="{model}", bench="{bench}", seed="{seed}"),
    params:
        decoder=lambda wc: config["models"][wc.model]["decoder"],
        dsuite=lambda wc: config["suites"][wc.suite]["decoder_suite"],
        sets=render_sets,
    log:
        W("logs/decoders/{suite}/{model}/{bench}/seed{seed}.log"),
    localrule: True
    shell:
        logged("{PY} -m repro.paper.render_config --suite {params.dsuite} --model {params.decoder} "
               "--benchmark {wildcards.bench} --seed {wildcards.seed} --checkpoint {input.ckpt} "
               "--backend engine {params.sets} --out {output}")
