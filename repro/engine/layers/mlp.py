"""SwiGLU MLP (docs/engine.md §2: dense layer 0, each routed expert, the shared expert)."""

import torch
import torch.nn.functional as F

from repro.engine.layers.linear import linear


def swiglu(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    """``down(silu(gate(x)) · up(x))`` with the gate and up weights fused row-wise.

    x: ``[n, D]``; w_gate_up: ``[2I, D]`` (rows 0..I-1 = ``gate_proj``, I..2I-1 = ``up_proj``);
    w_down: ``[D, I]``. All in the model dtype; returns ``[n, D]`` in that dtype. No biases (§1).
    Row-invariant products (:func:`repro.engine.layers.linear.linear`): row i depends on ``x[i]`` only.
    """
    h = linear(x, w_gate_up)
    g, u = h.chunk(2, dim=-1)
    return linear(F.silu(g) * u, w_down)
