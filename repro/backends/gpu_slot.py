"""Pin a local GPU job to one device: claim a free GPU with a lock file, set CUDA_VISIBLE_DEVICES.

Snakemake's ``--resources gpu=N`` only counts GPU jobs; it never says which device a job should use
(docs/workflow.md §1.3, measured). So each generation job claims one itself, before CUDA is initialised:

- if ``CUDA_VISIBLE_DEVICES`` names one device (Slurm sets it to the job's allocation, or the user did), or
  none, it is left alone;
- if it names several (``CUDA_VISIBLE_DEVICES=2,3``: the user gives the pipeline those GPUs), the job
  claims one of them, so two jobs never share the first of the list;
- else the GPUs are counted with ``nvidia-smi -L`` (no CUDA context is created) and the job claims one.

Claiming = taking the first device, in the listed order, whose lock file ``<lock_dir>/gpu<id>.lock`` it
can lock (``fcntl.flock``, released when the process exits, also on ``kill -9``), then setting
``CUDA_VISIBLE_DEVICES=<id>``. With more concurrent jobs than GPUs (a ``--resources gpu`` cap above the GPU
count) the extra job fails with a message naming the cap, rather than sharing a device.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
from pathlib import Path


class GpuSlotError(RuntimeError):
    """No free GPU: more concurrent GPU jobs than devices."""


def count_gpus() -> int:
    """Number of NVIDIA GPUs listed by ``nvidia-smi -L`` (0 when the tool is absent or fails)."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return 0
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def claim_gpu(lock_dir: str | os.PathLike) -> tuple[str | None, object | None]:
    """Claim a GPU for this process (see module docstring). Returns ``(device id, lock file handle)``: the id
    as ``CUDA_VISIBLE_DEVICES`` now names it (an index such as ``"1"``, or a UUID when the user's list held
    UUIDs); keep the handle open for the life of the job. ``(None, None)`` when ``CUDA_VISIBLE_DEVICES``
    already named one device or none, or no GPU is listed (the caller's own device check then reports a
    missing GPU).

    Raises:
        GpuSlotError: every GPU is claimed by another running job.
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        candidates = [d.strip() for d in visible.split(",") if d.strip()]
        if len(candidates) <= 1:
            return None, None
    else:
        candidates = [str(i) for i in range(count_gpus())]
        if not candidates:
            return None, None
    lock_dir = Path(lock_dir)
    lock_dir.mkdir(parents=True, exist_ok=True)
    for dev in candidates:
        f = open(lock_dir / f"gpu{re.sub(r'[^A-Za-z0-9_.-]', '_', dev)}.lock", "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            continue
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        os.environ["CUDA_VISIBLE_DEVICES"] = dev
        return dev, f
    n = len(candidates)
    raise GpuSlotError(f"all {n} GPUs ({','.join(candidates)}) are claimed by other running generation jobs (locks "
                       f"in {lock_dir}); cap concurrent GPU jobs at the number of GPUs: --resources gpu={n}")
