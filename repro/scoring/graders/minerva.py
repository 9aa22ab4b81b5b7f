"""MATH-500 grader: the Minerva grader as lm-evaluation-harness ships it (``lm_eval/tasks/minerva_math/utils.py``).

Contract: the grader protocol of ``repro.scoring.graders`` (``IN_WORKER = True``). ``normalize_final_answer``
(Lewkowycz et al. 2022, "Solving Quantitative Reasoning Problems with Language Models", appendix D) on both
sides, then ``is_equiv``: equal strings, else sympy's own ANTLR ``parse_latex`` and ``simplify(a - b) == 0``
(its 5 s SIGALRM limit works here: the worker's main thread). Extraction: that file's
``last_boxed_only_string`` + ``remove_boxed`` (our prompt asks for a box), else its ``get_unnormalized_answer``
("Final Answer: The final answer is X"). Gold: the ``answer`` field, normalised the same way.
Why: its parser and normalisation share nothing with Math-Verify (our primary), so it sees Math-Verify's parse
failures. The file is loaded by path (lm-eval's own dependencies are not needed). It and sympy's
``parse_latex`` require antlr4-python3-runtime 4.11, while Math-Verify pins 4.13.2: the grader workers run with
a private 4.11 first on ``sys.path`` (:data:`ANTLR_DIR`; ``python -m repro.scoring.graders install`` puts it
there; ``REPRO_ANTLR4_11_DIR`` overrides).
"""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

from ..verify_worker import ANTLR_DIR  # where the scoring workers find antlr4 4.11

__all__ = ["NAME", "TITLE", "SHORT", "IN_WORKER", "problem", "version", "prepare", "verdict", "minerva_file", "ANTLR_DIR",
           "ANTLR_PIP", "LM_EVAL_PIP"]

NAME = "minerva"
TITLE = "the Minerva grader of lm-evaluation-harness (minerva_math/utils.py: normalize_final_answer + is_equiv)"
SHORT = "Minerva (lm-eval)"
IN_WORKER = True

ANTLR_PIP = "antlr4-python3-runtime==4.11.0"
LM_EVAL_PIP = "lm-eval==0.4.13"
_MOD = None


def minerva_file() -> Path | None:
    """lm-eval's ``tasks/minerva_math/utils.py`` (found without importing lm_eval), or None."""
    spec = importlib.util.find_spec("lm_eval")
    if spec is None or not spec.submodule_search_locations:
        return None
    f = Path(list(spec.submodule_search_locations)[0]) / "tasks" / "minerva_math" / "utils.py"
    return f if f.is_file() else None


def problem() -> str | None:
    """Why it cannot run here, or None."""
    if minerva_file() is None:
        return f"lm-evaluation-harness is not installed (its minerva_math/utils.py is the grader; {LM_EVAL_PIP} --no-deps)"
    if not list(Path(ANTLR_DIR).glob("antlr4_python3_runtime-4.11*.dist-info")):
        return f"no antlr4-python3-runtime 4.11 in {ANTLR_DIR} (sympy's LaTeX parser needs 4.11; Math-Verify pins 4.13.2)"
    return None


def version() -> dict:
    """lm-eval's version, the sha256 of the file that grades, the antlr4 folder."""
    from importlib.metadata import PackageNotFoundError, version as v

    f = minerva_file()
    try:
        lm = v("lm_eval")
    except PackageNotFoundError:
        lm = None
    return {"lm_eval": lm, "file_sha256": hashlib.sha256(f.read_bytes()).hexdigest() if f else None,
            "antlr4_dir": ANTLR_DIR}


def _load():
    global _MOD
    if _MOD is None:
        spec = importlib.util.spec_from_file_location("lm_eval_minerva_math_utils", minerva_file())
        _MOD = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(_MOD)
    return _MOD


def prepare() -> None:
    """Load lm-eval's file (in a worker, before it reports ready)."""
    _load()


def verdict(benchmark: str, gold: str, completion: str) -> dict:
    """One Minerva verdict (module docstring); runs in the grader worker (SIGALRM: main thread only)."""
    mod = _load()
    box = mod.last_boxed_only_string(completion)
    raw = None
    if box is not None:
        try:
            raw = mod.remove_boxed(box)
        except AssertionError:  # "\fbox{...}": remove_boxed knows only \boxed
            raw = None
    how = "boxed"
    if raw is None:
        raw, how = mod.get_unnormalized_answer(completion), "final_answer"
    pred, ref = mod.normalize_final_answer(raw), mod.normalize_final_answer(gold)
    equal = bool(mod.is_equiv(pred, ref)) if raw != "[invalidanswer]" else False
    return {"correct": equal, "extracted": pred, "detail": f"{how}: {pred!r} {'==' if equal else '!='} {ref!r}"}
