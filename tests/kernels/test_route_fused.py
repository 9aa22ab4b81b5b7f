"""Router + route in one launch (``route_fused.moe_route_align_fused``): against ``route_reference`` (exact inputs,
ties), bit for bit against the two-kernel path (``route.moe_route_align``) on the same inputs and tiles (ids,
weights, per-expert lists, active list, normalised rows, tile table; several units / splits / row blocks, two
layers in a row through the per-layer counts rows), the counters back at 0 after each launch, and the block
forwards (single and batched) with the fused path equal to the two-kernel path bit for bit."""
import pytest
import torch

pytest.importorskip("triton")

from repro.engine.kernels import moe as M  # noqa: E402
from repro.engine.kernels import norm as Nm  # noqa: E402
from repro.engine.kernels.route_fused import moe_route_align_fused  # noqa: E402

from .test_batched_forward import mma_model  # noqa: E402,F401 - fixture: the interpreter's dot as an MMA does it
from .test_route_select import _exact_inputs, batched_round  # noqa: E402


def _cfg(be, split, bk=16, warps=4):
    return {"router": dict(BLOCK_E=be, SPLIT_K=split, BLOCK_K=bk, num_warps=warps), "route": dict(num_warps=warps)}


def _state(ws, E, out=None):
    """Everything a routing leaves in ``ws`` (per-expert lists as sets: their order is not fixed)."""
    n = ws.counts[: E + 1].tolist()
    return {"ids": ws.topk_ids.clone(), "w": ws.topk_w.clone(), "pair_w": ws.pair_w.clone(),
            "counts": ws.counts_all.clone(), "sets": [sorted(ws.pairs[e, : n[e]].tolist()) for e in range(E + 1)],
            "active": sorted(ws.active[: int(ws.counts[E + 1])].tolist()) if ws.compact else None,
            "normed": None if out is None else out.clone(),
            "tiles": None if ws.tiles is None else ws.tiles.clone()}


def _route(fn, xs, gate, bias, E, k, ng, tg, cfg, dev, nw=None, with_out=True, row_block=None, tile_m=None,
           compact=False):
    """Route the inputs ``xs`` (one per layer) through ``fn`` on one workspace with a counts row per layer; returns
    the state after each layer and the workspace."""
    T, H = xs[0].shape
    ws = M.MoEWorkspace.create(T, H, 32, E, E + 1, k, torch.float32, dev, split_k=cfg["router"]["SPLIT_K"],
                               n_slots=len(xs))
    ws.compact = compact
    states = []
    for layer, x in enumerate(xs):
        out = torch.full_like(x, float("nan")) if (nw is not None and with_out) else None
        fn(x, gate, bias, ws, E + 1, k, ng, tg, 2.5, True, cfg, slot=layer if len(xs) > 1 else None, norm_w=nw,
           norm_out=out, row_block=row_block, tile_block_m=tile_m)
        states.append(_state(ws, E, out))
    return states, ws


def _assert_same(a, b):
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


@pytest.mark.parametrize("T,H,E,k,ng,tg,seed", [(16, 64, 32, 4, 4, 2, 0), (32, 128, 64, 8, 8, 4, 1),
                                                (8, 64, 16, 4, 4, 2, 2)])
def test_fused_matches_reference_with_ties(dev, T, H, E, k, ng, tg, seed):
    """Exact logits (integers times 2^-10) with duplicated experts and groups: the same experts in the same order as
    ``route_reference`` (ties to the lower index), weights to fp32 rounding, each expert's pair list exact."""
    x, gate, bias = _exact_inputs(T, H, E, ng, seed, dev)
    ref_ids, ref_w = M.route_reference(x, gate, bias, k, ng, tg, 2.5)
    (st,), ws = _route(moe_route_align_fused, [x], gate, bias, E, k, ng, tg, _cfg(16, 2), dev, compact=True)
    assert torch.equal(st["ids"].long(), ref_ids)
    torch.testing.assert_close(st["w"], ref_w, rtol=2e-6, atol=0)
    torch.testing.assert_close(st["pair_w"][: T * k], ref_w.flatten(), rtol=2e-6, atol=0)
    for e in range(E):
        assert st["sets"][e] == sorted(torch.nonzero(ref_ids.flatten() == e).flatten().tolist())
    assert st["sets"][E] == list(range(T * k, T * k + T))  # the shared expert's constant list untouched
    assert st["active"] == sorted(set(ref_ids.flatten().tolist()))
    assert not ws.fused_route.cnt1.any() and not ws.fused_route.cnt2.any()


# (T, E, n_group, topk_group, top_k, BLOCK_E, SPLIT_K, rows): a unit of one expert tile holding 2 groups, of 2 tiles
# per group, of one tile = one group; 1 to 4 splits; one row block, two, and one larger than the rows
LAYOUTS = [
    (24, 32, 4, 2, 4, 16, 2, None),
    (24, 32, 4, 2, 4, 4, 4, None),
    (32, 64, 8, 4, 8, 8, 2, 16),
    (20, 32, 4, 2, 4, 8, 1, 64),
    (8, 16, 4, 2, 4, 4, 2, None),
]


@pytest.mark.parametrize("T,E,ng,tg,k,be,split,rows", LAYOUTS)
@pytest.mark.parametrize("norm", ["out", "none"])
def test_fused_bit_identical_to_two_kernels(dev, mma_model, T, E, ng, tg, k, be, split, rows, norm):
    """Random fp32 inputs (near-ties possible: the point is the same bits, not the reference), two MoE layers in a
    row: every result of the fused launch equals the two-kernel path's bit for bit, the counters are back at 0."""
    if dev == "cuda":
        pytest.skip("fp32 on GPU uses tf32 dots; the bf16 GPU test covers CUDA")
    g = torch.Generator().manual_seed(T + E + be + split)
    H = 64
    xs = [(torch.randn(T, H, generator=g) * s).to(dev) for s in (2.0, 0.5)]
    gate = (torch.randn(E, H, generator=g) / H ** 0.5).to(dev)
    bias = (torch.randn(E, generator=g) * 0.05).to(dev)
    nw = (torch.rand(H, generator=g) + 0.5).to(dev) if norm == "out" else None
    cfg = _cfg(be, split)
    old, _ = _route(M.moe_route_align, xs, gate, bias, E, k, ng, tg, cfg, dev, nw=nw, row_block=rows, compact=True)
    new, ws = _route(moe_route_align_fused, xs, gate, bias, E, k, ng, tg, cfg, dev, nw=nw, row_block=rows,
                     compact=True)
    for a, b in zip(old, new):
        _assert_same(a, b)
    assert not ws.fused_route.cnt1.any() and not ws.fused_route.cnt2.any() and int(ws.ticket[0]) == 0
    if nw is not None:
        torch.testing.assert_close(new[-1]["normed"], Nm.rmsnorm_reference(xs[-1], nw), rtol=1e-5, atol=1e-6)
    ref_ids, ref_w = M.route_reference(Nm.rmsnorm_reference(xs[-1], nw) if nw is not None else xs[-1], gate, bias,
                                       k, ng, tg, 2.5)
    same = (new[-1]["ids"].long() == ref_ids).all(1)
    assert same.float().mean() > 0.9  # the rest: fp32 near-ties
    torch.testing.assert_close(new[-1]["w"][same], ref_w[same], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("offset", [1, 2])
def test_fused_independent_of_the_last_program(dev, mma_model, offset):
    """Phases 2 and 3 run in the program that takes the last ticket. Route once, then again on the same inputs with
    every counter started at ``offset``: earlier programs (in the interpreter's order) now sum the partials and
    select, reading the later programs' stores from the first launch (the same values). Same bits: every sum is
    read back from memory in a fixed order, whichever program does it."""
    if dev == "cuda":
        pytest.skip("the interpreter runs programs in a fixed order; the GPU graph test covers CUDA")
    g = torch.Generator().manual_seed(9)
    T, H, E, k, ng, tg = 24, 64, 32, 4, 4, 2
    x = torch.randn(T, H, generator=g) * 2
    gate = torch.randn(E, H, generator=g) / H ** 0.5
    bias = torch.randn(E, generator=g) * 0.05
    nw = torch.rand(H, generator=g) + 0.5
    cfg = _cfg(4, 4)  # units of 2 tiles x 4 splits: 8 programs per unit, 4 units
    ws = M.MoEWorkspace.create(T, H, 32, E, E + 1, k, torch.float32, dev, split_k=4)
    states = []
    for start in (0, offset):
        if start:
            ws.fused_route.cnt1.fill_(start)
            ws.fused_route.cnt2.fill_(start)
        out = torch.full_like(x, float("nan"))
        moe_route_align_fused(x, gate, bias, ws, E + 1, k, ng, tg, 2.5, True, cfg, norm_w=nw, norm_out=out,
                              row_block=16)
        states.append(_state(ws, E, out))
    _assert_same(states[0], states[1])
    assert (ws.fused_route.cnt1 == offset).all() and (ws.fused_route.cnt2 == offset).all()


@pytest.mark.parametrize("R,block_m,rows", [(48, 8, 16), (40, 16, None)])
def test_fused_tile_table(dev, R, block_m, rows):
    """``tile_block_m``: the tile table written by the fused launch's last row block equals the two-kernel path's
    (and ``moe_tiles``'), over two routings in a row; the ticket is back at 0."""
    g = torch.Generator().manual_seed(R)
    H, E, k, ng, tg = 64, 16, 4, 4, 2
    gate = (torch.randn(E, H, generator=g) / H ** 0.5).to(dev)
    bias = (torch.randn(E, generator=g) * 0.05).to(dev)
    xs = [(torch.randn(R, H, generator=g) * s).to(dev) for s in (3.0, 0.2)]
    xs[0][: R // 2] = xs[0][0]  # half the tokens identical: one expert gets several tiles
    old, _ = _route(M.moe_route_align, xs, gate, bias, E, k, ng, tg, _cfg(8, 2), dev, row_block=rows, tile_m=block_m)
    new, ws = _route(moe_route_align_fused, xs, gate, bias, E, k, ng, tg, _cfg(8, 2), dev, row_block=rows,
                     tile_m=block_m)
    for a, b in zip(old, new):
        _assert_same(a, b)
    assert int(ws.ticket[0]) == 0
    assert torch.equal(M.moe_tiles(ws, block_m, static=True).clone(), new[-1]["tiles"])


def test_fused_rejects_bad_arguments(dev):
    x, gate, bias = _exact_inputs(8, 64, 16, 4, 0, dev, ties=False)
    ws = M.MoEWorkspace.create(8, 64, 32, 16, 17, 4, torch.float32, dev, split_k=2)
    with pytest.raises(ValueError, match="norm_out needs norm_w"):
        moe_route_align_fused(x, gate, bias, ws, 17, 4, 4, 2, 2.5, True, _cfg(8, 2), norm_out=torch.zeros_like(x))
    with pytest.raises(ValueError, match="power of two"):
        moe_route_align_fused(x, gate, bias, ws, 17, 4, 4, 2, 2.5, True, _cfg(8, 2), row_block=24)


def test_block_forward_fused_route_bit_identical(dev, mma_model):
    """BlockForward (tiny model, interpreter, fp32): ``fused_route`` gives the two-kernel path's logits and K/V bit
    for bit, with the post-attention norm in the route (the default) and without it."""
    if dev == "cuda":
        pytest.skip("fp32 on GPU uses tf32 dots; the bf16 GPU test covers CUDA")
    from repro.engine.kernels import fastpath as F

    from .test_fastpath import TINY, TINY_CFG

    W = F.random_weights(TINY, dev, torch.float32, seed=4, std=0.1)
    T, P = 8, 13
    g = torch.Generator().manual_seed(2)
    kv = torch.randn(TINY.layers, 2, TINY.nkv, 64, TINY.head_dim, generator=g)
    ids = torch.randint(0, TINY.vocab, (T,), generator=g)
    for norm_in_route in (True, False):
        got = []
        for fused in (False, True):
            fw = F.BlockForward(W, TINY, 64, T=T, device=dev, configs=TINY_CFG)
            fw.norm_in_route, fw.fused_route = norm_in_route, fused
            fw.kv.copy_(kv)
            fw.ids.copy_(ids)
            fw.cache_len.fill_(P)
            fw.forward()
            got.append((fw.logits.clone(), fw.kv.clone()))
        assert torch.equal(got[0][0], got[1][0]) and torch.equal(got[0][1], got[1][1]), norm_in_route


def test_batched_forward_fused_route_bit_identical(dev, mma_model):
    """BatchedBlockForward (3 slots, router tiles of 16 rows: several row blocks): ``fused_route`` (also writing the
    tile table, ``tiles_in_select``) gives the two-kernel path's round bit for bit."""
    if dev == "cuda":
        pytest.skip("fp32 on GPU uses tf32 dots; the bf16 GPU test covers CUDA")
    old = batched_round(dev)
    assert old[2].router_rows == 16 and old[2].ws.T_PAD == 32
    for in_select in (False, True):
        new = batched_round(dev, fused_route=True, tiles_in_select=in_select)
        assert torch.equal(new[0], old[0]) and torch.equal(new[1], old[1]), in_select


H200_SINGLE = dict(BLOCK_E=16, SPLIT_K=32, BLOCK_K=64, num_warps=4, num_stages=2, PREC="tf32x3")  # single-request file


@pytest.mark.gpu
@pytest.mark.parametrize("R,router,pdl", [
    (32, H200_SINGLE, False),
    (32, H200_SINGLE, True),  # one K step per split: the weight tile loaded before the PDL wait
    (32, dict(BLOCK_E=32, SPLIT_K=8, BLOCK_K=64, num_warps=4, num_stages=2, PREC="tf32x3", SEL_ROWS=8), False),
    pytest.param(32, dict(BLOCK_E=16, SPLIT_K=16, BLOCK_K=64, num_warps=4, num_stages=2, PREC="tf32x3", ROWS=16),
                 False, marks=pytest.mark.xfail(strict=True, reason=(
                     "two router row blocks of 16: on an H100 (2026-12-07) the fused launch's routing weights differed "
                     "from the two-kernel path's in the last bit (max rel 1e-7; ids, pairs and tiles equal); the fused "
                     "route is off by default (slower on that card, docs/perf.md)"))),
    (256, dict(BLOCK_E=64, SPLIT_K=8, BLOCK_K=64, num_warps=4, num_stages=2, PREC="tf32x3", ROWS=64), False),
])
def test_fused_bf16_model_shape_graph(R, router, pdl):
    """LLaDA2.1-mini routing shapes in bf16 (H 2048, 256 experts + shared, top-8 of 8 groups / 4): the fused launch
    vs the two-kernel path with the same tiles and warps, eager and as CUDA-graph replays of two layers (the
    counters reset by each launch): ids, pair lists and tile tables equal, weights and normalised rows equal (a
    last-bit difference of r on the GPU would show here). ``pdl``: the fused launch with programmatic dependent
    launch (its weight tile loaded before the wait when one K step covers its split)."""
    from repro.engine.kernels import _triton
    H, E, k, ng, tg = 2048, 256, 8, 8, 4
    g = torch.Generator(device="cuda").manual_seed(R)
    h = torch.randn(R, H, device="cuda", generator=g).to(torch.bfloat16)
    nw = (1 + 0.1 * torch.randn(H, device="cuda", generator=g)).to(torch.bfloat16)
    gates = [torch.randn(E, H, device="cuda", generator=g) * 0.02 for _ in range(2)]
    biases = [torch.randn(E, device="cuda", generator=g) * 0.01 for _ in range(2)]
    cfg = {"router": router, "route": dict(num_warps=router["num_warps"])}
    states = {}
    for name, fn in (("old", M.moe_route_align), ("new", moe_route_align_fused)):
        _triton.set_pdl(pdl and name == "new")
        ws = M.MoEWorkspace.create(R, H, 512, E, E + 1, k, torch.bfloat16, "cuda", split_k=router["SPLIT_K"],
                                   n_slots=2)
        out = torch.zeros_like(h)

        def run():
            for layer in range(2):
                fn(h, gates[layer], biases[layer], ws, E + 1, k, ng, tg, 2.5, True, cfg, slot=layer, norm_w=nw,
                   norm_out=out, row_block=router.get("ROWS", 32), tile_block_m=64)
        run()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run()
        eager = _state(ws, E, out)
        for _ in range(2):
            out.zero_()
            graph.replay()
            torch.cuda.synchronize()
            _assert_same(eager, _state(ws, E, out))
        states[name] = eager
        _triton.set_pdl(False)
        if name == "new":
            assert not ws.fused_route.cnt1.any() and not ws.fused_route.cnt2.any() and int(ws.ticket[0]) == 0
    _assert_same(states["old"], states["new"])
