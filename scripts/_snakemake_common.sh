# Sourced by build_images.sh, prepare.sh and main_table.sh: the Snakemake command line they share.
#   PROFILE=local|slurm  workflow profile (default local)      CORES   --cores for local runs (default all)
#   CONTAINERS=1         run jobs in the Apptainer images (adds --sdm apptainer + GPU/cache binds)
# Sets ROOT (checkout, also the cwd), SNAKEMAKE, PY_CHECK, WORK (exported as ORL_EVAL_WORK), SM_OPTS, CONFIGFILES,
# run() (checks the YAML syntax of every --configfile first: errors name file, line and column),
# take_configfiles() (the caller's --configfile files, to combine with the script's own: Snakemake keeps only
# the last --configfile option of a command line).
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CALLER_PWD=$PWD
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
  # --cleanenv keeps a host's PYTHONPATH/modules out. The caches reach the jobs as APPTAINERENV_* variables, not as
  # a comma-joined --env list (a work directory with a comma or a space would break it); the workflow binds $WORK
  # and any HF_HOME/TRITON_CACHE_DIR, quoted (repro/cluster.py bind_args), and forwards set ones (container_env).
  if command -v apptainer >/dev/null; then ENVP=APPTAINERENV_; else ENVP=SINGULARITYENV_; fi
  export "${ENVP}HF_HOME=$WORK/hf-home" "${ENVP}TRITON_CACHE_DIR=$WORK/triton-cache" \
         "${ENVP}HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-0}"
  SM_OPTS+=(--sdm apptainer "--apptainer-args=--nv --cleanenv")
  mkdir -p "$WORK/overlays"
  printf 'containers:\n  enabled: true\n' > "$WORK/overlays/containers.yaml"
  CONFIGFILES=(config.yaml "$WORK/overlays/containers.yaml")
else
  CONFIGFILES=(config.yaml)
fi
# (--config cannot carry a nested boolean: Snakemake leaves `containers={enabled: true}` values as strings)

# YAML syntax errors with file, line and column: Snakemake reads --configfile files before any workflow
# code runs and only says "Config file is not valid JSON or YAML", so every config file is checked first
# (python -m repro.config check-yaml exits 65 on a syntax error; if the check itself cannot run, Snakemake's
# own message stands).
PY_CHECK=$(dirname "$SNAKEMAKE")/python
[ -x "$PY_CHECK" ] || PY_CHECK=$ROOT/.venv/bin/python
check_yaml() {
  [ $# -gt 0 ] || return 0
  local rc=0
  "$PY_CHECK" -m repro.config check-yaml "$@" || rc=$?
  if [ "$rc" = 65 ]; then exit 2; fi
  if [ "$rc" != 0 ]; then echo "warning: YAML syntax check skipped ($PY_CHECK exited $rc)" >&2; fi
  return 0
}
check_yaml config.yaml   # read by the scripts themselves (main_table.sh) before Snakemake runs
# Snakemake 7 site profiles (cluster:, cluster-config:, ...): Snakemake 9's argument parser rejects them
# without saying what replaced them; say it (python -m repro.cluster check-profile, exit 2) before starting.
check_profiles() {
  local profiles=() prev="" a
  [ -n "${SNAKEMAKE_PROFILE:-}" ] && profiles+=("$SNAKEMAKE_PROFILE")
  for a in "$@"; do
    case "$prev" in --profile|--workflow-profile) profiles+=("$a") ;; esac
    case "$a" in --profile=*|--workflow-profile=*) profiles+=("${a#*=}") ;; esac
    prev=$a
  done
  [ ${#profiles[@]} -gt 0 ] || return 0
  local rc=0
  "$PY_CHECK" -m repro.cluster check-profile "${profiles[@]}" || rc=$?
  if [ "$rc" = 2 ]; then exit 2; fi
  return 0
}
# run CMD...: echo and run it, after checking the YAML syntax of every file after --configfile(s) and the
# profiles it names
run() {
  local files=() in_cf=0 a
  for a in "$@"; do
    case "$a" in
      --configfile|--configfiles) in_cf=1 ;;
      --configfile=*|--configfiles=*) files+=("${a#*=}"); in_cf=0 ;;
      -*) in_cf=0 ;;
      *) if [ "$in_cf" = 1 ]; then files+=("$a"); fi ;;
    esac
  done
  check_yaml "${files[@]+"${files[@]}"}"
  check_profiles "$@"
  echo "+ $*" >&2; "$@"
}

# take_configfiles ARGS...: the files after --configfile/--configfiles in ARGS go to USER_CONFIGFILES (a relative
# one that exists from the caller's directory made absolute; the checkout's config.yaml left out, CONFIGFILES has
# it first), the other arguments to OTHER_ARGS. Snakemake keeps only the last --configfile option of a command
# line, so a script that adds its own files passes `--configfile "${CONFIGFILES[@]}" USER_CONFIGFILES... OWN...`
# once, then OTHER_ARGS.
take_configfiles() {
  USER_CONFIGFILES=(); OTHER_ARGS=()
  local in_cf=0 a f
  for a in "$@"; do
    f=""
    case "$a" in
      --configfile|--configfiles) in_cf=1; continue ;;
      --configfile=*|--configfiles=*) f=${a#*=}; in_cf=0 ;;
      -*) in_cf=0 ;;
      *) if [ "$in_cf" = 1 ]; then f=$a; fi ;;
    esac
    if [ -z "$f" ]; then OTHER_ARGS+=("$a"); continue; fi
    case "$f" in /*) ;; *) if [ -e "$CALLER_PWD/$f" ]; then f="$CALLER_PWD/$f"; fi ;; esac
    if [ "$(realpath -m "$f")" != "$ROOT/config.yaml" ]; then USER_CONFIGFILES+=("$f"); fi
  done
}
