"""Render the paper's Table 1 (rows = models, columns = benchmark × {Acc, TPF}) as Markdown, LaTeX, CSV.

Numbers are rounded half-up on their decimal value (accuracy 1 decimal in %, TPF 1 decimal as in the
paper), so 62.25 prints 62.3 (Python's format would give 62.2). Missing values print ``-`` (Markdown,
CSV) or ``--`` (LaTeX). LaTeX uses booktabs rules, a ``\\cmidrule`` under each benchmark spanner, and
escapes every label. No timestamps inside table files (they live in provenance.json).
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

import pandas as pd

BENCH_TITLES = {"gsm8k": "GSM8K", "math500": "MATH-500", "humaneval": "HumanEval", "mbpp": "MBPP"}
_LATEX_ESCAPES = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def fmt(x, decimals: int = 1, missing: str = "-") -> str:
    """Round half-up on the decimal representation; ``missing`` for None/NaN."""
    if x is None or (isinstance(x, float) and x != x):
        return missing
    q = Decimal(1).scaleb(-decimals)
    return str(Decimal(repr(float(x))).quantize(q, rounding=ROUND_HALF_UP))


def latex_escape(s: str) -> str:
    """Escape LaTeX special characters in a label."""
    return "".join(_LATEX_ESCAPES.get(c, c) for c in s)


def wide(long: pd.DataFrame, benchmarks: list[str]) -> list[dict]:
    """One dict per model (table order): label, and per benchmark the seed-mean accuracy and TPF."""
    out = []
    for model, g in long.groupby("model", sort=False):
        row = {"model": model, "label": g["label"].iloc[0]}
        for b in benchmarks:
            gb = g[g["benchmark"] == b]
            row[f"{b}_acc"] = gb["accuracy"].mean() if len(gb) else None
            tpf = gb["tpf"].dropna()
            row[f"{b}_tpf"] = tpf.mean() if len(tpf) else None
        out.append(row)
    return out


def to_markdown(rows: list[dict], benchmarks: list[str]) -> str:
    head = ["Model"] + [f"{BENCH_TITLES[b]} {k}" for b in benchmarks for k in ("Acc", "TPF")]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join([":---"] + ["---:"] * (len(head) - 1)) + "|"]
    for r in rows:
        cells = [r["label"]] + [fmt(r[f"{b}_{k}"]) for b in benchmarks for k in ("acc", "tpf")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def to_latex(rows: list[dict], benchmarks: list[str], caption: str, label: str) -> str:
    n = len(benchmarks)
    spans = " & ".join(rf"\multicolumn{{2}}{{c}}{{{BENCH_TITLES[b]}}}" for b in benchmarks)
    rules = " ".join(rf"\cmidrule(lr){{{2 + 2 * i}-{3 + 2 * i}}}" for i in range(n))
    sub = " & ".join(["Acc & TPF"] * n)
    body = []
    for r in rows:
        cells = [latex_escape(r["label"])] + [fmt(r[f"{b}_{k}"], missing="--") for b in benchmarks
                                              for k in ("acc", "tpf")]
        body.append(" & ".join(cells) + r" \\")
    return "\n".join([
        r"\begin{table}[t]", r"\centering", rf"\caption{{{latex_escape(caption)}}}", rf"\label{{{label}}}",
        r"\begin{tabular}{l" + "rr" * n + "}", r"\toprule",
        rf"Model & {spans} \\", rules, rf" & {sub} \\", r"\midrule", *body, r"\bottomrule",
        r"\end{tabular}", r"\end{table}", ""])


def to_csv(rows: list[dict], benchmarks: list[str]) -> str:
    cols = ["model", "label"] + [f"{b}_{k}" for b in benchmarks for k in ("acc", "tpf")]
    df = pd.DataFrame([{c: r[c] for c in cols} for r in rows], columns=cols)
    for c in cols[2:]:
        df[c] = [fmt(v, missing="") for v in df[c]]
    return df.to_csv(index=False, lineterminator="\n")
