"""Whole block forward from the kernels vs the plain PyTorch reference forward (kernels/fastpath.py)."""
import pytest
import torch

pytest.importorskip("triton")

from repro.engine.graph import SMALL_TILES  # noqa: E402
from repro.engine.kernels import fastpath as F  # noqa: E402

from .conftest import rel_err, small_block_forward  # noqa: E402

TINY = F.preset_shape(vocab_size=64, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=16, intermediate_size=64, moe_intermediate_size=32, num_experts=16,
                      num_experts_per_tok=4, n_group=4, topk_group=2, mask_id=63)
TINY_CFG = SMALL_TILES  # the tiles the engine's graph path uses for small shapes


@pytest.mark.parametrize("fuse_norm,triton_linear,compact,norm_in_route", [
    (False, False, False, False), (True, False, False, False), (False, True, False, False),
    (False, False, True, False), (False, False, False, True)])
def test_block_forward_matches_reference_tiny(dev, fuse_norm, triton_linear, compact, norm_in_route):
    if dev == "cuda":
        pytest.skip("fp32 on GPU uses tf32 dots; the bf16 GPU test covers CUDA")
    W = F.random_weights(TINY, dev, torch.float32, seed=3, std=0.1)
    T, P = 8, 21
    fw = F.BlockForward(W, TINY, 64, T=T, device=dev, configs=TINY_CFG)
    fw.fuse_norm = fuse_norm
    fw.triton_linear = triton_linear
    fw.ws.compact = compact
    fw.norm_in_route = norm_in_route
    fw.kv.normal_()
    fw.cache_len.fill_(P)
    ids = torch.randint(0, TINY.vocab, (T,))
    fw.ids.copy_(ids)
    fw.logits.fill_(float("nan"))
    fw.forward()
    ref = F.reference_forward(W, TINY, fw.kv, P, ids)
    assert not torch.isnan(fw.logits).any()
    assert rel_err(fw.logits, ref) < 1e-5
    assert torch.equal(fw.pred, ref.argmax(-1))
    lp = torch.log_softmax(ref, -1)
    torch.testing.assert_close(fw.conf, lp.max(-1).values.exp(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fw.entropy, -(lp.exp() * lp).sum(-1), rtol=1e-4, atol=1e-5)
    assert len(fw.distinct_experts()) == TINY.layers - TINY.first_dense


@pytest.mark.gpu
@pytest.mark.parametrize("pdl,prefetch,fuse_norm,lin,compact,norm_in_route", [
    (False, False, False, False, False, False), (True, True, False, False, False, False),
    (False, False, True, False, False, False), (True, False, False, True, False, False),
    (False, False, False, False, True, False), (True, False, False, False, True, False),
    (False, False, False, False, False, True), (True, False, False, False, False, True)])
def test_block_forward_bf16_graph(pdl, prefetch, fuse_norm, lin, compact, norm_in_route):
    """Model-width layers (fewer layers/experts/vocab) in bf16 under a CUDA graph vs the bf16 reference."""
    from repro.engine.kernels import _triton

    if _triton.set_pdl(pdl) != pdl:
        pytest.skip("PDL not supported by this triton")
    shape, W, fw = small_block_forward()
    fw.prefetch = prefetch
    fw.fuse_norm = fuse_norm
    fw.triton_linear = lin
    fw.ws.compact = compact
    fw.norm_in_route = norm_in_route  # the default; off in the other cases so that their option is what runs
    fw.kv.normal_()
    ids = torch.randint(0, shape.vocab, (32,), device="cuda")
    fw.ids.copy_(ids)
    g = fw.capture()
    for P in (100, 1500):  # one graph, two cache lengths
        fw.cache_len.fill_(P)
        fw.logits.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        ref = F.reference_forward(W, shape, fw.kv, P, ids)
        assert not torch.isnan(fw.logits).any()
        assert rel_err(fw.logits, ref) < 5e-2
        assert (fw.pred == ref.float().argmax(-1)).float().mean() > 0.8
    _triton.set_pdl(False)
