"""LLM(kernels=...) selects the seam implementations. On the CPU "auto" selects torch and gives the same tokens
and forward counts as "torch"; "triton" is refused there (the Triton adapters would only fall back to torch,
and llm.kernels would misreport what runs)."""

import pytest

from repro.engine import LLM
from repro.engine.layers import attention, moe


def test_kernel_choices_agree_on_cpu(tiny_dir):
    pytest.importorskip("triton")
    outs = {}
    for k in ("torch", "auto"):
        llm = LLM(tiny_dir, role="orl", device="cpu", kernels=k)
        assert llm.kernels == "torch"  # auto picks triton only on CUDA
        o = llm.generate("Count: 1, 2, 3,", max_new_tokens=40)
        outs[k] = (o.token_ids, o.forwards)
    assert outs["torch"] == outs["auto"]
    with pytest.raises(ValueError, match="needs a CUDA device"):
        LLM(tiny_dir, role="orl", device="cpu", kernels="triton")
    LLM(tiny_dir, role="orl", device="cpu", kernels="torch")  # leave the seams as other tests expect
    assert moe._ACTIVE[0] is moe.moe_forward_torch


def test_bad_kernels_value(tiny_dir):
    with pytest.raises(ValueError, match="kernels must be"):
        LLM(tiny_dir, kernels="cuda")


def test_cuda_without_gpu_is_a_clear_error(tiny_dir):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ValueError, match="no CUDA GPU is usable"):
        LLM(tiny_dir, device="cuda")
