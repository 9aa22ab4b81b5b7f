#!/usr/bin/env bash
# Prepare everything before generation for the selected suite: download + verify the checkpoints, render the
# decoder configs from paper_decoding.json, normalize the benchmark problems. Thin wrapper over Snakemake
# (`main_table --until ...`: only these stages of main_table's DAG run).
#   bash scripts/prepare.sh [SUITE] [extra snakemake args]     SUITE: smoke (default from config) | paper
set -euo pipefail
source "$(dirname "$0")/_snakemake_common.sh"
SUITE_ARGS=()
if [ $# -gt 0 ] && [[ "$1" != -* ]]; then SUITE_ARGS=(--config "suite=$1"); shift; fi
run "$SNAKEMAKE" main_table --until verify_checkpoint render_decoder prepare_problems \
  "${SM_OPTS[@]}" --configfile "${CONFIGFILES[@]}" "${SUITE_ARGS[@]}" "$@"
