"""`python -m repro.backends.merge`: merge the shards of one (model, benchmark, seed) into one file.

    python -m repro.backends.merge --problems P.jsonl --out G.jsonl SHARD.jsonl [SHARD.jsonl ...]

Checks that every problem appears exactly once across the shards (else exits non-zero naming the ids),
orders records by problem index, and writes ``G.jsonl`` and ``G.jsonl.meta.json`` (the shards' metas)
atomically. The merged file is byte-identical to what an unsharded run writes.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from repro.io import atomic_write_text


def merge(problems: Path, shards: list[Path], out: Path) -> list[dict]:
    """Merge ``shards`` into ``out``; ValueError names missing or duplicated problem ids."""
    order = [json.loads(l)["id"] for l in problems.read_text().splitlines() if l.strip()]
    recs = [json.loads(l) for s in shards for l in s.read_text().splitlines() if l.strip()]
    counts = Counter(r["id"] for r in recs)
    dup = [i for i, c in counts.items() if c > 1]
    missing = [i for i in order if i not in counts]
    extra = [i for i in counts if i not in set(order)]
    if dup or missing or extra:
        raise ValueError(f"shards of {out}: duplicated {dup[:5]}, missing {missing[:5]}, unknown {extra[:5]}")
    by_id = {r["id"]: r for r in recs}
    ordered = [by_id[i] for i in order]
    atomic_write_text(out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in ordered))
    metas = [json.loads(Path(str(s) + ".meta.json").read_text()) for s in shards
             if Path(str(s) + ".meta.json").exists()]
    atomic_write_text(Path(str(out) + ".meta.json"), json.dumps({"shards": metas}, indent=1, sort_keys=True) + "\n")
    return ordered


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m repro.backends.merge", description=__doc__.splitlines()[0])
    ap.add_argument("--problems", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("shards", nargs="+", type=Path)
    a = ap.parse_args(argv)
    try:
        recs = merge(a.problems, a.shards, a.out)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"merged {len(a.shards)} shard(s), {len(recs)} records -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
