"""Regression-case runner and problem loading from the shared data files.

``run_cases(cases, data_dir, workers) -> (results, summary)`` scores records
``{id, benchmark, model_output, gold?, task_id?}`` (format of ``../shared/cases/scoring_cases.jsonl``,
docs/scoring_rules.md §10): ``gold`` is the GSM8K answer text (``#### N`` or a number) or the MATH answer; ``task_id``
names the HumanEval/MBPP problem whose tests apply, read from ``data_dir``. Each result is
``{id, correct, extracted, reason}`` (plus ``expected_correct`` and ``agrees`` when the case has an
expectation); the summary counts correct verdicts and disagreements with ``expected_correct``.

``load_problems(data_dir, benchmark)`` reads ``<data_dir>/<declared file>`` into normalized problem
records through ``repro.data.normalize`` (ids and gold as the benchmark declares them). It is a small
reader for tests and case runs, not the data stage (``repro.data`` owns preparation and hashing).
"""

from __future__ import annotations

from pathlib import Path

from repro import benchmarks

from .jsonl import read_jsonl

__all__ = ["load_problems", "run_cases", "case_problems"]


def load_problems(data_dir, benchmark: str, filename: str | None = None) -> list[dict]:
    """All problems of ``benchmark`` from ``data_dir`` (its declared file, or ``filename``), normalized."""
    from repro.data import normalize

    path = Path(data_dir) / (filename or benchmarks.get(benchmark).file)
    return normalize(benchmark, read_jsonl(path), str(path))


def _find_task(data_dir, benchmark: str, task_id, cache: dict) -> dict:
    if benchmark not in cache:
        probs = load_problems(data_dir, benchmark)
        for extra in benchmarks.get(benchmark).case_files:
            if (Path(data_dir) / extra).is_file():  # tasks outside the test split (e.g. MBPP 927)
                seen = {p["source"]["task_id"] for p in probs}
                probs += [p for p in load_problems(data_dir, benchmark, extra)
                          if p["source"]["task_id"] not in seen]
        cache[benchmark] = {str(p["source"]["task_id"]): p for p in probs}
    try:
        return cache[benchmark][str(task_id)]
    except KeyError:
        raise ValueError(f"{benchmark} task_id {task_id!r} not found in {data_dir}") from None


def case_problems(cases: list[dict], data_dir) -> dict[str, list[tuple[int, dict]]]:
    """``{benchmark: [(index in cases, problem record)]}`` for regression cases (module docstring); a code case's
    problem is its task's, renamed to the case id. ValueError for a case without the fields it needs."""
    cache: dict = {}
    groups: dict[str, list[tuple[int, dict]]] = {}
    for i, c in enumerate(cases):
        for k in ("id", "benchmark", "model_output"):
            if k not in c:
                raise ValueError(f"case #{i} ({c.get('id', '?')}) lacks field {k!r}")
        b = c["benchmark"]
        try:
            kind = benchmarks.get(b).kind
        except ValueError as e:
            raise ValueError(f"case {c['id']!r}: {e}") from None
        if kind == "math":
            if "gold" not in c:
                raise ValueError(f"case {c['id']!r}: {b} cases need 'gold'")
            problem = {"id": c["id"], "benchmark": b, "gold": c["gold"], "source": {}}
        else:
            if "task_id" not in c:
                raise ValueError(f"case {c['id']!r}: {b} cases need 'task_id'")
            base = _find_task(data_dir, b, c["task_id"], cache)
            problem = {**base, "id": c["id"]}
        groups.setdefault(b, []).append((i, problem))
    return groups


def run_cases(cases: list[dict], data_dir, workers: int | None = None) -> tuple[list[dict], dict]:
    """Score regression cases grouped by benchmark; results keep the input order."""
    from . import score_records

    groups = case_problems(cases, data_dir)
    results: list[dict | None] = [None] * len(cases)
    for b, items in groups.items():
        problems = [p for _, p in items]
        completions = {cases[i]["id"]: cases[i]["model_output"] for i, _ in items}
        if len(completions) != len(items):
            raise ValueError(f"duplicate case ids among {b} cases")
        for (i, _), s in zip(items, score_records(b, problems, completions, workers)):
            r = {"id": s["id"], "correct": s["correct"], "extracted": s["extracted"], "reason": s["reason"]}
            if "expected_correct" in cases[i]:
                r["expected_correct"] = bool(cases[i]["expected_correct"])
                r["agrees"] = r["correct"] == r["expected_correct"]
            results[i] = r
    with_exp = [r for r in results if "agrees" in r]
    summary = {
        "summary": True,
        "n": len(results),
        "correct": sum(r["correct"] for r in results),
        "with_expectation": len(with_exp),
        "agree": sum(r["agrees"] for r in with_exp),
        "disagree_ids": [r["id"] for r in with_exp if not r["agrees"]],
    }
    return results, summary
