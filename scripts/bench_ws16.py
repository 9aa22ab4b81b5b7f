"""Time the 16-bit expert GEMMs (gate+up, down) per launch at LLaDA2.1-mini's shapes and the batched round's slot
counts: the warp-specialised Gluon kernels (repro/engine/kernels/moe_ws.py) at a few tile sets against the Triton
kernels at this card's batched tiles (the tile file's entry for S slots, as the batched round reads it), in the same
process on the same routed workspace.

    python3 scripts/bench_ws16.py [--slots 1,8,32] [--iters 50]

GB/s = the bf16 bytes of the experts touched (each once: gate+up 2N·H, down H·N rows per expert) over the time per
launch (CUDA events around ``iters`` launches after a warm-up). The last line is one JSON document.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_w4_ws import _time  # noqa: E402 - the same timing (CUDA events around iters launches, after a warm-up)


def _triton_tiles(slots: int) -> dict:
    """This card's batched expert tiles for ``slots`` (the tile file, by_slots applied), as the batched round."""
    from repro.engine.kernels.configs import load_config
    from repro.engine.kernels.fastpath_batch import for_slots

    out = {}
    for k, d in (("gate_up", dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=3)),
                 ("down", dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=3))):
        out[k] = for_slots(load_config("batched", f"moe_{k}", d, E=257, N=512, H=2048, T=32), slots)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--slots", default="1,8,32")
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args(argv)

    from repro.engine.kernels import moe as M
    from repro.engine.kernels.moe_ws import moe_down_ws16, moe_gate_up_ws16, real_case16
    from repro.engine.kernels.route import moe_tiles

    variants = {"ws16_m64_s4": dict(BLOCK_M=64, STAGES=4), "ws16_m64_s3": dict(BLOCK_M=64, STAGES=3),
                "ws16_m32_s4": dict(BLOCK_M=32, STAGES=4), "ws16_m64_s6": dict(BLOCK_M=64, STAGES=6)}
    rows = []
    for slots in [int(s) for s in args.slots.split(",")]:
        tt = _triton_tiles(slots)
        x, w13, w2, ws, k = real_case16(slots, tt["gate_up"]["BLOCK_M"])
        E1, twoN, H = w13.shape
        N = twoN // 2
        touched = int((ws.counts[:E1] > 0).sum())
        nb = {"gate_up": touched * twoN * H * 2, "down": touched * H * N * 2}
        cases = [("triton", "gate_up", tt["gate_up"]["BLOCK_M"], lambda: M.moe_gate_up(x, w13, ws, k, tt)),
                 ("triton", "down", tt["down"]["BLOCK_M"], lambda: M.moe_down(w2, ws, tt))]
        for name, t in variants.items():
            cases += [(name, "gate_up", t["BLOCK_M"], lambda t=t: moe_gate_up_ws16(x, w13, ws, k, t)),
                      (name, "down", t["BLOCK_M"], lambda t=t: moe_down_ws16(w2, ws, t))]
        for name, kern, bm, fn in cases:
            moe_tiles(ws, bm, static=True)
            try:
                us = _time(fn, args.iters)
            except Exception as e:  # noqa: BLE001 - a variant that does not run is this row's result
                print(f"slots {slots:>3}  {kern:<8} {name:<14} FAILED {type(e).__name__}: {str(e)[:200]}")
                rows.append(dict(slots=slots, kernel=kern, variant=name, error=f"{type(e).__name__}: {e}"[:300]))
                continue
            gbps = nb[kern] / us / 1e3
            rows.append(dict(slots=slots, T=x.shape[0], experts_touched=touched, kernel=kern, variant=name,
                             block_m=bm, us=round(us, 2), gbps=round(gbps, 1)))
            print(f"slots {slots:>3}  T {x.shape[0]:>5}  experts {touched:>3}  {kern:<8} {name:<14} {us:9.2f} µs "
                  f"{gbps:8.1f} GB/s")
        del x, w13, w2, ws
        torch.cuda.empty_cache()
    print(json.dumps(dict(device=torch.cuda.get_device_name(), rows=rows, triton_tiles={s: _triton_tiles(int(s)) for s in
                                                                                      args.slots.split(",")})))
    return 0


if __name__ == "__main__":
    sys.exit(main())
