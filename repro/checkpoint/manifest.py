"""`checkpoint_manifest.json`: per-file size and sha256 of a checkpoint directory.

Schema (version 1; JSON Schema in ``MANIFEST_SCHEMA`` below)::

    {"schema_version": 1,
     "files": [{"path": "config.json", "size": 1234, "sha256": "<64 hex>"}, ...],   # sorted by path
     "manifest_sha256": "<sha256 of the canonical JSON of the 'files' list>"}

* ``path``: POSIX path relative to the checkpoint directory; no ``..``, no leading ``/``.
* The manifest does not list itself, nor anything under ``.cache/`` (huggingface_hub's ``local_dir``
  bookkeeping), nor ``IGNORED_NAMES`` (Snakemake's ``.snakemake_timestamp`` in ``directory()`` outputs). ``manifest_sha256`` = sha256 of ``json.dumps(files, sort_keys=True,
  separators=(",", ":"))``; it identifies the whole checkpoint in provenance and detects an edited
  manifest.
* Hashing streams each file in 8 MiB chunks into one reused buffer, so memory stays flat for multi-GB
  shards; several files are hashed in parallel threads (hashlib releases the GIL while hashing).

Verification against a manifest lives in ``repro.checkpoint.verify``; CLI: ``python -m repro.checkpoint``.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from repro.io import atomic_write_bytes

MANIFEST_NAME = "checkpoint_manifest.json"
SCHEMA_VERSION = 1
CHUNK = 8 << 20
IGNORED_PREFIXES = (".cache/",)
#: Bookkeeping files that tools, not checkpoint authors, put into a checkpoint directory: Snakemake's
#: marker for ``directory()`` outputs. Neither listed in a manifest nor reported as extra.
IGNORED_NAMES = (".snakemake_timestamp",)

MANIFEST_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "checkpoint_manifest.json (schema_version 1)",
    "type": "object",
    "additionalProperties": False,
    "required": ["schema_version", "files", "manifest_sha256"],
    "properties": {
        "schema_version": {"const": 1},
        "files": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["path", "size", "sha256"],
                "properties": {
                    "path": {"type": "string", "minLength": 1, "not": {"pattern": r"(^/)|(^|/)\.\.(/|$)"}},
                    "size": {"type": "integer", "minimum": 0},
                    "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                },
            },
        },
        "manifest_sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
    },
}

Progress = Callable[[int], None]


def default_jobs() -> int:
    """Parallel hashing threads: ``$REPRO_HASH_JOBS`` or min(4, CPUs)."""
    env = os.environ.get("REPRO_HASH_JOBS")
    if env:
        return max(1, int(env))
    return max(1, min(4, os.cpu_count() or 1))


def sha256_file(path: str | os.PathLike, progress: Progress | None = None) -> str:
    """Stream ``path`` through sha256 (8 MiB chunks, one reused buffer); return the hex digest.

    ``progress(n_bytes)`` is called after every chunk when given.
    """
    h = hashlib.sha256()
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
            if progress is not None:
                progress(n)
    return h.hexdigest()


def list_files(root: str | os.PathLike) -> list[str]:
    """Relative POSIX paths of every regular file under ``root`` except the manifest, ``.cache/`` and
    ``IGNORED_NAMES`` (Snakemake's ``.snakemake_timestamp``)."""
    root = Path(root)
    out = []
    for p in root.rglob("*"):
        rel = p.relative_to(root).as_posix()
        if rel in (MANIFEST_NAME, *IGNORED_NAMES) or any(rel.startswith(pre) for pre in IGNORED_PREFIXES):
            continue
        if p.is_file():
            out.append(rel)
    return sorted(out)


def files_digest(files: list[dict]) -> str:
    """sha256 of the canonical JSON (sorted keys, no spaces) of the manifest's ``files`` list."""
    blob = json.dumps(files, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


class _ByteBar:
    """Thread-safe byte counter feeding a tqdm bar (or nothing)."""

    def __init__(self, total: int, desc: str, enabled: bool | None):
        self.lock = threading.Lock()
        self.bar = None
        if enabled is not False:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                            disable=None if enabled is None else False, mininterval=0.5, leave=False)

    def __call__(self, n: int) -> None:
        if self.bar is not None:
            with self.lock:
                self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def hash_files(root: str | os.PathLike, rels: list[str], jobs: int | None = None,
               progress: bool | None = None, desc: str = "sha256") -> dict[str, str]:
    """sha256 of each ``root/rel`` in parallel threads; largest files first; a tqdm bar over bytes.

    ``progress``: None = bar only when stderr is a terminal, True = always, False = never.
    """
    root = Path(root)
    sizes = {rel: (root / rel).stat().st_size for rel in rels}
    bar = _ByteBar(sum(sizes.values()), desc, progress)
    try:
        order = sorted(rels, key=lambda r: (-sizes[r], r))
        with ThreadPoolExecutor(max_workers=jobs or default_jobs()) as pool:
            digests = dict(zip(order, pool.map(lambda r: sha256_file(root / r, bar), order)))
    finally:
        bar.close()
    return digests


def build_manifest(root: str | os.PathLike, jobs: int | None = None, progress: bool | None = False) -> dict:
    """Hash every file under ``root`` and return the manifest dict (not written)."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: not a directory; pass the checkpoint folder")
    rels = list_files(root)
    digests = hash_files(root, rels, jobs=jobs, progress=progress, desc=f"hash {root.name}")
    files = [{"path": rel, "size": (root / rel).stat().st_size, "sha256": digests[rel]} for rel in rels]
    return {"schema_version": SCHEMA_VERSION, "files": files, "manifest_sha256": files_digest(files)}


def write_json(path: str | os.PathLike, obj) -> None:
    """Atomically write ``obj`` as indented, key-sorted JSON plus newline."""
    atomic_write_bytes(path, (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode())


def write_manifest(root: str | os.PathLike, jobs: int | None = None, progress: bool | None = False) -> dict:
    """Write ``root/checkpoint_manifest.json`` atomically and return it."""
    manifest = build_manifest(root, jobs=jobs, progress=progress)
    write_json(Path(root) / MANIFEST_NAME, manifest)
    return manifest
