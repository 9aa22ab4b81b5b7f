"""Tuned launch configurations (block sizes, warps, stages) kept as data.

One JSON file per kernel family and shape, e.g. ``moe_E=257_N=512_H=2048_T=32.json``; inside, one entry
per device name as ``torch.cuda.get_device_name()`` reports it (e.g. ``"NVIDIA H200"``) plus an optional
``"default"``. Each entry maps a kernel name (``"gate_up"``, ``"down"``, ...) to its keyword arguments.
The files are written by ``python -m repro.engine.kernels.tune`` on the device they describe.
"""
from __future__ import annotations

import json
from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parent


def device_name(device=None) -> str:
    """The CUDA device name, or ``"cpu"`` when CUDA is unavailable."""
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(device)
    except Exception:  # noqa: BLE001
        pass
    return "cpu"


def config_path(family: str, **shape) -> Path:
    key = "_".join(f"{k}={v}" for k, v in shape.items())
    return CONFIG_DIR / f"{family}_{key}.json"


def load_config(family: str, kernel: str, default: dict, device=None, **shape) -> dict:
    """Tuned kwargs for ``kernel`` of ``family`` at ``shape`` on this device, else ``default``."""
    path = config_path(family, **shape)
    if path.exists():
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return dict(default)
        for dev in (device_name(device), "default"):
            entry = data.get(dev, {})
            if kernel in entry:
                cfg = dict(default)
                cfg.update(entry[kernel])
                return cfg
    return dict(default)


def save_config(family: str, kernel_cfgs: dict, device=None, extra: dict | None = None, **shape) -> Path:
    """Merge ``{kernel: kwargs}`` into the file for ``family``/``shape`` under this device's name."""
    path = config_path(family, **shape)
    data = {}
    if path.exists():
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            data = {}
    entry = data.setdefault(device_name(device), {})
    entry.update(kernel_cfgs)
    if extra:
        entry.setdefault("_meta", {}).update(extra)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return path
