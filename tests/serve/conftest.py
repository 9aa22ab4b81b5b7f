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


@pytest.fixture(scope="session")
def tiny_llm(serve_tiny_dir):
    """The tiny checkpoint loaded in the test process (what the servers run, for comparisons)."""
    from repro.engine.llm import LLM

    return LLM(serve_tiny_dir, role="orl", device="cpu")


@pytest.fixture(scope="session")
def long_messages(tiny_llm):
    """A chat prompt the tiny model answers with ≥ 128 tokens before EOS (≥ 4 blocks)."""
    from serve_util import probe_long_messages

    return probe_long_messages(tiny_llm)
