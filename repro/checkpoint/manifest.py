"""`checkpoint_manifest.json`: per-file size and sha256 of a checkpoint directory.

Schema (version 1)::

    {"schema_version": 1,
     "files": [{"path": "config.json", "size": 1234, "sha256": "<64 hex>"}, ...],   # sorted by path
     "manifest_sha256": "<sha256 of the canonical JSON of the 'files' list>"}

The manifest does not list itself. ``manifest_sha256`` identifies the whole checkpoint in provenance.
Hashing streams each file in 8 MiB chunks, so memory stays flat for multi-GB shards.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

MANIFEST_NAME = "checkpoint_manifest.json"
SCHEMA_VERSION = 1
CHUNK = 8 << 20


def sha256_file(path: str | os.PathLike) -> str:
    """Stream ``path`` through sha256 (8 MiB chunks); return the hex digest."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def list_files(root: str | os.PathLike) -> list[str]:
    """Relative POSIX paths of every regular file under ``root`` except the manifest and ``.cache``."""
    root = Path(root)
    out = []
    for p in root.rglob("*"):
        rel = p.relative_to(root).as_posix()
        if p.is_file() and rel != MANIFEST_NAME and not rel.startswith(".cache/"):
            out.append(rel)
    return sorted(out)


def files_digest(files: list[dict]) -> str:
    """sha256 of the canonical JSON (sorted keys, no spaces) of the manifest's ``files`` list."""
    blob = json.dumps(files, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


def build_manifest(root: str | os.PathLike) -> dict:
    """Hash every file under ``root`` and return the manifest dict (not written)."""
    root = Path(root)
    files = [{"path": rel, "size": (root / rel).stat().st_size, "sha256": sha256_file(root / rel)}
             for rel in list_files(root)]
    return {"schema_version": SCHEMA_VERSION, "files": files, "manifest_sha256": files_digest(files)}


def write_manifest(root: str | os.PathLike) -> dict:
    """Write ``root/checkpoint_manifest.json`` atomically and return it."""
    manifest = build_manifest(root)
    dst = Path(root) / MANIFEST_NAME
    tmp = dst.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, dst)
    return manifest
