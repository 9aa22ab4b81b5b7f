"""What the threshold buys: accuracy and TPF over a grid of decoder settings, as CSV, a plot and provenance.

    python -m repro.tables.sweep --work WORK --out-dir results/smoke/sweep --spec '{"suite": "smoke",
        "seeds": [12345], "benchmarks": ["gsm8k"], "models": [{"name": .., "label": .., "repo_id": ..}],
        "points": [{"suite": "smoke-sweep-t0p5", "overrides": {"threshold": 0.5}}], "reported": false}'

The workflow's ``sweep`` target (``workflow/rules/analysis.smk``) runs each grid point of a suite's
``sweep`` (config.yaml) as a suite of its own whose decoder configs carry the override (``render_config
--set threshold=…``); the suite itself, decoded as ``paper_decoding.json`` says, is the paper's operating
point. This stage reads their score summaries and generation files (``repro.tables.aggregate.collect``)
and writes into ``--out-dir``:

* ``sweep.csv``: one row per point × model × benchmark × seed: ``point`` (suite name), ``paper_setting``
  (true for the operating point), the ``threshold`` and ``edit_threshold`` the generation actually used
  (read back from its decoder), ``overrides`` (JSON), ``accuracy`` (%), ``ci_lo``, ``ci_hi``, ``n``,
  ``tpf``, ``tokens``, ``forwards``, ``decoder_sha256``.
* ``sweep.png`` / ``sweep.pdf``: accuracy against TPF, one panel per benchmark, one line per model (and
  edit threshold) through the thresholds, the operating point marked (``repro.tables.plot``).
* ``sweep.json``: provenance: per point the override and, per cell, what ``main_table``'s provenance
  records (checkpoint manifest hash, decoder and its hash, problems hash, code revision, …).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from repro import paths
from repro.io import atomic_write_text
from repro.provenance import code_revision
from repro.tables.aggregate import collect

COLUMNS = ["model", "label", "benchmark", "seed", "point", "paper_setting", "threshold", "edit_threshold",
           "overrides", "accuracy", "ci_lo", "ci_hi", "n", "tpf", "tokens", "forwards", "decoder_sha256"]


def _decoder(work: Path, suite: str, model: str, bench: str, seed: int) -> tuple[dict, str | None]:
    meta_path = work / (paths.GENERATIONS.format(suite=suite, model=model, bench=bench, seed=seed) + ".meta.json")
    meta = json.loads(meta_path.read_text())
    first = meta.get("shards", [meta])[0]
    return first.get("decoder") or {}, first.get("decoder_sha256")


def collect_sweep(work: Path, spec: dict) -> pd.DataFrame:
    """The tidy sweep table (``COLUMNS``): the operating point (the suite itself) first, then each point."""
    points = [{"suite": spec["suite"], "overrides": {}, "paper": True}] + [dict(p, paper=False) for p in spec["points"]]
    frames = []
    for p in points:
        long = collect(work, p["suite"], spec["models"], spec["benchmarks"], spec["seeds"])
        dec = [_decoder(work, p["suite"], r.model, r.benchmark, r.seed) for r in long.itertuples()]
        long["point"] = p["suite"]
        long["paper_setting"] = p["paper"]
        long["threshold"] = [d.get("threshold") for d, _ in dec]
        long["edit_threshold"] = [d.get("edit_threshold") if d.get("editing", True) else None for d, _ in dec]
        long["overrides"] = json.dumps(p["overrides"], sort_keys=True)
        long["decoder_sha256"] = [h for _, h in dec]
        frames.append(long)
    return pd.concat(frames, ignore_index=True)[COLUMNS]


def provenance(work: Path, spec: dict) -> dict:
    """What each point overrode and, per cell, the main table's provenance fields."""
    from repro.tables.__main__ import cell_provenance

    pts = [{"suite": spec["suite"], "overrides": {}, "paper_setting": True}] + \
          [{"suite": p["suite"], "overrides": p["overrides"], "paper_setting": False} for p in spec["points"]]
    for p in pts:
        p["cells"] = [cell_provenance(work, p["suite"], m["name"], b, s) for m in spec["models"]
                      for b in spec["benchmarks"] for s in spec["seeds"]]
    return {"suite": spec["suite"], "code_revision": code_revision(),
            "override_scope": "decoder configs of the sweep's own suites only (render_config --set); the "
                              "suite's main table keeps paper_decoding.json",
            "tpf_convention": "generated tokens up to the first EOS (EOS excluded) / (denoise + commit forwards); "
                              "prefill forwards excluded",
            "points": pts}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m repro.tables.sweep", description=__doc__.splitlines()[0])
    ap.add_argument("--work", required=True, type=Path)
    ap.add_argument("--spec", required=True, help="JSON: suite, seeds, benchmarks, models, points, reported")
    ap.add_argument("--out-dir", required=True, type=Path)
    a = ap.parse_args(argv)
    spec = json.loads(a.spec)
    df = collect_sweep(a.work, spec)
    out = a.out_dir
    atomic_write_text(out / "sweep.csv", df.to_csv(index=False, lineterminator="\n"))
    reported = None
    if spec.get("reported"):
        from repro.tables.reference import load_reported

        reported = load_reported()
    from repro.tables.plot import plot_sweep

    plot_sweep(df, spec, out / "sweep.png", out / "sweep.pdf", reported)
    atomic_write_text(out / "sweep.json", json.dumps(provenance(a.work, spec), indent=1, sort_keys=True) + "\n")
    view = df.groupby(["model", "benchmark", "point", "paper_setting", "threshold", "edit_threshold"], dropna=False,
                      sort=False)[["accuracy", "tpf"]].mean().reset_index()
    print(view.to_string(index=False, float_format=lambda x: f"{x:.2f}"))
    print(f"Sweep written to {(out / 'sweep.png').resolve()} (.pdf, .csv, .json beside it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
