"""The tested GPU stack (repro/stack.py) is the one the engine image, the `kernels` extra and docs/perf.md name,
and the engine refuses another Triton on the GPU with one line (the CPU interpreter takes any)."""

from __future__ import annotations

import re
import tomllib
import types
from pathlib import Path

import pytest
from spython.main.parse.parsers import SingularityParser

from repro.containers import load_images, render_def
from repro.engine.kernels import _triton
from repro.stack import TESTED, release, triton_problem

ROOT = Path(__file__).resolve().parent.parent


def test_engine_image_pins_exactly_the_tested_stack(tmp_path):
    text, info = render_def("engine", allow_unpinned=True)
    (tmp_path / "engine.def").write_text(text)
    post = "\n".join(SingularityParser(str(tmp_path / "engine.def")).recipe["spython-base"].install)
    pins = dict(re.findall(r'"(torch|triton)==([^"]+)"', post))
    assert pins == {"torch": TESTED["torch"], "triton": TESTED["triton"]}
    # the build itself checks what it installed: versions and the CUDA build of torch
    assert f"torch.version.cuda == '{TESTED['cuda']}'" in post and f"startswith('{TESTED['python']}.')" in post
    base = load_images()["engine"]["base"]
    assert f"cuda:{TESTED['cuda']}." in base and "ubuntu24.04" in base  # Ubuntu 24.04's python3 is 3.12
    assert "pytorch/pytorch" not in text  # no torch/Triton from a base image


def test_kernels_extra_and_perf_notes_name_the_same_versions():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert sorted(extras["kernels"]) == sorted(f"{k}=={TESTED[k]}" for k in ("torch", "triton"))
    line = next(l for l in (ROOT / "docs" / "perf.md").read_text().splitlines() if l.startswith("Tested stack"))
    for k in ("python", "torch", "triton", "cuda"):
        assert re.search(rf"\b{k} {re.escape(TESTED[k])}\b", line, re.I), (k, line)


def test_untested_triton_is_refused_on_the_gpu_path_only(monkeypatch):
    assert triton_problem("3.6.0") is None and triton_problem("3.6.0+git1a2b3c") is None
    assert release("2.11.0+cu130") == "2.11.0"
    msg = triton_problem("3.1.0")
    assert "Triton 3.1.0 is installed" in msg and "triton==3.6.0" in msg and "\n" not in msg
    monkeypatch.setattr(_triton, "triton", types.SimpleNamespace(__version__="3.1.0"))
    monkeypatch.setattr(_triton, "HAS_TRITON", True)
    monkeypatch.setattr(_triton, "_TRITON_CHECKED", [])
    monkeypatch.setattr(_triton, "INTERPRET", False)
    monkeypatch.delenv("REPRO_ALLOW_UNTESTED_TRITON", raising=False)
    cuda, cpu = types.SimpleNamespace(is_cuda=True), types.SimpleNamespace(is_cuda=False)
    with pytest.raises(RuntimeError, match=r"^Triton 3\.1\.0 is installed, but .* triton==3\.6\.0"):
        _triton.kernels_usable(cuda)
    assert _triton.kernels_usable(cpu) is False  # the CPU path never asks
    monkeypatch.setattr(_triton, "INTERPRET", True)  # Triton's CPU interpreter (CI): any version
    assert _triton.kernels_usable(cuda) is True
    monkeypatch.setattr(_triton, "INTERPRET", False)
    monkeypatch.setenv("REPRO_ALLOW_UNTESTED_TRITON", "1")  # the documented way to try another release
    assert _triton.kernels_usable(cuda) is True
