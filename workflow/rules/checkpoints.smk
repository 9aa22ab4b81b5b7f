# Checkpoints: obtain (HF download, local path, or the tiny random-weight model), then verify every
# file against checkpoint_manifest.json. Generation depends on the verification stamp, never on the
# bare directory, so it cannot start on an unverified checkpoint. The rules reading the checkpoint take the
# folder and the stamp as ancient() and what the checkpoint is from checkpoint_source: touching a checkpoint
# file re-verifies it and regenerates nothing; another source (hub revision, local folder or its manifest,
# tiny seed or code) regenerates. With the SGLang backend an NVFP4 checkpoint is also dequantized to a BF16
# copy, verified in turn, which its generation jobs read instead (last section below).


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
    # again at start-up (reverify_stale_stamps): a fresh stamp when it passes; when it fails the stamp is
    # removed and the run stops there, naming the files and the fix
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
        mem_mb_per_cpu=0,  # --mem, never a site's --mem-per-cpu (cluster.smk)
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


# --- NVFP4 checkpoints under the SGLang backend -------------------------------------------------------------
# SGLang runs an NVFP4 (ModelOpt) checkpoint on Hopper as a BF16 model (its FP4 kernels need Blackwell), so
# with `backend: sglang` a model whose checkpoint is NVFP4 (`quantization: nvfp4`, or a tiny source with
# `nvfp4: true`) is dequantized to BF16 once (repro.checkpoint.dequantize: hashed, quant_provenance.json),
# verified like any checkpoint, and the generation jobs read that copy. The engine backend reads the NVFP4
# export directly and never makes it. The copy is keyed by content: sources/dequantized/<model>.json holds the
# checkpoint's content key, the dequantize code version and the dtype, is rewritten only when one changes, and
# is what generation depends on (the copy and its stamp are taken as ancient(), as the checkpoint's are).
from repro.checkpoint.dequantize import declared_quantization, serves_dequantized

DEQUANTIZED_DTYPE = "bfloat16"


def dequantized_key(wildcards):
    """What the BF16 copy is made from: the checkpoint's content key, the dequantize code, the dtype."""
    return json.dumps({"checkpoint": json.loads(checkpoint_content_key(wildcards)), "dtype": DEQUANTIZED_DTYPE,
                       "dequantize_code": stage_code_version("dequantize")}, sort_keys=True, separators=(",", ":"))


def generation_checkpoint(kind):
    """Input function for the generation rule: the checkpoint folder (``"dir"``), its verification stamp
    (``"verified"``; both ancient()) or its source key file (``"source"``) -- the dequantized BF16 copy's
    when the SGLang backend runs an NVFP4 checkpoint (:func:`repro.checkpoint.dequantize.serves_dequantized`),
    else the checkpoint's own."""
    plain, deq = {"dir": (P.CHECKPOINT, P.DEQUANTIZED), "verified": (P.VERIFIED, P.DEQUANTIZED_VERIFIED),
                  "source": (P.CHECKPOINT_SOURCE, P.DEQUANTIZED_SOURCE)}[kind]

    def pick(wildcards):
        path = W(deq if serves_dequantized(model_cfg(wildcards), config["backend"]) else plain,
                 model=wildcards.model)
        return path if kind == "source" else ancient(path)

    return pick


def job_precision(wildcards):
    """The precision a generation job runs (its ``--precision`` and GPU memory request): the model's own
    ``precision``, else the suite's. Under SGLang an NVFP4 checkpoint runs as its dequantized BF16 copy, so the
    engine's 4-bit mode (``nvfp4-w4a16``, the paper suite's setting for the NVFP4 model) becomes ``bf16`` there
    (start-up says so); the tables' captions then name what ran."""
    m = model_cfg(wildcards)
    p = m.get("precision", suite_cfg(wildcards)["precision"])
    return "bf16" if p == "nvfp4-w4a16" and serves_dequantized(m, config["backend"]) else p


# Precision / backend choices that cannot run, caught before any download or job (the jobs would stop with a
# traceback after the checkpoint's download and verification): one line naming the model and the fix.
def _startup_precision_errors():
    errs = []
    if config["backend"] == "sglang" and S.get("device", "cuda") == "cpu":
        errs.append(f"backend sglang runs on CUDA GPUs only, but suite {SUITE!r} has device: cpu; use backend: "
                    "engine (the smoke suite is CPU by design) or a GPU suite")
    for m in S["models"]:
        if is_replay(config, m):
            continue
        mc = config["models"][m]
        p = mc.get("precision", S["precision"])
        if config["backend"] == "engine" and p == "nvfp4":
            errs.append(f"model {m}: precision nvfp4 (FP4 weights and activations on FP4 tensor cores) needs a "
                        "Blackwell GPU and is not implemented; use nvfp4-w4a16 (4-bit experts dequantized in the "
                        "kernels) or bf16 (dequantized at load)")
        elif p == "nvfp4-w4a16" and declared_quantization(mc) != "nvfp4":
            errs.append(f"model {m}: precision nvfp4-w4a16 keeps NVFP4 experts packed, but its checkpoint is not "
                        "declared NVFP4; use bf16 or fp32, or add `quantization: nvfp4` to the model if it is an "
                        "NVFP4 export")
    return errs


_perrs = _startup_precision_errors()
if _perrs:
    for _e in _perrs:
        print(f"Config error ({_source}): {_e}", file=sys.stderr)
    sys.exit(1)


# The SGLang backend runs the dequantized copy in bf16: the engine's 4-bit mode maps to it (a note); any other
# precision asked for such a model (fp32, native nvfp4) is a mistake caught here, before a 32 GB copy is written.
if config["backend"] == "sglang":
    _deq_models = [m for m in S["models"] if not is_replay(config, m)
                   and serves_dequantized(config["models"][m], "sglang")]
    _prec = {m: config["models"][m].get("precision", S["precision"]) for m in _deq_models}
    _bad = [f"{m} (precision {p})" for m, p in _prec.items() if p not in ("bf16", "nvfp4-w4a16")]
    if _bad:
        print(f"Config error: backend sglang runs an NVFP4 checkpoint dequantized to BF16, but {', '.join(_bad)} "
              f"asks for another precision; set the model's `precision: bf16` ({_source}), or use `backend: "
              "engine` (its nvfp4-w4a16 mode keeps the experts in 4 bits)", file=sys.stderr)
        sys.exit(1)
    _w4 = [m for m, p in _prec.items() if p == "nvfp4-w4a16"]
    if _w4 and workflow.is_main_process:
        print(f"note: backend sglang runs {', '.join(_w4)} as its dequantized BF16 copy (precision bf16; "
              "nvfp4-w4a16 is the engine's 4-bit mode)", file=sys.stderr)

# a dequantized copy touched or copied since its stamp: verified again by content now (as for the checkpoints,
# common.smk reverify_stale_stamps; a dry run only reports), so a touch regenerates nothing and a changed byte
# stops the run naming the files
if workflow.is_main_process:
    reverify_stale_stamps(((W(P.DEQUANTIZED, model=m), W(P.DEQUANTIZED_VERIFIED, model=m), None)
                           for m in config["models"]), what="dequantized copy")


rule dequantized_source:
    """The dequantized copy's source key (dequantized_key) as a file, rewritten only when it changes (params
    rerun trigger): a new checkpoint, dequantize code or dtype re-makes the copy and regenerates its cells."""
    output:
        W(P.DEQUANTIZED_SOURCE, model="{model}"),
    params:
        key=dequantized_key,
    log:
        W("logs/sources/dequantized/{model}.log"),
    localrule: True
    shell:
        "printf '%s\\n' {params.key:q} > {output} && echo 'wrote {output}' > {log}"


rule dequantize_checkpoint:
    """The BF16 copy of a verified NVFP4 checkpoint (SGLang backend): every NVFP4 expert weight dequantized to
    the values the engine's dequantize-at-load path holds, the rest copied; its own manifest and
    quant_provenance.json (source key and manifest hash, dequantize code version, dtype)."""
    input:
        ckpt=ancient(W(P.CHECKPOINT, model="{model}")),
        verified=ancient(W(P.VERIFIED, model="{model}")),
        source=W(P.DEQUANTIZED_SOURCE, model="{model}"),  # what it is made from (rewritten only on a change)
    output:
        directory(W(P.DEQUANTIZED, model="{model}")),
    params:
        key=checkpoint_content_key,
    log:
        W("logs/dequantize/{model}.log"),
    threads: 2
    resources:
        **CPU_ONLY,
        runtime=lambda wc, attempt: 60 * attempt,
        mem_mb=lambda wc, attempt: 32000 * attempt,  # one shard at a time: its tensors in BF16 (~18 GB for 5 GB)
        mem_mb_per_cpu=0,  # --mem, never a site's --mem-per-cpu (cluster.smk)
    shell:
        logged("{PY} -m repro.checkpoint dequantize --src {input.ckpt} --out {output} --verified {input.verified} "
               "--source-key {params.key:q}")


rule verify_dequantized_checkpoint:
    input:
        W(P.DEQUANTIZED, model="{model}"),
    output:
        W(P.DEQUANTIZED_VERIFIED, model="{model}"),
    log:
        W("logs/verify/dequantized/{model}.log"),
    threads: 2
    resources:
        **CPU_ONLY,
        runtime=lambda wc, attempt: 60 * attempt,
        mem_mb=lambda wc, attempt: 2000 * attempt,
        mem_mb_per_cpu=0,  # --mem, never a site's --mem-per-cpu (cluster.smk)
    shell:
        logged("{PY} -m repro.checkpoint verify {input} --stamp {output}")
