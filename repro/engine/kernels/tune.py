"""The tuner of every tile family the engine reads, at the LLaDA2.1-mini decode shapes; writes configs/*.json.

``python -m repro.engine.kernels.tune [--quick] [--only FAMILIES] [--no-save] [--json FILE]`` on a CUDA machine
tunes this card (``torch.cuda.get_device_name()``) and saves its entries, with the card's record, in
``configs/<family>_<shape>.json`` (:func:`~repro.engine.kernels.configs.save_config`); other cards' entries are
kept. ``--quick`` (a new card, about 10 minutes on an H100) times a few likely candidates per kernel and the batched
round at 1, 8 and 32 slots; the full run every candidate and 1, 2, 4, 8, 16, 32 slots.

Families (``--only``, default all): ``moe`` (single-request router, route, gate_up, down; E=257 incl. the shared
expert, N=512, H=2048, T=32), ``w4`` (the same expert GEMMs over packed NVFP4 experts: entries ``w4_gate_up`` /
``w4_down`` of the moe file), ``dense`` (layer-0 FFN as one expert; N=5120), ``linear`` (the Triton QKV / O GEMM),
``attn`` (split attention: NSPLIT, BLOCK_N, warps, stages; the sum of the times at prefix 1024 and 4096),
``batched`` and ``batched-w4`` (the batched round's tiles by slot count, BF16 and 4-bit experts:
:mod:`repro.engine.bench.tune_batched`, which also checks row invariance with what it saved). Single kernels are
timed as a CUDA-graph replay of 10 launches, median of 5 replays, after warm-up; each row prints ms and GB/s
(bytes the launch must read / time). Speed targets are not checked here: this only ranks configs.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

from . import attention as A
from . import moe as M
from .configs import device_name, save_config


def graph_time_ms(fn, inner: int = 10, reps: int = 5) -> float:
    """Median ms of one ``fn()`` call: graph of ``inner`` calls, replayed ``reps`` times (after warm-up)."""
    fn()
    torch.cuda.synchronize()
    st = torch.cuda.Stream()
    st.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(st):
        fn()
    torch.cuda.current_stream().wait_stream(st)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(inner):
            fn()
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) / inner)
    del g
    return statistics.median(ts)


def _try(fn, label, rows):
    try:
        ms = graph_time_ms(fn)
    except Exception as exc:  # noqa: BLE001 - a config may not compile (shared memory), skip it
        rows.append((label, None, f"{type(exc).__name__}: {str(exc)[:80]}"))
        return None
    rows.append((label, ms, ""))
    return ms


GU_CANDS = [  # BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages
    (16, 64, 128, 4, 4), (16, 64, 128, 4, 3), (16, 64, 256, 4, 3), (16, 64, 256, 8, 3),
    (16, 32, 128, 4, 4), (16, 32, 256, 4, 3), (16, 32, 256, 4, 4), (16, 128, 128, 4, 3),
    (16, 128, 128, 8, 4), (16, 64, 64, 4, 5), (16, 32, 128, 4, 6), (16, 64, 128, 8, 4),
    (16, 16, 256, 4, 4), (16, 32, 512, 4, 2), (32, 64, 128, 4, 4), (32, 32, 256, 4, 3),
]
DN_CANDS = [
    (16, 64, 128, 4, 4), (16, 64, 256, 4, 3), (16, 64, 512, 4, 2), (16, 128, 128, 4, 4),
    (16, 128, 256, 8, 3), (16, 32, 256, 4, 3), (16, 32, 512, 4, 2), (16, 128, 512, 8, 2),
    (16, 64, 64, 4, 4), (16, 256, 128, 8, 3), (16, 32, 128, 4, 4), (16, 16, 512, 4, 2),
    (32, 64, 256, 4, 3), (16, 64, 64, 4, 6), (16, 64, 64, 2, 4), (16, 32, 64, 4, 4), (16, 128, 64, 4, 4),
    (16, 64, 128, 4, 5), (16, 64, 64, 8, 4),
]
DGU_CANDS = [(16, 32, 128, 4, 4), (16, 32, 256, 4, 3), (16, 16, 256, 4, 3), (16, 64, 128, 4, 4),
             (16, 16, 512, 4, 2), (32, 32, 256, 4, 3)]
DDN_CANDS = [(16, 16, 256, 4, 3), (16, 16, 512, 4, 2), (16, 32, 256, 4, 3), (16, 32, 512, 4, 2),
             (16, 16, 128, 4, 4), (16, 64, 256, 4, 3)]


def _as_cfg(c):
    return dict(BLOCK_M=c[0], BLOCK_N=c[1], BLOCK_K=c[2], num_warps=c[3], num_stages=c[4])


def _best_of(cands, label, make_fn, nbytes, rows):
    """Time every tile candidate (tuple, see ``_as_cfg``) as ``make_fn(cfg)()`` in a graph, note its GB/s for
    ``nbytes`` in ``rows``, and return ``(ms, cfg)`` of the fastest. ``label(c)`` names a row. Raises
    RuntimeError when no candidate compiled."""
    kb = None
    for c in cands:
        cfg = _as_cfg(c)
        ms = _try(make_fn(cfg), label(c), rows)
        if ms is not None:
            rows[-1] = (rows[-1][0], ms, f"{nbytes / ms / 1e6:.0f} GB/s")
            if kb is None or ms < kb[0]:
                kb = (ms, cfg)
    if kb is None:
        raise RuntimeError(f"no tile candidate ran for {label(cands[0])} (see the rows above)")
    return kb


def _router_inputs(T, H, E, seed):
    """(generator, x [T, H] bf16, router weight [E, H] fp32, expert bias [E] fp32) on CUDA, drawn from ``seed``."""
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    x = torch.randn(T, H, device="cuda", generator=g).to(torch.bfloat16)
    gate = torch.randn(E, H, device="cuda", generator=g) * 0.02
    bias = torch.randn(E, device="cuda", generator=g) * 0.01
    return g, x, gate, bias


def tune_moe(T=32, H=2048, N=512, E=256, top_k=8, quick=False, seed=0):
    dev = "cuda"
    g, x, gate, bias = _router_inputs(T, H, E, seed)
    w13 = (torch.randn(E + 1, 2 * N, H, device=dev, generator=g, dtype=torch.bfloat16) * 0.02)
    w2 = (torch.randn(E + 1, H, N, device=dev, generator=g, dtype=torch.bfloat16) * 0.02)
    rows, best = [], {}
    # router + route (tiny kernels; SPLIT_K changes both)
    rbest = None
    rc = [(16, 8, 64, "ieee"), (16, 8, 64, "tf32x3"), (16, 4, 128, "tf32x3"), (32, 8, 64, "tf32x3"),
          (16, 16, 64, "ieee"), (16, 16, 64, "tf32x3"), (8, 8, 64, "ieee"), (32, 4, 64, "ieee")]
    for be, sk, bk, prec in rc[:2] if quick else rc:
        for rw in (1, 2, 4):
            cfg = {"router": dict(BLOCK_E=be, SPLIT_K=sk, BLOCK_K=bk, num_warps=4, num_stages=2, PREC=prec),
                   "route": dict(num_warps=rw)}
            ws = M.MoEWorkspace(T, H, N, E, E + 1, top_k, x.dtype, dev, split_k=sk, n_slots=2)
            ms = _try(lambda: M.moe_route_align(x, gate, bias, ws, E + 1, top_k, configs=cfg, slot=0),
                      f"router+route BE={be} SK={sk} BK={bk} {prec} route_warps={rw}", rows)
            if ms is not None and (rbest is None or ms < rbest[0]):
                rbest = (ms, cfg)
    best.update(rbest[1])
    ws = M.MoEWorkspace.create(T, H, N, E, E + 1, top_k, x.dtype, dev, split_k=best["router"]["SPLIT_K"])
    M.moe_route_align(x, gate, bias, ws, E + 1, top_k, configs=best)
    torch.cuda.synchronize()
    D = int((ws.counts[:E] > 0).sum().item())
    gu_bytes = (D + 1) * 2 * N * H * 2
    dn_bytes = (D + 1) * H * N * 2
    for name, cands, nbytes, fn in (
        ("gate_up", GU_CANDS, gu_bytes, lambda c: (lambda: M.moe_gate_up(x, w13, ws, top_k, {"gate_up": c}))),
        ("down", DN_CANDS, dn_bytes, lambda c: (lambda: M.moe_down(w2, ws, {"down": c}))),
    ):
        M.moe_gate_up(x, w13, ws, top_k, {"gate_up": _as_cfg(GU_CANDS[0])})  # valid inter for down
        kb = _best_of(cands[:3] if quick else cands, lambda c: f"{name} {c} ({nbytes / 1e6:.0f} MB)", fn, nbytes,
                      rows)
        best[name] = kb[1]
        best.setdefault("_ms", {})[name] = kb[0]
    best["_distinct"] = D
    return best, rows


W4_CANDS = [  # BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages (gate_up and down alike; K a multiple of 32)
    (16, 64, 64, 4, 3), (16, 128, 64, 4, 3), (16, 32, 64, 4, 3), (16, 64, 128, 4, 3), (16, 64, 64, 4, 4),
    (16, 128, 128, 4, 2), (16, 64, 64, 8, 3), (16, 128, 64, 8, 3), (16, 32, 128, 4, 4),
]


def tune_moe_w4(T=32, H=2048, N=512, E=256, top_k=8, quick=False, seed=0):
    """The single-request expert GEMMs over packed NVFP4 routed experts (+ a BF16 shared expert): entries
    ``w4_gate_up`` / ``w4_down`` of the moe file (:func:`~repro.engine.kernels.fastpath.kernel_configs` reads them
    for packed experts). Bytes per launch: the touched experts' 4-bit codes + E4M3 block scales (0.5 + 1/16 byte
    per weight) and the shared expert in BF16."""
    from .moe_w4 import random_nvfp4_experts

    dev = "cuda"
    g, x, gate, bias = _router_inputs(T, H, E, seed)
    w13 = random_nvfp4_experts(E, 2 * N, H, 2, torch.bfloat16, dev, g).with_shared(
        torch.randn(2 * N, H, device=dev, generator=g, dtype=torch.bfloat16) * 0.02)
    w2 = random_nvfp4_experts(E, H, N, 1, torch.bfloat16, dev, g).with_shared(
        torch.randn(H, N, device=dev, generator=g, dtype=torch.bfloat16) * 0.02)
    ws = M.MoEWorkspace.create(T, H, N, E, E + 1, top_k, x.dtype, dev)
    M.moe_route_align(x, gate, bias, ws, E + 1, top_k)
    torch.cuda.synchronize()
    D = int((ws.counts[:E] > 0).sum().item())
    per_w = 0.5 + 1 / 16
    rows, best = [], {}
    M.moe_gate_up(x, w13, ws, top_k, {"gate_up": _as_cfg(W4_CANDS[0])})  # a valid intermediate for down
    for name, nbytes, fn in (
        ("gate_up", D * 2 * N * H * per_w + 2 * N * H * 2,
         lambda c: (lambda: M.moe_gate_up(x, w13, ws, top_k, {"gate_up": c}))),
        ("down", D * H * N * per_w + H * N * 2, lambda c: (lambda: M.moe_down(w2, ws, {"down": c}))),
    ):
        best["w4_" + name] = _best_of(W4_CANDS[:3] if quick else W4_CANDS, lambda c: f"w4 {name} {c}", fn, nbytes,
                                      rows)[1]
    return best, rows


def tune_dense(T=32, H=2048, I=5120, quick=False, seed=0):
    dev = "cuda"
    g = torch.Generator(device=dev)
    g.manual_seed(seed)
    x = torch.randn(T, H, device=dev, generator=g).to(torch.bfloat16)
    w13 = torch.randn(1, 2 * I, H, device=dev, generator=g, dtype=torch.bfloat16) * 0.02
    w2 = torch.randn(1, H, I, device=dev, generator=g, dtype=torch.bfloat16) * 0.02
    ws = M.MoEWorkspace.create(T, H, I, 1, 1, 1, x.dtype, dev, split_k=1)
    ws.counts.fill_(T)
    ws.pairs[0, :T] = torch.arange(T, device=dev, dtype=torch.int32)
    ws.pair_w.fill_(1.0)
    rows, best = [], {}
    for name, cands, nbytes, fn in (
        ("gate_up", DGU_CANDS, 2 * I * H * 2, lambda c: (lambda: M.moe_gate_up(x, w13, ws, 1, {"gate_up": c}))),
        ("down", DDN_CANDS, I * H * 2, lambda c: (lambda: M.moe_down(w2, ws, {"down": c}))),
    ):
        best[name] = _best_of(cands[:2] if quick else cands, lambda c: f"dense {name} {c}", fn, nbytes, rows)[1]
    return best, rows


def tune_attn(T=32, NQ=16, NKV=4, D=128, prefixes=(1024, 4096), quick=False, seed=0):
    dev = "cuda"
    maxlen = max(prefixes) + 2 * T
    g = torch.Generator(device=dev)
    g.manual_seed(seed)
    kc = torch.randn(NKV, maxlen, D, device=dev, generator=g).to(torch.bfloat16)
    vc = torch.randn(NKV, maxlen, D, device=dev, generator=g).to(torch.bfloat16)
    q = torch.randn(T, NQ, D, device=dev, generator=g).to(torch.bfloat16)
    out = torch.empty(T, NQ * D, device=dev, dtype=torch.bfloat16)
    cl = torch.zeros(1, dtype=torch.int32, device=dev)
    rows, bestc = [], None
    cands = [(32, mk, bm, bn, w, st) for mk in (64, 128, 256) for bm in (16, 32, 64)
             for bn, w, st in ((64, 4, 3), (32, 4, 2), (64, 2, 3))] + [(32, 128, 128, 32, 4, 2)]
    quick_cands = [(32, 64, 64, 64, 4, 3), (32, 64, 16, 32, 4, 2), (32, 64, 32, 64, 4, 3)]  # row tiles 64 / 16 / 32
    for ns, mk, bm, bn, w, st in quick_cands if quick else cands:
        ws = A.AttnWorkspace(T, NQ, NKV, D, dev, nsplit=ns, block_n=bn, num_warps=w, num_stages=st, min_keys=mk,
                             block_m=bm)
        tot = 0.0
        for P in prefixes:
            cl.fill_(P)
            ms = _try(lambda: A.block_attention(q, kc, vc, cl, out, ws), f"attn NSPLIT={ns} MIN_KEYS={mk} BM={bm} BN={bn} w={w} s={st} P={P}", rows)
            if ms is None:
                tot = float("inf")
                break
            tot += ms
        if bestc is None or tot < bestc[0]:
            bestc = (tot, dict(NSPLIT=ns, BLOCK_N=bn, num_warps=w, num_stages=st, MIN_KEYS=mk, BLOCK_M=bm))
    return {"split": bestc[1]}, rows


LIN_CANDS = [(32, 16, 256, 4, 3), (32, 16, 128, 4, 4), (32, 32, 256, 4, 3), (32, 32, 128, 4, 4),
             (32, 16, 512, 4, 2), (32, 64, 128, 4, 4), (16, 16, 256, 4, 3), (32, 16, 256, 2, 3),
             (32, 32, 512, 8, 2)]


def tune_linear(T=32, H=2048, shapes=(("qkv", 3072), ("o", 2048)), quick=False, seed=0):
    """Skinny GEMM (moe.linear_rows) for the QKV and O projections vs cuBLAS (torch.mm) at M=T."""
    dev = "cuda"
    g = torch.Generator(device=dev)
    g.manual_seed(seed)
    x = torch.randn(T, H, device=dev, generator=g).to(torch.bfloat16)
    counts = torch.full((1,), T, dtype=torch.int32, device=dev)
    pairs = torch.arange(T, dtype=torch.int32, device=dev).view(1, T)
    rows, best = [], {}
    for name, n_out in shapes:
        w = torch.randn(n_out, H, device=dev, generator=g, dtype=torch.bfloat16) * 0.02
        out = torch.empty(T, n_out, device=dev, dtype=torch.float32)
        ob = torch.empty(T, n_out, device=dev, dtype=torch.bfloat16)
        nbytes = n_out * H * 2
        ms = _try(lambda: torch.mm(x, w.t(), out=ob), f"linear {name} cuBLAS torch.mm", rows)
        if ms:
            rows[-1] = (rows[-1][0], ms, f"{nbytes / ms / 1e6:.0f} GB/s")
        best[name] = _best_of(LIN_CANDS[:2] if quick else LIN_CANDS, lambda c: f"linear {name} {c}",
                              lambda cfg: (lambda: M.linear_rows(x, w, out, counts, pairs, cfg)), nbytes, rows)[1]
    return best, rows


FAMILIES = ("moe", "w4", "dense", "linear", "attn", "batched", "batched-w4")


def main(argv=None):
    import time

    ap = argparse.ArgumentParser(prog="python -m repro.engine.kernels.tune", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a few likely candidates per kernel, batched round at 1, 8 "
                                                         "and 32 slots: a new card in about 10 minutes")
    ap.add_argument("--only", default=",".join(FAMILIES), help=f"comma-separated families of {', '.join(FAMILIES)}")
    ap.add_argument("--no-save", action="store_true", help="print the choices, write no config file")
    ap.add_argument("--json", default=None, help="also write the summary (every timing) to this file")
    args = ap.parse_args(argv)
    parts = [p for p in args.only.split(",") if p]
    bad = [p for p in parts if p not in FAMILIES]
    if bad:
        ap.error(f"--only: unknown famil{'ies' if len(bad) > 1 else 'y'} {', '.join(bad)}; choose from "
                 f"{', '.join(FAMILIES)}")
    if not torch.cuda.is_available():
        print("tune: CUDA not available (the tuner times kernels on the card it tunes)", file=sys.stderr)
        return 2
    dev = device_name()
    t_start = time.perf_counter()
    summary = {"device": dev, "quick": args.quick, "saved": [], "seconds": {}}
    # every saved entry says what wrote it (a hand-kept note from before would otherwise stay beside tuned tiles)
    made = {"source": f"python -m repro.engine.kernels.tune{' --quick' if args.quick else ''}",
            "date": time.strftime("%Y-%m-%d")}
    print(f"tune: {dev}, families {', '.join(parts)}{' (quick)' if args.quick else ''}", file=sys.stderr)
    if "moe" in parts:
        best, rows = tune_moe(quick=args.quick)
        _print(rows)
        meta = {"distinct_experts_in_tuning": best.pop("_distinct"), "best_ms": best.pop("_ms")}
        summary["moe"] = best
        if not args.no_save:
            summary["saved"].append(save_config("moe", best, extra={**made, **meta}, E=257, N=512, H=2048, T=32).name)
    if "w4" in parts:
        best, rows = tune_moe_w4(quick=args.quick)
        _print(rows)
        summary["w4"] = best
        if not args.no_save:
            summary["saved"].append(save_config("moe", best, extra=made, E=257, N=512, H=2048, T=32).name)
    if "dense" in parts:
        best, rows = tune_dense(quick=args.quick)
        _print(rows)
        summary["dense"] = best
        if not args.no_save:
            summary["saved"].append(save_config("dense", best, extra=made, N=5120, H=2048, T=32).name)
    if "linear" in parts:
        best, rows = tune_linear(quick=args.quick)
        _print(rows)
        summary["linear"] = best
        if not args.no_save:
            summary["saved"].append(save_config("linear", best, extra=made, H=2048, T=32).name)
    if "attn" in parts:
        best, rows = tune_attn(quick=args.quick)
        _print(rows)
        summary["attn"] = best
        if not args.no_save:
            summary["saved"].append(save_config("attn", best, extra=made, NQ=16, NKV=4, D=128, T=32).name)
    precisions = [p for f, p in (("batched", "bf16"), ("batched-w4", "nvfp4-w4a16")) if f in parts]
    if precisions:  # the batched round's tiles by slot count (measured with the bench layer's tools)
        from repro.engine.bench.tune_batched import summary_table, tune_batched

        res = tune_batched(quick=args.quick, precisions=precisions, save=not args.no_save,
                           log=lambda m: print(m, file=sys.stderr, flush=True))
        print(summary_table(res["times"], res["entries"]), file=sys.stderr)
        summary["batched"] = res
        if not args.no_save:
            summary["saved"].append("batched_E=257_N=512_H=2048_T=32.json")
    summary["seconds"] = round(time.perf_counter() - t_start, 1)
    print(f"tune: {dev} done in {summary['seconds']:.0f} s; saved {', '.join(summary['saved']) or 'nothing'}",
          file=sys.stderr)
    text = json.dumps(summary)
    if args.json:
        with open(args.json, "w") as fh:
            fh.write(text + "\n")
    print(text)
    return 0


def _print(rows):
    for label, ms, note in rows:
        print(f"  {label:60s} {'' if ms is None else f'{ms * 1000:9.1f} us'}  {note}")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
