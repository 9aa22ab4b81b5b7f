"""Per-kernel device times of a forward from torch.profiler (CUPTI), shared by the round benchmarks.

* :func:`cuda_kernels`: the CUDA kernels recorded while a callable runs (name, start, duration), in launch order;
  ``bench.graph_round.kernel_breakdown`` (batched round, by kernel family) and :func:`round_breakdown` (the
  single-request round of ``fastpath.BlockForward``, by kernel role) are built on it.
* :func:`round_breakdown`: one single-request round (CUDA-graph replays; eager forwards where the profiler sees no
  kernel inside a graph) split by role — embed, add+RMSNorm, QKV GEMM, QK-norm+RoPE+KV write, attention split,
  attention combine, O GEMM, router GEMM, route-select, expert GEMMs, lm_head, logits statistics — as µs per launch,
  launches per round and ms per round, beside the round's graph time (CUDA events), so the launch gaps are the
  difference. :func:`breakdown_table` prints several of them side by side (``bench round --breakdown``).
"""
from __future__ import annotations

import json
import os
import tempfile

import torch

__all__ = ["cuda_kernels", "ROLES", "classify_round", "round_breakdown", "breakdown_table"]


def cuda_kernels(run, calls: int = 1) -> list[dict]:
    """CUDA kernels of ``calls`` calls of ``run()`` (after one warm call), from a torch.profiler trace: a list of
    ``{"name", "ts", "dur"}`` (µs) sorted by start. Raises RuntimeError when the profiler recorded no CUDA kernel."""
    from torch.profiler import ProfilerActivity, profile

    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            run()
        torch.cuda.synchronize()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as fh:
            trace = json.load(fh)
    finally:
        os.unlink(path)
    ks = sorted((e for e in trace.get("traceEvents", []) if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    if not ks:
        raise RuntimeError("cuda_kernels: the profiler recorded no CUDA kernel")
    return [{"name": e["name"], "ts": float(e["ts"]), "dur": float(e.get("dur", 0.0))} for e in ks]


#: roles of the single-request round's kernels, in table order (per layer, then the head)
ROLES = ("embed", "add_rmsnorm", "qkv_gemm", "qk_norm_rope_kv", "attn_split", "attn_combine", "attn_fused", "o_gemm",
         "router", "route_select", "route_fused", "gate_up", "down", "dense_gate_up", "dense_down", "lm_head",
         "logits_stats", "other")

_BY_NAME = (("_add_rmsnorm", "add_rmsnorm"), ("_qk_norm_rope_kv", "qk_norm_rope_kv"), ("_attn_split", "attn_split"),
            ("_attn_combine", "attn_combine"), ("_attn_fused", "attn_fused"), ("_router_logits", "router"),
            ("_route_select", "router_select"), ("_fused_route", "route_fused"), ("_moe_gate_up", "gate_up"),
            ("_moe_down", "down"), ("_logits_", "logits_stats"), ("index", "embed"), ("_rows_linear", "linear"))
_GEMM_WORDS = ("gemm", "nvjet", "xmma", "cutlass", "gemv", "sm90_", "sm80_")


def classify_round(names: list[str], first_dense: int, head: bool = True) -> list[str]:
    """Role (:data:`ROLES`) of each kernel of one round, ``names`` in launch order: Triton kernels by name; GEMMs
    (cuBLAS and the rows kernel) by order — per layer the first is the QKV projection and the second the
    O projection, the last of the round lm_head (``head``); a cuBLAS split-K reduction kernel takes the role of
    the GEMM before it; the expert GEMMs of the first ``first_dense`` layers are the dense FFN."""
    roles = []
    for n in names:
        role = next((r for key, r in _BY_NAME if key in n), None)
        if role == "router_select":
            role = "route_select"
        if role is None:
            low = n.lower()
            if "reduce" in low and roles and roles[-1] in ("linear", "lin_reduce"):
                role = "lin_reduce"
            elif any(w in low for w in _GEMM_WORDS):
                role = "linear"
            else:
                role = "other"
        roles.append(role)
    lin = [i for i, r in enumerate(roles) if r == "linear"]
    for j, i in enumerate(lin):
        roles[i] = "lm_head" if head and i == lin[-1] else ("qkv_gemm" if j % 2 == 0 else "o_gemm")
    for i, r in enumerate(roles):
        if r == "lin_reduce":
            roles[i] = roles[i - 1]
    for kern in ("gate_up", "down"):
        for i in [i for i, r in enumerate(roles) if r == kern][:first_dense]:
            roles[i] = "dense_" + kern
    return roles


def round_breakdown(fw, replays: int = 5, graph_ms: float | None = None) -> dict:
    """Device time of one round of ``fw`` (a ``fastpath.BlockForward`` with its inputs set) by role: ``{"roles":
    {role: {"us_per_launch", "launches", "ms"}}, "kernels_ms": Σ durations per round, "kernels": launches per
    round, "graph_ms": median replay time (CUDA events, or ``graph_ms`` if given), "source": "graph" | "eager"}``.
    The round is captured as a CUDA graph and ``replays`` replays are profiled; if the profiler sees no kernel
    inside the graph, ``replays`` eager forwards are profiled instead (the same kernels, plus launch gaps)."""
    from .common import time_replays

    g = fw.capture(head=True)
    if graph_ms is None:
        graph_ms = time_replays(g.replay, 20)["ms"]
    source = "graph"
    try:
        ks = cuda_kernels(g.replay, replays)
    except RuntimeError:
        ks = []
    if len(ks) < replays * 4 * fw.s.layers:  # graph kernels not recorded by this profiler
        source = "eager"
        ks = cuda_kernels(lambda: fw.forward(head=True), replays)
    del g
    n = len(ks) // replays
    out = {r: {"us_per_launch": 0.0, "launches": 0, "ms": 0.0} for r in ROLES}
    for k in range(replays):
        chunk = ks[k * n:(k + 1) * n]
        for e, r in zip(chunk, classify_round([e["name"] for e in chunk], fw.s.first_dense)):
            out[r]["ms"] += e["dur"] / 1e3 / replays
            out[r]["launches"] += 1
    for r in ROLES:
        out[r]["launches"] //= replays
        out[r]["us_per_launch"] = 1e3 * out[r]["ms"] / out[r]["launches"] if out[r]["launches"] else 0.0
    kms = sum(v["ms"] for v in out.values())
    return {"roles": {r: v for r, v in out.items() if v["launches"]}, "kernels_ms": kms, "kernels": n,
            "graph_ms": graph_ms, "source": source}


def breakdown_table(cols: list[tuple[str, dict]]) -> str:
    """Markdown table of :func:`round_breakdown` results side by side: per role µs per launch (launches per round
    in brackets when not one per layer) and ms per round; then Σ kernels, the graph time and the difference (gaps)."""
    roles = [r for r in ROLES if any(r in b["roles"] for _, b in cols)]
    head = "| kernel | " + " | ".join(f"{lbl} µs/launch (n) | {lbl} ms/round" for lbl, _ in cols) + " |"
    lines = [head, "|---|" + "---:|---:|" * len(cols)]
    for r in roles:
        cells = []
        for _, b in cols:
            v = b["roles"].get(r)
            cells += ([f"{v['us_per_launch']:.2f} ({v['launches']})", f"{v['ms']:.3f}"] if v else ["–", "–"])
        lines.append(f"| {r} | " + " | ".join(cells) + " |")
    for key, lbl in (("kernels_ms", "Σ kernels"), ("graph_ms", "graph replay")):
        lines.append(f"| {lbl} | " + " | ".join(f" | {b[key]:.3f}" for _, b in cols) + " |")
    lines.append("| gaps (graph − Σ) | " + " | ".join(f" | {b['graph_ms'] - b['kernels_ms']:.3f}" for _, b in cols)
                 + " |")
    return "\n".join(lines)
