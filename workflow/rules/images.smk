# Apptainer images: containers/<image>.def.j2 --render--> $WORK/images/<image>.def --build--> <image>.sif
# plus <image>.sif.json (sif sha256, base image + digest, apptainer version) for provenance.
# Include after common.smk. With `containers.enabled: false` (default) nothing here runs and every rule runs
# natively; with `true`, Snakemake must run with `--sdm apptainer` and an apptainer binary on PATH, otherwise
# the run stops at start-up with a message saying so (never a silent native run).
#
# Rules that run inside an image list it both as input (so the build runs first) and as container:
#     input:  image=image_input("generate"),      # [] when containers are disabled
#     container: image_for("generate")            # None when containers are disabled
# Kinds: "generate" -> engine.sif or sglang.sif (config backend), "cpu" -> scoring.sif (score, tables).
from repro import cluster as _cluster
from repro import containers as _containers

IMAGE_NAMES = ("engine", "sglang", "scoring")
CONTAINERS_ON = bool(config["containers"]["enabled"])


def _check_container_runtime():
    if not CONTAINERS_ON:
        return
    # one line and exit 1 (as the other start-up errors), not a WorkflowError with the Snakefile's frames
    import sys

    try:
        _containers.require_apptainer()
    except _containers.ContainerError as e:
        print(f"Config error: {e}", file=sys.stderr)
        sys.exit(1)
    if any(c.isspace() for c in WORK):  # the images live there; Snakemake refuses an image path with whitespace
        print(f"Config error: the work directory {WORK!r} holds a space, and Snakemake refuses a container image "
              "path with whitespace ('Invalid singularity image URL'); set ORL_EVAL_WORK to a path without spaces "
              "(commas are fine)", file=sys.stderr)
        sys.exit(1)
    methods = getattr(getattr(workflow, "deployment_settings", None), "deployment_method", None) or ()
    if not any(str(getattr(m, "name", m)).lower() in ("apptainer", "singularity") for m in methods):
        print("Config error: containers.enabled is true but Snakemake was started without `--sdm "
              "apptainer`, so the jobs would run natively. Add `--sdm apptainer --apptainer-args=\"--nv --cleanenv "
              "...\"` (scripts/main_table.sh does this) or set `containers: {enabled: false}`", file=sys.stderr)
        sys.exit(1)


_check_container_runtime()


def _container_setup():
    """Binds and environment of the container jobs, whatever the command line said (repro/cluster.py):
    - every path the container rules use (work dir, results dir, caches) is bound, as written in the
      commands (realpath:path when it goes through a symlink); Snakemake itself binds only the cwd;
    - under --cleanenv the GPU selection (CUDA_VISIBLE_DEVICES: Slurm's, or the user's) and the cache
      variables reach the job through APPTAINERENV_* of the process that runs `apptainer exec`. This code
      runs in that process: the local Snakemake, or the Slurm job step, which parses the workflow again."""
    if not CONTAINERS_ON:
        return
    paths = [WORK, RESULTS] + [os.environ[v] for v in ("HF_HOME", "TRITON_CACHE_DIR", "ORL_EVAL_GPU_LOCKS")
                               if os.environ.get(v)]
    for p in paths:
        os.makedirs(p, exist_ok=True)  # apptainer refuses to bind a missing path
    ds = workflow.deployment_settings
    ds.apptainer_args = _cluster.add_binds(ds.apptainer_args or "", _cluster.bind_args(paths))  # quoted
    os.environ.update(_cluster.container_env(os.environ, _containers.apptainer_binary()))


_container_setup()


def image_sif(name):
    return W(f"images/{name}.sif")


def image_for(kind):
    """The .sif a rule of this kind runs in, or None (containers disabled: run natively)."""
    if not CONTAINERS_ON:
        return None
    if kind == "generate":
        return image_sif("sglang" if config["backend"] == "sglang" else "engine")
    if kind == "cpu":
        return image_sif("scoring")
    raise ValueError(f"image_for: unknown kind {kind!r}; allowed: generate, cpu")


def image_input(kind):
    sif = image_for(kind)
    return [sif] if sif else []


def image_sidecars():
    """Sidecar JSONs of the images this run uses (for provenance); [] when containers are disabled."""
    if not CONTAINERS_ON:
        return []
    return [image_for("generate") + ".json", image_for("cpu") + ".json"]


wildcard_constraints:
    image="|".join(IMAGE_NAMES),


rule render_image_def:
    input:
        template=os.path.join(workflow.basedir, "containers/{image}.def.j2"),  # also with -d OTHER_DIR
        pins=os.path.join(workflow.basedir, "containers/images.yaml"),
    output:
        W("images/{image}.def"),
    log:
        W("logs/images/{image}.render.log"),
    localrule: True
    container: None
    shell:
        logged("{sys.executable} -m repro.containers render {wildcards.image} --out {output}")


rule build_image:
    input:
        W("images/{image}.def"),
    output:
        sif=W("images/{image}.sif"),
        meta=W("images/{image}.sif.json"),
    log:
        W("logs/images/{image}.build.log"),
    localrule: True  # pulls the base image from a registry: runs on the submit host, not a compute node
    container: None
    resources:
        runtime=180,
        mem_mb=16000,
        mem_mb_per_cpu=0,  # --mem, never a site's --mem-per-cpu (cluster.smk)
    shell:
        logged("{sys.executable} -m repro.containers build {wildcards.image} --def {input} --sif {output.sif} "
               "--sidecar {output.meta}")


rule images:
    input:
        [image_sif(n) for n in IMAGE_NAMES],
    localrule: True
