"""Measurement helpers shared by the engine benchmarks (the bottom of :mod:`repro.engine.bench`: it imports no
other benchmark module).

* :func:`env_info`: date, torch/triton/CUDA versions and the GPU, for every benchmark's JSON document;
* :func:`copy_bandwidth`: the device-to-device copy bandwidth in GB/s, the memory floor's denominator;
* :func:`time_replays`: CUDA-event times (ms) of single calls of a callable (a CUDA-graph replay);
* :func:`block_ids`: the random 32-token block of a round benchmark (``"issue"`` or ``"half_masked"``);
* :func:`pack_random_experts`: a full-size random model's routed experts as packed NVFP4 (``nvfp4-w4a16``).

All but :func:`env_info` need a CUDA device (``torch.cuda`` errors otherwise).
"""
from __future__ import annotations

import datetime as _dt
import statistics

import torch

__all__ = ["block_ids", "copy_bandwidth", "env_info", "pack_random_experts", "time_replays"]


def env_info() -> dict:
    """``{"date" (UTC, ISO), "torch", "triton" (None when absent)}`` and, with CUDA, ``gpu``, ``sms``,
    ``gpu_mem_GiB``, ``cuda``."""
    info = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "torch": torch.__version__}
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception:  # noqa: BLE001
        info["triton"] = None
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        from ..kernels.configs import tiles_report

        info.update(gpu=p.name, sms=p.multi_processor_count, gpu_mem_GiB=round(p.total_memory / 2**30, 1),
                    cuda=torch.version.cuda, tiles=tiles_report()["summary"])
    return info


def copy_bandwidth(nbytes: int = 2 << 30, iters: int = 20) -> float:
    """Device-to-device copy bandwidth in GB/s, counting bytes read + written (median of ``iters``)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / (statistics.median(ts) * 1e-3) / 1e9


def time_replays(fn, iters: int, warmup: int = 5) -> dict:
    """CUDA-event time of single calls of ``fn`` (ms): median, min, p90 over ``iters`` after ``warmup``."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return {"ms": statistics.median(ts), "ms_min": ts[0], "ms_p90": ts[int(0.9 * (len(ts) - 1))], "n": len(ts)}


def block_ids(shape, seed: int, kind: str = "issue", T: int = 32) -> torch.Tensor:
    """``T`` random token ids (int64, on CUDA, drawn below ``shape.vocab - 512`` with ``seed``); ``kind``
    ``"half_masked"``: the second half replaced by ``shape.mask_id``."""
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    ids = torch.randint(0, shape.vocab - 512, (T,), device="cuda", generator=g)
    if kind == "half_masked":
        ids[T // 2:] = shape.mask_id
    return ids


def pack_random_experts(model, seed: int) -> None:
    """Replace the routed experts of a full-size ``LLaDA2Model.random`` (on CUDA) by random NVFP4 experts kept packed
    (``moe_w4.random_nvfp4_experts``; the shared experts stay BF16) and set ``model.precision = "nvfp4-w4a16"``:
    the weights-only 4-bit mode with the format's real shapes and byte counts, values not a trained model's."""
    from repro.engine.kernels.moe_w4 import random_nvfp4_experts

    cfg = model.cfg
    g4 = torch.Generator(device="cuda").manual_seed(seed + 7)
    E, I, D = cfg.num_experts, cfg.moe_intermediate_size, cfg.hidden_size
    for l in cfg.moe_layers:
        q = f"layers.{l}.moe."
        model.params[q + "w_gate_up"] = random_nvfp4_experts(E, 2 * I, D, 2, torch.bfloat16, "cuda", g4)
        model.params[q + "w_down"] = random_nvfp4_experts(E, D, I, 1, torch.bfloat16, "cuda", g4)
    model.precision = "nvfp4-w4a16"
    torch.cuda.empty_cache()
