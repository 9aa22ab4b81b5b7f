#!/usr/bin/env bash
# Create .venv in the checkout and install the pipeline with everything it needs (CPU or GPU machine).
#   bash scripts/setup.sh            # idempotent; re-running only installs what is missing
# Environment: PYTHON (default python3, needs >= 3.11), TORCH_SPEC (default torch==2.13.0).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is required (Snakemake 9); set PYTHON=/path/to/python3.11")'
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
# torch first, pinned: on machines that carry the CPU wheel locally this takes it from disk
.venv/bin/python -m pip install -q "${TORCH_SPEC:-torch==2.13.0}"
# the pipeline itself (editable: code changes need no re-install); skipped when pyproject.toml is unchanged since
# the last install here and the packages import (.venv/.repro-install holds pyproject.toml's sha256)
STAMP=.venv/.repro-install
WANT=$(.venv/bin/python -c 'import hashlib; print(hashlib.sha256(open("pyproject.toml", "rb").read()).hexdigest())')
if [ "$(cat "$STAMP" 2>/dev/null)" = "$WANT" ] && .venv/bin/python -c 'import repro, snakemake, triton, fastapi, pytest' 2>/dev/null; then
  echo "pipeline already installed in .venv (pyproject.toml unchanged)"
else
  rm -f "$STAMP"
  # setuptools' "Editable installation" BuildBackendWarning is a UserWarning meant for other layouts: silenced
  PYTHONWARNINGS=ignore::UserWarning .venv/bin/python -m pip install -q -e ".[workflow,kernels,serve,dev]"
  echo "$WANT" > "$STAMP"
fi
.venv/bin/python -c 'import repro, torch, snakemake; print(f"setup ok: repro {repro.__version__}, torch {torch.__version__}, snakemake ready in .venv")'
