#!/usr/bin/env bash
# Prepare everything before generation for the selected suite: download + verify the checkpoints, render the
# decoder configs from paper_decoding.json (after verification), normalize the benchmark problems. Thin wrapper
# over Snakemake (`main_table --until render_decoder prepare_problems`: only these stages and what they need).
#   bash scripts/prepare.sh [SUITE] [extra snakemake args]     SUITE: smoke (default from config) | paper
set -euo pipefail
# --- shared by build_images.sh, prepare.sh, main_table.sh (kept inline: each script stands alone) ---
#   PROFILE=local|slurm  workflow profile (default local)      CORES   --cores for local runs (default all)
#   CONTAINERS=1         run jobs in the Apptainer images (adds --sdm apptainer + GPU/cache binds)
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
# --- end of shared part ---
SUITE_ARGS=()
if [ $# -gt 0 ] && [[ "$1" != -* ]]; then SUITE_ARGS=(--config "suite=$1"); shift; fi
run "$SNAKEMAKE" main_table --until render_decoder prepare_problems \
  "${SM_OPTS[@]}" --configfile "${CONFIGFILES[@]}" "${SUITE_ARGS[@]}" "$@"
