"""The warp-specialised Gluon 16-bit expert GEMMs (repro/engine/kernels/moe_ws.py): their ahead-of-time build for
sm_90a on the tested Triton 3.6 (CPU, a subprocess), their refusal off Hopper, and on a Hopper GPU their output at
the real shapes against the Triton BF16 kernels and the torch reference."""
import pytest
import torch

pytest.importorskip("triton")

from repro.engine.kernels import moe as M  # noqa: E402

from .conftest import rel_err  # noqa: E402
from .test_moe_w4_ws import run_on_tested_triton  # noqa: E402

_AOT = """
from repro.engine.kernels.moe_ws import HAS_GLUON, aot_build
import json, triton
assert HAS_GLUON, "no Gluon 3.6 API"
out = {}
for kernel in ("gate_up", "down"):
    for tiles in (dict(TILES=False), dict(TILES=True), dict(TILES=True, BLOCK_M=32, STAGES=3)):
        k = aot_build(kernel, (9, 0), tiles)
        ptx, ttgir = k.asm["ptx"], k.asm["ttgir"]
        out[f"{kernel} {tiles}"] = dict(cubin=len(k.asm["cubin"]), shared=int(k.metadata.shared),
                                        triton=triton.__version__, target=".target sm_90a" in ptx,
                                        wgmma=ptx.count("wgmma.mma_async"), setmaxnreg=ptx.count("setmaxnreg"),
                                        cp_async=ptx.count("cp.async.cg.shared.global"),
                                        cp_async_mbar=ptx.count("cp.async.mbarrier.arrive.noinc"),
                                        ws=ttgir.count("ttg.warp_specialize"), partitions=ttgir.count("partition0("))
print(json.dumps(out))
"""


def test_gluon16_kernels_build_for_sm90a():
    """gate+up and down compile for sm_90a on the tested Triton (3.6) without a GPU, at the real shapes (32 slots),
    plain grid and the tile table, BLOCK_M 64 and 32: a cubin with wgmma, the warp-specialised region with its loader
    partition and register reallocation, 16-byte cp.async copies and their mbarrier arrivals, shared memory within
    the card's 227 KB per block."""
    built = run_on_tested_triton(_AOT)
    assert len(built) == 6, built
    for tiles, r in built.items():
        assert r["triton"].startswith("3.6") and r["cubin"] > 0 and r["target"], (tiles, r)
        assert r["wgmma"] > 0 and r["ws"] == 1 and r["partitions"] == 1 and r["setmaxnreg"] > 0, (tiles, r)
        assert r["cp_async"] > 0 and r["cp_async_mbar"] > 0, (tiles, r)
        assert r["shared"] <= 227 * 1024, (tiles, r)


def test_moe_experts_sends_bf16_ws_tiles_to_the_gluon16_kernels():
    """``moe_experts`` with ``IMPL: "ws"`` tiles and bf16 experts goes to moe_ws's kernels: off Hopper that is their
    one-line refusal, not a silent Triton run; tile keys of neither kernel are refused by name."""
    from repro.engine.kernels.moe_ws import WS16_TILES_DEFAULT, moe_gate_up_ws16

    if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9:
        pytest.skip("a Hopper GPU runs the Gluon kernels: test_gluon16_* covers it")
    T, H, N, E, k = 4, 128, 64, 8, 2
    g = torch.Generator().manual_seed(0)
    w13 = torch.randn(E, 2 * N, H, generator=g).to(torch.bfloat16)
    w2 = torch.randn(E, H, N, generator=g).to(torch.bfloat16)
    x = torch.randn(T, H, generator=g).to(torch.bfloat16)
    ws = M.MoEWorkspace(T, H, N, E, E, k, torch.bfloat16, "cpu", split_k=1)
    tiles = {k_: dict(v, IMPL="ws") for k_, v in WS16_TILES_DEFAULT.items()}
    with pytest.raises(RuntimeError, match="moe_gate_up_ws16: needs (triton.experimental.gluon|a Hopper GPU)"):
        M.moe_experts(x, w13, w2, ws, k, tiles)
    with pytest.raises(RuntimeError, match="moe_down_ws16: needs"):
        M.moe_experts(x, w13, w2, ws, k, {"down": tiles["down"]})
    with pytest.raises(ValueError, match=r"tile keys \['W4_DECODE'\] are not this kernel's"):
        moe_gate_up_ws16(x, w13, ws, k, dict(tiles["gate_up"], W4_DECODE=5))


def _gpu_case(slots, block_m, pair_dtype=None):
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs sm_90 (Hopper)")
    from repro.engine.kernels.moe_ws import HAS_GLUON, real_case16

    if not HAS_GLUON:
        pytest.skip("no Triton 3.6 Gluon")
    return real_case16(slots, block_m, pair_dtype=pair_dtype)


def _triton16(block_m):
    """The Triton BF16 expert kernels' tiles at this BLOCK_M that take wgmma (BLOCK_M 64) or mma.sync."""
    return {"gate_up": dict(BLOCK_M=block_m, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=3),
            "down": dict(BLOCK_M=block_m, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=3)}


@pytest.mark.gpu
@pytest.mark.parametrize("slots,block_m", [(1, 16), (8, 32), (32, 64)])
def test_gluon16_matches_triton_and_reference(slots, block_m):
    """On sm_90, real shapes: the Gluon gate+up's inter and down's pair_out against the Triton BF16 kernels' at the
    same BLOCK_M (both fp32 accumulation in K order, 16 inputs per MMA: within the bf16 rounding of inter, and fp32
    summation order for pair_out) and, at one slot, against the torch reference pair by pair."""
    from repro.engine.kernels.moe_gemm import expert_gemms_reference
    from repro.engine.kernels.moe_ws import moe_down_ws16, moe_gate_up_ws16

    x, w13, w2, ws, k = _gpu_case(slots, block_m, torch.float32)  # fp32 pair rows: the arithmetic compared
    tiles = dict(BLOCK_M=block_m)
    ws.inter.fill_(float("nan"))
    moe_gate_up_ws16(x, w13, ws, k, tiles)
    inter = ws.inter.clone()
    assert not torch.isnan(inter[: ws.T * (k + 1)]).any()
    ws.pair_out.fill_(float("nan"))
    moe_down_ws16(w2, ws, tiles)
    out = ws.pair_out.clone()
    M.moe_gate_up(x, w13, ws, k, _triton16(block_m))
    assert rel_err(inter, ws.inter) < 4e-3
    M.moe_down(w2, ws, _triton16(block_m))  # from the Triton inter; ours from ours: compare down on one input
    tri_out = ws.pair_out.clone()
    ws.inter.copy_(inter)
    M.moe_down(w2, ws, _triton16(block_m))
    assert rel_err(out, ws.pair_out) < 1e-5
    assert rel_err(out, tri_out) < 4e-3
    fp32_rows = ws.pair_out
    ws.pair_out = torch.full(out.shape, float("nan"), dtype=torch.bfloat16, device="cuda")  # the engine's pair rows
    moe_down_ws16(w2, ws, tiles)
    assert torch.equal(ws.pair_out, out.to(torch.bfloat16)), "Gluon: bf16 pair rows are not its fp32 sums rounded"
    M.moe_down(w2, ws, _triton16(block_m))
    assert torch.equal(ws.pair_out, fp32_rows.to(torch.bfloat16)), "Triton: bf16 pair rows are not its fp32 sums"
    ws.pair_out = fp32_rows
    if slots == 1:  # the torch reference, pair by pair (its gathered weights are [T, k+1, 2N, H] fp32: 2.4 GB here)
        ids = torch.full((ws.T, k + 1), 256, device="cuda", dtype=torch.long)
        wts = torch.ones(ws.T, k + 1, device="cuda")
        for e in range(256):  # pair p = t·k + j of a routed expert; the shared expert's are T·k + t (column k)
            pe = ws.pairs[e, : int(ws.counts[e])].long()
            ids[pe // k, pe % k] = e
            wts[pe // k, pe % k] = ws.pair_w[pe]
        ref_inter, ref_out = expert_gemms_reference(x, w13, w2, ids, wts)
        as_pairs = lambda t: torch.cat([t[: ws.T * k].view(ws.T, k, -1), t[ws.T * k: ws.T * (k + 1)][:, None]], 1)
        assert rel_err(as_pairs(inter), ref_inter) < 4e-3
        assert rel_err(as_pairs(out), ref_out) < 4e-3  # the reference's pair_out is from its own inter


@pytest.mark.gpu
@pytest.mark.parametrize("slots", [8, 32])
def test_gluon16_rows_do_not_depend_on_block_m(slots):
    """A pair's numbers do not depend on BLOCK_M (the wgmma's N) — the condition for BLOCK_M to follow the slot count
    (``by_slots``) with this kernel: inter and pair_out bit-identical at BLOCK_M 16, 32 and 64."""
    from repro.engine.kernels.moe_ws import moe_down_ws16, moe_gate_up_ws16
    from repro.engine.kernels.route import moe_tiles

    x, w13, w2, ws, k = _gpu_case(slots, 16)
    got = []
    for bm in (16, 32, 64):
        moe_tiles(ws, bm, static=True)
        moe_gate_up_ws16(x, w13, ws, k, dict(BLOCK_M=bm))
        moe_down_ws16(w2, ws, dict(BLOCK_M=bm))
        got.append((ws.inter.clone(), ws.pair_out.clone()))
    P = ws.T * (k + 1)
    for bm, (i, o) in zip((32, 64), got[1:]):
        assert torch.equal(i[:P], got[0][0][:P]), f"inter differs at BLOCK_M {bm}"
        assert torch.equal(o[:P], got[0][1][:P]), f"pair_out differs at BLOCK_M {bm}"


def test_batched_forward_sends_ws_tiles_to_moe_ws(monkeypatch):
    """The batched round with ``IMPL: "ws"`` expert tiles (how the tile file or scripts/gpu/batched_tiles_ab.sh's
    ``ws16`` variant selects the Gluon kernels): every MoE layer's gate+up and down go to moe_ws with those tiles,
    over the tile table at their BLOCK_M; the dense layer 0 stays on the Triton kernels. On the CPU the Gluon
    kernels are replaced by the Triton ones at the same BLOCK_M (recording each call), so the round's outputs must
    equal the all-Triton round's."""
    import repro.engine.kernels.moe_ws as MW
    from repro.engine.graph import SMALL_TILES
    from repro.engine.kernels.fastpath import random_weights
    from repro.engine.kernels.fastpath_batch import BatchedBlockForward

    from .test_batched_forward import MAX_LEN, TINY, T

    if torch.cuda.is_available():
        pytest.skip("CPU plumbing check; the GPU tests run the Gluon kernels")
    calls = []

    def fake(kind):
        def run(*args, tiles=None):
            ws = args[2] if kind == "gate_up" else args[1]
            calls.append((kind, tiles.get("IMPL"), tiles["BLOCK_M"], ws.tiles_block_m))
            t = {kind: dict(SMALL_TILES["moe"][kind], BLOCK_M=tiles["BLOCK_M"])}
            (M.moe_gate_up(*args[:4], t) if kind == "gate_up" else M.moe_down(args[0], ws, t))
        return run

    monkeypatch.setattr(MW, "moe_gate_up_ws16", fake("gate_up"))
    monkeypatch.setattr(MW, "moe_down_ws16", fake("down"))
    W = random_weights(TINY, "cpu", torch.float32, seed=3, std=0.1)
    ws_moe = {**SMALL_TILES["moe"], **{k: dict(MW.WS16_TILES_DEFAULT[k], IMPL="ws", BLOCK_M=16) for k in
                                       ("gate_up", "down")}}
    outs = []
    for cfg in (SMALL_TILES, {**SMALL_TILES, "moe": ws_moe}):
        fw = BatchedBlockForward(W, TINY, MAX_LEN, slots=2, T=T, device="cpu", configs=cfg)
        g = torch.Generator().manual_seed(4)
        fw.ids.copy_(torch.randint(0, TINY.vocab, fw.ids.shape, generator=g))
        fw.forward()
        outs.append(fw.logits.clone())
    moe_layers = sum(1 for L in W["layers"] if "router" in L)
    assert calls == [("gate_up", "ws", 16, 16), ("down", "ws", 16, 16)] * moe_layers
    assert torch.equal(outs[0], outs[1])
