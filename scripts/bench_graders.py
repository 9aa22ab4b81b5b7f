"""Time the independent graders against the primary scorer on the full reference replay of the four benchmarks.

    .venv/bin/python scripts/bench_graders.py [--data-dir DIR] [--workers 2] [--rounds 1]

Per benchmark and round, two fresh processes (as the workflow's scoring job), alternating: *ours* -- the wall
time of ``score_records`` alone -- and *all* -- the graders' workers started first (as the scoring CLI does, so
their imports overlap ours), ``score_records``, then ``second_grader.compare`` with every declared grader; every
problem answered by its own reference solution (``repro.backends.replay``). Prints one line per benchmark and
round and the ratio of the totals ``all / ours`` -- the budget is 1.5x (docs/scoring.md "Independent graders").
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
BENCH = ("gsm8k", "math500", "humaneval", "mbpp")


def one(bench: str, data_dir: str, workers: int, mode: str) -> dict:
    from repro.backends.replay import reference_completion
    from repro.data import load_problems
    from repro.scoring import graders, score_records, second_grader
    from repro.scoring.graders.worker import pool

    probs = load_problems(bench, data_dir).problems
    comps = {p["id"]: reference_completion(bench, p) for p in probs}
    t0 = time.perf_counter()
    if mode == "all" and graders.in_worker(bench):
        pool(workers, preload=graders.in_worker(bench)).start()
    scores = score_records(bench, probs, comps, workers)
    rep = second_grader.compare(bench, probs, comps, scores, workers) if mode == "all" else None
    return {"bench": bench, "n": len(probs), "seconds": time.perf_counter() - t0,
            "correct": sum(s["correct"] for s in scores), "listed": rep["listed"] if rep else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--one", nargs=2, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.one:
        print(json.dumps(one(a.one[0], a.data_dir, a.workers, a.one[1])))
        return 0
    total = {"ours": 0.0, "all": 0.0}
    for r in range(a.rounds):
        for b in BENCH:
            got = {}
            for mode in ("ours", "all") if r % 2 == 0 else ("all", "ours"):
                out = subprocess.run([sys.executable, __file__, "--one", b, mode, "--data-dir", a.data_dir,
                                      "--workers", str(a.workers)], capture_output=True, text=True, check=True, cwd=ROOT)
                got[mode] = json.loads(out.stdout.strip().splitlines()[-1])
                total[mode] += got[mode]["seconds"]
            print(f"round {r + 1} {b}: n {got['all']['n']}, ours {got['ours']['seconds']:.2f} s, with every grader "
                  f"{got['all']['seconds']:.2f} s, correct {got['all']['correct']}, listed {got['all']['listed']}",
                  flush=True)
    print(f"total: ours {total['ours']:.1f} s, with every grader {total['all']:.1f} s, "
          f"ratio {total['all'] / total['ours']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
