"""`python -m repro.tables`: write results/<suite>/main_table.{md,tex,csv}, main_table_long.csv, provenance.json.

    python -m repro.tables --work WORK --suite smoke --spec '{"models": [{"name":..,"label":..}],
        "benchmarks": [...], "seeds": [...], "backend": "engine"}' --out-dir results/smoke

Provenance per cell: checkpoint manifest hash, decoder config hash, problems file hash (and the
original data file's hash and source), seed, code revision, backend, device, prompt template version;
for the run: the Apptainer images' sha256 sidecars (when containers are enabled).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from repro import paths
from repro.io import atomic_write_text
from repro.provenance import code_revision
from repro.tables.aggregate import collect
from repro.provenance import STAGE_CODE, stage_code_version
from repro.tables.render import caption, tex_header, to_csv, to_latex, to_markdown, wide


def cell_provenance(work: Path, suite: str, model: str, bench: str, seed: int) -> dict:
    fmt = dict(suite=suite, model=model, bench=bench, seed=seed)
    gen_meta = json.loads((work / (paths.GENERATIONS.format(**fmt) + ".meta.json")).read_text())
    shards = gen_meta.get("shards", [gen_meta])
    first = shards[0]
    prob_meta_path = work / (paths.PROBLEMS.format(**fmt) + ".meta.json")
    prob_meta = json.loads(prob_meta_path.read_text()) if prob_meta_path.exists() else {}
    first_rec = (work / paths.GENERATIONS.format(**fmt)).read_text().split("\n", 1)[0]
    tv = json.loads(first_rec).get("template_version") if first_rec.strip() else None
    return {
        "model": model, "benchmark": bench, "seed": seed,
        "checkpoint_manifest_sha256": first.get("checkpoint_manifest_sha256"),
        "decoder_sha256": first.get("decoder_sha256"),
        "problems_sha256": first.get("problems_sha256"),
        "data_source": prob_meta.get("source"), "data_sha256": prob_meta.get("sha256"),
        "data_location": prob_meta.get("location"), "problems_kept": prob_meta.get("kept"),
        "problems_total": prob_meta.get("total"),
        "code_revision": first.get("code_revision"), "backend": first.get("backend"),
        "device": (first.get("backend_info") or {}).get("device", first.get("device")),
        "precision": first.get("precision"), "num_shards": len(shards), "prompt_template_version": tv,
        "torch": (first.get("backend_info") or {}).get("torch"), "decoder": first.get("decoder"),
        "engine_path": (first.get("backend_info") or {}).get("engine_path"),
        "generation_code_version": first.get("code_version"),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m repro.tables", description=__doc__.splitlines()[0])
    ap.add_argument("--work", required=True, type=Path)
    ap.add_argument("--suite", required=True)
    ap.add_argument("--spec", required=True, help="JSON: models [{name, label, checkpoint_source}], benchmarks, "
                    "seeds, backend, latex_label")
    ap.add_argument("--out-dir", required=True, type=Path)
    ap.add_argument("--image-sidecars", nargs="*", type=Path, default=[],
                    help="<image>.sif.json files of the Apptainer images the run used (sha256 into provenance)")
    a = ap.parse_args(argv)
    spec = json.loads(a.spec)
    long = collect(a.work, a.suite, spec["models"], spec["benchmarks"], spec["seeds"])
    rows = wide(long, spec["benchmarks"])
    cells = [dict(cell_provenance(a.work, a.suite, m["name"], b, s), checkpoint_source=m.get("checkpoint_source"))
             for m in spec["models"] for b in spec["benchmarks"] for s in spec["seeds"]]
    # the caption says what was run: decoding (from the decoders' temperatures), problems scored per
    # benchmark (and "of <full size>" when the suite's limit cut it), shipped non-benchmark problems
    cap = dict(benchmarks=spec["benchmarks"], suite=a.suite, backend=spec.get("backend", "engine"),
               seeds=spec["seeds"])
    out = a.out_dir
    atomic_write_text(out / "main_table.md", caption(long, **cap) + "\n\n" + to_markdown(rows, spec["benchmarks"]))
    label = spec.get("latex_label") or f"tab:main-{a.suite}"
    header = tex_header(a.suite, cap["backend"], spec["seeds"])
    atomic_write_text(out / "main_table.tex", to_latex(rows, spec["benchmarks"], caption(long, latex=True, **cap),
                                                       label, escape_caption=False, header=header))
    atomic_write_text(out / "main_table.csv", to_csv(rows, spec["benchmarks"]))
    atomic_write_text(out / "main_table_long.csv", long.to_csv(index=False, lineterminator="\n"))
    # the code versions of the stages (sha256 of their sources): scores and the table are current with
    # this checkout (the workflow re-runs them when these change); generation records its own per cell
    versions = {st: stage_code_version(st) for st in STAGE_CODE if st not in ("generate", "tiny")}
    prov = {"suite": a.suite, "code_revision": code_revision(), "code_versions": versions,
            "images": [json.loads(p.read_text()) for p in a.image_sidecars] or "none (containers disabled: native run)",
            "tpf_convention": "generated tokens up to the first EOS (EOS excluded) / (denoise + commit forwards); "
                              "prefill forwards excluded",
            "cells": cells}
    atomic_write_text(out / "provenance.json", json.dumps(prov, indent=1, sort_keys=True) + "\n")
    print((out / "main_table.md").read_text())
    print(f"Table written to {(out / 'main_table.md').resolve()} (.tex, .csv beside it; provenance.json)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
