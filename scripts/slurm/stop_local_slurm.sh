#!/usr/bin/env bash
# Stop every daemon that scripts/slurm/start_local_slurm.sh started (listed, by PID, in
# $SLURM_LOCAL_BASE/started), in reverse dependency order; daemons it did not start are left alone.
# A PID is signalled only if it still runs the program of that name (guards against PID reuse). Then the
# /etc/slurm configs that start script wrote (marked by its comment) are removed: with a slurm.conf left
# behind and no controller, every `scontrol show config` waits ~10 s, and the Snakemake Slurm plugin runs
# one at start-up, so each later `snakemake` command on the machine would start 10 s late.
set -euo pipefail
BASE=${SLURM_LOCAL_BASE:-/tmp/repro-slurm}
LIST="$BASE/started"
[ -s "$LIST" ] || { echo "[slurm-local] nothing to stop ($LIST is empty or missing)"; exit 0; }
stop_one() {  # stop_one NAME PID
  local name=$1 pid=$2 comm
  [ -n "$pid" ] || return 0
  comm=$(cat "/proc/$pid/comm" 2>/dev/null || true)
  if [ -z "$comm" ]; then echo "[slurm-local] $name (pid $pid) already gone"; return 0; fi
  case "$comm" in "$name"*) ;; *) echo "[slurm-local] pid $pid is '$comm', not $name: left alone"; return 0;; esac
  kill "$pid"
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid"; fi
  echo "[slurm-local] stopped $name (pid $pid)"
}
for name in slurmd slurmctld slurmdbd mariadbd munged; do
  { grep "^$name " "$LIST" || true; } | while read -r n pid; do stop_one "$n" "$pid"; done  # none without slurmdbd
done
rm -f "$LIST"
for conf in /etc/slurm/slurm.conf /etc/slurm/slurmdbd.conf; do
  if [ -f "$conf" ] && grep -q "^# written by scripts/slurm/start_local_slurm.sh" "$conf"; then
    rm -f "$conf" && echo "[slurm-local] removed $conf"
  fi
done
