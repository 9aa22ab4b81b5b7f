"""The sweep figure: accuracy (%) against tokens per forward (TPF), one panel per benchmark.

``plot_sweep(df, spec, png, pdf, reported=None)`` draws ``repro.tables.sweep``'s tidy table (seed means
per point): one line per model (and per edit threshold when the grid sweeps it) through its thresholds,
each point labelled with its threshold τ, and the paper's operating point — the suite decoded as
``paper_decoding.json`` says — as a large hollow star. With ``reported`` (the sources of
``reported.json``) the paper's own number for a model whose checkpoint it names is an ×.

Readable in grayscale: every series differs in marker and line style, not only in colour (Okabe–Ito
colours, which also differ in lightness). Written with matplotlib's object API (no global pyplot state),
PNG at 200 dpi and a vector PDF, each atomically (``repro.io``).
"""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from repro.io import atomic_write_bytes
from repro.tables.render import declared_benchmark

COLORS = ["#000000", "#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00"]  # Okabe-Ito, dark to light
MARKERS = ["o", "s", "^", "D", "v", "P"]
LINESTYLES = ["-", "--", ":", "-.", (0, (5, 1)), (0, (1, 1))]
STYLE = {"font.size": 8, "axes.titlesize": 9, "axes.labelsize": 8, "legend.fontsize": 7.5,
         "xtick.labelsize": 7.5, "ytick.labelsize": 7.5, "axes.spines.top": False, "axes.spines.right": False,
         "axes.grid": True, "grid.color": "#d9d9d9", "grid.linewidth": 0.5, "font.family": "DejaVu Sans",
         "pdf.fonttype": 42}


def _num(x) -> str:
    return "-" if x is None or x != x else f"{x:g}"


def _ylim(values: list[float]) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    if hi - lo < 10:  # at least a 10-point span inside [0, 100], so noise does not look like a trend
        lo = min(max(0.0, (lo + hi) / 2 - 5), 90.0)
        hi = lo + 10
    return max(lo - 0.3 * (hi - lo), -3.5), min(hi + 0.12 * (hi - lo), 102.0)


def plot_sweep(df: pd.DataFrame, spec: dict, png: Path, pdf: Path, reported: list[dict] | None = None) -> Figure:
    """Write the figure (see module docstring) to ``png`` and ``pdf``; returns it (drawn: its texts have their
    final positions)."""
    import matplotlib

    benches = spec["benchmarks"]
    mean = (df.groupby(["model", "label", "benchmark", "point", "paper_setting", "threshold", "edit_threshold"],
                       dropna=False, sort=False)
            .agg(accuracy=("accuracy", "mean"), tpf=("tpf", "mean"), n=("n", "max")).reset_index())
    grid = mean[~mean["paper_setting"]]
    # one line per edit threshold only when the grid sweeps it (else each model keeps its own)
    swept = any("edit_threshold" in p.get("overrides", {}) for p in spec.get("points", []))
    edits = sorted(grid["edit_threshold"].dropna().unique()) if swept else []
    series = [(m["name"], m["label"], e) for m in spec["models"] for e in (edits if len(edits) > 1 else [None])]
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(3.2 * len(benches) + 0.4, 3.3), layout="constrained")
        axes = fig.subplots(1, len(benches), squeeze=False)[0]
        handles, drawn, extra_y = [], set(), {b: [] for b in benches}
        cell_range = {}  # benchmark -> ((min, max) TPF, (min, max) accuracy) of its points
        for b in benches:
            c = mean[mean["benchmark"] == b].dropna(subset=["tpf", "accuracy"])
            cell_range[b] = ((c["tpf"].min(), c["tpf"].max()), (c["accuracy"].min(), c["accuracy"].max()))
        for i, (name, label, edit) in enumerate(series):
            style = dict(color=COLORS[i % 6], marker=MARKERS[i % 6], linestyle=LINESTYLES[i % 6], linewidth=1.2,
                         markersize=4.5, markerfacecolor="white", markeredgewidth=1.1)
            handles.append(Line2D([], [], label=label + (f", edit threshold {edit:g}" if edit is not None else ""),
                                  **style))
            for ax, b in zip(axes, benches):
                pts = grid[(grid["model"] == name) & (grid["benchmark"] == b)]
                if edit is not None:
                    pts = pts[pts["edit_threshold"] == edit]
                pts = pts.dropna(subset=["tpf"]).sort_values("threshold")
                ax.plot(pts["tpf"], pts["accuracy"], **style)
                dy = 5 if i % 2 == 0 else -11  # alternate series label above / below their points
                # a busy panel (more than two lines): label each line's two ends only
                for r in (pts.iloc[[0, -1]] if len(series) > 2 and len(pts) > 2 else pts).itertuples():
                    ax.annotate(f"\u03c4={r.threshold:g}", (r.tpf, r.accuracy), textcoords="offset points",
                                xytext=(3, dy), fontsize=6.5, color=style["color"])
                op = mean[(mean["paper_setting"]) & (mean["model"] == name) & (mean["benchmark"] == b)].dropna(
                    subset=["tpf"])
                if (name, b) not in drawn:  # once per model, in its first series' colour
                    drawn.add((name, b))
                    for r in op.itertuples():
                        ax.plot([r.tpf], [r.accuracy], marker="*", markersize=13, markerfacecolor="none",
                                markeredgecolor=style["color"], markeredgewidth=1.2, linestyle="none", zorder=5)
                        # inside the panel: toward its middle (a label below a point at the bottom of the range
                        # sat on the x tick labels; one right of the rightmost point ran past the frame), series
                        # alternating between two distances so that two models' labels do not overlap
                        xs, ys = cell_range[b]
                        right = r.tpf > (xs[0] + xs[1]) / 2
                        above = r.accuracy <= (ys[0] + ys[1]) / 2
                        dy = (17 if i % 2 else 29) if above else (-25 if i % 2 == 0 else -37)
                        ax.annotate(f"paper: \u03c4={_num(r.threshold)}, edit {_num(r.edit_threshold)}",
                                    (r.tpf, r.accuracy), textcoords="offset points", xytext=(8 if right else -8, dy),
                                    ha="right" if right else "left", fontsize=6.5, color=style["color"],
                                    fontweight="bold", zorder=6,
                                    bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.85))
                    for src in reported or []:
                        for row in src["rows"]:
                            m = next((m for m in spec["models"] if m["name"] == name), {})
                            v = row["values"].get(b) or {}
                            if m.get("repo_id") and row.get("repo_id") == m["repo_id"] and None not in (v.get("tpf"), v.get("acc")):
                                extra_y[b].append(v["acc"])
                                ax.plot([v["tpf"]], [v["acc"]], marker="x", markersize=7, color=style["color"],
                                        markeredgewidth=1.4, linestyle="none", zorder=5)
        handles.append(Line2D([], [], marker="*", markersize=11, markerfacecolor="none", markeredgecolor="black",
                              linestyle="none", label="paper's operating point (paper_decoding.json)"))
        if reported and any(m.get("repo_id") == row.get("repo_id") for src in reported for row in src["rows"]
                            for m in spec["models"] if m.get("repo_id")):
            handles.append(Line2D([], [], marker="x", color="black", linestyle="none",
                                  label="reported in the paper (" + reported[0].get("short", "paper") + ")"))
        for ax, b in zip(axes, benches):
            cell = mean[mean["benchmark"] == b]
            ns = sorted({int(n) for n in cell["n"].dropna()})
            n_txt = f"n = {ns[0]}" if len(ns) == 1 else f"n = {ns[0]}\u2013{ns[-1]}"
            ax.set_title(f"{declared_benchmark(b).title} ({n_txt})")
            ax.set_xlabel("tokens per forward (TPF) \u2192 faster")
            ys = list(cell["accuracy"].dropna()) + extra_y[b]
            if ys:
                ax.set_ylim(*_ylim(ys))
                ax.set_yticks([y for y in ax.get_yticks() if 0 <= y <= 100])  # room below 0 for labels, no "-2 %"
            ax.margins(x=0.15)
        axes[0].set_ylabel("accuracy (%; pass@1 for code)")
        # one column under a single panel: two entries side by side are wider than its 3.6 in and were cut off
        fig.legend(handles=handles, loc="outside lower center", ncol=min(2, len(handles), len(benches)), frameon=False)
        for path, kw in ((png, {"dpi": 200}), (pdf, {})):
            buf = io.BytesIO()
            fig.savefig(buf, format=Path(path).suffix[1:], **kw)
            atomic_write_bytes(path, buf.getvalue())
    return fig
