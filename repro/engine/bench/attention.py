"""`python -m repro.engine.bench attention`: one block's QK-norm/RoPE/KV write + attention alone, today's three
launches against the fused launch (:mod:`repro.engine.kernels.attention_fused`) per tile set.

    python -m repro.engine.bench attention [--prefixes 0,1024,4096] [--layers 20] [--iters 50] [--sets FILE]
        [--json FILE]

LLaDA2.1-mini's attention shapes (NQ 16, NKV 4, D 128, RoPE on 64 channels, T = 32 block tokens), bf16, random
qkv rows and caches; ``--layers`` separate KV caches (a replay streams them from HBM, as a round does). Each variant
is one CUDA graph of ``--layers`` calls, replayed ``--iters`` times (median): µs per layer (per call), beside the
bytes a call must move (K/V of [0, P + T), the qkv rows, o) at the device's copy bandwidth (the floor).

Variants: ``unfused`` = ``attention.qk_norm_rope_kv`` + ``attention.block_attention`` (split + combine) with the
device's tuned ``attn``/``split`` tiles (``BlockForward``'s default path); every other name is the fused launch
with the tile set of :data:`FUSED_SETS` (``--sets FILE``: JSON ``{name: {NSPLIT, BLOCK_N, BLOCK_M, MIN_KEYS,
num_warps, num_stages, COMBINE}}``, keys missing taken from ``attention_fused.FUSED_DEFAULT``).

Checks per variant and prefix (layer 0, eager): the output against the unfused path's (``rel_err``, bf16 rounding
apart), the K rows written (``k_rel_err``) and the V rows (``v_equal``, bit for bit), the same bits on a second
call (``repeat_equal``) and the ticket counters back at 0. Prints one line per measurement on stderr, a table, and
as the last stdout line one JSON document (also written to ``--json``).
"""
from __future__ import annotations

import argparse
import sys

import torch

NQ, NKV, D, T, ROT = 16, 4, 128, 32, 64

#: tile sets timed by default: the default (16-row blocks, 128-key chunks), 64-key chunks, the first key tile
#: prefetched, row blocks of 32 / 64 rows, and the two-launch combine
FUSED_SETS = {
    "fused_default": {},
    "fused_mk64": {"MIN_KEYS": 64},
    "fused_prefetch": {"PREFETCH": 1},
    "fused_mk64_prefetch": {"MIN_KEYS": 64, "PREFETCH": 1},
    "fused_m32": {"BLOCK_M": 32},
    "fused_m32_mk64": {"BLOCK_M": 32, "MIN_KEYS": 64},
    "fused_m64_mk64": {"BLOCK_M": 64, "MIN_KEYS": 64},
    "fused_kernel_combine": {"COMBINE": "kernel"},
}


def _rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def bench(sets: dict, prefixes, layers=20, iters=50, log=print, json_path=None) -> dict:
    """Time ``unfused`` and every set of ``sets`` at every prefix (module doc); returns the JSON document (also
    written to ``json_path`` after every measurement, so a run cut short keeps what it measured)."""
    import json
    from .common import copy_bandwidth, env_info, time_replays
    from ..kernels import attention as A
    from ..kernels import attention_fused as AF
    from ..kernels.configs import load_config

    bw = copy_bandwidth()
    ac = load_config("attn", "split", dict(NSPLIT=32, BLOCK_N=64, num_warps=4, num_stages=3, MIN_KEYS=256),
                     NQ=NQ, NKV=NKV, D=D, T=T)
    doc = {"bench": "repro.engine.bench attention", **env_info(), "layers": layers, "iters": iters, "copy_GBps": bw,
           "split_config": ac, "sets": {n: {**AF.FUSED_DEFAULT, **c} for n, c in sets.items()}, "rows": []}
    log(f"copy bandwidth {bw:.0f} GB/s; unfused tiles {ac}")
    g = torch.Generator(device="cuda")
    g.manual_seed(0)
    ML = max(prefixes) + 2 * T
    cos, sin = A.rope_tables(ML, ROT, 600000.0, "cuda")
    qw = (torch.rand(D, device="cuda", generator=g) + 0.5).bfloat16()
    kw = (torch.rand(D, device="cuda", generator=g) + 0.5).bfloat16()
    qkv = torch.randn(T, (NQ + 2 * NKV) * D, device="cuda", generator=g).bfloat16()
    kv = [torch.randn(2, NKV, ML, D, device="cuda", generator=g).bfloat16() for _ in range(layers)]
    cl = torch.zeros(1, dtype=torch.int32, device="cuda")
    q = torch.empty(T, NQ, D, dtype=torch.bfloat16, device="cuda")
    o = torch.empty(T, NQ * D, dtype=torch.bfloat16, device="cuda")
    ws_u = A.AttnWorkspace(T, NQ, NKV, D, "cuda", nsplit=ac["NSPLIT"], block_n=ac["BLOCK_N"], num_warps=ac["num_warps"],
                           num_stages=ac["num_stages"], min_keys=ac["MIN_KEYS"], block_m=ac.get("BLOCK_M"))

    def unfused(i):
        A.qk_norm_rope_kv(qkv, qw, kw, cos, sin, cl, q, kv[i][0], kv[i][1], NQ, NKV, rot=ROT)
        A.block_attention(q, kv[i][0], kv[i][1], cl, o, ws_u)

    variants = {"unfused": (unfused, None)}
    for name, cfg in sets.items():
        ws = AF.fused_workspace(T, NQ, NKV, D, "cuda", cfg)
        variants[name] = ((lambda i, ws=ws: AF.block_attention_fused(qkv, qw, kw, cos, sin, cl, kv[i][0], kv[i][1], o,
                                                                      ws, NQ, NKV, rot=ROT)), ws)
    for P in prefixes:
        cl.fill_(P)
        nbytes = (P + T) * NKV * D * 2 * 2 + qkv.numel() * 2 + o.numel() * 2
        floor = nbytes / (bw * 1e9) * 1e6
        unfused(0)
        ref_o, ref_k, ref_v = o.clone(), kv[0][0, :, P:P + T].clone(), kv[0][1, :, P:P + T].clone()
        for name, (fn, ws) in variants.items():
            row = {"variant": name, "prefix": P, "floor_us": floor}
            try:
                kv[0][:, :, P:P + T] = float("nan")
                o.fill_(float("nan"))
                fn(0)
                first = o.clone()
                o.fill_(float("nan"))
                fn(0)
                torch.cuda.synchronize()
                row.update(rel_err=_rel(first, ref_o), k_rel_err=_rel(kv[0][0, :, P:P + T], ref_k),
                           v_equal=bool(torch.equal(kv[0][1, :, P:P + T], ref_v)),
                           repeat_equal=bool(torch.equal(o, first)),
                           tickets_zero=None if ws is None else not bool(ws.tickets.any()))
                fn(0)
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    for i in range(layers):
                        fn(i)
                t = time_replays(graph.replay, iters)
                row.update(us_per_layer=t["ms"] * 1e3 / layers, us_per_layer_min=t["ms_min"] * 1e3 / layers)
                del graph
            except Exception as exc:  # noqa: BLE001 - one failing set must not end the run
                row["error"] = repr(exc)[:300]
            doc["rows"].append(row)
            if json_path:
                with open(json_path, "w") as fh:
                    fh.write(json.dumps(doc) + "\n")
            log(f"[P={P:>5}] {name:26s} " + (row["error"] if "error" in row else
                f"{row['us_per_layer']:7.2f} µs/layer (floor {floor:.2f}), rel err {row['rel_err']:.1e}, "
                f"k {row['k_rel_err']:.1e}, v equal {row['v_equal']}, repeat equal {row['repeat_equal']}, "
                f"tickets zero {row['tickets_zero']}"))
    return doc


def table(doc) -> str:
    prefixes = sorted({r["prefix"] for r in doc["rows"]})
    cell = {(r["variant"], r["prefix"]): r for r in doc["rows"]}
    lines = ["| variant | " + " | ".join(f"P={P} µs/layer" for P in prefixes) + " | checks |",
             "|---|" + "---|" * (len(prefixes) + 1)]
    for name in dict.fromkeys(r["variant"] for r in doc["rows"]):
        rs = [cell.get((name, P)) for P in prefixes]
        ok = [r for r in rs if r and "error" not in r]
        checks = all(r["v_equal"] and r["repeat_equal"] and r["tickets_zero"] is not False and r["rel_err"] < 2e-2
                     for r in ok) if ok else None
        lines.append(f"| {name} | " + " | ".join("-" if r is None else "err" if "error" in r else
                                                 f"{r['us_per_layer']:.2f}" for r in rs) + f" | {checks} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m repro.engine.bench attention", description=__doc__.split("\n")[0])
    ap.add_argument("--prefixes", default="0,1024,4096", help="prefix lengths P (tokens), comma-separated")
    ap.add_argument("--layers", type=int, default=20, help="separate KV caches (calls per graph)")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--sets", default=None, help="JSON file {name: fused tiles} (module doc); default FUSED_SETS")
    from .cli import emit_json, gpu_args, log, read_json_object

    args, prefixes = gpu_args(ap, argv, "--prefixes", "0,1024,4096")
    sets = read_json_object(ap, "--sets", args.sets, "{name: tiles}") if args.sets else FUSED_SETS
    doc = bench(sets, prefixes, args.layers, args.iters, log=log, json_path=args.json)
    doc["table"] = table(doc)
    print(doc["table"], file=sys.stderr)
    return emit_json(doc, args.json)


if __name__ == "__main__":
    sys.exit(main())
