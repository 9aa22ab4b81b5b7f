"""Collect each cell's accuracy and TPF into a tidy long DataFrame.

Accuracy: the scorer's summary (percent; pass@1 for code, greedy n=1). TPF of a cell: total generated
tokens up to the first EOS divided by total denoise + commit forwards over the cell's problems
(prefill forwards excluded; engine_spec.md §6.10 recommendation, stated in the README). Over several
seeds, the mean of the per-seed values.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from repro import paths


def cell_tpf(generations: Path) -> tuple[float | None, int, int]:
    """(TPF, tokens, forwards) of one generation file; TPF None if no forward counts were reported."""
    toks = fwd = 0
    for line in generations.read_text().splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        if not r.get("forwards"):
            return None, 0, 0
        toks += r["generated_tokens"]
        fwd += r["forwards"]["denoise"] + r["forwards"]["commit"]
    return (toks / fwd if fwd else None), toks, fwd


def collect(work: Path, suite: str, models: list[dict], benchmarks: list[str], seeds: list[int]) -> pd.DataFrame:
    """Tidy rows: model, label, benchmark, seed, accuracy, ci_lo, ci_hi, n, tpf, tokens, forwards."""
    rows = []
    for m in models:
        for b in benchmarks:
            for s in seeds:
                fmt = dict(suite=suite, model=m["name"], bench=b, seed=s)
                summ = json.loads((work / paths.SUMMARY.format(**fmt)).read_text())
                tpf, toks, fwd = cell_tpf(work / paths.GENERATIONS.format(**fmt))
                ci = summ.get("ci95") or [None, None]
                rows.append({"model": m["name"], "label": m["label"], "benchmark": b, "seed": s,
                             "accuracy": summ["accuracy"], "ci_lo": ci[0], "ci_hi": ci[1], "n": summ["n"],
                             "tpf": tpf, "tokens": toks, "forwards": fwd})
    return pd.DataFrame(rows)
