"""Generations made under a verification stamp that a later check found wrong: find them, remove them.

A generation job checks at its start, and again before it writes a shard, that the checkpoint's files have the
sizes and mtimes its stamp recorded (repro.checkpoint.verify.require_verified; repro.backends.generation_job).
A byte changed with its mtime put back passes both checks: only the start-up check of the next run sees it
(the inode change time moved) and verifies the folder again by content. When that check fails, every record
generated since the stamp was written may have read the damaged bytes. Each shard meta records the stamp it
ran under (``checkpoint_stamp``: the stamp's ``verified_at`` and ``stat_fingerprint``), so those shards are
known exactly: :func:`remove_generated_under` removes them (and their partial files and the merged files made
from them), so that once the checkpoint is repaired exactly those cells are generated again, and nothing made
from the damaged bytes is reused.

A shard meta written before ``checkpoint_stamp`` existed is matched by model, manifest hash and time: its
job ended at or after the stamp's ``verified_at``.

Layout (repro/paths.py): shards ``<suite>/generations/<model>/<bench>/seed<S>/shard<K>of<N>.jsonl``, grouped
``<suite>/generations/<model>/seed<S>/shard<K>of<N>/<bench>.jsonl`` (+ the job's index ``...shard<K>of<N>.json``),
speed probes ``<suite>/speed/<model>/<bench>.jsonl``, each with ``.meta.json``; merged files
``<suite>/generations/<model>/<bench>/seed<S>.jsonl``.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

from repro import paths as P


def stamp_identity(stamp: dict) -> dict:
    """What a shard meta records of the stamp it ran under (``checkpoint_stamp``)."""
    return {"verified_at": stamp.get("verified_at"), "stat_fingerprint": stamp.get("stat_fingerprint")}


def _epoch(iso: str | None) -> float | None:
    try:
        return datetime.fromisoformat(iso).timestamp() if iso else None
    except ValueError:
        return None


def made_under(meta: dict, stamp: dict, model: str) -> bool:
    """Whether the shard whose meta is ``meta`` was generated under ``stamp`` (a stamp's JSON) of ``model``."""
    rec = meta.get("checkpoint_stamp")
    if isinstance(rec, dict) and rec.get("stat_fingerprint"):
        return rec["stat_fingerprint"] == stamp.get("stat_fingerprint")
    since = _epoch(stamp.get("verified_at"))
    ended = (meta.get("job") or {}).get("ended_at")
    return (meta.get("model") == model and meta.get("checkpoint_manifest_sha256") == stamp.get("manifest_sha256")
            and since is not None and isinstance(ended, (int, float)) and ended >= since)


def remove_generated_under(work: str | Path, stamp: dict, model: str, dry_run: bool = False) -> list[str]:
    """Remove every shard and speed-probe record under ``work`` (all suites) generated under ``stamp`` of
    ``model`` (:func:`made_under`), with its meta, its grouped job's index, the merged file made from it, and
    every partial file of ``model`` (its records may come from the same bytes). Returns one line per suite x
    model x benchmark, in words (``dry_run``: what would be removed; nothing is)."""
    work = Path(work)
    removed: dict[tuple, set] = {}
    for meta_file in sorted(list(work.glob(f"*/generations/{model}/**/*.jsonl.meta.json"))
                            + list(work.glob(f"*/speed/{model}/*.jsonl.meta.json"))):
        try:
            meta = json.loads(meta_file.read_text())
        except (OSError, ValueError):
            continue
        records = meta_file.with_name(meta_file.name[: -len(".meta.json")])
        # told by the layout inside the work directory, not the absolute path (a WORK under /x/speed/ has shards)
        suite, kind = records.relative_to(work).parts[:2]
        speed = kind == "speed"
        bench, seed = meta.get("benchmark"), meta.get("seed")
        merged = work / P.GENERATIONS.format(suite=suite, model=model, bench=bench, seed=seed)
        if records == merged:
            continue  # a merged file: removed with its shards
        if not made_under(meta, stamp, model):
            continue
        doomed = [records, meta_file]
        if re.fullmatch(r"shard\d+of\d+", records.parent.name):  # grouped: the job's index is the output
            doomed.append(records.parent.with_suffix(".json"))
        if not speed:
            doomed += [merged, merged.with_name(merged.name + ".meta.json")]
        for f in doomed if not dry_run else ():
            f.unlink(missing_ok=True)
        what = "speed-probe records" if speed else f"shards (seed {seed})"
        removed.setdefault((suite, bench), set()).add(what)
    if not dry_run:
        for partial in list(work.glob(f"*/generations/{model}/**/*.partial.*")) + \
                list(work.glob(f"*/speed/{model}/*.partial.*")):
            partial.unlink(missing_ok=True)
    verb = "would remove" if dry_run else "removed"
    return [f"{verb} the {', '.join(sorted(whats))} of {model}/{bench} (suite {suite}) generated under the stamp "
            f"verified at {stamp.get('verified_at')}: they may have read the damaged bytes, and are generated again "
            "once the checkpoint is repaired" for (suite, bench), whats in sorted(removed.items())]
