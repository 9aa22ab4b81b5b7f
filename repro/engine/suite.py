"""``bench suite``: run the engine over benchmark problem files and write per-problem records + a summary.

Input files: the original benchmark JSONL files (``../shared/data/{gsm8k,math500,humaneval,mbpp}.jsonl``;
the benchmark is the file stem) or normalized problem records (``{"id", "benchmark", "source"}``,
docs/interfaces.md). Prompts come from :func:`repro.prompts.build_prompt` (chat messages, rendered with the
checkpoint's chat template); ids from :mod:`repro.data`.

Outputs in ``--out``: ``records.jsonl`` — one generation record per problem (docs/interfaces.md
"Generation record" fields plus ``decoder``, ``block_forwards``, ``token_ids``) — and ``summary.json``:
``threads`` (torch's threads per operation: on the CPU the CLI's ``--threads``, default 1) and
per benchmark and overall ``n``, ``generated_tokens``, ``forwards`` (summed by kind), ``wall_s``,
``tokens_per_s = Σ generated / Σ wall_s`` and ``tpf = Σ generated / Σ (denoise + commit)`` (aggregate TPF,
same convention as repro.tables). Not here: scoring (``repro.scoring``).

``batch_size`` > 1 decodes all problems (of all files) together through the batched engine
(:meth:`repro.engine.llm.LLM.generate_batch`: on the CUDA-graph engine with greedy decoding the batched graph
path :mod:`repro.engine.batch_graph`, else :mod:`repro.engine.batch`; continuous batching; greedy token ids equal
those of batch 1 on the CPU, tested on the tiny checkpoint); records are written in input order once all are
done, each request's ``wall_s`` is its latency inside the batch, and ``summary.json`` adds ``batch``:
``{"batch_size", "engine", "capture_s" (graph capture seconds), "rounds", "wall_s",
"throughput_tokens_per_s" (Σ generated / batch wall time), "mean_round_s", "max_active"}``. ``batch_size`` 1
(default) runs one request at a time on the engine's own path (CUDA graphs on a GPU). A progress bar over the
problems goes to stderr (a line per update when stderr is not a terminal: :mod:`repro.console`).
"""

from __future__ import annotations

import json
import platform
import sys
from collections import Counter
from pathlib import Path

import torch

from repro.engine.llm import LLM
from repro.provenance import code_revision


def _problems(path: Path, limit: int | None):
    """Yield ``(id, benchmark, source)`` for the first ``limit`` records of ``path``."""
    from repro import benchmarks, data
    from repro.io import read_jsonl

    stem = path.name.split(".")[0]
    try:
        rows = read_jsonl(path)
    except ValueError as exc:  # names the file and line of a record that is not a JSON object
        raise ValueError(f"{exc}; give benchmark JSONL files (one JSON object per line, e.g. gsm8k.jsonl) "
                         "or normalized problem records") from None
    if limit is not None:
        rows = rows[:limit]
    for i, r in enumerate(rows):
        if "source" in r and "benchmark" in r:
            yield r.get("id", f"{r['benchmark']}/{i}"), r["benchmark"], r["source"]
        else:
            if stem not in benchmarks.names():
                raise ValueError(f"cannot tell the benchmark of {path} (stem {stem!r} not in {benchmarks.names()}) "
                                 "and its records are not normalized problem records")
            yield data.spec(stem).problem_id(i, r), stem, r


def run_suite(model: str, role: str, decoder: dict, problem_files: list[str], out: str, limit: int | None = None,
              precision: str = "fp32", device: str | None = None, seed: int = 12345, batch_size: int = 1,
              tensor_parallel_size: int = 1) -> dict:
    """Generate for every problem; write ``records.jsonl`` and ``summary.json`` in ``out``; return the summary.

    ``decoder``: engine decoder keys overriding the role's default decoder; ``batch_size``: requests decoded
    together (module docstring); ``tensor_parallel_size``: ranks per request (:class:`repro.engine.llm.LLM`;
    recorded in each record). Raises FileNotFoundError for a missing problem file, ValueError for a
    batch size < 1, a problem file given twice, an ``out`` that is a file, or a problem file that is not JSONL of
    one benchmark (naming the file and line), and the loaders' errors for a bad checkpoint. An existing
    ``records.jsonl`` in ``out`` is replaced, with a note on stderr.
    """
    from repro.engine.batch import BatchStats
    from repro.prompts import build_prompt

    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer ≥ 1, got {batch_size!r}")
    files = [Path(p) for p in problem_files]
    missing = [str(p) for p in files if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"problem files not found: {missing}")
    # the problems first: a bad file is reported before a model load (seconds to minutes)
    twice = sorted(str(p) for p, k in Counter(p.resolve() for p in files).items() if k > 1)
    if twice:
        raise ValueError(f"problem file given more than once: {', '.join(twice)}; each problem would be generated "
                         "and counted twice")
    if Path(out).exists() and not Path(out).is_dir():
        raise ValueError(f"--out {out}: is a file; give a directory (created when missing)")
    old = Path(out) / "records.jsonl"
    if old.is_file():
        print(f"note: {old} exists ({sum(1 for _ in old.open())} records); this run replaces it and summary.json",
              file=sys.stderr)
    items = [(pid, bench, build_prompt(bench, src)) for f in files for pid, bench, src in _problems(f, limit)]
    llm = LLM(model, role=role, precision=precision, device=device, tensor_parallel_size=tensor_parallel_size)
    dec = {**llm.default_decoder().to_dict(), **decoder, "seed": seed}
    outdir = Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    per: dict[str, dict] = {}
    stats = BatchStats()
    from tqdm import tqdm

    from repro.console import bar_interval, bar_stream

    stream = bar_stream()  # stderr: redrawn on a terminal, a line per update in a log
    bar = tqdm(total=len(items), desc="bench suite", unit="problem", file=stream, mininterval=bar_interval(stream),
               ascii=not stream.isatty())
    try:  # a failure leaves the bar at how far it got (a log redraws it every 30 s at most)
        if batch_size > 1:  # records are written in input order once all are done; the bar moves as each finishes
            outs = llm.generate_batch([p.messages for _, _, p in items], decoder=dec, batch_size=batch_size,
                                      stats=stats, on_result=lambda i, o: bar.update(1))
        else:
            outs = (llm.generate(p.messages, decoder=dec) for _, _, p in items)
        with (outdir / "records.jsonl").open("w") as fh:
            for (pid, bench, _), o in zip(items, outs):
                if batch_size == 1:
                    bar.update(1)
                rec = {"id": pid, "benchmark": bench, "model": Path(model).name, "role": role, "seed": seed,
                       "backend": "engine", "prompt_text": o.prompt_text, "completion": o.text,
                       "prompt_tokens": o.prompt_tokens, "generated_tokens": o.generated_tokens,
                       "forwards": o.forwards, "tpf": o.tpf, "wall_s": o.wall_s, "tokens_per_s": o.request_tps,
                       "finish_reason": o.finish_reason, "device": str(llm.model.device), "batch_size": batch_size,
                       "tensor_parallel_size": tensor_parallel_size,
                       "decoder": o.decoder, "block_forwards": o.block_forwards, "token_ids": o.token_ids}
                fh.write(json.dumps(rec) + "\n")
                for key in (bench, "all"):
                    s = per.setdefault(key, {"n": 0, "generated_tokens": 0, "wall_s": 0.0,
                                             "forwards": {"prefill": 0, "denoise": 0, "commit": 0}})
                    s["n"] += 1
                    s["generated_tokens"] += o.generated_tokens
                    s["wall_s"] += o.wall_s
                    for k, v in o.forwards.items():
                        s["forwards"][k] += v
    finally:
        bar.close()
        llm.close()  # a tensor-parallel LLM's ranks stop here
    for s in per.values():
        d = s["forwards"]["denoise"] + s["forwards"]["commit"]
        s["tpf"] = s["generated_tokens"] / d if d else None
        s["tokens_per_s"] = s["generated_tokens"] / s["wall_s"] if s["wall_s"] > 0 else None
    summary = {"model": str(model), "role": role, "precision": precision, "device": str(llm.model.device),
               "threads": torch.get_num_threads(), "host": platform.node(), "decoder": dec,
               "engine_path": llm.engine_path, "code_revision": code_revision(),
               "tpf_convention": "generated tokens up to first EOS (excluded) / (denoise + commit forwards)",
               "benchmarks": {k: v for k, v in per.items() if k != "all"}, "overall": per.get("all"),
               "batch": _batch_summary(batch_size, stats, per.get("all"))}
    (outdir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def _batch_summary(batch_size: int, stats, overall: dict | None) -> dict:
    """The summary's ``batch`` entry (module docstring); rounds/throughput are None at batch 1."""
    if batch_size == 1 or not stats.rounds:
        return {"batch_size": batch_size, "engine": "one request at a time"}
    gen = overall["generated_tokens"] if overall else 0
    engine = ("batched CUDA graphs (repro.engine.batch_graph)" if stats.engine == "cuda-graph" else
              "batched graph path, eager (repro.engine.batch_graph)" if stats.engine == "graph-path eager" else
              "batched eager (repro.engine.batch)")
    return {"batch_size": batch_size, "engine": engine, "capture_s": stats.capture_s, "rounds": stats.rounds,
            "wall_s": stats.wall_s, "throughput_tokens_per_s": gen / stats.wall_s if stats.wall_s > 0 else None,
            "mean_round_s": sum(stats.round_s) / len(stats.round_s), "max_active": stats.max_active}
