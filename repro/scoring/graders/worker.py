"""The grader worker process: ``python -m repro.scoring.graders.worker`` (started by :func:`pool`, never by hand).

Contract: the ``verify_worker`` protocol. After importing the graders it writes ``{"ready": true}``; then for each
stdin line ``{"gold", "pred": <completion>, "benchmark", "graders": [names]}`` it writes one stdout line
``{"status": "ok", "verdicts": {name: {"extracted", "correct", "status": "ok"|"error", "detail"}}}``: each
named grader's ``verdict`` (an ``IN_WORKER`` grader of ``repro.scoring.graders``), an exception of one grader
reported as its ``"error"`` (the others still answer). Library output goes to stderr. One request carries all
graders of an item, so a process start (sympy, Math-Verify, lm-eval's file: about 2 s) is paid once per worker,
not per grader. The hard timeout is the pool's (``verify_worker.VerifyPool``): it kills this process, and the
item counts as not graded by any of them. ``pool(workers, preload=names)`` returns the process-wide pool of these
workers, its ``PYTHONPATH`` starting with the Minerva grader's private antlr4 4.11 (``minerva.ANTLR_DIR``). The graders
named in ``preload`` (those of the benchmark about to be scored; :data:`PRELOAD_ENV` in the workers' environment) are
imported, with their optional ``prepare()``, *before* the worker reports ready, so a pool started ahead of our
scoring (the scoring CLI, ``scripts/bench_graders.py``) pays those imports while our scorer runs; other graders
load at their first request. A pool is made once per process: a later ``preload`` does not restart it.
"""

from __future__ import annotations

import threading

__all__ = ["pool", "serve", "TIMEOUT_S", "PRELOAD_ENV"]

#: wall-clock seconds for one item's graders together; past it the worker is killed (the item: not graded)
TIMEOUT_S = 30.0
#: comma-separated grader names a worker imports before it reports ready
PRELOAD_ENV = "REPRO_GRADERS_PRELOAD"
_POOL = None
_LOCK = threading.Lock()


def pool(workers: int, preload=()):
    """The process-wide pool of grader workers with at least ``workers`` slots (closed at exit); a new pool's
    workers import the graders named in ``preload`` before they report ready (module docstring)."""
    global _POOL
    from ..verify_worker import VerifyPool
    from .minerva import ANTLR_DIR

    with _LOCK:
        if _POOL is None or _POOL.size < workers:
            if _POOL is not None:
                _POOL.close()
            _POOL = VerifyPool(workers, TIMEOUT_S, module=__name__, path_first=(ANTLR_DIR,),
                               extra_env={PRELOAD_ENV: ",".join(preload)})
            import atexit

            atexit.register(_POOL.close)
        return _POOL


def serve() -> None:
    """Worker loop (module docstring)."""
    import os

    from ..verify_serve import serve_loop
    from . import get

    loaded = {}

    def prepare():
        for name in filter(None, os.environ.get(PRELOAD_ENV, "").split(",")):
            mod = loaded.setdefault(name, get(name))
            if hasattr(mod, "prepare"):
                mod.prepare()

    def answer(req):
        verdicts = {}
        for name in req["graders"]:
            try:
                mod = loaded.get(name) or loaded.setdefault(name, get(name))
                verdicts[name] = {"status": "ok", **mod.verdict(req["benchmark"], req["gold"], req["pred"])}
            except Exception as exc:  # noqa: BLE001 - one grader's failure is its verdict's status
                verdicts[name] = {"status": "error", "correct": False, "extracted": None,
                                  "detail": f"{type(exc).__name__}: {exc}"[:300]}
        return {"status": "ok", "verdicts": verdicts}

    serve_loop(answer, prepare)


if __name__ == "__main__":
    serve()
