"""The engine as it was before its MoE pair rows went to bf16, for an A/B in one device call: runs a
``repro.engine.bench`` command with every :class:`~repro.engine.kernels.route.MoEWorkspace` built with
``pair_dtype=torch.float32`` (the down GEMM's rows stored in fp32; the top-k sum reads them as before). Everything
else is the engine's own code, so the difference to the same command without this script is the pair rows' dtype.

    python3 scripts/gpu/pair_rows_fp32.py batch --sections batched-graph --batch-sizes 32   # fp32 pair rows
    python3 -m repro.engine.bench batch --sections batched-graph --batch-sizes 32           # the engine (bf16)
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from repro.engine.bench.__main__ import main  # noqa: E402
from repro.engine.kernels import route  # noqa: E402

_init = route.MoEWorkspace.__init__


def _fp32_rows(self, *a, **kw):
    _init(self, *a, **{**kw, "pair_dtype": torch.float32})


route.MoEWorkspace.__init__ = _fp32_rows
print("A/B: MoEWorkspace pair rows in fp32 (the engine before bf16 pair rows)")
sys.exit(main(sys.argv[1:]))
