"""`python -m repro.tables`: write results/<suite>/main_table.{md,tex,csv}, main_table_long.csv, provenance.json.

    python -m repro.tables compare RUN_A RUN_B [--out PREFIX]     # per-problem differences (compare.py)
    python -m repro.tables --work WORK --suite smoke --spec '{"models": [{"name":..,"label":..}],
        "benchmarks": [...], "seeds": [...], "backend": "engine"}' --out-dir results/smoke

Provenance per cell: checkpoint manifest hash, decoder config hash, problems file hash (and the
original data file's hash and source), seed, code revision, backend, device, precision (as run, and
``precision_label`` as the model cards name it, with the checkpoint's ``quantization``), for a dequantized
NVFP4 checkpoint (SGLang) ``quant_provenance`` (the copy's quant_provenance.json), prompt template version,
and each shard's generation job (fixed costs, GPU, batch size);
for the run: the Apptainer images' sha256 sidecars (when containers are enabled), and per benchmark the
independent graders with their versions and per cell its listed verdicts and band (``independent_graders``; also
one sentence under the ``.md`` caption, a ``%`` line of the ``.tex`` and ``listed_verdicts.md`` beside the table:
``repro/tables/disagreements.py``).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

import pandas as pd

from repro import paths
from repro.backends.merge import MergedFileChanged
from repro.io import atomic_write_text, read_jsonl
from repro.provenance import code_revision, sha256_path
from repro.tables import disagreements
from repro.tables.aggregate import WorkFileDamaged, cell_precision, collect, labels_as_run
from repro.backends.replay import caption_note as replay_caption
from repro.provenance import STAGE_CODE, stage_code_version
from repro.tables.reference import (REPORTED_PATH, compare_reported, csv_rows, footnote, latex_rows, load_reported,
                                    long_csv, markdown_rows)
from repro.tables.render import caption, tex_header, to_csv, to_latex, to_markdown, wide


def cell_provenance(work: Path, suite: str, model: str, bench: str, seed: int, quantization: str | None = None) -> dict:
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
        "precision": first.get("precision"), "quantization": quantization,
        "precision_label": cell_precision(gen_meta, quantization),
        "quant_provenance": (first.get("backend_info") or {}).get("quant_provenance"),
        "num_shards": len(shards), "prompt_template_version": tv,
        "torch": (first.get("backend_info") or {}).get("torch"), "decoder": first.get("decoder"),
        "engine_path": (first.get("backend_info") or {}).get("engine_path"),
        "kernel_tiles": (first.get("backend_info") or {}).get("tiles"),  # which tuned tile entry ran (GPU)
        "generation_code_version": first.get("code_version"),
        # per shard: the job that finished it and its fixed costs (model load s, graph capture s, benchmarks
        # sharing the load, GPU, start/end), and the batch size it generated at (repro.backends.generation_job)
        "generation_jobs": [dict(sh.get("job") or {}, shard=sh.get("shard"), batch_size=sh.get("batch_size"))
                            for sh in shards if "shard" in sh],
        "samples": first.get("samples"),  # replayed cells: the samples file, its sha256, the note
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["compare"]:  # python -m repro.tables compare RUN_A RUN_B (repro/tables/compare.py)
        from repro.tables.compare import main as compare_main

        return compare_main(argv[1:])
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
    # every row label, caption and reference row names the model as it ran (a quantized checkpoint: how)
    try:
        spec["models"] = labels_as_run(a.work, a.suite, spec["models"], spec["benchmarks"], spec["seeds"])
        long = collect(a.work, a.suite, spec["models"], spec["benchmarks"], spec["seeds"])
    except (MergedFileChanged, WorkFileDamaged) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows = wide(long, spec["benchmarks"])
    cells = [dict(cell_provenance(a.work, a.suite, m["name"], b, s, m.get("quantization")),
                  checkpoint_source=m.get("checkpoint_source"))
             for m in spec["models"] for b in spec["benchmarks"] for s in spec["seeds"]]
    # the caption says what was run: decoding (from the decoders' temperatures), problems scored per
    # benchmark (and "of <full size>" when the suite's limit cut it), shipped non-benchmark problems
    cap = dict(benchmarks=spec["benchmarks"], suite=a.suite, backend=spec.get("backend", "engine"),
               seeds=spec["seeds"])
    # replayed models (repro/backends/replay.py) decode nothing: the caption's decoding is the generating
    # models', and a sentence per replayed row says where its samples came from
    replayed = [m for m in spec["models"] if m.get("replay")]
    cap_long = long[~long["model"].isin([m["name"] for m in replayed])] if len(replayed) < len(spec["models"]) else long
    notes_md = notes_tex = ""
    for m in replayed:
        samples = next((c.get("samples") for c in cells if c["model"] == m["name"] and c.get("samples")), None) or {}
        has_tpf = long[long["model"] == m["name"]]["tpf"].notna().any()
        # reference solutions must score 100: name every one a scorer rejects, with its reason
        rejected = [] if samples.get("kind") != "reference" else [
            f"{s['id']} ({s.get('reason', '')[:120]})" for b in spec["benchmarks"] for seed in spec["seeds"]
            for s in read_jsonl(a.work / paths.SCORES.format(suite=a.suite, model=m["name"], bench=b, seed=seed))
            if not s["correct"]]
        notes_md += " " + replay_caption(m["label"], samples, has_tpf, rejected=rejected)
        notes_tex += " " + replay_caption(m["label"], samples, has_tpf, latex=True, rejected=rejected)
    # the independent graders' listed verdicts (never a number of the table): one sentence under the caption with
    # each cell's band, the details in listed_verdicts.md beside the table, the graders and versions in provenance
    try:
        second = disagreements.collect(a.work, a.suite, spec["models"], spec["benchmarks"], spec["seeds"])
    except WorkFileDamaged as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    details_path = a.out_dir / disagreements.DETAILS_FILE
    # named beside the table, not by a path: the table reads the same wherever the run wrote it (the CI compares a
    # local and a Slurm run's tables byte for byte)
    second_md = disagreements.sentence(second, f"{disagreements.DETAILS_FILE} (beside this table)")
    md_table, csv_text = to_markdown(rows, spec["benchmarks"]), to_csv(rows, spec["benchmarks"])
    label = spec.get("latex_label") or f"tab:main-{a.suite}"
    tex = to_latex(rows, spec["benchmarks"], caption(cap_long, latex=True, **cap) + notes_tex, label,
                   escape_caption=False, header=tex_header(a.suite, cap["backend"], spec["seeds"])
                   + ([f"% {second_md}"] if second_md else []))
    atomic_write_text(details_path, disagreements.details(second, a.suite))
    footer = ""
    out = a.out_dir
    if spec.get("reported"):  # reference rows: the paper's numbers beside ours (repro/tables/reference.py)
        ref = compare_reported(long, spec["models"], spec["benchmarks"])
        md_table += markdown_rows(ref, spec["benchmarks"])
        footer = "\n\u00b9 " + footnote(ref) + "\n"
        tex = tex.replace("\\bottomrule", "\n".join(latex_rows(ref, spec["benchmarks"])) + "\n\\bottomrule", 1) if ref else tex
        tex = tex.replace("}\n\\label{", " " + footnote(ref, latex=True) + "}\n\\label{", 1)
        cols = list(pd.read_csv(io.StringIO(csv_text), nrows=0).columns)
        csv_text = pd.concat([pd.read_csv(io.StringIO(csv_text), dtype=str, keep_default_na=False),
                              pd.DataFrame(csv_rows(ref, spec["benchmarks"], list(cols)))]).to_csv(
            index=False, lineterminator="\n")
        atomic_write_text(out / "main_table_reported.csv", long_csv(ref, spec["benchmarks"]))
    atomic_write_text(out / "main_table.md", caption(cap_long, **cap) + notes_md + "\n\n"
                      + (second_md + "\n\n" if second_md else "") + md_table + footer)
    atomic_write_text(out / "main_table.tex", tex)
    atomic_write_text(out / "main_table.csv", csv_text)
    atomic_write_text(out / "main_table_long.csv", long.to_csv(index=False, lineterminator="\n"))
    # the code versions of the stages (sha256 of their sources): scores and the table are current with
    # this checkout (the workflow re-runs them when these change); generation records its own per cell
    versions = {st: stage_code_version(st) for st in STAGE_CODE if st not in ("generate", "tiny", "dequantize")}
    prov = {"suite": a.suite, "code_revision": code_revision(), "code_versions": versions,
            "images": [json.loads(p.read_text()) for p in a.image_sidecars] or "none (containers disabled: native run)",
            "tpf_convention": "generated tokens up to the first EOS (EOS excluded) / (denoise + commit forwards); "
                              "prefill forwards excluded",
            "cells": cells, "independent_graders": disagreements.provenance(second)}
    if spec.get("reported"):
        prov["reported"] = {"file": "repro/tables/reported.json", "sha256": sha256_path(REPORTED_PATH),
                            "sources": [{k: s.get(k) for k in ("key", "citation", "url", "table", "date_read")}
                                        for s in load_reported()]}
    atomic_write_text(out / "provenance.json", json.dumps(prov, indent=1, sort_keys=True) + "\n")
    print((out / "main_table.md").read_text())
    print(f"Table written to {(out / 'main_table.md').resolve()} (.tex, .csv beside it; provenance.json)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
