"""Route-select kernel (``route._route_select_kernel`` through ``moe_route_align``): the selection rule against
``route_reference`` including exact ties, a slot's routing alone vs among other slots (the batched forward's row
invariance), and the tile table written by the select kernel's last program vs ``moe_tiles`` and a hand-built one.

Exact inputs: x holds small integers and the router weights multiples of 2^-10, so every logit is exact in fp32
whatever the summation order (split-K partials, tf32x3 or IEEE dots, torch's matmul): the kernel and the
reference then select from the same numbers, up to the last bit of the sigmoid, and duplicated router rows give
exact ties, which both resolve to the lower expert (or group) index.
"""
import pytest
import torch

pytest.importorskip("triton")

from repro.engine.kernels import moe as M  # noqa: E402
from repro.engine.kernels import norm as Nm  # noqa: E402

from .conftest import rel_err  # noqa: E402
from .test_batched_forward import mma_model  # noqa: E402,F401 - fixture: the interpreter's dot as an MMA does it

CFG = {"router": dict(BLOCK_E=16, SPLIT_K=2, BLOCK_K=32), "route": dict(num_warps=1)}


def _exact_inputs(T, H, E, n_group, seed, dev, ties=True):
    """x [T, H] fp32 integers in [-3, 3]; gate [E, H] multiples of 2^-10 in [-8, 8]·2^-10; bias multiples of 2^-8.
    With ``ties``: expert 3 repeats expert 1 (same group), the last expert repeats expert 0 (another group), and
    group 1 is group 0 again, so that its group score ties with group 0's."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-3, 4, (T, H), generator=g).float()
    gate = torch.randint(-8, 9, (E, H), generator=g).float() / 1024
    bias = torch.randint(-4, 5, (E,), generator=g).float() / 256
    if ties:
        gs = E // n_group
        gate[3], bias[3] = gate[1], bias[1]
        gate[E - 1], bias[E - 1] = gate[0], bias[0]
        gate[gs:2 * gs], bias[gs:2 * gs] = gate[:gs], bias[:gs]
    return x.to(dev), gate.contiguous().to(dev), bias.to(dev)


@pytest.mark.parametrize("T,H,E,k,ng,tg,seed", [(16, 64, 32, 4, 4, 2, 0), (32, 128, 64, 8, 8, 4, 1),
                                                (8, 64, 16, 4, 4, 2, 2)])
def test_select_matches_reference_with_ties(dev, T, H, E, k, ng, tg, seed):
    x, gate, bias = _exact_inputs(T, H, E, ng, seed, dev)
    ref_ids, ref_w = M.route_reference(x, gate, bias, k, ng, tg, 2.5)
    logits = x.double() @ gate.double().t()
    assert torch.equal(logits, (x @ gate.t()).double())  # the inputs really are exact
    n_tied = int((logits[:, None, :] == logits[:, :, None]).sum() - logits.numel()) // 2
    assert n_tied >= 3 * T  # the duplicated experts tie in every token
    ws = M.MoEWorkspace.create(T, H, 32, E, E + 1, k, torch.float32, dev, split_k=CFG["router"]["SPLIT_K"])
    ws.topk_ids.fill_(-1)
    M.moe_route_align(x, gate, bias, ws, E + 1, k, ng, tg, 2.5, True, CFG)
    assert torch.equal(ws.topk_ids.long(), ref_ids)  # same experts in the same order (ties: lower index first)
    torch.testing.assert_close(ws.topk_w, ref_w, rtol=2e-6, atol=0)
    torch.testing.assert_close(ws.pair_w[: T * k], ref_w.flatten(), rtol=2e-6, atol=0)
    counts = ws.counts[:E].tolist()
    for e in range(E):  # each expert's pair list: exactly the pairs t*k + slot that chose it
        want = sorted(torch.nonzero(ref_ids.flatten() == e).flatten().tolist())
        assert sorted(ws.pairs[e, : counts[e]].tolist()) == want
    n_act = int(ws.counts[E + 1])
    assert sorted(ws.active[:n_act].tolist()) == sorted(set(ref_ids.flatten().tolist()))


def test_reference_tie_rule():
    """route_reference: an exact tie between two experts (and between two groups) goes to the lower index."""
    scores_logit = torch.zeros(1, 8)
    scores_logit[0, [1, 2, 5, 6]] = 2.0  # groups of 2: group 0 {0,1}, 1 {2,3}, 2 {4,5}, 3 {6,7}
    gate = torch.eye(8)
    ids, _ = M.route_reference(scores_logit, gate, None, top_k=2, n_group=4, topk_group=2)
    assert ids.tolist() == [[1, 2]]  # groups 0..3 all score sigmoid(2)+sigmoid(0): groups 0 and 1 kept


def _route_rows(h, gate, bias, nw, k, ng, tg, dev, tile_m=None, row_block=16):
    R, H = h.shape
    E = gate.shape[0]
    ws = M.MoEWorkspace.create(R, H, 32, E, E + 1, k, torch.float32, dev, split_k=CFG["router"]["SPLIT_K"])
    out = torch.full_like(h, float("nan"))
    M.moe_route_align(h, gate, bias, ws, E + 1, k, ng, tg, 2.5, True, CFG, norm_w=nw, norm_out=out,
                      row_block=row_block, tile_block_m=tile_m)
    return ws, out


@pytest.mark.parametrize("row_block", [16, 64])
def test_slot_routing_alone_vs_with_others(dev, mma_model, row_block):
    """Three 16-row slots routed together (router tiles of ``row_block`` rows: one slot, or several slots in one
    tile and a slot alone in a tile larger than its rows; the normalised rows written by the select kernel) equal
    each slot routed alone, bit for bit: ids, weights, normed rows, per-expert token sets."""
    g = torch.Generator().manual_seed(5)
    S, T, H, E, k, ng, tg = 3, 16, 64, 32, 4, 4, 2
    h = (torch.randn(S * T, H, generator=g) * 2).to(dev)
    gate = (torch.randn(E, H, generator=g) / H ** 0.5).to(dev)
    bias = (torch.randn(E, generator=g) * 0.05).to(dev)
    nw = (torch.rand(H, generator=g) + 0.5).to(dev)
    big, big_out = _route_rows(h, gate, bias, nw, k, ng, tg, dev, tile_m=8, row_block=row_block)
    assert not torch.isnan(big_out).any()
    torch.testing.assert_close(big_out, Nm.rmsnorm_reference(h, nw), rtol=1e-5, atol=1e-6)
    ref_ids, _ = M.route_reference(Nm.rmsnorm_reference(h, nw), gate, bias, k, ng, tg, 2.5)
    assert (big.topk_ids.long() == ref_ids).all(1).float().mean() > 0.95  # same routing up to fp32 near-ties
    for s in range(S):
        rows = slice(s * T, (s + 1) * T)
        one, one_out = _route_rows(h[rows], gate, bias, nw, k, ng, tg, dev, tile_m=8, row_block=row_block)
        assert torch.equal(one.topk_ids, big.topk_ids[rows]), s
        assert torch.equal(one.topk_w, big.topk_w[rows]), s
        assert torch.equal(one_out, big_out[rows]), s
        for e in range(E):  # expert e's tokens of this slot: the same in both runs
            mine = {p // k for p in one.pairs[e, : int(one.counts[e])].tolist()}
            theirs = {p // k - s * T for p in big.pairs[e, : int(big.counts[e])].tolist() if p // k in range(
                s * T, (s + 1) * T)}
            assert mine == theirs, (s, e)


def _hand_table(counts, block_m, maxt):
    rows = [[e, b] for e in range(len(counts)) for b in range(-(-counts[e] // block_m))]
    return rows + [[-1, 0]] * (maxt - len(rows))


@pytest.mark.parametrize("R,block_m", [(48, 8), (40, 16), (8, 64)])
def test_tile_table_from_select_kernel(dev, R, block_m):
    """``moe_route_align(tile_block_m=)``: the table equals the hand-built one and ``moe_tiles``'s, on two
    different routings in a row through the per-layer counts rows (stale entries of the first are overwritten),
    and the ticket is back at 0 after each launch."""
    g = torch.Generator().manual_seed(R)
    H, E, k, ng, tg = 64, 16, 4, 4, 2
    gate = (torch.randn(E, H, generator=g) / H ** 0.5).to(dev)
    bias = (torch.randn(E, generator=g) * 0.05).to(dev)
    ws = M.MoEWorkspace.create(R, H, 32, E, E + 1, k, torch.float32, dev, split_k=CFG["router"]["SPLIT_K"],
                               n_slots=2)
    ws2 = M.MoEWorkspace.create(R, H, 32, E, E + 1, k, torch.float32, dev, split_k=CFG["router"]["SPLIT_K"])
    for layer, scale in enumerate((3.0, 0.2)):  # a spread-out routing, then a different one
        x = (torch.randn(R, H, generator=g) * scale).to(dev)
        if layer == 0:
            x[: R // 2] = x[0]  # half the tokens identical: one expert gets >= R/2 rows (several tiles)
        M.moe_route_align(x, gate, bias, ws, E + 1, k, ng, tg, 2.5, True, CFG, slot=layer, tile_block_m=block_m)
        counts = ws.counts[: E + 1].tolist()
        maxt = -(-(R * k + R) // block_m) + E + 1
        assert ws.tiles.shape == (maxt, 2) and ws.tiles_block_m == block_m
        assert ws.tiles.tolist() == _hand_table(counts, block_m, maxt), layer
        assert int(ws.ticket[0]) == 0
        M.moe_route_align(x, gate, bias, ws2, E + 1, k, ng, tg, 2.5, True, CFG)
        assert torch.equal(M.moe_tiles(ws2, block_m), ws.tiles)
        assert torch.equal(ws2.topk_ids, ws.topk_ids)
    assert max(counts[:E]) >= 1


def batched_round(dev, moe=None, **attrs):
    """(logits, kv) of one BatchedBlockForward round of the tiny model (3 slots of 8 tokens, prefixes 9 / 0 / 30,
    fixed random weights, cache and ids; fp32 under the interpreter) with the MoE tiles ``moe`` (default the small
    tiles) and the forward's attributes ``attrs`` (e.g. ``tiles_in_select=True``)."""
    from repro.engine.graph import SMALL_TILES
    from repro.engine.kernels import fastpath as F
    from repro.engine.kernels.fastpath_batch import BatchedBlockForward

    from .test_batched_forward import MAX_LEN, T, TINY

    W = F.random_weights(TINY, dev, torch.float32, seed=11, std=0.1)
    g = torch.Generator().manual_seed(3)
    kv = torch.randn(TINY.layers, 2, 3, TINY.nkv, MAX_LEN, TINY.head_dim, generator=g)
    ids = torch.randint(0, TINY.vocab, (3, T), generator=g)
    fw = BatchedBlockForward(W, TINY, MAX_LEN, slots=3, T=T, device=dev,
                             configs={**SMALL_TILES, "moe": moe or SMALL_TILES["moe"]})
    for k, v in attrs.items():
        setattr(fw, k, v)
    fw.kv.copy_(kv)
    fw.ids.copy_(ids)
    fw.cache_len.copy_(torch.tensor([9, 0, 30], dtype=torch.int32))
    fw.forward()
    return fw.logits.clone(), fw.kv.clone(), fw


def test_batched_forward_tile_table_in_select(dev, mma_model):
    """BatchedBlockForward: the tile table written by the select kernel (``tiles_in_select = True``, an option, off
    by default) and by its own launch (the default) give the same round bit for bit, also with router tiles of 64
    rows (ROWS > the 3 x 8 rows of the round)."""
    from repro.engine.graph import SMALL_TILES

    if dev == "cuda":
        pytest.skip("fp32 on GPU uses tf32 dots; the bf16 GPU test covers CUDA")
    outs = []
    for in_select, rows in ((True, None), (False, None), (True, 64)):
        moe = dict(SMALL_TILES["moe"], router=dict(SMALL_TILES["moe"]["router"], **({"ROWS": rows} if rows else {})))
        logits, kv, fw = batched_round(dev, moe, tiles_in_select=in_select)
        assert fw.router_rows == (rows or 16)
        outs.append((logits, kv))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    assert rel_err(outs[2][0], outs[0][0]) < 1e-5  # other router tiles: the same up to fp32 rounding
