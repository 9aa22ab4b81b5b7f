"""The CUDA-graph engine path (repro.engine.graph.GraphBackend) against the eager cached engine on the tiny
checkpoint. Here (no GPU) the same Triton kernels run eagerly under TRITON_INTERPRET=1 in fp32, so the two
paths must agree to fp32 rounding; the graph replays themselves run in tests/engine/test_gpu.py."""
import pytest
import torch

pytest.importorskip("triton")

from repro.checkpoint.tiny import write_tiny  # noqa: E402
from repro.engine.decode_loop import CachedBackend  # noqa: E402
from repro.engine.graph import GraphBackend, kernel_weights, unsupported_reason  # noqa: E402
from repro.engine.model import LLaDA2Model  # noqa: E402
from repro.engine.tokenizer import ChatTokenizer  # noqa: E402

from .conftest import rel_err  # noqa: E402


def tiny_checkpoint(tmp_path_factory, name: str, nvfp4: bool = False):
    """(directory, tokenizer) of a freshly written tiny checkpoint (seed 1; NVFP4 variant with ``nvfp4``)."""
    d = tmp_path_factory.mktemp(name)
    write_tiny(d, seed=1, nvfp4=nvfp4)
    return d, ChatTokenizer(d)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory, "tiny_graph")


def test_graph_backend_forwards_match_eager_engine(tiny, dev):
    if dev == "cuda":
        pytest.skip("fp32 on GPU uses tf32 dots; tests/engine/test_gpu.py covers CUDA in bf16")
    d, tok = tiny
    m = LLaDA2Model.from_pretrained(d, "cpu", "fp32", with_adapter=True)
    eager, graph = CachedBackend(m), GraphBackend(m, tok.mask_id, use_graphs=False)
    B, V = 32, m.cfg.vocab_size
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 256, (B,), generator=g)
    block = torch.randint(0, 256, (B,), generator=g)
    block[::3] = tok.mask_id
    for be in (eager, graph):
        be.begin(3 * B, B)
        be.prefill(prompt)
    la, lb = eager.denoise(block, B, None), graph.denoise(block, B, None)
    assert lb.shape == (B, V) and lb.dtype == torch.float32 and torch.isfinite(lb).all()
    assert rel_err(lb, la) < 1e-5 and torch.equal(lb.argmax(-1), la.argmax(-1))
    emb = m.embed(block) + 0.5 * torch.randn(B, m.cfg.hidden_size, generator=g)  # self-conditioning input
    la, lb = eager.denoise(block, B, emb), graph.denoise(block, B, emb)
    assert rel_err(lb, la) < 1e-5
    final = torch.randint(0, 256, (B,), generator=g)
    for be in (eager, graph):
        be.commit_block(final, B, run_forward=True)
    nxt = torch.full((B,), tok.mask_id)
    la, lb = eager.denoise(nxt, 2 * B, None), graph.denoise(nxt, 2 * B, None)  # reads the committed K/V
    assert rel_err(lb, la) < 1e-5 and torch.equal(lb.argmax(-1), la.argmax(-1))
    assert graph.forwards == 5  # prefill (1 block), 3 denoise, 1 commit


def test_kernel_weights_share_storage_with_the_model(tiny):
    d, _ = tiny
    m = LLaDA2Model.from_pretrained(d, "cpu", "fp32", with_adapter=True)
    before = {n: t.clone() for n, t in m.params.items()}
    W = kernel_weights(m)
    assert kernel_weights(m) is W  # idempotent
    E = m.cfg.num_experts
    L = W["layers"][1]
    assert L["w13"].shape[0] == E + 1 and L["w2"].shape[0] == E + 1
    p = m.params
    assert p["layers.1.moe.w_gate_up"].data_ptr() == L["w13"].data_ptr()
    assert p["layers.1.moe.shared_gate_up"].data_ptr() == L["w13"][E].data_ptr()
    assert p["layers.1.moe.w_down"].data_ptr() == L["w2"].data_ptr()
    for n, t in before.items():  # values unchanged
        assert torch.equal(p[n], t), n


def test_unsupported_reasons(tiny):
    from repro.engine.config import LLaDA2Config

    d, _ = tiny
    cfg = LLaDA2Config.from_file(d)
    assert "not CUDA" in unsupported_reason(cfg, 32, "cpu")
    assert "block_size 16" in unsupported_reason(cfg, 16, "cuda")


def test_graph_backend_device_step_generation_matches_eager_engine(tiny, dev):
    """GraphBackend's round path (forward + on-device decoder step) through generate_ids, kernels eager."""
    if dev == "cuda":
        pytest.skip("covered in bf16 by tests/engine/test_gpu.py")
    from repro.engine.decode_loop import generate_ids

    d, tok = tiny
    m = LLaDA2Model.from_pretrained(d, "cpu", "fp32", with_adapter=True)
    gb = GraphBackend(m, tok.mask_id, use_graphs=False)
    kw = dict(mask_id=tok.mask_id, eos_id=tok.eos_id, max_new_tokens=6)
    dec = {"algorithm": "low_confidence", "threshold": 0.0}  # one denoise round + one commit
    a = generate_ids(CachedBackend(m), [5, 17, 99], dec, **kw)
    b = generate_ids(gb, [5, 17, 99], dec, **kw)
    assert b.raw_ids == a.raw_ids and b.forwards == a.forwards == {"prefill": 0, "denoise": 1, "commit": 1}
    assert gb.forwards == 2 and len(gb.steppers) == 1


def test_device_steps_off_or_sampling_leaves_decoding_to_the_host(tiny):
    from repro.engine.decoders import DecoderConfig

    d, tok = tiny
    m = LLaDA2Model.from_pretrained(d, "cpu", "fp32", with_adapter=True)
    greedy, sampling = DecoderConfig.from_dict({"algorithm": "orl"}), DecoderConfig.from_dict(
        {"algorithm": "orl", "temperature": 0.7})
    assert GraphBackend(m, tok.mask_id, use_graphs=False, device_steps=False).device_stepper(greedy) is None
    gb = GraphBackend(m, tok.mask_id, use_graphs=False)
    gb.begin(64, 32)
    assert gb.device_stepper(sampling) is None and gb.device_stepper(greedy) is not None
