"""Benchmark declarations: one module per benchmark, found by name; every list and dispatch derives from here.

Contract: each module ``repro/benchmarks/<name>.py`` defines ``BENCHMARK = Benchmark(...)`` with
``name == <name>``: display title, data file and its required fields, published sha256, how a record
becomes a problem id and gold, its reference solution written as a completion (the ``replay``
backend's self-test, which must score 100 %), prompt template and the fields it reads, stop strings,
kind (``math``:
the answer is extracted and compared; ``code``: a program runs in the sandbox), the scorer module
under ``repro.scoring``, the independent graders (modules of ``repro.scoring.graders``), and the hub dataset (path, config, split, pinned revision). ``get(name)``
returns one declaration (``ValueError`` naming the known benchmarks otherwise), ``names()`` all names,
``declarations()`` all declarations -- math benchmarks first, then code, alphabetical within a kind
(gsm8k, math500, humaneval, mbpp). Discovery imports every module of this package, so adding a
benchmark is one module plus its template and tests (docs/benchmarks.md).

Who reads what: ``repro.data`` (file, fields, ids, gold, hub), ``repro.prompts`` (template, prompt
fields, stop strings), ``repro.scoring`` (kind, scorer, graders), ``repro.backends.replay`` (reference
completion), ``repro.tables`` (title), ``repro.config`` (allowed names in a suite or sweep), the
workflow (the ``{bench}`` wildcard, the scoring timeout for code); ``repro.provenance`` counts this
package as code of the prepare, generate, score and table stages.
Modelled on lm-eval's one YAML per task and nanochat's ``tasks/*.py``.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

__all__ = ["Benchmark", "get", "names", "declarations", "KINDS"]

KINDS = ("math", "code")


@dataclass(frozen=True)
class Benchmark:
    """One benchmark's declaration (module docstring). Callables take original records (dicts)."""

    name: str                              # id in paths, config and the ``{bench}`` wildcard
    title: str                             # column title in the tables ("MATH-500")
    kind: str                              # "math" | "code"
    file: str                              # original JSONL file in a data directory / repro/data/builtin
    fields: tuple[str, ...]                # fields every original record must have
    published_sha256: str                  # of the published file; another hash is flagged "not comparable"
    problem_id: Callable[[int, dict], str]  # (line index, record) -> problem id
    gold: Callable[[dict], str]            # record -> gold (answer text or reference code)
    template: str                          # file in repro/prompts/templates/
    template_number: int                   # bumped when the wording changes on purpose
    prompt_fields: tuple[str, ...]         # fields the template reads
    stop: tuple[str, ...]                  # stop strings cut after generation (besides the EOS markers)
    scorer: str                            # module in repro.scoring (math: score_many; code: build_program)
    hub_path: str                          # Hugging Face dataset id
    hub_config: str | None
    hub_split: str
    hub_revision: str | None               # pinned dataset commit; None = not pinned (logged at load)
    reference_completion: Callable[[dict], str]  # record -> its reference solution written as a completion
    from_hub: Callable[[list[dict]], list[dict]] | None = None  # hub rows -> original layout, if they differ
    case_files: tuple[str, ...] = ()       # extra files whose tasks regression cases may name (code)
    # independent graders (modules of repro.scoring.graders) whose differing verdicts are listed beside
    # ours and counted both ways in the table's band; none changes a score (docs/scoring.md)
    graders: tuple[str, ...] = ()

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"benchmark {self.name!r}: kind must be one of {KINDS}, got {self.kind!r}")


@lru_cache(maxsize=None)
def _registry() -> dict[str, Benchmark]:
    found = []
    for info in pkgutil.iter_modules(__path__):
        mod = importlib.import_module(f"{__name__}.{info.name}")
        b = getattr(mod, "BENCHMARK", None)
        if not isinstance(b, Benchmark):
            raise TypeError(f"repro/benchmarks/{info.name}.py must define BENCHMARK = Benchmark(...)")
        if b.name != info.name:
            raise ValueError(f"repro/benchmarks/{info.name}.py declares name {b.name!r}; it must be {info.name!r}")
        found.append(b)
    found.sort(key=lambda b: (KINDS.index(b.kind), b.name))
    return {b.name: b for b in found}


def declarations() -> list[Benchmark]:
    """All declarations: math benchmarks, then code, alphabetical within a kind."""
    return list(_registry().values())


def names() -> tuple[str, ...]:
    """All benchmark names, in ``declarations()`` order."""
    return tuple(_registry())


def get(name: str) -> Benchmark:
    """The declaration of ``name``.

    Raises:
        ValueError: unknown name (the message lists the known ones).
    """
    reg = _registry()
    if name not in reg:
        raise ValueError(f"unknown benchmark {name!r}; expected one of {', '.join(reg)}")
    return reg[name]
