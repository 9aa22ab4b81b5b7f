#!/usr/bin/env bash
# Create .venv in the checkout and install the pipeline with everything it needs (CPU or GPU machine).
#   bash scripts/setup.sh            # idempotent; re-running only installs what is missing
# Environment: PYTHON (default python3, needs >= 3.11), TORCH_SPEC (default torch==2.11.0 on a GPU machine, the
# tested stack of repro/stack.py; torch==2.13.0 on a CPU machine).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is required (Snakemake 9); set PYTHON=/path/to/python3.11")'
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
# torch first, pinned: on machines that carry the CPU wheel locally this takes it from disk
# A GPU machine gets the tested GPU stack (the `kernels` extra: torch and triton pinned as in repro/stack.py); a CPU
# machine the CPU torch and a Triton whose interpreter runs the kernel tests (`kernels-cpu`)
if nvidia-smi -L 2>/dev/null | grep -q GPU; then KERNELS=kernels; DEFAULT_TORCH=torch==2.11.0
else KERNELS=kernels-cpu; DEFAULT_TORCH=torch==2.13.0; fi
.venv/bin/python -m pip install -q "${TORCH_SPEC:-$DEFAULT_TORCH}"
# the pipeline itself (editable: code changes need no re-install). Skipped when pyproject.toml and the extras are
# unchanged since the last install here (.venv/.repro-install holds their sha256) and every requirement of those
# extras is installed at a version it accepts, with this checkout as the installed `repro` (checked from /, so the
# checkout's own folder on sys.path cannot pass for an install)
EXTRAS=workflow,$KERNELS,serve,dev,graders
STAMP=.venv/.repro-install
WANT=$( (cat pyproject.toml; echo "$EXTRAS") | .venv/bin/python -c 'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())')
installed_ok() {
  (ROOT=$PWD; cd / && "$ROOT/.venv/bin/python" - "$EXTRAS" "$ROOT" <<'PY'
import json, sys, importlib.metadata as md
try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
extras, here = sys.argv[1].split(","), sys.argv[2]
try:
    d = md.distribution("repro")
    url = json.loads(d.read_text("direct_url.json") or "{}").get("url", "")
    if url.rstrip("/") != "file://" + here.rstrip("/"):
        sys.exit(1)
    for r in map(Requirement, d.requires or []):
        if r.marker and not any(r.marker.evaluate({"extra": e}) for e in extras + [""]):
            continue
        if r.specifier and not r.specifier.contains(md.version(r.name), prereleases=True):
            sys.exit(1)
        md.version(r.name)
except (md.PackageNotFoundError, ValueError):
    sys.exit(1)
PY
  )
}
if [ "$(cat "$STAMP" 2>/dev/null)" = "$WANT" ] && installed_ok; then
  echo "pipeline already installed in .venv (pyproject.toml unchanged, every requirement present)"
else
  rm -f "$STAMP"
  # setuptools' "Editable installation" BuildBackendWarning is a UserWarning meant for other layouts: silenced
  PYTHONWARNINGS=ignore::UserWarning .venv/bin/python -m pip install -q -e ".[$EXTRAS]"
  echo "$WANT" > "$STAMP"
fi
# the independent graders' two steps pip cannot express (lm-eval without its dependencies, a private antlr4 4.11 for
# sympy's LaTeX parser; Math-Verify pins 4.13.2): each only when missing, then a check (docs/scoring.md)
.venv/bin/python -m repro.scoring.graders install
# the GPU machines' Triton (repro/stack.py), beside the interpreter's, for the ahead-of-time build of every kernel for
# the cards users own (repro/engine/aot.py, tests/kernels/test_aot.py): on a GPU machine .venv has it already
if [ "$KERNELS" = kernels-cpu ]; then
  TT=$(.venv/bin/python -c 'from repro.stack import TESTED; print(TESTED["triton"])')
  ls ".venv/share/repro/triton-$TT/triton-$TT.dist-info" >/dev/null 2>&1 || \
    .venv/bin/python -m pip install -q --no-deps --target ".venv/share/repro/triton-$TT" "triton==$TT"
fi
.venv/bin/python -c 'import repro, torch, snakemake; print(f"setup ok: repro {repro.__version__}, torch {torch.__version__}, snakemake ready in .venv")'
