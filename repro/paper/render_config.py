"""Render the decoder config of one (suite, model, benchmark, seed) from `paper_decoding.json` (jinja2).

Command (the model card's, verbatim, plus options)::

    python -m repro.paper.render_config --suite main --model llada-orl --benchmark gsm8k --seed 12345 \
        --out decoder.yaml [--checkpoint DIR] [--backend engine|sglang] [--set key=value ...] \
        [--hash-out FILE] [--meta-out FILE] [--sglang-out FILE]

Contract
--------
* Source: ``DIR/paper_decoding.json`` when ``--checkpoint DIR`` has one, else the packaged default;
  validated against ``paper_decoding.schema.json`` (see ``repro.paper.decoding``).
* ``--backend engine`` (default): a YAML with exactly the engine decoder keys of docs/interfaces.md.
  ``--backend sglang``: the ``dllm_algorithm_config`` YAML with exactly the keys the selected SGLang
  algorithm reads (``repro.paper.decoding.to_sglang``); the algorithm name, ``sampling_params`` and notes
  go to ``--meta-out`` (they are not YAML keys SGLang reads).
* Output is byte-identical for identical inputs: fixed key order, normalised numbers, no timestamps, no
  absolute paths. The header comments name the source kind and the source file's sha256.
* ``--sglang-out FILE`` (with the engine backend): also write the SGLang YAML of the same settings, so a
  workflow can keep the engine config (all keys, what every backend consumes) and record SGLang's file.
* Writes ``--out`` atomically; prints ``<sha256>  <out>`` on stdout; ``--hash-out FILE`` writes the hex
  digest plus newline; ``--meta-out FILE`` writes JSON ``{sha256, backend, decoder, dllm_algorithm?,
  sglang_config?, sampling_params?, notes, source, source_kind, source_sha256}``.
* Exit status 2 with a one-paragraph message on any invalid input.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

import jinja2

from repro import benchmarks
from repro.io import atomic_write_text

from .decoding import (PaperDecodingError, _coerce, load_paper_decoding, parse_overrides, resolve_decoder,
                       sglang_sampling_params, to_sglang)

TEMPLATES = Path(__file__).with_name("templates")


def yaml_scalar(value) -> str:
    """A YAML scalar for bool / int / float / str that reads back as the same value (JSON ⊂ YAML)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"cannot render non-finite number {value!r}")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    raise TypeError(f"cannot render {type(value).__name__} {value!r} as a YAML scalar")


def _env() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, autoescape=False)
    env.filters["yaml_scalar"] = yaml_scalar
    return env


def render(suite: str, model: str, benchmark: str, seed: int, backend: str = "engine",
           checkpoint: str | os.PathLike | None = None, overrides: dict | None = None) -> tuple[str, dict]:
    """Return ``(yaml_text, meta)`` for one decoder config; raises ``PaperDecodingError`` on bad input."""
    if backend not in ("engine", "sglang"):
        raise PaperDecodingError(f"--backend {backend!r}: allowed: engine, sglang")
    overrides = dict(overrides or {})
    pd = load_paper_decoding(checkpoint)
    decoder = resolve_decoder(pd, suite, model, benchmark, seed, overrides)
    # Overrides are shown normalised (threshold=1 and threshold=1.0 render the same bytes).
    over_text = ", ".join(f"{k}={yaml_scalar(_coerce(k, v, '--set ' + k))}" for k, v in sorted(overrides.items()))
    common = dict(suite=suite, model=model, benchmark=benchmark, seed=seed, source_kind=pd.source_kind,
                  source_sha256=pd.sha256, overrides=over_text)
    meta = {"backend": backend, "decoder": decoder, "source": str(pd.path), "source_kind": pd.source_kind,
            "source_sha256": pd.sha256, "notes": []}
    if backend == "engine":
        text = _env().get_template("engine.yaml.j2").render(decoder=decoder, **common)
    else:
        extra = {k: overrides[k] for k in ("penalty_lambda", "sglang_algorithm") if k in overrides}
        algorithm, cfg, notes = to_sglang(decoder, extra)
        text = _env().get_template("sglang.yaml.j2").render(algorithm=algorithm, config=cfg, notes=notes,
                                                             **common)
        meta.update(dllm_algorithm=algorithm, sglang_config=cfg, sampling_params=sglang_sampling_params(decoder),
                    notes=notes)
    meta["sha256"] = hashlib.sha256(text.encode()).hexdigest()
    return text, meta


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m repro.paper.render_config", description=__doc__.split("\n")[0])
    ap.add_argument("--suite", required=True, help="suite in paper_decoding.json (e.g. main)")
    ap.add_argument("--model", required=True, help="decoder model name (llada-orl | llada)")
    ap.add_argument("--benchmark", required=True, help=" | ".join(benchmarks.names()))
    ap.add_argument("--seed", required=True, type=int)
    ap.add_argument("--out", required=True, help="YAML file to write")
    ap.add_argument("--checkpoint", help="checkpoint dir; its paper_decoding.json wins over the packaged one")
    ap.add_argument("--backend", default="engine", choices=["engine", "sglang"])
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="override a decoder key (repeatable), e.g. --set max_new_tokens=64")
    ap.add_argument("--hash-out", help="write the sha256 hex digest of the rendered YAML here")
    ap.add_argument("--meta-out", help="write a JSON sidecar (sha256, resolved decoder, SGLang algorithm, notes)")
    ap.add_argument("--sglang-out", help="with --backend engine: also write the SGLang YAML of the same settings")
    args = ap.parse_args(argv)
    try:
        overrides = parse_overrides(args.sets, args.backend)
        text, meta = render(args.suite, args.model, args.benchmark, args.seed, args.backend, args.checkpoint,
                            overrides)
    except PaperDecodingError as e:
        print(f"render_config: error: {e}", file=sys.stderr)
        return 2
    if args.sglang_out:
        if args.backend != "engine":
            print("render_config: error: --sglang-out goes with --backend engine (--out is already SGLang's)",
                  file=sys.stderr)
            return 2
        try:
            stext, smeta = render(args.suite, args.model, args.benchmark, args.seed, "sglang", args.checkpoint,
                                  overrides)
        except PaperDecodingError as e:
            print(f"render_config: error: {e}", file=sys.stderr)
            return 2
        meta["sglang"] = {k: smeta[k] for k in ("sha256", "dllm_algorithm", "sglang_config", "sampling_params",
                                                "notes")}
    atomic_write_text(args.out, text)
    if args.sglang_out:
        atomic_write_text(args.sglang_out, stext)
    if args.hash_out:
        atomic_write_text(args.hash_out, meta["sha256"] + "\n")
    if args.meta_out:
        atomic_write_text(args.meta_out, json.dumps(meta, indent=1, sort_keys=True) + "\n")
    if meta["source_kind"] == "packaged" and args.checkpoint:
        print(f"render_config: {args.checkpoint} has no paper_decoding.json; using the packaged default "
              f"{meta['source']}", file=sys.stderr)
    for note in meta["notes"]:
        print(f"render_config: note: {note}", file=sys.stderr)
    print(f"{meta['sha256']}  {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
