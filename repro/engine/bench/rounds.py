"""Benchmark of one denoising round and of a whole generation at the memory floor (targets: docs/perf_model.md §4).

    python -m repro.engine.bench round     [--prefixes 1024,4096] [--iters 50] [--naive-iters 3] [--no-w4]
                                           [--variants a,b] [--w4-variants a,b] [--breakdown]
                                           [--breakdown-variants a,b]
    python -m repro.engine.bench generate  [--prefix 1024] [--tokens 1024] [--steps-per-block 8]
    python -m repro.engine.bench all       (both, one model build; last line = one JSON with both)
    python -m repro.engine.bench decode    [--prefix 1024] [--decode-tokens 256] [--precision bf16|nvfp4-w4a16]
    python -m repro.engine.bench batch     batched generation: tokens/s at batch 1/8/32, round vs floor,
                                           batch invariance (repro/engine/bench/batch.py)

The command line is :mod:`repro.engine.bench.__main__` (it runs ``batch`` through :mod:`.batch`); this module
holds the modes' measurements and their parser (:func:`build_parser`) and :func:`run`.

Needs only torch + triton and a CUDA GPU. Builds LLaDA2.1-mini in its real shapes (docs/engine.md §1/§3:
20 layers, hidden 2048, 16 Q / 4 KV heads x 128, dense layer 0 (5120), 19 MoE layers of 256 experts x 512
+ shared 512, vocab 157184) with deterministic random bf16 weights (router + expert bias fp32) on the GPU,
a KV cache with a random prefix of P tokens, and a 32-token block.

``round``: for each block kind (``BLOCKS``: the headline "issue" block of 32 distinct random tokens, the block the
targets are stated for (docs/perf_model.md §4), and a "half_masked" block) and prefix P: the engine round (``kernels.fastpath.BlockForward``: the whole forward +
lm_head over the 32 positions + fp32 argmax/confidence/entropy, one CUDA graph) timed as the median of
CUDA-event timings of single graph replays after warm-up; the distinct routed experts per MoE layer
(measured on that block); the bytes that round must read (``fastpath.round_bytes``: every weight it
touches once + KV of [0, P+32)); achieved GB/s = bytes / time; the device-to-device copy bandwidth
measured in the same run ((read + write bytes) / time, 2 GiB buffers); the floor = bytes / copy
bandwidth and ratio = time / floor. Then the naive reference (``fastpath.reference_forward``: eager bf16,
per-expert loop with a host sync per expert, the model's remote-code style) timed the same way, its
ratio to the engine, and a check of the engine's logits against it (relative error, argmax agreement).

Then (unless ``--no-w4``) the weights-only 4-bit round (precision ``nvfp4-w4a16``) on the same block, cache
and copy bandwidth: :mod:`repro.engine.bench.w4`, with the BF16 round's fastest variant (``--w4-variants``: others
timed on it too). Variants: :mod:`repro.engine.bench.variants` (``--variants`` picks them). ``--breakdown``: a
table of µs per kernel launch by role for one round of each (CUDA-graph replays under torch.profiler,
:mod:`repro.engine.bench.profiling`), for the session-5 default ``norm_in_route`` and the fastest variant.

``generate``: P-token random prefix, then ``tokens`` new tokens in blocks of 32 with a fixed commit
schedule (each denoise round commits the ``32/steps`` most confident masked positions, on device; after
``steps`` rounds a commit forward writes the block's final K/V and advances the device-side cache
length), so the number of forwards does not depend on the random weights. Two CUDA graphs (denoise
forward + decode step; commit forward + cache advance) are replayed with no host sync inside the
generation. Reported: wall time (first event to last), GPU busy time (sum of per-replay event
intervals), GPU idle time between rounds = wall - busy, tokens/s, ms per forward.

Targets (docs/perf_model.md §4; reported, never asserted): ratio <= 1.15 at P=1k, <= 1.2 at P=4k; naive/engine >= 80;
GPU idle < 3% of the generation's wall time. The last line printed is one JSON document.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from .cli import emit_json
from .common import block_ids, copy_bandwidth, env_info, pack_random_experts, time_replays
from .variants import (ROUND_VARIANTS, VARIANTS, breakdowns as _breakdowns, round_w4 as _round_w4,
                       set_variant as _set_variant, time_variants)

TARGETS = {"ratio_1k": 1.15, "ratio_4k": 1.2, "naive_over_engine": 80.0, "gpu_idle_frac": 0.03}


def build(seed: int = 0, max_len: int = 4096 + 128, configs=None):
    from ..kernels import fastpath as F

    shape = F.preset_shape("llada2.1-mini")
    t0 = time.perf_counter()
    W = F.random_weights(shape, "cuda", torch.bfloat16, seed=seed)
    fw = F.BlockForward(W, shape, max_len, T=32, device="cuda", configs=configs)
    g = torch.Generator(device="cuda")
    g.manual_seed(seed + 1)
    fw.kv.normal_(0.0, 1.0, generator=g)
    torch.cuda.synchronize()
    return shape, W, fw, time.perf_counter() - t0


# Block contents. "issue": 32 distinct random tokens — the block the targets are stated for (docs/perf_model.md
# §4; the first measurement on it saw ≈151 distinct experts per MoE layer, ≈19.3 GB per round), the headline.
# "half_masked": 16 random tokens + 16 <|mask|>: the 16 masks share one embedding, so with random weights their
# routing is correlated and fewer experts are touched (≈108), which lowers the floor and makes the fixed per-layer
# cost weigh more; reported beside it.
BLOCKS = {"issue": "32 distinct random tokens (the targets' block)", "half_masked": "16 random tokens + 16 masks"}


def bench_round(shape, W, fw, prefixes, iters, naive_iters, copy_bw, profile_path=None, log=print,
                variants=ROUND_VARIANTS):
    """Time one denoising round (graph replay, head included) for every block kind × prefix.

    Variants are timed on the headline block ("issue") at every prefix; the best over all prefixes is kept
    and then timed on every (block, prefix). The naive reference runs on the headline block. Returns one
    dict per (block, prefix) with ms, GB/s, distinct experts, bytes, floor and ratio.
    """
    from ..kernels import fastpath as F

    cases = {}  # (kind, P) -> (ids, distinct, bytes, floor_ms)
    _set_variant(fw, "base")
    for kind in BLOCKS:
        for P in prefixes:
            ids = block_ids(shape, 100 + P, kind)
            fw.ids.copy_(ids)
            fw.cache_len.fill_(P)
            distinct = fw.distinct_experts()
            nb = F.round_bytes(shape, distinct, P, fw.T)
            cases[kind, P] = (ids, distinct, nb, nb["total"] / (copy_bw * 1e9) * 1e3)
    times = time_variants(fw, variants, prefixes, {P: cases["issue", P][0] for P in prefixes}, iters, log)
    ok = [n for n in variants if "error" not in times.get(n, {"error": 1})]
    best = min(ok, key=lambda n: sum(times[n][q]["ms"] for q in prefixes))  # best over all prefixes
    _set_variant(fw, best)
    graph = fw.capture(head=True)
    results = []
    for (kind, P), (ids, distinct, nb, floor_ms) in cases.items():
        fw.ids.copy_(ids)
        fw.cache_len.fill_(P)
        t = time_replays(graph.replay, iters)
        eng = dict(t, variant=best, GBps=nb["total"] / (t["ms"] * 1e-3) / 1e9, ratio=t["ms"] / floor_ms)
        r = {"prefix": P, "block_kind": kind, "block": BLOCKS[kind], "engine": eng,
             "distinct_experts_mean": sum(distinct) / len(distinct),
             "distinct_experts_per_layer": distinct, "bytes_GB": nb["total"] / 1e9,
             "bytes_by_item_MB": {k: round(v / 1e6, 2) for k, v in nb.items()},
             "copy_GBps": copy_bw, "floor_ms": floor_ms}
        if kind == "issue":
            r["variants_ms"] = {n: times[n][P]["ms"] if "error" not in times[n] else times[n]["error"]
                                for n in variants}
        log(f"[round {kind} P={P}] engine ({best}) {eng['ms']:.3f} ms, {eng['GBps']:.0f} GB/s, "
            f"D={r['distinct_experts_mean']:.1f}, {r['bytes_GB']:.2f} GB, floor {floor_ms:.3f} ms, "
            f"ratio {eng['ratio']:.3f}")
        if naive_iters > 0 and kind == "issue":
            graph.replay()
            torch.cuda.synchronize()
            ref = F.reference_forward(W, shape, fw.kv, P, ids)  # warm-up + check
            lg = fw.logits.float()
            rf = ref.float()
            r["check"] = {"logits_rel_err": float((lg - rf).norm() / rf.norm()),
                          "argmax_agree": float((lg.argmax(-1) == rf.argmax(-1)).float().mean())}
            # noise floor: the same reference with the MoE in fp32 (moe_reference) instead of the bf16 loop;
            # routing near-ties flip under bf16 rounding, so two correct bf16 paths differ by about this much
            from ..kernels import moe as M

            r32 = F.reference_forward(W, shape, fw.kv, P, ids, moe_fn=M.moe_reference).float()
            r["check"]["ref_fp32moe_vs_naive_rel_err"] = float((r32 - rf).norm() / rf.norm())
            r["check"]["ref_fp32moe_vs_naive_argmax_agree"] = float((r32.argmax(-1) == rf.argmax(-1)).float().mean())
            r["check"]["engine_vs_ref_fp32moe_rel_err"] = float((lg - r32).norm() / r32.norm())
            del ref, lg, rf, r32
            tn = time_replays(lambda: F.reference_forward(W, shape, fw.kv, P, ids), naive_iters, warmup=0)
            r["naive"] = dict(tn, GBps=nb["total"] / (tn["ms"] * 1e-3) / 1e9, ratio=tn["ms"] / floor_ms)
            r["naive_over_engine"] = tn["ms"] / eng["ms"]
            log(f"[round P={P}] naive {tn['ms']:.1f} ms, naive/engine {r['naive_over_engine']:.1f}x, "
                f"check {r['check']}")
        results.append(r)
    if profile_path:
        fw.ids.copy_(cases["issue", prefixes[0]][0])
        fw.cache_len.fill_(prefixes[0])
        _profile(fw, profile_path, log)
    del graph
    return results


def _profile(fw, path, log):
    """Per-kernel device times of one eager forward (torch.profiler), written to ``path``."""
    try:
        from torch.profiler import ProfilerActivity, profile

        fw.forward()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
            fw.forward()
            torch.cuda.synchronize()
        ka = prof.key_averages()
        try:
            table = ka.table(sort_by="self_device_time_total", row_limit=40)
        except Exception:  # noqa: BLE001
            table = ka.table(sort_by="self_cuda_time_total", row_limit=40)
        with open(path, "w") as fh:
            fh.write(table)
        log(table[:6000])
    except Exception as exc:  # noqa: BLE001
        log(f"profile failed: {exc!r}")


def bench_generate(shape, W, fw, prefix, tokens, steps, log=print):
    T = fw.T
    assert T % steps == 0 and tokens % T == 0
    k_per = T // steps
    blocks = tokens // T
    mask_id = shape.mask_id
    out = torch.zeros(tokens, dtype=torch.long, device="cuda")
    blk = torch.zeros(1, dtype=torch.long, device="cuda")
    ar = torch.arange(T, device="cuda")

    def decode_step():
        masked = fw.ids == mask_id
        score = torch.where(masked, fw.conf, torch.full_like(fw.conf, -1.0))
        idx = torch.topk(score, k_per).indices
        new = torch.where(masked[idx], fw.pred[idx], fw.ids[idx])
        fw.ids.index_copy_(0, idx, new)

    def commit_step():
        out.index_copy_(0, blk * T + ar, fw.ids)
        fw.cache_len.add_(T)
        blk.add_(1)
        fw.ids.fill_(mask_id)

    fw.cache_len.fill_(prefix)
    fw.ids.fill_(mask_id)
    g_den = fw.capture(head=True, extra=decode_step)
    g_com = fw.capture(head=False, extra=commit_step)

    def run():
        fw.cache_len.fill_(prefix)
        fw.ids.fill_(mask_id)
        blk.zero_()
        torch.cuda.synchronize()
        ev = []
        h0 = time.perf_counter()
        for _ in range(blocks):
            for _ in range(steps):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                g_den.replay()
                b.record()
                ev.append((a, b, "denoise"))
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            g_com.replay()
            b.record()
            ev.append((a, b, "commit"))
        host_enqueue_s = time.perf_counter() - h0
        torch.cuda.synchronize()
        host_s = time.perf_counter() - h0
        busy = {"denoise": [], "commit": []}
        for a, b, kind in ev:
            busy[kind].append(a.elapsed_time(b))
        wall = ev[0][0].elapsed_time(ev[-1][1])
        tot_busy = sum(busy["denoise"]) + sum(busy["commit"])
        return {"wall_ms": wall, "host_wall_ms": host_s * 1e3, "host_enqueue_ms": host_enqueue_s * 1e3,
                "gpu_busy_ms": tot_busy, "gpu_idle_ms": wall - tot_busy, "gpu_idle_frac": (wall - tot_busy) / wall,
                "ms_per_denoise": statistics.median(busy["denoise"]), "ms_per_commit": statistics.median(busy["commit"]),
                "tokens_per_s": tokens / (wall * 1e-3)}

    run()  # warm-up
    res = run()
    n_gen = int((out != mask_id).sum().item())
    res.update(prefix=prefix, tokens=tokens, blocks=blocks, steps_per_block=steps,
               forwards={"denoise": blocks * steps, "commit": blocks}, tokens_committed=n_gen,
               host_syncs_inside_generation=0,
               note="prefix K/V random (no prefill timed); fixed schedule: 32/steps most confident masked "
                    "positions committed per round, on device")
    log(f"[generate] {tokens} tokens after P={prefix}: wall {res['wall_ms']:.1f} ms, busy {res['gpu_busy_ms']:.1f} ms, "
        f"idle {res['gpu_idle_ms']:.2f} ms ({100 * res['gpu_idle_frac']:.2f}%), {res['tokens_per_s']:.0f} tok/s, "
        f"denoise {res['ms_per_denoise']:.3f} ms, commit {res['ms_per_commit']:.3f} ms")
    del g_den, g_com
    return res


def bench_decode(prefix: int, tokens: int, algorithms=("joint_threshold", "low_confidence"), seed: int = 0,
                 eager_tokens: int = 64, log=print, precision: str = "bf16") -> dict:
    """The engine's own decode loop at full size: :func:`repro.engine.decode_loop.generate_ids` with the real
    decoders over :class:`repro.engine.graph.GraphBackend` (every forward a CUDA-graph replay) on
    ``LLaDA2Model.random`` (LLaDA2.1-mini preset, bf16), a prompt of ``prefix`` random token ids and
    ``tokens`` new tokens; the first algorithm again with the host-driven decoders over the same forward
    graphs; then the eager engine path (``CachedBackend`` with the Triton seams) for ``eager_tokens`` tokens.
    Reports per run: wall ms (CUDA-synchronised), forwards, ms per replay (GPU, CUDA events around each
    replay; a round replay includes the on-device decoder step), GPU-idle fraction of the wall time (host
    gaps: one flag read per round with the device step; host decoder work and syncs without), tokens/s, TPF. With
    random weights the number of steps per block is whatever the decoder decides (confidences are low, so
    mostly the one-token fallback), so tokens/s here is a lower bound for a trained model.
    """
    from repro.engine.config import LLaDA2Config
    from repro.engine.decode_loop import CachedBackend, generate_ids
    from repro.engine.graph import GraphBackend
    from repro.engine.kernels import register_with_seams
    from repro.engine.model import LLaDA2Model
    from repro.engine.presets import PRESET_MASK_IDS, PRESETS

    cfg = LLaDA2Config.from_dict(PRESETS["llada2.1-mini"])
    t0 = time.perf_counter()
    model = LLaDA2Model.random(cfg, device="cuda", dtype="bf16", seed=seed, with_adapter=False)
    if precision == "nvfp4-w4a16":
        pack_random_experts(model, seed)
    out_mem = torch.cuda.memory_allocated() / 1e9
    mask_id, eos_id = PRESET_MASK_IDS["llada2.1-mini"], PRESETS["llada2.1-mini"]["eos_token_id"]
    gb = GraphBackend(model, mask_id)
    torch.cuda.synchronize()
    out = {"build_s": time.perf_counter() - t0, "prefix": prefix, "tokens": tokens, "runs": {},
           "precision": precision, "model_GB_allocated": out_mem}
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, cfg.vocab_size - 512, (prefix,), generator=g).tolist()

    def run(backend, algo, n):
        torch.cuda.synchronize()
        h0 = time.perf_counter()
        with torch.inference_mode():
            r = generate_ids(backend, prompt, {"algorithm": algo}, mask_id=mask_id, eos_id=eos_id, max_new_tokens=n)
        torch.cuda.synchronize()
        return r, (time.perf_counter() - h0) * 1e3

    def timed(algo, step_on_device):
        gb.device_steps = step_on_device  # off: generate_ids drives the host decoders over the forward graphs
        try:
            run(gb, algo, 64)  # warm-up: graph capture
            gb.events = []
            r, wall = run(gb, algo, tokens)
            ev = gb.events
        finally:
            gb.events = None
            gb.device_steps = True
        busy = sum(a.elapsed_time(b) for a, b in ev)
        n_fwd = len(ev)  # prefill blocks + denoise rounds + commit replays
        res = {"wall_ms": wall, "replays": n_fwd, "forwards": r.forwards, "gpu_replay_ms": busy,
               "ms_per_replay": busy / max(n_fwd, 1), "gpu_busy_frac": busy / wall,
               "gpu_idle_frac": 1 - busy / wall, "generated_tokens": len(r.raw_ids),
               "tokens_per_s": len(r.raw_ids) / (wall * 1e-3), "tpf": len(r.raw_ids) / max(
                   r.forwards["denoise"] + r.forwards["commit"], 1)}
        where = "device step in the round graph" if step_on_device else "host decoders"
        log(f"[decode {algo}, {where}] {len(r.raw_ids)} tokens after P={prefix}: wall {wall:.0f} ms, "
            f"{n_fwd} replays, {res['ms_per_replay']:.3f} ms/replay, GPU idle {100 * res['gpu_idle_frac']:.1f}%, "
            f"{res['tokens_per_s']:.0f} tok/s, TPF {res['tpf']:.2f}")
        return res

    for algo in algorithms:
        out["runs"][algo] = timed(algo, True)
    out["runs"][algorithms[0] + "+host_decoders"] = timed(algorithms[0], False)
    out["capture_s"] = gb.capture_s
    del gb
    register_with_seams(select=True)
    eb = CachedBackend(model)
    algo = algorithms[0]
    run(eb, algo, 32)
    r, wall = run(eb, algo, eager_tokens)
    n = r.forwards["prefill"] + r.forwards["denoise"] + r.forwards["commit"]
    out["eager"] = {"algorithm": algo, "wall_ms": wall, "forwards": r.forwards, "ms_per_forward": wall / n,
                    "tokens_per_s": len(r.raw_ids) / (wall * 1e-3)}
    log(f"[decode eager {algo}] {len(r.raw_ids)} tokens: wall {wall:.0f} ms, {wall / n:.2f} ms/forward "
        f"(incl. decoder), {out['eager']['tokens_per_s']:.0f} tok/s")
    del eb, model
    torch.cuda.empty_cache()
    return out


#: the modes of :func:`build_parser` (``batch`` runs :func:`repro.engine.bench.batch.run`)
MODES = ("round", "generate", "decode", "all", "batch")


def build_parser(commands: dict[str, str] | None = None) -> argparse.ArgumentParser:
    """The command line of ``python -m repro.engine.bench`` (every option with its help and default).
    ``commands``: the benchmarks with a parser of their own (name -> what it measures), listed among the modes
    and in the epilog (``repro.engine.bench.__main__`` passes them and runs them before this parser sees them)."""
    commands = commands or {}
    epilog = None
    if commands:
        width = max(map(len, commands))
        epilog = "benchmarks with options of their own (python -m repro.engine.bench NAME --help):\n" + "\n".join(
            f"  {n:<{width}}  {what}" for n, what in commands.items())
    ap = argparse.ArgumentParser(prog="python -m repro.engine.bench", epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 description="LLaDA2.1-mini engine benchmarks on a CUDA GPU: denoising round, "
                                             "generation, decode loop (docs/perf.md)")
    ap.add_argument("mode", choices=[*MODES, *commands], metavar="MODE",
                    help="round: one denoising round vs its memory floor; generate: a fixed-schedule generation; "
                         "decode: the engine's decode loop (GPU idle); all: round + generate; batch: batched "
                         "generation and batch invariance (repro/engine/bench/batch.py); "
                         + (", ".join(commands) + ": see below" if commands else ""))
    ap.add_argument("--prefixes", default="1024,4096", help="round: prefix lengths P in tokens (default: %(default)s)")
    ap.add_argument("--iters", type=int, default=50, help="round: timed graph replays per variant, median "
                                                            "reported (default: %(default)s)")
    ap.add_argument("--naive-iters", type=int, default=3, help="round: timed runs of the naive eager reference; 0 "
                                                                "skips it (default: %(default)s)")
    ap.add_argument("--prefix", type=int, default=1024, help="generate/decode/batch: prefix length P in tokens "
                                                              "(default: %(default)s)")
    ap.add_argument("--tokens", type=int, default=1024, help="generate: new tokens (default: %(default)s)")
    ap.add_argument("--steps-per-block", type=int, default=8, help="generate: denoising steps per 32-token block "
                                                                    "of the fixed schedule (default: %(default)s)")
    ap.add_argument("--decode-tokens", type=int, default=256,
                    help="decode mode: new tokens per request (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random weights and tokens (default: %(default)s)")
    ap.add_argument("--profile", default=None, help="write a per-kernel profile table to this file")
    ap.add_argument("--json", default=None, help="also write the JSON document to this file")
    ap.add_argument("--batch-sizes", default="1,8,32",
                    help="batch mode: batch sizes (repro/engine/bench/batch.py) (default: %(default)s)")
    ap.add_argument("--invariance-prompts", type=int, default=32,
                    help="batch mode: prompts of the invariance check (default: %(default)s)")
    ap.add_argument("--invariance-tokens", type=int, default=32,
                    help="batch mode: new tokens per invariance prompt (default: %(default)s)")
    ap.add_argument("--batch-tokens", type=int, default=256,
                    help="batch mode: new tokens per throughput request (default: %(default)s)")
    ap.add_argument("--sections", default="throughput,graph,invariance",
                    help="batch mode: which parts to run, comma-separated: throughput, graph, batched-graph, handoff, "
                         "invariance, invariance-graph (repro/engine/bench/batch.py) (default: %(default)s)")
    ap.add_argument("--algorithms", default="joint_threshold,orl", help="batch mode: decoders of the invariance check "
                    "(default: %(default)s)")
    ap.add_argument("--precision", default="bf16", choices=["bf16", "nvfp4-w4a16"],
                    help="decode and batch modes, round with --tensor-parallel-size: the model's precision "
                    "(nvfp4-w4a16: random NVFP4 routed experts, kept packed; batch mode: sections batched-graph and invariance-graph only) (default: %(default)s)")
    ap.add_argument("--variants", default=None, help="round: comma-separated BlockForward variants to time (names "
                    "of bench.variants.VARIANTS; default ROUND_VARIANTS); the fastest is the round's engine")
    ap.add_argument("--w4-variants", default=None, help="round: also time these variants on the 4-bit round (default "
                    "tiles), e.g. norm_in_route,norm_in_route+pdl")
    ap.add_argument("--breakdown", action="store_true", help="round: per-kernel table of one round (torch.profiler "
                    "over graph replays) for the BF16 and 4-bit rounds, P = first prefix, default and best variants")
    ap.add_argument("--breakdown-variants", default=None, help="round: the variants of the --breakdown tables "
                    "(comma-separated; default norm_in_route and the fastest), e.g. the old and the new path of a "
                    "change side by side")
    ap.add_argument("--tensor-parallel-size", type=int, default=1, metavar="N",
                    help="round: split the round over N GPUs (repro/engine/bench/parallel.py: eager, at --precision: "
                         "bf16, or nvfp4-w4a16 with the packed experts split by expert; times N = 1 and N in the same "
                         "call, and the time in collectives; default: %(default)s, the single-GPU round)")
    ap.add_argument("--no-w4", action="store_true", help="round/all: skip the weights-only 4-bit (nvfp4-w4a16) "
                    "round (repro/engine/bench/w4.py) that otherwise follows the BF16 round")
    return ap


def run(args: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    """Modes ``round``, ``generate``, ``decode``, ``all`` of ``args`` (from :func:`build_parser`, ``ap``: for
    its errors) on the CUDA device; prints progress on stderr and the JSON document last. Returns the exit status."""
    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    if args.tensor_parallel_size != 1:  # one round over N GPUs (repro/engine/bench/parallel.py)
        from repro.engine.bench.parallel import main_round

        if args.mode != "round":
            print(json.dumps({"error": "--tensor-parallel-size applies to the round benchmark only"}))
            return 2
        return main_round(args, log, env_info)
    doc = {"bench": "repro.engine.bench", "mode": args.mode, **env_info(), "targets": TARGETS}
    prefixes = [int(p) for p in args.prefixes.split(",") if p]
    max_len = max(prefixes + [args.prefix + args.tokens]) + 128
    if args.mode == "decode":
        doc["decode"] = bench_decode(args.prefix, args.decode_tokens, log=log, precision=args.precision)
        return emit_json(doc, args.json)
    copy_bw = copy_bandwidth()
    log(f"copy bandwidth {copy_bw:.0f} GB/s")
    shape, W, fw, build_s = build(args.seed, max_len)
    doc["build_s"] = build_s
    doc["copy_GBps"] = copy_bw
    from ..kernels import moe as M

    doc["configs"] = {k: M._cfg(k, None, shape.hidden, shape.moe_inter, shape.experts + 1, 32)
                      for k in ("router", "route", "gate_up", "down")}
    doc["configs"]["dense"] = fw.dense_cfg
    doc["configs"]["attn"] = {"NSPLIT": fw.aws.nsplit, "BLOCK_N": fw.aws.block_n, "num_warps": fw.aws.num_warps,
                              "num_stages": fw.aws.num_stages, "MIN_KEYS": fw.aws.min_keys,
                              "BLOCK_M": fw.aws.block_m}
    if args.mode in ("round", "all"):
        names = [v for v in (args.variants or "").split(",") if v] or list(ROUND_VARIANTS)
        bnames = [v for v in (args.breakdown_variants or "").split(",") if v]
        unknown = [v for v in names + bnames + [v for v in (args.w4_variants or "").split(",") if v]
                   if v not in VARIANTS]
        if unknown:
            ap.error(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
        doc["round"] = bench_round(shape, W, fw, prefixes, args.iters, args.naive_iters, copy_bw, args.profile, log,
                                   variants=names)
        best = doc["round"][0]["engine"]["variant"]
        fw4 = _round_w4(args, doc, shape, W, fw, prefixes, copy_bw, best, log)
        if args.breakdown:
            doc["breakdown"] = _breakdowns(shape, fw, fw4, prefixes[0], best, log, names=bnames or None)
    if args.mode in ("generate", "all"):
        doc["generate"] = bench_generate(shape, W, fw, args.prefix, args.tokens, args.steps_per_block, log)
    doc["copy_GBps_end"] = copy_bandwidth()
    summ = {}
    for r in doc.get("round", []):
        tag = "" if r["block_kind"] == "issue" else f"_{r['block_kind']}"
        summ[f"ratio_P{r['prefix']}{tag}"] = round(r["engine"]["ratio"], 4)
        summ[f"ms_P{r['prefix']}{tag}"] = round(r["engine"]["ms"], 4)
        summ[f"D_P{r['prefix']}{tag}"] = round(r["distinct_experts_mean"], 1)
        if "naive_over_engine" in r:
            summ[f"naive_over_engine_P{r['prefix']}"] = round(r["naive_over_engine"], 1)
    for r in doc.get("round_w4", {}).get("round", []):
        tag = "" if r["block_kind"] == "issue" else f"_{r['block_kind']}"
        summ[f"w4_ms_P{r['prefix']}{tag}"] = round(r["ms"], 4)
        summ[f"w4_ratio_P{r['prefix']}{tag}"] = round(r["ratio"], 4)
    if "round_w4" in doc:
        summ["w4_model_GB"] = round(doc["round_w4"]["model_GB"], 2)
    if "generate" in doc:
        summ["gpu_idle_frac"] = round(doc["generate"]["gpu_idle_frac"], 5)
        summ["tokens_per_s"] = round(doc["generate"]["tokens_per_s"], 1)
    doc["summary"] = summ
    return emit_json(doc, args.json)

