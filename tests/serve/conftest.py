"""Fixtures of the server tests: a tiny checkpoint and the shared default server (helpers: serve_util.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the server needs the 'serve' extra (scripts/setup.sh installs it)")
pytest.importorskip("uvicorn")

from serve_util import ServerProc  # noqa: E402

from repro.checkpoint.tiny import write_tiny  # noqa: E402


@pytest.fixture(scope="session")
def serve_tiny_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("serve_tiny")
    write_tiny(d, seed=1)
    return d


@pytest.fixture(scope="session")
def server(serve_tiny_dir, tmp_path_factory):
    """The default server (no API key, queue of 64) shared by the tests."""
    s = ServerProc(serve_tiny_dir, tmp_path_factory.mktemp("serve_log") / "server.log")
    yield s
    s.stop()
