"""`python -m repro.engine.bench batch`: batched generation at full size on one GPU — throughput and invariance.

    python -m repro.engine.bench batch [--prefix 1024] [--batch-tokens 256] [--batch-sizes 1,8,32]
        [--sections throughput,graph,batched-graph,handoff,invariance,invariance-graph]
        [--algorithms joint_threshold,orl]
        [--invariance-prompts 32] [--invariance-tokens 32] [--precision bf16|nvfp4-w4a16] [--json FILE]

``--precision nvfp4-w4a16``: the routed experts replaced by random NVFP4 experts kept packed (the weights-only 4-bit
mode; floors count 0.5 + 1/16 bytes per expert weight); sections batched-graph and invariance-graph only.

Time: the eager forward is slow at batch 1 (≈ 0.1 s per forward measured before this work, docs/perf.md), and
the invariance check runs every prompt alone; to stay inside a 10-minute device call run it in pieces, e.g.
``--sections throughput``, then ``--sections invariance --algorithms joint_threshold``, then ``... orl``
(each saves its JSON after every algorithm / section).

Builds LLaDA2.1-mini in its real shapes with deterministic random bf16 weights
(:meth:`repro.engine.model.LLaDA2Model.random`, preset ``llada2.1-mini``, router fp32), selects the Triton
kernels in the layer seams, and runs the batched engine (:mod:`repro.engine.batch`: eager forward, one
``forward_chunks`` per round over all active requests; no CUDA graphs).

1. **Throughput** per batch size b: b requests (``max(2, b)`` at b = 1), each a distinct random prompt of
   ``prefix`` tokens followed by ``--batch-tokens`` new tokens with a **fixed schedule** (as ``bench generate``):
   ``low_confidence`` with threshold 1 (never passed) and ``num_to_transfer = 32 / steps`` (default 8
   steps per block: 4 tokens per round), the mask token excluded, no EOS stop — so every block takes
   ``steps`` denoising rounds + 1 commit, whatever the weights. Reported: aggregate tokens/s (all generated
   tokens / wall time of the decode rounds, prefill rounds excluded; with prefill beside it), the median
   decode round (CUDA-synchronised wall time of one ``forward_chunks``), and its **floor** = bytes the round
   actually reads / device copy bandwidth: every non-expert weight once per GEMM row tile
   (:func:`repro.engine.layers.linear.row_tile`), the routed experts touched per 128-row MoE group (counted
   on one round with the routing recorded), the shared experts and router once per group, and each request's
   K/V prefix. Speed-ups are against batch 1 of the same run.
   ``graph``: the single-request CUDA-graph path with the same schedule (``bench generate``), so each batch
   size is also compared with the fastest batch-1 path (``speedup_vs_graph_batch1``).
   ``batched-graph``: the batched CUDA-graph path (:mod:`repro.engine.batch_graph`: one replay per round
   over all slots, the on-device step of every slot, one flags read per round) with the same schedule:
   aggregate tokens/s per batch size, the median decode round against its floor (each weight once, the
   routed experts touched by all rows of the round, every slot's K/V prefix) and the graph capture seconds.
2. **Batch invariance**: ``--invariance-prompts`` random prompts of varied length (64..prefix tokens), real
   greedy decoders (``joint_threshold``, ``orl`` with adapter-free self-conditioning: the preset has no
   adapter), ``--invariance-tokens`` new tokens, real EOS: each prompt alone (batch 1), then in batches of
   8 and of all of them; identical token ids and forward counts for every prompt is the pass condition.
   ``invariance-graph``: the same on the batched CUDA-graph path ("alone" = that path at batch 1).
3. ``handoff``: rounds/s of the batched graph path's scheduler with a forward that computes nothing (the
   per-round host cost: the engine loop's pass over the slots, copies, the decoder step run eagerly), per batch size.

Prints one line per measurement on stderr, then a short table, and as the last stdout line one JSON
document (also written to ``--json``). Each section catches its own errors (recorded in the JSON as
``error``), so one failure does not lose the others; the JSON file is rewritten after every section.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import traceback

import torch


#: sections that run with packed 4-bit experts (``--precision nvfp4-w4a16``): the CUDA-graph path's; the eager
#: sections count expert bytes from BF16 stacks
W4_SECTIONS = ("batched-graph", "invariance-graph")


def _model(seed: int, precision: str = "bf16"):
    from repro.engine.config import LLaDA2Config
    from repro.engine.kernels import register_with_seams
    from repro.engine.model import LLaDA2Model
    from repro.engine.presets import PRESET_MASK_IDS, PRESETS

    cfg = LLaDA2Config.from_dict(PRESETS["llada2.1-mini"])
    model = LLaDA2Model.random(cfg, device="cuda", dtype="bf16", seed=seed, with_adapter=False)
    if precision == "nvfp4-w4a16":
        from .common import pack_random_experts

        pack_random_experts(model, seed)
    register_with_seams(select=True)
    return model, PRESET_MASK_IDS["llada2.1-mini"], PRESETS["llada2.1-mini"]["eos_token_id"]


def _plain_vocab(model) -> int:
    """Upper bound of random prompt ids: below the special tokens (the preset's sit above 156k; the tiny
    checkpoint's byte tokens are 0..255)."""
    V = model.cfg.vocab_size
    return V - 512 if V > 4096 else 256


def _sync(model) -> None:
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)


class _RoundRecorder:
    """Wraps ``model.forward_chunks``: per round its rows, whether it held a prefill, and its wall time
    (CUDA-synchronised before and after)."""

    def __init__(self, model):
        self.model, self.inner, self.rounds = model, model.forward_chunks, []
        model.forward_chunks = self  # an instance attribute: shadows the method until close()

    def __call__(self, chunks):
        _sync(self.model)
        t0 = time.perf_counter()
        out = self.inner(chunks)
        _sync(self.model)
        rows = sum(int((c.embeds if c.embeds is not None else c.ids).shape[0]) for c in chunks)
        self.rounds.append({"s": time.perf_counter() - t0, "rows": rows, "chunks": len(chunks),
                            "prefill": any(c.start == 0 and c.ids is not None and c.ids.shape[0] > c.block_size
                                           for c in chunks),
                            "kv_positions": sum(c.start + int((c.embeds if c.embeds is not None else c.ids).shape[0])
                                                for c in chunks)})
        return out

    def close(self):
        del self.model.forward_chunks


def _expert_groups(model, chunks, group: int | None = None) -> list[int]:
    """Distinct routed experts read per MoE layer in one ``forward_chunks`` of ``chunks``, summed over
    ``group``-row groups (default: the fixed 128-row groups of the Triton seam, layers.moe.ROW_GROUPS); runs
    one untimed forward."""
    import repro.engine.model as M
    from repro.engine.layers import moe

    group = group or moe.ROW_GROUPS.get(moe._ACTIVE_NAME[0]) or 10**9
    counts: list[int] = []
    real = M.moe_forward

    def counting(x, a, b, w, ids):
        counts.append(sum(int(ids[i:i + group].unique().numel()) for i in range(0, ids.shape[0], group)))
        return real(x, a, b, w, ids)

    M.moe_forward = counting
    try:
        with torch.inference_mode():
            model.forward_chunks(chunks)
    finally:
        M.moe_forward = real
    return counts


def round_bytes(model, rows: int, kv_positions: int, experts_read: list[int]) -> dict:
    """Bytes one batched round reads (module docstring): non-expert weights once per GEMM row tile, routed
    experts as counted, shared experts + router once per MoE row group, K/V of every request's prefix."""
    from repro.engine.layers import moe
    from repro.engine.layers.linear import CUDA_ROW_TILE

    c, p = model.cfg, model.params
    tiles = -(-rows // CUDA_ROW_TILE)
    group = moe.ROW_GROUPS.get(moe._ACTIVE_NAME[0]) or rows
    groups = -(-rows // group)
    nbytes = lambda t: t.numel() * t.element_size()  # noqa: E731
    routed = {n for n in p if n.endswith(("moe.w_gate_up", "moe.w_down"))}
    first_moe = f"layers.{c.first_k_dense_replace}.moe."
    per_expert = sum(nbytes(p[n]) // p[n].shape[0] for n in routed if n.startswith(first_moe))
    router = sum(nbytes(t) for n, t in p.items() if n.endswith(("moe.router", "moe.expert_bias")))
    shared = sum(nbytes(t) for n, t in p.items() if "shared_" in n)
    rest = sum(nbytes(t) for n, t in p.items() if n not in routed and "shared_" not in n and n != "embed"
               and not n.endswith(("moe.router", "moe.expert_bias")))
    b = {"gemm_tiles": tiles, "moe_groups": groups, "dense_weights": rest * tiles,
         "router": router * tiles, "shared_experts": shared * tiles,
         "routed_experts": sum(experts_read) * per_expert, "embed_rows": rows * c.hidden_size * 2,
         "kv_cache": kv_positions * c.num_hidden_layers * 2 * c.num_key_value_heads * c.head_dim * 2}
    b["total"] = sum(v for k, v in b.items() if k not in ("gemm_tiles", "moe_groups"))
    return b


def bench_throughput(model, mask_id: int, prefix: int, tokens: int, batch_sizes, steps: int, copy_gbps: float,
                     seed: int, log) -> list[dict]:
    """Section 1 of the module docstring; one result dict per batch size."""
    from repro.engine.batch import BatchRequest, BatchStats, generate_batch
    from repro.engine.model import Chunk

    dec = _schedule(steps, tokens)
    g = torch.Generator().manual_seed(seed)
    V = _plain_vocab(model)
    out = []
    for bs in batch_sizes:
        n_req = max(2, bs)
        reqs = [BatchRequest(torch.randint(0, V, (prefix,), generator=g).tolist(), dec) for _ in range(n_req)]
        # warm-up (Triton compilation, allocator): two short requests at this batch size
        generate_batch(model, [BatchRequest(r.prompt_ids, {**dec, "max_new_tokens": 32}) for r in reqs[:bs]],
                       mask_id=mask_id, eos_id=-1, batch_size=bs)
        rec = _RoundRecorder(model)
        stats = BatchStats()
        try:
            t0 = time.perf_counter()
            res = generate_batch(model, reqs, mask_id=mask_id, eos_id=-1, batch_size=bs, stats=stats)
            wall = time.perf_counter() - t0
        finally:
            rec.close()
        gen = sum(len(r.raw_ids) for r, _ in res)
        decode = [r for r in rec.rounds if not r["prefill"]]
        full = [r for r in decode if r["chunks"] == bs] or decode
        med = statistics.median(r["s"] for r in full)
        rep = min(full, key=lambda r: abs(r["s"] - med))
        # routing of a representative full round: each request's current block (random ids over its prefix)
        caches = []
        for r in reqs[:bs]:
            cache = model.new_cache(prefix + 32)
            caches.append(Chunk(prefix, cache, 32, ids=torch.randint(0, V, (32,), generator=g).to(model.device)))
        experts = _expert_groups(model, caches)
        del caches
        by = round_bytes(model, rep["rows"], rep["kv_positions"], experts)
        floor_ms = by["total"] / (copy_gbps * 1e9) * 1e3
        row = {"batch_size": bs, "requests": n_req, "generated_tokens": gen, "wall_s": wall,
               "rounds": len(rec.rounds), "decode_rounds": len(decode),
               "tokens_per_s_decode": gen / sum(r["s"] for r in decode),
               "tokens_per_s_with_prefill": gen / wall, "round_ms_median": med * 1e3,
               "rows_per_round": rep["rows"], "distinct_experts_per_layer_mean": statistics.mean(experts),
               "bytes_per_round": by, "floor_ms": floor_ms, "round_over_floor": med * 1e3 / floor_ms,
               "forwards_per_request": res[0][0].forwards}
        log(f"[batch {bs}] {n_req} req x {tokens} tok after P={prefix}: {row['tokens_per_s_decode']:.0f} tok/s "
            f"(decode rounds; {row['tokens_per_s_with_prefill']:.0f} with prefill), round {med * 1e3:.2f} ms, "
            f"floor {floor_ms:.2f} ms ({by['total'] / 1e9:.1f} GB), x{row['round_over_floor']:.2f}, "
            f"{row['distinct_experts_per_layer_mean']:.0f} experts/layer")
        out.append(row)
    return _with_speedup_vs_batch1(out)


def _with_speedup_vs_batch1(rows: list[dict]) -> list[dict]:
    """``rows`` (one per batch size), each given ``speedup_vs_batch1``: its ``tokens_per_s_decode`` over the batch
    size 1 row's (None in every row when no row has batch size 1)."""
    base = next((r for r in rows if r["batch_size"] == 1), None)
    for r in rows:
        r["speedup_vs_batch1"] = r["tokens_per_s_decode"] / base["tokens_per_s_decode"] if base else None
    return rows


def _schedule(steps: int, tokens: int) -> dict:
    """The fixed-schedule decoder of section 1: ``steps`` denoising rounds + 1 commit per block."""
    return {"algorithm": "low_confidence", "threshold": 1.0, "num_to_transfer": 32 // steps,
            "exclude_mask_token": True, "max_new_tokens": tokens}


def bench_batched_graph(model, mask_id: int, prefix: int, tokens: int, batch_sizes, steps: int, copy_gbps: float,
                        seed: int, log, forward="auto", use_graphs=None) -> list[dict]:
    """Section ``batched-graph``: the batched CUDA-graph path (:mod:`repro.engine.batch_graph`) with the fixed
    schedule of section 1, per batch size b: ``b`` requests (``max(2, b)`` at b = 1), aggregate tokens/s over
    the decode rounds (rounds without a prefill block) and with prefill, the median full decode round
    (host fill + replay + the flags read) against its floor (each weight once, the routed experts touched by
    all ``b·32`` rows, lm_head once, every slot's K/V prefix: fastpath_batch.batched_round_bytes), and the
    capture seconds.
    ``forward`` / ``use_graphs``: as :class:`repro.engine.batch_graph.BatchGraphEngine` (CPU tests: torch)."""
    from repro.engine.batch import BatchRequest, BatchStats
    from repro.engine.batch_graph import generate_batch_graph
    from repro.engine.kernels.fastpath import ModelShape
    from repro.engine.kernels.fastpath_batch import batched_round_bytes
    from repro.engine.model import Chunk

    dec = _schedule(steps, tokens)
    g = torch.Generator().manual_seed(seed)
    V = _plain_vocab(model)
    shape = ModelShape.from_config(model.cfg, mask_id)
    out = []
    engine = None
    for bs in batch_sizes:
        n_req = max(2, bs)
        reqs = [BatchRequest(torch.randint(0, V, (prefix,), generator=g).tolist(), dec) for _ in range(n_req)]
        warm = BatchStats()  # capture + Triton compilation: a short run at this batch size (same engine shape)
        _, engine = generate_batch_graph(model, [BatchRequest(r.prompt_ids, dec) for r in reqs[:bs]],
                                         mask_id=mask_id, eos_id=-1, batch_size=bs, stats=warm, engine=engine,
                                         forward=forward, use_graphs=use_graphs)
        stats = BatchStats()
        t0 = time.perf_counter()
        res, engine = generate_batch_graph(model, reqs, mask_id=mask_id, eos_id=-1, batch_size=bs, stats=stats,
                                           engine=engine, forward=forward, use_graphs=use_graphs)
        wall = time.perf_counter() - t0
        gen = sum(len(r.raw_ids) for r, _ in res)
        decode = [t for t, pre in zip(stats.round_s, stats.round_prefill) if not pre]
        med = statistics.median(decode)
        chunks = [Chunk(prefix, model.new_cache(prefix + 32), 32,
                        ids=torch.randint(0, V, (32,), generator=g).to(model.device)) for _ in range(bs)]
        experts = _expert_groups(model, chunks, group=bs * 32)
        del chunks
        packed = getattr(model, "precision", "bf16") == "nvfp4-w4a16"
        floor_b = batched_round_bytes(shape, experts, [prefix] * bs, T=32,
                                      expert_bytes=0.5 + 1 / 16 if packed else None)["total"]
        floor_ms = floor_b / (copy_gbps * 1e9) * 1e3
        row = {"batch_size": bs, "requests": n_req, "generated_tokens": gen, "wall_s": wall,
               "engine": stats.engine, "forward": engine.forward_kind, "forward_note": engine.forward_note,
               "capture_s": warm.capture_s,
               "rounds": stats.rounds, "decode_rounds": len(decode),
               "tokens_per_s_decode": gen / sum(decode), "tokens_per_s_with_prefill": gen / wall,
               "round_ms_median": med * 1e3, "floor_ms": floor_ms, "floor_bytes": floor_b,
               "round_over_floor": med * 1e3 / floor_ms,
               "distinct_experts_per_layer_mean": statistics.mean(experts), "forwards_per_request": res[0][0].forwards}
        log(f"[batched graph {bs}] {n_req} req x {tokens} tok after P={prefix}: {row['tokens_per_s_decode']:.0f} "
            f"tok/s (decode rounds; {row['tokens_per_s_with_prefill']:.0f} with prefill), round {med * 1e3:.2f} ms, "
            f"floor {floor_ms:.2f} ms, x{row['round_over_floor']:.2f}, capture {warm.capture_s:.1f} s "
            f"({row['forward']}, {row['engine']})")
        out.append(row)
    return _with_speedup_vs_batch1(out)


class _NullForward:
    """The batched forward's buffers (:class:`repro.engine.batch_graph.TorchSlotForward`) with a forward that
    computes nothing (logits stay 0): rounds then cost only the engine loop (its pass over the slots), the
    host→device / device→host copies and the on-device step."""

    def __init__(self, model, mask_id: int, max_len: int, slots: int, T: int):
        from repro.engine.batch_graph import slot_buffers

        slot_buffers(self, model, slots, T)

    def forward(self, head: bool = True) -> None:
        """Nothing."""


def bench_handoff(model, mask_id: int, batch_sizes, tokens: int, steps: int, seed: int, log,
                  use_graphs: bool = False) -> list[dict]:
    """Section ``handoff``: rounds/s of the batched graph path's scheduler with :class:`_NullForward` (no
    model compute), per batch size: the per-round host overhead (the loop's pass, control/flags copies, the
    decoder step) that a real round adds to its forward. Runs on the CPU (``use_graphs=False``)."""
    from repro.engine.batch import BatchRequest, BatchStats
    from repro.engine.batch_graph import generate_batch_graph

    dec = _schedule(steps, tokens)
    g = torch.Generator().manual_seed(seed)
    out = []
    for bs in batch_sizes:
        reqs = [BatchRequest(torch.randint(0, 200, (40,), generator=g).tolist(), dec) for _ in range(2 * bs)]
        stats = BatchStats()
        generate_batch_graph(model, reqs, mask_id=mask_id, eos_id=-1, batch_size=bs, stats=stats,
                             forward=_NullForward, use_graphs=use_graphs)
        med = statistics.median(stats.round_s)
        row = {"batch_size": bs, "rounds": stats.rounds, "rounds_per_s": stats.rounds / stats.wall_s,
               "round_ms_median": med * 1e3, "device": str(model.device)}
        log(f"[handoff {bs}] {stats.rounds} rounds, {row['rounds_per_s']:.0f} rounds/s, "
            f"median round {med * 1e3:.3f} ms (null forward, {model.device})")
        out.append(row)
    return out


def bench_graph_batch1(prefix: int, tokens: int, steps: int, seed: int, log) -> dict:
    """The single-request CUDA-graph path with the same fixed schedule (``bench generate``: its own
    ``BlockForward`` weights, random prefix K/V), for comparison with the batched engine's batch sizes."""
    from . import rounds as B

    shape, W, fw, build_s = B.build(seed, prefix + tokens + 128)
    try:
        res = B.bench_generate(shape, W, fw, prefix, tokens, steps, log)
    finally:
        del W, fw
        torch.cuda.empty_cache()
    return {"build_s": build_s, **res}


def bench_invariance(model, mask_id: int, eos_id: int, n_prompts: int, prefix: int, tokens: int, algorithms,
                     seed: int, log, on_algorithm=None, path: str = "eager", **graph_kw) -> dict:
    """Section 2 of the module docstring: ``{algorithm: {"alone_s", "batches": {b: {...}}}}``. ``path``:
    ``"eager"`` (:func:`repro.engine.batch.generate_batch`) or ``"graph"`` (the batched CUDA-graph path,
    :func:`repro.engine.batch_graph.generate_batch_graph`, "alone" = its batch 1; ``graph_kw`` passed on)."""
    from repro.engine.batch import BatchRequest
    from repro.engine.batch import generate_batch as eager_batch

    if path == "graph":
        from repro.engine.batch_graph import generate_batch_graph

        def generate_batch(model, reqs, **kw):
            return generate_batch_graph(model, reqs, **kw, **graph_kw)[0]
    else:
        generate_batch = eager_batch

    g = torch.Generator().manual_seed(seed + 7)
    V = _plain_vocab(model)
    lens = torch.randint(64, prefix + 1, (n_prompts,), generator=g).tolist()
    prompts = [torch.randint(0, V, (n,), generator=g).tolist() for n in lens]
    out = {}
    for algo in algorithms:
        dec = {"algorithm": algo, "max_new_tokens": tokens}
        reqs = [BatchRequest(p, dec) for p in prompts]
        t0 = time.perf_counter()
        alone = [r for r, _ in generate_batch(model, reqs, mask_id=mask_id, eos_id=eos_id, batch_size=1)]
        res = {"alone_s": time.perf_counter() - t0, "batches": {},
               "generated_tokens": [len(r.token_ids) for r in alone]}
        for bs in sorted({8, n_prompts}):
            t0 = time.perf_counter()
            got = [r for r, _ in generate_batch(model, reqs, mask_id=mask_id, eos_id=eos_id, batch_size=bs)]
            ids_eq = [a.token_ids == b.token_ids and a.raw_ids == b.raw_ids for a, b in zip(alone, got)]
            fw_eq = [a.forwards == b.forwards for a, b in zip(alone, got)]
            res["batches"][bs] = {"s": time.perf_counter() - t0, "identical_ids": sum(ids_eq),
                                  "identical_forwards": sum(fw_eq), "of": n_prompts,
                                  "first_mismatch": next((i for i, (x, y) in enumerate(zip(ids_eq, fw_eq))
                                                          if not (x and y)), None)}
            log(f"[invariance {algo}] batch {bs}: ids identical {sum(ids_eq)}/{n_prompts}, forwards identical "
                f"{sum(fw_eq)}/{n_prompts}")
        res["pass"] = all(b["identical_ids"] == b["of"] == b["identical_forwards"] for b in res["batches"].values())
        out[algo] = res
        if on_algorithm is not None:  # save partial results: the run may be cut by its time limit
            on_algorithm(out)
    return out


def table(doc: dict) -> str:
    """The short human-readable summary printed at the end."""
    lines = [f"batched engine on {doc.get('gpu', '?')} (bf16, eager forward + Triton seams), "
             f"copy {doc.get('copy_GBps', 0):.0f} GB/s"]
    thr = doc.get("throughput")
    if isinstance(thr, list):
        lines.append(f"{'batch':>5} {'tok/s':>9} {'x b1':>6} {'round ms':>9} {'floor ms':>9} {'ratio':>6} {'exp/layer':>9}")
        for r in thr:
            lines.append(f"{r['batch_size']:>5} {r['tokens_per_s_decode']:>9.0f} {r['speedup_vs_batch1'] or 0:>6.2f} "
                         f"{r['round_ms_median']:>9.2f} {r['floor_ms']:>9.2f} {r['round_over_floor']:>6.2f} "
                         f"{r['distinct_experts_per_layer_mean']:>9.0f}")
    elif thr is not None:
        lines.append(f"throughput: {thr}")
    g1 = doc.get("graph_batch1")
    if isinstance(g1, dict) and "tokens_per_s" in g1:
        lines.append(f"CUDA-graph path, batch 1, same schedule: {g1['tokens_per_s']:.0f} tok/s, "
                     f"{g1['ms_per_denoise']:.2f} ms/round; batched / graph: " + ", ".join(
                         f"b{r['batch_size']} {r.get('speedup_vs_graph_batch1', 0):.2f}x"
                         for r in (thr if isinstance(thr, list) else [])))
    elif g1 is not None:
        lines.append(f"graph path batch 1: {g1}")
    bg = doc.get("batched_graph")
    if isinstance(bg, list):
        lines.append("batched CUDA-graph path (one replay per round over all slots):")
        lines.append(f"{'batch':>5} {'tok/s':>9} {'x b1':>6} {'round ms':>9} {'floor ms':>9} {'ratio':>6} "
                     f"{'capture s':>9}")
        for r in bg:
            lines.append(f"{r['batch_size']:>5} {r['tokens_per_s_decode']:>9.0f} {r['speedup_vs_batch1'] or 0:>6.2f} "
                         f"{r['round_ms_median']:>9.2f} {r['floor_ms']:>9.2f} {r['round_over_floor']:>6.2f} "
                         f"{r['capture_s']:>9.1f}")
    elif bg is not None:
        lines.append(f"batched graph path: {bg}")
    for key, label in (("invariance", "invariance"), ("invariance_graph", "invariance (batched graph path)")):
        inv = doc.get(key)
        if isinstance(inv, dict) and "error" not in inv:
            for algo, r in inv.items():
                cells = ", ".join(f"b{b}: {v['identical_ids']}/{v['of']} ids, {v['identical_forwards']}/{v['of']} fwd"
                                  for b, v in r["batches"].items())
                lines.append(f"{label} {algo}: {'PASS' if r['pass'] else 'FAIL'} ({cells})")
        elif inv is not None:
            lines.append(f"{label}: {inv}")
    return "\n".join(lines)


def run(args, env_info, copy_bandwidth) -> int:
    """Entry from :func:`repro.engine.bench.__main__.main` (mode ``batch``)."""
    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    doc = {"bench": "repro.engine.bench batch", **env_info(), "prefix": args.prefix, "tokens": args.batch_tokens,
           "invariance_tokens": args.invariance_tokens, "invariance_prompts": args.invariance_prompts}

    def save():
        if args.json:
            with open(args.json, "w") as fh:
                fh.write(json.dumps(doc) + "\n")

    precision = getattr(args, "precision", "bf16")
    sections = {x for x in args.sections.split(",") if x}
    doc["precision"] = precision
    if precision != "bf16" and sections - set(W4_SECTIONS):
        doc["error"] = (f"bench batch --precision {precision} runs the sections {', '.join(W4_SECTIONS)} only; "
                        f"drop {', '.join(sorted(sections - set(W4_SECTIONS)))} from --sections")
        log(doc["error"])
        save()
        print(json.dumps(doc))
        return 2
    try:
        doc["copy_GBps"] = copy_bandwidth()
        t0 = time.perf_counter()
        model, mask_id, eos_id = _model(args.seed, precision)
        _sync(model)
        doc["build_s"] = time.perf_counter() - t0
        log(f"model built in {doc['build_s']:.1f} s; copy bandwidth {doc['copy_GBps']:.0f} GB/s")
    except Exception as e:  # noqa: BLE001
        doc["error"] = f"{type(e).__name__}: {e}"
        doc["traceback"] = traceback.format_exc()
        save()
        print(json.dumps(doc))
        return 1
    sizes = [int(b) for b in args.batch_sizes.split(",") if b]
    algos = [a for a in args.algorithms.split(",") if a]

    def section(name: str, key: str, run) -> None:
        """Run one benchmark section into ``doc[key]``; an error is recorded there (with its traceback) and the
        other sections still run; the JSON is saved after each."""
        if name not in sections:
            return
        try:
            doc[key] = run()
        except Exception as e:  # noqa: BLE001
            doc[key] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
            log(doc[key]["traceback"])
        save()

    def partial(key):  # the invariance sections save each algorithm's result as it finishes
        def keep(out):
            doc[key] = out
            save()
        return keep

    def graph_batch1():
        g = bench_graph_batch1(args.prefix, args.batch_tokens, args.steps_per_block, args.seed, log)
        if isinstance(doc.get("throughput"), list):
            for r in doc["throughput"]:
                r["speedup_vs_graph_batch1"] = r["tokens_per_s_decode"] / g["tokens_per_s"]
        return g

    section("throughput", "throughput", lambda: bench_throughput(
        model, mask_id, args.prefix, args.batch_tokens, sizes, args.steps_per_block, doc["copy_GBps"], args.seed, log))
    section("graph", "graph_batch1", graph_batch1)
    section("batched-graph", "batched_graph", lambda: bench_batched_graph(
        model, mask_id, args.prefix, args.batch_tokens, sizes, args.steps_per_block, doc["copy_GBps"], args.seed, log))
    section("handoff", "handoff", lambda: bench_handoff(
        model, mask_id, sizes, args.batch_tokens, args.steps_per_block, args.seed, log))
    section("invariance-graph", "invariance_graph", lambda: bench_invariance(
        model, mask_id, eos_id, args.invariance_prompts, args.prefix, args.invariance_tokens, algos, args.seed, log,
        on_algorithm=partial("invariance_graph"), path="graph"))
    section("invariance", "invariance", lambda: bench_invariance(
        model, mask_id, eos_id, args.invariance_prompts, args.prefix, args.invariance_tokens, algos, args.seed, log,
        on_algorithm=partial("invariance")))
    log(table(doc))
    print(json.dumps(doc))
    return 0
