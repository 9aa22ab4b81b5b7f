"""Time the 4-bit gate+up and down GEMMs per launch at LLaDA2.1-mini's shapes: the warp-specialised Gluon kernel
(repro/engine/kernels/moe_w4_ws.py, plus its separate shared-expert launch) against the Triton hop-layout decode-5
kernels (default and swap-AB), in the same process on the same routed workspace (tile table, BLOCK_M 16).

    python3 scripts/bench_w4_ws.py [--slots 1,32] [--iters 200] [--stages 4] [--maxnreg 64]

GB/s = the packed bytes of the routed experts touched (q + s of w13 or w2, each once) plus the shared expert's bf16
rows, over the
time per launch (CUDA events around ``iters`` launches after a warm-up). The last line is one JSON document.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _time(fn, iters: int) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1000.0 / iters  # µs per launch


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--slots", default="1,32")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--stages", type=int, default=4)
    ap.add_argument("--maxnreg", type=int, default=64, help="registers per thread at launch (0: no cap)")
    args = ap.parse_args(argv)

    from repro.engine.kernels import moe as M
    from repro.engine.kernels.moe_w4 import random_nvfp4_experts
    from repro.engine.kernels.moe_w4_ws import moe_down_ws, moe_gate_up_ws, real_gate_up_case

    rows = []
    for slots in [int(s) for s in args.slots.split(",")]:
        x, w13, ws, k = real_gate_up_case(slots)
        touched = int((ws.counts[: ws.E] > 0).sum())
        H, N = x.shape[1], w13.shape[1] // 2
        nbytes = touched * (w13.q[0].numel() + w13.s[0].numel()) + w13.shared.numel() * 2
        tiles = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=3, W4_DECODE=5)
        cases = {
            "triton_decode5": lambda: M.moe_gate_up(x, w13, ws, k, {"gate_up": tiles}),
            "triton_decode5_swap": lambda: M.moe_gate_up(x, w13, ws, k, {"gate_up": dict(tiles, W4_SWAP=True)}),
            "gluon_ws": lambda: moe_gate_up_ws(x, w13, ws, k, dict(STAGES=args.stages, MAXNREG=args.maxnreg)),
            "gluon_ws_shared_in": lambda: moe_gate_up_ws(x, w13, ws, k, dict(STAGES=args.stages, MAXNREG=args.maxnreg, SH_IN=True)),
            "gluon_ws_routed_only": lambda: moe_gate_up_ws(x, w13, ws, k, dict(STAGES=args.stages, MAXNREG=args.maxnreg), shared=False),
        }
        g = torch.Generator(device="cuda").manual_seed(7)
        w2 = random_nvfp4_experts(256, H, N, 1, torch.bfloat16, "cuda", g).with_layout("hop")
        w2 = w2.with_shared((torch.randn(H, N, device="cuda", generator=g) * 0.02).to(torch.bfloat16))
        dt = dict(BLOCK_M=16, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=3, W4_DECODE=5)
        down = {
            "down_triton_decode5": lambda: M.moe_down(w2, ws, {"down": dt}),
            "down_triton_decode5_swap": lambda: M.moe_down(w2, ws, {"down": dict(dt, W4_SWAP=True)}),
            "down_gluon_ws": lambda: moe_down_ws(w2, ws, dict(STAGES=args.stages, MAXNREG=args.maxnreg)),
            "down_gluon_ws_shared_in": lambda: moe_down_ws(w2, ws, dict(STAGES=args.stages, MAXNREG=args.maxnreg, SH_IN=True)),
            "down_gluon_ws_routed_only": lambda: moe_down_ws(w2, ws, dict(STAGES=args.stages, MAXNREG=args.maxnreg), shared=False),
        }
        for name, fn in {**cases, **down}.items():
            us = _time(fn, args.iters)
            nb = nbytes if not name.startswith("down") else \
                touched * (w2.q[0].numel() + w2.s[0].numel()) + w2.shared.numel() * 2
            rows.append(dict(slots=slots, T=x.shape[0], experts_touched=touched, kernel=name, us=round(us, 2),
                             gbps=round(nb / us / 1e3, 1)))
            print(f"slots {slots:>3}  T {x.shape[0]:>5}  experts {touched:>3}  {name:<26} {us:9.2f} µs "
                  f"{nb / us / 1e3:8.1f} GB/s")
    dev = torch.cuda.get_device_name()
    print(json.dumps(dict(device=dev, H=H, N=N, rows=rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
