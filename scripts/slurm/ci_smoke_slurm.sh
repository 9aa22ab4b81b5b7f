#!/usr/bin/env bash
# CI: run the smoke suite through a real single-node Slurm (the `slurm` workflow profile, real sbatch +
# sacct) and check its table is byte-identical to a local run's table. One generation job is cancelled with
# scancel while it runs (sacct then says `CANCELLED by 0`): the workflow must report it failed and retry it
# (the profile's `retries: 1`), and the table must still be identical. Starts the cluster, and stops every
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
# A site profile as the README shows it (the workflow profile sets no resources, so these are not replaced), plus
# a site-wide mem_mb_per_cpu: jobs must still get the memory they declare (--mem, checked below with sacct).
mkdir -p "$SW/site"
printf 'default-resources:\n  slurm_account: %s\n  slurm_partition: %s\n  mem_mb_per_cpu: 500\n' \
  "${SLURM_TEST_ACCOUNT:-testacct}" "${SLURM_PARTITION:-debug}" > "$SW/site/config.yaml"

# Cancel the first generation job once it runs (the plugin's --comment names the rule).
cancel_one_generation_job() {
  local id
  for _ in $(seq 1 1200); do
    id=$(squeue -h -t RUNNING -o '%i %k' 2>/dev/null | awk '$2 ~ /^rule_generate_shard/ {print $1; exit}')
    if [ -n "$id" ]; then scancel "$id" && echo "$id" > "$SW/cancelled_job"; return 0; fi
    sleep 0.25
  done
}
cancel_one_generation_job &
CANCELLER=$!
"$ROOT/.venv/bin/snakemake" main_table --workflow-profile workflow/profiles/slurm --profile "$SW/site" \
  --configfile config.yaml "$@" "$SW/overlay.yaml" \
  --slurm-init-seconds-before-status-checks 1 --seconds-between-status-checks 2 \
  --jobs "${SLURM_JOBS:-4}" > "$SW/snakemake.log" 2>&1 \
  || { kill "$CANCELLER" 2>/dev/null || true; tail -40 "$SW/snakemake.log"; echo "error: the Slurm run failed; log: $SW/snakemake.log" >&2; exit 1; }
kill "$CANCELLER" 2>/dev/null || true
T2=$(date +%s)
[ -s "$SW/cancelled_job" ] || { echo "error: no running generation job was seen to cancel" >&2; exit 1; }
cid=$(cat "$SW/cancelled_job")
state=$(sacct -n -X -P -j "$cid" -o State | head -1)
[[ "$state" == CANCELLED* ]] || { echo "error: sacct says job $cid is '$state', expected CANCELLED" >&2; exit 1; }
grep -q "SLURM-job '$cid' failed, SLURM status is: 'CANCELLED'" "$SW/snakemake.log" \
  || { echo "error: the workflow did not report cancelled job $cid as failed; log: $SW/snakemake.log" >&2; exit 1; }
grep -q "Trying to restart job" "$SW/snakemake.log" \
  || { echo "error: cancelled job $cid was not retried; log: $SW/snakemake.log" >&2; exit 1; }
# the generation job's first attempt declares 4000 MB (CPU suite): --mem 4000, not the site's 500 MB per CPU
tres=$(sacct -n -X -P -j "$cid" -o ReqTRES | head -1)
[[ ",$tres," == *",mem=4000M,"* ]] || { echo "error: job $cid requested '$tres', expected mem=4000M (the rule's mem_mb)" >&2; exit 1; }
! grep -E "^(Warning: .*replaces|Note: Slurm accounting is disabled)" "$SW/snakemake.log" \
  || { echo "error: the site profile lost a setting, or sacct was taken for disabled; log: $SW/snakemake.log" >&2; exit 1; }
n_jobs=$(sacct -X -n -P -S "$(date -d @"$T1" +%Y-%m-%dT%H:%M:%S)" -o State | grep -c COMPLETED || true)
for f in main_table.md main_table.csv main_table.tex; do
  cmp "$LOCAL/$f" "$SW/results/smoke/$f" || { diff "$LOCAL/$f" "$SW/results/smoke/$f" || true; \
    echo "error: $f differs between the local run and the Slurm run" >&2; exit 1; }
done
# Slurm without accounting (no slurmdbd): sacct fails, and the plugin would poll it forever; the workflow must
# notice, poll with squeue, and finish (docs/cluster.md §2 item 4). One generation shard again, on a restarted
# cluster without slurmdbd.
bash scripts/slurm/stop_local_slurm.sh >/dev/null
SLURM_WITH_DBD=0 bash scripts/slurm/start_local_slurm.sh >/dev/null
mkdir -p "$SW/site-noacct"
printf 'default-resources:\n  slurm_partition: %s\n' "${SLURM_PARTITION:-debug}" > "$SW/site-noacct/config.yaml"
SHARD="$ORL_EVAL_WORK/smoke/generations/tiny/gsm8k/seed12345/shard0of1.jsonl"
rm -f "$SHARD"
timeout 600 "$ROOT/.venv/bin/snakemake" "$SHARD" --workflow-profile workflow/profiles/slurm --profile "$SW/site-noacct" \
  --configfile config.yaml "$@" "$SW/overlay.yaml" --slurm-init-seconds-before-status-checks 1 \
  --seconds-between-status-checks 2 --jobs 1 > "$SW/snakemake-noacct.log" 2>&1 \
  || { tail -20 "$SW/snakemake-noacct.log"; echo "error: the run without Slurm accounting failed or hung" >&2; exit 1; }
grep -q "^Note: Slurm accounting is disabled" "$SW/snakemake-noacct.log" && [ -s "$SHARD" ] \
  || { echo "error: without accounting the workflow did not switch to squeue; log: $SW/snakemake-noacct.log" >&2; exit 1; }
T3=$(date +%s)
echo "[slurm-ci] smoke suite through Slurm: $n_jobs sbatch jobs COMPLETED (sacct); generation job $cid cancelled" \
     "($state, $tres), reported failed and retried; table identical to $LOCAL;" \
     "cluster setup $(( T1 - T0 )) s, workflow $(( T2 - T1 )) s; without accounting: polled with squeue," \
     "one shard in $(( T3 - T2 )) s"
