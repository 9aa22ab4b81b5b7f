"""`python -m repro.engine.bench slot-attention`: the batched round's attention and norms alone, per variant and S.

    python -m repro.engine.bench slot-attention [--slots 1,8,32] [--prefix 1024] [--layers 20] [--iters 50]
        [--json FILE]

LLaDA2.1-mini's shapes (NQ 16, NKV 4, D 128, T = 32 rows per slot, H 2048, top-k 8 + the shared expert), bf16,
random inputs, ``--layers`` separate KV caches per S (a replay streams them from HBM, as a round does). Each
variant is one CUDA graph of ``--layers`` calls, replayed ``--iters`` times (median); figures are µs per layer
(per call), with the bytes each call must move and their time at the device's copy bandwidth (the floor):

* ``qknorm_single``: :func:`.kernels.attention.qk_norm_rope_kv` (one program per (row, head));
  ``qknorm_rowsN``: :func:`.kernels.attention_slots.slot_qk_norm_rope_kv` with N rows per program;
* ``attn_single``: :func:`.kernels.attention.block_attention` (split + combine; the batched path before session 5);
  ``attn_split`` / ``attn_whole``: :func:`.kernels.attention_slots.slot_attention`'s two launches (``_m128w8``:
  BLOCK_M 128 with 8 warps; ``_mk256``: MIN_KEYS 256, i.e. fewer, longer chunks);
* ``norm_wN[_rR]``: :func:`.kernels.norm.add_rmsnorm` with the MoE top-k sum (fp32 pair outputs) at S·T rows, N warps
  (``_rR``: R rows per program, each prefetching the next).

Checks (``checks``): ``attn_split`` and ``attn_whole`` give the same bits at every S, and slot 0's output at every S
equals that at the first S (each mode). The KV caches, inputs and tiles (the device's tuned "attn" config) are the
same in every variant. Prints one line per measurement on stderr, a table, and as the last stdout line one JSON
document (also written to ``--json``).
"""
from __future__ import annotations

import argparse
import sys

import torch

NQ, NKV, D, T, H, TOPK, ROT = 16, 4, 128, 32, 2048, 8, 64


def _graph(fn):
    """A CUDA graph of ``fn()`` (run once eagerly first: compilation and a warm-up)."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def _randn(shape, seed):
    """N(0, 1) bf16 on the GPU from ``seed``."""
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    return torch.randn(shape, device="cuda", generator=g).bfloat16()


def bench(slots, prefix=1024, layers=20, iters=50, log=print) -> dict:
    """Time every variant (module doc) at each S of ``slots``; returns the JSON document."""
    from .common import copy_bandwidth, env_info, time_replays
    from ..kernels import attention as A
    from ..kernels import attention_slots as AS
    from ..kernels import norm as Nm
    from ..kernels.configs import load_config

    bw = copy_bandwidth()
    ac = load_config("attn", "split", dict(NSPLIT=32, BLOCK_N=64, num_warps=4, num_stages=3, MIN_KEYS=256),
                     NQ=NQ, NKV=NKV, D=D, T=T)
    doc = {"bench": "repro.engine.bench slot-attention", **env_info(), "prefix": prefix, "layers": layers,
           "copy_GBps": bw, "attn_config": ac, "rows": [], "checks": {}}
    log(f"copy bandwidth {bw:.0f} GB/s; attn config {ac}")
    g = torch.Generator(device="cuda")
    g.manual_seed(0)
    ML = prefix + 2 * T
    cos, sin = A.rope_tables(ML, ROT, 600000.0, "cuda")
    qw = (torch.rand(D, device="cuda", generator=g) + 0.5).bfloat16()
    kw = (torch.rand(D, device="cuda", generator=g) + 0.5).bfloat16()
    first = {}
    for S in slots:
        R = S * T
        # slot s's caches and queries from seeds of (layer, s): slot 0 holds the same data at every S
        kv = [torch.stack([_randn((2, NKV, ML, D), 1000 * i + s) for s in range(S)], 1) for i in range(layers)]
        q = torch.cat([_randn((T, NQ, D), 10 ** 6 + s) for s in range(S)])
        qkv = torch.randn(R, (NQ + 2 * NKV) * D, device="cuda", generator=g).bfloat16()
        cl = torch.full((S,), prefix, dtype=torch.int32, device="cuda")
        o = torch.empty(R, NQ * D, dtype=torch.bfloat16, device="cuda")
        ws = A.AttnWorkspace(T, NQ, NKV, D, "cuda", nsplit=ac["NSPLIT"], block_n=ac["BLOCK_N"],
                             num_warps=ac["num_warps"], num_stages=ac["num_stages"], min_keys=ac["MIN_KEYS"],
                             block_m=ac.get("BLOCK_M"), slots=S)
        h = torch.randn(R, H, device="cuda", generator=g).bfloat16()
        pairs = torch.randn(R * TOPK + R, H, device="cuda", generator=g)
        nw = (torch.rand(H, device="cuda", generator=g) + 0.5).bfloat16()
        normed = torch.empty_like(h)
        kv_b = S * (prefix + T) * NKV * D * 2 * 2
        qkn_b = R * (NQ + 2 * NKV) * D * 2 * 2
        att_b = kv_b + 2 * R * NQ * D * 2
        norm_b = pairs.numel() * 4 + 3 * h.numel() * 2
        variants = {
            "qknorm_single": (lambda i: A.qk_norm_rope_kv(qkv, qw, kw, cos, sin, cl, q, kv[i][0], kv[i][1], NQ, NKV,
                                                          rot=ROT), qkn_b),
            "attn_single": (lambda i: A.block_attention(q, kv[i][0], kv[i][1], cl, o, ws), att_b),
            "attn_split": (lambda i: AS.slot_attention(q, kv[i][0], kv[i][1], cl, o, ws, mode="split"), att_b),
            "attn_whole": (lambda i: AS.slot_attention(q, kv[i][0], kv[i][1], cl, o, ws, mode="whole"), att_b),
        }
        for tag, kw_ in (("m128w8", dict(block_m=128, num_warps=8)), ("mk256", dict(min_keys=256))):
            wsx = A.AttnWorkspace(T, NQ, NKV, D, "cuda", **{**dict(
                nsplit=ac["NSPLIT"], block_n=ac["BLOCK_N"], num_warps=ac["num_warps"], num_stages=ac["num_stages"],
                min_keys=ac["MIN_KEYS"], block_m=ac.get("BLOCK_M"), slots=S), **kw_})
            for mode in ("split", "whole"):  # other tiles / chunk lengths, for the record (other bits than the default)
                variants[f"attn_{mode}_{tag}"] = (
                    lambda i, wsx=wsx, mode=mode: AS.slot_attention(q, kv[i][0], kv[i][1], cl, o, wsx, mode=mode), att_b)
        for rows in (8, 16, 32):
            variants[f"qknorm_rows{rows}"] = (
                lambda i, rows=rows: AS.slot_qk_norm_rope_kv(qkv, qw, kw, cos, sin, cl, q, kv[i][0], kv[i][1], NQ,
                                                             NKV, rot=ROT, rows=rows), qkn_b)
        for w, r in ((4, 0), (8, 0), (16, 0), (8, 2), (8, 4), (8, 8), (16, 4)):
            variants[f"norm_w{w}" + (f"_r{r}" if r else "")] = (
                lambda i, w=w, r=r: Nm.add_rmsnorm(h, nw, normed, pairs=pairs, top_k=TOPK, shared=True, num_warps=w,
                                                   rows=r), norm_b)
        outs = {}
        for mode in ("split", "whole"):  # checks first, on the untouched caches
            AS.slot_attention(q, kv[0][0], kv[0][1], cl, o, ws, mode=mode)
            outs[mode] = o.clone()
        torch.cuda.synchronize()
        doc["checks"][f"S={S} split==whole"] = bool(torch.equal(outs["split"], outs["whole"]))
        for mode, x in outs.items():
            first.setdefault(mode, x[:T].clone())
            doc["checks"][f"S={S} {mode} slot0==first S"] = bool(torch.equal(x[:T], first[mode]))
        for name, (fn, nbytes) in variants.items():
            try:
                gr = _graph(lambda fn=fn: [fn(i) for i in range(layers)])
                t = time_replays(gr.replay, iters)
            except Exception as exc:  # noqa: BLE001 - one failing variant must not end the run
                log(f"[S={S}] {name}: failed {exc!r}")
                doc["rows"].append({"slots": S, "variant": name, "error": repr(exc)})
                continue
            us = t["ms"] * 1e3 / layers
            floor = nbytes / (bw * 1e9) * 1e6
            doc["rows"].append({"slots": S, "variant": name, "us_per_layer": us, "floor_us": floor,
                                "ratio": us / floor, "ms_per_round": t["ms"], "bytes_MB": nbytes / 1e6})
            log(f"[S={S:>2}] {name:14s} {us:8.2f} µs/layer  floor {floor:6.2f} µs  ratio {us / floor:5.2f}")
            del gr
        del kv, ws, pairs
        torch.cuda.empty_cache()
    return doc


def _table(doc) -> str:
    slots = sorted({r["slots"] for r in doc["rows"]})
    names = list(dict.fromkeys(r["variant"] for r in doc["rows"]))
    cell = {(r["slots"], r["variant"]): r for r in doc["rows"]}
    lines = ["| variant | " + " | ".join(f"S={S} µs/layer (floor)" for S in slots) + " |",
             "|---|" + "---|" * len(slots)]
    for n in names:
        cs = [cell.get((S, n)) for S in slots]
        lines.append(f"| {n} | " + " | ".join("-" if c is None or "error" in c else
                                                f"{c['us_per_layer']:.1f} ({c['floor_us']:.1f})" for c in cs) + " |")
    lines.append("checks: " + ", ".join(f"{k}: {v}" for k, v in doc["checks"].items()))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m repro.engine.bench slot-attention", description=__doc__.split("\n")[0])
    ap.add_argument("--slots", default="1,8,32", help="slot counts S, comma-separated")
    ap.add_argument("--prefix", type=int, default=1024, help="prefix length of every slot (tokens)")
    ap.add_argument("--layers", type=int, default=20, help="separate KV caches (calls per graph)")
    ap.add_argument("--iters", type=int, default=50)
    from .cli import emit_json, gpu_args, log

    args, slots = gpu_args(ap, argv, "--slots")
    doc = bench(slots, args.prefix, args.layers, args.iters, log=log)
    print(_table(doc), file=sys.stderr)
    return emit_json(doc, args.json)


if __name__ == "__main__":
    sys.exit(main())
