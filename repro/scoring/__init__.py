"""Scoring stage: per-sample verdicts and per-benchmark summaries for the declared benchmarks.

Contract (docs/interfaces.md, "Scoring"):
``score_records(benchmark, problems, completions, workers) -> list[score record]`` with one record per
problem, in the order of ``problems``; ``completions`` maps problem id -> raw completion text and must
cover every problem (a missing id is an error naming it). A score record is
``{"id", "benchmark", "correct", "extracted", "reason", "status", "strict_correct"}`` with status
``correct``/``wrong`` (gsm8k, math500; math500 also ``timeout``/``error`` when Math-Verify hangs or
crashes) or ``passed``/``failed``/``timeout``/``error`` (humaneval, mbpp; ``reason`` carries the
sandbox verdict and the tail of stderr). ``strict_correct``: GSM8K/MATH answer given in ``\\boxed{}``
(or ``#### N`` for GSM8K); null for code benchmarks.
``summarize(benchmark, scores)`` is ``stats.summarize``. CLI: ``python -m repro.scoring score|cases``.

Problems are the normalized records of ``repro.data`` (``id``, ``benchmark``, ``gold``, ``source``).
Dispatch: the benchmark's declaration (``repro.benchmarks``) names its kind and scorer module; a ``math``
scorer exposes ``score_many``, a ``code`` scorer ``build_program`` (run here in the sandbox).
One module per concept: ``truncate`` (EOS/stop cut), ``boxed``, ``gsm8k``, ``math`` + ``math_normalize`` + ``math_forms``
+ ``verify_worker`` + ``verify_serve``
(Math-Verify in a killable process: the pool, the process's loop; ``graders/worker`` is what that process runs), ``code/extract``, ``code/sandbox``, ``humaneval``, ``mbpp``,
``stats``, ``cases`` (the regression-case runner), ``fixes`` (the turn-4 fixes' switches, a diagnostic),
``graders/`` + ``second_grader`` (the independent graders and the listed verdicts), ``__main__`` (CLI). Design notes and peer behaviour:
``docs/scoring_rules.md``; regression cases: ``../shared/cases/scoring_cases.jsonl``.
"""

from __future__ import annotations

import importlib

from repro import benchmarks

from .code.sandbox import Limits, Sandbox, default_workers
from .stats import summarize

__all__ = ["SCORER_VERSION", "score_records", "summarize", "score_programs", "scorer_module"]

# Bumped whenever a verdict can change for the same completion, so the pipeline re-scores (without
# regenerating). 1: first scorer. 2: blank boxes skipped, LaTeX thousands spacing, plain mixed numbers,
# GSM8K "answer is ... = N" and last-marker-wins, hardened code tests, output drained (docs/scoring.md).
# 3: a lone-number side of "=" is what "the answer is" states ("18 = 9 * 2"), an empty \text{} box is
# blank, sandboxed programs see .pth-named and system site dirs.
# 4: turn-3 kinds (docs/scoring_rules.md §2-§5, §9): partial Math-Verify parses, plain-text maths, option
# letters, contradicting units, unboxed "the answer is", scale and number words, stray fence, last block,
# private writable /tmp and /dev/shm.
# 5: turn-4 kinds (docs/scoring_rules.md §2 item 8, §3 item 11, §4): list words, sets vs intervals and tuples,
# repeating decimals, Unicode maths, E-notation, roman constants; GSM8K "Answer:" lines, remarks in a box, powers of
# ten, hedges, fractions; CommonMark fences, list-item indentation, split answers. Independent graders per benchmark.
SCORER_VERSION = 5

_STDERR_IN_REASON = 400


def scorer_module(benchmark: str):
    """The scorer module a benchmark declares (``repro.benchmarks``): ``math`` kind -> it has
    ``score_many(benchmark, problems, completions, workers)``; ``code`` kind -> ``build_program(source, completion)``.
    ValueError for an unknown benchmark."""
    return importlib.import_module(f"{__name__}.{benchmarks.get(benchmark).scorer}")


def _check_inputs(benchmark: str, problems: list[dict], completions: dict) -> None:
    benchmarks.get(benchmark)  # ValueError naming the known benchmarks
    ids = []
    for i, p in enumerate(problems):
        if not isinstance(p, dict) or "id" not in p:
            raise ValueError(f"problem #{i} is not a problem record with an 'id': {str(p)[:120]}")
        if p.get("benchmark", benchmark) != benchmark:
            raise ValueError(f"problem {p['id']!r} is a {p.get('benchmark')!r} problem, not {benchmark!r}")
        ids.append(p["id"])
    dup = sorted({i for i in ids if ids.count(i) > 1}) if len(set(ids)) != len(ids) else []
    if dup:
        raise ValueError(f"duplicate problem ids: {dup[:10]}")
    missing = [i for i in ids if i not in completions]
    if missing:
        raise ValueError(f"no completion for {len(missing)} problem(s), e.g. {missing[:5]}")
    wrong_type = [i for i in ids if not isinstance(completions[i], str)]
    if wrong_type:
        raise ValueError(f"completion is not a string for {wrong_type[:5]}")


def score_programs(benchmark: str, items: list[tuple[str, str, str, str]], workers: int,
                   limits: Limits | None = None) -> list[dict]:
    """Run ``(id, program, extracted, how)`` items in the sandbox and build score records."""
    with Sandbox(workers, limits) as sb:
        results = sb.run_many([prog for _, prog, _, _ in items])
    out = []
    for (pid, _, code, how), r in zip(items, results):
        reason = f"{r.status}: {r.reason} (code: {how}, {r.wall_s:.2f} s"
        reason += f", attempts {r.attempts})" if r.attempts > 1 else ")"
        if r.status != "passed" and r.stderr_tail.strip():
            reason += " | stderr tail: " + r.stderr_tail.strip()[-_STDERR_IN_REASON:]
        out.append({"id": pid, "benchmark": benchmark, "correct": r.status == "passed", "extracted": code,
                    "reason": reason, "status": r.status, "strict_correct": None})
    return out


def score_records(benchmark: str, problems: list[dict], completions: dict, workers: int | None = None,
                  timeout_s: float | None = None) -> list[dict]:
    """Score every problem's completion (see module docstring).

    ``timeout_s``: wall-clock limit per sandboxed program (HumanEval, MBPP), seconds; default
    ``Limits().timeout_s`` (10 s). The workflow passes config ``scoring.timeout_s``.
    """
    _check_inputs(benchmark, problems, completions)
    workers = int(workers) if workers else default_workers()
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    scorer = scorer_module(benchmark)
    if benchmarks.get(benchmark).kind == "math":
        return scorer.score_many(benchmark, problems, completions, workers)
    items = []
    for p in problems:
        if "source" not in p:
            raise ValueError(f"{benchmark} problem {p['id']!r} has no 'source' record (needed for its tests)")
        program, code, how = scorer.build_program(p["source"], completions[p["id"]])
        items.append((p["id"], program, code, how))
    limits = Limits(timeout_s=float(timeout_s)) if timeout_s else None
    return score_programs(benchmark, items, workers, limits)
