"""`python -m repro.data.prepare`: write one normalized problem file per benchmark, with its provenance.

    python -m repro.data.prepare --benchmark gsm8k --out problems/gsm8k.jsonl [--data-dir DIR] [--limit N]

Writes ``--out`` (JSON Lines, normalized records) and ``--out`` + ``.meta.json`` (source, location, sha256
of the original file, counts), both atomically. Prints which source was used.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from repro.data import DataError, load_problems
from repro.io import atomic_write_text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m repro.data.prepare", description=__doc__.splitlines()[0])
    ap.add_argument("--benchmark", required=True)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--data-dir", type=Path, default=None)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--no-hub", action="store_true", help="never try the Hugging Face hub")
    ap.add_argument("--no-builtin", action="store_true",
                    help="fail instead of falling back to the shipped non-benchmark problems (paper suite)")
    a = ap.parse_args(argv)
    try:
        loaded = load_problems(a.benchmark, a.data_dir, a.limit, allow_hub=not a.no_hub,
                               allow_builtin=not a.no_builtin)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    atomic_write_text(a.out, "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in loaded.problems))
    meta = {"benchmark": a.benchmark, "source": loaded.source, "location": loaded.location,
            "sha256": loaded.sha256, "total": loaded.total, "kept": len(loaded.problems),
            "limit": a.limit, "notes": loaded.notes}
    atomic_write_text(Path(str(a.out) + ".meta.json"), json.dumps(meta, indent=1, sort_keys=True) + "\n")
    for n in loaded.notes:
        print(f"note: {n}", file=sys.stderr)
    print(f"{a.benchmark}: {len(loaded.problems)}/{loaded.total} problems from {loaded.source} "
          f"({loaded.location}, sha256 {loaded.sha256[:12]}…) -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
