"""Benchmark problems: load from a data directory, the Hugging Face hub, or the shipped handful; normalize.

What a benchmark's file looks like -- its file name, required fields, the sha256 of the published file,
its hub location and pinned revision, and how one original record becomes a normalized problem record
(``docs/interfaces.md``) -- is declared once in ``repro.benchmarks.<name>``::

    {"id": ..., "benchmark": ..., "index": i, "gold": ..., "source": {original fields}}

Sources, in order: a data directory (config ``data_dir`` or ``$ORL_EVAL_DATA``) holding the original
JSONL files; else the hub through ``datasets`` (at the declared revision; an unpinned revision is said
in the notes); else ``repro/data/builtin/`` -- a few problems per benchmark written for this project
(not copied from the benchmarks) so a machine with neither network nor data still runs the smoke
suite. The source used is recorded and printed.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from repro import benchmarks
from repro.io import not_a, read_jsonl, sha256_path

BUILTIN_DIR = Path(__file__).with_name("builtin")


class DataError(RuntimeError):
    """A benchmark file is missing, unreadable, or not in the expected layout."""


def spec(benchmark: str) -> benchmarks.Benchmark:
    """The declaration of ``benchmark`` (``repro.benchmarks``); DataError names the known ones."""
    try:
        return benchmarks.get(benchmark)
    except ValueError as e:
        raise DataError(str(e)) from None


@dataclass
class LoadedProblems:
    """Normalized problems plus where they came from (for provenance)."""

    benchmark: str
    problems: list[dict]
    source: str            # "data_dir" | "hub" | "builtin"
    location: str          # file path or hub id
    sha256: str            # of the original file (data_dir/builtin) or of the canonical JSONL (hub)
    total: int             # problems in the source before `limit`
    notes: list[str] = field(default_factory=list)


def normalize(benchmark: str, rows: list[dict], where: str) -> list[dict]:
    """Turn original records into normalized problem records. DataError names the record (``line N``: the N-th
    record) that lacks a field or whose value the benchmark cannot read (e.g. a GSM8K answer without ``####``)."""
    decl = spec(benchmark)
    out = []
    for i, r in enumerate(rows):
        missing = [k for k in decl.fields if k not in r]
        if missing:
            raise DataError(f"{where}: line {i + 1} lacks field(s) {', '.join(missing)}; "
                            f"a {benchmark} file needs {', '.join(decl.fields)}")
        try:
            pid, gold = decl.problem_id(i, r), decl.gold(r)
        except (ValueError, TypeError, KeyError, AttributeError, IndexError) as e:
            raise DataError(f"{where}: line {i + 1}: not a {benchmark} record as published ({type(e).__name__}: "
                            f"{e})") from None
        out.append({"id": pid, "benchmark": benchmark, "index": i, "gold": gold, "source": {k: r[k] for k in r}})
    ids = [p["id"] for p in out]
    if len(set(ids)) != len(ids):
        raise DataError(f"{where}: duplicate problem ids")
    return out


def _from_file(benchmark: str, path: Path, source: str) -> LoadedProblems:
    decl = spec(benchmark)
    path = path.resolve()
    probs = normalize(benchmark, read_jsonl(path, error=DataError), str(path))
    if not probs:
        raise DataError(f"{path}: holds no problems (the file is empty or has only blank lines); put the "
                        f"original {benchmark} records there, one JSON object per line "
                        f"({', '.join(decl.fields)}), or unset data_dir / ORL_EVAL_DATA")
    digest = sha256_path(path)
    notes = []
    if source == "data_dir" and digest != decl.published_sha256:
        notes.append(f"{path.name}: sha256 {digest[:12]}… differs from the published file "
                     f"({decl.published_sha256[:12]}…); results are not comparable with the paper")
    return LoadedProblems(benchmark, probs, source, str(path), digest, len(probs), notes)


def check_file(benchmark: str, path: Path) -> int:
    """Read and normalize ``path`` as ``benchmark``'s file, as its prepare job will; the number of problems.

    The pipeline calls this at start-up for every file a suite reads from the data directory, so an empty,
    unreadable or malformed file stops the run with one line before any job starts.

    Raises:
        DataError: the file is missing, unreadable (permissions, not UTF-8), not JSON Lines, lacks a field the
            benchmark needs, or holds no problems (the message names the file and the line).
    """
    path = Path(path)
    if not path.is_file():
        why = not_a(path)
        raise DataError(f"{path}: missing" if why == "does not exist" else f"{path}: {why}")
    try:
        rows = read_jsonl(path, error=DataError)
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot be read ({type(e).__name__}: {e})") from None
    probs = normalize(benchmark, rows, str(path))
    if not probs:
        raise DataError(f"{path}: holds no problems (the file is empty or has only blank lines); put the "
                        f"original {benchmark} records there, one JSON object per line "
                        f"({', '.join(spec(benchmark).fields)})")
    return len(probs)


def _from_hub(benchmark: str) -> LoadedProblems:
    decl = spec(benchmark)
    import datasets  # lazy: heavy, and only needed without a data directory

    ds = datasets.load_dataset(decl.hub_path, decl.hub_config, split=decl.hub_split, revision=decl.hub_revision)
    rows = [dict(r) for r in ds]
    rows = decl.from_hub(rows) if decl.from_hub is not None else rows
    blob = "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows).encode()
    probs = normalize(benchmark, rows, f"hub:{decl.hub_path}")
    location = f"{decl.hub_path}/{decl.hub_config or ''}:{decl.hub_split}@{decl.hub_revision or 'unpinned'}"
    notes = [] if decl.hub_revision else [
        f"{benchmark}: hub dataset {decl.hub_path} has no pinned revision (repro/benchmarks/{benchmark}.py); "
        "loaded its current revision -- the sha256 of the rows is recorded, pin hub_revision to fix it"]
    return LoadedProblems(benchmark, probs, "hub", location, hashlib.sha256(blob).hexdigest(), len(probs),
                          notes)


def hub_disabled() -> bool:
    """True when the environment says not to try the hub (``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE``)."""
    return any(os.environ.get(k, "0").lower() in ("1", "true", "yes")
               for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "ORL_EVAL_NO_HUB"))


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """Quick TCP probe of the hub endpoint (``$HF_ENDPOINT``), so an offline machine falls back in
    seconds instead of sitting through ``datasets``' retry loop (measured here: 24 s per benchmark)."""
    import socket
    from urllib.parse import urlparse

    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        with socket.create_connection((url.hostname, url.port or 443), timeout=timeout_s):
            return True
    except OSError:
        return False


def load_problems(benchmark: str, data_dir: Path | None, limit: int | None = None,
                  allow_hub: bool = True, allow_builtin: bool = True) -> LoadedProblems:
    """Load one benchmark from the first source that works and keep the first ``limit`` problems.

    Raises:
        DataError: ``data_dir`` is given but lacks the benchmark's file (the message names the file), or
            neither a data directory nor the hub is available and ``allow_builtin`` is False.
    """
    decl = spec(benchmark)
    notes = []
    if data_dir is not None:
        path = Path(data_dir) / decl.file
        if not path.is_file():
            why = not_a(path)
            raise DataError(f"{path}: {'missing' if why == 'does not exist' else why}; the data directory must hold "
                            f"{decl.file} (original {benchmark} layout), or unset data_dir / ORL_EVAL_DATA")
        loaded = _from_file(benchmark, path, "data_dir")
    else:
        loaded = None
        if allow_hub and not hub_disabled() and not hub_reachable():
            notes.append(f"hub unreachable for {benchmark} (no network to $HF_ENDPOINT)")
        elif allow_hub and not hub_disabled():
            try:
                loaded = _from_hub(benchmark)
            except Exception as e:  # no network, no datasets, gated repo: fall back, say why
                notes.append(f"hub unavailable for {benchmark} ({type(e).__name__}: {str(e)[:120]})")
        if loaded is None and not allow_builtin:
            raise DataError(f"{benchmark}: no data directory and the hub is not available ({'; '.join(notes)}); "
                            f"set data_dir in config.yaml or ORL_EVAL_DATA to a folder holding {decl.file} "
                            "(this suite refuses the shipped non-benchmark problems: builtin_data is false)")
        if loaded is None:
            loaded = _from_file(benchmark, BUILTIN_DIR / decl.file, "builtin")
            notes.append(f"{benchmark}: using the {loaded.total} shipped problems written for this project "
                         "(not the benchmark); set data_dir or ORL_EVAL_DATA for real problems")
    loaded.notes = notes + loaded.notes
    if limit is not None:
        loaded.problems = loaded.problems[:limit]
    return loaded
