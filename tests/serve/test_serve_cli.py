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
    assert r.returncode == 2 and r.stderr.startswith("error: --model 'nobody/no-such-model': no local folder of that "
                                                     "name, and as a hub id: cannot obtain")
    assert "Traceback" not in r.stderr


def test_model_argument_and_listen_address_checked_first(serve_tiny_dir, server):
    assert resolve_model(str(serve_tiny_dir)) == serve_tiny_dir
    with pytest.raises(ValueError, match="no such local checkpoint folder"):
        resolve_model("no/such/dir")
    with pytest.raises(ValueError, match="is a file, not a checkpoint folder"):
        resolve_model(str(serve_tiny_dir / "config.json"))
    with pytest.raises(ValueError, match=f"cannot listen on 127.0.0.1:{server.port}"):
        _check_listen("127.0.0.1", server.port)  # the test server holds it
    _check_listen("127.0.0.1", 0)


def test_missing_local_folder_is_named_as_one_not_as_a_hub_id(tmp_path, monkeypatch):
    """A --model that looks like a path (./x, ~/x, /x, a/b/c, or a/b with a/ a folder here) and does not
    exist: "no such local checkpoint folder", never the hub's pre-seeding instructions."""
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path)
    for model in ("work/nonexist", "./nonexist", "~/no-such-checkpoint-dir", str(tmp_path / "nonexist"), "a/b/c",
                  "..\\x"):
        with pytest.raises(ValueError, match=r"no such local checkpoint folder: /") as e:
            resolve_model(model)
        assert "hub" not in str(e.value).split(";")[0] and "cannot obtain" not in str(e.value), e.value
    # the README's command, before the checkpoint was written: one line, exit 2, before loading anything
    r = subprocess.run([sys.executable, "-m", "repro.engine", "serve", "--model", "work/nonexist", "--role", "orl"],
                       cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
                                          "PYTHONPATH": str(REPO_ROOT)},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"error: --model 'work/nonexist': no such local checkpoint folder: {tmp_path / 'work/nonexist'}; write one "
        "(python -m repro.checkpoint.tiny --out DIR) or give a hub id of the form owner/name"], r.stderr
