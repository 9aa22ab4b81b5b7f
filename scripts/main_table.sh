#!/usr/bin/env bash
# The main table for one model from a local checkpoint folder (the model card's command):
#   bash scripts/main_table.sh MODEL CKPT_DIR [extra snakemake args]
#   e.g. bash scripts/main_table.sh llada-orl /data/LLaDA2.1-mini-ORL
# MODEL is a model of config.yaml (its label, role and decoder are kept); CKPT_DIR replaces its source
# (type: local; the folder is copied/hard-linked into $ORL_EVAL_WORK/hf/MODEL-local and verified against its
# checkpoint_manifest.json before any generation). SUITE (default paper) picks the suite; the table has this
# one model unless KEEP_SUITE_MODELS=1. PROFILE=local|slurm, CONTAINERS=1: see below. Your own
# `--configfile config.yaml my.yaml` (in the extra args) is combined: config.yaml, my.yaml, then this overlay.
# Output: <results_dir>/<SUITE>/main_table.{md,tex,csv} + provenance.json.
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,10p' "$0" >&2; exit 2; }
MODEL=$1; CKPT=$(cd "$2" 2>/dev/null && pwd) || {
  echo "error: CKPT_DIR $2 is not a directory; give the checkpoint folder (the one holding config.json)" >&2; exit 2; }
shift 2
# shared command-line set-up (PROFILE, CORES, CONTAINERS; see the file)
source "$(dirname "${BASH_SOURCE[0]}")/_snakemake_common.sh"
SUITE=${SUITE:-paper}
mkdir -p "$WORK/overlays"
OVERLAY="$WORK/overlays/main_table.$MODEL.yaml"
# your --configfile files (extra args) go between config.yaml and this script's overlay: Snakemake would keep
# only the last --configfile option, so they are combined into one
take_configfiles "$@"
check_yaml "${USER_CONFIGFILES[@]+"${USER_CONFIGFILES[@]}"}"
"$ROOT/.venv/bin/python" - "$MODEL" "$CKPT" "$SUITE" "${KEEP_SUITE_MODELS:-0}" "$OVERLAY" \
  "${USER_CONFIGFILES[@]+"${USER_CONFIGFILES[@]}"}" <<'PY'
import sys, yaml
model, ckpt, suite, keep, out, *extra = sys.argv[1:]


def merge(base, over):  # nested keys merge, as Snakemake merges --configfile files
    for k, v in over.items():
        base[k] = merge(dict(base[k]), v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return base


cfg = yaml.safe_load(open("config.yaml"))
for f in extra:
    try:
        cfg = merge(cfg, yaml.safe_load(open(f)) or {})
    except OSError as e:
        sys.exit(f"error: --configfile {f}: {e.strerror}")
if extra:
    print(f"configfiles: config.yaml, {', '.join(extra)}, then {out} (this script's overlay: the suite, "
          f"{model}-local and the suite's models)", file=sys.stderr)
if model not in cfg["models"]:
    sys.exit(f"error: model {model!r} is not in config.yaml; available: {', '.join(cfg['models'])}")
if suite not in cfg["suites"]:
    sys.exit(f"error: suite {suite!r} is not in config.yaml; available: {', '.join(cfg['suites'])}")
local = f"{model}-local"
entry = dict(cfg["models"][model], source={"type": "local", "path": ckpt})
models = list(cfg["suites"][suite]["models"]) if keep == "1" else []
models = [m for m in models if m != model] + [local]
overlay = {"suite": suite, "models": {local: entry}, "suites": {suite: {"models": models}}}
open(out, "w").write(yaml.safe_dump(overlay, sort_keys=True))
print(f"overlay {out}: {local} <- {ckpt}; suite {suite} models {models}", file=sys.stderr)
if keep != "1":
    print(f"note: the table written to {cfg.get('results_dir') or 'results'}/{suite}/ has only {local}; it replaces a "
          f"table of the whole suite there (KEEP_SUITE_MODELS=1 keeps the suite's other models)", file=sys.stderr)
PY
run "$SNAKEMAKE" main_table "${SM_OPTS[@]}" --configfile "${CONFIGFILES[@]}" \
  "${USER_CONFIGFILES[@]+"${USER_CONFIGFILES[@]}"}" "$OVERLAY" "${OTHER_ARGS[@]+"${OTHER_ARGS[@]}"}"
