"""Tuned launch configurations (block sizes, warps, stages) kept as data, looked up for the card in use.

One JSON file per kernel family and shape, e.g. ``moe_E=257_N=512_H=2048_T=32.json``; inside, one entry per card
name as ``torch.cuda.get_device_name()`` reports it (e.g. ``"NVIDIA H200"``) plus an optional ``"default"``. Each
entry maps a kernel name (``"gate_up"``, ``"down"``, ...) to its keyword arguments, and its ``"_meta"`` says how
it was made and, under ``"card"``, the card it was tuned on (compute capability, SM count, memory bandwidth). The
files are written by ``python -m repro.engine.kernels.tune`` on the card they describe.

Lookup (:func:`load_config`), per kernel: this card's own entry → an entry tuned on a card of the same
architecture (same compute capability), nearest in SM count and memory bandwidth (:func:`nearest_cards`) → the
file's ``"default"`` entry → the caller's built-in defaults. Any step past the first prints one line, once per
process and card, naming the card, its architecture, the entry used and the tune command (:func:`tiles_report`
gives the same as data: the generation record, provenance and the speed table say which entry ran). On the CPU
no lookup is made (built-in defaults) and nothing is printed.
"""
from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parent

#: the command a user runs to tune a new card (quick mode: a few candidates per kernel, ≤ 10 minutes on an H100)
TUNE_COMMAND = "python -m repro.engine.kernels.tune --quick"

#: memory bandwidth (GB/s, datasheet) by card name, for cards whose properties do not give the memory clock
_SPEC_BANDWIDTH = (("H200", 4800), ("H100 NVL", 3900), ("H100 PCIe", 2000), ("H100", 3350), ("GH200", 4000),
                   ("B200", 8000), ("B100", 8000), ("A100-SXM4-80GB", 2039), ("A100 80GB PCIe", 1935),
                   ("A100", 1555), ("L40S", 864), ("L40", 864), ("RTX 4090", 1008), ("RTX 5090", 1792),
                   ("RTX 6000 Ada", 960), ("A10", 600), ("L4", 300))

_ARCH_NAMES = {(8, 0): "Ampere", (8, 6): "Ampere", (8, 7): "Ampere", (8, 9): "Ada", (9, 0): "Hopper",
               (10, 0): "Blackwell", (10, 3): "Blackwell", (12, 0): "Blackwell (consumer)"}


@dataclass(frozen=True)
class Card:
    """A CUDA card as the tile lookup sees it: ``name`` (``torch.cuda.get_device_name()``), compute capability
    ``cc`` (major, minor), ``sms`` (multiprocessors), ``bandwidth_GBps`` (memory bandwidth, GB/s: from the memory
    clock and bus width, else the datasheet figure of :data:`_SPEC_BANDWIDTH`, else None) and ``mem_GB``."""

    name: str
    cc: tuple[int, int]
    sms: int
    bandwidth_GBps: float | None = None
    mem_GB: float | None = None

    @property
    def arch(self) -> str:
        """``"sm_90"`` for compute capability 9.0."""
        return f"sm_{self.cc[0]}{self.cc[1]}"

    @property
    def family(self) -> str:
        """The architecture's name (``"Hopper"``), or the ``arch`` where it is not known."""
        return _ARCH_NAMES.get(tuple(self.cc), self.arch)

    def meta(self) -> dict:
        """The ``_meta["card"]`` record of a tuned entry (JSON-ready)."""
        d = asdict(self)
        d["cc"] = f"{self.cc[0]}.{self.cc[1]}"
        return d

    @classmethod
    def from_meta(cls, name: str, meta: dict) -> "Card | None":
        """The card of an entry's ``_meta["card"]`` record, or None when it has none or it is malformed."""
        try:
            major, minor = (int(x) for x in str(meta["cc"]).split("."))
            return cls(name, (major, minor), int(meta["sms"]), meta.get("bandwidth_GBps"), meta.get("mem_GB"))
        except (KeyError, TypeError, ValueError):
            return None


def spec_bandwidth(name: str) -> float | None:
    """Datasheet memory bandwidth (GB/s) of a card by its name (first match in :data:`_SPEC_BANDWIDTH`)."""
    for key, bw in _SPEC_BANDWIDTH:
        if key in name:
            return float(bw)
    return None


def current_card(device=None) -> Card | None:
    """The :class:`Card` of CUDA device ``device`` (default: the current one), or None without CUDA."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        p = torch.cuda.get_device_properties(device)
    except Exception:  # noqa: BLE001 - no usable CUDA: the CPU
        return None
    clock_khz, bus_bits = getattr(p, "memory_clock_rate", 0) or 0, getattr(p, "memory_bus_width", 0) or 0
    bw = 2 * clock_khz * 1e3 * bus_bits / 8 / 1e9 if clock_khz and bus_bits else spec_bandwidth(p.name)
    return Card(p.name, (p.major, p.minor), p.multi_processor_count, round(bw, 1) if bw else None,
                round(p.total_memory / 1e9, 1))


def device_name(device=None) -> str:
    """The CUDA device name, or ``"cpu"`` when CUDA is unavailable."""
    card = current_card(device)
    return card.name if card is not None else "cpu"


def config_path(family: str, **shape) -> Path:
    key = "_".join(f"{k}={v}" for k, v in shape.items())
    return CONFIG_DIR / f"{family}_{key}.json"


def _distance(a: Card, b: Card) -> float:
    """How far card ``b`` is from ``a``: |log SM ratio| + |log bandwidth ratio| (a missing bandwidth counts 0)."""
    d = abs(math.log(max(b.sms, 1) / max(a.sms, 1)))
    if a.bandwidth_GBps and b.bandwidth_GBps:
        d += abs(math.log(b.bandwidth_GBps / a.bandwidth_GBps))
    return d


def nearest_cards(data: dict, card: Card) -> list[str]:
    """Entry names of ``data`` (one config file) tuned on another card of ``card``'s compute capability, nearest
    first (:func:`_distance`; ties by name). Entries without a ``_meta["card"]`` record are not candidates."""
    found = []
    for name, entry in data.items():
        if name in (card.name, "default") or not isinstance(entry, dict):
            continue
        other = Card.from_meta(name, (entry.get("_meta") or {}).get("card") or {})
        if other is not None and tuple(other.cc) == tuple(card.cc):
            found.append((_distance(card, other), name))
    return [n for _, n in sorted(found)]


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _order(data: dict, card: Card | None) -> list[str]:
    """Entry names to try for ``card``, in lookup order (module doc)."""
    if card is None:
        return []
    return [card.name, *nearest_cards(data, card), "default"]


_warned: set[str] = set()


def load_config(family: str, kernel: str, default: dict, device=None, **shape) -> dict:
    """Tuned kwargs for ``kernel`` of ``family`` at ``shape`` on this card (lookup order in the module doc), merged
    over ``default``; ``default`` itself on the CPU, without a file, or when no entry has the kernel. A fallback
    past the card's own entry prints one line once per process (:func:`tiles_report`)."""
    card = current_card(device)
    path = config_path(family, **shape)
    if card is None or not path.exists():
        return dict(default)
    data = _read(path)
    for name in _order(data, card):
        entry = data.get(name)
        if isinstance(entry, dict) and kernel in entry:
            if name != card.name:
                _warn_once(card)
            cfg = dict(default)
            cfg.update(entry[kernel])
            return cfg
    if card.name not in data and any(isinstance(e, dict) for e in data.values()):
        _warn_once(card)  # a file tuned for other cards only; a kernel no entry has keeps its defaults silently
    return dict(default)


def _entry_used(data: dict, card: Card) -> str | None:
    """The entry that serves most of a file's kernels on ``card``: the first in lookup order that exists."""
    for name in _order(data, card):
        if isinstance(data.get(name), dict) and any(not k.startswith("_") for k in data[name]):
            return name
    return None


def tiles_report(device=None) -> dict:
    """Which tuned entries the engine reads on this card, for records and tables.

    Returns ``{"card", "arch", "family", "files": {file stem: entry name or None (built-in defaults)},
    "status": "tuned" | "borrowed" | "default" | "mixed" | "cpu", "summary": one sentence}``, e.g. summary
    ``"tiles tuned on NVIDIA H200, used on NVIDIA H100 80GB HBM3"``. On the CPU: status ``"cpu"``, summary
    ``"no GPU tiles (CPU)"``."""
    card = current_card(device)
    if card is None:
        return {"card": "cpu", "arch": None, "family": None, "files": {}, "status": "cpu",
                "summary": "no GPU tiles (CPU)"}
    files = {p.stem: _entry_used(_read(p), card) for p in sorted(CONFIG_DIR.glob("*.json"))}
    used = set(files.values())
    if used == {card.name}:
        status, summary = "tuned", f"tiles tuned on this card ({card.name})"
    elif len(used) == 1 and None not in used and "default" not in used:
        status, summary = "borrowed", f"tiles tuned on {used.pop()}, used on {card.name}"
    elif used <= {None, "default"}:
        status, summary = "default", f"built-in default tiles: no tuned entry for {card.name} ({card.arch})"
    else:
        status = "mixed"
        parts = sorted({f"{stem.split('_')[0]}: {n or 'built-in defaults'}" for stem, n in files.items()})
        summary = f"tiles on {card.name} from " + "; ".join(parts)
    return {"card": card.name, "arch": card.arch, "family": card.family, "files": files, "status": status,
            "summary": summary}


def _warn_once(card: Card) -> None:
    """Print, once per process and card, that this card runs tiles it was not tuned with (module doc)."""
    if card.name in _warned:
        return
    _warned.add(card.name)
    rep = tiles_report()
    what = ("not every kernel family is tuned for" if rep["status"] == "mixed" else "no kernel tiles tuned for")
    print(f"repro engine: {what} {card.name} ({card.arch}, {card.family}): {rep['summary']}; speed may be well "
          f"below what this card can do. Tune it (about 10 min): {TUNE_COMMAND}", file=sys.stderr, flush=True)


def save_config(family: str, kernel_cfgs: dict, device=None, extra: dict | None = None, **shape) -> Path:
    """Merge ``{kernel: kwargs}`` into the file for ``family``/``shape`` under this card's name, with the card's
    record (:meth:`Card.meta`) and ``extra`` in the entry's ``_meta``. Raises RuntimeError without CUDA."""
    card = current_card(device)
    if card is None:
        raise RuntimeError("save_config: no CUDA card to save tuned tiles for")
    path = config_path(family, **shape)
    data = _read(path) if path.exists() else {}
    entry = data.setdefault(card.name, {})
    entry.update(kernel_cfgs)
    meta = entry.setdefault("_meta", {})
    meta["card"] = card.meta()
    if extra:
        meta.update(extra)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return path
