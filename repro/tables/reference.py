"""Reference rows: numbers others reported (the paper's Table 1), beside ours, marked as reported.

The numbers live in ``repro/tables/reported.json``, one entry per source with its citation, URL, table,
and the date it was read; a row applies to the suite models whose checkpoint ``repo_id`` it names (so the
tiny smoke models never match). A suite shows them when ``reported: true`` (the paper suite).

For each matched model and benchmark (``compare_reported``): our accuracy (seed mean, %) and its 95 %
interval — the summary's percentile bootstrap (``repro.scoring.stats.bootstrap_ci``) for one seed, the
same bootstrap over the pooled per-seed outcomes for several —, our TPF, the reported values,
``diff`` = ours − reported, and ``in_ci``: whether the reported accuracy lies inside our interval.

Rendered as rows after the measured ones: "<label> (reported)" with the reported values, then
"Δ ours − reported" with ``+0.4 (in CI)`` / ``−5.1 (outside CI)`` for accuracy and a signed TPF
difference; the citation goes in a footnote (Markdown) and the caption (LaTeX). ``main_table_reported.csv``
holds the long form: one row per model × benchmark × metric.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from repro.scoring.stats import bootstrap_ci
from repro.tables.render import fmt, latex_escape

REPORTED_PATH = Path(__file__).with_name("reported.json")


def load_reported(path: Path = REPORTED_PATH) -> list[dict]:
    """The sources of ``reported.json``; ValueError names a source lacking its citation fields."""
    data = json.loads(Path(path).read_text())
    for i, src in enumerate(data.get("sources", [])):
        missing = [k for k in ("key", "citation", "url", "table", "date_read", "rows") if not src.get(k)]
        if missing:
            raise ValueError(f"{path}: sources[{i}] lacks {', '.join(missing)}; every reported number needs its "
                             "citation, URL, table and the date it was read")
    return data.get("sources", [])


def _ours(g: pd.DataFrame) -> tuple[float | None, float | None, float | None, float | None]:
    """(accuracy, ci_lo, ci_hi, tpf) of one model × benchmark over its seeds."""
    if g.empty:
        return None, None, None, None
    tpf = g["tpf"].dropna()
    tpf = float(tpf.mean()) if len(tpf) else None
    if len(g) == 1:
        r = g.iloc[0]
        return float(r["accuracy"]), r["ci_lo"], r["ci_hi"], tpf
    ones = int(round(sum(a * n / 100 for a, n in zip(g["accuracy"], g["n"]))))
    total = int(g["n"].sum())
    lo, hi = bootstrap_ci([1] * ones + [0] * (total - ones))
    return float(g["accuracy"].mean()), lo, hi, tpf


def compare_reported(long: pd.DataFrame, models: list[dict], benchmarks: list[str],
                     sources: list[dict] | None = None) -> list[dict]:
    """One dict per (matched model, source row): ``model``, ``label``, ``reported_label``, ``source`` and
    per benchmark ``{ours_acc, ci_lo, ci_hi, ours_tpf, reported_acc, reported_tpf, diff_acc, diff_tpf,
    in_ci}`` under ``cells[bench]`` (None where a value is missing)."""
    sources = load_reported() if sources is None else sources
    out = []
    for m in models:
        for src in sources:
            for row in src["rows"]:
                if not m.get("repo_id") or row.get("repo_id") != m["repo_id"]:
                    continue
                cells = {}
                for b in benchmarks:
                    rep = row["values"].get(b) or {}
                    acc, lo, hi, tpf = _ours(long[(long["model"] == m["name"]) & (long["benchmark"] == b)])
                    ra, rt = rep.get("acc"), rep.get("tpf")
                    cells[b] = {"ours_acc": acc, "ci_lo": lo, "ci_hi": hi, "ours_tpf": tpf, "reported_acc": ra,
                                "reported_tpf": rt,
                                "diff_acc": acc - ra if acc is not None and ra is not None else None,
                                "diff_tpf": tpf - rt if tpf is not None and rt is not None else None,
                                "in_ci": (bool(lo <= ra <= hi) if None not in (lo, hi, ra) else None)}
                out.append({"model": m["name"], "label": m["label"], "reported_label": row["label"],
                            "source": src, "cells": cells})
    return out


def _signed(x, decimals: int = 1) -> str | None:
    return None if x is None else ("+" if x >= 0 else "\u2212") + fmt(abs(x), decimals)


def _diff_cells(c: dict, latex: bool) -> list[str]:
    missing = "--" if latex else "-"
    acc = _signed(c["diff_acc"])
    if acc is not None and c["in_ci"] is not None:
        acc += " (in CI)" if c["in_ci"] else " (outside CI)"
    out = [acc or missing, _signed(c["diff_tpf"]) or missing]
    return [s.replace("\u2212", "$-$") if latex else s for s in out]


def footnote(rows: list[dict], latex: bool = False) -> str:
    """The citation sentence: where the reported numbers come from and what Δ / in CI mean."""
    esc = latex_escape if latex else (lambda s: s)
    if not rows:
        return ("Reported numbers: none of reported.json's rows names these models' checkpoints, so no "
                "reference rows are shown.")
    srcs = list({r["source"]["key"]: r["source"] for r in rows}.values())
    cites = " ".join(f"{esc(s['citation'])}; {esc(s['table'])}; {esc(s['url'])}, read {s['date_read']}."
                     + (f" {esc(s['note'])}" if s.get("note") else "") for s in srcs)
    delta, minus, pct = ("$\\Delta$", "$-$", "95\\%") if latex else ("\u0394", "\u2212", "95%")
    return (f"Rows marked reported are copied, not measured here: {cites} {delta} = ours {minus} reported; "
            f"in CI / outside CI: whether the reported accuracy lies inside our {pct} bootstrap interval.")


def markdown_rows(rows: list[dict], benchmarks: list[str]) -> str:
    """Table lines to append after the measured rows (same columns as ``render.to_markdown``)."""
    lines = []
    for r in rows:
        rep = [fmt(r["cells"][b][k]) for b in benchmarks for k in ("reported_acc", "reported_tpf")]
        lines.append("| " + " | ".join([f"{r['reported_label']} (reported\u00b9)"] + rep) + " |")
        diffs = [s for b in benchmarks for s in _diff_cells(r["cells"][b], latex=False)]
        lines.append("| " + " | ".join([f"\u0394 {r['label']} \u2212 reported"] + diffs) + " |")
    return "".join(line + "\n" for line in lines)


def latex_rows(rows: list[dict], benchmarks: list[str]) -> list[str]:
    """``\\midrule`` then the reference rows, to insert before ``\\bottomrule``."""
    out = [r"\midrule"]
    for r in rows:
        rep = [fmt(r["cells"][b][k], missing="--") for b in benchmarks for k in ("reported_acc", "reported_tpf")]
        out.append(" & ".join([rf"\textit{{{latex_escape(r['reported_label'])} (reported)}}"] + rep) + r" \\")
        diffs = [s for b in benchmarks for s in _diff_cells(r["cells"][b], latex=True)]
        out.append(" & ".join([rf"$\Delta$ {latex_escape(r['label'])} $-$ reported"] + diffs) + r" \\")
    return out


def long_csv(rows: list[dict], benchmarks: list[str]) -> str:
    """One row per model × benchmark × metric: ours, our interval (accuracy), reported, diff, in_ci, source."""
    recs = []
    for r in rows:
        s = r["source"]
        for b in benchmarks:
            c = r["cells"][b]
            for metric in ("acc", "tpf"):
                recs.append({"model": r["model"], "label": r["label"], "reported_label": r["reported_label"],
                             "benchmark": b, "metric": metric, "ours": c[f"ours_{metric}"],
                             "ci_lo": c["ci_lo"] if metric == "acc" else None,
                             "ci_hi": c["ci_hi"] if metric == "acc" else None,
                             "reported": c[f"reported_{metric}"], "diff": c[f"diff_{metric}"],
                             "reported_in_ci": c["in_ci"] if metric == "acc" else None, "source": s["key"],
                             "citation": s["citation"], "url": s["url"], "table": s["table"],
                             "date_read": s["date_read"]})
    cols = ["model", "label", "reported_label", "benchmark", "metric", "ours", "ci_lo", "ci_hi", "reported", "diff",
            "reported_in_ci", "source", "citation", "url", "table", "date_read"]
    return pd.DataFrame(recs, columns=cols).to_csv(index=False, lineterminator="\n")


def csv_rows(rows: list[dict], benchmarks: list[str], columns: list[str]) -> list[dict]:
    """Reported values as extra rows of ``main_table.csv`` (label "<row> (reported)")."""
    out = []
    for r in rows:
        d = {c: None for c in columns}
        d.update({"model": f"reported:{r['model']}", "label": f"{r['reported_label']} (reported)"})
        for b in benchmarks:
            d[f"{b}_acc"] = fmt(r["cells"][b]["reported_acc"], missing="")
            d[f"{b}_tpf"] = fmt(r["cells"][b]["reported_tpf"], missing="")
        out.append(d)
    return out
