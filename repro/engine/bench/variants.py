"""Variants of the single-request round (``fastpath.BlockForward`` options) for ``python -m repro.engine.bench round``.

:data:`VARIANTS` maps a name to settings on top of :data:`BASE`: ``pdl`` (programmatic dependent launch for the
Triton kernels) and BlockForward attributes; :func:`set_variant` applies one, :func:`time_variants` times a list of
them as CUDA-graph replays. :func:`round_w4` runs the 4-bit round (:mod:`.w4`) with the BF16 round's best variant
(and ``--w4-variants`` on it), :func:`breakdowns` the per-kernel tables of both rounds (``--breakdown``,
:mod:`.profiling`). The measurements behind each option are in docs/perf.md.
"""
from __future__ import annotations

# variant -> settings: ``pdl`` (programmatic dependent launch for Triton kernels), and BlockForward attributes:
# ``prefetch`` (L2 prefetch of the next layer's weights), ``fuse_norm`` (post-attention RMSNorm folded into the
# FFN GEMMs), ``triton_linear`` (QKV/O through the Triton skinny GEMM), ``compact`` (expert GEMM grids over the
# active-expert list; a MoE-workspace attribute), ``norm_in_route`` (MoE layers: post-attention RMSNorm written
# by the route-select kernel), ``fused_attn`` (QK-norm + RoPE + KV write + attention + combine in one launch),
# ``fused_route`` (router GEMM + route/align in one launch). Unnamed settings take ``BASE``'s values.
BASE = {"pdl": False, "prefetch": False, "fuse_norm": False, "triton_linear": False, "compact": False,
        "norm_in_route": False, "fused_attn": False, "fused_route": False}
VARIANTS = {
    "base": {},
    "pdl": {"pdl": True},
    "prefetch": {"prefetch": True},
    "pdl+prefetch": {"pdl": True, "prefetch": True},
    "fused_norm": {"fuse_norm": True},
    "linear": {"triton_linear": True},
    "compact": {"compact": True},
    "norm_in_route": {"norm_in_route": True},
    "fused_attn": {"fused_attn": True},
    "norm_in_route+pdl": {"norm_in_route": True, "pdl": True},
    "norm_in_route+fused_attn": {"norm_in_route": True, "fused_attn": True},
    "norm_in_route+fused_attn+pdl": {"norm_in_route": True, "fused_attn": True, "pdl": True},
    "norm_in_route+fused_route": {"norm_in_route": True, "fused_route": True},
    "norm_in_route+fused_route+pdl": {"norm_in_route": True, "fused_route": True, "pdl": True},
    "norm_in_route+fused_route+fused_attn": {"norm_in_route": True, "fused_route": True, "fused_attn": True},
}

#: the variants ``bench round`` times by default (``--variants`` picks others)
ROUND_VARIANTS = ("base", "pdl", "compact", "norm_in_route", "fused_attn", "norm_in_route+pdl",
                  "norm_in_route+fused_attn", "norm_in_route+fused_attn+pdl")


def set_variant(fw, name):
    """Apply VARIANTS[name] on top of BASE; returns False when PDL was asked for but is unsupported."""
    from ..kernels import _triton

    v = {**BASE, **VARIANTS[name]}
    eff = _triton.set_pdl(v.pop("pdl"))
    fw.ws.compact = v.pop("compact")
    for k, val in v.items():
        if not hasattr(fw, k):
            if val:
                raise AttributeError(f"BlockForward has no option {k!r} in this version")
            continue
        setattr(fw, k, val)
    return eff == VARIANTS[name].get("pdl", False)


def time_variants(fw, variants, prefixes, ids_by_prefix, iters, log=print, tag="round") -> dict:
    """Median graph-replay ms of every variant (VARIANTS) of ``fw`` at every prefix: ``{name: {P: time_replays
    dict}}``, or ``{name: {"error": text}}`` for a variant that failed (reported, the others go on). Leaves PDL off."""
    from .common import time_replays

    times = {}
    for name in variants:
        try:
            if not set_variant(fw, name):
                times[name] = {"error": "PDL not supported by this triton"}
                continue
            graph = fw.capture(head=True)
            times[name] = {}
            for P in prefixes:
                fw.ids.copy_(ids_by_prefix[P])
                fw.cache_len.fill_(P)
                times[name][P] = time_replays(graph.replay, iters)
                log(f"[{tag} P={P}] variant {name}: {times[name][P]['ms']:.3f} ms (min {times[name][P]['ms_min']:.3f})")
            del graph
        except Exception as exc:  # noqa: BLE001 - report and keep the other variants
            times[name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            log(f"variant {name} failed: {times[name]['error']}")
    from ..kernels import _triton

    _triton.set_pdl(False)
    return times


def round_w4(args, doc, shape, W, fw, prefixes, copy_bw, best, log):
    """The 4-bit round (:mod:`.w4`) with the BF16 round's best variant, then ``--w4-variants`` timed on it; returns its
    BlockForward (None with ``--no-w4``)."""
    if args.no_w4:
        return None
    from .common import block_ids, time_replays
    from .w4 import W4_TARGETS, bench_round_w4

    held = []

    def configure(f4):
        set_variant(f4, best)
        held.append(f4)

    doc["round_w4"] = bench_round_w4(shape, W, fw, prefixes, args.iters, copy_bw, log, block_ids=block_ids,
                                     time_replays=time_replays, configure=configure)
    doc["targets_w4"] = W4_TARGETS
    names = [v for v in (args.w4_variants or "").split(",") if v]
    if names:
        t = time_variants(held[0], names, prefixes, {P: block_ids(shape, 100 + P, "issue") for P in prefixes},
                          args.iters, log, tag="w4 round")
        doc["round_w4"]["variants_ms"] = {n: ({str(P): v["ms"] for P, v in t[n].items()} if "error" not in t[n]
                                              else t[n]["error"]) for n in names}
    set_variant(held[0], best)
    return held[0]


def breakdowns(shape, fw, fw4, P, best, log, names=None) -> dict:
    """Per-kernel tables (bench.profiling.round_breakdown) of the BF16 and 4-bit rounds at prefix P, issue block, for
    the variants ``names`` (default: ``norm_in_route``, the session-5 default, and ``best``); printed as one
    markdown table."""
    from .common import block_ids
    from .profiling import breakdown_table, round_breakdown

    out, cols = {}, []
    for prec, f in (("bf16", fw), ("w4", fw4)):
        if f is None:
            continue
        for v in dict.fromkeys(names or ["norm_in_route", best]):
            set_variant(f, v)
            f.ids.copy_(block_ids(shape, 100 + P, "issue"))
            f.cache_len.fill_(P)
            try:
                out[f"{prec} {v}"] = b = round_breakdown(f)
                cols.append((f"{prec} {v}", b))
            except Exception as exc:  # noqa: BLE001 - report, keep the rest of the benchmark
                out[f"{prec} {v}"] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        set_variant(f, best)
    if cols:
        out["table"] = breakdown_table(cols)
        log(out["table"])
    return out
