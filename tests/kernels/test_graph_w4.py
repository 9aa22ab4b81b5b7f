"""The engine's kernel path (GraphBackend) in precision nvfp4-w4a16 on the tiny NVFP4 checkpoint: 4-bit experts
dequantized inside the MoE kernels vs the same checkpoint dequantized at load. Here (no GPU) the kernels run
eagerly under TRITON_INTERPRET=1 in fp32; on the H200 tests/engine/test_gpu.py-style runs are in docs/perf.md."""
import pytest
import torch

pytest.importorskip("triton")

from repro.checkpoint.nvfp4 import NVFP4Experts  # noqa: E402
from repro.engine.graph import GraphBackend, kernel_weights  # noqa: E402
from repro.engine.model import LLaDA2Model  # noqa: E402

from .conftest import rel_err  # noqa: E402
from .test_graph_backend import tiny_checkpoint  # noqa: E402


@pytest.fixture(scope="module")
def tiny_nvfp4(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory, "tiny_graph_nvfp4", nvfp4=True)


def test_w4a16_kernel_path_matches_dequantize_at_load(tiny_nvfp4, dev):
    if dev == "cuda":
        pytest.skip("fp32 on GPU uses tf32 dots; the bf16 GPU comparison is in the benchmark")
    d, tok = tiny_nvfp4
    deq = LLaDA2Model.from_pretrained(d, "cpu", "fp32", with_adapter=True)
    w4 = LLaDA2Model.from_pretrained(d, "cpu", "nvfp4-w4a16", with_adapter=True)
    W = kernel_weights(w4)
    assert isinstance(W["layers"][1]["w13"], NVFP4Experts) and W["layers"][1]["w13"].shared is not None
    assert W["layers"][1]["w13"].q.data_ptr() == w4.params["layers.1.moe.w_gate_up"].q.data_ptr()  # no copy
    ga, gb = GraphBackend(deq, tok.mask_id, use_graphs=False), GraphBackend(w4, tok.mask_id, use_graphs=False)
    B = 32
    block = torch.randint(0, 256, (B,), generator=torch.Generator().manual_seed(0))
    block[::2] = tok.mask_id
    for be in (ga, gb):
        be.begin(B, B)
    # one denoising forward of a first block (the prompt's own block): the greedy step reads the argmax
    la, lb = ga.denoise(block, 0, None), gb.denoise(block, 0, None)
    assert rel_err(lb, la) < 1e-5 and torch.equal(lb.argmax(-1), la.argmax(-1))


@pytest.mark.gpu
def test_w4a16_graph_path_bf16_on_gpu_matches_dequantize_at_load(tiny_nvfp4):
    """H200 (bf16, CUDA graphs): teacher-forced logits of the 4-bit mode vs the dequantize-at-load model, same
    prompt and block; then a whole greedy request through LLM(precision="nvfp4-w4a16") on the graph path."""
    from repro.engine.llm import LLM

    d, tok = tiny_nvfp4
    deq = LLaDA2Model.from_pretrained(d, "cuda", "bf16", with_adapter=True)
    w4 = LLaDA2Model.from_pretrained(d, "cuda", "nvfp4-w4a16", with_adapter=True)
    assert w4.dtype == torch.bfloat16
    ga, gb = GraphBackend(deq, tok.mask_id), GraphBackend(w4, tok.mask_id)
    B = 32
    g = torch.Generator().manual_seed(0)
    prompt, block = torch.randint(0, 256, (B,), generator=g).cuda(), torch.randint(0, 256, (B,), generator=g).cuda()
    block[::3] = tok.mask_id
    for be in (ga, gb):
        be.begin(2 * B, B)
        be.prefill(prompt)
    la, lb = ga.denoise(block, B, None), gb.denoise(block, B, None)
    torch.cuda.synchronize()
    assert rel_err(lb, la) < 2e-2  # bf16 rounding of activations; the expert values are identical
    assert (lb.argmax(-1) == la.argmax(-1)).float().mean() >= 0.9
    from repro.engine.layers import attention as seam_attn
    from repro.engine.layers import moe as seam_moe

    try:
        llm = LLM(d, role="orl", precision="nvfp4-w4a16", device="cuda")  # selects the Triton seams globally
        assert llm.engine_path == "cuda-graph"
        out = llm.generate("hello", max_new_tokens=64)
        assert out.forwards and len(out.token_ids) <= 64
    finally:  # later tests compare the torch seams (fp32 parity): leave them selected
        seam_moe.set_moe_impl("torch")
        seam_attn.set_attention_impl("torch")
