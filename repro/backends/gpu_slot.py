"""Pin a local GPU job to one device: claim a free GPU index with a lock file, set CUDA_VISIBLE_DEVICES.

Snakemake's ``--resources gpu=N`` only counts GPU jobs; it never says which device a job should use
(docs/workflow.md §1.3, measured). So each generation job claims one itself, before CUDA is initialised:

- if ``CUDA_VISIBLE_DEVICES`` is already set (Slurm sets it for the job's allocation, or the user did),
  it is left alone;
- else the GPUs are counted with ``nvidia-smi -L`` (no CUDA context is created), and the job takes the
  lowest index whose lock file ``<lock_dir>/gpu<i>.lock`` it can lock (``fcntl.flock``, released when the
  process exits, also on ``kill -9``), and sets ``CUDA_VISIBLE_DEVICES=<i>``.

With more concurrent jobs than GPUs (a ``--resources gpu`` cap above the GPU count) the extra job fails
with a message naming the cap, rather than sharing a device.
"""

from __future__ import annotations

import fcntl
import os
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


def claim_gpu(lock_dir: str | os.PathLike) -> tuple[int | None, object | None]:
    """Claim a GPU for this process (see module docstring). Returns ``(index, lock file handle)``; keep the
    handle open for the life of the job. ``(None, None)`` when ``CUDA_VISIBLE_DEVICES`` was already set or
    no GPU is listed (the caller's own device check then reports a missing GPU).

    Raises:
        GpuSlotError: every GPU is claimed by another running job.
    """
    if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
        return None, None
    n = count_gpus()
    if n == 0:
        return None, None
    lock_dir = Path(lock_dir)
    lock_dir.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        f = open(lock_dir / f"gpu{i}.lock", "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            continue
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        os.environ["CUDA_VISIBLE_DEVICES"] = str(i)
        return i, f
    raise GpuSlotError(f"all {n} GPUs are claimed by other running generation jobs (locks in {lock_dir}); "
                       f"cap concurrent GPU jobs at the number of GPUs: --resources gpu={n}")
