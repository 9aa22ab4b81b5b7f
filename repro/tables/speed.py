"""`python -m repro.tables.speed`: the speed table beside the main table, as the model cards report speed.

    python -m repro.tables.speed --work WORK --suite smoke --spec SPEC_JSON --out-dir results/smoke

Writes ``speed_table.{md,tex,csv}`` in ``--out-dir`` (``SPEC_JSON``: the main table's spec, models and
benchmarks). One row per generated model × benchmark (replayed models decode nothing and are skipped), from
the generation records and their shard metas only (nothing is re-run):

* ``tokens/s (1 req.)``: tokens per second of a **single request** = Σ generated tokens / Σ ``wall_s``
  over the first :data:`SUBSET` problems (problem order) of seed ``seeds[0]`` whose records were made at
  batch 1 (the model cards' convention: "tokens/s for a single request"; the paper reports GSM8K and
  HumanEval). A suite generated batched has no such records: its **speed probe** (``--probe-benchmarks``;
  workflow rule ``speed_probe``) ran the first :data:`SUBSET` problems of those benchmarks one request at a time
  at batch 1 in a separate job, and its records (``<work>/<suite>/speed/<model>/<bench>.jsonl``,
  ``repro.paths.SPEED_PROBE``, + ``.meta.json``) give this column and ``ms/forward (1 req.)`` (the caption says
  so and names the probe's engine path); ``-`` for a benchmark without a probe.
* ``TPF``: Σ generated / Σ (denoise + commit) over all records (the main table's convention).
* ``ms/forward (1 req.)``: Σ ``wall_s`` / Σ forwards (prefill + denoise + commit) over the same subset.
* ``tokens/s (batch N)``: the jobs' throughput at the suite's batch size: Σ generated / Σ generation
  seconds of every session that wrote the shards' records (``generation_sessions`` of the shard metas, a
  session killed and resumed included); a meta written before those were recorded gives only the session that
  finished the shard (``generated_last_session``), and the caption names such cells when the shard was resumed
  (:func:`last_session_sentence`); and
  ``ms/round (batch N)``: the batched engine's mean round time (``backend_info.batch``), ``-`` at batch 1.
* ``load s``: model load seconds per generation job (the shard metas' ``job.model_load_s``, else
  ``backend_info.load_s``; mean over the distinct jobs that made the cell's shards, a killed job's included
  when its session is recorded in ``generation_sessions``), and ``capture s``: CUDA-graph
  capture seconds per job (``job.graph_capture_s``: the seconds spent capturing while generating the cell's
  shards, over those jobs; ``-`` when none was recorded). A grouped job (suite ``group_benchmarks``) serves
  several benchmarks with one load, and its first benchmark pays the captures.

Below the table, a note sums these fixed costs over the distinct jobs (a job's id is in every shard meta it
wrote): how many jobs loaded a model (a killed one included), the mean load, how many benchmarks each load
served (the shards each job finished, counted from the metas: a killed job's recorded
``job.benchmarks_sharing_load`` is what it planned, not what it finished), the graph capture seconds per job
and in all, and the speed probe jobs' loads (their metas' ``job``), which generate nothing of the table's records.

A last row ``all`` sums each column's numerators and denominators over the rows. The caption names the
device (GPU name), engine path and batch size, read from the shard metas, and each model's precision as the
model cards name it (``repro.tables.render.precision_label``: the shards' precision and backend, the
checkpoint's ``quantization`` from the spec). The ``.tex`` is
ready for a paper, as the main table's: its first line names the packages it needs (booktabs, graphicx),
suite and engine path go to a ``%`` comment. Its ten columns are a ``table*`` (both columns of a two-column
article: in one column they shrank to about 5 pt), column titles on two rows, and ``\\resizebox`` shrinks it to
the text width only when wider.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import pandas as pd

from repro import paths
from repro.backends.merge import MergedFileChanged, check_merged
from repro.benchmarks import get as declared_benchmark
from repro.io import atomic_write_text, read_jsonl
from repro.tables.aggregate import WorkFileDamaged, cell_precision, labels_as_run, read_json
from repro.tables.render import fmt, latex_escape, precision_sentence

#: Problems per benchmark (first in problem order) over which single-request tokens/s is measured (the speed
#: probe runs as many: repro.paths.SPEED_SUBSET).
SUBSET = paths.SPEED_SUBSET

COLUMNS = [("tps_single", "tokens/s (1 req.)", 1), ("tpf", "TPF", 2), ("ms_per_forward", "ms/forward (1 req.)", 1),
           ("tps_batch", "tokens/s (batch N)", 1), ("ms_per_round_batch", "ms/round (batch N)", 1),
           ("load_s", "load s", 2), ("capture_s", "capture s", 2)]


def _ratio(num: float, den: float, scale: float = 1.0):
    return num / den * scale if den else None


def _job_entry(jobs: dict, jid: str, load) -> dict:
    return jobs.setdefault(jid, {"load_s": load, "finished": 0, "capture_s": None})


def job_costs(metas: list[dict], cell: str = "") -> dict:
    """``{job id: {"load_s", "finished", "capture_s"}}`` of the jobs that made ``metas`` (one cell's shards):
    each job's model load, the shards it finished (one per benchmark) and its capture seconds (module
    docstring). A meta with ``generation_sessions`` counts every session's job, a killed one's load and capture
    included, and credits the shard to the job of its last session (a rerun that found nothing left loaded
    nothing). An older meta counts only the job that finished the shard (``job``), and one without job facts
    counts as a job of its own, ``cell#index``, with ``backend_info.load_s``."""
    jobs: dict[str, dict] = {}
    for i, m in enumerate(metas):
        j = m.get("job") or {}
        sessions = m.get("generation_sessions")
        if sessions is not None:
            for k, s in enumerate(sessions):
                sj = s.get("job") or {}
                e = _job_entry(jobs, sj.get("id") or f"{cell}#{i}.{k}", sj.get("model_load_s"))
                if s.get("graph_capture_s") is not None:
                    e["capture_s"] = (e["capture_s"] or 0.0) + s["graph_capture_s"]
                e["finished"] += k == len(sessions) - 1
            continue
        if j and not j.get("benchmarks_sharing_load"):
            continue  # a rerun that found nothing left: no model loaded
        load = j.get("model_load_s") if j else (m.get("backend_info") or {}).get("load_s")
        e = _job_entry(jobs, j.get("id") or f"{cell}#{i}", load)
        e["finished"] += 1
        if j.get("graph_capture_s") is not None:
            e["capture_s"] = (e["capture_s"] or 0.0) + j["graph_capture_s"]
    return jobs


def merge_jobs(a: dict, b: dict) -> dict:
    """Job costs of two sets of cells: a job seen in both (one grouped job, two benchmarks) is one load; its
    finished shards and capture seconds add up."""
    out = {k: dict(v) for k, v in a.items()}
    for k, v in b.items():
        if k not in out:
            out[k] = dict(v)
            continue
        out[k]["finished"] += v["finished"]
        if v["capture_s"] is not None:
            out[k]["capture_s"] = (out[k]["capture_s"] or 0.0) + v["capture_s"]
        if out[k]["load_s"] is None:
            out[k]["load_s"] = v["load_s"]
    return out


def batch_sums(metas: list[dict], cell: str = "") -> dict:
    """``batch_tokens`` and ``batch_wall`` (generated tokens and generation seconds of every session that wrote
    the shards' records: ``generation_sessions``), and ``last_session_only``: ``[cell]`` when an older meta of a
    resumed shard records only the session that finished it (``generated_last_session``), so the earlier
    sessions' tokens and seconds are not known."""
    toks = wall = 0.0
    partial = False
    for m in metas:
        sessions = m.get("generation_sessions")
        if sessions is None:
            last = m.get("generated_last_session")
            sessions = [last] if last else []
            # resumed (several backend sessions), or finished by a rerun that generated nothing
            partial |= len(m.get("backend_sessions") or []) > 1 or (not last and bool(m.get("backend_sessions")))
        toks += sum(s.get("generated_tokens", 0) for s in sessions)
        wall += sum(s.get("wall_s", 0.0) for s in sessions)
    return {"batch_tokens": toks, "batch_wall": wall, "last_session_only": [cell] if partial else []}


def _forwards(r: dict, kinds: tuple[str, ...]) -> int:
    return sum((r.get("forwards") or {}).get(k, 0) for k in kinds)


def single_sums(records: list[dict]) -> dict:
    """``n_single``, ``single_tokens``, ``single_wall``, ``single_forwards`` over the first :data:`SUBSET` engine
    records made at batch 1 (module docstring)."""
    single = [r for r in records if r.get("backend") == "engine" and r.get("batch_size", 1) == 1
              and r.get("wall_s")][:SUBSET]
    return {"n_single": len(single), "single_tokens": sum(r["generated_tokens"] for r in single),
            "single_wall": sum(r["wall_s"] for r in single),
            "single_forwards": sum(_forwards(r, ("prefill", "denoise", "commit")) for r in single)}


def cell_sums(records: list[dict], metas: list[dict], cell: str = "", probe: tuple[list, dict] | None = None) -> dict:
    """The numerators/denominators of one model × benchmark (module docstring), plus what the caption needs.
    ``probe``: the speed probe's ``(records, meta)``, whose batch-1 records replace the generation's for the
    single-request sums."""
    fw = _forwards
    counted = [r for r in records if r.get("forwards")]
    infos = [m.get("backend_info") or {} for m in metas]
    rounds = [i["batch"] for i in infos if i.get("batch")]
    pinfo = ((probe[1] or {}).get("backend_info") or {}) if probe else {}
    return {
        **single_sums(probe[0] if probe else records),
        "probe_benchmarks": [cell.split("/")[-1]] if probe else [],
        "probe_devices": [str(pinfo["device"])] if pinfo.get("device") else [],
        "probe_engine_paths": [str(pinfo["engine_path"])] if pinfo.get("engine_path") else [],
        "tokens": sum(r["generated_tokens"] for r in counted),
        "tpf_forwards": sum(fw(r, ("denoise", "commit")) for r in counted),
        **batch_sums(metas, cell),
        "round_s": sum(b["mean_round_s"] * b["rounds"] for b in rounds), "rounds": sum(b["rounds"] for b in rounds),
        "jobs": job_costs(metas, cell),
        "probe_jobs": job_costs([probe[1]], f"probe:{cell}") if probe and probe[1] else {},
        "batch_sizes": sorted({m.get("batch_size", 1) for m in metas}),
        "devices": sorted({str(i.get("device")) for i in infos if i.get("device")}),
        "precisions": sorted({str(m.get("precision")) for m in metas if m.get("precision")}),
        "engine_paths": sorted({str(i.get("engine_path")) for i in infos if i.get("engine_path")}),
        "tiles": sorted({str(i["tiles"]) for i in infos if i.get("tiles")}),
    }


def row_values(s: dict) -> dict:
    """The printed numbers of a row from its sums."""
    return {"tps_single": _ratio(s["single_tokens"], s["single_wall"]), "tpf": _ratio(s["tokens"], s["tpf_forwards"]),
            "ms_per_forward": _ratio(s["single_wall"], s["single_forwards"], 1000.0),
            "tps_batch": _ratio(s["batch_tokens"], s["batch_wall"]),
            "ms_per_round_batch": _ratio(s["round_s"], s["rounds"], 1000.0), **_job_means(s["jobs"]),
            "n_single": s["n_single"]}


def _job_means(jobs: dict) -> dict:
    loads = [j["load_s"] for j in jobs.values() if j["load_s"] is not None]
    caps = [j["capture_s"] for j in jobs.values() if j["capture_s"] is not None]
    return {"load_s": _ratio(sum(loads), len(loads)), "capture_s": _ratio(sum(caps), len(caps))}


def fixed_costs_note(total: dict) -> str:
    """One sentence on the run's fixed costs per generation job (module docstring); "" when none recorded."""
    jobs = [j for j in (total.get("jobs") or {}).values() if j["load_s"] is not None]
    probes = [j["load_s"] for j in (total.get("probe_jobs") or {}).values() if j["load_s"] is not None]
    if not jobs and not probes:
        return ""
    text = "Fixed costs: "
    if jobs:
        loads = [j["load_s"] for j in jobs]
        caps = [j["capture_s"] for j in jobs if j["capture_s"] is not None]
        share = sum(j["finished"] for j in jobs) / len(jobs)
        stopped = sum(1 for j in jobs if not j["finished"])
        text += (f"{len(jobs)} generation job{'s' if len(jobs) != 1 else ''} loaded a model"
                 + (f" ({stopped} stopped before finishing a benchmark)" if stopped else "")
                 + f", {sum(loads) / len(loads):.2f} s per load on average ({_total_s(loads)} s in all); each load "
                 f"served {share:.2g} benchmark{'s' if share != 1 else ''} on average (counting the benchmarks "
                 "its job finished)")
        if share > 1:
            text += ("; a grouped job's one load appears in the load s column of each benchmark it served, so the "
                     "column is not to be summed down")
        if caps:
            text += f"; CUDA-graph capture {sum(caps) / len(caps):.2f} s per job ({_total_s(caps)} s in all)"
    if probes:
        text += ("; " if jobs else "") + (
            f"the speed probe's {len(probes)} job{'s' if len(probes) != 1 else ''} loaded it again, "
            f"{sum(probes) / len(probes):.2f} s per load ({_total_s(probes)} s in all)")
    return text + "."


def _total_s(values: list[float]) -> str:
    """A sum of seconds printed as precisely as the per-job means beside it (two decimals below 10 s): 3 loads of
    0.02 s read "0.06 s in all", not "0.1"."""
    total = sum(values)
    return f"{total:.2f}" if total < 10 else f"{total:.1f}"


def read_probe(work: Path, suite: str, model: str, bench: str) -> tuple[list[dict], dict]:
    """The speed probe's records and meta of one model × benchmark. FileNotFoundError names a missing file."""
    p = work / paths.SPEED_PROBE.format(suite=suite, model=model, bench=bench)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: speed probe missing; run the speed_table target (rule speed_probe) first")
    meta_p = Path(str(p) + ".meta.json")
    return read_jsonl(p), (read_json(meta_p, p) if meta_p.is_file() else {})


def build(work: Path, suite: str, spec: dict, probe_benchmarks=()) -> tuple[list[dict], dict]:
    """Rows (label, benchmark, values) and the summed facts for the caption; ``probe_benchmarks``: those whose
    single-request columns come from the speed probe (:func:`read_probe`). Raises FileNotFoundError naming a
    missing generation or probe file, ``MergedFileChanged`` a merged generation file changed since its merge,
    ``WorkFileDamaged`` a ``.meta.json`` beside them that does not parse."""
    seed = spec["seeds"][0]
    rows, total = [], None
    per_model: dict[str, str] = {}  # label -> precision as the model cards name it
    # row labels as the main table's: a quantized checkpoint's label says how its jobs ran it
    for m in labels_as_run(work, suite, spec["models"], spec["benchmarks"], [seed]):
        if m.get("replay"):
            continue
        for b in spec["benchmarks"]:
            g = work / paths.GENERATIONS.format(suite=suite, model=m["name"], bench=b, seed=seed)
            if not g.is_file():
                raise FileNotFoundError(f"{g}: generation file missing; run the main table's generation first")
            check_merged(g)
            meta_p = Path(str(g) + ".meta.json")
            meta = read_json(meta_p, g) if meta_p.is_file() else {}
            probe = read_probe(work, suite, m["name"], b) if b in probe_benchmarks else None
            s = cell_sums(read_jsonl(g), meta.get("shards", [meta] if meta else []), cell=f"{m['name']}/{b}",
                          probe=probe)
            if s["last_session_only"]:  # named in the caption as the table names the row
                s["last_session_only"] = [f"{m['label']} on {declared_benchmark(b).title}"]
            prec = cell_precision(meta, m.get("quantization")) if meta else None
            if prec:
                per_model[m["label"]] = " / ".join(sorted({*per_model.get(m["label"], prec).split(" / "),
                                                          *prec.split(" / ")}))
            rows.append({"model": m["name"], "label": m["label"], "benchmark": b, **row_values(s)})
            if total is None:
                total = dict(s)
            else:
                for k, v in s.items():
                    total[k] = (merge_jobs(total[k], v) if isinstance(v, dict) else
                                sorted(set(total[k]) | set(v)) if isinstance(v, list) else total[k] + v)
    if total is not None:
        rows.append({"model": "all", "label": "all", "benchmark": "all", **row_values(total)})
        total["model_precisions"] = per_model
    per_row = [r["n_single"] for r in rows if r["benchmark"] != "all" and r["n_single"]]
    if total:  # how many problems the single-request columns cover (the caption's words: _subset_words)
        total = {**total, "n_single_max": max(per_row, default=SUBSET), "n_single_uneven": len(set(per_row)) > 1}
    return rows, total or {}


def _device(d: str) -> str:
    """A recorded device, "1 threads" made singular (records written before the engine said ``1 thread``)."""
    return re.sub(r"\b1 threads\b", "1 thread", d)


def caption(total: dict, suite: str, latex: bool = False) -> str:
    """What the numbers were measured on (device, batch size, subset, each model's precision as the model cards
    name it: ``total["model_precisions"]``, else the raw ``precisions``). The Markdown caption also names the
    suite and engine path; the LaTeX one is in a paper's words (those go to the ``%`` header,
    :func:`tex_header`) and escaped."""
    bs = total.get("batch_sizes") or [1]
    dev = ", ".join(_device(d) for d in (total.get("devices") or ["device not recorded"]))
    # one precision for every model: named beside the device; several: a sentence naming each model's
    per_model = total.get("model_precisions") or {}
    several = len(set(per_model.values())) > 1
    prec_sentence = precision_sentence(per_model) if several else ""
    prec = "" if several else ", " + (next(iter(per_model.values()), None)
                                      or ", ".join(total.get("precisions") or ["precision not recorded"]))
    path = ", ".join(total.get("engine_paths") or ["?"])
    n = "N = " + ", ".join(map(str, bs))
    probed = total.get("probe_benchmarks") or []
    first, why = _subset_words(total)
    if probed:
        names = " and ".join(declared_benchmark(b).title for b in sorted(probed))
        ppath = ", ".join(total.get("probe_engine_paths") or ["?"])
        pdev = ", ".join(_device(d) for d in (total.get("probe_devices") or [])) or dev
        single = (f"single-request tokens/s and ms/forward (1 req.) over {first} of {names}{why}, "
                  f"measured in a separate speed-probe run one request at a time at batch 1 on {pdev}, "
                  f"engine path {ppath}; '-' for the other benchmarks")
    elif 1 in bs:
        single = f"single-request tokens/s over {first} of each benchmark generated at batch 1{why}"
    else:
        single = ("single-request tokens/s not measured in this run (generated batched and no speed probe: set "
                  "the suite's speed_benchmarks in config.yaml)")
    where = (f"Decoding speed on {dev}{prec}, batch {n}" if latex else
             f"Decoding speed ({suite} suite) on {dev}{prec}, engine path {path}, batch {n}")
    text = (f"{where}: {single}; "
            "TPF = generated tokens / (denoise + commit forwards); tokens/s (batch N) = generated tokens / "
            "generation seconds of the jobs; ms/round (batch N) = the batched engine's mean round; load s = "
            "model load per generation job; capture s = CUDA-graph capture per generation job." + prec_sentence
            + tiles_sentence(total.get("tiles") or [])
            + last_session_sentence(total.get("last_session_only") or []))
    return latex_escape(text) if latex else text


def tiles_sentence(tiles: list[str]) -> str:
    """The caption's words on the GPU kernel tiles that ran (``repro.engine.kernels.configs.tiles_report``'s
    summaries, as the generation jobs recorded them), e.g. " Kernel tiles: tuned on NVIDIA H200, used on NVIDIA
    H100 80GB HBM3."; "" when no job ran on a GPU."""
    if not tiles:
        return ""
    said = "; ".join(t[len("tiles "):] if t.startswith("tiles ") else t for t in tiles)
    return f" Kernel tiles: {said}."


def _subset_words(total: dict) -> tuple[str, str]:
    """How the caption names the problems the single-request columns cover, and a remark: the first
    :data:`SUBSET`, or -- when fewer were generated (the suite's ``limit``) -- as many as column n shows. (No
    "suite" in the words: the LaTeX caption is in a paper's words.)"""
    n_max = total.get("n_single_max", SUBSET)
    if n_max >= SUBSET:
        return f"the first {SUBSET} problems", ""
    if total.get("n_single_uneven"):
        return f"the first {SUBSET} problems", " (all there are where fewer: column n)"
    return f"the first {n_max} problems", f" (all that were generated; the subset is capped at {SUBSET} problems)"


def last_session_sentence(cells: list[str]) -> str:
    """The caption's warning for cells whose batch figures cover only the session that finished a resumed
    shard (metas written before every session's figures were recorded); "" when none."""
    if not cells:
        return ""
    named = ", ".join(sorted(cells))
    return (f" Tokens/s (batch N) of {named} counts only the session that finished each shard: the shard was "
            "resumed after a stop and its meta predates per-session figures, so the earlier sessions' tokens, "
            "seconds and model load are not counted (delete the shard to measure it again).")


def tex_header(total: dict, suite: str) -> list[str]:
    """The ``%`` lines atop ``speed_table.tex``: the packages it needs and what its caption leaves out."""
    path = ", ".join(total.get("engine_paths") or ["?"])
    return ["% Speed table written by repro (python -m repro.tables.speed). Needs \\usepackage{booktabs} and "
            "\\usepackage{graphicx} in the preamble.",
            f"% Pipeline: suite {suite}, engine path {path}; per-job facts in the generation files' .meta.json."]


def to_frame(rows: list[dict]) -> pd.DataFrame:
    """The CSV's frame: ``model`` (config.yaml's name, as in main_table.csv: the two join on it; ``all`` for the
    total row), ``label``, ``benchmark``, ``n_single`` and the numbers of :data:`COLUMNS`."""
    cols = ["model", "label", "benchmark", "n_single"] + [c for c, _, _ in COLUMNS]
    return pd.DataFrame(rows, columns=cols)


def to_markdown(rows: list[dict], cap: str, note: str = "") -> str:
    """The caption, the table, and ``note`` (:func:`fixed_costs_note`) below it."""
    head = ["Model", "Benchmark", "n (1 req.)"] + [t for _, t, _ in COLUMNS]
    lines = [cap, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        bench = r["benchmark"] if r["benchmark"] == "all" else declared_benchmark(r["benchmark"]).title
        lines.append("| " + " | ".join([r["label"], bench, str(r["n_single"])]
                                       + [fmt(r[c], d) for c, _, d in COLUMNS]) + " |")
    return "\n".join(lines + (["", note] if note else [])) + "\n"


def _two_lines(title: str) -> tuple[str, str]:
    """A column title set on two header rows, so the numbers' columns stay narrow: ``"tokens/s (1 req.)"`` ->
    ``("tokens/s", "(1 req.)")``, ``"load s"`` -> ``("load", "s")``, ``"TPF"`` -> ``("", "TPF")``."""
    if " (" in title:
        top, rest = title.split(" (", 1)
        return top, "(" + rest
    return tuple(title.rsplit(" ", 1)) if " " in title else ("", title)


def to_latex(rows: list[dict], cap: str, label: str, header: list[str] | None = None) -> str:
    """A booktabs table in a ``table*`` float (the full text width: ten columns do not fit one column of a
    two-column article legibly; in a one-column document ``table*`` is a ``table``), column titles on two rows,
    shrunk to the text width only when wider (``\\resizebox``, graphicx); ``header``: ``%`` lines put first
    (:func:`tex_header`). ``cap`` is LaTeX source (``caption(..., latex=True)``)."""
    titles = [("", "Model"), ("", "Benchmark"), ("$n$", "(1 req.)")] + [
        tuple(latex_escape(x) for x in _two_lines(t)) for _, t, _ in COLUMNS]
    body = []
    for r in rows:
        bench = r["benchmark"] if r["benchmark"] == "all" else declared_benchmark(r["benchmark"]).title
        body.append(" & ".join([latex_escape(r["label"]), latex_escape(bench), str(r["n_single"])]
                               + [fmt(r[c], d, "--") for c, _, d in COLUMNS]) + r" \\")
    if header is None:
        header = ["% Needs \\usepackage{booktabs} and \\usepackage{graphicx} in the preamble."]
    return "\n".join([*header, r"\begin{table*}[t]", r"\centering", r"\small", r"\setlength{\tabcolsep}{3pt}",
                      rf"\caption{{{cap}}}", rf"\label{{{label}}}",
                      r"\resizebox{\ifdim\width>\textwidth\textwidth\else\width\fi}{!}{%",  # shrink only if too wide
                      r"\begin{tabular}{ll" + "r" * (len(titles) - 2) + "}", r"\toprule",
                      " & ".join(t for t, _ in titles) + r" \\", " & ".join(b for _, b in titles) + r" \\",
                      r"\midrule", *body, r"\bottomrule", r"\end{tabular}}", r"\end{table*}"]) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m repro.tables.speed", description=__doc__.splitlines()[0])
    ap.add_argument("--work", required=True, type=Path)
    ap.add_argument("--suite", required=True)
    ap.add_argument("--spec", required=True, help="the main table's JSON spec (models, benchmarks, seeds)")
    ap.add_argument("--out-dir", required=True, type=Path)
    ap.add_argument("--probe-benchmarks", nargs="*", default=[],
                    help="benchmarks whose single-request columns come from the speed probe's records")
    a = ap.parse_args(argv)
    spec = json.loads(a.spec)
    try:
        rows, total = build(a.work, a.suite, spec, a.probe_benchmarks)
    except (FileNotFoundError, MergedFileChanged, WorkFileDamaged) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = a.out_dir
    note = fixed_costs_note(total)
    atomic_write_text(out / "speed_table.md", to_markdown(rows, caption(total, a.suite), note))
    atomic_write_text(out / "speed_table.tex", to_latex(rows, caption(total, a.suite, latex=True)
                                                        + (" " + latex_escape(note) if note else ""),
                                                        f"tab:speed-{a.suite}", tex_header(total, a.suite)))
    atomic_write_text(out / "speed_table.csv", to_frame(rows).to_csv(index=False, lineterminator="\n"))
    print((out / "speed_table.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
