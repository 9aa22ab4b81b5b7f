"""The weights-only 4-bit round (precision ``nvfp4-w4a16``) for ``python -m repro.engine.bench round``.

Same model, block and prefixes as the BF16 round of :mod:`repro.engine.bench.rounds` (run in the same process, so
against the same copy bandwidth): every MoE layer's routed experts replaced by random NVFP4 experts in the
real shapes (:func:`repro.engine.kernels.moe_w4.random_nvfp4_experts`; packed e2m1 + E4M3 block scales +
fp32 global scales, ~0.56 byte per weight), everything else (attention, dense layer 0, shared experts,
routers, embeddings, lm_head) the BF16 round's own tensors. Reported per (block, prefix): the round time
(median of CUDA-event timings of single graph replays), distinct experts, the bytes it must read
(``fastpath.round_bytes`` with 4-bit experts), floor = bytes / copy bandwidth, ratio; the tile variants
tried (``W4_TILES``) on the headline block; the GPU memory of the 4-bit model (every weight tensor once);
and a fidelity check: logits of the 4-bit round vs the same experts dequantized to BF16 once (the
dequantize-at-load path) through the BF16 kernels, same block and cache.

Targets (``W4_TARGETS``; reported, never asserted; docs/perf.md): ≤ 1.9 ms and ≤ 1.25× the floor at P=1k, ≤ 2.0 ms at P=4k;
model memory ≤ 12 GB.
"""
from __future__ import annotations

import os

import torch

from ..kernels.moe_w4 import W4_TILES_DEFAULT
from ..kernels.moe_w4_ws import WS_TILES_DEFAULT

#: bytes per routed-expert weight in NVFP4: 4-bit code + one E4M3 scale per 16 weights
NVFP4_BYTES = 0.5 + 1.0 / 16
W4_TARGETS = {"ms_1k": 1.9, "ratio_1k": 1.25, "ms_4k": 2.0, "model_GB": 12.0}

#: MoE tile variants for the 4-bit expert GEMMs ("default" = ``moe_w4.W4_TILES_DEFAULT``; None = the tuned BF16
#: tiles of kernels/configs; every variant with the default decode of the experts' layout (4 on the GPU, the
#: lookup-table decode with derived tables) unless it names ``W4_DECODE``; decodes 0/1 read layout "modelopt", for
#: which the round re-labels the same random bytes (:func:`relabel`), so those variants time the same distribution
#: of values)
W4_TILES = {
    "default": W4_TILES_DEFAULT,
    # session 4's default (BLOCK_K 128: 149 registers, 3 programs per SM), and each kernel alone at it
    "k128": {k: dict(v, BLOCK_K=128) for k, v in W4_TILES_DEFAULT.items()},
    "gu_k128": {"gate_up": dict(W4_TILES_DEFAULT["gate_up"], BLOCK_K=128), "down": W4_TILES_DEFAULT["down"]},
    "down_k128": {"gate_up": W4_TILES_DEFAULT["gate_up"], "down": dict(W4_TILES_DEFAULT["down"], BLOCK_K=128)},
    "s2": {k: dict(v, num_stages=2) for k, v in W4_TILES_DEFAULT.items()},
    "s4": {k: dict(v, num_stages=4) for k, v in W4_TILES_DEFAULT.items()},
    "down_n64": {"gate_up": W4_TILES_DEFAULT["gate_up"], "down": dict(W4_TILES_DEFAULT["down"], BLOCK_N=64)},
    "gu_n32_w2": {"gate_up": dict(W4_TILES_DEFAULT["gate_up"], BLOCK_N=32, num_warps=2),
                  "down": W4_TILES_DEFAULT["down"]},
    # BLOCK_N 32 at 4 warps: twice the programs of the default; the inline-PTX decode since session 11 (a gate+up
    # tile is sized by its 2·BLOCK_N packed columns, moe_gemm.w4_decode_tile; before, decode 2)
    "gu_n32": {"gate_up": dict(W4_TILES_DEFAULT["gate_up"], BLOCK_N=32), "down": W4_TILES_DEFAULT["down"]},
    "gu_n32_k128": {"gate_up": dict(W4_TILES_DEFAULT["gate_up"], BLOCK_N=32, BLOCK_K=128),
                    "down": W4_TILES_DEFAULT["down"]},
    # larger tiles at BLOCK_K 64 (offline: gate+up n128 w4 3.41 instr/weight at 127 registers; w8 3.80 at 97;
    # down n256 w8 3.80 at 96)
    "gu_n128": {"gate_up": dict(W4_TILES_DEFAULT["gate_up"], BLOCK_N=128), "down": W4_TILES_DEFAULT["down"]},
    "gu_n128_w8": {"gate_up": dict(W4_TILES_DEFAULT["gate_up"], BLOCK_N=128, num_warps=8),
                   "down": W4_TILES_DEFAULT["down"]},
    "down_n256_w8": {"gate_up": W4_TILES_DEFAULT["gate_up"],
                     "down": dict(W4_TILES_DEFAULT["down"], BLOCK_N=256, num_warps=8)},
    "default+dec3": {k: dict(v, W4_DECODE=3) for k, v in W4_TILES_DEFAULT.items()},
    "k128+dec3": {k: dict(v, BLOCK_K=128, W4_DECODE=3) for k, v in W4_TILES_DEFAULT.items()},  # session 4's kernels
    "default+dec1": {k: dict(v, W4_DECODE=1) for k, v in W4_TILES_DEFAULT.items()},
    # the shift-and-mask decode of layout "hop" (moe_w4_hop), and with the weights as wgmma's operand A (W4_SWAP)
    "hop": {k: dict(v, W4_DECODE=5) for k, v in W4_TILES_DEFAULT.items()},
    "hop_k128": {k: dict(v, W4_DECODE=5, BLOCK_K=128) for k, v in W4_TILES_DEFAULT.items()},
    "hop_swap": {k: dict(v, W4_DECODE=5, W4_SWAP=True) for k, v in W4_TILES_DEFAULT.items()},
    "hop_swap_k128": {k: dict(v, W4_DECODE=5, W4_SWAP=True, BLOCK_K=128) for k, v in W4_TILES_DEFAULT.items()},
    # the warp-specialised Gluon GEMMs (moe_w4_ws; Hopper only), same layout and numeric contract as "hop"
    "ws": {k: dict(v, IMPL="ws", W4_DECODE=5) for k, v in WS_TILES_DEFAULT.items()},
}


def relabel(W4: dict, layout: str) -> dict:
    """``W4`` with each layer's NVFP4Experts re-labelled as ``layout`` (the same bytes, no conversion: for timing
    the decodes of the other layout on random experts without a second copy of the weights)."""
    from repro.checkpoint.nvfp4 import NVFP4Experts

    def lab(t):
        if not isinstance(t, NVFP4Experts):
            return t
        o = t.with_shared(t.shared)
        o.layout = layout
        return o

    return dict(W4, layers=[{k: lab(v) for k, v in L.items()} for L in W4["layers"]])


def _relabelled(W4: dict, tiles) -> dict:
    """``W4`` (layout "lut") relabelled for the layout the variant's ``W4_DECODE`` reads (:func:`relabel`)."""
    from ..kernels.moe_w4 import DECODE_LAYOUT

    lay = {DECODE_LAYOUT.get(c.get("W4_DECODE"), "lut") for c in (tiles or {}).values()}
    return relabel(W4, lay.pop()) if lay and lay != {"lut"} else W4


def w4_weights(W: dict, shape, seed: int = 0) -> dict:
    """``W`` (kernel layout, BF16) with each MoE layer's routed experts replaced by random NVFP4 experts
    (the shared expert, index E of W's stacks, attached as ``.shared``; no copy of the other tensors)."""
    from ..kernels.moe_w4 import random_nvfp4_experts

    dev = W["embed"].device
    g = torch.Generator(device=dev)
    g.manual_seed(seed + 7)
    E, N, H = shape.experts, shape.moe_inter, shape.hidden
    layers = []
    for L in W["layers"]:
        if "router" in L:
            w13 = random_nvfp4_experts(E, 2 * N, H, 2, L["w13"].dtype, dev, g, std=0.02)
            w2 = random_nvfp4_experts(E, H, N, 1, L["w2"].dtype, dev, g, std=0.02)
            L = dict(L, w13=w13.with_shared(L["w13"][E]), w2=w2.with_shared(L["w2"][E]))
        layers.append(L)
    return dict(W, layers=layers)


def model_bytes(W: dict) -> int:
    """Bytes of every weight tensor of a kernel-layout dict once (packed experts: q + s + g; views of a
    shared storage counted once)."""
    from repro.checkpoint.nvfp4 import NVFP4Experts

    seen, total = set(), 0

    def add(t):
        nonlocal total
        if t is None:
            return
        if isinstance(t, NVFP4Experts):
            for x in (t.q, t.s, t.g, t.shared):
                add(x)
            return
        key = (t.untyped_storage().data_ptr(), t.data_ptr(), t.numel())
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()

    for k, v in W.items():
        if k != "layers":
            add(v)
    for L in W["layers"]:
        for v in L.values():
            add(v)
    return total


def dequantized(W4: dict) -> dict:
    """BF16 kernel-layout stacks of the same expert values (dequantize-at-load), shared expert at index E."""
    layers = []
    for L in W4["layers"]:
        if "router" in L:
            L = dict(L, **{k: torch.cat([L[k].dequantize(), L[k].shared[None]], 0).contiguous()
                           for k in ("w13", "w2")})
        layers.append(L)
    return dict(W4, layers=layers)


def bench_round_w4(shape, W, fw, prefixes, iters, copy_bw, log=print, block_ids=None, time_replays=None,
                   configure=None) -> dict:
    """The 4-bit round beside the BF16 one (module doc). ``fw``: the BF16 round's BlockForward (its KV cache
    is copied); ``block_ids(shape, seed, kind)`` and ``time_replays(fn, iters)`` from :mod:`.common`. The tile
    variants timed: all of ``W4_TILES``, or those named in the environment variable ``W4_ROUND_TILES``
    (comma-separated; "default" always included), for a GPU call short of time. Raises KeyError for an unknown
    name. ``configure(fw4)`` (optional) is called on the 4-bit BlockForward once it is built (e.g. to set the
    options of the BF16 round's best variant, or to keep a reference for a kernel breakdown)."""
    from ..kernels import fastpath as F

    W4 = w4_weights(W, shape)
    fw4 = F.BlockForward(W4, shape, fw.max_len, T=fw.T, device="cuda")
    fw4.kv.copy_(fw.kv)
    if configure is not None:
        configure(fw4)
    out = {"model_GB": model_bytes(W4) / 1e9, "model_GB_bf16": model_bytes(W) / 1e9, "tiles": {}, "round": []}
    log(f"[w4] model weights {out['model_GB']:.2f} GB (bf16: {out['model_GB_bf16']:.2f} GB)")
    cases = {}
    for kind in ("issue", "half_masked"):
        for P in prefixes:
            ids = block_ids(shape, 100 + P, kind)
            fw4.ids.copy_(ids)
            fw4.cache_len.fill_(P)
            distinct = fw4.distinct_experts()
            nb = F.round_bytes(shape, distinct, P, fw4.T, expert_bytes=NVFP4_BYTES)
            cases[kind, P] = (ids, distinct, nb, nb["total"] / (copy_bw * 1e9) * 1e3)
    best, best_ms = None, float("inf")
    W_lut = fw4.W
    names = [n for n in os.environ.get("W4_ROUND_TILES", "").split(",") if n]
    variants = {n: W4_TILES[n] for n in (["default"] + [n for n in names if n != "default"])} if names else W4_TILES
    for name, tiles in variants.items():
        try:
            fw4.W = _relabelled(W_lut, tiles)
            fw4.moe_cfg = tiles
            graph = fw4.capture(head=True)
            out["tiles"][name] = {}
            for P in prefixes:
                fw4.ids.copy_(cases["issue", P][0])
                fw4.cache_len.fill_(P)
                out["tiles"][name][P] = time_replays(graph.replay, iters)["ms"]
            log(f"[w4 round] tiles {name}: " + ", ".join(f"P={P} {ms:.3f} ms" for P, ms in out["tiles"][name].items()))
            del graph
            tot = sum(out["tiles"][name].values())
            if tot < best_ms:
                best, best_ms = name, tot
        except Exception as exc:  # noqa: BLE001 - report and keep the other variants
            out["tiles"][name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            log(f"[w4 round] tiles {name} failed: {out['tiles'][name]['error']}")
    fw4.moe_cfg = W4_TILES[best]
    fw4.W = _relabelled(W_lut, W4_TILES[best])
    graph = fw4.capture(head=True)
    for (kind, P), (ids, distinct, nb, floor_ms) in cases.items():
        fw4.ids.copy_(ids)
        fw4.cache_len.fill_(P)
        t = time_replays(graph.replay, iters)
        r = {"prefix": P, "block_kind": kind, "tiles": best, "ms": t["ms"], "ms_min": t["ms_min"],
             "GBps": nb["total"] / (t["ms"] * 1e-3) / 1e9, "ratio": t["ms"] / floor_ms, "floor_ms": floor_ms,
             "distinct_experts_mean": sum(distinct) / len(distinct), "bytes_GB": nb["total"] / 1e9,
             "bytes_by_item_MB": {k: round(v / 1e6, 2) for k, v in nb.items()}}
        out["round"].append(r)
        log(f"[w4 round {kind} P={P}] {t['ms']:.3f} ms, {r['GBps']:.0f} GB/s, D={r['distinct_experts_mean']:.1f}, "
            f"{r['bytes_GB']:.2f} GB, floor {floor_ms:.3f} ms, ratio {r['ratio']:.3f}")
    del graph
    try:
        out["check"] = _fidelity(shape, fw, fw4, W4, cases["issue", prefixes[0]][0], prefixes[0])
    except torch.OutOfMemoryError:  # the BF16 copy of the experts (~30 GB) beside both models: an 80 GB card
        out["check"] = {"skipped": "out of GPU memory for the dequantized BF16 copy of the experts"}
    log(f"[w4 check] {out['check']}")
    del fw4, W4
    torch.cuda.empty_cache()
    return out


def _fidelity(shape, fw, fw4, W4, ids, P) -> dict:
    """The 4-bit round's logits against the same experts dequantized once to BF16 through the BF16 kernels (same
    block ``ids`` and cache at prefix ``P``), the BF16 path's own noise against the fp32 torch reference MoE, and
    one MoE layer alone: relative errors and the argmax agreement."""
    from ..kernels import fastpath as F

    # fidelity: the same experts dequantized once to BF16, through the BF16 kernels, same block and cache
    fwd = F.BlockForward(dequantized(W4), shape, fw.max_len, T=fw.T, device="cuda")
    fwd.kv.copy_(fw.kv)
    for f in (fw4, fwd):
        f.ids.copy_(ids)
        f.cache_len.fill_(P)
        f.forward()
    torch.cuda.synchronize()
    a, b = fw4.logits.float(), fwd.logits.float()
    # noise scale of the BF16 path itself: the dequantized model through the fp32 torch reference MoE
    from ..kernels import moe as M

    ref = F.reference_forward(fwd.W, shape, fw.kv, P, ids, moe_fn=M.moe_reference).float()
    # one MoE layer alone (no routing flips propagating through 20 layers): 4-bit kernels vs BF16 kernels on
    # the dequantized experts, same input and routing
    L4, Ld = W4["layers"][shape.first_dense], fwd.W["layers"][shape.first_dense]
    x = torch.randn(fw.T, shape.hidden, device="cuda", generator=torch.Generator(device="cuda").manual_seed(1))
    x = x.to(fw.dtype)
    moe = [M.fused_moe(x, L["router"], L["expert_bias"], L["w13"], L["w2"], shape.top_k, shape.n_group,
                       shape.topk_group, shape.scaling).float() for L in (L4, Ld)]
    check = {"w4_vs_dequantized_bf16_rel_err": float((a - b).norm() / b.norm()),
             "w4_vs_dequantized_bf16_argmax_agree": float((a.argmax(-1) == b.argmax(-1)).float().mean()),
             "dequantized_bf16_vs_fp32moe_ref_rel_err": float((b - ref).norm() / ref.norm()),
             "moe_layer_w4_vs_dequantized_rel_err": float((moe[0] - moe[1]).norm() / moe[1].norm())}
    del fwd, ref
    return check


def moe_layer_kernels(iters: int = 50, T: int = 32, seed: int = 0, log=print,
                      tiles: tuple[str, ...] = ("k128", "k128+dec3", "s4", "s2", "gu_n32_w2")) -> dict:
    """Per-kernel times of one MoE layer in the real shapes (E=256, H=2048, N=512, top-8 + shared), BF16 vs
    4-bit experts with the same routing: gate+up and down, median µs of CUDA-event timed launches, and the
    expert bytes each reads (touched experts + shared) / time; the decodes 4 / 3 / 2 / 1 at the default tiles,
    then each ``W4_TILES`` variant named in ``tiles``. ``python -m repro.engine.bench w4``; also the
    program to profile (``ncu --kernel-name regex:_moe_ ...``)."""
    from .common import time_replays
    from ..kernels import moe as M
    from ..kernels.moe_w4 import random_nvfp4_experts

    E, H, N, k = 256, 2048, 512, 8
    ref = None
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(T, H, device="cuda", generator=g).to(torch.bfloat16)
    gate = torch.randn(E, H, device="cuda", generator=g) * H ** -0.5
    bias = torch.randn(E, device="cuda", generator=g) * 0.05
    w13_4 = random_nvfp4_experts(E, 2 * N, H, 2, torch.bfloat16, "cuda", g)
    w2_4 = random_nvfp4_experts(E, H, N, 1, torch.bfloat16, "cuda", g)
    w13_4.shared = (torch.randn(2 * N, H, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    w2_4.shared = (torch.randn(H, N, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    w13 = torch.cat([w13_4.dequantize(), w13_4.shared[None]]).contiguous()
    w2 = torch.cat([w2_4.dequantize(), w2_4.shared[None]]).contiguous()
    ws = M.MoEWorkspace.create(T, H, N, E, E + 1, k, torch.bfloat16, "cuda")
    M.moe_route_align(x, gate, bias, ws, E + 1, k)
    D = int((ws.counts[:E] > 0).sum())
    out = {"T": T, "distinct_experts": D}
    m13, m2 = w13_4.with_layout("modelopt"), w2_4.with_layout("modelopt")  # the same values, export layout
    dec = lambda d: {k: dict(v, W4_DECODE=d) for k, v in W4_TILES_DEFAULT.items()}  # noqa: E731
    runs = [("bf16", w13, w2, 2.0, None), ("w4_lut_dec4", w13_4, w2_4, NVFP4_BYTES, dec(4)),
            ("w4_lut_dec3", w13_4, w2_4, NVFP4_BYTES, dec(3)), ("w4_lut_dec2", w13_4, w2_4, NVFP4_BYTES, dec(2)),
            ("w4_modelopt_dec1", m13, m2, NVFP4_BYTES, dec(1))]
    runs += [(f"w4_lut_{v}", w13_4, w2_4, NVFP4_BYTES, W4_TILES[v]) for v in tiles]
    for name, a, b, bpw, cfg in runs:
        gu = time_replays(lambda: M.moe_gate_up(x, a, ws, k, cfg), iters)["ms"] * 1e3
        dn = time_replays(lambda: M.moe_down(b, ws, cfg), iters)["ms"] * 1e3
        routed = D * 2 * N * H * bpw + 2 * N * H * 2  # touched routed experts + the bf16 shared expert
        out[name] = {"gate_up_us": gu, "down_us": dn, "gate_up_GBps": routed / (gu * 1e-6) / 1e9,
                     "down_GBps": (routed / 2) / (dn * 1e-6) / 1e9}
        ws.pair_out.fill_(float("nan"))
        M.moe_gate_up(x, a, ws, k, cfg)
        M.moe_down(b, ws, cfg)
        res = ws.pair_out.clone()
        out[name]["pair_out_vs_bf16_rel_err"] = 0.0 if name == "bf16" else float(
            (res.double() - ref.double()).norm() / ref.double().norm())
        if name == "bf16":
            ref = res
        log(f"[moe layer {name}] D={D}: gate+up {gu:.1f} µs ({out[name]['gate_up_GBps']:.0f} GB/s), "
            f"down {dn:.1f} µs ({out[name]['down_GBps']:.0f} GB/s), vs bf16 kernels "
            f"{out[name]['pair_out_vs_bf16_rel_err']:.2e}")
    return out



def main(argv=None) -> int:
    """``python -m repro.engine.bench w4``: :func:`moe_layer_kernels` with its default tiles; the JSON document
    on stdout. Without CUDA: ``{"error": "CUDA not available"}`` and exit status 2."""
    import argparse
    import json

    ap = argparse.ArgumentParser(prog="python -m repro.engine.bench w4",
                                 description="one MoE layer's 4-bit expert GEMMs (gate+up, down) per tile set vs "
                                             "the BF16 kernels: µs, GB/s, error against BF16 (module docstring)")
    ap.parse_args(argv)
    if not torch.cuda.is_available():
        print(json.dumps({"error": "CUDA not available"}))
        return 2
    print(json.dumps(moe_layer_kernels()))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
