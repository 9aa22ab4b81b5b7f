"""The scoring worker process: ``python -m repro.scoring.graders.worker`` (started by
:class:`repro.scoring.verify_worker.VerifyPool`, never by hand). Our Math-Verify verdicts and the independent
graders share these workers (``verify_worker``: why, and the antlr4 4.11 first on their ``PYTHONPATH``).

Contract: the ``verify_worker`` protocol. After importing Math-Verify (enlarging its parse caches, below) and the
graders named in :data:`PRELOAD_ENV` (with their optional ``prepare()``) it writes ``{"ready": true}``; then per
stdin line one stdout line:
- ``{"gold", "pred"}`` (our MATH-500 check): ``{"status": "ok", **repro.scoring.math.equivalent(gold, pred)}``;
- ``{"gold", "pred": <completion>, "benchmark", "graders": [names]}``: ``{"status": "ok", "verdicts": {name:
  {"extracted", "correct", "status": "ok"|"error", "detail"}}}``, each named grader's ``verdict`` (an
  ``IN_WORKER`` grader of ``repro.scoring.graders``), an exception of one grader reported as its ``"error"``
  (the others still answer).
An exception of our check becomes ``{"status": "error", ...}`` (``verify_serve.serve_loop``). Library output goes
to stderr. One request carries all graders of an item, so their imports are paid once per worker, not per
grader. The hard timeouts are the pool's (:data:`TIMEOUT_S` for a graders request, ``DEFAULT_TIMEOUT_S`` for
ours): past one, it kills this process. ``pool(workers, preload=names)`` is ``verify_worker.get_pool``.

Math-Verify's parse costs, paid once (``_speed_up_math_verify``, at start-up; same functions, same results: only
what is computed twice changes):
- Parse caches: Math-Verify 0.9.0 keeps its last 20 LaTeX and expression parses (``parser.parse_latex_cached``,
  ``parse_expr_cached``: ``functools.lru_cache`` of pure functions of one string). Here they keep
  :data:`PARSE_CACHE` entries, so the gold and answer parsed for our verdict are found again when the
  Math-Verify grader reads the same item later in the same worker.
- sympy's ``parse_expr``, called without a ``global_dict`` (by ``sympify`` of a string, as in ``Number("72")``,
  and by Math-Verify), builds its default namespace on every call (``exec("from sympy import *")`` plus the
  builtins, ``sympy/parsing/sympy_parser.py`` 1.14: more than half of Math-Verify's time on GSM8K's worked
  answers). Here every binding of it in the worker is given a fresh copy of that same namespace, built once.
"""

from __future__ import annotations

from ..verify_worker import PRELOAD_ENV, get_pool

__all__ = ["pool", "serve", "TIMEOUT_S", "PRELOAD_ENV", "PARSE_CACHE"]

#: wall-clock seconds for one item's graders together; past it the worker is killed (the item: not graded)
TIMEOUT_S = 30.0
#: entries of each enlarged Math-Verify parse cache in a worker (module docstring)
PARSE_CACHE = 8192


def pool(workers: int, preload=()):
    """The process-wide scoring pool (``verify_worker.get_pool``) with at least ``workers`` slots; a new pool's
    workers import the graders named in ``preload`` before they report ready (module docstring)."""
    return get_pool(workers, preload)


def sympy_default_namespace() -> dict:
    """The namespace ``sympy.parsing.sympy_parser.parse_expr`` builds when given no ``global_dict`` (sympy 1.14,
    ``parse_expr``: ``from sympy import *``, the builtin functions, ``max``/``min`` as ``Max``/``Min``)."""
    import builtins
    import types

    from sympy import Max, Min

    namespace: dict = {}
    exec("from sympy import *", namespace)  # noqa: S102 - sympy's own default, built once instead of per call
    for name, obj in vars(builtins).items():
        if isinstance(obj, types.BuiltinFunctionType):
            namespace[name] = obj
    namespace["max"], namespace["min"] = Max, Min
    return namespace


def _speed_up_math_verify() -> None:
    """Math-Verify's parse caches refitted with :data:`PARSE_CACHE` entries, and sympy's ``parse_expr`` given a
    copy of its default namespace built once (module docstring); a piece no longer there is left alone."""
    import functools
    import sys

    import math_verify.parser as parser
    import sympy.parsing.sympy_parser as sympy_parser

    for name in ("parse_latex_cached", "parse_expr_cached"):
        fn = getattr(parser, name, None)
        if fn is not None and hasattr(fn, "cache_info") and hasattr(fn, "__wrapped__"):
            setattr(parser, name, functools.lru_cache(maxsize=PARSE_CACHE)(fn.__wrapped__))
    original = sympy_parser.parse_expr
    if getattr(original, "_repro_namespace", False):
        return
    namespace = sympy_default_namespace()

    @functools.wraps(original)
    def parse_expr(s, *args, **kwargs):
        if len(args) < 3 and "global_dict" not in kwargs:
            kwargs["global_dict"] = dict(namespace)  # a copy: eval may add to it
        return original(s, *args, **kwargs)

    parse_expr._repro_namespace = True
    for module in list(sys.modules.values()):  # every binding of it: sympy's own, sympify's lazy import, Math-Verify's
        if getattr(module, "parse_expr", None) is original:
            module.parse_expr = parse_expr


def serve() -> None:
    """Worker loop (module docstring)."""
    import os

    from ..verify_serve import serve_loop
    from . import get

    loaded = {}

    def prepare():
        _speed_up_math_verify()
        for name in filter(None, os.environ.get(PRELOAD_ENV, "").split(",")):
            mod = loaded.setdefault(name, get(name))
            if hasattr(mod, "prepare"):
                mod.prepare()

    def answer(req):
        if "graders" not in req:
            from ..math import equivalent

            return {"status": "ok", **equivalent(req["gold"], req["pred"])}
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
