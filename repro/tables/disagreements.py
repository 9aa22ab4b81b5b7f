"""The independent graders' listed verdicts, per table cell: the caption's one sentence, a details file, provenance.

Contract:
- ``collect(work, suite, models, benchmarks, seeds) -> list[cell]``: one dict per (model, benchmark), from each
  seed's ``*.disagreements.json`` (``repro.paths.DISAGREEMENTS``, written by ``python -m repro.scoring score``;
  ``repro/scoring/second_grader.py``): ``{"model", "label", "benchmark", "title", "n", "accuracy", "band",
  "listed", "seeds": [{"seed", "n", "accuracy", "band", "listed", "graders", "problems", "report"}]}``.
  ``accuracy`` and ``band`` (percent) are the means over seeds, as the table's accuracy; ``listed`` the sum;
  ``report`` the absolute path of the seed's JSON report. A missing report raises ``WorkFileDamaged`` naming it
  and the fix (remake the scores) when it does not parse. A seed without a report (scored before the graders
  existed, or by hand) is kept under ``not_graded`` and the sentence says so: never shown as "0 listed".
- ``sentence(cells, details) -> str``: the caption's one sentence, e.g. "Independent graders: 1 verdict
  listed (a grader disagrees with ours), counted both ways: tiny LLaDA2 GSM8K 33.3 [0.0, 33.3]; no other
  cell has one; details: listed_verdicts.md (beside this table)." -- per cell, the n of the table (the cell's own
  problems; never a total over rows). Cells with nothing listed are named only as a count.
- ``details(cells, suite) -> str``: the Markdown of ``listed_verdicts.md`` (beside the table): per cell and seed
  its n, accuracy, band, listed count and each grader's differ / graded, then every listed problem with our
  extraction and verdict and each grader's.
- ``provenance(cells) -> dict``: per benchmark the graders (name, title, version) and per cell n, listed, band.
The numbers of the table never come from here.
"""

from __future__ import annotations

from pathlib import Path

from repro import paths
from repro.benchmarks import get as declared_benchmark
from repro.tables.aggregate import WorkFileDamaged, read_json

__all__ = ["collect", "sentence", "details", "provenance", "DETAILS_FILE"]

DETAILS_FILE = "listed_verdicts.md"


def _fmt(x: float) -> str:
    from repro.tables.render import fmt

    return fmt(x)


def collect(work: Path, suite: str, models: list[dict], benchmarks: list[str], seeds: list[int]) -> list[dict]:
    """See module docstring."""
    cells = []
    for m in models:
        for b in benchmarks:
            per_seed = []
            for s in seeds:
                fmt = dict(suite=suite, model=m["name"], bench=b, seed=s)
                f = Path(work) / paths.DISAGREEMENTS.format(**fmt)
                rep = read_json(f, remake=Path(work) / paths.SCORES.format(**fmt)) if f.is_file() else {}
                if "band" not in rep:  # scored before the independent graders (or by hand): said, never hidden
                    per_seed.append({"seed": s, "missing": f"{f} {'is missing' if not rep else 'has no band'}",
                                     "report": str(f.resolve())})
                    continue
                per_seed.append({"seed": s, "n": rep["n"], "accuracy": rep["accuracy"], "band": rep["band"],
                                 "listed": rep["listed"], "graders": rep["graders"], "problems": rep["problems"],
                                 "ungraded": len(rep.get("ungraded") or []), "report": str(f.resolve())})
            graded = [c for c in per_seed if "missing" not in c]
            k = max(1, len(graded))
            cells.append({"model": m["name"], "label": m.get("label", m["name"]), "benchmark": b,
                          "title": declared_benchmark(b).title, "n": sorted({c["n"] for c in graded}),
                          "accuracy": sum(c["accuracy"] for c in graded) / k,
                          "band": [sum(c["band"][0] for c in graded) / k, sum(c["band"][1] for c in graded) / k],
                          "listed": sum(c["listed"] for c in graded), "seeds": graded,
                          "not_graded": [c["missing"] for c in per_seed if "missing" in c]})
    return cells


def _cell_text(c: dict) -> str:
    lo, hi = c["band"]
    return f"{c['label']} {c['title']} {_fmt(c['accuracy'])} [{_fmt(lo)}, {_fmt(hi)}], {c['listed']} listed"


def sentence(cells: list[dict], details: str) -> str:
    """The caption's sentence (module docstring); ``details``: the details file's path as the reader opens it."""
    if not cells:
        return ""
    lost = [c for c in cells if c.get("not_graded")]
    if lost:  # a cell scored before the graders existed: said, with the fix, never shown as "0 listed"
        names = ", ".join(f"{c['label']} {c['title']}" for c in lost[:4]) + (", ..." if len(lost) > 4 else "")
        head = sentence([c for c in cells if not c.get("not_graded")], details).rstrip(".")
        head = head or "Independent graders"
        return (f"{head}; not graded (no report: rescore to grade them): {names}."
                if head != "Independent graders" else f"Independent graders: not run on {names} (no report: "
                f"rescore to grade them); details: {details}.")
    hit = [c for c in cells if c["listed"]]
    total = sum(c["listed"] for c in cells)
    if not hit:
        return (f"Independent graders: 0 verdicts listed in each of the {len(cells)} cells (no grader differs from "
                f"ours), so every cell's band, its accuracy with listed verdicts counted both ways, is its accuracy; "
                f"details: {details}.")
    rest = len(cells) - len(hit)
    others = f"; the other {rest} cells: 0 listed" if rest else ""
    return (f"Independent graders: {total} verdict{'s' if total != 1 else ''} listed (a grader differs from ours), "
            f"accuracy with them counted both ways: {'; '.join(_cell_text(c) for c in hit)}{others}; "
            f"details: {details}.")


def _verdict(v: dict | None) -> str:
    if not v:
        return "-"
    if v.get("status") != "ok":
        return f"not graded ({v.get('detail', '')[:80]})"
    ok = "correct" if v.get("correct") else "wrong"
    return f"{ok} (`{str(v.get('extracted'))[:60]}`)"


def details(cells: list[dict], suite: str) -> str:
    """The Markdown of ``listed_verdicts.md`` (module docstring)."""
    out = [f"# Listed verdicts, suite {suite}", "",
           "A verdict is *listed* when an independent grader (declared in `repro/benchmarks/<name>.py`, code in "
           "`repro/scoring/graders/`, docs/scoring.md) gives it differently from ours. Ours stays the table's number; "
           "the band is the accuracy with the listed verdicts counted both ways (low: each listed verdict ours calls "
           "correct taken as wrong; high: each one ours calls wrong taken as correct).", "",
           "| model | benchmark | seed | n | accuracy | band | listed | graders (differ of graded) | report |",
           "|:---|:---|---:|---:|---:|:---|---:|:---|:---|"]
    for c in cells:
        for s in c["seeds"]:
            per = "; ".join(f"{g['short']} {g['differ']} of {g['graded']}" for g in s["graders"])
            out.append(f"| {c['label']} | {c['title']} | {s['seed']} | {s['n']} | {_fmt(s['accuracy'])} | "
                       f"[{_fmt(s['band'][0])}, {_fmt(s['band'][1])}] | {s['listed']} | {per} | `{s['report']}` |")
    for c in cells:
        for s in c["seeds"]:
            if not s["problems"]:
                continue
            out += ["", f"## {c['label']} · {c['title']} · seed {s['seed']}: {s['listed']} listed", ""]
            for row in s["problems"]:
                ours = row["ours"]
                out.append(f"- `{row['id']}` (gold `{str(row.get('gold'))[:60]}`): ours "
                           f"{'correct' if ours.get('correct') else 'wrong'} (`{str(ours.get('extracted'))[:60]}`)")
                out += [f"  - {name}: {_verdict(v)}" for name, v in row["graders"].items()]
    return "\n".join(out) + "\n"


def provenance(cells: list[dict]) -> dict:
    """Per benchmark: the graders with their versions, and per cell its n, listed count and band."""
    out: dict = {}
    for c in cells:
        b = out.setdefault(c["benchmark"], {"graders": {}, "cells": []})
        for s in c["seeds"]:
            for g in s["graders"]:
                b["graders"].setdefault(g["name"], {"title": g["title"], "version": g["version"]})
            b["cells"].append({"model": c["model"], "seed": s["seed"], "n": s["n"], "listed": s["listed"],
                               "band": s["band"], "report": s["report"]})
    return out
