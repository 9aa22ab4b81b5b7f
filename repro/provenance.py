"""Provenance helpers: code revision, file hashes, environment — attached to every stage's outputs."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

from repro import __version__

REPO_ROOT = Path(__file__).resolve().parent.parent


def code_revision() -> str:
    """``git describe``-style revision of the checkout (``<sha>`` or ``<sha>-dirty``), else the version."""
    env_rev = os.environ.get("ORL_EVAL_CODE_REVISION")
    if env_rev:
        return env_rev
    try:
        sha = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no",
                                "--", "repro", "workflow", "Snakefile"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return f"repro-{__version__}"


def tree_digest(*packages: str) -> str:
    """sha256 over the sources (``*.py``, ``*.j2``, ``*.json``) of the named package folders under the
    checkout, e.g. ``tree_digest("repro/scoring")``; used as a Snakemake param so that a code change
    re-runs the stage."""
    h = hashlib.sha256()
    for pkg in packages:
        for p in sorted((REPO_ROOT / pkg).rglob("*")):
            if p.is_file() and p.suffix in (".py", ".j2", ".json") and "__pycache__" not in p.parts:
                h.update(p.relative_to(REPO_ROOT).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def sha256_path(path: str | os.PathLike) -> str:
    """sha256 of a (small) file's bytes, hex."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
