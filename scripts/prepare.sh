#!/usr/bin/env bash
# Prepare everything before generation for the selected suite: download + verify the checkpoints, render the
# decoder configs from paper_decoding.json (after verification), normalize the benchmark problems. Thin wrapper
# over Snakemake (`main_table --until render_decoder prepare_problems prepare_generation_problems`: only these
# stages and what they need).
#   bash scripts/prepare.sh [SUITE] [extra snakemake args]     SUITE: smoke (default from config) | paper
set -euo pipefail
# shared command-line set-up (PROFILE, CORES, CONTAINERS; see the file)
source "$(dirname "${BASH_SOURCE[0]}")/_snakemake_common.sh"
SUITE_ARGS=()
if [ $# -gt 0 ] && [[ "$1" != -* ]]; then SUITE_ARGS=(--config "suite=$1"); shift; fi
take_configfiles "$@"   # yours after CONFIGFILES, in one --configfile option (Snakemake keeps the last one only)
run "$SNAKEMAKE" main_table --until render_decoder prepare_problems prepare_generation_problems \
  "${SM_OPTS[@]}" --configfile "${CONFIGFILES[@]}" "${USER_CONFIGFILES[@]+"${USER_CONFIGFILES[@]}"}" \
  "${SUITE_ARGS[@]}" "${OTHER_ARGS[@]+"${OTHER_ARGS[@]}"}"
