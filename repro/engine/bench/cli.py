"""Command-line plumbing shared by the engine benchmarks (``python -m repro.engine.bench route``,
``slot-attention``, ``graph-round``; :func:`int_list` and :func:`emit_json` also by ``round``/``decode``/``batch``,
:func:`emit_json` and :func:`log` by ``serve``): one way to parse their arguments, refuse a machine without CUDA, read
a JSON file named by a flag, log progress, and end with the JSON document. Imports no other benchmark module.

Contract (every such benchmark CLI):

* progress lines go to stderr (:func:`log`), a table goes to stderr, and the last stdout line is the one JSON
  document (:func:`emit_json`, also written to ``--json FILE``);
* a bad integer list (``--slots`` / ``--rows``) ends in one ``argparse`` error (exit status 2) naming the flag,
  its value and the fix, checked *before* the CUDA check, so a typo is reported on any machine; a bad JSON file
  (``--sets`` / ``--sweep``) likewise, on a CUDA machine; the error comes from the parser that defines the flag,
  so the usage printed above it is that parser's;
* without CUDA the last stdout line is ``{"error": "CUDA not available"}`` and the exit status is 2.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Callable

import torch

__all__ = ["emit_json", "gpu_args", "int_list", "log", "read_json_object"]


def int_list(ap, flag: str, text: str, example: str = "1,8,32") -> list[int]:
    """``text`` (comma-separated integers, the value of ``flag``) as a list; otherwise ``ap.error`` (exit 2)
    naming the flag and an example."""
    try:
        return [int(v) for v in text.split(",") if v]
    except ValueError:
        ap.error(f"{flag} {text!r}: want comma-separated integers, e.g. {example}")


def emit_json(doc: dict, path: str | None) -> int:
    """The benchmarks' last step: ``doc`` as one JSON line on stdout (the last line a device call returns) and,
    when ``path`` is given, the same text in that file. Returns 0 (the exit status)."""
    text = json.dumps(doc)
    if path:
        with open(path, "w") as fh:
            fh.write(text + "\n")
    print(text)
    return 0


def log(msg: str) -> None:
    """One progress line on stderr, flushed at once (so a run cut short still shows how far it got)."""
    print(msg, file=sys.stderr, flush=True)


def gpu_args(ap: argparse.ArgumentParser, argv: list[str] | None, list_flag: str, example: str = "1,8,32",
             check: Callable[[list[int]], str | None] | None = None) -> tuple[argparse.Namespace, list[int]]:
    """Add ``--json FILE`` to ``ap``, parse ``argv`` and the comma-separated integers of ``list_flag`` (e.g.
    ``"--slots"``; :func:`int_list`, ``example`` shown in its error). ``check(ints)``, when
    given, returns what is wrong with the values (one phrase with the fix) or None.

    Returns ``(args, ints)``. Raises ``SystemExit(2)``: through ``ap.error`` for bad arguments (naming the flag, its
    value and the fix), or, after printing ``{"error": "CUDA not available"}`` on stdout, when torch sees no CUDA
    device.
    """
    ap.add_argument("--json", default=None, help="also write the JSON document to this file")
    args = ap.parse_args(argv)
    text = getattr(args, list_flag.lstrip("-").replace("-", "_"))
    ints = int_list(ap, list_flag, text, example)
    problem = check(ints) if check else None
    if problem:
        ap.error(f"{list_flag} {text!r}: {problem}")
    if not torch.cuda.is_available():
        print(json.dumps({"error": "CUDA not available"}))
        raise SystemExit(2)
    return args, ints


def read_json_object(ap: argparse.ArgumentParser, flag: str, path: str, shape: str) -> dict:
    """The JSON object in file ``path`` (the value of ``flag``). ``shape`` describes the wanted object for the
    error message, e.g. ``"{name: configs}"``. ``ap``: the parser that defines ``flag`` (in a CLI with
    subcommands, that subcommand's own parser, not the top-level one), whose usage the error prints.

    Raises ``SystemExit(2)`` through ``ap.error`` naming the flag and file when the file cannot be read, is not
    JSON, or holds something other than an object.
    """
    try:
        with open(path) as fh:
            doc = json.load(fh)
    except (OSError, ValueError) as exc:
        ap.error(f"{flag} {path}: {exc} (want a JSON object {shape})")
    if not isinstance(doc, dict):
        ap.error(f"{flag} {path}: want a JSON object {shape}, got {type(doc).__name__}")
    return doc
