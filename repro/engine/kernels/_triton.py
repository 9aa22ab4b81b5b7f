"""Optional Triton import shared by the kernel modules.

``HAS_TRITON`` is False when triton is not installed; the plain PyTorch references still work then.
``INTERPRET`` is True under ``TRITON_INTERPRET=1`` (kernels run on CPU tensors through Triton's
interpreter; fp32/fp16 are correct there, bf16 loads are not, seen with triton 3.9).
"""
from __future__ import annotations

import os

try:  # pragma: no cover - depends on the environment
    import triton
    import triton.language as tl

    HAS_TRITON = True
except Exception:  # noqa: BLE001 - triton missing or broken: references only
    triton = None
    tl = None
    HAS_TRITON = False

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (>= 1)."""
    return 1 << max(0, (int(n) - 1).bit_length())


def kernels_usable(t) -> bool:
    """True when Triton kernels can run on tensor ``t``: CUDA tensor, or any tensor under the interpreter."""
    if not HAS_TRITON:
        return False
    return bool(t.is_cuda) or INTERPRET
