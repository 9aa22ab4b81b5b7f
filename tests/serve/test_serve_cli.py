"""``python -m repro.engine serve`` refuses what it cannot serve with one ``error:`` line and exit status 2,
before loading a model or listening."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from repro.config import REPO_ROOT
from repro.engine.serve import _check_listen, resolve_model


def test_unreachable_hub_id_is_one_error_line(serve_tiny_dir):
    r = subprocess.run([sys.executable, "-m", "repro.engine", "serve", "--model", "nobody/no-such-model"],
                       cwd=REPO_ROOT, env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("error: --model 'nobody/no-such-model': cannot obtain")
    assert "Traceback" not in r.stderr


def test_model_argument_and_listen_address_checked_first(serve_tiny_dir, server):
    assert resolve_model(str(serve_tiny_dir)) == serve_tiny_dir
    with pytest.raises(ValueError, match="not a checkpoint directory nor a hub id"):
        resolve_model("no/such/dir")
    with pytest.raises(ValueError, match=f"cannot listen on 127.0.0.1:{server.port}"):
        _check_listen("127.0.0.1", server.port)  # the test server holds it
    _check_listen("127.0.0.1", 0)
