"""Kernel tests: on a CPU-only machine the Triton kernels run under TRITON_INTERPRET=1 (set here, before
the kernel modules are imported) on small fp32/fp16 shapes; ``@pytest.mark.gpu`` tests run bf16 at the
model's shapes and skip without CUDA. All tests skip cleanly when triton is not installed."""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton_interpreter  # noqa: E402  (tests/: on sys.path through tests/conftest.py)

triton_interpreter.install()  # a helper's repeated language patch skipped under the interpreter (its docstring)


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


def small_block_forward(seed: int = 5, max_len: int = 2048):
    """``(shape, W, fw)``: a 3-layer, 64-expert, 8192-token-vocabulary model in the real layer widths, bf16 random
    weights (``seed``) and its single-request :class:`~repro.engine.kernels.fastpath.BlockForward` (32-token
    block, ``max_len`` cache rows, cache not filled) on the GPU: the model-width GPU tests' model."""
    from repro.engine.kernels import fastpath as F

    shape = F.preset_shape(vocab_size=8192, num_hidden_layers=3, num_experts=64)
    W = F.random_weights(shape, "cuda", torch.bfloat16, seed=seed)
    return shape, W, F.BlockForward(W, shape, max_len, T=32, device="cuda")
