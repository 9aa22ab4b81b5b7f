"""The second grader's disagreements, counted per benchmark for the table's caption and provenance.

Contract: ``collect(work, suite, models, benchmarks, seeds) -> {benchmark: {"grader", "n", "differ",
"files", "unavailable"}}`` from each cell's ``*.disagreements.json`` (``repro.paths.DISAGREEMENTS``, written
by ``python -m repro.scoring score``; ``repro/scoring/second_grader.py``); ``sentence(per_bench)`` is the
caption's line, e.g. "Second grader: GSM8K: 3 of 1319 verdicts differ from the lm-eval GSM8K grader, listed in
smoke/scores/m/gsm8k/seed1.disagreements.json." The numbers of the table never come from here. A cell
without the file (scored before the second grader existed) counts as not run; a file that does not parse
raises ``WorkFileDamaged`` naming it and the fix.
"""

from __future__ import annotations

from pathlib import Path

from repro import paths
from repro.benchmarks import get as declared_benchmark
from repro.scoring.second_grader import SHORT_NAMES
from repro.tables.aggregate import read_json

__all__ = ["collect", "sentence"]


def collect(work: Path, suite: str, models: list[dict], benchmarks: list[str], seeds: list[int]) -> dict:
    """Per benchmark: the grader's name, problems graded, verdicts that differ (None when not run in some
    cell), the files listing them (relative to ``work``) and why it did not run, where it did not."""
    out = {}
    for b in benchmarks:
        agg = {"grader": None, "n": 0, "differ": 0, "files": [], "unavailable": []}
        for m in models:
            for s in seeds:
                fmt = dict(suite=suite, model=m["name"], bench=b, seed=s)
                rel = paths.DISAGREEMENTS.format(**fmt)
                f = work / rel
                if not f.exists():
                    agg["unavailable"].append(f"{rel} missing (scored before the second grader existed)")
                    continue
                rep = read_json(f, remake=work / paths.SCORES.format(**fmt))
                if rep.get("differ") is None:
                    agg["unavailable"].append(rep.get("unavailable") or "not run")
                    continue
                agg["grader"] = rep.get("second_grader")
                agg["n"] += int(rep["n"])
                agg["sample_of"] = agg.get("sample_of", 0) + int(rep.get("sample_of", rep["n"]))
                agg["differ"] += int(rep["differ"])
                agg["ungraded"] = agg.get("ungraded", 0) + int(rep.get("errors") or 0)
                agg["files"].append(rel)
        if not agg["files"]:
            agg["differ"] = None
        agg["unavailable"] = sorted(set(agg["unavailable"]))
        out[b] = agg
    return out


def sentence(per_bench: dict) -> str:
    """The caption line (plain text); ``""`` when no benchmark of the table has a second grader."""
    parts = []
    for b, a in per_bench.items():
        title = declared_benchmark(b).title
        if b not in SHORT_NAMES:
            continue
        if a["differ"] is None:
            parts.append(f"{title}: second grader not run ({'; '.join(a['unavailable'])[:200]})")
            continue
        where = a["files"][0] if len(a["files"]) == 1 else f"{len(a['files'])} files ({a['files'][0]}, ...)"
        sample = f" (a sample of {a['n']} of {a['sample_of']})" if a.get("sample_of", a["n"]) > a["n"] else ""
        part = f"{title}: {a['differ']} of {a['n']} verdicts{sample} differ from {SHORT_NAMES[b]}, listed in {where}"
        if a.get("ungraded"):
            part += f" ({a['ungraded']} not graded by it)"
        if a["unavailable"]:
            part += f" (not run in {len(a['unavailable'])} cell(s))"
        parts.append(part)
    if not parts:
        return ""
    return "Second grader (lists doubtful verdicts, changes no number): " + "; ".join(parts) + "."
