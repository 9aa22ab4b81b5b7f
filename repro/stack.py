"""The tested GPU stack: the one place that names the Python, torch, Triton and CUDA the engine is measured on.

Read by the engine image's definition (``repro/containers.py`` renders ``containers/engine.def.j2`` with these
pins), by the engine's kernels (``repro/engine/kernels/_triton.py`` refuses another Triton on the GPU), and
checked against ``pyproject.toml``'s ``kernels`` extra, ``docs/perf.md`` and ``containers/images.yaml`` by
``tests/plumbing/test_containers.py``. Change a version here, there, and re-measure (docs/perf.md).

Contract
--------
* :data:`TESTED` -- the versions every GPU measurement in docs/perf.md ran with (the device tool's H100/H200
  machines: Python 3.12, ``torch 2.11.0+cu130``, ``triton 3.6.0``, CUDA 13.0; /work/.library device notes).
  ``torch==2.11.0`` on PyPI is that CUDA 13.0 build (its wheel requires the ``nvidia-*-cu13`` wheels, which
  carry the CUDA libraries, and ``triton==3.6.0``), so the image installs both from PyPI on a CUDA 13.0 base
  (the driver comes from the host through ``apptainer exec --nv``). The base image itself is
  ``containers/images.yaml``'s (its tag names this CUDA and an Ubuntu whose python3 is this Python).
* "Tested Triton" means the same release ``X.Y.Z`` (a local suffix such as ``+git1234`` is ignored) for
  compiled GPU kernels. Under Triton's CPU interpreter (``TRITON_INTERPRET=1``, CI) any installed Triton is
  accepted: the interpreter checks what a kernel computes, not the compiled code path that was measured.
* ``pyproject.toml``: the ``kernels`` extra pins ``torch`` and ``triton`` to :data:`TESTED` (a GPU machine's
  install); the ``kernels-cpu`` extra asks for a Triton whose CPU interpreter runs the kernel tests
  (>= :data:`INTERPRETER_MIN_TRITON`): Triton 3.6's interpreter fails ``tests/kernels/test_attention.py``
  (``TypeError: only 0-dimensional arrays can be converted to Python scalars``, measured on the CPU with
  torch 2.13), 3.9's passes. ``scripts/setup.sh`` picks ``kernels`` where ``nvidia-smi`` lists a GPU.
* :func:`triton_problem(version)` -- one line naming the installed and the needed version and the fix, or
  None when ``version`` is the tested release.
"""

from __future__ import annotations

import re

#: the tested stack (docs/perf.md, "Machine"); the engine image pins exactly these
TESTED = {
    "python": "3.12",
    "torch": "2.11.0",
    "triton": "3.6.0",
    "cuda": "13.0",
}
#: the oldest Triton whose CPU interpreter runs the kernel tests (the ``kernels-cpu`` extra)
INTERPRETER_MIN_TRITON = "3.9"
#: set to 1 to run the GPU kernels on a Triton other than the tested one (a developer trying a new release)
ALLOW_UNTESTED_ENV = "REPRO_ALLOW_UNTESTED_TRITON"


def release(version: str) -> str:
    """``"3.6.0+git1a2b" -> "3.6.0"``, ``"2.11.0+cu130" -> "2.11.0"``: the public release of a version string."""
    m = re.match(r"\d+(?:\.\d+)*", str(version).strip())
    return m.group(0) if m else str(version).strip()


def triton_problem(version: str) -> str | None:
    """One line when Triton ``version`` is not the tested release (module docstring), else None."""
    need = TESTED["triton"]
    if release(version) == need:
        return None
    return (f"Triton {version} is installed, but the engine's GPU kernels are tested with triton=={need} "
            f"(torch=={TESTED['torch']}, repro/stack.py): install it (pip install 'triton=={need}', or the "
            f"package's 'kernels' extra), or set {ALLOW_UNTESTED_ENV}=1 to run an untested Triton anyway")
