"""`python -m repro.backends.merge`: merge the shards of one (model, benchmark, seed) into one file.

    python -m repro.backends.merge --problems P.jsonl --out G.jsonl SHARD.jsonl [SHARD.jsonl ...]
    python -m repro.backends.merge --problems P.jsonl --out G.jsonl --benchmark B --group-index IDX.json [...]

Checks that every problem appears exactly once across the shards (else exits non-zero naming the ids),
orders records by problem index, and writes ``G.jsonl`` and ``G.jsonl.meta.json`` (the shards' metas under
``shards``, and ``sha256``: the merged file's own sha256) atomically. The merged file is byte-identical to what an
unsharded run writes.

Every reader of a merged file (scoring, the tables' TPF and speed figures, ``compare``) calls
:func:`check_merged` first: a merged file whose sha256 is no longer the one its merge recorded (edited by hand)
is refused with one line naming the file and the fix (delete it; the workflow merges it again from the
unchanged shards). A generation file without such a record (a replayed cell's: ``repro.backends.replay``; a
merge written before the sha256 was recorded) is not checked here.

Each shard is checked against the ``records_sha256`` its generation job recorded in its ``.meta.json``: a shard
edited by hand or damaged stops the merge with one line naming it and the fix (delete it and its meta).

``--group-index``: the shards are those a grouped generation job wrote for benchmark ``B``
(``repro.backends.generation_job``): each index names the shard file and its sha256; a shard file that is
missing or no longer has that sha256 stops the merge, naming the file and the fix.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections import Counter
from pathlib import Path

from repro.io import atomic_write_text
from repro.provenance import sha256_path


class MergedFileChanged(ValueError):
    """A merged generation file no longer has the sha256 its merge recorded; the message names it and the fix."""


def check_merged(path: str | Path) -> None:
    """Refuse a merged generation file ``path`` whose content changed since :func:`merge` wrote it.

    Reads ``path.meta.json``; when it records the merge's ``sha256`` (beside ``shards``) and the file's sha256
    differs, raises :class:`MergedFileChanged` (a ValueError) naming the file and the fix. Returns None for an
    unchanged file, a file without a meta, or a meta that records no merge sha256 (a replayed cell, an older
    merge). FileNotFoundError is left to the caller's own read of ``path``."""
    path = Path(path)
    meta_p = Path(str(path) + ".meta.json")
    try:
        meta = json.loads(meta_p.read_text())
    except (OSError, ValueError):
        return
    if not isinstance(meta, dict) or "shards" not in meta or not meta.get("sha256") or not path.is_file():
        return
    if sha256_path(path) != meta["sha256"]:
        raise MergedFileChanged(
            f"{path}: changed since repro.backends.merge wrote it (its sha256 differs from the one recorded in "
            f"{meta_p.name}); delete it to merge again from the shards (the workflow re-merges and re-scores it)")


def group_shards(indexes: list[Path], benchmark: str) -> list[Path]:
    """The shard files of ``benchmark`` listed in grouped jobs' ``indexes``, each checked against its recorded
    sha256. ValueError names an index without the benchmark, or a missing or altered shard file."""
    out = []
    for idx in indexes:
        try:
            index = json.loads(idx.read_text())
            if not isinstance(index, dict):
                raise ValueError("not a JSON object")
        except (ValueError, OSError) as e:
            raise ValueError(f"{idx}: unreadable grouped-job index ({e}); delete it and run again: the job rebuilds it "
                             "and keeps every shard whose inputs are unchanged") from None
        entry = index.get("benchmarks", {}).get(benchmark)
        if entry is None:
            raise ValueError(f"{idx}: the grouped job wrote no shard of {benchmark!r}; delete {idx} so that the "
                             "job runs again with this benchmark")
        shard = idx.parent / entry["file"]
        if not shard.is_file() or sha256_path(shard) != entry["sha256"]:
            raise ValueError(f"{shard}: {'missing' if not shard.is_file() else 'changed'} since the grouped job "
                             f"listed it in {idx}; delete {idx} (and {shard}) to generate this shard again")
        out.append(shard)
    return out


def _records(shard: Path, meta: dict) -> list[dict]:
    """The records of one shard file, read once: refused (ValueError naming the shard and the fix) when its sha256
    is not the ``records_sha256`` its generation job recorded in ``meta`` (``generation_job.complete_shard``: a
    record edited by hand, a damaged or truncated file), or when a line is not a JSON record with an ``id``."""
    raw = shard.read_bytes()
    want = meta.get("records_sha256") if isinstance(meta, dict) else None
    if want and hashlib.sha256(raw).hexdigest() != want:
        raise ValueError(f"{shard}: changed since its generation job wrote it (its sha256 differs from "
                         f"records_sha256 in {shard.name}.meta.json), so its records are not the model's; delete "
                         f"{shard} and {shard}.meta.json to generate this shard again")
    out = []
    for n, line in enumerate(raw.decode("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict) or "id" not in rec:
                raise ValueError("not a record with an 'id'")
        except ValueError as e:
            raise ValueError(f"{shard}, line {n}: not a generation record ({e}); delete {shard} and "
                             f"{shard}.meta.json to generate this shard again") from None
        out.append(rec)
    return out


def merge(problems: Path, shards: list[Path], out: Path) -> list[dict]:
    """Merge ``shards`` into ``out``; ValueError names a shard without its ``.meta.json``, a shard changed since
    its job wrote it or a line that is no record (:func:`_records`), or missing or duplicated problem ids."""
    order = [json.loads(l)["id"] for l in problems.read_text().splitlines() if l.strip()]
    no_meta = [s for s in shards if not Path(f"{s}.meta.json").is_file()]
    if no_meta:  # a record's provenance (decoder, checkpoint, code, ...) would be unknown in every table cell
        raise ValueError(f"{no_meta[0]}.meta.json: missing, so what made this shard (decoder, problems, checkpoint, "
                         f"code) is unknown; delete {no_meta[0]} so that its generation job writes it again")
    metas = [json.loads(Path(f"{s}.meta.json").read_text()) for s in shards]
    recs = [r for s, m in zip(shards, metas) for r in _records(s, m)]
    counts = Counter(r["id"] for r in recs)
    dup = [i for i, c in counts.items() if c > 1]
    missing = [i for i in order if i not in counts]
    extra = [i for i in counts if i not in set(order)]
    if dup or missing or extra:
        raise ValueError(f"shards of {out}: duplicated {dup[:5]}, missing {missing[:5]}, unknown {extra[:5]}")
    by_id = {r["id"]: r for r in recs}
    ordered = [by_id[i] for i in order]
    # meta first: a kill between the two renames leaves an old merged file that check_merged refuses
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in ordered)
    sha = hashlib.sha256(text.encode("utf-8")).hexdigest()
    atomic_write_text(Path(str(out) + ".meta.json"),
                      json.dumps({"shards": metas, "sha256": sha}, indent=1, sort_keys=True) + "\n")
    atomic_write_text(out, text)
    return ordered


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m repro.backends.merge", description=__doc__.splitlines()[0])
    ap.add_argument("--problems", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--benchmark", help="with --group-index: the benchmark whose shards to take")
    ap.add_argument("--group-index", nargs="+", type=Path, default=[],
                    help="grouped generation jobs' index files (their shards of --benchmark are merged)")
    ap.add_argument("shards", nargs="*", type=Path)
    a = ap.parse_args(argv)
    if a.group_index and not a.benchmark:
        ap.error("--group-index needs --benchmark")
    if not (a.shards or a.group_index):
        ap.error("give the shard files, or --benchmark B --group-index IDX ...")
    try:
        shards = list(a.shards) + (group_shards(a.group_index, a.benchmark) if a.group_index else [])
        recs = merge(a.problems, shards, a.out)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"merged {len(shards)} shard(s), {len(recs)} records -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
