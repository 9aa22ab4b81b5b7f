# Decoder configs: rendered (jinja2) per model × benchmark × seed from the checkpoint's paper_decoding.json
# (the packaged default when the checkpoint ships none). Always the engine's keys: the SGLang backend maps
# them to its algorithm and YAML itself (repro.backends.sglang), since SGLang's file has no max_new_tokens.


rule render_decoder:
    input:
        ckpt=ancient(W(P.CHECKPOINT, model="{model}")),  # what it holds: `source` (checkpoints.smk)
        verified=ancient(W(P.VERIFIED, model="{model}")),
        source=W(P.CHECKPOINT_SOURCE, model="{model}"),
    output:
        # update(): kept (the previous version put back) when a run fails, as the problems (prepare.smk)
        update(W(P.DECODER, suite="{suite}", model="{model}", bench="{bench}", seed="{seed}")),
    params:
        decoder=lambda wc: model_cfg(wc)["decoder"],
        dsuite=lambda wc: suite_cfg(wc)["decoder_suite"],
        sets=render_sets,
        code=code_version("decoder"),  # templates, packaged paper_decoding.json, renderer
    log:
        W("logs/decoders/{suite}/{model}/{bench}/seed{seed}.log"),
    localrule: True
    shell:
        logged("{PY} -m repro.paper.render_config --suite {params.dsuite} --model {params.decoder} "
               "--benchmark {wildcards.bench} --seed {wildcards.seed} --checkpoint {input.ckpt} "
               "--backend engine {params.sets} --out {output}")
