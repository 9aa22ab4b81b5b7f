"""Table rendering: paper layout, half-up rounding on displayed values, LaTeX escaping, missing cells;
the caption says what was run (problems scored per benchmark, subsets, decoding temperature)."""

import json
import shutil
from pathlib import Path

import pandas as pd

from repro import paths
from repro.tables.__main__ import main as tables_main
from repro.tables.render import caption, fmt, latex_escape, to_csv, to_latex, to_markdown, wide

BENCH = ["gsm8k", "math500"]


def long_frame():
    return pd.DataFrame([
        {"model": "a_b", "label": "LLaDA_2.1 & co", "benchmark": "gsm8k", "seed": 1, "accuracy": 62.25, "tpf": 5.55},
        {"model": "a_b", "label": "LLaDA_2.1 & co", "benchmark": "gsm8k", "seed": 2, "accuracy": 62.25, "tpf": 5.55},
        {"model": "a_b", "label": "LLaDA_2.1 & co", "benchmark": "math500", "seed": 1, "accuracy": 80.0, "tpf": None},
        {"model": "orl", "label": "+ ORL", "benchmark": "gsm8k", "seed": 1, "accuracy": 92.0, "tpf": 8.5},
        {"model": "orl", "label": "+ ORL", "benchmark": "math500", "seed": 1, "accuracy": 87.04, "tpf": 10.2},
    ])


def test_half_up_rounding():
    assert fmt(62.25) == "62.3" and fmt(71.35) == "71.4" and fmt(None) == "-" and fmt(float("nan")) == "-"


def test_markdown_layout_and_order():
    md = to_markdown(wide(long_frame(), BENCH), BENCH)
    lines = md.splitlines()
    assert lines[0] == "| Model | GSM8K Acc | GSM8K TPF | MATH-500 Acc | MATH-500 TPF |"
    assert lines[2] == "| LLaDA_2.1 & co | 62.3 | 5.6 | 80.0 | - |"
    assert lines[3] == "| + ORL | 92.0 | 8.5 | 87.0 | 10.2 |"


def test_latex_is_booktabs_and_escaped():
    tex = to_latex(wide(long_frame(), BENCH), BENCH, "Acc & TPF", "tab:x")
    assert r"\toprule" in tex and r"\midrule" in tex and r"\bottomrule" in tex and "|" not in tex
    assert r"LLaDA\_2.1 \& co" in tex and r"\cmidrule(lr){2-3}" in tex and "--" in tex
    assert latex_escape("50%_$#") == r"50\%\_\$\#"


def test_csv_keeps_machine_names():
    csv = to_csv(wide(long_frame(), BENCH), BENCH).splitlines()
    assert csv[0] == ("model,label,gsm8k_acc,gsm8k_tpf,math500_acc,math500_tpf,gsm8k_n,math500_n,decoding,precision,"
                      "tpf_not_counted")
    assert csv[1] == 'a_b,LLaDA_2.1 & co,62.3,5.6,80.0,,,,decoding temperature not recorded,,'


def test_replayed_rows_say_so_in_the_decoding_column():
    """A replayed model (the reference solutions, or samples made elsewhere) records no decoder temperature:
    its decoding reads "replayed samples", not "decoding temperature not recorded"."""
    long = long_frame()
    long["backend"] = "replay"
    assert {r["decoding"] for r in wide(long, BENCH)} == {"replayed samples"}
    long["temperature"] = 0.0  # samples whose maker recorded greedy decoding keep it
    assert {r["decoding"] for r in wide(long, BENCH)} == {"greedy"}


def measured(n=3, total=(1319, 500), temps=(0.0, 0.0), source="data_dir"):
    """A long table as aggregate.collect builds it: two models x GSM8K, MATH-500, one seed."""
    rows = []
    for (model, label), t in zip([("a_b", "LLaDA_2.1 & co"), ("orl", "+ ORL")], temps):
        for b, tot in zip(BENCH, total):
            rows.append({"model": model, "label": label, "benchmark": b, "seed": 1, "accuracy": 50.0, "tpf": 2.0,
                         "n": n if n is not None else tot, "n_total": tot, "data_source": source, "temperature": t})
    return pd.DataFrame(rows)


CAP = dict(benchmarks=BENCH, suite="smoke", backend="engine", seeds=[12345])


def test_caption_states_problems_scored_and_subsets():
    text = caption(measured(n=3), **CAP)
    assert "Problems scored: n = 3 of 1319 GSM8K, 3 of 500 MATH-500; subsets, not full-benchmark results." in text
    assert "greedy" in text and "seed 12345" in text
    tex = caption(measured(n=3), latex=True, **CAP)
    assert r"$n = 3$ of 1319 GSM8K, 3 of 500 MATH-500; subsets" in tex and r"(\%, pass@1" in tex
    # only one benchmark cut: named
    one = measured(n=None)
    one.loc[one["benchmark"] == "gsm8k", "n"] = 10
    assert "n = 10 of 1319 GSM8K, 500 MATH-500; GSM8K: subsets, not full-benchmark" in caption(one, **CAP)


def test_caption_says_the_generation_budget_per_benchmark_where_it_differs():
    long = measured(n=3)
    assert "Generation" not in caption(long, **CAP)  # not recorded (replayed samples): not claimed
    long["max_new_tokens"] = 4096.0
    assert " Generation: at most 4096 new tokens per problem. " in caption(long, **CAP) + " "
    long.loc[long["benchmark"] == "gsm8k", "max_new_tokens"] = 256.0
    assert "Generation: at most 256 (GSM8K), 4096 (MATH-500) new tokens per problem." in caption(long, **CAP)
    long.loc[(long["benchmark"] == "gsm8k") & (long.index == long.index[0]), "max_new_tokens"] = 64.0
    assert "at most 64/256 (GSM8K), 4096 (MATH-500)" in caption(long, **CAP)  # the models differ on GSM8K


def test_caption_full_sets_and_shipped_problems():
    text = caption(measured(n=None), **CAP)
    assert "Problems scored: n = 1319 GSM8K, 500 MATH-500 (full test sets)." in text and " of " not in text
    shipped = caption(measured(n=3, total=(5, 5), source="builtin"), **CAP)
    assert "n = 3 GSM8K, 3 MATH-500." in shipped and "full test sets" not in shipped
    assert "Not benchmark results: GSM8K, MATH-500 used the few problems shipped" in shipped


def test_caption_decoding_from_the_decoders_temperature():
    sampled = caption(measured(temps=(0.7, 0.7)), **CAP)
    assert "sampling, T = 0.7" in sampled and "greedy" not in sampled
    assert r"sampling, $T = 0.7$" in caption(measured(temps=(0.7, 0.7)), latex=True, **CAP)
    mixed = caption(measured(temps=(0.0, 0.7)), latex=True, **CAP)
    assert r"greedy for LLaDA\_2.1 \& co; sampling, $T = 0.7$ for + ORL" in mixed
    rows = wide(measured(n=3, temps=(0.0, 0.7)), BENCH)
    assert [r["decoding"] for r in rows] == ["greedy", "sampling, T = 0.7"] and rows[0]["gsm8k_n"] == "3"


def fake_cell(work, bench, n, total, temperature, source="data_dir", max_new_tokens=64):
    fmt_ = dict(suite="smoke", model="m", bench=bench, seed=1)
    gen = work / paths.GENERATIONS.format(**fmt_)
    gen.parent.mkdir(parents=True, exist_ok=True)
    gen.write_text("".join(json.dumps({"id": f"{bench}/{i}", "generated_tokens": 8, "template_version": "v1",
                                       "forwards": {"denoise": 2, "commit": 2}}) + "\n" for i in range(n)))
    Path(str(gen) + ".meta.json").write_text(json.dumps({"shards": [{"backend": "engine", "decoder": {
        "algorithm": "orl", "temperature": temperature, "max_new_tokens": max_new_tokens}}]}))
    prob = work / paths.PROBLEMS.format(**fmt_)
    prob.parent.mkdir(parents=True, exist_ok=True)
    Path(str(prob) + ".meta.json").write_text(json.dumps({"source": source, "total": total, "kept": n,
                                                          "limit": n if n < total else None}))
    summ = work / paths.SUMMARY.format(**fmt_)
    summ.parent.mkdir(parents=True, exist_ok=True)
    summ.write_text(json.dumps({"accuracy": 33.3, "n": n, "ci95": [0, 90]}))


def test_written_table_says_limit_and_temperature_in_every_format(tmp_path):
    """The reported case: `limit: 3` and a sampling decoder; before, the caption said neither (and 'greedy')."""
    fake_cell(tmp_path, "gsm8k", 3, 1319, 0.6)
    fake_cell(tmp_path, "math500", 3, 500, 0.6)
    spec = {"models": [{"name": "m", "label": "M_1"}], "benchmarks": BENCH, "seeds": [1], "backend": "engine"}
    out = tmp_path / "res"
    assert tables_main(["--work", str(tmp_path), "--suite", "smoke", "--spec", json.dumps(spec),
                        "--out-dir", str(out)]) == 0
    md = (out / "main_table.md").read_text().split("\n\n")[0]
    assert "n = 3 of 1319 GSM8K, 3 of 500 MATH-500; subsets, not full-benchmark results" in md
    assert "sampling, T = 0.6" in md and "greedy" not in md
    assert "Generation: at most 64 new tokens per problem." in md  # the smoke suite's cut, not the paper's 4096
    tex = (out / "main_table.tex").read_text()
    assert r"$n = 3$ of 1319 GSM8K" in tex and r"sampling, $T = 0.6$" in tex and r"\toprule" in tex
    assert "Generation: at most 64 new tokens per problem." in tex
    csv = (out / "main_table.csv").read_text().splitlines()
    assert csv[0].endswith(",gsm8k_n,math500_n,decoding,precision,tpf_not_counted")
    assert csv[1].endswith(",3,3,\"sampling, T = 0.6\",,")  # no precision in these metas, every TPF counted
    long = (out / "main_table_long.csv").read_text().splitlines()
    assert long[0] == ("model,label,benchmark,seed,accuracy,ci_lo,ci_hi,n,n_total,data_source,temperature,"
                       "max_new_tokens,backend,precision,tpf,tokens,forwards,tpf_note")
    prov = json.loads((out / "provenance.json").read_text())
    assert {(c["problems_kept"], c["problems_total"]) for c in prov["cells"]} == {(3, 1319), (3, 500)}


def four_benchmark_tex(tmp_path, label=None):
    """The .tex main() writes for four benchmarks (full test sets, greedy) and the paper's longer label."""
    benches = ["gsm8k", "math500", "humaneval", "mbpp"]
    totals = {"gsm8k": 1319, "math500": 500, "humaneval": 164, "mbpp": 500}
    for b in benches:
        fake_cell(tmp_path, b, totals[b], totals[b], 0.0)
    spec = {"models": [{"name": "m", "label": "LLaDA-2.1-mini"}], "benchmarks": benches, "seeds": [1],
            "backend": "engine", "latex_label": label}
    out = tmp_path / "res"
    assert tables_main(["--work", str(tmp_path), "--suite", "smoke", "--spec", json.dumps(spec),
                        "--out-dir", str(out)]) == 0
    return (out / "main_table.tex").read_text(), json.loads((out / "provenance.json").read_text())


def test_tex_says_what_it_needs_and_prints_a_papers_words(tmp_path):
    tex, prov = four_benchmark_tex(tmp_path, label="tab:orl-main")
    lines = tex.splitlines()
    assert lines[0].startswith("%") and r"\usepackage{booktabs}" in lines[0] and r"\usepackage{graphicx}" in lines[0]
    assert lines[1].startswith("% Pipeline: suite smoke, backend engine, seeds 1")
    cap = next(l for l in lines if l.startswith(r"\caption{"))
    assert "suite" not in cap and "backend" not in cap and "engine" not in cap and "one seed" in cap
    assert r"\label{tab:orl-main}" in tex and tex.index(r"\label") > tex.index(r"\caption")
    assert set(prov["code_versions"]) == {"prepare", "decoder", "merge", "score", "table"}
    tex_default, _ = four_benchmark_tex(tmp_path / "default")
    assert r"\label{tab:main-smoke}" in tex_default


def test_tex_compiles_in_a_minimal_document_and_fits_a_column(tmp_path):
    """pdflatex (texlive-latex-base + texlive-latex-recommended) in a two-column article with the packages
    the .tex's first line names: no error, no overfull box (four benchmarks and the paper's labels fit one
    column)."""
    import shutil
    import subprocess

    import pytest

    if shutil.which("pdflatex") is None:
        pytest.skip("pdflatex not installed (apt-get install texlive-latex-base texlive-latex-recommended)")
    tex, _ = four_benchmark_tex(tmp_path)
    doc = tmp_path / "doc.tex"
    doc.write_text("\\documentclass[twocolumn]{article}\n\\usepackage{booktabs}\n\\usepackage{graphicx}\n"
                   "\\begin{document}\n"
                   + tex + "\nText.\n\\end{document}\n")
    r = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", doc.name], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    log = (tmp_path / "doc.log").read_text(errors="replace")
    assert r.returncode == 0, log[-2000:]
    assert "Overfull \\hbox" not in log, log[-2000:]
    # without booktabs the document fails: the first line of the .tex is what tells the reader
    doc.write_text(doc.read_text().replace("\\usepackage{booktabs}\n", ""))
    r = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", doc.name], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0


def test_tpf_without_forward_counts_explains_itself_and_caption_names_the_backend():
    """A backend without forward counts (released SGLang): the cell says n/c, the caption why; a cell with
    counts and the caption's TPF sentence name the backend that counted."""
    long = measured()
    long["tpf_note"] = None
    sglang_rows = long["model"] == "orl"
    long.loc[sglang_rows, "tpf"] = None
    long.loc[sglang_rows, "tpf_note"] = "SGLang reported no forward counts"
    rows = wide(long, BENCH)
    md = to_markdown(rows, BENCH).splitlines()
    assert md[2] == "| LLaDA_2.1 & co | 50.0 | 2.0 | 50.0 | 2.0 |"
    assert md[3] == "| + ORL | 50.0 | n/c | 50.0 | n/c |"
    assert "n/c" in to_latex(rows, BENCH, "c", "tab:x")
    # the CSV's number columns hold numbers only: the n/c cell is empty, named in tpf_not_counted
    csv = to_csv(rows, BENCH)
    assert csv.splitlines()[2].startswith("orl,+ ORL,50.0,,50.0,,") and csv.splitlines()[2].endswith(",gsm8k;math500")
    import io

    back = pd.read_csv(io.StringIO(csv))
    assert back["gsm8k_tpf"].dtype == float and back["gsm8k_tpf"].isna().tolist() == [False, True]
    cap = caption(long, **{**CAP, "backend": "sglang"})
    assert "TPF: generated tokens per denoising or commit forward, as counted by SGLang" in cap
    assert "n/c: not counted, SGLang reported no forward counts" in cap
    assert "n/c" not in caption(measured(), **CAP) and "as counted by our block-diffusion decoder" in caption(
        measured(), **CAP)


def test_caption_names_each_models_precision_as_the_cards_do():
    """bf16 / nvfp4-w4a16 "NVFP4 weights, dequantized in the kernels" / NVFP4 weights dequantized at load (engine)
    or before loading (SGLang): one phrase when every model ran alike, else one per precision with its models."""
    from repro.tables.render import precision_label

    assert precision_label("bf16") == "bf16" and precision_label(None) == "precision not recorded"
    assert precision_label("bf16", "nvfp4") == "bf16 (NVFP4 weights dequantized at load)"
    assert precision_label("nvfp4-w4a16", "nvfp4", kernels="triton", device="cuda (NVIDIA H200)") == \
        "nvfp4-w4a16 (NVFP4 weights, dequantized in the kernels)"
    assert precision_label("bf16", "nvfp4", "sglang") == "bf16 (NVFP4 weights dequantized to BF16 before loading)"
    long = measured()
    four_bit = precision_label("nvfp4-w4a16", "nvfp4", kernels="triton")
    long["precision"] = ["bf16", "bf16", four_bit, four_bit]  # rows: model a_b x 2 benchmarks, then orl
    text = caption(long, **CAP)
    assert ("Precision: bf16 for LLaDA_2.1 & co; nvfp4-w4a16 (NVFP4 weights, dequantized in the kernels) for "
            "+ ORL.") in text
    assert r"Precision: bf16 for LLaDA\_2.1 \& co;" in caption(long, latex=True, **CAP)
    long["precision"] = "bf16"
    assert "Precision: bf16. TPF" in caption(long, **CAP)
    assert [r["precision"] for r in wide(long, BENCH)] == ["bf16", "bf16"]


def test_precision_label_follows_the_checkpoint_the_job_read():
    """A shard meta's recorded ``checkpoint_quantization`` (what the job loaded) wins over config.yaml's
    declaration: a plain checkpoint declared NVFP4 is not labelled NVFP4, and a local NVFP4 export whose
    declaration is missing still is."""
    from repro.tables.aggregate import cell_precision

    gpu = {"kernels": "triton", "device": "cuda (NVIDIA H200)"}
    plain = {"shards": [{"precision": "fp32", "backend": "engine", "checkpoint_quantization": None}]}
    nvfp4 = {"shards": [{"precision": "nvfp4-w4a16", "backend": "engine", "checkpoint_quantization": "nvfp4",
                         "backend_info": gpu}]}
    old = {"shards": [{"precision": "bf16", "backend": "engine"}]}  # a meta from before the field existed
    assert cell_precision(plain, "nvfp4") == "fp32"
    assert cell_precision(nvfp4, None) == "nvfp4-w4a16 (NVFP4 weights, dequantized in the kernels)"
    assert cell_precision(old, "nvfp4") == "bf16 (NVFP4 weights dequantized at load)"


def test_w4a16_label_says_what_ran_on_that_device():
    """nvfp4-w4a16 on the CPU runs the torch MoE, which dequantizes each expert it uses at every forward: the
    label says so (not "in the kernels", which only the GPU's Triton MoE does); a mixed cell names both; a
    shard recording neither kernels nor device claims only the 4 bits."""
    from repro.tables.aggregate import cell_precision
    from repro.tables.render import precision_label

    def shard(**info):
        return {"precision": "nvfp4-w4a16", "backend": "engine", "checkpoint_quantization": "nvfp4",
                **({"backend_info": info} if info else {})}

    cpu = shard(kernels="torch", device="cpu (x86_64, 1 threads)")
    cpu_label = "nvfp4-w4a16 (NVFP4 weights kept in 4 bits, each expert dequantized per forward in torch on the CPU)"
    assert cell_precision({"shards": [cpu]}, "nvfp4") == cpu_label
    assert cell_precision({"shards": [dict(shard(), device="cpu")]}, "nvfp4") == cpu_label  # older meta: device only
    gpu_torch = shard(kernels="torch", device="cuda (NVIDIA H200)")
    assert cell_precision({"shards": [gpu_torch]}, "nvfp4").endswith("in torch on the GPU)")
    both = cell_precision({"shards": [cpu, shard(kernels="triton", device="cuda (NVIDIA H200)")]}, "nvfp4")
    assert both == "nvfp4-w4a16 (NVFP4 weights kept in 4 bits, each expert dequantized per forward in torch on the " \
        "CPU) / nvfp4-w4a16 (NVFP4 weights, dequantized in the kernels)"
    assert cell_precision({"shards": [shard()]}, "nvfp4") == "nvfp4-w4a16 (NVFP4 weights kept in 4 bits)"
    assert "in the kernels" not in precision_label("nvfp4-w4a16", "nvfp4", device="cpu")


def test_row_label_of_a_quantized_checkpoint_names_how_it_ran():
    from repro.tables.render import run_note, with_run_notes

    assert run_note("nvfp4-w4a16", "nvfp4") == "4-bit experts"
    assert run_note("bf16", "nvfp4") == "experts dequantized to bf16 at load"
    assert run_note("bf16", "nvfp4", "sglang") == "dequantized to bf16 before loading"
    assert run_note("bf16", None) is None and run_note(None, "nvfp4") is None  # unquantized / not recorded
    assert with_run_notes("+ ORL (NVFP4 checkpoint)", ["4-bit experts"]) == "+ ORL (NVFP4 checkpoint, 4-bit experts)"
    assert with_run_notes("ORL NVFP4", ["4-bit experts", "experts dequantized to fp32 at load"]) == \
        "ORL NVFP4 (4-bit experts / experts dequantized to fp32 at load)"
    assert with_run_notes("+ ORL", []) == "+ ORL"


def test_a_damaged_summary_or_meta_is_one_error_naming_the_file_and_the_fix(tmp_path, capsys):
    """A score summary (or a ``.meta.json`` beside a job output) that no longer parses — cut by a full disk, edited
    by hand — stopped the table job with a JSONDecodeError traceback. It is now one line: the file, where it fails,
    and what to delete so that Snakemake makes it anew; nothing is written."""
    spec = {"models": [{"name": "m", "label": "M"}], "benchmarks": BENCH, "seeds": [1], "backend": "engine"}
    args = ["--work", str(tmp_path), "--suite", "smoke", "--spec", json.dumps(spec), "--out-dir", str(tmp_path / "res")]
    fake_cell(tmp_path, "gsm8k", 3, 1319, 0.0)
    fake_cell(tmp_path, "math500", 3, 500, 0.0)
    summ = tmp_path / paths.SUMMARY.format(suite="smoke", model="m", bench="math500", seed=1)
    summ.write_text('{"accuracy": 33.3, "n"')  # cut mid-write
    assert tables_main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"{summ}: not valid JSON" in err and f"Delete {summ} and run again" in err
    assert not (tmp_path / "res").exists()

    fake_cell(tmp_path, "math500", 3, 500, 0.0)
    gen = tmp_path / paths.GENERATIONS.format(suite="smoke", model="m", bench="gsm8k", seed=1)
    meta = Path(str(gen) + ".meta.json")
    meta.write_text("{oops")
    assert tables_main(args) == 2
    err = capsys.readouterr().err
    assert f"{meta}: not valid JSON" in err and f"Delete {gen} (and {meta.name}) and run again" in err


def test_a_summary_that_disagrees_with_its_verdicts_never_reaches_the_table(tmp_path, capsys):
    """A fresh user set a summary's accuracy to 99.0 (3 problems) and the table printed 99.0. The summary is now
    recomputed from the scorer's per-problem verdicts beside it; a disagreement (either file edited) is one line
    naming both files and the fix, and nothing is written."""
    from repro.scoring.stats import summarize

    spec = {"models": [{"name": "m", "label": "M"}], "benchmarks": BENCH, "seeds": [1], "backend": "engine"}
    args = ["--work", str(tmp_path), "--suite", "smoke", "--spec", json.dumps(spec), "--out-dir", str(tmp_path / "res")]
    for bench in BENCH:
        fake_cell(tmp_path, bench, 3, 500, 0.0)
        scores = [{"id": f"{bench}/{i}", "benchmark": bench, "correct": i == 0, "status": "ok"} for i in range(3)]
        fmt_ = dict(suite="smoke", model="m", bench=bench, seed=1)
        (tmp_path / paths.SCORES.format(**fmt_)).write_text("".join(json.dumps(s) + "\n" for s in scores))
        (tmp_path / paths.SUMMARY.format(**fmt_)).write_text(json.dumps(summarize(bench, scores)))
    assert tables_main(args) == 0  # consistent: accepted
    assert "| 33.3 |" in (tmp_path / "res" / "main_table.md").read_text()
    shutil.rmtree(tmp_path / "res")

    fmt_ = dict(suite="smoke", model="m", bench=BENCH[0], seed=1)
    summ, scores = tmp_path / paths.SUMMARY.format(**fmt_), tmp_path / paths.SCORES.format(**fmt_)
    good = summ.read_text()
    summ.write_text(good.replace('"accuracy": 33.3333', '"accuracy": 99.0'))
    assert tables_main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and not (tmp_path / "res").exists()
    assert f"{summ}: accuracy = 99.0, but the per-problem verdicts in {scores.name} give 33.3333" in err
    assert "Delete both and run again" in err

    summ.write_text(good)  # the verdict flipped instead
    scores.write_text(scores.read_text().replace('"correct": false', '"correct": true', 1))
    assert tables_main(args) == 2
    assert "n = " not in (err := capsys.readouterr().err) and f"{summ}: correct = 1" in err
