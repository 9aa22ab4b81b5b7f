"""Post-attention RMSNorm written by the route-select kernel (``moe_route_align(..., norm_out=)``) vs the unfused
path (``norm.add_rmsnorm`` then ``moe_route_align`` on the normalised rows), and ``BlockForward.norm_in_route``
(its bf16 CUDA-graph case is in test_fastpath.py's option matrix).

Routing near-ties: the unfused router reads the normalised rows rounded to the dtype, the fused router the
unrounded h·w (scaled by r in fp32), so logits differ by that rounding (fp32: ~1e-7, fp16: ~1e-4,
bf16: ~1e-3). A token's selection may then differ only where it is that close to a tie: the kept/dropped
group scores or the k-th/(k+1)-th expert scores (``_margin``). The order of a token's top-k (and so its pair
indices t*k + slot) may differ between near-equal experts, so pair lists are compared as token sets.
"""
import pytest
import torch

pytest.importorskip("triton")

from repro.engine.kernels import fastpath as F  # noqa: E402
from repro.engine.kernels import moe as M  # noqa: E402
from repro.engine.kernels import norm as Nm  # noqa: E402

from .conftest import rel_err  # noqa: E402
from .test_fastpath import TINY, TINY_CFG  # noqa: E402

CFG = {"router": dict(BLOCK_E=16, SPLIT_K=2, BLOCK_K=32), "route": dict(num_warps=4)}
NEAR_TIE = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 5e-3}  # selection margin allowed to flip


def _inputs(T, H, E, dtype, dev, seed):
    g = torch.Generator().manual_seed(seed)
    h = (torch.randn(T, H, generator=g) * 3).to(dtype)
    delta = torch.randn(T, H, generator=g).to(dtype)  # attention output added to the residual
    nw = (torch.rand(H, generator=g) + 0.5).to(dtype)
    gate = torch.randn(E, H, generator=g) * (1.0 / H ** 0.5)
    bias = torch.randn(E, generator=g) * 0.05
    return [t.to(dev) for t in (h, delta, nw, gate, bias)]


def _route_both(T, H, E, k, ng, tg, dtype, dev, seed, split_k=2, cfg=CFG):
    """Unfused (add_rmsnorm + route on a) and fused (route on h with norm_out) runs on the same inputs."""
    h, delta, nw, gate, bias = _inputs(T, H, E, dtype, dev, seed)
    hu, a = h.clone(), torch.empty_like(h)
    Nm.add_rmsnorm(hu, nw, a, delta=delta)
    wsu = M.MoEWorkspace.create(T, H, 32, E, E + 1, k, dtype, dev, split_k=split_k)
    M.moe_route_align(a, gate, bias, wsu, E + 1, k, ng, tg, configs=cfg)

    hf = (h.float() + delta.float()).to(dtype)  # the residual after the in-place O projection
    buf = torch.full((T + 3, H), float("nan"), dtype=dtype, device=dev)
    wsf = M.MoEWorkspace.create(T, H, 32, E, E + 1, k, dtype, dev, split_k=split_k)
    M.moe_route_align(hf, gate, bias, wsf, E + 1, k, ng, tg, configs=cfg, norm_w=nw, norm_out=buf[:T])
    assert torch.equal(hf, hu)
    return hf, nw, gate, bias, a, buf, wsu, wsf


def _margin(biased, k, ng, tg):
    """Per token: the smaller gap at the two selection boundaries (kept vs dropped group score, k-th vs
    (k+1)-th biased score among the kept groups), i.e. how far the routing is from a tie."""
    T, E = biased.shape
    gsc, order = biased.view(T, ng, E // ng).topk(2, -1).values.sum(-1).sort(-1, descending=True)
    mask = torch.zeros(T, ng, dtype=torch.bool, device=biased.device).scatter_(1, order[:, :tg], True)
    kept = biased.masked_fill(~mask.repeat_interleave(E // ng, 1), float("-inf")).sort(-1, descending=True).values
    return torch.minimum(gsc[:, tg - 1] - gsc[:, tg], kept[:, k - 1] - kept[:, k])


def _token_sets(ws, E, k, skip):
    counts = ws.counts[:E].tolist()
    return [{p // k for p in ws.pairs[e, : counts[e]].tolist()} - skip for e in range(E)]


def _check_same_routing(a, gate, bias, wsu, wsf, E, k, ng, tg, dtype):
    """Fused routing == unfused routing (ids as sets, weights per expert, per-expert token lists); returns the
    number of tokens whose selection flipped, each asserted to be a near-tie (module doc)."""
    idu, idf = wsu.topk_ids.long(), wsf.topk_ids.long()
    T = idu.shape[0]
    same = idu.sort(1).values.eq(idf.sort(1).values).all(1)
    margin = _margin(torch.sigmoid(a.float() @ gate.float().t()) + bias.float(), k, ng, tg)
    flipped = torch.nonzero(~same).flatten().tolist()
    for t in flipped:
        assert margin[t] < NEAR_TIE[dtype], (t, idu[t], idf[t], float(margin[t]))
    rtol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(wsf.topk_w[same].gather(1, idf[same].argsort(1)),
                               wsu.topk_w[same].gather(1, idu[same].argsort(1)), rtol=rtol, atol=rtol * 0.1)
    # pair lists: pair p = t*k + slot carries the weight of its slot; the token sets per expert match (the slot
    # order inside a token's top-k, and so the pair index, may differ between near-equal experts)
    torch.testing.assert_close(wsf.pair_w[: T * k], wsf.topk_w.flatten())
    assert torch.all(wsf.pair_w[T * k:] == 1)
    for e in range(E):
        lst = wsf.pairs[e, : int(wsf.counts[e])].long()
        assert torch.all(idf.flatten()[lst] == e) and lst.unique().numel() == lst.numel()
    assert int(wsf.counts[:E].sum()) == idf.numel()
    assert _token_sets(wsf, E, k, set(flipped)) == _token_sets(wsu, E, k, set(flipped))
    n_act = int(wsf.counts[E + 1])
    assert sorted(wsf.active[:n_act].tolist()) == torch.nonzero(wsf.counts[:E] > 0).flatten().tolist()
    return len(flipped)


@pytest.mark.parametrize("dtype,T,H,E,split_k,seed", [
    (torch.float32, 8, 64, 16, 2, 0),
    (torch.float16, 8, 128, 32, 2, 1),
    (torch.float32, 32, 256, 32, 4, 2),
    (torch.float16, 32, 256, 16, 4, 3),
])
def test_norm_out_matches_unfused(dev, dtype, T, H, E, split_k, seed):
    k, ng, tg = 4, 4, 2
    hf, nw, gate, bias, a, buf, wsu, wsf = _route_both(T, H, E, k, ng, tg, dtype, dev, seed, split_k)
    normed = buf[:T]
    assert not torch.isnan(normed).any() and torch.isnan(buf[T:]).all()  # every row < T written, no other
    ref = Nm.rmsnorm_reference(hf, nw)
    assert rel_err(normed, ref) < (1e-6 if dtype == torch.float32 else 1e-3)
    # the numerics of add_rmsnorm (one fp32 reduction of the row, the same roundings): bit-equal under the
    # interpreter; compiled, the reduction order may differ (num_warps), a last-bit change of r
    if dev == "cpu":
        assert torch.equal(normed, a)
    else:
        torch.testing.assert_close(normed, a, rtol=2e-3 if dtype == torch.float16 else 1e-6, atol=0)
    assert _check_same_routing(a, gate, bias, wsu, wsf, E, k, ng, tg, dtype) == 0  # no near-tie flips for these seeds


def test_norm_out_needs_norm_w(dev):
    h, _, nw, gate, bias = _inputs(8, 64, 16, torch.float32, dev, 0)
    ws = M.MoEWorkspace.create(8, 64, 32, 16, 17, 4, torch.float32, dev, split_k=2)
    with pytest.raises(ValueError):
        M.moe_route_align(h, gate, bias, ws, 17, 4, 4, 2, configs=CFG, norm_out=torch.empty_like(h))
    with pytest.raises(ValueError):
        M.moe_route_align(h, gate, bias, ws, 17, 4, 4, 2, configs=CFG, norm_w=nw, norm_out=h[:4])


def test_block_forward_norm_in_route_tiny(dev):
    """Whole block forward (fp32): norm_in_route on vs off gives the same logits up to fp32 rounding."""
    if dev == "cuda":
        pytest.skip("fp32 on GPU uses tf32 dots; the bf16 GPU test covers CUDA")
    W = F.random_weights(TINY, dev, torch.float32, seed=7, std=0.1)
    T, P = 8, 13
    fw = F.BlockForward(W, TINY, 64, T=T, device=dev, configs=TINY_CFG)
    fw.kv.normal_()
    fw.cache_len.fill_(P)
    fw.ids.copy_(torch.randint(0, TINY.vocab, (T,)))
    fw.norm_in_route = False
    fw.forward()
    base = fw.logits.clone()
    fw.norm_in_route = True
    fw.logits.fill_(float("nan"))
    fw.forward()
    assert not torch.isnan(fw.logits).any()
    assert rel_err(fw.logits, base) < 1e-5
    assert torch.equal(fw.pred, base.argmax(-1))


@pytest.mark.gpu
@pytest.mark.parametrize("seed", [0, 1])
def test_norm_out_bf16_model_shape(seed):
    T, H, E, k, ng, tg = 32, 2048, 256, 8, 8, 4
    dt = torch.bfloat16
    hf, nw, gate, bias, a, buf, wsu, wsf = _route_both(T, H, E, k, ng, tg, dt, "cuda", seed, split_k=4, cfg=None)
    torch.cuda.synchronize()
    normed = buf[:T]
    assert not torch.isnan(normed).any() and torch.isnan(buf[T:]).all()
    assert (normed == a).float().mean() > 0.99  # add_rmsnorm's numerics up to the reduction order (see above)
    torch.testing.assert_close(normed, a, rtol=1e-2, atol=0)  # at most one bf16 ulp (2^-8 relative)
    assert rel_err(normed, Nm.rmsnorm_reference(hf, nw)) < 1e-2
    assert _check_same_routing(a, gate, bias, wsu, wsf, E, k, ng, tg, dt) <= 2  # near-ties under bf16 rounding
