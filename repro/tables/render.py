"""Render the paper's Table 1 (rows = models, columns = benchmark × {Acc, TPF}) as Markdown, LaTeX, CSV.

Numbers are rounded half-up on their decimal value (accuracy 1 decimal in %, TPF 1 decimal as in the
paper), so 62.25 prints 62.3 (Python's format would give 62.2). Missing values print ``-`` (Markdown,
CSV) or ``--`` (LaTeX). LaTeX uses booktabs rules, a ``\\cmidrule`` under each benchmark spanner, and
escapes every label. No timestamps inside table files (they live in provenance.json).

The ``.tex`` is written to be pasted into a paper: its first lines are ``%`` comments saying what it needs
(``\\usepackage{booktabs}`` and ``\\usepackage{graphicx}``) and the pipeline details (suite, backend,
seeds, where provenance is), its caption is in a paper's words (no suite or backend names), it fits one
column: ``\\small``, a 3 pt column gap, and the tabular scaled down to ``\\columnwidth`` only when wider
(``\\resizebox{\\ifdim\\width>\\columnwidth ...}``, graphicx), so four benchmarks with the paper's labels
fit a column of a two-column article without an overfull box (checked with pdflatex in the tests); its
``\\label`` comes from config (``table.latex_label``).

``caption`` states what the numbers were measured on, from the long table (so the three formats
agree): the decoding (``greedy`` only when every decoder's temperature is 0, else ``sampling, T = …``),
the suite, backend and seeds, and always the number of problems scored per benchmark, with ``of <full
size>`` and a "subsets, not full-benchmark results" note when a benchmark was cut by the suite's
``limit``, and the generation budget (``max_new_tokens``, :func:`generation_sentence`; a suite may cut the paper's
4096). The CSV carries the same facts as columns (``<bench>_n``, ``decoding``; ``max_new_tokens`` in the long CSV).

Precision: the caption names each model's precision as the model cards name it (:func:`precision_label`: ``bf16``,
``nvfp4-w4a16 (NVFP4 weights, dequantized in the kernels)`` on a GPU's Triton kernels, ``nvfp4-w4a16 (NVFP4
weights kept in 4 bits, each expert dequantized per forward in torch on the CPU)``, ``bf16 (NVFP4 weights
dequantized at load)``, and for SGLang ``bf16 (NVFP4 weights dequantized to BF16 before loading)``), one phrase
when every model ran
alike; the CSV has it as the ``precision`` column. A model whose checkpoint is quantized also says in its row
label how its jobs ran it (:func:`run_note`, e.g. ``+ ORL (NVFP4 checkpoint, 4-bit experts)``), from the
generation metas, not from config.yaml (repro.tables.aggregate.labels_as_run).

TPF says where it came from: the caption names the backend whose forward counts gave it, and a TPF cell
whose generations carry no forward counts (the backend said why in ``forwards_note``, e.g. released SGLang
reports none) prints :data:`NOT_COUNTED` with a caption sentence explaining it, rather than a blank.
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

import pandas as pd

from repro.benchmarks import get as declared_benchmark

#: TPF cell of a benchmark whose backend reported no forward counts (explained in the caption).
NOT_COUNTED = "n/c"
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


def _present(values) -> list:
    """The distinct non-missing values, sorted."""
    return sorted({v for v in values if v is not None and not (isinstance(v, float) and v != v)})


def _count(values) -> str | None:
    """``"3"``, or ``"2-3"`` when the cells disagree (e.g. a generation file missing problems); None if unknown."""
    vs = [int(v) for v in _present(values)]
    if not vs:
        return None
    return str(vs[0]) if vs[0] == vs[-1] else f"{vs[0]}-{vs[-1]}"


def _column(df: pd.DataFrame, name: str) -> list:
    return list(df[name]) if name in df.columns else [None] * len(df)


def decoding(temperatures, latex: bool = False) -> str:
    """``greedy`` when every temperature is 0, ``sampling, T = 0.7`` for one non-zero temperature,
    ``T = 0, 0.7 (by benchmark)`` for several; ``decoding temperature not recorded`` when none is known."""
    ts = [float(t) for t in _present(temperatures)]
    math = (lambda x: f"${x}$") if latex else (lambda x: x)
    if not ts:
        return "decoding temperature not recorded"
    if ts == [0.0]:
        return "greedy"
    if len(ts) == 1:
        return "sampling, " + math(f"T = {ts[0]:g}")
    return math("T = " + ", ".join(f"{t:g}" for t in ts)) + " (by benchmark)"


def _w4a16_phrase(kernels: str | None, device: str | None) -> str:
    """How the engine ran ``nvfp4-w4a16``, from the job's recorded MoE ``kernels`` (``"triton"`` | ``"torch"``,
    ``repro.engine.llm.LLM.kernels``) and ``device`` (``"cuda (H200)"``, ``"cpu (x86_64, 1 thread)"``, ``"cpu"``):
    the Triton MoE kernels dequantize the 4-bit tiles in registers; the torch MoE (the CPU's, or ``kernels:
    torch`` on a GPU) dequantizes each expert it uses at every forward (``repro.checkpoint.nvfp4.NVFP4Experts``).
    Neither recorded: only that the weights stayed in 4 bits."""
    on = "GPU" if str(device or "").startswith("cuda") else "CPU" if str(device or "").startswith("cpu") else None
    if kernels is None and on == "CPU":  # the Triton kernels need CUDA: a CPU job ran the torch MoE
        kernels = "torch"
    if kernels == "triton":
        return "NVFP4 weights, dequantized in the kernels"
    if kernels == "torch":
        return "NVFP4 weights kept in 4 bits, each expert dequantized per forward in torch" + (f" on the {on}"
                                                                                             if on else "")
    return "NVFP4 weights kept in 4 bits"


def _nvfp4_run(precision: str, backend: str | None, kernels: str | None = None,
               device: str | None = None) -> tuple[str, str]:
    """(caption phrase, row-label note) for an NVFP4 checkpoint run at ``precision`` by ``backend`` with the MoE
    ``kernels`` on ``device`` (:func:`_w4a16_phrase`)."""
    if backend == "sglang":
        return (f"{precision} (NVFP4 weights dequantized to BF16 before loading)",
                f"dequantized to {precision} before loading")
    if precision == "nvfp4-w4a16":
        return f"nvfp4-w4a16 ({_w4a16_phrase(kernels, device)})", "4-bit experts"
    if precision == "nvfp4":
        return "nvfp4 (native FP4)", "native FP4"
    return f"{precision} (NVFP4 weights dequantized at load)", f"experts dequantized to {precision} at load"


def precision_label(precision: str | None, quantization: str | None = None, backend: str | None = "engine",
                    kernels: str | None = None, device: str | None = None) -> str:
    """A model's precision as the model cards name it, from the run's ``precision`` (``repro.engine.model.PRECISIONS``),
    the checkpoint's ``quantization`` (config.yaml; ``"nvfp4"`` or None), the backend that ran it and, for the
    engine, the MoE ``kernels`` and ``device`` its job recorded (what ran there):

    * unquantized checkpoint: the precision itself (``bf16``, ``fp32``);
    * NVFP4 checkpoint, engine: ``nvfp4-w4a16 (NVFP4 weights, dequantized in the kernels)`` (experts kept in 4
      bits, the Triton MoE kernels on a GPU) or ``nvfp4-w4a16 (NVFP4 weights kept in 4 bits, each expert
      dequantized per forward in torch on the CPU)`` (the torch MoE; ``on the GPU`` with ``kernels: torch``),
      ``<precision> (NVFP4 weights dequantized at load)`` (bf16 / fp32), ``nvfp4 (native FP4)``;
    * NVFP4 checkpoint, SGLang: ``bf16 (NVFP4 weights dequantized to BF16 before loading)`` (the workflow's
      dequantized copy, ``repro.checkpoint.dequantize``).

    ``"precision not recorded"`` when ``precision`` is None."""
    if not precision:
        return "precision not recorded"
    return _nvfp4_run(precision, backend, kernels, device)[0] if quantization == "nvfp4" else precision


def run_note(precision: str | None, quantization: str | None = None, backend: str | None = "engine") -> str | None:
    """How a quantized checkpoint ran, in the few words a table row's label carries (the caption's
    :func:`precision_label` says it in full): for an NVFP4 checkpoint ``4-bit experts`` (engine
    ``nvfp4-w4a16``), ``experts dequantized to <precision> at load`` (engine ``fp32`` / ``bf16``), ``native
    FP4`` (engine ``nvfp4``), ``dequantized to <precision> before loading`` (SGLang); None for an unquantized
    checkpoint or an unrecorded precision (the label then needs no note)."""
    return _nvfp4_run(precision, backend)[1] if quantization == "nvfp4" and precision else None


def with_run_notes(label: str, notes: list[str]) -> str:
    """``label`` with ``notes`` (:func:`run_note`, joined with " / " when a model's cells ran differently) added
    inside its closing parenthesis, or in one of its own: ``+ ORL (NVFP4 checkpoint)`` + ``4-bit experts`` ->
    ``+ ORL (NVFP4 checkpoint, 4-bit experts)``; ``label`` itself without notes."""
    if not notes:
        return label
    note = " / ".join(notes)
    return f"{label[:-1]}, {note})" if label.endswith(")") else f"{label} ({note})"


def precision_sentence(per_model: dict[str, str], esc=lambda x: x) -> str:
    """`` Precision: bf16.`` when every model (label -> :func:`precision_label`) ran alike, else
    `` Precision: fp32 for A, B; nvfp4-w4a16 (...) for C.``; empty without any model."""
    if not per_model:
        return ""
    by_label: dict[str, list[str]] = {}
    for label, prec in per_model.items():
        by_label.setdefault(prec, []).append(label)
    if len(by_label) == 1:
        return f" Precision: {esc(next(iter(by_label)))}."
    return " Precision: " + "; ".join(f"{esc(p)} for {', '.join(esc(x) for x in labels)}"
                                      for p, labels in by_label.items()) + "."


def model_precisions(long: pd.DataFrame) -> dict[str, str]:
    """label -> precision label of every model with one recorded (the long table's ``precision`` column;
    cells of one model that disagree are joined with " / ")."""
    out = {}
    if "precision" not in long.columns:
        return out
    for _, g in long.groupby("model", sort=False):
        precs = _present(_column(g, "precision"))
        if precs:
            out[str(g["label"].iloc[0])] = " / ".join(precs)
    return out


def wide(long: pd.DataFrame, benchmarks: list[str]) -> list[dict]:
    """One dict per model (table order): label, per benchmark the seed-mean accuracy and TPF and the
    number of problems scored (``<bench>_n``), and the model's ``decoding`` (see ``decoding``)."""
    out = []
    for model, g in long.groupby("model", sort=False):
        row = {"model": model, "label": g["label"].iloc[0]}
        for b in benchmarks:
            gb = g[g["benchmark"] == b]
            row[f"{b}_acc"] = gb["accuracy"].mean() if len(gb) else None
            tpf = gb["tpf"].dropna()
            row[f"{b}_tpf"] = tpf.mean() if len(tpf) else None
            row[f"{b}_tpf_not_counted"] = bool(len(gb)) and not len(tpf) and bool(_present(_column(gb, "tpf_note")))
            row[f"{b}_n"] = _count(_column(gb, "n"))
        temps, backends = _column(g, "temperature"), set(_present(_column(g, "backend")))
        # replayed samples (the reference solutions, or completions made elsewhere) were not decoded here
        row["decoding"] = ("replayed samples" if backends == {"replay"} and not _present(temps)
                           else decoding(temps))
        row["precision"] = " / ".join(_present(_column(g, "precision"))) or None
        out.append(row)
    return out


def caption(long: pd.DataFrame, benchmarks: list[str], suite: str, backend: str, seeds: list[int],
            latex: bool = False) -> str:
    """The table's caption (plain text, or LaTeX with labels escaped and ``$n = …$`` / ``$T = …$``).

    The plain text (Markdown) names the suite, backend and seeds; the LaTeX caption is in a paper's words
    (``one seed`` / ``mean over N seeds``) and leaves those to the ``.tex`` file's comment (``tex_header``)."""
    esc = latex_escape if latex else (lambda x: x)
    math = (lambda x: f"${x}$") if latex else (lambda x: x)
    dash = "--" if latex else "\u2013"
    # decoding: one phrase when every model decoded alike, else one per model
    per_model = {}
    for _, g in long.groupby("model", sort=False):
        per_model[esc(str(g["label"].iloc[0]))] = decoding(_column(g, "temperature"), latex)
    phrases = list(dict.fromkeys(per_model.values()))
    dec = phrases[0] if len(phrases) == 1 else "; ".join(f"{d} for {lab}" for lab, d in per_model.items())
    if latex:
        seeds_txt = "one seed" if len(seeds) == 1 else f"mean over {len(seeds)} seeds"
        text = f"Accuracy ({esc('%')}, pass@1 for code; {dec}) and tokens per forward (TPF); {seeds_txt}."
    else:
        seeds_txt = (f"seed {seeds[0]}" if len(seeds) == 1
                     else f"mean over seeds {', '.join(map(str, seeds))}")
        text = (f"Accuracy (%, pass@1 for code; {dec}) and tokens per forward (TPF); suite {suite}, "
                f"backend {backend}, {seeds_txt}.")
    # problems scored per benchmark, always; "of <full size>" where the suite's limit cut the benchmark
    counts, subsets, builtin, full = [], [], [], True
    for b in benchmarks:
        gb = long[long["benchmark"] == b]
        n = _count(_column(gb, "n")) or "?"
        lo, hi = (n.split("-") + [n])[:2] if n != "?" else ("?", "?")
        totals = [int(t) for t in _present(_column(gb, "n_total"))]
        title = declared_benchmark(b).title
        of = ""
        if "builtin" in _present(_column(gb, "data_source")):
            builtin.append(title)
            full = False
        elif len(totals) == 1 and lo != "?" and int(lo) < totals[0]:
            of = f" of {totals[0]}"
            subsets.append(title)
        elif len(totals) != 1 or hi == "?" or int(hi) != totals[0]:
            full = False  # not known to be the full set (no problems .meta.json)
        counts.append((lo, hi, of, title))
    parts = []
    for i, (lo, hi, of, title) in enumerate(counts):
        num = math(f"n = {lo}") if i == 0 else lo
        parts.append(num + (f"{dash}{hi}" if hi != lo else "") + f"{of} {title}")
    text += " Problems scored: " + ", ".join(parts)
    if subsets:
        which = "" if len(subsets) == len(counts) else ", ".join(subsets) + ": "
        text += f"; {which}subsets, not full-benchmark results."
    elif full:
        text += " (full test sets)."
    else:
        text += "."
    if builtin:
        text += (f" Not benchmark results: {', '.join(builtin)} used the few problems shipped with the "
                 "pipeline (no data directory, no hub).")
    return (text + generation_sentence(long) + precision_sentence(model_precisions(long), esc)
            + tpf_sentence(long, backend, esc))


def generation_sentence(long: pd.DataFrame) -> str:
    """The generation budget the decoders ran with (``max_new_tokens``, tokens per problem), as one sentence:
    ``Generation: at most 64 new tokens per problem.``, per benchmark where they differ (``at most 256 (GSM8K),
    1024 (MATH-500) new tokens ...``), a benchmark's values joined by ``/`` where models differ; ``""`` when no
    cell recorded it. A short budget cuts answers off, so a table made with a suite's override says so."""
    per = {}
    for b, g in long.groupby("benchmark", sort=False):
        vals = sorted({int(v) for v in _present(_column(g, "max_new_tokens"))})
        if vals:
            per[declared_benchmark(b).title] = "/".join(map(str, vals))
    if not per:
        return ""
    if len(set(per.values())) == 1:
        return f" Generation: at most {next(iter(per.values()))} new tokens per problem."
    return " Generation: at most " + ", ".join(f"{v} ({t})" for t, v in per.items()) + " new tokens per problem."


#: Who counted the forwards behind TPF, in a paper's words (the caption names no pipeline terms).
TPF_COUNTED_BY = {"engine": "our block-diffusion decoder", "sglang": "SGLang", "replay": "the replayed samples"}


def tpf_sentence(long: pd.DataFrame, backend: str, esc=lambda x: x) -> str:
    """Caption sentence saying which decoder counted the forwards behind TPF (:data:`TPF_COUNTED_BY`), and
    what a :data:`NOT_COUNTED` cell means."""
    counted = bool(_present(_column(long, "tpf")))
    missing = bool(_present(_column(long, "tpf_note")))
    who = esc(TPF_COUNTED_BY.get(backend, backend))
    text = ""
    if counted:
        text += (f" TPF: generated tokens per denoising or commit forward, as counted by {who} "
                 "(prompt prefill excluded).")
    if missing:
        text += (f" {NOT_COUNTED}: not counted, {who} reported no forward counts for these generations "
                 "(released SGLang reports none).")
    return text


def _cell(r: dict, b: str, k: str, missing: str) -> str:
    """A table cell: the rounded number, :data:`NOT_COUNTED` for an explained missing TPF, else ``missing``."""
    if k == "tpf" and r.get(f"{b}_tpf_not_counted"):
        return NOT_COUNTED
    return fmt(r[f"{b}_{k}"], missing=missing)


def to_markdown(rows: list[dict], benchmarks: list[str]) -> str:
    head = ["Model"] + [f"{declared_benchmark(b).title} {k}" for b in benchmarks for k in ("Acc", "TPF")]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join([":---"] + ["---:"] * (len(head) - 1)) + "|"]
    for r in rows:
        cells = [r["label"]] + [_cell(r, b, k, "-") for b in benchmarks for k in ("acc", "tpf")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


#: The first line of every .tex: the packages it needs.
NEEDS = r"% Needs \usepackage{booktabs} and \usepackage{graphicx} in the preamble."


def tex_header(suite: str, backend: str, seeds: list[int], provenance: str = "provenance.json") -> list[str]:
    """The ``%`` comment lines atop the ``.tex``: what it needs and the pipeline details its caption omits."""
    return [NEEDS.replace("% Needs", "% Table 1 written by repro (python -m repro.tables). Needs"),
            f"% Pipeline: suite {suite}, backend {backend}, seeds {', '.join(map(str, seeds))}; per-cell provenance "
            f"(checkpoint, decoder, data hashes, code versions) in {provenance}."]


def to_latex(rows: list[dict], benchmarks: list[str], caption: str, label: str, escape_caption: bool = True,
             header: list[str] | None = None) -> str:
    """A booktabs table (``\\toprule``, ``\\cmidrule``, ``\\midrule``, ``\\bottomrule``; needs
    ``\\usepackage{booktabs}`` and ``\\usepackage{graphicx}``, which the first comment line says). ``caption`` is plain text and escaped,
    or LaTeX source as given when ``escape_caption`` is False (``caption(..., latex=True)`` builds one);
    ``header``: comment lines put first (``tex_header``; default: the booktabs line only)."""
    n = len(benchmarks)
    spans = " & ".join(rf"\multicolumn{{2}}{{c}}{{{declared_benchmark(b).title}}}" for b in benchmarks)
    rules = " ".join(rf"\cmidrule(lr){{{2 + 2 * i}-{3 + 2 * i}}}" for i in range(n))
    sub = " & ".join(["Acc & TPF"] * n)
    cap = latex_escape(caption) if escape_caption else caption
    body = []
    for r in rows:
        cells = [latex_escape(r["label"])] + [_cell(r, b, k, "--") for b in benchmarks for k in ("acc", "tpf")]
        body.append(" & ".join(cells) + r" \\")
    if header is None:
        header = [NEEDS]
    return "\n".join([
        *header,
        r"\begin{table}[t]", r"\centering", r"\small", r"\setlength{\tabcolsep}{3pt}",
        rf"\caption{{{cap}}}", rf"\label{{{label}}}",
        r"\resizebox{\ifdim\width>\columnwidth\columnwidth\else\width\fi}{!}{%",  # shrink only if too wide
        r"\begin{tabular}{l" + "rr" * n + "}", r"\toprule",
        rf"Model & {spans} \\", rules, rf" & {sub} \\", r"\midrule", *body, r"\bottomrule",
        r"\end{tabular}}", r"\end{table}", ""])


def to_csv(rows: list[dict], benchmarks: list[str]) -> str:
    """The wide table; after the numbers, what they were measured on (the caption's facts): problems
    scored per benchmark (``<bench>_n``), the model's ``decoding`` and ``precision`` (:func:`precision_label`),
    and ``tpf_not_counted``: the benchmarks (``;``-joined) whose TPF cell is empty because the backend reported
    no forward counts (:data:`NOT_COUNTED` in the Markdown and LaTeX). Number columns hold numbers only (an
    empty cell is missing), so ``pandas.read_csv`` reads them as floats."""
    nums = [f"{b}_{k}" for b in benchmarks for k in ("acc", "tpf")]
    cols = ["model", "label"] + nums + [f"{b}_n" for b in benchmarks] + ["decoding", "precision", "tpf_not_counted"]

    def value(r: dict, c: str):
        if c == "tpf_not_counted":
            return ";".join(b for b in benchmarks if r.get(f"{b}_tpf_not_counted")) or None
        if c in nums:
            cell = _cell(r, *c.rsplit("_", 1), "")
            return "" if cell == NOT_COUNTED else cell
        return r.get(c)

    df = pd.DataFrame([{c: value(r, c) for c in cols} for r in rows], columns=cols)
    return df.to_csv(index=False, lineterminator="\n")
