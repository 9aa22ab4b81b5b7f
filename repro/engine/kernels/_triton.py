"""Optional Triton import shared by the kernel modules.

``HAS_TRITON`` is False when triton is not installed; the plain PyTorch references still work then.
``INTERPRET`` is True under ``TRITON_INTERPRET=1`` (kernels run on CPU tensors through Triton's
interpreter; fp32/fp16 are correct there, bf16 loads are not, seen with triton 3.9).
``require_tested_triton()`` (the engine calls it when it selects the Triton kernels on CUDA) and
``kernels_usable(t)`` on a CUDA tensor refuse a Triton other than the tested one (``repro/stack.py``: RuntimeError,
one line naming the version needed; ``REPRO_ALLOW_UNTESTED_TRITON=1`` lets it run); the interpreter takes any.
``compiled(t)`` / ``capability(t)``: whether launches on ``t`` run compiled for a GPU, and for which compute
capability — the one place the host code asks (e.g. the 4-bit decode a card builds). While :mod:`repro.engine.aot`
records the launches for a card, every tensor counts as a tensor on a card of that capability.
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
    gdc_wait = gdc_launch_dependents = None

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (>= 1)."""
    return 1 << max(0, (int(n) - 1).bit_length())


#: the compute capability whose launches :mod:`repro.engine.aot` is recording (``recording``), or None
_RECORDING: list = [None]
_CAPABILITY: dict = {}  # CUDA device index -> (major, minor), read once per device


def compiled(t) -> bool:
    """Whether kernels launched on tensor ``t`` run compiled for a GPU: a CUDA tensor outside the interpreter, or any
    tensor while :mod:`repro.engine.aot` records launches."""
    return _RECORDING[0] is not None or (bool(t.is_cuda) and not INTERPRET)


def capability(t) -> tuple[int, int] | None:
    """Compute capability (major, minor) of the card ``t``'s kernels are compiled for, None when they are not
    (:func:`compiled`)."""
    if _RECORDING[0] is not None:
        return _RECORDING[0]
    if not compiled(t):
        return None
    cc = _CAPABILITY.get(t.device.index)
    if cc is None:
        import torch

        cc = _CAPABILITY[t.device.index] = tuple(torch.cuda.get_device_capability(t.device))
    return cc



def kernels_usable(t) -> bool:
    """True when Triton kernels can run on tensor ``t``: CUDA tensor, or any tensor under the interpreter (or while
    :mod:`repro.engine.aot` records launches). RuntimeError on a CUDA tensor when the installed Triton is not the
    tested one (module docstring)."""
    if not HAS_TRITON:
        return False
    if _RECORDING[0] is not None:
        return True
    if t.is_cuda:
        require_tested_triton()
    return bool(t.is_cuda) or INTERPRET


_TRITON_CHECKED = []  # non-empty once the installed Triton passed the check (checked at the first CUDA launch)


def require_tested_triton() -> None:
    """RuntimeError (one line: installed and needed version, the fix) unless the installed Triton is the tested
    release of ``repro/stack.py`` or ``REPRO_ALLOW_UNTESTED_TRITON=1``; a no-op under the interpreter."""
    if INTERPRET or not HAS_TRITON or _TRITON_CHECKED:
        return
    from repro.stack import ALLOW_UNTESTED_ENV, triton_problem

    problem = triton_problem(triton.__version__)
    if problem and os.environ.get(ALLOW_UNTESTED_ENV) != "1":
        raise RuntimeError(problem)
    _TRITON_CHECKED.append(True)


# ---- programmatic dependent launch (PDL): overlap a kernel's launch/prologue with its predecessor ----
# Each kernel takes a ``USE_PDL`` constexpr; when set it calls griddepcontrol.launch_dependents and then
# griddepcontrol.wait before touching anything a previous kernel wrote (so correctness never depends on
# the launch order), and it is launched with ``launch_pdl=True``. Off by default; the benchmark measures
# both. Needs triton with ``launch_pdl`` (3.4+) and sm_90+.
HAS_PDL = False
if HAS_TRITON:
    try:
        from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait  # noqa: F401
        from triton.backends.nvidia.compiler import CUDAOptions

        HAS_PDL = "launch_pdl" in getattr(CUDAOptions, "__dataclass_fields__", {})
    except Exception:  # noqa: BLE001
        HAS_PDL = False
if not HAS_PDL and HAS_TRITON:

    @triton.jit
    def gdc_wait():  # noqa: D103 - never traced (USE_PDL is False without support)
        pass

    @triton.jit
    def gdc_launch_dependents():  # noqa: D103
        pass

_PDL = [False]


def set_pdl(on: bool) -> bool:
    """Enable/disable PDL launches for kernels launched from now on; returns the effective state."""
    _PDL[0] = bool(on) and HAS_PDL and not INTERPRET
    return _PDL[0]


def pdl() -> dict:
    """Launch kwargs: ``dict(USE_PDL=..., launch_pdl=...)`` (launch_pdl only when enabled)."""
    return dict(USE_PDL=True, launch_pdl=True) if _PDL[0] else dict(USE_PDL=False)
