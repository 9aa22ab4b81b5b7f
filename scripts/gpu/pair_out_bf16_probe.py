"""Probe (not the engine's contract): a benchmark run with the MoE workspaces' pair outputs stored in bf16 instead of
fp32, to size the lead of docs/perf.md ("The warp-specialised 16-bit expert GEMM": the down GEMM's fp32 pair rows,
75 MB a layer at 32 slots, written and read back by the top-k sum). The down kernels' stores round to the buffer's
dtype; the top-k sum (norm.add_rmsnorm) then adds the bf16 rows in bf16 (a real change would add them in fp32: the
same bytes, so the same time). Speed only: its numbers are not the engine's.

    python3 scripts/gpu/pair_out_bf16_probe.py batch --sections batched-graph --batch-sizes 32   # then the same
    python3 -m repro.engine.bench batch --sections batched-graph --batch-sizes 32                # fp32, to compare
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from repro.engine.bench.__main__ import main  # noqa: E402
from repro.engine.kernels import route  # noqa: E402

_init = route.MoEWorkspace.__init__


def _bf16_pairs(self, *a, **kw):
    _init(self, *a, **kw)
    self.pair_out = self.pair_out.to(torch.bfloat16)


route.MoEWorkspace.__init__ = _bf16_pairs
print("probe: MoEWorkspace.pair_out in bf16")
sys.exit(main(sys.argv[1:]))
