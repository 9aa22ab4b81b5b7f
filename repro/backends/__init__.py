"""Generation backends behind one small interface (``base.GenerationBackend``): ``engine`` (ours) and ``sglang``.

``get_backend(name, **kwargs)`` imports the chosen module lazily, so SGLang is imported only when used.
"""

from __future__ import annotations


def get_backend(name: str, **kwargs):
    """Build the backend ``name`` (``engine`` | ``sglang``); ValueError names the allowed values."""
    if name == "engine":
        from repro.backends.engine import EngineBackend

        return EngineBackend(**kwargs)
    if name == "sglang":
        from repro.backends.sglang import SGLangBackend

        return SGLangBackend(**kwargs)
    raise ValueError(f"unknown backend {name!r}; allowed: engine, sglang")
