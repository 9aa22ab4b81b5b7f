"""CLI of the embedded engine.

``python -m repro.engine generate --model DIR [--role orl|base] [--raw] [decoder flags] "prompt"`` — the
prompt is wrapped as one user chat message and rendered with the checkpoint's chat template (``--raw``: use
it as is); prints the completion, then one JSON line with counts, TPF and timing.

``python -m repro.engine bench suite --model DIR --role orl --threshold 0.85 --edit-threshold 0.5
--max-new-tokens 4096 --problems gsm8k.jsonl ... --out DIR [--limit N] [--batch-size N]`` — see :mod:`repro.engine.suite`;
prints the summary JSON as the last line.

``python -m repro.engine serve --model DIR|HUB_ID --role orl --port 18080 [--precision] [--host] [--api-key]``
— the HTTP server (``/generate`` streamed per block, OpenAI-compatible ``/v1/...``): :mod:`repro.engine.serve`.

Decoder flags (override the role's default decoder from paper_decoding.json): ``--algorithm``,
``--threshold``, ``--edit-threshold``, ``--no-editing``, ``--max-post-steps``, ``--max-new-tokens``,
``--temperature``, ``--no-self-conditioning``, ``--residual-temperature``, ``--exclude-mask-token``,
``--block-size``, ``--seed``. ``--threads N`` (all three commands): torch threads per operation on the CPU (default
``$OMP_NUM_THREADS`` if set, else 1; repro/engine/README.md says why).
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def _decoder_flags(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", required=True, help="checkpoint directory")
    ap.add_argument("--role", default="orl", choices=["orl", "base"])
    ap.add_argument("--precision", default=None, choices=["fp32", "bf16", "nvfp4-w4a16", "nvfp4"],
                    help="default: bf16 on cuda, fp32 on cpu")
    ap.add_argument("--device", default=None, help="cpu | cuda (default: cuda if available)")
    ap.add_argument("--threads", type=int, default=None,
                    help="CPU: torch threads per operation (default: $OMP_NUM_THREADS if set, else 1, as in the "
                         "pipeline's generation jobs). More threads pay only on large matrices; the tiny model's "
                         "are small, so each operation then waits for the other threads (measured on a busy "
                         "2-core machine: --batch-size 8 took 1.9 s at 1 thread, 7.6 s at 2)")
    ap.add_argument("--decoder", help="a decoder YAML rendered by repro.paper.render_config (flags below override it)")
    ap.add_argument("--algorithm", choices=["low_confidence", "joint_threshold", "orl"])
    ap.add_argument("--threshold", type=float)
    ap.add_argument("--edit-threshold", type=float)
    ap.add_argument("--no-editing", action="store_true", help="turn T2T editing off (≠ --edit-threshold 0)")
    ap.add_argument("--max-post-steps", type=int)
    ap.add_argument("--max-new-tokens", type=int)
    ap.add_argument("--temperature", type=float)
    ap.add_argument("--no-self-conditioning", action="store_true")
    ap.add_argument("--residual-temperature", type=float)
    ap.add_argument("--exclude-mask-token", action="store_true",
                    help="never propose <|mask|> (default: it is a candidate, as in the LLaDA2.1 reference)")
    ap.add_argument("--block-size", type=int)
    ap.add_argument("--seed", type=int)


def _decoder_overrides(a) -> dict:
    base = {}
    if a.decoder:
        import yaml

        base = yaml.safe_load(open(a.decoder)) or {}
        if not isinstance(base, dict):
            raise SystemExit(f"{a.decoder}: a decoder config must be a mapping of decoder keys")
    d = {"algorithm": a.algorithm, "threshold": a.threshold, "edit_threshold": a.edit_threshold,
         "max_post_steps": a.max_post_steps, "max_new_tokens": a.max_new_tokens, "temperature": a.temperature,
         "residual_temperature": a.residual_temperature, "block_size": a.block_size}
    d = {**base, **{k: v for k, v in d.items() if v is not None}}
    if a.no_editing:
        d["editing"] = False
    if a.no_self_conditioning:
        d["self_conditioning"] = False
    if a.exclude_mask_token:
        d["exclude_mask_token"] = True
    return d


def _device(a) -> str:
    import torch

    return a.device or ("cuda" if torch.cuda.is_available() else "cpu")


def _precision(a) -> str:
    if a.precision:
        return a.precision
    return "bf16" if _device(a).startswith("cuda") else "fp32"


def _cpu_threads(a) -> None:
    """On the CPU, torch's intra-op threads: ``--threads``, else ``$OMP_NUM_THREADS`` (torch reads it itself),
    else 1 (the ``--threads`` help says why). A CUDA run keeps torch's default."""
    import torch

    if _device(a).startswith("cpu"):
        if a.threads is not None:
            torch.set_num_threads(a.threads)
        elif not os.environ.get("OMP_NUM_THREADS"):
            torch.set_num_threads(1)


def main(argv=None) -> int:
    """Entry point; returns the exit status (2 for bad arguments or inputs, with a one-line error)."""
    ap = argparse.ArgumentParser(prog="python -m repro.engine", description="LLaDA2 block-diffusion engine")
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="generate one completion")
    _decoder_flags(g)
    g.add_argument("--raw", action="store_true", help="use the prompt as is (no chat template)")
    g.add_argument("prompt")
    b = sub.add_parser("bench", help="benchmarks")
    bsub = b.add_subparsers(dest="bench_cmd", required=True)
    s = bsub.add_parser("suite", help="run problem files, write records + summary")
    _decoder_flags(s)
    s.add_argument("--problems", nargs="+", required=True, help="benchmark JSONL files")
    s.add_argument("--out", required=True, help="output directory")
    s.add_argument("--limit", type=int, default=None, help="first N problems of each file")
    s.add_argument("--batch-size", type=int, default=1,
                   help="requests decoded together (continuous batching; greedy ids equal those of 1; on "
                        "the CPU it beats 1 at --threads 1, the default, not at more threads: see --threads)")
    v = sub.add_parser("serve", help="HTTP server: /generate (streamed per block) and an OpenAI-compatible API")
    v.add_argument("--model", required=True, help="checkpoint directory or hub id (owner/name)")
    v.add_argument("--role", default="orl", choices=["orl", "base"])
    v.add_argument("--precision", default=None, choices=["fp32", "bf16"], help="default: bf16 on cuda, fp32 on cpu")
    v.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: cuda if available)")
    v.add_argument("--threads", type=int, default=None,
                   help="CPU: torch threads per operation (default: $OMP_NUM_THREADS if set, else 1; see "
                        "bench suite --help)")
    from repro.engine.serve import add_serve_args

    add_serve_args(v)
    a = ap.parse_args(argv)
    if a.cmd == "bench" and a.limit is not None and a.limit < 1:  # as the config's `limit` (>= 1 or absent)
        ap.error(f"--limit {a.limit}: give N >= 1 (the first N problems of each file), or leave it out for all")
    if a.cmd == "bench" and a.batch_size < 1:
        ap.error(f"--batch-size {a.batch_size}: give N >= 1 (requests decoded together; 1 = one at a time)")
    if getattr(a, "threads", None) is not None and a.threads < 1:
        ap.error(f"--threads {a.threads}: give N >= 1 (torch threads per operation on the CPU), or leave it out")

    from repro.engine.llm import LLM

    try:
        _cpu_threads(a)
        if a.cmd == "serve":
            from repro.engine.serve import serve_main

            return serve_main(a, _precision(a))
        if a.cmd == "generate":
            llm = LLM(a.model, role=a.role, precision=_precision(a), device=a.device)
            dec = {**llm.default_decoder().to_dict(), **_decoder_overrides(a)}
            prompt = a.prompt if a.raw else [{"role": "user", "content": a.prompt}]
            o = llm.generate(prompt, decoder=dec, seed=a.seed)
            print(o.text)
            print(json.dumps({**{k: getattr(o, k) for k in ("prompt_tokens", "generated_tokens", "forwards", "tpf",
                                                            "wall_s", "request_tps", "finish_reason")},
                              "engine_path": llm.engine_path}))
            return 0
        from repro.engine.suite import run_suite
        summary = run_suite(a.model, a.role, _decoder_overrides(a), a.problems, a.out, limit=a.limit,
                            precision=_precision(a), device=a.device,
                            seed=a.seed if a.seed is not None else 12345, batch_size=a.batch_size)
        print(json.dumps(summary))
        return 0
    except (ValueError, FileNotFoundError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
