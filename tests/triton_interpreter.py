"""Make Triton's CPU interpreter (``TRITON_INTERPRET=1``) skip work it repeats, for the test suite only.

Under the interpreter a kernel launch patches ``triton.language`` for the launch (``GridExecutor.__call__``:
``_patch_lang``, about 1,000 attribute walks), and so does every call of a ``@triton.jit`` helper *inside* the
kernel (``InterpretedFunction.__call__``), once per program instance and call site. The helper's patch changes
nothing the launch has not already patched when the helper's module sees the same ``triton.language`` modules
(``_patch_lang`` patches exactly those modules found in the function's globals), or modules an earlier helper
of the same launch patched (Triton never undoes a helper's patch; ``tl.sum`` and the other
``triton.language.standard`` helpers see ``tl.core`` too); it was about a third of the
kernel tests' time (cProfile of ``tests/kernels/test_graph_backend.py``: 282,481 ``_patch_builtin`` calls,
60 s of 178 s). :func:`install` skips the helper's patch in that case and only then; results are unchanged
(the same patched functions run). On a Triton whose interpreter lacks these names it does nothing.

It also turns off the interpreter's integer-overflow check, which a compiled kernel runs only in debug mode:
every ``+``, ``-`` and ``*`` on int32 was recomputed in int64 and compared (about 40 % of a kernel test's time,
cProfile of ``test_slots_bit_identical_to_alone``); the small shapes these tests run cannot come near 2**31.
``REPRO_TEST_SANITIZE_OVERFLOW=1`` keeps it on.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import threading


_LANGS: dict[int, frozenset[int]] = {}


def _langs(fn, tl) -> frozenset[int]:
    """Ids of the ``triton.language`` modules ``_patch_lang`` would patch for ``fn`` (its globals' tl / tl.core;
    a module's globals name the same modules for the whole run, so it is read once per function)."""
    got = _LANGS.get(id(fn))
    if got is None:
        got = _LANGS[id(fn)] = frozenset(id(v) for v in fn.__globals__.values()
                                         if inspect.ismodule(v) and v in (tl, tl.core))
    return got


def install() -> bool:
    """Install the skip when the interpreter is on; returns whether it is installed."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return False
    try:
        import triton.language as tl
        from triton.runtime import interpreter as interp
    except Exception:  # noqa: BLE001 - no triton: nothing to speed up
        return False
    grid, helper = getattr(interp, "GridExecutor", None), getattr(interp, "InterpretedFunction", None)
    if grid is None or helper is None or not hasattr(interp, "_patch_lang") or getattr(helper, "_repro_skip", False):
        return bool(helper is not None and getattr(helper, "_repro_skip", False))
    state = threading.local()
    launch, call = grid.__call__, helper.__call__

    def launch_once(self, *args, **kwargs):
        outer = getattr(state, "patched", None)
        state.patched = _langs(self.fn, tl)
        try:
            return launch(self, *args, **kwargs)
        finally:
            state.patched = outer

    def call_patched(self, *args, **kwargs):
        patched, langs = getattr(state, "patched", None), _langs(self.fn, tl)
        if patched is None or not langs <= patched:
            if patched is not None:  # its patch (never undone by Triton) now holds for the rest of the launch
                state.patched = patched | langs
            return call(self, *args, **kwargs)
        fn = self.rewrite()  # the rest of InterpretedFunction.__call__, without its _patch_lang
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise interp.InterpreterError(repr(e)) from e

    grid.__call__, helper.__call__ = launch_once, call_patched
    helper._repro_skip = True
    builder = getattr(interp, "interpreter_builder", None)
    opts = getattr(builder, "options", None)
    if os.environ.get("REPRO_TEST_SANITIZE_OVERFLOW") != "1" and getattr(opts, "sanitize_overflow", False):
        builder.options = dataclasses.replace(opts, sanitize_overflow=False)
    return True
