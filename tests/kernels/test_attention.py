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


# ---- attention_slots: the batched forward's attention (fixed chunk fold; "split" and "whole" launches) ----

from repro.engine.kernels import attention_slots as AS  # noqa: E402


def _slot_inputs(dev, dtype, T, lens, NQ=4, NKV=2, D=16, ML=96, seed=0):
    g = torch.Generator().manual_seed(seed)
    S = len(lens)
    q = torch.randn(S * T, NQ, D, generator=g).to(dtype).to(dev)
    kc = torch.randn(S, NKV, ML, D, generator=g).to(dtype).to(dev)
    vc = torch.randn(S, NKV, ML, D, generator=g).to(dtype).to(dev)
    return q, kc, vc, torch.tensor(lens, dtype=torch.int32, device=dev)


@pytest.mark.parametrize("dtype,T,lens,nsplit,min_keys,block_m", [
    (torch.float32, 6, [37, 0, 70], 8, 16, None),  # 3 / 1 / 5 chunks of 16 keys
    (torch.float32, 5, [9, 60, 1], 8, 1, 16),  # min_keys 1: 8 pieces, empty ones dropped; 2 row blocks
    (torch.float32, 3, [90, 20], 2, 16, None),  # capped at NSPLIT: chunks of several tiles
    (torch.float16, 16, [48, 3], 4, 16, None),
])
def test_slot_attention_modes_bit_identical(dev, dtype, T, lens, nsplit, min_keys, block_m):
    """"split" and "whole" give the same bits; a slot alone (S = 1) equals its rows among S slots in either mode;
    all within rounding of the fp32 reference; every output element written (NaN-poisoned before)."""
    if dev == "cuda" and dtype == torch.float32:
        pytest.skip("tf32 dot on GPU; covered by the bf16 GPU test")
    q, kc, vc, cl = _slot_inputs(dev, dtype, T, lens, seed=T)
    S, NQ, D = len(lens), q.shape[1], q.shape[2]
    ws = A.AttnWorkspace(T, NQ, kc.shape[1], D, dev, nsplit=nsplit, block_n=16, min_keys=min_keys, block_m=block_m,
                         slots=S)
    outs = {}
    for mode in ("split", "whole"):
        ws.po.fill_(float("nan"))  # partials of chunks not in use must not be read
        outs[mode] = torch.full((S * T, NQ * D), float("nan"), dtype=dtype, device=dev)
        AS.slot_attention(q, kc, vc, cl, outs[mode], ws, mode=mode)
        assert not torch.isnan(outs[mode]).any(), mode
    assert torch.equal(outs["split"], outs["whole"])
    ref = AS.slot_attention_reference(q, kc, vc, cl)
    assert rel_err(outs["whole"], ref) < (1e-5 if dtype == torch.float32 else 1e-2)
    for s in range(S):
        one = torch.full((T, NQ * D), float("nan"), dtype=dtype, device=dev)
        AS.slot_attention(q[s * T:(s + 1) * T], kc[s:s + 1], vc[s:s + 1], cl[s:s + 1], one, ws,
                          mode="whole" if s % 2 else "split")
        assert torch.equal(one, outs["split"][s * T:(s + 1) * T]), s


def test_chunk_layout_depends_on_prefix_only():
    """The fold order of a slot: BLOCK_N-aligned chunks covering [0, P+T) once, at most NSPLIT of them."""
    for P in (0, 1, 63, 64, 1000, 1024, 4096):
        ch = AS.chunk_layout(P, 32, 32, 64, 64)
        assert ch[0][0] == 0 and ch[-1][1] == P + 32 and len(ch) <= 32
        assert all(a[1] == b[0] for a, b in zip(ch, ch[1:])) and all(s % 64 == 0 for s, _ in ch)
    assert AS.chunk_layout(1024, 32, 32, 64, 64) == [(64 * i, min(64 * i + 64, 1056)) for i in range(17)]


def test_slot_attention_bad_arguments(dev):
    q, kc, vc, cl = _slot_inputs(dev, torch.float32, 4, [5, 6])
    ws = A.AttnWorkspace(4, 4, 2, 16, dev, nsplit=4, block_n=16, min_keys=16, slots=1)
    out = torch.empty(8, 64, device=dev)
    with pytest.raises(ValueError, match="workspace for 1 slot"):
        AS.slot_attention(q, kc, vc, cl, out, ws)
    ws = A.AttnWorkspace(4, 4, 2, 16, dev, nsplit=4, block_n=16, min_keys=16, slots=2)
    with pytest.raises(ValueError, match="mode 'both'"):
        AS.slot_attention(q, kc, vc, cl, out, ws, mode="both")
    with pytest.raises(ValueError, match="rows a power of two"):
        AS.slot_qk_norm_rope_kv(torch.zeros(8, 128, device=dev), torch.ones(16), torch.ones(16),
                                *A.rope_tables(96, 8, 600000.0, dev), cl, q, kc, vc, 4, 2, rot=8, rows=6)


@pytest.mark.parametrize("dtype,rows", [(torch.float32, 16), (torch.float32, 4), (torch.float16, 2)])
def test_slot_qk_norm_rope_kv(dev, dtype, rows):
    """Row-blocked QK-norm + RoPE + K/V write over S = 3 slots (T = 6, so a 4-row block straddles slots): matches
    the fp32 reference per slot, writes only rows [P_s, P_s + T) of each cache, and a slot alone gives the same
    bits as among the others."""
    if dev == "cuda" and dtype == torch.float32:
        pytest.skip("covered by the bf16 GPU tests")
    T, NQ, NKV, D, ROT, ML, lens = 6, 4, 2, 16, 8, 96, [21, 0, 70]
    g = torch.Generator().manual_seed(rows)
    S = len(lens)
    qkv = torch.randn(S * T, (NQ + 2 * NKV) * D, generator=g).to(dtype).to(dev)
    qw = (torch.rand(D, generator=g) + 0.5).to(dtype).to(dev)
    kw = (torch.rand(D, generator=g) + 0.5).to(dtype).to(dev)
    cos, sin = A.rope_tables(ML, ROT, 600000.0, dev)
    kc0 = torch.randn(S, NKV, ML, D, generator=g).to(dtype).to(dev)
    vc0 = torch.randn(S, NKV, ML, D, generator=g).to(dtype).to(dev)
    cl = torch.tensor(lens, dtype=torch.int32, device=dev)
    kc, vc = kc0.clone(), vc0.clone()
    q = torch.full((S * T, NQ, D), float("nan"), dtype=dtype, device=dev)
    AS.slot_qk_norm_rope_kv(qkv, qw, kw, cos, sin, cl, q, kc, vc, NQ, NKV, rot=ROT, rows=rows)
    assert not torch.isnan(q).any()
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    for s, P in enumerate(lens):
        qr, kr, vr = A.qk_norm_rope_reference(qkv[s * T:(s + 1) * T], qw, kw, P, cos, sin, NQ, NKV, D, ROT)
        assert rel_err(q[s * T:(s + 1) * T], qr) < tol
        assert rel_err(kc[s, :, P:P + T].transpose(0, 1), kr) < tol
        assert torch.equal(vc[s, :, P:P + T].transpose(0, 1).float(), vr)
        for c, c0 in ((kc, kc0), (vc, vc0)):
            assert torch.equal(c[s, :, :P], c0[s, :, :P]) and torch.equal(c[s, :, P + T:], c0[s, :, P + T:])
        q1 = torch.full((T, NQ, D), float("nan"), dtype=dtype, device=dev)
        k1, v1 = kc0[s:s + 1].clone(), vc0[s:s + 1].clone()
        AS.slot_qk_norm_rope_kv(qkv[s * T:(s + 1) * T], qw, kw, cos, sin, cl[s:s + 1], q1, k1, v1, NQ, NKV, rot=ROT,
                                rows=rows)
        assert torch.equal(q1, q[s * T:(s + 1) * T]) and torch.equal(k1[0], kc[s]) and torch.equal(v1[0], vc[s])


@pytest.mark.gpu
def test_slot_attention_bf16_full_shape():
    """Model shape in bf16 (the H200 tiles: BLOCK_M 64, MIN_KEYS 64, NSPLIT 32): "split" = "whole" bit for bit
    for 6 slots of prefix 0..4000 and each slot alone; within bf16 rounding of the fp32 reference."""
    g = torch.Generator(device="cuda")
    g.manual_seed(11)
    lens, T, ML = [0, 1024, 4000, 37, 2048, 1], 32, 4096 + 64
    S = len(lens)
    q = torch.randn(S * T, 16, 128, device="cuda", generator=g).bfloat16()
    kc = torch.randn(S, 4, ML, 128, device="cuda", generator=g).bfloat16()
    vc = torch.randn(S, 4, ML, 128, device="cuda", generator=g).bfloat16()
    cl = torch.tensor(lens, dtype=torch.int32, device="cuda")
    ws = A.AttnWorkspace(T, 16, 4, 128, "cuda", nsplit=32, block_n=64, num_warps=4, num_stages=3, min_keys=64,
                         block_m=64, slots=S)
    outs = {m: AS.slot_attention(q, kc, vc, cl, torch.full((S * T, 2048), float("nan"), dtype=torch.bfloat16,
                                                            device="cuda"), ws, mode=m) for m in ("split", "whole")}
    assert not torch.isnan(outs["whole"]).any() and torch.equal(outs["split"], outs["whole"])
    assert rel_err(outs["whole"], AS.slot_attention_reference(q, kc, vc, cl)) < 1e-2
    for s in (0, 2, 5):
        one = AS.slot_attention(q[s * T:(s + 1) * T], kc[s:s + 1], vc[s:s + 1], cl[s:s + 1],
                                torch.empty(T, 2048, dtype=torch.bfloat16, device="cuda"), ws, mode="split")
        assert torch.equal(one, outs["whole"][s * T:(s + 1) * T]), s
