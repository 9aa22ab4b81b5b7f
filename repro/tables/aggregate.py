"""Collect each cell's accuracy and TPF into a tidy long DataFrame.

Accuracy: the scorer's summary (percent; pass@1 for code, greedy n=1). TPF of a cell: total generated
tokens up to the first EOS divided by total denoise + commit forwards over the cell's problems
(prefill forwards excluded; the project's convention, docs/engine.md §6.10 and the README). Over several
seeds, the mean of the per-seed values.

Beside the numbers, each row says what they were measured on: ``n`` (problems scored), ``n_total``
(problems in the benchmark's source before the suite's ``limit``; from the problems' ``.meta.json``),
``data_source`` (``data_dir`` | ``hub`` | ``builtin``), ``temperature`` and ``max_new_tokens`` (of the rendered
decoder the generation used, from the generations' ``.meta.json``; temperature 0 = greedy; a suite's
``max_new_tokens`` overrides the paper's). The table caption is built from them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from repro import paths


def cell_tpf(generations: Path) -> tuple[float | None, int | None, int | None]:
    """(TPF, tokens, forwards) of one generation file; all three None if a record reports no forward counts
    (replayed samples, released SGLang: the long CSV then leaves them empty rather than writing 0).
    ValueError (``MergedFileChanged``) when a merged file changed since its merge wrote it."""
    from repro.backends.merge import check_merged

    check_merged(generations)
    toks = fwd = 0
    for line in generations.read_text().splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        if not r.get("forwards"):
            return None, None, None
        toks += r["generated_tokens"]
        fwd += r["forwards"]["denoise"] + r["forwards"]["commit"]
    return (toks / fwd if fwd else None), toks, fwd


def cell_tpf_note(generations: Path) -> str | None:
    """Why a generation file has no TPF: the ``forwards_note`` of its first record without forward counts
    (the backend says why, e.g. released SGLang reports none), ``"no forward counts"`` if it gave none;
    None when every record has counts."""
    for line in generations.read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            if not r.get("forwards"):
                return r.get("forwards_note") or "no forward counts"
    return None


class WorkFileDamaged(ValueError):
    """A JSON file that an earlier job of the workflow wrote (a score summary, a problems or generation file's
    ``.meta.json``) does not parse: changed or cut since."""


def read_json(path: Path, remake: Path | None = None) -> dict:
    """``path`` parsed as JSON. Raises :class:`WorkFileDamaged` naming the file, where it fails and the fix: delete
    ``remake`` (default: ``path`` itself; for a side file, the job output it belongs to) and run again, so that
    Snakemake makes it anew. Raises FileNotFoundError for a missing file."""
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        remake = remake or path
        also = "" if remake == path else f" (and {path.name})"
        raise WorkFileDamaged(f"{path}: not valid JSON ({e.msg}, line {e.lineno} column {e.colno}); an earlier job "
                              f"wrote it and it was changed or cut since. Delete {remake}{also} and run again: "
                              "Snakemake makes it anew, and what depends on it") from None


def read_summary(summary: Path, scores: Path, benchmark: str) -> dict:
    """A cell's score summary, checked against the per-problem verdicts it was computed from.

    When ``scores`` (the scorer's per-problem file beside ``summary``) exists, the summary is recomputed from it
    (:func:`repro.scoring.stats.summarize`) and must agree on ``n``, ``correct``, ``accuracy``, ``ci95`` and
    ``strict_accuracy``: a summary or verdict edited by hand (an accuracy of 99.0 over 3 problems) never reaches
    a table. Raises :class:`WorkFileDamaged` naming both files, the disagreement and the fix, or for a summary
    that does not parse (:func:`read_json`)."""
    summ = read_json(summary)
    if not scores.is_file():
        return summ
    from repro.io import read_jsonl
    from repro.scoring.stats import summarize

    try:
        want = summarize(benchmark, read_jsonl(scores))
    except (ValueError, KeyError, TypeError) as e:
        raise WorkFileDamaged(f"{scores}: not the scorer's per-problem verdicts ({e}); delete it and {summary.name} "
                              "and run again: the workflow scores the cell anew") from None
    k = next((k for k in ("n", "correct", "accuracy", "ci95", "strict_accuracy") if summ.get(k) != want.get(k)), None)
    if k is not None:
        raise WorkFileDamaged(f"{summary}: {k} = {summ.get(k)!r}, but the per-problem verdicts in {scores.name} give "
                              f"{want.get(k)!r}; one of the two was changed since the scorer wrote them. Delete both "
                              "and run again: the workflow scores the cell anew")
    return summ


def _meta(path: Path) -> dict:
    """The ``.meta.json`` beside a job output (``{}`` when there is none); :class:`WorkFileDamaged` if damaged."""
    return read_json(path, path.with_name(path.name.removesuffix(".meta.json"))) if path.exists() else {}


def decoder_setting(gen_meta: dict, key: str) -> float | None:
    """A setting (``temperature``, ``max_new_tokens``) of the decoder a generation file was made with, as a number;
    None if not recorded (replayed samples record no decoder)."""
    for sh in gen_meta.get("shards", [gen_meta]):  # the shards of one cell share one decoder file
        dec = sh.get("decoder")
        if isinstance(dec, dict) and dec.get(key) is not None:
            return float(dec[key])
    return None


def cell_precision(gen_meta: dict, quantization: str | None) -> str | None:
    """The precision a generation file was made at, as the model cards name it
    (:func:`repro.tables.render.precision_label` of the shards' ``precision`` and ``backend``, the MoE
    ``kernels`` and ``device`` their jobs recorded in ``backend_info``, and the quantization of the checkpoint
    each shard read: its recorded ``checkpoint_quantization``, else the model's declared ``quantization``);
    None for a replayed cell (no precision recorded)."""
    from repro.tables.render import precision_label

    shards = gen_meta.get("shards", [gen_meta])
    # the checkpoint each shard read, as its job recorded it (config.yaml's declaration for older metas)
    labels = sorted({precision_label(sh["precision"], sh.get("checkpoint_quantization", quantization),
                                     sh.get("backend"), (sh.get("backend_info") or {}).get("kernels"),
                                     (sh.get("backend_info") or {}).get("device", sh.get("device")))
                     for sh in shards if sh.get("precision")})
    return " / ".join(labels) or None


def labels_as_run(work: Path, suite: str, models: list[dict], benchmarks: list[str], seeds: list[int]) -> list[dict]:
    """``models`` (the table spec's ``{"name", "label", "quantization", ...}``) with each ``label`` saying how its
    jobs ran a quantized checkpoint (:func:`repro.tables.render.run_note` of every shard's ``precision``,
    ``backend`` and recorded ``checkpoint_quantization`` -- else the model's declared ``quantization`` -- in
    the generation metas of its cells; :func:`repro.tables.render.with_run_notes`): so a row never claims 4-bit
    experts for a job that ran the dequantized weights. Labels of unquantized and replayed models, and of cells
    without metas, are as given."""
    from repro.tables.render import run_note, with_run_notes

    out = []
    for m in models:
        notes = set()
        for b in benchmarks:
            for s in seeds:
                meta = _meta(work / (paths.GENERATIONS.format(suite=suite, model=m["name"], bench=b, seed=s)
                                     + ".meta.json"))
                for sh in meta.get("shards", [meta] if meta else []):
                    notes.add(run_note(sh.get("precision"), sh.get("checkpoint_quantization", m.get("quantization")),
                                       sh.get("backend")))
        out.append(dict(m, label=with_run_notes(m["label"], sorted(notes - {None}))))
    return out


def collect(work: Path, suite: str, models: list[dict], benchmarks: list[str], seeds: list[int]) -> pd.DataFrame:
    """Tidy rows: model, label, benchmark, seed, accuracy, ci_lo, ci_hi, n, n_total, data_source,
    temperature, max_new_tokens (the decoder's generation budget), backend (of the generation file; ``"replay"`` for replayed samples), precision (:func:`cell_precision`; ``models[i]["quantization"]`` is the checkpoint's), tpf,
    tokens, forwards, tpf_note (why TPF is missing, else None)."""
    rows = []
    for m in models:
        for b in benchmarks:
            for s in seeds:
                fmt = dict(suite=suite, model=m["name"], bench=b, seed=s)
                summ = read_summary(work / paths.SUMMARY.format(**fmt), work / paths.SCORES.format(**fmt), b)
                tpf, toks, fwd = cell_tpf(work / paths.GENERATIONS.format(**fmt))
                prob_meta = _meta(work / (paths.PROBLEMS.format(**fmt) + ".meta.json"))
                gen_meta = _meta(work / (paths.GENERATIONS.format(**fmt) + ".meta.json"))
                ci = summ.get("ci95") or [None, None]
                rows.append({"model": m["name"], "label": m["label"], "benchmark": b, "seed": s,
                             "accuracy": summ["accuracy"], "ci_lo": ci[0], "ci_hi": ci[1], "n": summ["n"],
                             "n_total": prob_meta.get("total"), "data_source": prob_meta.get("source"),
                             "temperature": decoder_setting(gen_meta, "temperature"),
                             "max_new_tokens": decoder_setting(gen_meta, "max_new_tokens"),
                             "backend": gen_meta.get("backend") or (gen_meta.get("shards") or [{}])[0].get("backend"),
                             "precision": cell_precision(gen_meta, m.get("quantization")),
                             "tpf": tpf, "tokens": toks, "forwards": fwd,
                             "tpf_note": cell_tpf_note(work / paths.GENERATIONS.format(**fmt)) if tpf is None
                             else None})
    return pd.DataFrame(rows)
