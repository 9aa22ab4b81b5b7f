"""JSON Lines reading (``repro.io.read_jsonl``: errors name the file and line) and atomic writes for scoring."""

from __future__ import annotations

import json
from pathlib import Path

from repro.io import atomic_write_text, read_jsonl

__all__ = ["read_jsonl", "write_jsonl_atomic", "write_json_atomic"]


def write_jsonl_atomic(path, records) -> None:
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


def write_json_atomic(path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")
