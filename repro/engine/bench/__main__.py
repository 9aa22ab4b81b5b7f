"""``python -m repro.engine.bench NAME [options]``: the one entry point of the engine's benchmarks.

``NAME`` ``round`` | ``generate`` | ``decode`` | ``all`` | ``batch`` share one parser
(:func:`repro.engine.bench.rounds.build_parser`); the others (``graph-round``, ``slot-attention``, ``route``,
``w4``, ``serve``: :data:`repro.engine.bench.COMMANDS`) hand the rest of the command line to their module's
``main``, so ``python -m repro.engine.bench graph-round --help`` shows that benchmark's own options. ``--help``
lists every NAME. Every benchmark prints its progress on stderr and one JSON document as its last stdout line;
without CUDA the GPU benchmarks print ``{"error": "CUDA not available", ...}`` and exit with status 2 (``serve``
runs on the CPU with ``--checkpoint DIR --device cpu``).
"""
from __future__ import annotations

import importlib
import json
import sys

from repro.engine.bench import COMMANDS


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark named by ``argv[0]`` (default ``sys.argv[1:]``); returns its exit status. Argument
    errors exit with status 2 through argparse, naming the option and the fix."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in COMMANDS:
        module = importlib.import_module(f"repro.engine.bench.{COMMANDS[argv[0]][0]}")
        return module.main(argv[1:])
    from repro.engine.bench import rounds

    ap = rounds.build_parser({name: what for name, (_, what) in COMMANDS.items()})
    args = ap.parse_args(argv)
    if args.mode in COMMANDS:  # options before the name: the command's own parser would not see them
        ap.error(f"{args.mode}: put its name first, python -m repro.engine.bench {args.mode} [options]")
    import torch

    from repro.engine.bench.common import copy_bandwidth, env_info

    if not torch.cuda.is_available():
        print(json.dumps({"error": "CUDA not available", **env_info()}))
        return 2
    if args.mode == "batch":  # batched generation: throughput at batch 1/8/32 and batch invariance
        from repro.engine.bench.batch import run as run_batch

        return run_batch(args, env_info, copy_bandwidth)
    return rounds.run(args, ap)


if __name__ == "__main__":
    sys.exit(main())
