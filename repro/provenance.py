"""Provenance helpers: code revision, file hashes, and the content keys of every input that decides a cell.

The workflow passes the keys below to its rules as ``params`` (Snakemake's default ``params`` rerun trigger
records them per output and re-runs a job whose value changed), so a change re-runs what it affects even
when no file date moves:

* ``data_source_key(benchmark, data_dir, builtin_allowed)``: the benchmark file's sha256 (data directory),
  or the hub location plus the shipped fallback file's sha256;
* ``prompt_source_key(benchmark, data_dir, builtin_allowed, limit)``: the sha256 of the rendered prompts
  (ids, chat messages, stop strings, template versions) of the problems a suite keeps -- what generation
  depends on; a gold-answer fix leaves it unchanged, so it re-scores without regenerating;
* ``checkpoint_source_key(source)``: hub id + revision, a local folder's path + manifest hash + file
  fingerprint (size, mtime of every file), or the tiny model's seed + the code that writes it;
* ``stage_code_version(stage, backend)``: sha256 over the sources of the code a stage runs (scorer,
  generation engine and prompt templates, decoder rendering, data normalisation, table writer, the NVFP4 ->
  BF16 dequantization the SGLang backend's checkpoint goes through), so a scorer fix re-scores without
  regenerating.

All are plain strings of the job's wildcards and the config only (Snakemake does not record params that
are functions of ``input``/``output``), cheap to compute at every start (file hashes of at most a few MB,
``stat`` of a checkpoint's files) and unchanged for an unchanged tree ("Nothing to be done").
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
from pathlib import Path

from repro import __version__
from repro.io import sha256_path  # noqa: F401 (re-exported: the callers' one place to hash a file)

REPO_ROOT = Path(__file__).resolve().parent.parent


def code_revision() -> str:
    """``git describe``-style revision of the checkout (``<sha>`` or ``<sha>-dirty``), else the version."""
    env_rev = os.environ.get("ORL_EVAL_CODE_REVISION")
    if env_rev:
        return env_rev
    try:
        sha = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no",
                                "--", "repro", "workflow", "Snakefile"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return f"repro-{__version__}"


@functools.lru_cache(maxsize=None)
def tree_digest(*packages: str) -> str:
    """sha256 over the sources (``*.py``, ``*.j2``, ``*.json``) of the named package folders (or single
    files) under the checkout, e.g. ``tree_digest("repro/scoring")``; used as a Snakemake param so that a
    code change re-runs the stage. Cached per process (the tree does not change during one Snakemake run)."""
    h = hashlib.sha256()
    for pkg in packages:
        root = REPO_ROOT / pkg
        for p in ([root] if root.is_file() else sorted(root.rglob("*"))):
            if p.is_file() and p.suffix in (".py", ".j2", ".json") and "__pycache__" not in p.parts:
                h.update(p.relative_to(REPO_ROOT).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


#: The code each stage runs, as folders/files under the checkout (``stage_code_version``). Generation with
#: the engine backend adds ``repro/engine``; the prompt templates live in ``repro/prompts``; the benchmark
#: declarations (``repro/benchmarks``: file, ids, gold, template, stop strings, scorer, titles) feed
#: prepare, generate, score and table.
STAGE_CODE = {
    "prepare": ("repro/data", "repro/io.py", "repro/benchmarks"),
    "tiny": ("repro/checkpoint/tiny.py", "repro/checkpoint/nvfp4.py", "repro/checkpoint/manifest.py", "repro/paper/paper_decoding.json"),
    # the BF16 copy of an NVFP4 checkpoint the SGLang backend loads: the code that decides its values
    "dequantize": ("repro/checkpoint/dequantize.py", "repro/checkpoint/nvfp4.py"),
    "decoder": ("repro/paper",),
    # merging shards into a benchmark's generation file (and the sha256 it records for the readers' check)
    "merge": ("repro/backends/merge.py",),
    "generate": ("repro/backends", "repro/prompts", "repro/benchmarks"),
    "score": ("repro/scoring", "repro/benchmarks"),
    "table": ("repro/tables", "repro/benchmarks"),
}


def stage_code_version(stage: str, backend: str | None = None) -> str:
    """sha256 (hex) over the code of one stage (``STAGE_CODE``); for ``generate`` with ``backend="engine"``
    the engine's sources too. Raises KeyError naming the allowed stages."""
    if stage not in STAGE_CODE:
        raise KeyError(f"unknown stage {stage!r}; allowed: {', '.join(STAGE_CODE)}")
    # the engine reads NVFP4 experts through repro/checkpoint/nvfp4.py (layout, dequantize-at-load values)
    parts = STAGE_CODE[stage] + (("repro/engine", "repro/checkpoint/nvfp4.py")
                                 if stage == "generate" and backend == "engine" else ())
    return tree_digest(*parts)


@functools.lru_cache(maxsize=None)
def _file_sha256(path: str, size: int, mtime_ns: int) -> str:
    return sha256_path(path)


def file_key(path: str | os.PathLike) -> str:
    """``"sha256:<hex>"`` of a file's bytes, or ``"missing:<path>"`` (the job then fails naming it)."""
    p = Path(path)
    if not p.is_file():
        return f"missing:{p}"
    st = p.stat()
    return "sha256:" + _file_sha256(str(p.resolve()), st.st_size, st.st_mtime_ns)


def data_source_key(benchmark: str, data_dir: str | os.PathLike | None, builtin_allowed: bool) -> str:
    """What ``repro.data.prepare`` reads for ``benchmark``: ``data_dir:<file>:sha256:<hex>`` when a data
    directory is set; else ``hub:<dataset>`` plus, when the suite allows it, the shipped fallback file's
    hash (which of the two is used is decided when prepare runs and recorded in the problems' meta)."""
    from repro.data import BUILTIN_DIR, spec

    decl = spec(benchmark)
    if data_dir is not None:
        path = Path(data_dir) / decl.file
        return f"data_dir:{path}:{file_key(path)}"
    key = f"hub:{decl.hub_path}/{decl.hub_config or ''}:{decl.hub_split}"
    if decl.hub_revision:  # a pinned dataset revision: changing it re-prepares
        key += f"@{decl.hub_revision}"
    if builtin_allowed:
        key += f"|builtin:{file_key(BUILTIN_DIR / decl.file)}"
    return key


def prompt_source_key(benchmark: str, data_dir: str | os.PathLike | None, builtin_allowed: bool,
                      limit: int | None) -> str:
    """``prompts:<sha256>`` over (id, index, chat messages, stop strings, template version) of every problem
    ``repro.data.prepare`` keeps from the data directory (``repro.prompts.build_prompt``, the call the
    generation job makes). Without a data directory (hub or shipped problems, chosen when prepare runs),
    or when the file cannot be read (prepare then fails naming it), ``data_source_key``'s value."""
    if data_dir is None:
        return data_source_key(benchmark, data_dir, builtin_allowed)
    from repro.data import load_problems
    from repro.prompts import build_prompt

    try:
        loaded = load_problems(benchmark, Path(data_dir), limit, allow_hub=False, allow_builtin=False)
        h = hashlib.sha256()
        for p in loaded.problems:
            pr = build_prompt(benchmark, p["source"])
            h.update(json.dumps([p["id"], p["index"], pr.messages, pr.stop, pr.template_version],
                                sort_keys=True).encode() + b"\n")
    except Exception:  # noqa: BLE001 - any unreadable input: key by the file; prepare reports the error
        return "unreadable:" + data_source_key(benchmark, data_dir, builtin_allowed)
    return f"prompts:{h.hexdigest()}"


def checkpoint_source_key(source: dict) -> str:
    """Canonical JSON naming the checkpoint a model's ``source`` (config.yaml) yields: ``hf``: repo id and
    revision; ``local``: the resolved folder, the ``manifest_sha256`` its ``checkpoint_manifest.json``
    carries (null without one) and a fingerprint of every file's size and mtime (a repaired or replaced
    file changes it); ``tiny``: the seed and the version of the code that writes the tiny model."""
    kind = source["type"]
    if kind == "hf":
        key = {"type": "hf", "repo_id": source["repo_id"], "revision": source["revision"]}
    elif kind == "local":
        from repro.checkpoint.manifest import MANIFEST_NAME
        from repro.checkpoint.verify import stat_fingerprint

        folder = Path(source["path"]).expanduser().resolve()
        try:
            manifest = json.loads((folder / MANIFEST_NAME).read_text()).get("manifest_sha256")
        except (OSError, ValueError, AttributeError):
            manifest = None
        key = {"type": "local", "path": str(folder), "manifest_sha256": manifest,
               "files": stat_fingerprint(folder)}
    elif kind == "tiny":
        key = {"type": "tiny", "seed": source["seed"], "nvfp4": bool(source.get("nvfp4")), "code": stage_code_version("tiny")}
    elif kind == "replay":  # no checkpoint: completions replayed from a samples file (repro.backends.replay)
        key = {"type": "replay", "samples": source["samples"]}
    else:
        raise ValueError(f"unknown checkpoint source type {kind!r}; allowed: hf, local, tiny, replay")
    return json.dumps(key, sort_keys=True, separators=(",", ":"))
