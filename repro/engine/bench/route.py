"""`python -m repro.engine.bench route`: the router / route-select / tile-table family (kernels/route.py) alone.

    python -m repro.engine.bench route [--rows 32,256,1024] [--layers 48] [--iters 30] [--before FILE]
        [--sets FILE] [--json FILE]

LLaDA2.1-mini's MoE routing shapes (H 2048, E 256 + shared, top-8 of 8 groups / 4 kept, x2.5) on R token rows
(R = 32·S: S request blocks of the batched forward), as the forward runs it: the post-attention RMSNorm folded into
the router GEMM, the select kernel writing the normalised rows, one counts row per layer. ``--layers`` layers,
each with its own random router weights (fp32, std 0.02 as ``fastpath.random_weights``; 48 layers = 96 MB, twice
the H200's L2, so a layer's router weights come from HBM as in a round, where the expert stream evicts them), are
captured in one CUDA graph; the figure is the replay's median / layers (µs per layer). Beside it one eager pass
under torch.profiler gives µs per layer by kernel (router GEMM, select, tile table).

Variants (``--sets FILE``: JSON ``{name: {"configs": {"router": {...}, "route": {...}}, "mode": "batched" |
"single", "tiles": "fused" | "launch" | null, "module": "before" | "after" | "fused", "fused": bool, "compare":
name}}``; default :data:`DEFAULT_SETS`; ``--sets fused``: :data:`FUSED_SETS`, the one-launch router + route
(``"fused": true``, :mod:`repro.engine.kernels.route_fused`) against the two-kernel path, each compared bit for bit
with its ``"compare"`` partner instead of the mode's first set):
``batched`` = the batched forward's call (router tiles of ``router["ROWS"]`` rows, default 32, tile table for
BLOCK_M 64), ``single`` =
``BlockForward``'s (one router row block, no tile table; timed at R = 32 only). ``--before FILE``: another
version of ``route.py`` (e.g. ``git show BASE:repro/engine/kernels/route.py > /tmp/route_before.py``) for the
sets with ``"module": "before"`` (its own workspace and a tile-table launch).

Checks per variant and R (layer 0, eager): every token's expert ids, weights and normalised row, the per-expert
token lists and the tile table, compared bit for bit with the first set of the same mode (``same_as_first``);
slot 0 (rows 0..31, the same inputs at every R) bit for bit with the set's first R (``slot0_same_as_first_R``:
the row invariance);
and the ids with ``route_reference`` on the fp64 normalised rows (``ref_ids_agree``: fraction of tokens; the
rest are near-ties, ``ref_flip_max_margin``). Prints one line per measurement on stderr, a table, and the JSON
document as the last stdout line (also to ``--json``).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys

import torch

H, E, TOPK, N_GROUP, TOPK_GROUP, SCALE, N_INTER, TILE_M = 2048, 256, 8, 8, 4, 2.5, 512, 64

#: the H200 router config of both paths before session 5 (the variants change some of its keys)
BASE_ROUTER = dict(BLOCK_E=16, SPLIT_K=16, BLOCK_K=64, num_warps=4, num_stages=2, PREC="tf32x3")

def _set(module, mode, tiles, route_warps=1, **router):
    """One variant: ``BASE_ROUTER`` with ``router`` keys replaced, the select kernel with ``route_warps`` warps."""
    return {"module": module, "mode": mode, "tiles": tiles,
            "configs": {"router": dict(BASE_ROUTER, **router), "route": {"num_warps": route_warps}}}


#: variants timed by default (module doc): the old kernels, the new select kernel, router tiles, select warps
DEFAULT_SETS = {
    "before": _set("before", "batched", "launch"),
    "new": _set("after", "batched", "fused"),
    "new_tile_launch": _set("after", "batched", "launch"),
    "new_route_w2": _set("after", "batched", "fused", route_warps=2),
    "new_r32x8": _set("after", "batched", "fused", BLOCK_E=32, SPLIT_K=8),
    "new_r64x4": _set("after", "batched", "fused", BLOCK_E=64, SPLIT_K=4),
    "new_r32x8_rows64": _set("after", "batched", "fused", BLOCK_E=32, SPLIT_K=8, ROWS=64),
    "new_r64x8_rows64": _set("after", "batched", "fused", BLOCK_E=64, SPLIT_K=8, ROWS=64),
    "new_r64x4_rows64": _set("after", "batched", "fused", BLOCK_E=64, SPLIT_K=4, ROWS=64),
    "new_r64x4_rows64_s3": _set("after", "batched", "fused", BLOCK_E=64, SPLIT_K=4, ROWS=64, num_stages=3),
    "new_r128x4_w8": _set("after", "batched", "fused", BLOCK_E=128, SPLIT_K=4, num_warps=8),
    "new_r128x4_rows64_w8": _set("after", "batched", "fused", BLOCK_E=128, SPLIT_K=4, ROWS=64, num_warps=8),
    "single_before": _set("before", "single", None),
    "single_new": _set("after", "single", None),
    "single_r16x8": _set("after", "single", None, SPLIT_K=8),
    "single_r32x8": _set("after", "single", None, BLOCK_E=32, SPLIT_K=8),
    "single_r16x32": _set("after", "single", None, SPLIT_K=32),
    "single_r32x8_rows64": _set("after", "single", None, BLOCK_E=32, SPLIT_K=8, ROWS=64),
    "single_route_w2": _set("after", "single", None, route_warps=2),
    "single_route_w4": _set("after", "single", None, route_warps=4),
}


def _fused_pair(name, mode, route_warps, cmp_to=None, tiles="launch", **router):
    """An issue-41 A/B pair: ``name`` = the two-kernel path, ``name + "_fused"`` = the fused launch with the same
    tiles and warps, compared with it bit for bit (``compare``)."""
    old = _set("after", mode, tiles if mode == "batched" else None, route_warps, **router)
    new = dict(old, fused=True, compare=name, module="fused")
    if cmp_to:
        old = dict(old, compare=cmp_to)
    return {name: old, name + "_fused": new}


#: ``--sets fused``: the fused router + route launch (route_fused) against the two-kernel path, each pair
#: with the same tiles and warps (``_fused`` compared bit for bit with its partner). "single_h200" / "batched_h200" =
#: the tile files' H200 entries (route 2 warps: the fused launch then runs the router's 4, so its Σh² and Σ weights
#: may differ in the last bit; the "_w4" pairs have 4 warps in both and must be equal). The rest: tiles for the
#: fused launch (fewer partials to read back: SPLIT_K 8-16; ROWS 16 = two row blocks, two selecting programs).
FUSED_SETS = {
    **_fused_pair("single_h200", "single", 2, SPLIT_K=32),
    **_fused_pair("single_h200_w4", "single", 4, SPLIT_K=32),
    **_fused_pair("single_r32x8", "single", 4, BLOCK_E=32, SPLIT_K=8),
    **_fused_pair("single_r32x16", "single", 4, BLOCK_E=32, SPLIT_K=16),
    **_fused_pair("single_r16x32_rows16", "single", 4, SPLIT_K=32, ROWS=16),
    **_fused_pair("single_r32x8_rows16", "single", 4, BLOCK_E=32, SPLIT_K=8, ROWS=16),
    **_fused_pair("single_h200_w4_sel8", "single", 4, SPLIT_K=32, SEL_ROWS=8),
    **_fused_pair("batched_h200", "batched", 2, BLOCK_E=64, SPLIT_K=8, ROWS=64),
    **_fused_pair("batched_h200_w4", "batched", 4, BLOCK_E=64, SPLIT_K=8, ROWS=64),
}
FUSED_SETS["batched_h200_tiles_fused"] = dict(FUSED_SETS["batched_h200_fused"], tiles="fused")


def load_before(path: str):
    """``route.py`` of another version, loaded as a module named ``_route_before`` inside this package's
    ``kernels`` (so its relative imports resolve). Raises FileNotFoundError for a missing file."""
    spec = importlib.util.spec_from_file_location("repro.engine.kernels._route_before", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class _Case:
    """Inputs and workspace of one variant at R rows (module doc); ``run()`` routes every layer once."""

    def __init__(self, mod, spec, R, layers, seed=0, device="cuda"):
        g = torch.Generator(device=device)
        g.manual_seed(seed)
        self.mod, self.spec, self.R, self.layers = mod, spec, R, layers
        self.dtype = torch.bfloat16 if device == "cuda" else torch.float32  # the interpreter's bf16 loads are wrong
        # rows of the largest R (1024) drawn for every R: row r and the weights are the same at every R
        self.h = torch.randn(max(R, 1024), H, device=device, generator=g)[:R].to(self.dtype).contiguous()
        self.nw = (1 + 0.1 * torch.randn(H, device=device, generator=g)).to(self.dtype)
        self.gates = [torch.empty(E, H, device=device).normal_(0, 0.02, generator=g) for _ in range(layers)]
        self.biases = [torch.empty(E, device=device).normal_(0, 0.01, generator=g) for _ in range(layers)]
        self.out = torch.zeros(R, H, dtype=self.dtype, device=device)
        split = spec["configs"]["router"]["SPLIT_K"]
        self.ws = mod.MoEWorkspace(R, H, N_INTER, E, E + 1, TOPK, self.dtype, device, split_k=split,
                                   n_slots=layers)
        if spec["tiles"]:
            mod.moe_tiles(self.ws, TILE_M)  # allocates the table (before any capture)

    def run(self, layers=None):
        mod, sp, ws = self.mod, self.spec, self.ws
        batched = sp["mode"] == "batched"
        for layer in range(self.layers if layers is None else layers):
            kw = dict(slot=layer, norm_w=self.nw, eps=1e-6, norm_out=self.out)
            if batched:
                kw["row_block"] = sp["configs"]["router"].get("ROWS", 32)
                if sp["tiles"] == "fused":
                    kw["tile_block_m"] = TILE_M
            route = mod.moe_route_align_fused if sp.get("fused") else mod.moe_route_align
            route(self.h, self.gates[layer], self.biases[layer], ws, E + 1, TOPK, N_GROUP, TOPK_GROUP, SCALE, True,
                  sp["configs"], **kw)
            if batched and sp["tiles"] == "launch":
                mod.moe_tiles(ws, TILE_M)

    def layer0_state(self) -> dict:
        """Layer 0 routed eagerly: ids, weights, normalised rows, per-expert token sets, tile table (CPU). The
        counts rows are cleared before and after (the shared expert's count, index E, is kept)."""
        ws = self.ws
        ws.counts_all[:, :E].zero_()
        ws.counts_all[:, E + 1:].zero_()
        self.run(layers=1)
        if ws.part.is_cuda:
            torch.cuda.synchronize()
        counts = ws.counts_all[0, :E].tolist()
        sets = [sorted(ws.pairs[e, : counts[e]].tolist()) for e in range(E)]
        st = {"ids": ws.topk_ids.cpu().clone(), "w": ws.topk_w.cpu().clone(), "normed": self.out.cpu().clone(),
              "sets": sets, "tiles": None if ws.tiles is None or not self.spec["tiles"] else ws.tiles.cpu().clone()}
        ws.counts_all[:, :E].zero_()
        ws.counts_all[:, E + 1:].zero_()
        return st


def _ref_check(case, st) -> dict:
    """Agreement of the ids with route_reference on the fp64 normalised rows (module doc)."""
    from ..kernels.route import route_reference

    h = case.h.double()
    a = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * case.nw.double()
    ids, _ = route_reference(a, case.gates[0].double(), case.biases[0].double(), TOPK, N_GROUP, TOPK_GROUP, SCALE)
    same = (ids.cpu() == st["ids"].long()).all(1)
    scores = torch.sigmoid(a @ case.gates[0].double().t()) + case.biases[0].double()
    top = scores.sort(-1, descending=True).values
    margin = (top[:, TOPK - 1] - top[:, TOPK]).cpu()  # k-th vs (k+1)-th biased score, groups ignored
    return {"ref_ids_agree": float(same.float().mean()),
            "ref_flip_max_margin": float(margin[~same].max()) if (~same).any() else 0.0}


def _same(a, b) -> bool:
    return all(torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k]
               for k in ("ids", "w", "normed", "sets")) and (
        a["tiles"] is None or b["tiles"] is None or torch.equal(a["tiles"], b["tiles"]))


def _profile_kernels(case) -> dict:
    """µs per layer by kernel name of one eager pass (torch.profiler, CUDA kernels)."""
    from torch.profiler import ProfilerActivity, profile

    case.run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        case.run()
        torch.cuda.synchronize()
    out = {}
    for ev in prof.key_averages():
        name = ev.key
        for short in ("_router_logits", "_route_select", "_fused_route", "_tile_table", "Memset", "fill", "zero"):
            if short in name:
                t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0.0)
                out[short.strip("_")] = out.get(short.strip("_"), 0.0) + t / case.layers
    return out


def bench(sets: dict, rows, layers=48, iters=30, before=None, log=print, json_path=None) -> dict:
    """Every set of ``sets`` at every R of ``rows`` (``single`` sets at R = 32 only); returns the JSON document
    (also written to ``json_path`` after every measurement, so a run cut short keeps what it measured)."""
    from .common import env_info, time_replays
    from ..kernels import moe as fused
    from ..kernels import route as after

    mods = {"after": after, "before": before, "fused": fused}
    doc = {"bench": "repro.engine.bench route", **env_info(), "layers": layers, "iters": iters, "results": []}
    first = {}
    for name, spec in sets.items():
        mod = mods[spec.get("module", "after")]
        if mod is None:
            log(f"[{name}] skipped: no --before module")
            continue
        for R in rows:
            if spec["mode"] == "single" and R != 32:
                continue
            r = {"set": name, "R": R, "slots": R // 32, **{k: spec[k] for k in ("mode", "tiles", "module")},
                 "configs": spec["configs"]}
            try:
                case = _Case(mod, spec, R, layers)
                st = case.layer0_state()
                key = (spec["mode"], R)
                first.setdefault(key, (name, st))
                first[(name, R)] = (name, st)
                if spec.get("compare") and (spec["compare"], R) in first:
                    key = (spec["compare"], R)  # its A/B partner, measured before it
                f0 = first[key][1]
                r["same_as_first"] = {"first": first[key][0], "equal": _same(st, f0),
                                      "ids_equal": bool(torch.equal(st["ids"], f0["ids"])),
                                      "w_max_rel_diff": float(((st["w"] - f0["w"]).abs() / f0["w"].abs()).max()),
                                      "normed_equal": bool(torch.equal(st["normed"], f0["normed"]))}
                r.update(_ref_check(case, st))
                slot0 = first.setdefault(("slot0", name), st)  # the set's first R: rows 0..31 = slot 0
                r["slot0_same_as_first_R"] = all(torch.equal(st[k][:32], slot0[k][:32]) for k in ("ids", "w", "normed"))
                case.run()  # warm
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    case.run()
                t = time_replays(graph.replay, iters)
                r["us_per_layer"] = t["ms"] * 1e3 / layers
                r["us_per_layer_min"] = t["ms_min"] * 1e3 / layers
                r["kernels_us_per_layer"] = _profile_kernels(case)
                del graph, case
            except Exception as exc:  # noqa: BLE001 - one bad variant (e.g. out of registers) must not end the run
                r["error"] = repr(exc)[:300]
            doc["results"].append(r)
            log(f"[{name} R={R}] " + (r["error"] if "error" in r else _line(r)))
            if json_path:
                with open(json_path, "w") as fh:
                    fh.write(json.dumps(doc) + "\n")
            torch.cuda.empty_cache()
    return doc


def _line(r) -> str:
    ks = ", ".join(f"{k} {v:.2f}" for k, v in r["kernels_us_per_layer"].items())
    sf = r["same_as_first"]
    return (f"{r['us_per_layer']:.2f} us/layer (kernels: {ks}), slot 0 invariant {r['slot0_same_as_first_R']}, "
            f"vs {sf['first']}: all equal {sf['equal']}, ids "
            f"{sf['ids_equal']}, weights max rel diff {sf['w_max_rel_diff']:.1e}, normed {sf['normed_equal']}; "
            f"ids = reference for {r['ref_ids_agree']:.4f} of the tokens")


def table(doc) -> str:
    rows = sorted({r["R"] for r in doc["results"]})
    lines = ["| set | " + " | ".join(f"R={R} us/layer" for R in rows) + " | same as first | slot 0 invariant "
             "| ref agree (min) |", "|---|" + "---|" * (len(rows) + 3)]
    for name in dict.fromkeys(r["set"] for r in doc["results"]):
        rs = {r["R"]: r for r in doc["results"] if r["set"] == name}
        cells = [("err" if "error" in rs[R] else f"{rs[R]['us_per_layer']:.2f}") if R in rs else "-" for R in rows]
        ok = [r for r in rs.values() if "error" not in r]
        same = all(r["same_as_first"]["equal"] for r in ok) if ok else None
        agree = min((r["ref_ids_agree"] for r in ok), default=float("nan"))
        inv = all(r["slot0_same_as_first_R"] for r in ok) if ok else None
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {same} | {inv} | {agree:.4f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m repro.engine.bench route", description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="32,256,1024", help="token rows R (32 per request slot), comma-separated")
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--before", default=None, help="another version's route.py for the 'before' sets")
    ap.add_argument("--sets", default=None, help="JSON file {name: variant} (module doc), or 'fused' (FUSED_SETS: "
                    "the fused router + route against the two-kernel path); default DEFAULT_SETS")
    from .cli import emit_json, gpu_args, log, read_json_object

    args, rows = gpu_args(ap, argv, "--rows", "32,256,1024", check=lambda rows: (
        "every R must be a multiple of 32 (whole request blocks)" if any(R % 32 for R in rows) else None))
    if args.sets == "fused":
        sets = FUSED_SETS
    else:
        sets = read_json_object(ap, "--sets", args.sets, "{name: variant}") if args.sets else DEFAULT_SETS
    before = load_before(args.before) if args.before else None
    doc = bench(sets, rows, args.layers, args.iters, before, log, json_path=args.json)
    doc["table"] = table(doc)
    print(doc["table"], file=sys.stderr)
    return emit_json(doc, args.json)


if __name__ == "__main__":
    sys.exit(main())
