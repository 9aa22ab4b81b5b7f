"""One tensor-parallel denoising round, timed: ``python -m repro.engine.bench round --tensor-parallel-size N``.

What is timed (every rank, in lockstep through :mod:`repro.engine.ranks`): random weights in the real shapes
(:data:`repro.engine.presets.LLADA21_MINI`, each rank drawing only its slices,
:meth:`repro.engine.parallel.ShardedModel.random`), a prefix of P random tokens prefilled into the rank's KV
cache, then ``iters`` rounds of one 32-token block at position P — a round being the block forward plus the
greedy on-device decoder step (:class:`repro.engine.decoders.device.DeviceStep`, ``joint_threshold``), as the
engine runs a greedy round. Rounds run eagerly (no CUDA graph yet on this path), after ``warmup`` untimed ones.

Measured per rank: ``ms_per_round`` (wall time of the ``iters`` rounds between two device synchronisations and
a barrier, divided by ``iters``); ``collective_ms_per_round``: the time inside the collectives — on GPUs CUDA
events recorded on the rank's stream around each NCCL call (:attr:`repro.engine.parallel.Comm.timings`), so it
includes waiting for the slowest rank to arrive; on the CPU the seconds of each synchronous gloo call. The
minimum over ranks is the best estimate of the transfers themselves, the maximum adds the ranks' skew.
``collectives_per_round``: calls per round (2 per layer + 2 for the argmax / confidence reduction).

Runs on the CPU too (gloo; ``config`` = a small config.json dict) — the test that keeps this code working.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist


def time_round(model, req: dict) -> dict:
    """Every rank: prefill ``req["prefix"]`` tokens, time ``req["iters"]`` rounds (module docstring)."""
    from repro.engine.decoders import DecoderConfig
    from repro.engine.decoders.device import DeviceStep

    P, iters, B = int(req["prefix"]), int(req["iters"]), 32
    dev, V = model.device, model.cfg.vocab_size
    mask_id = int(req.get("mask_id", V - 1))
    g = torch.Generator().manual_seed(int(req.get("seed", 0)))  # same tokens on every rank
    ids = torch.randint(0, V, (P + B,), generator=g).to(dev)
    block = ids[P:].clone()
    block[B // 2:] = mask_id  # half the block masked: M2T and T2T both have work
    editable = torch.ones(B, dtype=torch.bool, device=dev)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    with torch.inference_mode():
        cache = model.new_cache(P + B)
        if P:
            model.forward(ids[:P], 0, cache, B, logits=False)
        cfg = DecoderConfig.from_dict({"algorithm": "joint_threshold"})
        tok = torch.zeros(B, dtype=torch.long, device=dev)
        emb = torch.zeros(B, model.cfg.hidden_size, dtype=model.dtype, device=dev)
        st = DeviceStep(cfg, mask_id, model, tok, emb)

        def one_round():
            st.start_block(block, editable)
            st.step(model.forward(st.tokens, P, cache, B))

        for _ in range(int(req.get("warmup", 3))):
            one_round()
        sync()
        dist.barrier()
        model.comm.timings, calls0 = [], model.comm.calls
        t0 = time.perf_counter()
        for _ in range(iters):
            one_round()
        sync()
        wall = time.perf_counter() - t0
        timings, model.comm.timings = model.comm.timings, None
    coll = sum(s.elapsed_time(e) / 1e3 for s, e in timings) if timings and isinstance(timings[0], tuple) \
        else sum(timings)
    return {"rank": model.comm.rank, "ms_per_round": 1e3 * wall / iters, "collective_ms_per_round": 1e3 * coll / iters,
            "collectives_per_round": (model.comm.calls - calls0) / iters}


def teacher_forced(model, req: dict):
    """Every rank: one block-causal forward of ``req["ids"]`` (block ``req["block_size"]``, 32 by default) from
    position 0; rank 0 returns the full-vocabulary logits ``[n, V]`` fp32 on the CPU (the slices gathered), the
    others None. The N-rank side of the "logits within rounding of one GPU" check (docs/perf.md)."""
    ids = torch.tensor(req["ids"], dtype=torch.long, device=model.device)
    B = int(req.get("block_size", 32))
    with torch.inference_mode():
        cache = model.new_cache(-(-len(ids) // B) * B)
        full = model.vocab.full(model.forward(ids, 0, cache, B))
    return full.cpu() if model.comm.rank == 0 else None


def run(n: int, prefixes: list[int], iters: int, device: str = "cuda", precision: str = "bf16", seed: int = 0,
        config: dict | None = None, kernels: str = "torch", warmup: int = 3, timeout_s: float = 300.0) -> dict:
    """Start ``n`` ranks (:class:`repro.engine.ranks.Ranks`) on random weights of ``config`` (default: the
    LLaDA2.1-mini preset), time a round at each prefix, stop them. Returns ``{"tensor_parallel_size", "rounds":
    [{"prefix", "ms_per_round" (rank 0), "collective_ms_per_round" {min, max, by_rank}, "collectives_per_round"}]}``.
    Raises ValueError for a size that does not split the model or GPUs too few, TensorParallelError on a rank's
    failure."""
    from repro.engine.config import LLaDA2Config
    from repro.engine.parallel import parallel_problem
    from repro.engine.presets import LLADA21_MINI, PRESET_MASK_IDS
    from repro.engine.ranks import Ranks, check_devices

    config = config or LLADA21_MINI
    why = parallel_problem(LLaDA2Config.from_dict(config), n)
    if why:
        raise ValueError(why)
    check_devices(device, n)
    mask_id = PRESET_MASK_IDS["llada2.1-mini"] if config is LLADA21_MINI else config["vocab_size"] - 1
    ranks = Ranks(dict(config=config, seed=seed, precision=precision, device=device, kernels=kernels), n, timeout_s)
    out = []
    try:
        for P in prefixes:
            req = dict(prefix=P, iters=iters, warmup=warmup, seed=seed, mask_id=mask_id)
            r0, rest = ranks.call("repro.engine.bench.parallel:time_round", req)
            by_rank = [round(r["collective_ms_per_round"], 4) for r in [r0] + rest]
            out.append({"prefix": P, "ms_per_round": round(r0["ms_per_round"], 4),
                        "collective_ms_per_round": {"min": min(by_rank), "max": max(by_rank), "by_rank": by_rank},
                        "collectives_per_round": r0["collectives_per_round"]})
    finally:
        ranks.close()
    return {"tensor_parallel_size": n, "device": device, "precision": precision, "kernels": kernels,
            "path": "eager (no CUDA graph)", "rounds": out}


def main_round(args, log, env_info) -> int:
    """``bench round --tensor-parallel-size N``: N = 1 (the same sharded eager code on one GPU; its one-rank
    collectives are copies) and N GPUs in the same call; prints the JSON document."""
    from repro.engine.bench.cli import emit_json

    try:
        import triton  # noqa: F401

        kernels = "triton"
    except ImportError:
        kernels = "torch"
    prefixes = [int(p) for p in args.prefixes.split(",") if p]
    doc = {"bench": "repro.engine.bench", "mode": "round", **env_info(), "runs": []}
    for n in sorted({1, args.tensor_parallel_size}):
        log(f"[tp round] {n} rank(s), prefixes {prefixes}, {args.iters} rounds each")
        r = run(n, prefixes, args.iters, "cuda", args.precision, args.seed, kernels=kernels)
        for x in r["rounds"]:
            log(f"[tp round] N={n} P={x['prefix']}: {x['ms_per_round']:.3f} ms/round, in collectives "
                f"{x['collective_ms_per_round']['min']:.3f}-{x['collective_ms_per_round']['max']:.3f} ms "
                f"({x['collectives_per_round']:.0f} calls)")
        doc["runs"].append(r)
    base = {x["prefix"]: x["ms_per_round"] for x in doc["runs"][0]["rounds"]}
    doc["summary"] = {f"ratio_N{args.tensor_parallel_size}_over_1_P{x['prefix']}": round(x["ms_per_round"] / base[x["prefix"]], 3)
                      for x in doc["runs"][-1]["rounds"]}
    return emit_json(doc, args.json)
