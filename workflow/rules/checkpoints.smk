# Checkpoints: obtain (HF download, local path, or the tiny random-weight model), then verify every
# file against checkpoint_manifest.json. Generation depends on the verification stamp, never on the
# bare directory, so it cannot start on an unverified checkpoint. The rules reading the checkpoint take the
# folder and the stamp as ancient() and what the checkpoint is from checkpoint_source: touching a checkpoint
# file re-verifies it and regenerates nothing; another source (hub revision, local folder or its manifest,
# tiny seed or code) regenerates.


rule download_checkpoint:
    output:
        directory(W(P.CHECKPOINT, model="{model}")),
    params:
        cmd=fetch_command,
        # what the checkpoint is (hub id + revision, local folder + manifest + file fingerprint, tiny seed +
        # code): another source, a repaired local folder or a new seed fetches again (params rerun trigger)
        source=checkpoint_key,
    log:
        W("logs/download/{model}.log"),
    localrule: True  # needs the network: runs on the submit host, not a compute node
    retries: 2
    resources:
        runtime=240,
    shell:
        logged("{params.cmd}")


rule verify_checkpoint:
    input:
        W(P.CHECKPOINT, model="{model}"),
    output:
        W(P.VERIFIED, model="{model}"),
    # a checkpoint file changed since the stamp (or the work directory was copied): common.smk verifies it
    # again at start-up (_reverify_stale_stamps), and removes the stamp when that fails, so this job re-runs
    params:
        pin=manifest_pin_arg,
        copy_of=copy_of_arg,
    log:
        W("logs/verify/{model}.log"),
    threads: 2
    resources:
        **CPU_ONLY,
        runtime=lambda wc, attempt: 60 * attempt,
        mem_mb=lambda wc, attempt: 2000 * attempt,
    shell:
        logged("{PY} -m repro.checkpoint verify {input} --stamp {output} {params.pin} {params.copy_of}")


rule checkpoint_source:
    """The checkpoint's source key (common.smk: checkpoint_content_key) as a file, rewritten only when it
    changes (params rerun trigger): the non-ancient input by which a new source reaches decoders and
    generation. (A param of those rules would not do: Snakemake does not check the params of jobs below one
    that re-runs, such as a re-verification, when it reaches them only through ancient() inputs.)"""
    output:
        W(P.CHECKPOINT_SOURCE, model="{model}"),
    params:
        key=checkpoint_content_key,
    log:
        W("logs/sources/{model}.log"),
    localrule: True
    shell:
        "printf '%s\\n' {params.key:q} > {output} && echo 'wrote {output}' > {log}"
