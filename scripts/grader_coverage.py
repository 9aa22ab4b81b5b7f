"""How many of the verdicts a scoring fix repairs would the independent graders list, had the fix not been made?

    .venv/bin/python scripts/grader_coverage.py [CASES.jsonl] [--data-dir DIR] [--json OUT]
    .venv/bin/python scripts/grader_coverage.py --false-alarms [CASES.jsonl ...] [--data-dir DIR] [--json OUT]

For each fix of ``repro.scoring.fixes.FIXES`` in turn, the case file (default ``../shared/cases/
scoring_cases_turn4.jsonl``) is scored with that fix switched off (``REPRO_SCORING_DISABLE``, in a fresh process,
so the worker processes inherit it); every case whose verdict then disagrees with its ``expected_correct`` is a
verdict "gone wrong", and it is *listed* when any independent grader its benchmark declares gives it differently
from that (wrong) verdict -- the grader-coverage measure (at least 80 %, docs/scoring.md "Independent graders"). Prints one line per fix and a
total line ``listed L of W (P %)``; ``--json`` writes the per-fix details. Exit status 0 (a measurement).

``--false-alarms`` is the other side of that measure: every case file given (default: every ``*.jsonl`` of
``../shared/cases``) scored with every fix in force, and per grader the *right* verdicts (ours agrees with
``expected_correct``) it lists -- all of them, and those no other grader lists (the ones adding that grader
newly lists). Prints one line per grader and writes the rows with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

_BENCH = {"math": ("math500",), "gsm8k": ("gsm8k",), "code": ("humaneval", "mbpp")}


def one(cases_file: str, data_dir: str) -> dict:
    """In the child process: the cases gone wrong under the current switches, and whether each is listed."""
    from repro.scoring import second_grader
    from repro.scoring.cases import case_problems, run_cases
    from repro.scoring.fixes import disabled
    from repro.scoring.jsonl import read_jsonl

    off = disabled()
    benches = {b for f in off for b in _BENCH[f.split("_", 1)[0]]}
    cases = [c for c in read_jsonl(cases_file) if c["benchmark"] in benches]
    results, _ = run_cases(cases, data_dir, 2)
    by_id = {r["id"]: r for r in results}
    wrong = []
    for b, items in case_problems(cases, data_dir).items():
        bad = [(i, p) for i, p in items if not by_id[cases[i]["id"]]["agrees"]]
        if not bad:
            continue
        probs = [p for _, p in bad]
        scores = [{**by_id[p["id"]], "status": "x"} for p in probs]
        rep = second_grader.compare(b, probs, {cases[i]["id"]: cases[i]["model_output"] for i, _ in bad}, scores, 2)
        listed = {r["id"]: r for r in rep["problems"]}
        for p in probs:
            wrong.append({"id": p["id"], "listed": p["id"] in listed,
                          "by": sorted(n for n, v in (listed.get(p["id"]) or {}).get("graders", {}).items()
                                       if v["status"] == "ok" and bool(v["correct"]) != bool(by_id[p["id"]]["correct"]))})
    return {"fix": ",".join(off), "wrong": wrong}


def false_alarms(files: list[str], data_dir: str) -> dict:
    """Per grader, the right verdicts of ``files`` it lists, and those it alone lists (module docstring)."""
    from repro.scoring import second_grader
    from repro.scoring.cases import case_problems, run_cases
    from repro.scoring.jsonl import read_jsonl

    per: dict = {}
    for f in files:
        cases = [c for c in read_jsonl(f) if "expected_correct" in c]
        results, _ = run_cases(cases, data_dir, 2)
        by_id = {r["id"]: r for r in results}
        for b, items in case_problems(cases, data_dir).items():
            right = [p for _, p in items if by_id[p["id"]]["agrees"]]
            scores = [{**by_id[p["id"]], "status": "x"} for p in right]
            rep = second_grader.compare(b, right, {cases[i]["id"]: cases[i]["model_output"] for i, _ in items}, scores, 2)
            for g in rep["graders"]:
                per.setdefault(g["name"], {"graded": 0, "listed": [], "alone": []})["graded"] += g["graded"]
            for row in rep["problems"]:
                ours = bool(by_id[row["id"]]["correct"])
                by = [n for n, v in row["graders"].items() if v["status"] == "ok" and bool(v["correct"]) != ours]
                for n in by:
                    per[n]["listed"].append(row["id"])
                    if len(by) == 1:
                        per[n]["alone"].append(row["id"])
    return per


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cases", nargs="*")
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--json", default=None)
    ap.add_argument("--false-alarms", action="store_true", help="per grader, the right verdicts it lists")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    shared = ROOT.parent / "shared" / "cases"
    if a.false_alarms:
        per = false_alarms(a.cases or sorted(str(f) for f in shared.glob("*.jsonl")), a.data_dir)
        for n, d in per.items():
            print(f"{n}: lists {len(d['listed'])} right verdict(s) of {d['graded']} graded, {len(d['alone'])} no other "
                  f"grader lists" + (f" ({', '.join(d['alone'])})" if d["alone"] else ""))
        if a.json:
            Path(a.json).write_text(json.dumps(per, indent=1))
        return 0
    if len(a.cases) > 1:
        ap.error("one case file (several only with --false-alarms)")
    a.cases = a.cases[0] if a.cases else str(shared / "scoring_cases_turn4.jsonl")
    if a.one:
        print(json.dumps(one(a.cases, a.data_dir)))
        return 0
    from repro.scoring.fixes import ENV, FIXES

    rows, total, listed = [], 0, 0
    for fix in FIXES:
        env = dict(os.environ, **{ENV: fix})
        out = subprocess.run([sys.executable, __file__, a.cases, "--data-dir", a.data_dir, "--one"], env=env,
                             capture_output=True, text=True, check=True, cwd=ROOT)
        row = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(row)
        n, k = len(row["wrong"]), sum(w["listed"] for w in row["wrong"])
        total, listed = total + n, listed + k
        print(f"{fix}: {n} verdict(s) go wrong, {k} listed "
              + " ".join(f"{w['id']}{'[' + ','.join(w['by']) + ']' if w['listed'] else '[-]'}" for w in row["wrong"]))
    pct = 100.0 * listed / total if total else 100.0
    print(f"total: listed {listed} of {total} verdicts gone wrong ({pct:.1f} %)")
    if a.json:
        Path(a.json).write_text(json.dumps({"fixes": rows, "listed": listed, "wrong": total, "percent": pct}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
