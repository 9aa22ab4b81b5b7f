"""QK-norm + RoPE + KV write and split-KV block attention vs references (kernels/attention.py)."""
import pytest
import torch

pytest.importorskip("triton")

from repro.engine.kernels import attention as A  # noqa: E402

from .conftest import rel_err  # noqa: E402


def _run(dev, dtype, T, NQ, NKV, D, ROT, MAXLEN, P, nsplit, block_n, seed, min_keys=16, block_m=None):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(T, (NQ + 2 * NKV) * D, generator=g).to(dtype).to(dev)
    qw = (torch.rand(D, generator=g) + 0.5).to(dtype).to(dev)
    kw = (torch.rand(D, generator=g) + 0.5).to(dtype).to(dev)
    cos, sin = A.rope_tables(MAXLEN, ROT, 600000.0, dev)
    kc = torch.randn(NKV, MAXLEN, D, generator=g).to(dtype).to(dev)
    vc = torch.randn(NKV, MAXLEN, D, generator=g).to(dtype).to(dev)
    kc0, vc0 = kc.clone(), vc.clone()
    cl = torch.tensor([P], dtype=torch.int32, device=dev)
    q = torch.full((T, NQ, D), float("nan"), dtype=dtype, device=dev)
    A.qk_norm_rope_kv(qkv, qw, kw, cos, sin, cl, q, kc, vc, NQ, NKV, rot=ROT)
    qr, kr, vr = A.qk_norm_rope_reference(qkv, qw, kw, P, cos, sin, NQ, NKV, D, ROT)
    assert not torch.isnan(q).any()
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert rel_err(q, qr) < tol
    assert rel_err(kc[:, P:P + T].transpose(0, 1), kr) < tol
    assert torch.equal(vc[:, P:P + T].transpose(0, 1).float(), vr)
    assert torch.equal(kc[:, :P], kc0[:, :P]) and torch.equal(kc[:, P + T:], kc0[:, P + T:])
    assert torch.equal(vc[:, :P], vc0[:, :P])
    ws = A.AttnWorkspace(T, NQ, NKV, D, dev, nsplit=nsplit, block_n=block_n, min_keys=min_keys, block_m=block_m)
    ws.po.fill_(float("nan"))  # splits not in use must not be read
    o = torch.full((T, NQ * D), float("nan"), dtype=dtype, device=dev)
    A.block_attention(q, kc, vc, cl, o, ws)
    ref = A.attention_reference(q, kc[:, :P + T], vc[:, :P + T])
    assert not torch.isnan(o).any()
    assert rel_err(o, ref) < (1e-5 if dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("dtype,T,P,nsplit,min_keys,seed", [
    (torch.float32, 5, 37, 4, 16, 0),
    (torch.float16, 16, 0, 2, 16, 1),
    (torch.float32, 3, 70, 8, 1, 2),  # more splits than key tiles: empty splits
    (torch.float32, 6, 60, 8, 32, 3),  # fewer splits in use than NSPLIT
])
@pytest.mark.parametrize("block_m", [None, 16])
def test_attention_small(dev, dtype, T, P, nsplit, min_keys, seed, block_m):
    if dev == "cuda" and dtype == torch.float32:
        pytest.skip("tf32 dot on GPU; covered by the bf16 GPU test")
    _run(dev, dtype, T, 4, 2, 16, 8, 96, P, nsplit, 16, seed, min_keys, block_m)


@pytest.mark.gpu
@pytest.mark.parametrize("P,nsplit,min_keys,block_m", [(1000, 32, 256, None), (4096, 16, 128, 32), (0, 8, 256, 64),
                                                       (3000, 32, 64, 16)])
def test_attention_bf16_full_shape(P, nsplit, min_keys, block_m):
    _run("cuda", torch.bfloat16, 32, 16, 4, 128, 64, 4096 + 64, P, nsplit, 64, P, min_keys, block_m)


@pytest.mark.parametrize("dtype,P,n", [(torch.float32, 32, 32), (torch.float16, 64, 5), (torch.float32, 0, 8)])
def test_seam_adapter_matches_engine_torch_impl(dev, dtype, P, n):
    seam = pytest.importorskip("repro.engine.layers.attention")
    if dev == "cuda" and dtype == torch.float32:
        pytest.skip("tf32 dot on GPU")
    g = torch.Generator().manual_seed(P + n)
    q = torch.randn(n, 4, 16, generator=g).to(dtype).to(dev)
    k = torch.randn(P + n, 2, 16, generator=g).to(dtype).to(dev)
    v = torch.randn(P + n, 2, 16, generator=g).to(dtype).to(dev)
    got = A.attention_forward_triton(q, k, v, P, 32)
    ref = seam.attention_torch(q.float(), k.float(), v.float(), P, 32)
    assert got.shape == ref.shape and got.dtype == q.dtype and not torch.isnan(got).any()
    assert rel_err(got, ref) < (1e-5 if dtype == torch.float32 else 3e-3)
    # multi-block chunk (prefill): falls back to the torch implementation, same contract
    q2 = torch.randn(40, 4, 16, generator=g).to(dtype).to(dev)
    k2 = torch.randn(40, 2, 16, generator=g).to(dtype).to(dev)
    torch.testing.assert_close(A.attention_forward_triton(q2, k2, k2, 0, 32), seam.attention_torch(q2, k2, k2, 0, 32))


@pytest.mark.gpu
def test_seam_adapter_bf16():
    seam = pytest.importorskip("repro.engine.layers.attention")
    g = torch.Generator(device="cuda").manual_seed(0)
    P, n = 1024, 32
    q = torch.randn(n, 16, 128, generator=g, device="cuda").bfloat16()
    kv = torch.randn(2, P + n + 64, 4, 128, generator=g, device="cuda").bfloat16()
    k, v = kv[0, : P + n], kv[1, : P + n]
    got = A.attention_forward_triton(q, k, v, P, 32)
    ref = seam.attention_torch(q.float(), k.float(), v.float(), P, 32)
    assert not torch.isnan(got).any() and rel_err(got, ref) < 1e-2
