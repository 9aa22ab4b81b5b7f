"""The rows of the ``gsm8k_local`` lm-eval task (``gsm8k_local.yaml``, its ``custom_dataset``): GSM8K's test rows
from ``$ORL_EVAL_DATA/gsm8k.jsonl`` (the original layout: ``question``, ``answer``), the folder the pipeline reads
its benchmark files from; without ``$ORL_EVAL_DATA``, the five practice problems every clone has
(``repro/data/builtin/gsm8k.jsonl``: written for this project in GSM8K's layout, not GSM8K items), said on stderr.
A relative ``$ORL_EVAL_DATA`` is taken from the working directory. An ``$ORL_EVAL_DATA`` without ``gsm8k.jsonl``
raises FileNotFoundError naming the file and the fix. lm-eval imports this file by path (``!function``)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

BUILTIN = Path(__file__).resolve().parents[2] / "repro" / "data" / "builtin" / "gsm8k.jsonl"


def gsm8k_file(environ=os.environ) -> Path:
    """The GSM8K JSONL file the task reads (module docstring)."""
    d = environ.get("ORL_EVAL_DATA")
    if not d:
        return BUILTIN
    f = Path(d) / "gsm8k.jsonl"
    if not f.is_file():
        raise FileNotFoundError(f"gsm8k_local: {f.resolve()} not found: set ORL_EVAL_DATA to the folder holding "
                                "gsm8k.jsonl (GSM8K's test split, original layout), or unset it for the built-in "
                                "practice problems")
    return f


def load(**_):
    """``{"test": Dataset}`` of :func:`gsm8k_file`'s rows (lm-eval passes the task's metadata, ignored here)."""
    import datasets

    f = gsm8k_file()
    if f == BUILTIN:
        print(f"gsm8k_local: ORL_EVAL_DATA is not set: the 5 built-in practice problems of {f} (not GSM8K items); "
              "set ORL_EVAL_DATA=/path/to/data for GSM8K's test rows", file=sys.stderr)
    rows = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})
