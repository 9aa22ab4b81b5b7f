#!/usr/bin/env bash
# Build the Apptainer images (containers/*.def.j2 -> $ORL_EVAL_WORK/images/{engine,sglang,scoring}.sif, each
# with a .sif.json sidecar holding its sha256). Thin wrapper over `snakemake images`.
#   bash scripts/build_images.sh [extra snakemake args]      e.g. ... --forcerun build_image
# Needs apptainer (or singularity) on PATH and unprivileged --fakeroot builds. The base-image digests in
# containers/images.yaml are not filled in: pin them, or set REPRO_ALLOW_UNPINNED_BASE=1 to build from tags.
set -euo pipefail
# shared command-line set-up (PROFILE, CORES, CONTAINERS; see the file)
source "$(dirname "${BASH_SOURCE[0]}")/_snakemake_common.sh"
command -v apptainer >/dev/null || command -v singularity >/dev/null \
  || { echo "error: apptainer is not on PATH; install Apptainer >= 1.1 to build images" >&2; exit 2; }
run "$SNAKEMAKE" images "${SM_OPTS[@]}" "$@"
