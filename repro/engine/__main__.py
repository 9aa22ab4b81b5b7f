"""CLI of the embedded engine; ``--help`` at every level lists the options, each with its default and units.

``python -m repro.engine generate --model DIR [--role orl|base] [--raw] [decoder flags] "prompt"`` — the
prompt is wrapped as one user chat message and rendered with the checkpoint's chat template (``--raw``: use
it as is); prints the completion, then one JSON line with counts (forwards by kind: NFE), TPF and timing.

``python -m repro.engine bench suite --model DIR --role orl --threshold 0.85 --edit-threshold 0.5
--max-new-tokens 4096 --problems gsm8k.jsonl ... --out DIR [--limit N] [--batch-size N]`` — see :mod:`repro.engine.suite`;
prints the summary JSON as the last line. Its seed: ``--seed``, else the ``--decoder`` file's, else 12345.
``bench --help`` lists the sub-benchmarks (``suite``) and the engine benchmarks without a checkpoint, a package of
their own (``python -m repro.engine.bench NAME``: :mod:`repro.engine.bench`).

``python -m repro.engine serve --model DIR|HUB_ID --role orl --port 18080 [--precision] [--host] [--api-key]``
— the HTTP server (``/generate`` streamed per block, OpenAI-compatible ``/v1/...``): :mod:`repro.engine.serve`.

Decoder flags (override the role's default decoder from paper_decoding.json, and the ``--decoder`` YAML):
``--algorithm``, ``--threshold``, ``--edit-threshold``, ``--no-editing``, ``--max-post-steps``,
``--max-new-tokens``, ``--temperature``, ``--no-self-conditioning``, ``--residual-temperature``,
``--exclude-mask-token``, ``--block-size``, ``--seed``. ``--threads N`` (all three commands): torch threads per
operation on the CPU (default ``$OMP_NUM_THREADS`` if set, else 1; repro/engine/README.md says why).

Argument errors (a missing command or sub-benchmark, an option the command does not have — with the closest one it
has, ``--max_new_tokens`` → ``--max-new-tokens`` —, ``--threads``/``--limit``/``--batch-size`` below 1, a
``--decoder`` file that is not a YAML mapping) print the usage of the (sub)command they belong to and one
``error:`` line, exit status 2 (:func:`parse_args`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import textwrap

from repro.engine.bench import COMMANDS as BENCH_COMMANDS


#: ``--role`` → its decoder's model name in ``paper_decoding.json`` (as :data:`repro.engine.llm.ROLES`, kept here so
#: that ``--help`` does not import torch).
_ROLE_MODELS = {"orl": "llada-orl", "base": "llada"}
_ROLE_HELP = ("orl: load the checkpoint's ORL residual adapter, decoder llada-orl; base: no adapter, decoder llada "
              "(LLaDA2.1 S mode) (default: %(default)s)")
_PRECISION_HELP = "number format of the weights (default: bf16 on cuda, fp32 on cpu)"
_DEVICE_HELP = "cpu | cuda | cuda:N (default: cuda if available, else cpu)"
_TP_HELP = ("split each request over N ranks (N GPUs cuda:0..N-1 on one node, or N gloo processes on the CPU): "
            "experts, attention heads, dense widths and vocabulary divided by N; the ranks start with this command "
            "(docs/engine.md §15). Default: %(default)s")
_THREADS_HELP = ("CPU only: torch threads per operation (default: $OMP_NUM_THREADS if set, else 1; a CUDA run keeps "
                 "torch's default). More threads slowed the tiny model's batched denoising steps: "
                 "repro/engine/README.md has the measurements")


def _benchmark_files() -> str:
    """The declared benchmarks' file names (repro.benchmarks), for the help of ``--problems``."""
    from repro import benchmarks

    return ", ".join(b.file for b in benchmarks.declarations())


def _role_defaults() -> dict:
    """Per role, the decoder settings of the packaged ``paper_decoding.json`` (suite ``main``; block size and
    temperature from its ``engine`` block), for the help texts; ``{}`` when the file cannot be read."""
    try:
        from repro.paper import DEFAULT_PAPER_DECODING

        pd = json.loads(DEFAULT_PAPER_DECODING.read_text())
        eng = pd.get("engine", {})
        return {role: {"block_size": eng.get("block_size", 32), "temperature": eng.get("temperature", 0.0),
                       **pd["suites"]["main"][name]["defaults"]} for role, name in _ROLE_MODELS.items()}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _decoder_flags(ap: argparse.ArgumentParser, seed_default: str) -> None:
    """The options shared by ``generate`` and ``bench suite``: checkpoint, role, device, and the decoder flags.
    ``seed_default``: how the command picks the seed without ``--seed`` (for its help)."""
    ap.add_argument("--model", required=True, metavar="DIR", help="checkpoint directory")
    ap.add_argument("--role", default="orl", choices=["orl", "base"], help=_ROLE_HELP)
    ap.add_argument("--precision", default=None, choices=["fp32", "bf16", "nvfp4-w4a16", "nvfp4"],
                    help=_PRECISION_HELP + "; nvfp4-w4a16: an NVFP4 checkpoint's routed experts kept packed in 4 "
                         "bits; nvfp4 (native FP4) is refused with the alternatives")
    ap.add_argument("--device", default=None, help=_DEVICE_HELP)
    ap.add_argument("--tensor-parallel-size", type=int, default=1, metavar="N", help=_TP_HELP)
    ap.add_argument("--threads", type=int, default=None, metavar="N", help=_THREADS_HELP)
    rd = _role_defaults()

    def dflt(key: str, fmt=str) -> str:
        """``X for --role orl, Y for base`` from the packaged paper_decoding.json (one value when both agree)."""
        vals = {role: d.get(key) for role, d in rd.items()}
        if not vals or None in vals.values():
            return "the role's decoder"
        if len(set(vals.values())) == 1:
            return fmt(next(iter(vals.values())))
        (r0, v0), *rest = vals.items()
        return ", ".join([f"{fmt(v0)} for --role {r0}"] + [f"{fmt(v)} for {r}" for r, v in rest])

    def on_off(v) -> str:
        return "on" if v else "off"

    d = ap.add_argument_group(
        "decoder", "Without these, the decoder is the role's from the checkpoint's paper_decoding.json (else the "
        "packaged repro/paper/paper_decoding.json, whose values the defaults below quote); --decoder FILE "
        "overrides it and each flag overrides both.")
    d.add_argument("--decoder", metavar="FILE",
                   help="a decoder YAML rendered by repro.paper.render_config (its keys override the role's "
                        "decoder; the flags below override it)")
    d.add_argument("--algorithm", choices=["low_confidence", "joint_threshold", "orl"],
                   help="the block decoder: low_confidence (fill above the threshold, no editing), joint_threshold "
                        "(LLaDA2.1: fill + T2T edits), orl (joint_threshold + the self-conditioning residual) "
                        f"(default: {dflt('algorithm')})")
    d.add_argument("--threshold", type=float, metavar="P",
                   help="mask threshold, a probability in [0, 1]: each denoising step fills the masked positions "
                        "whose top token has p > P, else the single most confident one "
                        f"(default: {dflt('threshold')})")
    d.add_argument("--edit-threshold", type=float, metavar="P",
                   help="edit threshold, a probability in [0, 1]: a written position is re-written (T2T edit) when "
                        "its top token differs from it and has p > P; 0 edits every disagreement "
                        f"(default: {dflt('edit_threshold')})")
    d.add_argument("--no-editing", action="store_true",
                   help="turn T2T editing off (≠ --edit-threshold 0, which edits every disagreement) "
                        f"(default: editing {dflt('editing', on_off)})")
    d.add_argument("--max-post-steps", type=int, metavar="N",
                   help="denoising steps (forwards) a block may still take for edits once it has no masks "
                        f"(default: {dflt('max_post_steps')})")
    d.add_argument("--max-new-tokens", type=int, metavar="N",
                   help=f"most tokens to generate (default: {dflt('max_new_tokens')})")
    d.add_argument("--temperature", type=float, metavar="T",
                   help=f"sampling temperature; 0 = greedy (default: {dflt('temperature')})")
    d.add_argument("--no-self-conditioning", action="store_true",
                   help="turn the ORL self-conditioning residual off (it feeds each denoising step's predictions "
                        f"into the block's next one) (default: {dflt('self_conditioning', on_off)})")
    d.add_argument("--residual-temperature", type=float, metavar="T",
                   help="temperature of the self-conditioning residual's entropy weight (default: the adapter's "
                        "temperature; 1.0 without an adapter)")
    d.add_argument("--exclude-mask-token", action="store_true",
                   help="never propose <|mask|> (default: it is a candidate, as in the LLaDA2.1 reference)")
    d.add_argument("--block-size", type=int, metavar="N",
                   help="tokens per block, the unit decoded together over denoising steps "
                        f"(default: {dflt('block_size')})")
    d.add_argument("--seed", type=int, metavar="N", help=f"sampling seed, used when --temperature > 0 "
                                                          f"(default: {seed_default})")


def _decoder_overrides(a) -> dict:
    """The ``--decoder`` file's keys under the decoder flags given. Raises ValueError when the file is not YAML
    or not a mapping, OSError when it cannot be read (:func:`parse_args` reports both against ``--decoder``)."""
    base = {}
    if a.decoder:
        import yaml

        try:
            with open(a.decoder) as fh:
                base = yaml.safe_load(fh) or {}
        except yaml.YAMLError as e:
            raise ValueError("not YAML: " + " ".join(str(e).split())) from None
        if not isinstance(base, dict):
            raise ValueError(f"a decoder config must be a mapping of decoder keys, got {type(base).__name__}")
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


_COMMANDS = {"generate": "generate one completion of a prompt",
             "bench": "benchmarks of a checkpoint (bench suite)",
             "serve": "HTTP server: /generate (streamed per block) and an OpenAI-compatible API"}
#: ``bench``'s sub-benchmarks: what each measures, on what.
_BENCHES = {"suite": "generation speed of a checkpoint on benchmark problem files (GSM8K, MATH500, HumanEval, "
                     "MBPP): per file and overall, generated tokens, NFE (forwards by kind), TPF, wall time, "
                     "tokens/s; the completions as records"}
#: The engine benchmarks without a checkpoint (``python -m repro.engine.bench NAME``), listed in ``bench --help``.
_GPU_BENCHES = {"round, generate, decode, all, batch":
                    "one denoising round, a whole generation, the decode loop, batched generation; time against the "
                    "memory floor",
                **{name: what for name, (_, what) in BENCH_COMMANDS.items()}}


def _width() -> int:
    """The help width argparse itself wraps to (the terminal's, ``$COLUMNS``, less 2)."""
    return shutil.get_terminal_size().columns - 2


def _para(text: str) -> str:
    """``text`` wrapped to the help width, for ``bench``'s raw description (which keeps the lists' lines)."""
    return textwrap.fill(text, _width(), break_on_hyphens=False)


def _rows(rows: dict, indent: int = 2) -> str:
    """One ``name  text`` entry a line (continuations indented under the text), as argparse lists subcommands."""
    w = max(map(len, rows)) + 2
    return "\n".join(textwrap.fill(text, max(_width(), indent + w + 30), initial_indent=" " * indent + name.ljust(w),
                                   subsequent_indent=" " * (indent + w), break_on_hyphens=False)
                     for name, text in rows.items())


def build_parser() -> tuple[argparse.ArgumentParser, dict]:
    """The parser and its subcommand parsers by name (``generate``, ``bench``, ``bench suite``, ``serve``), so a
    check made after parsing reports against the parser whose arguments it checks."""
    ap = argparse.ArgumentParser(
        prog="python -m repro.engine", description="LLaDA2 block-diffusion engine (repro/engine/README.md).",
        epilog="'python -m repro.engine COMMAND --help' lists a command's options.")
    sub = ap.add_subparsers(dest="cmd", title="commands", metavar="COMMAND")  # a missing command: parse_args's own error
    g = sub.add_parser(
        "generate", help=_COMMANDS["generate"],
        description="Generate one completion. The prompt is wrapped as one user chat message and rendered with the "
                    "checkpoint's chat template (--raw: used as is). Prints the completion, then one JSON line: "
                    "prompt and generated tokens, forwards by kind (NFE), TPF, wall time, tokens/s, finish reason.")
    _decoder_flags(g, "the decoder's seed, 0 unless --decoder FILE sets one")
    g.add_argument("--raw", action="store_true", help="use the prompt as is (no chat template)")
    g.add_argument("prompt", help="the user message (with --raw: the whole model input)")
    b = sub.add_parser(
        "bench", help=_COMMANDS["bench"], formatter_class=argparse.RawDescriptionHelpFormatter,
        description=_para("Benchmarks of a real checkpoint with this engine, on the CPU or CUDA. Sub-benchmarks:")
        + "\n" + _rows(_BENCHES),
        epilog=_para("Engine benchmarks without a checkpoint (CUDA, serve also on the CPU; LLaDA2.1-mini's real shapes "
                     "with random weights; the last stdout line is one JSON document): python -m repro.engine.bench "
                     "NAME [--help], NAME one of:")
        + "\n" + _rows(_GPU_BENCHES))
    bsub = b.add_subparsers(dest="bench_cmd", title="sub-benchmarks", metavar="SUB_BENCHMARK")  # a missing one: parse_args's own error
    s = bsub.add_parser(
        "suite", help="run benchmark problem files; write records.jsonl + summary.json",
        description="Generate for every problem of the given files; write --out/records.jsonl (one record per "
                    "problem) and --out/summary.json (per benchmark and overall: n, generated tokens, forwards by "
                    "kind (NFE), TPF = generated tokens / (denoise + commit forwards), wall time, tokens/s). No "
                    "scoring (repro.scoring). Prints the summary JSON as the last line.")
    _decoder_flags(s, "the --decoder file's seed, else 12345")
    s.add_argument("--problems", nargs="+", required=True, metavar="FILE",
                   help=f"benchmark JSONL files ({_benchmark_files()}: the benchmark is the file name) or "
                        "normalized problem records")
    s.add_argument("--out", required=True, metavar="DIR", help="output directory")
    s.add_argument("--limit", type=int, default=None, metavar="N",
                   help="only the first N problems of each file (default: all)")
    s.add_argument("--batch-size", type=int, default=1, metavar="N",
                   help="requests decoded together, with continuous batching (default: %(default)s, one at a "
                        "time); greedy token ids equal those at 1. On the CPU a batch pays at --threads 1, the "
                        "default, not at more threads (see --threads)")
    v = sub.add_parser("serve", help=_COMMANDS["serve"],
                       description="HTTP server: /generate (streamed per block) and an OpenAI-compatible /v1 API "
                                   "(repro/engine/serve).")
    v.add_argument("--model", required=True, metavar="DIR|HUB_ID", help="checkpoint directory or hub id (owner/name)")
    v.add_argument("--role", default="orl", choices=["orl", "base"], help=_ROLE_HELP)
    v.add_argument("--precision", default=None, choices=["fp32", "bf16"], help=_PRECISION_HELP)
    v.add_argument("--device", default=None, help=_DEVICE_HELP)
    v.add_argument("--tensor-parallel-size", type=int, default=1, metavar="N", help=_TP_HELP)
    v.add_argument("--threads", type=int, default=None, metavar="N", help=_THREADS_HELP)
    from repro.engine.serve import add_serve_args

    add_serve_args(v)
    return ap, {"generate": g, "bench": b, "bench suite": s, "serve": v}


def _unknown_option_check(ap: argparse.ArgumentParser, subs: dict, argv: list[str]) -> None:
    """An option the (sub)command does not have ends in one ``error:`` line that names it and the closest option it
    does have (``--max_new_tokens`` → ``--max-new-tokens``), before argparse would take the option's value for the
    prompt and report both as "unrecognized arguments". Options after ``--`` are not checked."""
    import difflib

    words = [w for w in argv if not w.startswith("-")]
    name = "bench suite" if words[:2] == ["bench", "suite"] else (words[0] if words else None)
    p = subs.get(name, ap)
    known = [o for act in p._actions for o in act.option_strings]
    for w in argv:
        if w == "--":
            return
        opt = w.split("=", 1)[0]
        if not opt.startswith("--") or opt in known or any(k.startswith(opt) for k in known):
            continue  # argparse accepts an unambiguous prefix of a long option
        near = [k for k in known if k == opt.replace("_", "-")] or difflib.get_close_matches(opt, known, n=1, cutoff=0.6)
        hint = f"did you mean {near[0]}?" if near else f"'{p.prog} --help' lists the options"
        p.error(f"{opt}: {p.prog} has no such option; {hint}")


def parse_args(argv=None) -> argparse.Namespace:
    """Parse ``argv``; a missing command or a bad value ends in the usage and error of the (sub)command it belongs
    to (``SystemExit(2)``)."""
    ap, subs = build_parser()
    _unknown_option_check(ap, subs, sys.argv[1:] if argv is None else list(argv))
    a = ap.parse_args(argv)
    if a.cmd is None:
        ap.error(f"choose a command: {', '.join(_COMMANDS)} ('{ap.prog} --help' says what each does)")
    if a.cmd == "bench" and a.bench_cmd is None:
        b = subs["bench"]
        b.error(f"choose a sub-benchmark: {', '.join(_BENCHES)} ('{b.prog} --help' says what each measures)")
    p = subs["bench suite" if a.cmd == "bench" else a.cmd]
    if a.cmd == "bench" and a.limit is not None and a.limit < 1:  # as the config's `limit` (>= 1 or absent)
        p.error(f"--limit {a.limit}: give N >= 1 (the first N problems of each file), or leave it out for all")
    if a.cmd == "bench" and a.batch_size < 1:
        p.error(f"--batch-size {a.batch_size}: give N >= 1 (requests decoded together; 1 = one at a time)")
    if a.tensor_parallel_size < 1:
        p.error(f"--tensor-parallel-size {a.tensor_parallel_size}: give N >= 1 (ranks per request; 1 = one device)")
    if a.threads is not None and a.threads < 1:
        p.error(f"--threads {a.threads}: give N >= 1 (torch threads per operation on the CPU), or leave it out")
    if a.cmd in ("generate", "bench"):
        try:
            a.decoder_overrides = _decoder_overrides(a)
        except OSError as e:
            p.error(f"--decoder {a.decoder}: {e.strerror or e}")
        except ValueError as e:
            p.error(f"--decoder {a.decoder}: {e}")
    return a


def main(argv=None) -> int:
    """Entry point; returns the exit status (2 for bad arguments or inputs, with a one-line error)."""
    a = parse_args(argv)
    from repro.console import plain_warnings

    plain_warnings()  # "warning: <message> (RuntimeWarning)", one line, no source path
    from repro.engine.llm import LLM

    try:
        _cpu_threads(a)
        if a.cmd == "serve":
            from repro.engine.serve import serve_main

            return serve_main(a, _precision(a))
        if a.cmd == "generate":
            with LLM(a.model, role=a.role, precision=_precision(a), device=a.device,
                     tensor_parallel_size=a.tensor_parallel_size) as llm:  # leaves the ranks' group before exit
                dec = {**llm.default_decoder().to_dict(), **a.decoder_overrides}
                prompt = a.prompt if a.raw else [{"role": "user", "content": a.prompt}]
                o = llm.generate(prompt, decoder=dec, seed=a.seed)
            print(o.text)
            print(json.dumps({**{k: getattr(o, k) for k in ("prompt_tokens", "generated_tokens", "forwards", "tpf",
                                                            "wall_s", "request_tps", "finish_reason")},
                              "engine_path": llm.engine_path, "precision": llm.precision,
                              "tensor_parallel_size": llm.tensor_parallel_size}))
            return 0
        from repro.engine.suite import run_suite
        seed = a.seed if a.seed is not None else a.decoder_overrides.get("seed", 12345)
        summary = run_suite(a.model, a.role, a.decoder_overrides, a.problems, a.out, limit=a.limit,
                            precision=_precision(a), device=a.device, seed=seed, batch_size=a.batch_size,
                            tensor_parallel_size=a.tensor_parallel_size)
        print(json.dumps(summary))
        return 0
    except (ValueError, FileNotFoundError, KeyError, RuntimeError) as e:  # RuntimeError: a rank failed (ranks.py)
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
