"""Independent graders: each grades the same completions its own way; where one differs from ours, the
verdict is *listed* (``repro.scoring.second_grader``). None ever changes a score.

Contract: a grader is a module ``repro/scoring/graders/<name>.py`` defining
- ``NAME`` (= the module name), ``TITLE`` (what it is, with its source), ``SHORT`` (a few words);
- ``problem() -> str | None``: why it cannot run in this environment, with the fix; None when it can;
- ``version() -> dict``: package versions / file hashes that identify it (into each report and provenance);
- either ``IN_WORKER = True`` and ``verdict(benchmark, gold, completion) -> {"extracted", "correct",
  "detail"}``, run inside a grader worker process (``worker.py``: a killable process, sympy may hang), or
  ``IN_WORKER = False`` and ``grade(benchmark, problems, completions, scores, workers, timeout_s) ->
  [{"extracted", "correct", "status": "ok"|"error"|"skipped", "detail"}]``, one per problem, in order;
- optionally (``IN_WORKER`` graders) ``prepare()``: import what ``verdict`` needs, called in a worker before it
  reports ready when the pool was started for this grader's benchmark (``worker.pool(n, preload=...)``).

Which graders a benchmark has is declared in its ``repro/benchmarks/<name>.py`` (``graders=(...)``): a fifth
benchmark names its graders there. ``for_benchmark(b)`` returns those modules (``in_worker(b)``: the names of its
``IN_WORKER`` ones); ``get(name)`` one;
``missing(benchmarks) -> list[str]`` one line per grader that cannot run here (empty when all can) -- the
scoring CLI and the workflow stop at start-up on it (``require``), never scoring with a thinner check.
``python -m repro.scoring.graders install`` installs the two pieces pip's dependency resolution cannot
express (``install.py``); ``python -m repro.scoring.graders check`` prints what ``missing`` finds.
"""

from __future__ import annotations

import importlib

from repro import benchmarks

__all__ = ["get", "for_benchmark", "in_worker", "missing", "missing_line", "require", "GradersUnavailable", "FIX"]

#: The one command that makes every grader available (scripts/setup.sh and the scoring image run it).
FIX = "bash scripts/setup.sh (or: pip install -e '.[graders]' && python -m repro.scoring.graders install)"


class GradersUnavailable(RuntimeError):
    """Some declared grader cannot run here; the message is one line naming each and the fix."""


def get(name: str):
    """The grader module ``name``. ValueError for an unknown one (a declaration's typo)."""
    try:
        mod = importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        if e.name == f"{__name__}.{name}":
            raise ValueError(f"unknown grader {name!r} (no repro/scoring/graders/{name}.py)") from None
        raise
    if getattr(mod, "NAME", None) != name:
        raise ValueError(f"repro/scoring/graders/{name}.py must define NAME = {name!r}")
    return mod


def for_benchmark(benchmark: str) -> list:
    """The grader modules ``benchmark`` declares, in declaration order."""
    return [get(n) for n in benchmarks.get(benchmark).graders]


def in_worker(benchmark: str) -> list[str]:
    """The names of the ``IN_WORKER`` graders ``benchmark`` declares (what a grader worker pool preloads for it)."""
    return [g.NAME for g in for_benchmark(benchmark) if g.IN_WORKER]


def missing(names) -> list[str]:
    """One line per grader of the benchmarks ``names`` that cannot run here: ``"<bench>: <grader>: <why>"``."""
    out = []
    for b in names:
        for g in for_benchmark(b):
            why = g.problem()
            if why:
                out.append(f"{b}: {g.NAME}: {why}")
    return out


def missing_line(names) -> str | None:
    """One line naming every grader of the benchmarks ``names`` that cannot run here and the fix; None if all can."""
    lines = missing(names)
    return f"independent grader(s) cannot run here ({'; '.join(lines)}); fix: {FIX}" if lines else None


def require(names) -> None:
    """Raise :class:`GradersUnavailable` (:func:`missing_line`) unless every grader the benchmarks ``names``
    declare can run here."""
    line = missing_line(names)
    if line:
        raise GradersUnavailable(line)
