"""Fixtures for the plumbing tests; helpers live in plumbing_util (import that, not conftest)."""

from __future__ import annotations

from pathlib import Path

import pytest

from plumbing_util import ROOT


@pytest.fixture
def repo_root() -> Path:
    return ROOT
