"""`python -m repro.engine.bench graph-round`: the batched CUDA-graph round (kernels/fastpath_batch.py) on one GPU.

    python -m repro.engine.bench graph-round [--slots 1,8,32] [--prefix 1024] [--iters 30] [--layers N]
        [--precision bf16|nvfp4-w4a16] [--breakdown] [--sweep FILE] [--json FILE]

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

``--breakdown``: per S, the device time of one eager forward split by kernel family (:func:`kernel_breakdown`:
torch.profiler, kernels classified by name and launch order; the graph replays the same kernels). ``--sweep FILE``:
a JSON object ``{name: configs}`` of candidate tile sets (``configs`` as :class:`BatchedBlockForward` takes them,
e.g. ``{"moe": {"gate_up": {...}, "down": {...}}, "dense": {...}, "linear": {"qkv": ..., "o": ..., "lm_head":
...}}``; ``{}`` = the defaults; with ``--precision nvfp4-w4a16`` the ``moe`` tiles are the 4-bit kernels'): every
set is timed at every S over the same weights (of ``--precision``), with its breakdown and its
own slot-0 check (slot 0 at every S bit-identical to the set's first S), and tables compare the sets (rounds;
per S, the kernel families side by side: :func:`family_table`).

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
    from .common import block_ids

    for s in range(S):
        fw.ids[s].copy_(block_ids(shape, seed + 1000 * s))
        fw.kv[:, :, s].copy_(_random_cache(fw.kv[:, :, s], seed + 1000 * s + 1))
    fw.cache_len.fill_(prefix)


def _random_cache(like, seed):
    """A contiguous N(0, 1) tensor of ``like``'s shape and dtype from ``seed`` (the same values whatever the
    strides of the slot view it goes to)."""
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    return torch.empty(like.shape, dtype=like.dtype, device="cuda").normal_(0.0, 1.0, generator=g)


def _model(layers, precision, seed):
    """(shape, W, expert_bytes) of LLaDA2.1-mini with deterministic random weights (module doc)."""
    from ..kernels import fastpath as F

    overrides = {} if layers is None else {"num_hidden_layers": layers}
    shape = F.preset_shape("llada2.1-mini", **overrides)
    W = F.random_weights(shape, "cuda", torch.bfloat16, seed=seed)
    expert_bytes = None
    if precision == "nvfp4-w4a16":
        from .w4 import w4_weights

        W = w4_weights(W, shape, seed)  # routed experts as random NVFP4 experts (the shared ones stay BF16)
        expert_bytes = 0.5 + 1 / 16
    return shape, W, expert_bytes


#: kernel families of :func:`kernel_breakdown`, in table order
FAMILIES = ("attention", "qkv", "o", "router/route", "gate_up", "down", "moe_sum", "dense_gate_up", "dense_down",
            "lm_head", "norms", "logits_stats", "embed/other")


def _family(name: str) -> str:
    """Kernel family of one CUDA kernel name (rows_linear and the expert GEMMs are split by launch order later)."""
    for key, fam in (("_rows_linear_kernel", "rows_linear"), ("_moe_gate_up_kernel", "gate_up"),
                     ("_moe_down_kernel", "down"), ("_moe_sum_kernel", "moe_sum"), ("_router_logits", "router/route"),
                     ("_route_select", "router/route"), ("_align_kernel", "router/route"),
                     ("_tile_table", "router/route"), ("_qk_norm_rope", "attention"), ("_attn_", "attention"),
                     ("_slot_chunk", "attention"), ("_slot_fold", "attention"), ("_slot_whole", "attention"),
                     ("_add_rmsnorm", "norms"), ("_logits_", "logits_stats")):
        if key in name:
            return fam
    return "embed/other"


def classify_kernels(names: list[str], first_dense: int, head: bool = True) -> list[str]:
    """Family (:data:`FAMILIES`) of each kernel of one forward, ``names`` in launch order: by name
    (:func:`_family`), then ``_rows_linear_kernel`` by order (per layer QKV then O; with ``head`` the last one is
    lm_head) and the expert GEMMs of the first ``first_dense`` layers as the dense FFN."""
    fams = [_family(n) for n in names]
    lin = [i for i, f in enumerate(fams) if f == "rows_linear"]
    for j, i in enumerate(lin):
        fams[i] = "lm_head" if head and i == lin[-1] else ("qkv" if j % 2 == 0 else "o")
    for kern in ("gate_up", "down"):
        idx = [i for i, f in enumerate(fams) if f == kern]
        for i in idx[:first_dense]:
            fams[i] = "dense_" + kern
    return fams


def kernel_breakdown(fw, head=True) -> dict:
    """Device time (ms) of one eager ``fw.forward(head)`` split by kernel family (:data:`FAMILIES`), from a
    torch.profiler trace of CUDA kernels (a warm forward first). ``_rows_linear_kernel`` launches are assigned by
    order: per layer the 1st is QKV and the 2nd the O projection, the last of the forward lm_head; the expert
    GEMMs of the first ``first_dense`` layers are the dense FFN (``dense_*``), the others the routed experts with
    the shared expert (one launch). Returns ``{family: ms, "total": ms, "kernels": n, "by_kernel": {name: ms}}`` (the
    last: the attention, norm and router/route kernels by name); raises RuntimeError when the profiler recorded no
    kernel."""
    from .profiling import cuda_kernels

    try:
        ks = cuda_kernels(lambda: fw.forward(head=head))
    except RuntimeError as exc:
        raise RuntimeError("kernel_breakdown: the profiler recorded no CUDA kernel") from exc
    fams = classify_kernels([e["name"] for e in ks], fw.s.first_dense, head)
    out = {f: 0.0 for f in FAMILIES}
    by_kernel: dict = {}
    for e, f in zip(ks, fams):
        out[f] += e["dur"] / 1e3
        if f in ("attention", "norms", "router/route"):
            name = e["name"].split("(")[0]
            by_kernel[name] = by_kernel.get(name, 0.0) + e["dur"] / 1e3
    out["total"] = sum(out[f] for f in FAMILIES)
    out["kernels"] = len(ks)
    out["by_kernel"] = by_kernel
    return out


def _breakdown_table(rows) -> str:
    """Markdown table: one column per (label, breakdown dict), one row per family (ms), then one per attention / norm
    kernel (``by_kernel``)."""
    lines = ["| family | " + " | ".join(lbl for lbl, _ in rows) + " |", "|---|" + "---|" * len(rows)]
    for f in FAMILIES + ("total",):
        lines.append(f"| {f} | " + " | ".join(f"{b.get(f, float('nan')):.3f}" for _, b in rows) + " |")
    names = dict.fromkeys(n for _, b in rows for n in b.get("by_kernel", {}))
    for n in names:  # the attention and norm kernels one by one
        lines.append(f"| · {n} | " + " | ".join(f"{b.get('by_kernel', {}).get(n, 0.0):.3f}" for _, b in rows) + " |")
    return "\n".join(lines)


def bench_slots(slots, prefix=1024, iters=30, layers=None, precision="bf16", seed=0, log=print, configs=None,
                model=None, breakdown=False, single=True, copy_bw=None, keep=None) -> dict:
    """Time the batched round at each S of ``slots`` (tile set ``configs``, None = the defaults) and, with
    ``single``, the BlockForward round; returns the JSON document. ``model``: a ``_model(...)`` tuple to reuse.
    ``keep``: a dict that receives ``"logits0"``, slot 0's logits at the first S ([T, vocab], model dtype, on the
    GPU), for comparing tile sets bit for bit (:func:`sweep`)."""
    from .common import copy_bandwidth, env_info, time_replays
    from ..kernels import fastpath as F
    from ..kernels.fastpath_batch import BatchedBlockForward, batched_round_bytes

    shape, W, expert_bytes = model or _model(layers, precision, seed)
    copy_bw = copy_bw or copy_bandwidth()
    log(f"copy bandwidth {copy_bw:.0f} GB/s; {shape.layers} layers, prefix {prefix}, precision {precision}")
    doc = {"bench": "repro.engine.bench graph-round", **env_info(), "prefix": prefix, "layers": shape.layers,
           "precision": precision, "copy_GBps": copy_bw, "rounds": []}
    max_len = prefix + 32 + 32
    ref_logits = None
    for S in slots:
        fw = BatchedBlockForward(W, shape, max_len, slots=S, T=32, device="cuda", configs=configs)
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
            if keep is not None:
                keep["logits0"] = lg0
        r = {"slots": S, **t, "capture_s": capture_s, "floor_ms": floor_ms, "ratio": t["ms"] / floor_ms, "bytes_GB": nb["total"] / 1e9,
             "bytes_by_item_MB": {k: round(v / 1e6, 2) for k, v in nb.items()},
             "distinct_experts_mean": sum(distinct) / max(len(distinct), 1), "tokens_per_round": 32 * S,
             "block_tokens_per_s": 32 * S / (t["ms"] * 1e-3), "invariant": bool(torch.equal(lg0, ref_logits))}
        if breakdown:
            fw.kv.copy_(kv0)
            r["breakdown_ms"] = kernel_breakdown(fw)
        doc["rounds"].append(r)
        log(f"[S={S:>2}] {t['ms']:.3f} ms (min {t['ms_min']:.3f}), floor {floor_ms:.3f} ms, ratio {r['ratio']:.2f}, "
            f"D={r['distinct_experts_mean']:.1f}, {r['bytes_GB']:.2f} GB, {r['block_tokens_per_s']:.0f} block tok/s, "
            f"slot 0 = S=1: {r['invariant']}, capture {capture_s:.1f} s")
        del fw, graph, kv0
        torch.cuda.empty_cache()
    if breakdown:
        log(_breakdown_table([(f"S={r['slots']} ms", r["breakdown_ms"]) for r in doc["rounds"]]))
    if not single:
        return doc
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
    return doc


def _speedups(doc):
    rounds = {r["slots"]: r for r in doc["rounds"]}
    if 1 in rounds:
        for r in doc["rounds"]:
            r["speedup_vs_S1"] = rounds[1]["ms"] * r["slots"] / r["ms"]


def sweep(sets: dict, slots, prefix=1024, iters=30, layers=None, seed=0, log=print, json_path=None,
          precision="bf16") -> dict:
    """Every tile set of ``sets`` ({name: configs}) timed at every S over one set of weights (``precision``:
    "bf16", or "nvfp4-w4a16" with packed routed experts, whose tiles a set gives under ``moe``), with its
    breakdown (module doc); returns ``{"sets": {name: bench_slots doc}, "table": markdown}``."""
    from .common import copy_bandwidth, env_info

    model = _model(layers, precision, seed)
    bw = copy_bandwidth()
    out = {"bench": "repro.engine.bench graph-round --sweep", **env_info(), "prefix": prefix, "precision": precision,
           "copy_GBps": bw, "sets": {}}
    first = None  # slot-0 logits (first S) of the first set that ran
    for name, cfg in sets.items():
        log(f"--- tile set {name}: {json.dumps(cfg)}")
        try:
            keep = {}
            d = bench_slots(slots, prefix, iters, layers, precision, seed, log, configs=cfg or None, model=model,
                            breakdown=True, single=False, copy_bw=bw, keep=keep)
            _speedups(d)
            if "logits0" not in keep:  # no round ran to the read-back: nothing to compare
                raise RuntimeError(f"tile set {name}: no slot-0 logits were read back")
            if first is None:
                first, out["reference_set"] = keep["logits0"], name
            d["reference_set"] = out["reference_set"]
            d["same_bits_as_first"] = bool(torch.equal(keep["logits0"], first))
            if not d["same_bits_as_first"]:
                diff = (keep["logits0"].float() - first.float()).abs()
                d["differs_from_first"] = {"logits_differing": int((diff > 0).sum()), "max_abs": float(diff.max()),
                                           "argmax_differing": int((keep["logits0"].argmax(-1)
                                                                    != first.argmax(-1)).sum())}
            log(f"    {name}: slot 0 logits at S={slots[0]} bit-identical to set {out['reference_set']}'s: "
                f"{d['same_bits_as_first']}"
                + (f" ({d['differs_from_first']})" if not d["same_bits_as_first"] else ""))
            out["sets"][name] = d
        except Exception as exc:  # noqa: BLE001 - one bad candidate (e.g. out of shared memory) must not end the sweep
            log(f"tile set {name} failed: {exc!r}")
            out["sets"][name] = {"error": repr(exc)}
        if json_path:  # after every set, so a run cut short keeps what it measured
            with open(json_path, "w") as fh:
                fh.write(json.dumps(out) + "\n")
    hdr = "| set | " + " | ".join(f"S={S} ms" for S in slots) + " | slot 0 = first S | slot 0 = first set |"
    lines = [hdr, "|---|" + "---|" * (len(slots) + 2)]
    for name, d in out["sets"].items():
        if "error" in d:
            lines.append(f"| {name} | " + " | ".join("-" for _ in slots) + f" | {d['error'][:60]} | - |")
            continue
        lines.append(f"| {name} | " + " | ".join(f"{r['ms']:.3f}" for r in d["rounds"]) + " | "
                     + str(all(r["invariant"] for r in d["rounds"])) + f" | {d['same_bits_as_first']} |")
    out["table"] = "\n".join(lines)
    out["family_tables"] = {S: family_table(out, S) for S in slots}
    return out


def family_table(doc, S) -> str:
    """Markdown table of a sweep document at slot count ``S``: one row per kernel family (ms, from each set's
    breakdown), one column per tile set (sets that failed are left out), the round (graph replay) last."""
    sets = [(n, r) for n, d in doc["sets"].items() if "error" not in d for r in d["rounds"]
            if r["slots"] == S and "breakdown_ms" in r]
    lines = [f"| S={S} | " + " | ".join(n for n, _ in sets) + " |", "|---|" + "---|" * len(sets)]
    for f in FAMILIES:
        lines.append(f"| {f} | " + " | ".join(f"{r['breakdown_ms'].get(f, 0.0):.3f}" for _, r in sets) + " |")
    lines.append("| round (replay) | " + " | ".join(f"{r['ms']:.3f}" for _, r in sets) + " |")
    return "\n".join(lines)


def _single_ids(shape, seed):
    from .common import block_ids

    return block_ids(shape, seed)


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
    ap = argparse.ArgumentParser(prog="python -m repro.engine.bench graph-round", description=__doc__.split("\n")[0])
    ap.add_argument("--slots", default="1,8,32", help="slot counts S, comma-separated")
    ap.add_argument("--prefix", type=int, default=1024, help="prefix length of every slot (tokens)")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--layers", type=int, default=None, help="keep only this many layers (quick runs)")
    ap.add_argument("--precision", default="bf16", choices=["bf16", "nvfp4-w4a16"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--breakdown", action="store_true", help="per S, device time by kernel family (torch.profiler)")
    ap.add_argument("--sweep", default=None, help="JSON file {name: configs} of candidate tile sets to compare")
    from .cli import gpu_args, log, read_json_object

    args, slots = gpu_args(ap, argv, "--slots")
    if args.sweep:
        sets = read_json_object(ap, "--sweep", args.sweep, "{name: configs}")
        doc = sweep(sets, slots, args.prefix, args.iters, args.layers, args.seed, log, json_path=args.json,
                    precision=args.precision)
        for S in slots:
            print(doc["family_tables"][S], file=sys.stderr)
        print(doc["table"], file=sys.stderr)
    else:
        doc = bench_slots(slots, args.prefix, args.iters, args.layers, args.precision, args.seed, log,
                          breakdown=args.breakdown)
        _speedups(doc)
        print(_table(doc), file=sys.stderr)
    from .cli import emit_json

    return emit_json(doc, args.json)


if __name__ == "__main__":
    sys.exit(main())
