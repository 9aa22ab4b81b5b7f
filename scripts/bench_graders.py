"""Time the independent graders against the primary scorer on the full reference replay of the four benchmarks.

    .venv/bin/python scripts/bench_graders.py [--data-dir DIR] [--workers 2] [--rounds 1]

Per benchmark, in a fresh process (as the workflow's scoring job): the wall time of ``score_records`` (ours,
worker pool start included) and then of ``second_grader.compare`` (every declared grader, their pool start
included) on every problem answered by its own reference solution (``repro.backends.replay``). Prints one line
per benchmark and round and the total ratio ``(ours + graders) / ours`` -- the budget of issue 39 is 1.5x.
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


def one(bench: str, data_dir: str, workers: int) -> dict:
    from repro.backends.replay import reference_completion
    from repro.data import load_problems
    from repro.scoring import score_records, second_grader

    probs = load_problems(bench, data_dir).problems
    comps = {p["id"]: reference_completion(bench, p) for p in probs}
    t0 = time.perf_counter()
    scores = score_records(bench, probs, comps, workers)
    t1 = time.perf_counter()
    rep = second_grader.compare(bench, probs, comps, scores, workers)
    t2 = time.perf_counter()
    return {"bench": bench, "n": len(probs), "ours_s": t1 - t0, "graders_s": t2 - t1,
            "correct": sum(s["correct"] for s in scores), "listed": rep["listed"], "band": rep["band"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.one:
        print(json.dumps(one(a.one, a.data_dir, a.workers)))
        return 0
    ours = graders = 0.0
    for r in range(a.rounds):
        for b in BENCH:
            out = subprocess.run([sys.executable, __file__, "--one", b, "--data-dir", a.data_dir, "--workers",
                                  str(a.workers)], capture_output=True, text=True, check=True, cwd=ROOT)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            ours, graders = ours + row["ours_s"], graders + row["graders_s"]
            print(f"round {r + 1} {b}: n {row['n']}, ours {row['ours_s']:.2f} s, graders {row['graders_s']:.2f} s, "
                  f"correct {row['correct']}, listed {row['listed']}, band {row['band']}", flush=True)
    print(f"total: ours {ours:.1f} s, graders {graders:.1f} s, ratio {(ours + graders) / ours:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
