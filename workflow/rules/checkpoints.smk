# Checkpoints: obtain (HF download, local path, or the tiny random-weight model), then verify every
# file against checkpoint_manifest.json. Generation depends on the verification stamp, never on the
# bare directory, so it cannot start on an unverified checkpoint.


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
    params:
        trigger=verify_trigger,
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
