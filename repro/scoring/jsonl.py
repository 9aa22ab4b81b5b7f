"""JSON Lines reading with errors that name the file and line, and atomic writes (tmp + rename)."""

from __future__ import annotations

import json
from pathlib import Path

from repro.io import atomic_write_text

__all__ = ["read_jsonl", "write_jsonl_atomic", "write_json_atomic"]


def read_jsonl(path) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    out = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: not valid JSON ({exc.msg})") from None
            if not isinstance(rec, dict):
                raise ValueError(f"{path}:{n}: expected a JSON object, got {type(rec).__name__}")
            out.append(rec)
    return out


def write_jsonl_atomic(path, records) -> None:
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


def write_json_atomic(path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")
