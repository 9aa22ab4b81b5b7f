"""Helpers for the plumbing tests (a uniquely named module: several test folders have a conftest)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def env_with_repo(**extra) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_py(args: list[str], cwd=None, env: dict | None = None, **extra_env) -> subprocess.CompletedProcess:
    """Run ``python <args>`` with this interpreter and the checkout importable; capture text output."""
    e = env_with_repo(**extra_env) if env is None else env
    return subprocess.run([sys.executable, *args], cwd=cwd, env=e, capture_output=True, text=True, timeout=300)

