"""The ``replay`` backend: completions made elsewhere, by problem id, through the same scoring and tables.

    python -m repro.backends.replay --samples FILE.jsonl|reference --problems problems/gsm8k.jsonl \
        --benchmark gsm8k --model sglang-by-hand --seed 12345 --out seed12345.jsonl [--note TEXT]

A model of ``config.yaml`` whose source is ``{type: replay, samples: FILE.jsonl}`` is not generated but
replayed: its generation file is built from the samples file, then scored, tabulated, compared and
recorded in provenance like any other model (``workflow/rules/analysis.smk``). ``samples: reference``
replays the benchmarks' own reference solutions (``reference_completion``), which must score 100 %: the
smoke table's ``reference`` row proves the scorers end to end.

Samples file (JSON Lines; ``{bench}`` in the path is replaced by the benchmark, so one file per benchmark
also works)::

    {"id": "gsm8k/0", "completion": "raw text ...",                      # required
     "benchmark": "gsm8k",                                               # optional; other benchmarks skipped
     "generated_tokens": 211, "forwards": {"denoise": 30, "commit": 7}}  # optional, both or neither

* ``id`` is the problem id of ``docs/interfaces.md`` (``gsm8k/<line>``, MATH-500 ``unique_id``,
  HumanEval ``task_id``, ``mbpp/<task_id>``). Records of problems outside the suite's problem file are
  ignored (counted in the meta); a problem of the suite without a record is an error naming it.
* TPF only when a record carries forward counts: ``generated_tokens`` ÷ (``denoise`` + ``commit``), the
  README's TPF convention. Without them the table's TPF cell is ``-``.
* Output: the generation records of ``docs/interfaces.md`` (``backend: "replay"``; fields a replay cannot
  know are null) and ``OUT.meta.json`` naming the samples file, its sha256 and the note, written
  atomically (``repro.io``).

Errors (``ReplayError``, exit status 2): an unreadable line, a record without ``id`` or string
``completion``, two records for one problem, forward counts without token counts, missing problems.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from repro import benchmarks
from repro.io import atomic_write_text, read_jsonl
from repro.provenance import code_revision, sha256_path

REFERENCE = "reference"
REFERENCE_NOTE = ("the benchmarks' own reference solutions (GSM8K answer, MATH-500 solution, HumanEval prompt + "
                  "canonical_solution, MBPP code), replayed as completions")


class ReplayError(ValueError):
    """A samples file cannot be replayed against the suite's problems; the message names the record."""


def reference_completion(benchmark: str, problem: dict) -> str:
    """The benchmark's own reference solution of ``problem`` (a normalized problem record,
    ``docs/interfaces.md``) written as a model completion, as its declaration says
    (``repro.benchmarks.<name>.reference_completion``): GSM8K the worked ``answer`` (ends ``#### N``),
    MATH-500 the ``solution`` (its ``\\boxed{}``), HumanEval ``prompt`` + ``canonical_solution`` in a
    Python fence, MBPP ``code`` in a Python fence.

    Raises:
        ReplayError: unknown benchmark (the message lists the declared ones).
    """
    try:
        decl = benchmarks.get(benchmark)
    except ValueError as e:
        raise ReplayError(str(e)) from None
    return decl.reference_completion(problem["source"])


def _forwards(rec: dict, where: str) -> tuple[int | None, dict | None]:
    toks, fwd = rec.get("generated_tokens"), rec.get("forwards")
    if fwd is None:
        return (toks if isinstance(toks, int) else None), None
    if not (isinstance(fwd, dict) and all(isinstance(fwd.get(k), int) and fwd[k] >= 0 for k in ("denoise", "commit"))):
        raise ReplayError(f"{where}: 'forwards' must be an object with integer 'denoise' and 'commit' counts "
                          f"(prefill optional), got {fwd!r}")
    if not isinstance(toks, int) or toks < 0:
        raise ReplayError(f"{where}: forward counts need 'generated_tokens' (an integer) for TPF; add it or drop "
                          "'forwards'")
    return toks, {"prefill": int(fwd.get("prefill") or 0), "denoise": fwd["denoise"], "commit": fwd["commit"]}


def load_samples(path: Path, benchmark: str, problems: list[dict]) -> tuple[dict[str, dict], int]:
    """Samples of ``problems`` from a JSONL file: ``({id: record}, records ignored)``; ReplayError on bad input."""
    want = {p["id"] for p in problems}
    try:
        rows = read_jsonl(path, error=ReplayError)
    except FileNotFoundError:
        raise ReplayError(f"samples file {path} does not exist; set the model's source.samples to a JSONL of "
                          "{id, completion} records (or 'reference')") from None
    out: dict[str, dict] = {}
    ignored = 0
    for n, r in enumerate(rows, 1):
        where = f"{path}:{n}"
        if r.get("benchmark", benchmark) != benchmark:
            ignored += 1
            continue
        pid = r.get("id")
        if pid is None:
            raise ReplayError(f"{where}: record has no 'id' (the problem id, e.g. gsm8k/0 or HumanEval/0)")
        if pid not in want:
            ignored += 1
            continue
        if not isinstance(r.get("completion"), str):
            raise ReplayError(f"{where}: id {pid!r} has no string 'completion'")
        if pid in out:
            raise ReplayError(f"{where}: a second record for id {pid!r}; keep one completion per problem")
        out[pid] = r
    missing = [p["id"] for p in problems if p["id"] not in out]
    if missing:
        raise ReplayError(f"{path}: no {benchmark} sample for {len(missing)} of the suite's {len(problems)} problems, "
                          f"e.g. {missing[:5]}; add them, or lower the suite's limit / pick other benchmarks")
    return out, ignored


def replay(samples: str, problems_path: Path, benchmark: str, model: str, seed: int, out: Path,
           note: str | None = None) -> list[dict]:
    """Write the generation file ``out`` (+ ``out.meta.json``) of one replayed cell; returns its records."""
    problems = read_jsonl(problems_path, error=ReplayError)
    if samples == REFERENCE:
        by_id = {p["id"]: {"id": p["id"], "completion": reference_completion(benchmark, p)} for p in problems}
        ignored, sample_meta = 0, {"kind": REFERENCE, "path": None, "sha256": None, "note": note or REFERENCE_NOTE}
    else:
        path = Path(samples.replace("{bench}", benchmark)).expanduser().resolve()
        by_id, ignored = load_samples(path, benchmark, problems)
        sample_meta = {"kind": "file", "path": str(path), "sha256": sha256_path(path), "note": note}
    recs = []
    for p in problems:
        r = by_id[p["id"]]
        toks, fwd = _forwards(r, f"{samples}: id {p['id']!r}")
        fw = (fwd["denoise"] + fwd["commit"]) if fwd else 0
        recs.append({"id": p["id"], "benchmark": benchmark, "model": model, "seed": seed, "backend": "replay",
                     "template_version": None, "prompt_text": None, "completion": r["completion"],
                     "prompt_tokens": None, "generated_tokens": toks, "forwards": fwd,
                     "tpf": (toks / fw) if fwd and fw else None, "wall_s": None, "tokens_per_s": None,
                     "finish_reason": r.get("finish_reason"), "device": None})
    meta = {"model": model, "benchmark": benchmark, "seed": seed, "backend": "replay", "samples": sample_meta,
            "records_used": len(recs), "records_ignored": ignored, "problems_sha256": sha256_path(problems_path),
            "code_revision": code_revision(), "decoder": None, "checkpoint_manifest_sha256": None,
            "backend_info": {"backend": "replay", "device": None, "samples": sample_meta}}
    atomic_write_text(out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs))
    atomic_write_text(Path(str(out) + ".meta.json"), json.dumps(meta, indent=1, sort_keys=True) + "\n")
    return recs


def caption_note(label: str, samples: dict, has_tpf: bool, latex: bool = False, rejected: list[str] = ()) -> str:
    """The table caption's sentence for a replayed row: where its samples came from, why no TPF, and (for
    reference solutions, which must all score) every problem whose reference the scorers rejected."""
    from repro.tables.render import NOT_COUNTED, latex_escape

    esc = latex_escape if latex else (lambda s: s)
    if samples.get("kind") == REFERENCE:
        what = samples.get("note") or REFERENCE_NOTE
    else:
        what = "samples from " + (samples.get("path") or "a samples file") + (
            f" ({samples['note']})" if samples.get("note") else "")
    tpf = "" if has_tpf else f"; no TPF ({NOT_COUNTED}: the samples carry no forward counts)"
    text = f"Row \u201c{label}\u201d is replayed, not generated: {what}{tpf}."
    if rejected:
        text += f" Exceptions, reference solutions the scorers reject ({len(rejected)}): {'; '.join(rejected)}."
    elif samples.get("kind") == REFERENCE:
        text += " Every reference solution is scored correct (100%)."
    return esc(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m repro.backends.replay", description=__doc__.splitlines()[0])
    ap.add_argument("--samples", required=True, help="JSONL of {id, completion} ('{bench}' expands), or 'reference'")
    ap.add_argument("--problems", required=True, type=Path)
    ap.add_argument("--benchmark", required=True, choices=benchmarks.names())
    ap.add_argument("--model", required=True, help="model name from config.yaml")
    ap.add_argument("--seed", required=True, type=int)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--note", help="where the samples came from (into provenance and the table caption)")
    a = ap.parse_args(argv)
    try:
        recs = replay(a.samples, a.problems, a.benchmark, a.model, a.seed, a.out, a.note)
    except ReplayError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    tpf = "with forward counts (TPF)" if any(r["forwards"] for r in recs) else "no forward counts (no TPF)"
    print(f"replayed {len(recs)} {a.benchmark} samples from {a.samples}, {tpf} -> {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
