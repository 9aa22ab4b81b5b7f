"""repro.tables.speed: the speed table from generation records and shard metas (nothing re-run)."""

import json
import re

import pytest

from repro import paths
from repro.tables import speed


def _rec(i, tokens, wall, bs, fw=(1, 10, 2)):
    return {"id": f"gsm8k/{i}", "backend": "engine", "generated_tokens": tokens, "wall_s": wall, "batch_size": bs,
            "forwards": {"prefill": fw[0], "denoise": fw[1], "commit": fw[2]}}


def _write(work, model, bench, recs, metas):
    g = work / paths.GENERATIONS.format(suite="s", model=model, bench=bench, seed=1)
    g.parent.mkdir(parents=True, exist_ok=True)
    g.write_text("".join(json.dumps(r) + "\n" for r in recs))
    (g.parent / (g.name + ".meta.json")).write_text(json.dumps({"shards": metas}))


SPEC = {"models": [{"name": "m", "label": "Model M"}, {"name": "ref", "label": "replayed", "replay": True}],
        "benchmarks": ["gsm8k", "humaneval"], "seeds": [1]}


def test_single_request_subset_batched_throughput_and_totals(tmp_path):
    meta1 = {"batch_size": 1, "precision": "bf16", "generated_last_session": {"generated_tokens": 400, "wall_s": 5.0},
             "backend_info": {"device": "cuda (NVIDIA H200)", "engine_path": "cuda-graph", "load_s": 20.0}}
    # gsm8k at batch 1: 40 records, only the first SUBSET (32) count for the single-request numbers
    _write(tmp_path, "m", "gsm8k", [_rec(i, 10, 0.1 if i < speed.SUBSET else 9.0, 1) for i in range(40)], [meta1])
    meta8 = {"batch_size": 8, "precision": "bf16", "generated_last_session": {"generated_tokens": 300, "wall_s": 1.0},
             "backend_info": {"device": "cuda (NVIDIA H200)", "engine_path": "batched-eager", "load_s": 30.0,
                              "batch": {"rounds": 10, "mean_round_s": 0.02, "wall_s": 1.0, "max_active": 8}}}
    _write(tmp_path, "m", "humaneval", [_rec(i, 30, 0.5, 8) for i in range(10)], [meta8])
    rows, total = speed.build(tmp_path, "s", SPEC)
    assert [r["benchmark"] for r in rows] == ["gsm8k", "humaneval", "all"]  # the replayed model is skipped
    g, h, a = rows
    assert g["n_single"] == 32 and g["tps_single"] == pytest.approx(100.0)  # 320 tokens / 3.2 s
    assert g["ms_per_forward"] == pytest.approx(3.2 / (32 * 13) * 1000)
    assert g["tpf"] == pytest.approx(400 / (40 * 12)) and g["tps_batch"] == pytest.approx(80.0)
    assert g["ms_per_round_batch"] is None and g["load_s"] == 20.0
    assert h["n_single"] == 0 and h["tps_single"] is None  # batched records are not single-request timings
    assert h["tps_batch"] == pytest.approx(300.0) and h["ms_per_round_batch"] == pytest.approx(20.0)
    assert a["tps_batch"] == pytest.approx(700 / 6.0) and a["load_s"] == 25.0
    cap = speed.caption(total, "s")
    assert "NVIDIA H200" in cap and "bf16" in cap and "batched-eager" in cap and "N = 1, 8" in cap
    md = speed.to_markdown(rows, cap)
    assert "| Model M | GSM8K | 32 | 100.0 |" in md
    assert "\\toprule" in speed.to_latex(rows, speed.caption(total, "s", latex=True), "tab:speed-s")


def test_cli_writes_three_files_and_names_a_missing_generation_file(tmp_path, capsys):
    _write(tmp_path, "m", "gsm8k", [_rec(0, 5, 0.1, 1)], [{"batch_size": 1}])
    spec = dict(SPEC, benchmarks=["gsm8k"])
    out = tmp_path / "res"
    assert speed.main(["--work", str(tmp_path), "--suite", "s", "--spec", json.dumps(spec), "--out-dir", str(out)]) == 0
    assert {p.name for p in out.iterdir()} == {"speed_table.md", "speed_table.tex", "speed_table.csv"}
    # the CSV carries config.yaml's model name, as main_table.csv does: the two tables join on it
    import pandas as pd

    csv = pd.read_csv(out / "speed_table.csv")
    assert list(csv.columns[:4]) == ["model", "label", "benchmark", "n_single"]
    assert csv["model"].tolist() == ["m", "all"] and csv["label"].tolist() == ["Model M", "all"]
    spec["benchmarks"] = ["gsm8k", "mbpp"]
    assert speed.main(["--work", str(tmp_path), "--suite", "s", "--spec", json.dumps(spec), "--out-dir", str(out)]) == 2
    assert "mbpp" in capsys.readouterr().err


def test_a_damaged_shard_meta_is_one_error_naming_the_file_and_the_fix(tmp_path, capsys):
    """The speed table reads each generation file's ``.meta.json``; one cut mid-write is one error line naming it
    and the generation file to delete (Snakemake then merges it anew), not a JSONDecodeError traceback."""
    _write(tmp_path, "m", "gsm8k", [_rec(0, 5, 0.1, 1)], [{"batch_size": 1}])
    g = tmp_path / paths.GENERATIONS.format(suite="s", model="m", bench="gsm8k", seed=1)
    (g.parent / (g.name + ".meta.json")).write_text('{"shards": [')
    out = tmp_path / "res"
    spec = dict(SPEC, benchmarks=["gsm8k"])
    assert speed.main(["--work", str(tmp_path), "--suite", "s", "--spec", json.dumps(spec), "--out-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{g}.meta.json: not valid JSON" in err and f"Delete {g} (and " in err
    assert not out.exists()


def test_tex_is_legible_across_a_two_column_article_with_a_paper_caption(tmp_path):
    """The smoke suite's shape (three long labels × four benchmarks, CPU with one thread) through the CLI, then
    pdflatex in a two-column article with the packages the first line names: no error, no overfull box, and the
    ten columns (a table* across both columns) set at 7 pt or more after any shrinking (in one column
    ``\\resizebox`` took them to about 5 pt)."""
    import shutil
    import subprocess

    labels = ["tiny LLaDA2 (random weights)", "+ ORL (tiny, random weights)",
              "+ ORL (tiny NVFP4 checkpoint, 4-bit experts)"]
    benches = ["gsm8k", "math500", "humaneval", "mbpp"]
    meta = {"batch_size": 1, "precision": "fp32", "generated_last_session": {"generated_tokens": 50, "wall_s": 0.7},
            "backend_info": {"device": "cpu (x86_64, 1 threads)", "engine_path": "eager", "load_s": 0.05}}
    for i, _ in enumerate(labels):
        for b in benches:
            _write(tmp_path, f"m{i}", b, [_rec(j, 17, 0.26, 1) for j in range(3)], [meta])
    spec = {"models": [{"name": f"m{i}", "label": lab} for i, lab in enumerate(labels)], "benchmarks": benches,
            "seeds": [1]}
    out = tmp_path / "res"
    assert speed.main(["--work", str(tmp_path), "--suite", "s", "--spec", json.dumps(spec), "--out-dir", str(out)]) == 0
    tex = (out / "speed_table.tex").read_text()
    first, second = tex.splitlines()[:2]
    assert "\\usepackage{booktabs}" in first and "\\usepackage{graphicx}" in first
    assert second.startswith("% Pipeline: suite s, engine path eager")
    cap = tex[tex.index("\\caption{"):tex.index("\\label{")]
    assert "Decoding speed on cpu (x86\\_64, 1 thread), fp32, batch N = 1:" in cap
    assert "suite" not in cap and "engine path" not in cap and "threads" not in cap
    assert "(x86_64, 1 thread)," in (out / "speed_table.md").read_text()
    if shutil.which("pdflatex") is None:
        pytest.skip("pdflatex not installed (apt-get install texlive-latex-base texlive-latex-recommended)")
    assert "\\begin{table*}[t]" in tex and "\\end{table*}" in tex
    doc = tmp_path / "doc.tex"
    # the tabular's natural width, logged by a \\resizebox that measures its content before the real one scales it
    measure = ("\\let\\realresizebox\\resizebox\n\\renewcommand{\\resizebox}[3]{\\sbox0{#3}"
               "\\typeout{NATURAL=\\the\\wd0, TEXT=\\the\\textwidth, FONT=\\f@size}\\realresizebox{#1}{#2}{#3}}\n")
    doc.write_text("\\documentclass[twocolumn]{article}\n\\usepackage{booktabs}\n\\usepackage{graphicx}\n"
                   "\\makeatletter\n" + measure + "\\makeatother\n"
                   "\\begin{document}\n" + tex + "\nText.\n\\end{document}\n")
    r = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", doc.name], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    log = (tmp_path / "doc.log").read_text(errors="replace")
    assert r.returncode == 0, log[-2000:]
    assert "Overfull \\hbox" not in log, log[-2000:]
    natural, text, font = map(float, re.search(r"NATURAL=([\d.]+)pt, TEXT=([\d.]+)pt, FONT=([\d.]+)", log).groups())
    assert font * min(1.0, text / natural) >= 7.0, (natural, text, font)


def test_fixed_costs_per_job_counted_once_across_the_benchmarks_it_served(tmp_path):
    """A grouped job (one load serving both benchmarks) is one job in the note; its capture seconds, spent on
    its first benchmark, are summed over the benchmarks; a second, ungrouped-era shard without job facts counts
    as its own job; a path without graphs shows '-'."""
    def meta(job_id, capture, shard=0, sharing=2):
        return {"batch_size": 1, "shard": shard, "backend_info": {"load_s": 99.0},
                "job": {"id": job_id, "model_load_s": 20.0, "graph_capture_s": capture,
                        "benchmarks_sharing_load": sharing}}
    _write(tmp_path, "m", "gsm8k", [_rec(i, 10, 0.1, 1) for i in range(4)], [meta("J1", 9.0), meta("J2", 7.0, 1)])
    _write(tmp_path, "m", "humaneval", [_rec(i, 10, 0.1, 1) for i in range(4)],
           [meta("J1", 0.5), {"batch_size": 1, "backend_info": {"load_s": 30.0}}])
    rows, total = speed.build(tmp_path, "s", SPEC)
    g, h, a = rows
    assert g["load_s"] == 20.0 and g["capture_s"] == 8.0  # two jobs, 9 s and 7 s
    assert h["load_s"] == 25.0 and h["capture_s"] == 0.5  # J1 (20 s) and an old shard (30 s, no capture known)
    assert a["capture_s"] == pytest.approx((9.5 + 7.0) / 2)
    note = speed.fixed_costs_note(total)
    assert note.startswith("Fixed costs: 3 generation jobs loaded a model, 23.33 s per load on average (70.0 s in all)")
    # benchmarks finished: J1 2, J2 1 (its meta's sharing says 2, but the table holds one shard of it), old 1
    assert "each load served 1.3 benchmarks on average (counting the benchmarks its job finished)" in note
    assert "CUDA-graph capture 8.25 s per job" in note
    assert "a grouped job's one load appears in the load s column of each benchmark it served" in note
    _write(tmp_path, "m", "gsm8k", [_rec(0, 10, 0.1, 1)], [meta("J3", None, sharing=1)])
    _write(tmp_path, "m", "humaneval", [_rec(0, 10, 0.1, 1)], [meta("J3", None, sharing=1)])
    rows, total = speed.build(tmp_path, "s", SPEC)
    assert rows[0]["capture_s"] is None and "| - |" in speed.to_markdown(rows, "cap")
    assert "capture" not in speed.fixed_costs_note(total) and "1 generation job loaded" in speed.fixed_costs_note(total)


def _session(job_id, load, problems, tokens, wall, capture=None, finished=True):
    return {"problems": problems, "generated_tokens": tokens, "wall_s": wall, "graph_capture_s": capture,
            "finished": finished, "job": {"id": job_id, "model_load_s": load}}


def test_killed_and_resumed_grouped_job_counts_every_session_and_each_jobs_load(tmp_path):
    """Grouped job J1 (planned both benchmarks) finished GSM8K, then was killed 6 problems into HumanEval;
    J2 resumed HumanEval. Throughput sums both HumanEval sessions, both loads count, each job finished one
    benchmark (not J1's planned 2), and the speed probe's load is in the note. The same shard with an older meta
    (only the finishing session recorded) is named in the caption."""
    gsm = {"batch_size": 8, "generated_last_session": {"generated_tokens": 400, "wall_s": 2.0},
           "backend_sessions": [{}], "job": {"id": "J1", "model_load_s": 20.0, "benchmarks_sharing_load": 2},
           "generation_sessions": [_session("J1", 20.0, 10, 400, 2.0, capture=5.0)]}
    he = {"batch_size": 8, "generated_last_session": {"generated_tokens": 160, "wall_s": 1.0},
          "backend_sessions": [{}, {}], "job": {"id": "J2", "model_load_s": 30.0, "benchmarks_sharing_load": 1},
          "generation_sessions": [_session("J1", 20.0, 6, 240, 3.0, capture=0.0, finished=False),
                                  _session("J2", 30.0, 4, 160, 1.0, capture=4.0)]}
    _write(tmp_path, "m", "gsm8k", [_rec(i, 40, 0.2, 8) for i in range(10)], [gsm])
    _write(tmp_path, "m", "humaneval", [_rec(i, 40, 0.2, 8) for i in range(10)], [he])
    probe = tmp_path / paths.SPEED_PROBE.format(suite="s", model="m", bench="gsm8k")
    probe.parent.mkdir(parents=True)
    probe.write_text("".join(json.dumps(_rec(i, 20, 0.2, 1)) + "\n" for i in range(4)))
    (probe.parent / (probe.name + ".meta.json")).write_text(json.dumps(
        {"batch_size": 1, "job": {"id": "P1", "model_load_s": 18.0, "benchmarks_sharing_load": 1},
         "generation_sessions": [_session("P1", 18.0, 4, 80, 0.8)]}))
    rows, total = speed.build(tmp_path, "s", SPEC, ["gsm8k"])
    g, h, a = rows
    assert h["tps_batch"] == pytest.approx(400 / 4.0)  # both sessions: 240 + 160 tokens over 3 + 1 s
    assert h["load_s"] == pytest.approx(25.0) and h["capture_s"] == pytest.approx(2.0)  # J1 and J2
    assert a["tps_batch"] == pytest.approx(800 / 6.0) and a["load_s"] == pytest.approx(25.0)  # J1 once
    note = speed.fixed_costs_note(total)
    assert note.startswith("Fixed costs: 2 generation jobs loaded a model, 25.00 s per load on average (50.0 s in "
                           "all); each load served 1 benchmark on average"), note
    assert "CUDA-graph capture 4.50 s per job (9.00 s in all)" in note and "grouped job" not in note
    assert "the speed probe's 1 job loaded it again, 18.00 s per load" in note
    assert "counts only the session" not in speed.caption(total, "s")

    # the same shard recorded before per-session figures: the finishing session only, and the caption says so
    old = {k: v for k, v in he.items() if k != "generation_sessions"}
    _write(tmp_path, "m", "humaneval", [_rec(i, 40, 0.2, 8) for i in range(10)], [old])
    rows, total = speed.build(tmp_path, "s", SPEC, ["gsm8k"])
    assert rows[1]["tps_batch"] == pytest.approx(160.0)
    assert "Tokens/s (batch N) of Model M on HumanEval counts only the session that finished each shard" in speed.caption(
        total, "s")


def test_speed_probe_gives_the_single_request_columns_of_a_batched_suite(tmp_path):
    """A suite generated at batch 32: its records (latencies inside the batch) give no single-request numbers;
    the speed probe's batch-1 records of GSM8K do (first SUBSET only), HumanEval without a probe stays '-', and
    the caption says it was a separate probe run on its own engine path; a probe file missing is named."""
    meta32 = {"batch_size": 32, "precision": "bf16",
              "generated_last_session": {"generated_tokens": 4000, "wall_s": 2.0},
              "backend_info": {"device": "cuda (NVIDIA H200)", "engine_path": "batched-cuda-graph", "load_s": 20.0,
                               "batch": {"rounds": 100, "mean_round_s": 0.01, "wall_s": 2.0, "max_active": 32}}}
    for b in ("gsm8k", "humaneval"):
        _write(tmp_path, "m", b, [_rec(i, 40, 3.0, 32) for i in range(100)], [meta32])
    probe = tmp_path / paths.SPEED_PROBE.format(suite="s", model="m", bench="gsm8k")
    probe.parent.mkdir(parents=True)
    # 40 batch-1 records: the first 32 at 0.2 s for 20 tokens (100 tok/s), the rest would pull it down
    probe.write_text("".join(json.dumps(_rec(i, 20, 0.2 if i < speed.SUBSET else 50.0, 1)) + "\n" for i in range(40)))
    (probe.parent / (probe.name + ".meta.json")).write_text(json.dumps(
        {"batch_size": 1, "backend_info": {"device": "cuda (NVIDIA H200)", "engine_path": "cuda-graph"}}))
    with pytest.raises(FileNotFoundError, match="speed probe missing"):
        speed.build(tmp_path, "s", SPEC, ["gsm8k", "humaneval"])
    rows, total = speed.build(tmp_path, "s", SPEC, ["gsm8k"])
    g, h, a = rows
    assert g["n_single"] == 32 and g["tps_single"] == pytest.approx(100.0)
    assert g["ms_per_forward"] == pytest.approx(0.2 * 32 / (32 * 13) * 1000)
    assert g["tpf"] == pytest.approx(40 / 12) and g["tps_batch"] == pytest.approx(2000.0)  # the main generation's
    assert h["n_single"] == 0 and h["tps_single"] is None and h["tps_batch"] == pytest.approx(2000.0)
    assert a["n_single"] == 32 and a["tps_single"] == pytest.approx(100.0)
    cap = speed.caption(total, "s")
    assert "first 32 problems of GSM8K" in cap and "separate speed-probe run" in cap
    assert "engine path cuda-graph;" in cap and "engine path batched-cuda-graph" in cap and "N = 32" in cap
    # without the probe the batched suite says what to set
    _, plain = speed.build(tmp_path, "s", SPEC)
    assert "speed_benchmarks" in speed.caption(plain, "s")


def test_wording_matches_the_numbers_a_small_suite_shows(tmp_path):
    """A suite keeping 3 problems: the caption says the first 3 (as column n), not the first 32; the note's sum of
    3 loads of 0.02 s reads 0.06 s (not a rounded 0.1); the .tex header says n is per single request, as the .md."""
    def meta(job_id):
        return {"batch_size": 1, "backend_info": {"device": "cpu", "engine_path": "eager"},
                "job": {"id": job_id, "model_load_s": 0.02, "graph_capture_s": None, "benchmarks_sharing_load": 1}}
    _write(tmp_path, "m", "gsm8k", [_rec(i, 10, 0.1, 1) for i in range(3)], [meta("J1")])
    _write(tmp_path, "m", "humaneval", [_rec(i, 10, 0.1, 1) for i in range(3)], [meta("J2")])
    _write(tmp_path, "m", "math500", [_rec(i, 10, 0.1, 1) for i in range(3)], [meta("J3")])
    spec = dict(SPEC, benchmarks=["gsm8k", "humaneval", "math500"])
    rows, total = speed.build(tmp_path, "s", spec)
    assert [r["n_single"] for r in rows] == [3, 3, 3, 9]
    cap = speed.caption(total, "s")
    assert "over the first 3 problems of each benchmark generated at batch 1 (all that were generated; the subset is capped at 32 problems)" in cap, cap
    assert "first 32" not in cap
    note = speed.fixed_costs_note(total)
    assert "0.02 s per load on average (0.06 s in all)" in note, note
    md, tex = speed.to_markdown(rows, cap, note), speed.to_latex(rows, speed.caption(total, "s", latex=True), "t")
    assert "| n (1 req.) |" in md and "& $n$ & tokens/s & " in tex and "& (1 req.) & (1 req.) & TPF &" in tex
