"""`python -m repro.engine.bench_graph_round`: the batched CUDA-graph round (kernels/fastpath_batch.py) on one GPU.

    python -m repro.engine.bench_graph_round [--slots 1,8,32] [--prefix 1024] [--iters 30] [--layers N]
        [--precision bf16|nvfp4-w4a16] [--json FILE]

LLaDA2.1-mini in its real shapes with deterministic random weights
(:func:`repro.engine.kernels.fastpath.random_weights`; ``--layers`` keeps fewer layers for a quick look), every
slot a block of 32 distinct random tokens at prefix ``--prefix`` over its own random KV cache. Per slot count S: one :class:`BatchedBlockForward` round as a CUDA-graph
replay (median of ``--iters``; head, i.e. lm_head + decode statistics, included), its **floor** = bytes the round
must read (:func:`~repro.engine.kernels.fastpath_batch.batched_round_bytes`: every weight once, the routed experts
touched by any slot counted on this round, each slot's K/V prefix) / device copy bandwidth, the ratio to it, and
the block tokens per round (S·32) and per second, and the seconds ``capture`` took (two warm-up forwards and
the graph capture; the first S includes compiling the kernels). Beside it the single-request :class:`BlockForward` round on slot
0's block (the batch-1 path of today: cuBLAS GEMMs), so the price of row invariance at batch 1 is the ratio of
the two. Row invariance is spot-checked: slot 0's logits at every S equal those at the first S, 1 by default
(``invariant``).

Prints one line per measurement on stderr, a table, and as the last stdout line one JSON document (also written to
``--json``).
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch


def _fill(fw, S, prefix, seed, shape):
    """Slot s: block ids and KV contents from seeds that depend on s only (so slot 0 is the same at every S)."""
    from .bench import _block_ids

    for s in range(S):
        fw.ids[s].copy_(_block_ids(shape, seed + 1000 * s))
        fw.kv[:, :, s].copy_(_random_cache(fw.kv[:, :, s], seed + 1000 * s + 1))
    fw.cache_len.fill_(prefix)


def _random_cache(like, seed):
    """A contiguous N(0, 1) tensor of ``like``'s shape and dtype from ``seed`` (the same values whatever the
    strides of the slot view it goes to)."""
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    return torch.empty(like.shape, dtype=like.dtype, device="cuda").normal_(0.0, 1.0, generator=g)


def bench_slots(slots, prefix=1024, iters=30, layers=None, precision="bf16", seed=0, log=print) -> dict:
    """Time the batched round at each S of ``slots`` and the BlockForward round; returns the JSON document."""
    from .bench import copy_bandwidth, env_info, time_replays
    from .kernels import fastpath as F
    from .kernels.fastpath_batch import BatchedBlockForward, batched_round_bytes

    overrides = {} if layers is None else {"num_hidden_layers": layers}
    shape = F.preset_shape("llada2.1-mini", **overrides)
    W = F.random_weights(shape, "cuda", torch.bfloat16, seed=seed)
    expert_bytes = None
    if precision == "nvfp4-w4a16":
        from .bench_w4 import w4_weights

        W = w4_weights(W, shape, seed)  # routed experts as random NVFP4 experts (the shared ones stay BF16)
        expert_bytes = 0.5 + 1 / 16
    copy_bw = copy_bandwidth()
    log(f"copy bandwidth {copy_bw:.0f} GB/s; {shape.layers} layers, prefix {prefix}, precision {precision}")
    doc = {"bench": "repro.engine.bench_graph_round", **env_info(), "prefix": prefix, "layers": shape.layers,
           "precision": precision, "copy_GBps": copy_bw, "rounds": []}
    max_len = prefix + 32 + 32
    ref_logits = None
    for S in slots:
        fw = BatchedBlockForward(W, shape, max_len, slots=S, T=32, device="cuda")
        _fill(fw, S, prefix, seed, shape)
        kv0 = fw.kv.clone()
        distinct = fw.distinct_experts()
        nb = batched_round_bytes(shape, distinct, [prefix] * S, 32, expert_bytes=expert_bytes)
        floor_ms = nb["total"] / (copy_bw * 1e9) * 1e3
        t0 = time.perf_counter()
        graph = fw.capture(head=True)  # 2 warm-up forwards (first S: kernel compilation too) + the capture
        capture_s = time.perf_counter() - t0
        t = time_replays(graph.replay, iters)
        fw.kv.copy_(kv0)
        graph.replay()
        torch.cuda.synchronize()
        lg0 = fw.logits[0].clone()
        if ref_logits is None:
            ref_logits = lg0
        r = {"slots": S, **t, "capture_s": capture_s, "floor_ms": floor_ms, "ratio": t["ms"] / floor_ms, "bytes_GB": nb["total"] / 1e9,
             "bytes_by_item_MB": {k: round(v / 1e6, 2) for k, v in nb.items()},
             "distinct_experts_mean": sum(distinct) / max(len(distinct), 1), "tokens_per_round": 32 * S,
             "block_tokens_per_s": 32 * S / (t["ms"] * 1e-3), "invariant": bool(torch.equal(lg0, ref_logits))}
        doc["rounds"].append(r)
        log(f"[S={S:>2}] {t['ms']:.3f} ms (min {t['ms_min']:.3f}), floor {floor_ms:.3f} ms, ratio {r['ratio']:.2f}, "
            f"D={r['distinct_experts_mean']:.1f}, {r['bytes_GB']:.2f} GB, {r['block_tokens_per_s']:.0f} block tok/s, "
            f"slot 0 = S=1: {r['invariant']}, capture {capture_s:.1f} s")
        del fw, graph, kv0
        torch.cuda.empty_cache()
    single = F.BlockForward(W, shape, max_len, T=32, device="cuda")
    single.ids.copy_(_single_ids(shape, seed))
    single.kv.copy_(_random_cache(single.kv, seed + 1))  # slot 0's cache
    single.cache_len.fill_(prefix)
    graph = single.capture(head=True)
    t = time_replays(graph.replay, iters)
    doc["block_forward"] = {**t, "logits_rel_diff_vs_batched": float(
        (single.logits.float() - ref_logits.float()).norm() / ref_logits.float().norm()) if ref_logits is not None
        else None}
    log(f"[BlockForward, batch 1] {t['ms']:.3f} ms (cuBLAS GEMMs; not row-invariant)")
    rounds = {r["slots"]: r for r in doc["rounds"]}
    if 1 in rounds:
        doc["batch1_cost"] = rounds[1]["ms"] / t["ms"]
        for r in doc["rounds"]:
            r["speedup_vs_S1"] = rounds[1]["ms"] * r["slots"] / r["ms"]
    return doc


def _single_ids(shape, seed):
    from .bench import _block_ids

    return _block_ids(shape, seed)


def _table(doc) -> str:
    lines = ["| S | round ms | floor ms | ratio | block tok/s | speed-up vs S=1 | slot 0 = S=1 |",
             "|---|---|---|---|---|---|---|"]
    for r in doc["rounds"]:
        lines.append(f"| {r['slots']} | {r['ms']:.3f} | {r['floor_ms']:.3f} | {r['ratio']:.2f} | "
                     f"{r['block_tokens_per_s']:.0f} | {r.get('speedup_vs_S1', float('nan')):.1f} | {r['invariant']} |")
    bf = doc.get("block_forward")
    if bf:
        lines.append(f"BlockForward (batch 1, cuBLAS): {bf['ms']:.3f} ms; batched S=1 / BlockForward = "
                     f"{doc.get('batch1_cost', float('nan')):.3f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m repro.engine.bench_graph_round", description=__doc__.split("\n")[0])
    ap.add_argument("--slots", default="1,8,32", help="slot counts S, comma-separated")
    ap.add_argument("--prefix", type=int, default=1024, help="prefix length of every slot (tokens)")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--layers", type=int, default=None, help="keep only this many layers (quick runs)")
    ap.add_argument("--precision", default="bf16", choices=["bf16", "nvfp4-w4a16"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="also write the JSON document to this file")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print(json.dumps({"error": "CUDA not available"}))
        return 2
    try:
        slots = [int(s) for s in args.slots.split(",") if s]
    except ValueError:
        ap.error(f"--slots {args.slots!r}: want comma-separated integers, e.g. 1,8,32")
    doc = bench_slots(slots, args.prefix, args.iters, args.layers, args.precision, args.seed,
                      log=lambda m: print(m, file=sys.stderr, flush=True))
    print(_table(doc), file=sys.stderr)
    text = json.dumps(doc)
    if args.json:
        with open(args.json, "w") as fh:
            fh.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
