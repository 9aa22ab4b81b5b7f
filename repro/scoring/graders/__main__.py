"""``python -m repro.scoring.graders install | check``: make every independent grader available, or say what is missing.

``install`` does the two steps pip's dependency resolution cannot express, each only when missing (the Python
packages of the graders are the ``graders`` extra of pyproject.toml):
- lm-evaluation-harness without its dependencies (``pip install --no-deps lm-eval==0.4.13``): the Minerva grader
  is one file of it, loaded by path; lm-eval's own dependencies (datasets, evaluate, scikit-learn, ...) are not used;
- antlr4-python3-runtime 4.11 into a private folder (``pip install --no-deps --target <ANTLR_DIR>``): sympy's LaTeX
  parser needs 4.11 while Math-Verify pins 4.13.2 in site-packages (graders/minerva.py).
``check`` prints one line per grader that cannot run (exit status 1), or "all graders available" (0).
Used by scripts/setup.sh, .ci/run and containers/scoring.def.j2; the workflow and the scoring CLI stop at
start-up naming this command when a grader is missing.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from repro import benchmarks

from . import missing
from .minerva import ANTLR_DIR, ANTLR_PIP, LM_EVAL_PIP, minerva_file


def install() -> int:
    """Install what is missing (module docstring); the exit status of the first failing pip, else 0."""
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps"]
    if minerva_file() is None:
        rc = subprocess.call(pip + [LM_EVAL_PIP])
        if rc:
            return rc
    if not list(Path(ANTLR_DIR).glob("antlr4_python3_runtime-4.11*.dist-info")):
        rc = subprocess.call(pip + ["--target", ANTLR_DIR, ANTLR_PIP])
        if rc:
            return rc
    return check()


def check() -> int:
    """Print what cannot run; 1 when something cannot, else 0."""
    lines = missing(benchmarks.names())
    print("\n".join(lines) if lines else "all graders available")
    return 1 if lines else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["install"]:
        return install()
    if argv[:1] == ["check"]:
        return check()
    print("usage: python -m repro.scoring.graders install | check", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
