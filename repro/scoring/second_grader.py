"""Independent graders beside every verdict: the verdicts any of them gives differently from ours, listed.

Contract: ``compare(benchmark, problems, completions, scores, workers, timeout_s) -> report`` (a JSON-ready
dict) and ``write_report(path, report)``; ``console_line(report)`` is one readable line. The graders are the
ones ``benchmark`` declares (``repro/benchmarks/<name>.py``, ``graders=``; modules of ``repro.scoring.graders``).
A verdict is *listed* when any grader that graded it differs from ours. The report::

    {"benchmark", "n", "primary", "correct", "accuracy", "band": [low, high], "listed",
     "ours_only_correct", "second_only_correct", "graders": [{"name", "title", "short", "version",
     "graded", "differ", "ungraded", "skipped"}], "problems": [listed rows], "ungraded": [rows]}

``accuracy`` and ``band`` are percentages: ``band`` counts the listed verdicts both ways -- low: every listed
verdict that ours calls correct taken as wrong; high: every listed one ours calls wrong taken as correct
(``(correct - ours_only_correct) / n`` and ``(correct + second_only_correct) / n``). A row is ``{"id", "gold",
"ours": {"extracted", "correct", "status", "reason"}, "graders": {name: {"extracted", "correct", "status",
"detail"}}}``; ``ungraded`` rows are problems some grader could not grade (its worker died or timed out),
not counted as differing. The graders never change a score: ``scores`` (ours) are read, not written.
A grader that cannot run here raises ``graders.GradersUnavailable`` (one line with the fix): the scoring CLI
checks that before scoring (``graders.require``), so a report is never silently thinner. ``differ`` (= ``listed``)
is kept for readers of the first report format. The CLI writes the report beside the summary
(``*.disagreements.json``); the table's caption and ``listed_verdicts.md`` are made from it
(``repro/tables/disagreements.py``). Graders: docs/scoring.md, "Independent graders".
"""

from __future__ import annotations

from pathlib import Path

from . import graders
from .jsonl import write_json_atomic
from .truncate import truncate_for

__all__ = ["compare", "write_report", "disagreements_path", "console_line", "band"]


def disagreements_path(summary: str | Path) -> Path:
    """``X.summary.json`` -> ``X.disagreements.json`` (any other name: ``<name>.disagreements.json``)."""
    s = str(summary)
    return Path(s[: -len(".summary.json")] + ".disagreements.json" if s.endswith(".summary.json")
                else s + ".disagreements.json")


def band(n: int, correct: int, ours_only_correct: int, second_only_correct: int) -> tuple[float, float]:
    """``(low, high)`` accuracy in percent with the listed verdicts counted both ways (module docstring)."""
    if n <= 0:
        return (0.0, 0.0)
    return (100.0 * (correct - ours_only_correct) / n, 100.0 * (correct + second_only_correct) / n)


def _in_workers(benchmark: str, problems: list[dict], completions: dict, names: list[str], workers: int) -> dict:
    """``{grader name: [verdict per problem]}`` for the ``IN_WORKER`` graders, one worker request per problem."""
    from concurrent.futures import ThreadPoolExecutor

    from .graders.worker import TIMEOUT_S, pool

    workers_pool = pool(workers)

    def one(p):
        ans = workers_pool.check(str(p["gold"]), truncate_for(benchmark, completions[p["id"]]),
                                 timeout=TIMEOUT_S, benchmark=benchmark, graders=names)
        if ans.get("status") != "ok":
            why = f"grader worker: {ans.get('status')}: {ans.get('detail', '')}"[:300]
            return {n: {"extracted": None, "correct": None, "status": "error", "detail": why} for n in names}
        return ans["verdicts"]

    with ThreadPoolExecutor(max_workers=workers) as ex:
        answers = list(ex.map(one, problems))
    return {n: [a[n] for a in answers] for n in names}


def compare(benchmark: str, problems: list[dict], completions: dict, scores: list[dict],
            workers: int | None = None, timeout_s: float | None = None) -> dict:
    """The report of the module docstring for ``scores`` (ours, in the order of ``problems``); ``workers``:
    grader worker processes or sandbox slots (default: the sandbox's ``default_workers``); ``timeout_s``: per
    sandboxed program (HumanEval, MBPP), as the primary's. Raises ``graders.GradersUnavailable``."""
    from .code.sandbox import default_workers

    workers = max(1, int(workers or default_workers()))
    graders.require([benchmark])
    mods = graders.for_benchmark(benchmark)
    verdicts = _in_workers(benchmark, problems, completions, [m.NAME for m in mods if m.IN_WORKER], workers) \
        if any(m.IN_WORKER for m in mods) else {}
    for m in mods:
        if not m.IN_WORKER:
            verdicts[m.NAME] = m.grade(benchmark, problems, completions, scores, workers, timeout_s)
    listed, ungraded, summary = [], [], []
    for m in mods:
        vs = verdicts[m.NAME]
        summary.append({"name": m.NAME, "title": m.TITLE, "short": m.SHORT, "version": m.version(),
                        "graded": sum(v["status"] == "ok" for v in vs),
                        "differ": sum(v["status"] == "ok" and bool(v["correct"]) != bool(o["correct"])
                                      for v, o in zip(vs, scores)),
                        "ungraded": sum(v["status"] == "error" for v in vs),
                        "skipped": sum(v["status"] == "skipped" for v in vs)})
    for i, (p, ours) in enumerate(zip(problems, scores)):
        row = {"id": p["id"], "gold": p.get("gold"),
               "ours": {k: ours.get(k) for k in ("extracted", "correct", "status", "reason")},
               "graders": {m.NAME: verdicts[m.NAME][i] for m in mods if verdicts[m.NAME][i]["status"] != "skipped"}}
        if any(v["status"] == "ok" and bool(v["correct"]) != bool(ours["correct"]) for v in row["graders"].values()):
            listed.append(row)
        elif any(v["status"] == "error" for v in row["graders"].values()):
            ungraded.append(row)
    n, correct = len(scores), sum(bool(s["correct"]) for s in scores)
    ours_only = sum(bool(r["ours"]["correct"]) for r in listed)
    lo, hi = band(n, correct, ours_only, len(listed) - ours_only)
    return {"benchmark": benchmark, "n": n, "primary": "repro.scoring (ours; the table's numbers)",
            "correct": correct, "accuracy": 100.0 * correct / n if n else 0.0, "band": [lo, hi],
            "listed": len(listed), "differ": len(listed), "ours_only_correct": ours_only,
            "second_only_correct": len(listed) - ours_only, "errors": len(ungraded), "graders": summary,
            "problems": listed, "ungraded": ungraded}


def write_report(path: str | Path, report: dict) -> None:
    """Write ``report`` atomically as JSON."""
    write_json_atomic(path, report)


def console_line(report: dict) -> str:
    """One readable line on what the graders found."""
    lo, hi = report["band"]
    per = ", ".join(f"{g['short']} {g['differ']} of {g['graded']}" for g in report["graders"])
    bad = f"; {report['errors']} not graded by some grader" if report.get("errors") else ""
    return (f"independent graders ({report['benchmark']}): {report['listed']} of {report['n']} verdicts listed "
            f"({per}); accuracy {report['accuracy']:.1f} [{lo:.1f}, {hi:.1f}] with them counted both ways{bad}")
