"""Split-K skinny GEMM with the fixed-order ticket reduction and its epilogues (kernels/splitk.py) vs the torch
references: fp32 under the interpreter on small shapes, bf16 at the model's shapes on the GPU."""
import pytest
import torch

pytest.importorskip("triton")

from repro.engine.kernels import attention as A  # noqa: E402
from repro.engine.kernels import splitk as SK  # noqa: E402

from .conftest import rel_err  # noqa: E402


def _data(dev, dtype, T, N, K, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(T, K, generator=g).to(dev, dtype)
    w = (0.1 * torch.randn(N, K, generator=g)).to(dev, dtype)
    h = torch.randn(T, N, generator=g).to(dev, dtype)
    return x, w, h


@pytest.mark.parametrize("T,N,K,split,bn,bk,pre", [(8, 32, 64, 1, 16, 16, False), (5, 64, 128, 4, 32, 16, False),
                                                   (16, 32, 64, 2, 16, 32, True)])
@pytest.mark.parametrize("mode", ["store", "add"])
def test_splitk_linear_matches_reference(dev, T, N, K, split, bn, bk, pre, mode):
    dtype = torch.float32 if dev == "cpu" else torch.bfloat16
    x, w, h = _data(dev, dtype, T, N, K, seed=T + N + split)
    ws = SK.SplitKWorkspace(T, N, 4, dev)
    cfg = dict(SPLIT=split, BLOCK_N=bn, BLOCK_K=bk, num_warps=4, num_stages=2, PRELOAD=pre)
    out = h.clone() if mode == "add" else torch.full_like(h, float("nan"))
    ref = SK.splitk_linear_reference(x, w, h, mode)
    SK.splitk_linear(x, w, out, ws, cfg, mode)
    assert not torch.isnan(out).any()
    assert rel_err(out, ref) < (1e-6 if dtype == torch.float32 else 1e-2)
    assert not ws.tickets.any(), "every launch leaves its tickets at zero"
    # deterministic: the same launch again gives the same bits (whichever split program finishes last)
    out2 = h.clone() if mode == "add" else torch.full_like(h, float("nan"))
    SK.splitk_linear(x, w, out2, ws, cfg, mode)
    assert torch.equal(out, out2)


@pytest.mark.parametrize("T,P,split", [(8, 21, 2), (3, 0, 4)])
def test_splitk_qkv_rope_kv_matches_reference(dev, T, P, split):
    """The fused epilogue = qk_norm_rope_reference of the rounded GEMM; the cache rows [P, P+T) written, the rest not."""
    dtype = torch.float32 if dev == "cpu" else torch.bfloat16
    nq, nkv, D, rot, H, maxlen = 4, 2, 16, 8, 64, 48
    N = (nq + 2 * nkv) * D
    x, w, _ = _data(dev, dtype, T, N, H, seed=7 + T)
    qw = (1 + 0.1 * torch.randn(D)).to(dev, dtype)
    kw = (1 + 0.1 * torch.randn(D)).to(dev, dtype)
    cos, sin = A.rope_tables(maxlen, rot, 600000.0, dev)
    kc = torch.randn(nkv, maxlen, D, device=dev).to(dtype)
    vc = torch.randn(nkv, maxlen, D, device=dev).to(dtype)
    kc0, vc0 = kc.clone(), vc.clone()
    q = torch.full((T, nq, D), float("nan"), device=dev, dtype=dtype)
    cl = torch.tensor([P], dtype=torch.int32, device=dev)
    ws = SK.SplitKWorkspace(T, N, 4, dev)
    SK.splitk_qkv_rope_kv(x, w, ws, qw, kw, cos, sin, cl, q, kc, vc, nq, nkv, rot, 1e-6,
                          dict(SPLIT=split, BLOCK_K=16, num_warps=4, num_stages=2))
    rq, rk, rv = SK.splitk_qkv_reference(x, w, qw, kw, P, cos, sin, nq, nkv, rot, 1e-6)
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    assert not torch.isnan(q).any()
    assert rel_err(q, rq) < tol
    assert rel_err(kc[:, P:P + T], rk.transpose(0, 1)) < tol
    assert rel_err(vc[:, P:P + T], rv.transpose(0, 1)) < tol
    for new, old in ((kc, kc0), (vc, vc0)):  # rows outside [P, P+T) untouched
        assert torch.equal(new[:, :P], old[:, :P]) and torch.equal(new[:, P + T:], old[:, P + T:])
    assert not ws.tickets.any()
    # the same as the unfused path on the same rounded qkv (QKV GEMM, then attention.qk_norm_rope_kv)
    qkv = (x.float() @ w.float().t()).to(dtype)
    q2 = torch.empty_like(q)
    kc2, vc2 = kc0.clone(), vc0.clone()
    A.qk_norm_rope_kv(qkv, qw, kw, cos, sin, cl, q2, kc2, vc2, nq, nkv, rot=rot, eps=1e-6)
    assert rel_err(q, q2) < tol and rel_err(kc, kc2) < tol and rel_err(vc, vc2) < tol


def test_splitk_bad_arguments(dev):
    x, w, h = _data(dev, torch.float32, 4, 32, 64, seed=1)
    ws = SK.SplitKWorkspace(4, 32, 2, dev)
    with pytest.raises(ValueError, match="SPLIT=3"):
        SK.splitk_linear(x, w, h, ws, dict(SPLIT=3, BLOCK_N=16, BLOCK_K=16))
    with pytest.raises(ValueError, match="workspace"):
        SK.splitk_linear(x, w, h, ws, dict(SPLIT=4, BLOCK_N=16, BLOCK_K=16))
    with pytest.raises(ValueError, match="mode"):
        SK.splitk_linear(x, w, h, ws, dict(SPLIT=2, BLOCK_N=16, BLOCK_K=16), mode="sub")
    with pytest.raises(ValueError, match="PRELOAD"):
        SK.splitk_linear(x, w, h, ws, dict(SPLIT=2, BLOCK_N=16, BLOCK_K=16, PRELOAD=True))
    assert SK.fit_tiles(SK.SPLITK_TILES["pre"]["o"], 64, 32)["BLOCK_K"] * SK.fit_tiles(
        SK.SPLITK_TILES["pre"]["o"], 64, 32)["SPLIT"] == 64
    with pytest.raises(ValueError, match="out"):
        SK.splitk_linear(x, w, h[:, :16], ws, dict(SPLIT=2, BLOCK_N=16, BLOCK_K=16))


@pytest.mark.gpu
@pytest.mark.parametrize("cfg_q,cfg_o", [({}, {}), (dict(SPLIT=16), dict(SPLIT=16, BLOCK_N=128)),
                                         (SK.SPLITK_TILES["pre"]["qkv"], SK.SPLITK_TILES["pre"]["o"])])
def test_splitk_bf16_model_shape(cfg_q, cfg_o):
    """LLaDA2.1-mini QKV (3072 x 2048, with the fused epilogue) and O (2048 x 2048, add into h) at T = 32 in bf16."""
    dev, dt = "cuda", torch.bfloat16
    T, H, nq, nkv, D, rot, P, maxlen = 32, 2048, 16, 4, 128, 64, 1000, 2048
    N = (nq + 2 * nkv) * D
    x, w, _ = _data(dev, dt, T, N, H, seed=11)
    x2, wo, h = _data(dev, dt, T, H, H, seed=12)
    qw = (1 + 0.1 * torch.randn(D, device=dev)).to(dt)
    kw = (1 + 0.1 * torch.randn(D, device=dev)).to(dt)
    cos, sin = A.rope_tables(maxlen, rot, 600000.0, dev)
    kc = torch.randn(nkv, maxlen, D, device=dev, dtype=dt)
    vc = torch.randn(nkv, maxlen, D, device=dev, dtype=dt)
    q = torch.full((T, nq, D), float("nan"), device=dev, dtype=dt)
    cl = torch.tensor([P], dtype=torch.int32, device=dev)
    ws = SK.SplitKWorkspace(T, N, 16, dev)
    SK.splitk_qkv_rope_kv(x, w, ws, qw, kw, cos, sin, cl, q, kc, vc, nq, nkv, rot, 1e-6, cfg_q)
    rq, rk, rv = SK.splitk_qkv_reference(x, w, qw, kw, P, cos, sin, nq, nkv, rot, 1e-6)
    assert rel_err(q, rq) < 1e-2 and rel_err(kc[:, P:P + T], rk.transpose(0, 1)) < 1e-2
    assert rel_err(vc[:, P:P + T], rv.transpose(0, 1)) < 1e-2
    out = h.clone()
    SK.splitk_linear(x2, wo, out, ws, cfg_o, "add")
    ref = SK.splitk_linear_reference(x2, wo, h, "add")
    assert rel_err(out, ref) < 1e-2
    # fp32-accumulated like cuBLAS: within bf16 rounding of torch.addmm
    assert rel_err(out, torch.addmm(h, x2, wo.t())) < 1e-2
    out2 = h.clone()
    SK.splitk_linear(x2, wo, out2, ws, cfg_o, "add")
    assert torch.equal(out, out2) and not ws.tickets.any()


@pytest.mark.parametrize("T,prefetch", [(8, True), (3, False)])
def test_router_in_o_epilogue(dev, T, prefetch):
    """splitk_linear(router=...): h += o·Woᵀ, the router partials of the new h = the reference's, and the route-select
    kernel on them routes as route_reference on RMSNorm(h)·nw and writes that RMSNorm (norm_out)."""
    from repro.engine.kernels import norm as Nm
    from repro.engine.kernels import route as R

    dtype = torch.float32 if dev == "cpu" else torch.bfloat16
    H, E, top_k, bn = 64, 16, 4, 16
    o, wo, h = _data(dev, dtype, T, H, H, seed=20 + T)
    g = torch.Generator(device="cpu").manual_seed(5)
    rw = torch.randn(E, H, generator=g).to(dev)
    nw = (1 + 0.1 * torch.randn(H, generator=g)).to(dev, dtype)
    bias = (0.01 * torch.randn(E, generator=g)).to(dev)
    ws = SK.SplitKWorkspace(T, H, 4, dev)
    mws = R.MoEWorkspace(T, H, 32, E, E + 1, top_k, dtype, dev, split_k=2)
    rpart = torch.full((H // bn, mws.T_PAD, E), float("nan"), device=dev)
    hk = h.clone()
    SK.splitk_linear(o, wo, hk, ws, dict(SPLIT=2, BLOCK_N=bn, BLOCK_K=16, num_warps=4, num_stages=2), "add",
                     router=(rw, nw, rpart, "ieee"), router_prefetch=prefetch)
    h_ref = SK.splitk_linear_reference(o, wo, h, "add")
    assert rel_err(hk, h_ref) < (1e-6 if dtype == torch.float32 else 1e-2)
    ref_part = SK.router_partials_reference(hk, nw, rw, bn)
    assert rel_err(rpart[:, :T], ref_part) < 1e-5
    assert not rpart[:, T:].any(), "padding rows have zero logits"
    normed = torch.full_like(hk, float("nan"))
    R.moe_route_select(rpart, hk, bias, mws, E + 1, top_k, n_group=4, topk_group=2, scaling=2.5, norm_w=nw,
                       eps=1e-6, norm_out=normed)
    x_ref = Nm.rmsnorm_reference(hk, nw, 1e-6)
    assert rel_err(normed, x_ref) < (1e-6 if dtype == torch.float32 else 1e-2)
    # the router's NORM mode: logits of h·nw in fp32, scaled by r (not of the normed row rounded to the dtype)
    hf = hk.float()
    x32 = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-6) * nw.float()
    ids, wts = R.route_reference(x32, rw, bias, top_k, 4, 2, 2.5)
    assert torch.equal(mws.topk_ids.long().sort(-1).values, ids.sort(-1).values)
    torch.testing.assert_close(mws.topk_w.sort(-1).values, wts.sort(-1).values, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="router"):
        SK.splitk_linear(o, wo, hk, ws, dict(SPLIT=2, BLOCK_N=bn, BLOCK_K=16), "store", router=(rw, nw, rpart, "ieee"))
    with pytest.raises(ValueError, match="norm_out"):
        R.moe_route_select(rpart, hk, bias, mws, E + 1, top_k, n_group=4, topk_group=2, norm_w=nw)
