#!/usr/bin/env bash
# CI: run the smoke suite through a real single-node Slurm (the `slurm` workflow profile, real sbatch +
# sacct) and check its table is byte-identical to a local run's table. Starts the cluster, and stops every
# daemon it started on exit (also on failure).
#   bash scripts/slurm/ci_smoke_slurm.sh LOCAL_RESULTS_DIR [CONFIGFILE ...]
#   e.g. bash scripts/slurm/ci_smoke_slurm.sh results/smoke "$ORL_EVAL_WORK.overlay.yaml"
# LOCAL_RESULTS_DIR holds main_table.{md,csv,tex} of the local run made with config.yaml + the same
# CONFIGFILEs. Env: ORL_EVAL_DATA (passed through), SLURM_JOBS (default 4), KEEP_SLURM=1 (leave it running).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
[ $# -ge 1 ] || { sed -n '2,9p' "$0" >&2; exit 2; }
LOCAL=$1; shift
for f in main_table.md main_table.csv main_table.tex; do
  [ -s "$LOCAL/$f" ] || { echo "error: $LOCAL/$f missing: run the local smoke suite first" >&2; exit 2; }
done
T0=$(date +%s)
bash scripts/slurm/start_local_slurm.sh
[ "${KEEP_SLURM:-0}" = 1 ] || trap 'bash "$ROOT/scripts/slurm/stop_local_slurm.sh"' EXIT
T1=$(date +%s)

SW=$(mktemp -d /tmp/repro-slurm-smoke.XXXXXX)
printf 'results_dir: %s/results\n' "$SW" > "$SW/overlay.yaml"
export ORL_EVAL_WORK="$SW/work"
# (The workflow profile sets no default-resources, so account/partition come from here, like a site profile.)
"$ROOT/.venv/bin/snakemake" main_table --workflow-profile workflow/profiles/slurm \
  --configfile config.yaml "$@" "$SW/overlay.yaml" \
  --default-resources slurm_account="${SLURM_TEST_ACCOUNT:-testacct}" slurm_partition="${SLURM_PARTITION:-debug}" \
  --slurm-init-seconds-before-status-checks 1 --seconds-between-status-checks 2 \
  --jobs "${SLURM_JOBS:-4}" > "$SW/snakemake.log" 2>&1 \
  || { tail -40 "$SW/snakemake.log"; echo "error: the Slurm run failed; log: $SW/snakemake.log" >&2; exit 1; }
T2=$(date +%s)
n_jobs=$(sacct -X -n -P -S "$(date -d @"$T1" +%Y-%m-%dT%H:%M:%S)" -o State | grep -c COMPLETED || true)
for f in main_table.md main_table.csv main_table.tex; do
  cmp "$LOCAL/$f" "$SW/results/smoke/$f" || { diff "$LOCAL/$f" "$SW/results/smoke/$f" || true; \
    echo "error: $f differs between the local run and the Slurm run" >&2; exit 1; }
done
echo "[slurm-ci] smoke suite through Slurm: $n_jobs sbatch jobs COMPLETED (sacct); table identical to $LOCAL;" \
     "cluster setup $(( T1 - T0 )) s, workflow $(( T2 - T1 )) s"
