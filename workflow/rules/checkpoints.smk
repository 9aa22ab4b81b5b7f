# Checkpoints: obtain (HF download, local path, or the tiny random-weight model), then verify every
# file against checkpoint_manifest.json. Generation depends on the verification stamp, never on the
# bare directory, so it cannot start on an unverified checkpoint.


def fetch_command(wildcards, output):
    src = config["models"][wildcards.model]["source"]
    if src["type"] == "tiny":
        return (f"{PY} -m repro.checkpoint.tiny --out {output[0]} --seed {src['seed']}"
                + (" --nvfp4" if src.get("nvfp4") else ""))
    if src["type"] == "local":
        return f"{PY} -m repro.checkpoint download --name {wildcards.model} --local-path {src['path']} --out {output[0]}"
    return (f"{PY} -m repro.checkpoint download --name {wildcards.model} --repo-id {src['repo_id']} "
            f"--revision {src['revision']} --out {output[0]}")


rule download_checkpoint:
    output:
        directory(W(P.CHECKPOINT, model="{model}")),
    params:
        cmd=fetch_command,
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
        # changes when any checkpoint file changed since the stamp: a byte flip re-runs verify, which fails
        trigger=lambda wc: rerun_trigger(W(P.CHECKPOINT, model=wc.model), W(P.VERIFIED, model=wc.model)),
        pin=lambda wc: (f"--expect-manifest-sha256 {config['models'][wc.model]['source']['manifest_sha256']}"
                        if config["models"][wc.model]["source"].get("manifest_sha256") else ""),
    log:
        W("logs/verify/{model}.log"),
    threads: 2
    resources:
        runtime=60,
    shell:
        logged("{PY} -m repro.checkpoint verify {input} --stamp {output} {params.pin}")
