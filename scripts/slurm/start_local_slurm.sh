#!/usr/bin/env bash
# Start a single-node Slurm cluster with accounting on this machine, for CI (Debian 12, run as root, no
# systemd needed): munge, MariaDB, slurmdbd, slurmctld, slurmd as plain daemons, then a smoke test
# (srun + sbatch + sacct). Recipe and pitfalls: docs/cluster.md.
#
#   sudo bash scripts/slurm/start_local_slurm.sh     # idempotent: a running cluster is left as it is
#   bash scripts/slurm/stop_local_slurm.sh           # stops exactly the daemons this script started
#
# Writes /etc/slurm/slurm.conf and /etc/slurm/slurmdbd.conf (the config MUST be at /etc/slurm: the
# snakemake slurm-jobstep plugin strips SLURM_CONF before its inner srun); everything else lives under
# $SLURM_LOCAL_BASE (default /tmp/repro-slurm). The PIDs of the daemons started here are listed in
# $SLURM_LOCAL_BASE/started (one "name pid" per line) for stop_local_slurm.sh.
# Env: SLURM_LOCAL_BASE, SLURM_WITH_DBD=1|0 (0: no accounting; then use --slurm-status-command squeue),
#      SLURM_TEST_ACCOUNT (default testacct), SLURM_PARTITION (default debug).
# Afterwards: snakemake ... --workflow-profile workflow/profiles/slurm \
#      --profile SITE (default-resources: {slurm_account: testacct, slurm_partition: debug}) --slurm-init-seconds-before-status-checks 1
set -euo pipefail
BASE=${SLURM_LOCAL_BASE:-/tmp/repro-slurm}
WITH_DBD=${SLURM_WITH_DBD:-1}
ACCOUNT=${SLURM_TEST_ACCOUNT:-testacct}
PARTITION=${SLURM_PARTITION:-debug}
MYSOCK=/run/mysqld/mysqld.sock
T0=$(date +%s)
log() { echo "[slurm-local +$(( $(date +%s) - T0 ))s] $*"; }
die() { echo "[slurm-local] ERROR: $*" >&2; exit 1; }
started() { echo "$1 $2" >> "$BASE/started"; }

[ "$(id -u)" = 0 ] || die "run as root (it installs packages and writes /etc/slurm)"

wait_for() {  # wait_for SECONDS CMD... ; polls every 0.25 s
  local n=$(( $1 * 4 )); shift
  for _ in $(seq 1 "$n"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.25; done
  return 1
}
pid_of_file() { [ -s "$1" ] && cat "$1" || echo ""; }

if [ "$WITH_DBD" = 1 ] && [[ "$(scontrol ping 2>/dev/null)" == *UP* ]] && [[ "$(sacctmgr -n -P show cluster format=cluster 2>/dev/null)" == *localcluster* ]] \
   && [[ "$(sinfo -h -N -o %T 2>/dev/null)" =~ ^(idle|mixed|allocated)$ ]]; then
  log "cluster already up: $(sinfo -h -o '%P %a %D %T %N')"; exit 0
fi

# --- packages (Debian 12: slurm-wlm 22.05, munge, slurmdbd, mariadb-server) -------------------------------
pkgs="slurm-wlm munge"
[ "$WITH_DBD" = 1 ] && pkgs="$pkgs slurmdbd mariadb-server"
# shellcheck disable=SC2086
if ! dpkg -s $pkgs >/dev/null 2>&1; then
  log "installing $pkgs"
  apt-get update -qq
  # no systemd / policy-rc.d: the postinst scripts cannot start services, which is what we want
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $pkgs >/dev/null
  log "packages installed"
fi
mkdir -p "$BASE"/{state,spool,log,run} /etc/slurm
touch "$BASE/started"

# --- node shape from slurmd -C; hostname is not 'localhost', so the node is named localhost explicitly ----
hw=$(slurmd -C | head -1)
field() { sed -n "s/.* $1=\([0-9]*\).*/\1/p" <<<"$hw"; }
cpus=$(field CPUs); sockets=$(field SocketsPerBoard); cores=$(field CoresPerSocket)
threads=$(field ThreadsPerCore); mem=$(( $(field RealMemory) * 95 / 100 ))
if [ "$WITH_DBD" = 1 ]; then
  acct="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=6819
AccountingStorageEnforce=associations"
else
  acct="AccountingStorageType=accounting_storage/none"
fi
cat > /etc/slurm/slurm.conf <<CONF
# written by scripts/slurm/start_local_slurm.sh (single-node CI cluster)
ClusterName=localcluster
SlurmctldHost=localhost
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1000
SchedulerType=sched/backfill
ReturnToService=2
MinJobAge=300
StateSaveLocation=$BASE/state
SlurmdSpoolDir=$BASE/spool
SlurmctldPidFile=$BASE/run/slurmctld.pid
SlurmdPidFile=$BASE/run/slurmd.pid
SlurmctldLogFile=$BASE/log/slurmctld.log
SlurmdLogFile=$BASE/log/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
$acct
JobCompType=jobcomp/none
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus Boards=1 SocketsPerBoard=$sockets CoresPerSocket=$cores ThreadsPerCore=$threads RealMemory=$mem State=UNKNOWN
PartitionName=$PARTITION Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF

# --- munge ------------------------------------------------------------------------------------------------
[ -s /etc/munge/munge.key ] || runuser -u munge -- mungekey -c
mkdir -p /run/munge && chown munge:munge /run/munge
if ! (munge -n | unmunge) >/dev/null 2>&1; then
  runuser -u munge -- /usr/sbin/munged
  wait_for 10 sh -c 'munge -n | unmunge' || die "munged did not start"
  started munged "$(pid_of_file /run/munge/munged.pid)"
fi
log "munge up"

# --- MariaDB + slurmdbd -----------------------------------------------------------------------------------
if [ "$WITH_DBD" = 1 ]; then
  if [ ! -d "$BASE/mysql/mysql" ]; then
    mkdir -p "$BASE/mysql" && chown mysql:mysql "$BASE/mysql"
    mariadb-install-db --no-defaults --user=mysql --datadir="$BASE/mysql" \
      --auth-root-authentication-method=socket --skip-test-db > "$BASE/log/mysql_install.log" 2>&1 \
      || { cat "$BASE/log/mysql_install.log"; die "mariadb-install-db failed"; }
  fi
  mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
  if ! mariadb-admin --socket=$MYSOCK ping >/dev/null 2>&1; then
    # pid file and error log inside the mysql-owned datadir (mariadbd runs as mysql)
    nohup mariadbd --no-defaults --user=mysql --datadir="$BASE/mysql" --socket=$MYSOCK \
      --pid-file="$BASE/mysql/mysqld.pid" --log-error="$BASE/mysql/mysqld.err" --skip-networking \
      --innodb-buffer-pool-size=128M >/dev/null 2>&1 &
    wait_for 30 mariadb-admin --socket=$MYSOCK ping || { tail -20 "$BASE/mysql/mysqld.err"; die "mariadbd did not start"; }
    started mariadbd "$(pid_of_file "$BASE/mysql/mysqld.pid")"
  fi
  mariadb --socket=$MYSOCK -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
    CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurmpw';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"
  log "mariadb up"
  cat > /etc/slurm/slurmdbd.conf <<CONF
# written by scripts/slurm/start_local_slurm.sh (single-node CI cluster)
AuthType=auth/munge
DbdHost=localhost
DbdPort=6819
SlurmUser=root
DebugLevel=info
LogFile=$BASE/log/slurmdbd.log
PidFile=$BASE/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=slurmpw
StorageLoc=slurm_acct_db
CONF
  chmod 600 /etc/slurm/slurmdbd.conf   # slurmdbd refuses a readable config
  if ! sacctmgr -n show cluster >/dev/null 2>&1; then
    slurmdbd
    wait_for 30 sacctmgr -n show cluster || { tail -20 "$BASE/log/slurmdbd.log"; die "slurmdbd did not start"; }
    started slurmdbd "$(pid_of_file "$BASE/run/slurmdbd.pid")"
  fi
  # cluster, account and root association before slurmctld registers
  sacctmgr -i -Q add cluster localcluster >/dev/null 2>&1 || true
  sacctmgr -i -Q add account "$ACCOUNT" Cluster=localcluster Description=ci Organization=ci >/dev/null 2>&1 || true
  sacctmgr -i -Q add user root Account="$ACCOUNT" Cluster=localcluster >/dev/null 2>&1 || true
  log "slurmdbd up; associations: $(sacctmgr -n -P show assoc format=account,user | tr '\n' ' ')"
fi

# --- slurmctld + slurmd -----------------------------------------------------------------------------------
if [[ "$(scontrol ping 2>/dev/null)" != *UP* ]]; then
  slurmctld
  wait_for 30 sh -c 'scontrol ping | grep -q UP' || { tail -20 "$BASE/log/slurmctld.log"; die "slurmctld did not start"; }
  started slurmctld "$(pid_of_file "$BASE/run/slurmctld.pid")"
else
  scontrol reconfigure >/dev/null 2>&1 || true
fi
if ! pid=$(pid_of_file "$BASE/run/slurmd.pid") || [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
  rm -f "$BASE/run/slurmd.pid"
  slurmd -N localhost
  wait_for 10 test -s "$BASE/run/slurmd.pid" || die "slurmd wrote no pid file; see $BASE/log/slurmd.log"
  started slurmd "$(pid_of_file "$BASE/run/slurmd.pid")"
fi
wait_for 30 sh -c 'sinfo -h -N -o %T | grep -Eqx "idle|mixed"' || { sinfo; tail -20 "$BASE/log/slurmd.log"; die "node not idle"; }
log "slurm up: $(sinfo -h -o '%P %a %D %T %N')"

# --- smoke test: srun, sbatch, and (with accounting) sacct ------------------------------------------------
srun -N1 -n1 true
jid=$(sbatch --parsable -o /dev/null --wrap 'true')
wait_for 30 sh -c "scontrol show job $jid | grep -q JobState=COMPLETED" || { scontrol show job "$jid"; die "smoke job $jid did not complete"; }
if [ "$WITH_DBD" = 1 ]; then
  wait_for 30 sh -c "sacct -n -X -P -j $jid -o State | grep -qx COMPLETED" || { sacct -j "$jid"; die "sacct does not see job $jid"; }
  log "smoke test ok: job $jid $(sacct -n -X -P -j "$jid" -o State,Account)"
else
  log "smoke test ok: job $jid (no accounting: pass --slurm-status-command squeue to snakemake)"
fi
log "ready in $(( $(date +%s) - T0 )) s; daemons started by this script: $(tr '\n' ' ' < "$BASE/started")"
