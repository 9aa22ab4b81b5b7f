"""Residual add + RMSNorm kernel (with the fused MoE top-k sum) vs reference (kernels/norm.py)."""
import pytest
import torch

pytest.importorskip("triton")

from repro.engine.kernels import norm as Nm  # noqa: E402

from .conftest import rel_err  # noqa: E402


@pytest.mark.parametrize("mode", ["none", "delta", "pairs"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_add_rmsnorm_small(dev, mode, dtype):
    T, H, K = 6, 48, 4
    h = torch.randn(T, H).to(dtype).to(dev)
    w = (torch.rand(H) + 0.5).to(dtype).to(dev)
    kw = {}
    if mode == "delta":
        kw["delta"] = torch.randn(T, H).to(dtype).to(dev)
    if mode == "pairs":
        kw.update(pairs=torch.randn(T * K + T, H, device=dev), top_k=K, shared=True)
    hr, yr = Nm.add_rmsnorm_reference(h.clone(), w, **kw)
    y = torch.full_like(h, float("nan"))
    Nm.add_rmsnorm(h, w, y, **kw)
    assert not torch.isnan(y).any()
    tol = 1e-6 if dtype == torch.float32 else 2e-3
    assert rel_err(h, hr) < tol and rel_err(y, yr) < tol


@pytest.mark.gpu
def test_add_rmsnorm_bf16():
    T, H, K = 32, 2048, 8
    h = torch.randn(T, H, device="cuda").bfloat16()
    w = (torch.rand(H, device="cuda") + 0.5).bfloat16()
    pairs = torch.randn(T * K + T, H, device="cuda")
    hr, yr = Nm.add_rmsnorm_reference(h.clone(), w, pairs=pairs, top_k=K, shared=True)
    y = torch.full_like(h, float("nan"))
    Nm.add_rmsnorm(h, w, y, pairs=pairs, top_k=K, shared=True)
    assert not torch.isnan(y).any()
    assert rel_err(h, hr) < 1e-2 and rel_err(y, yr) < 1e-2


@pytest.mark.parametrize("mode", ["none", "delta", "pairs"])
def test_add_rmsnorm_rows_per_program_same_bits(dev, mode):
    """``rows`` >= 1 (rows in turn with a prefetch of the next; the last program part-empty): the same bits for
    rows 1, 3 and 4 (so rows may follow the row count), within rounding of the reference and of rows 0; no row
    outside [0, T) touched."""
    T, H, K = 7, 48, 4
    g = torch.Generator().manual_seed(3)
    h0 = torch.randn(T + 2, H, generator=g).to(dev)
    w = (torch.rand(H, generator=g) + 0.5).to(dev)
    kw = {}
    if mode == "delta":
        kw = dict(delta=torch.randn(T, H, generator=g).to(dev))
    if mode == "pairs":
        kw = dict(pairs=torch.randn(T * K + T, H, generator=g).to(dev), top_k=K, shared=True)
    outs = []
    for rows in (0, 1, 3, 4):
        h = h0.clone()
        y = torch.full_like(h, float("nan"))
        Nm.add_rmsnorm(h[:T], w, y[:T], rows=rows, **kw)
        assert torch.equal(h[T:], h0[T:]) and torch.isnan(y[T:]).all() and not torch.isnan(y[:T]).any()
        outs.append((h[:T], y[:T]))
    for h, y in outs[2:]:
        assert torch.equal(h, outs[1][0]) and torch.equal(y, outs[1][1])
    hr, yr = Nm.add_rmsnorm_reference(h0[:T].clone(), w, **kw)
    for h, y in outs[:2]:
        assert rel_err(h, hr) < 1e-6 and rel_err(y, yr) < 1e-6
    if mode == "pairs":
        with pytest.raises(ValueError, match="power of two"):
            Nm.add_rmsnorm(h0[:3].clone(), w, torch.empty(3, H, device=dev), pairs=kw["pairs"][:9], top_k=3,
                           rows=2)
