# Sourced by build_images.sh, prepare.sh and main_table.sh: the Snakemake command line they share.
#   PROFILE=local|slurm  workflow profile (default local)      CORES   --cores for local runs (default all)
#   CONTAINERS=1         run jobs in the Apptainer images (adds --sdm apptainer + GPU/cache binds)
# Sets ROOT (checkout, also the cwd), SNAKEMAKE, WORK (exported as ORL_EVAL_WORK), SM_OPTS, CONFIGFILES, run().
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
SNAKEMAKE=${SNAKEMAKE:-$ROOT/.venv/bin/snakemake}
[ -x "$SNAKEMAKE" ] || { echo "error: $SNAKEMAKE not found; run bash scripts/setup.sh first" >&2; exit 2; }
PROFILE=${PROFILE:-local}
[ -d "workflow/profiles/$PROFILE" ] || { echo "error: no profile workflow/profiles/$PROFILE (local | slurm)" >&2; exit 2; }
WORK=${ORL_EVAL_WORK:-$ROOT/work}
export ORL_EVAL_WORK=$WORK
# Options go AFTER the targets: nargs='+' options (--resources, --config, --sdm) swallow a following target.
SM_OPTS=(--workflow-profile "workflow/profiles/$PROFILE")
[ "$PROFILE" = local ] && SM_OPTS+=(--cores "${CORES:-all}")
if [ "${CONTAINERS:-0}" = 1 ]; then
  mkdir -p "$WORK/hf-home" "$WORK/triton-cache"
  # --cleanenv keeps a host's PYTHONPATH/modules out; caches are bound and named explicitly
  SM_OPTS+=(--sdm apptainer
            "--apptainer-args=--nv --cleanenv --bind $WORK --env HF_HOME=$WORK/hf-home,TRITON_CACHE_DIR=$WORK/triton-cache,HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-0}")
  mkdir -p "$WORK/overlays"
  printf 'containers:\n  enabled: true\n' > "$WORK/overlays/containers.yaml"
  CONFIGFILES=(config.yaml "$WORK/overlays/containers.yaml")
else
  CONFIGFILES=(config.yaml)
fi
# (--config cannot carry a nested boolean: Snakemake leaves `containers={enabled: true}` values as strings)
run() { echo "+ $*" >&2; "$@"; }
