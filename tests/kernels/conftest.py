"""Kernel tests: on a CPU-only machine the Triton kernels run under TRITON_INTERPRET=1 (set here, before
the kernel modules are imported) on small fp32/fp16 shapes; ``@pytest.mark.gpu`` tests run bf16 at the
model's shapes and skip without CUDA. All tests skip cleanly when triton is not installed."""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip_gpu)


@pytest.fixture
def dev():
    """Device for the small-shape tests: cuda when present (compiled kernels), else cpu (interpreter)."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def rel_err(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))
