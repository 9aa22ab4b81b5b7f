"""The backend interface: turn chat prompts into completions with forward counts.

A backend is built once per job (it loads the model) and then asked for completions::

    backend = get_backend("engine", model_dir=..., role="orl", device="cpu", precision="fp32")
    for rec in backend.generate(prompts, decoder):   # one dict per prompt, in order
        ...

Each yielded dict has the generation-record fields that depend on the backend (``docs/interfaces.md``):
``prompt_text``, ``completion``, ``prompt_tokens``, ``generated_tokens``, ``forwards`` (dict or None),
``tpf`` (float or None), ``wall_s``, ``tokens_per_s``, ``finish_reason``, ``device``, and optionally
``forwards_note``. The driver (``repro.backends.generation_job``) adds ``id``, ``benchmark``, ``model``,
``seed``, ``backend`` and writes the records.
"""

from __future__ import annotations

from typing import Iterable, Iterator, Protocol


class GenerationBackend(Protocol):
    """What every backend provides (see module docstring)."""

    name: str

    def generate(self, prompts: Iterable, decoder: dict) -> Iterator[dict]:
        """Yield one record dict per prompt (objects with ``messages`` and ``stop``), in order."""
        ...

    def describe(self) -> dict:
        """Provenance of the backend: versions, device name, precision, and what ``generate`` set up (an
        engine started lazily is described fully only after ``generate`` has run)."""
        ...

    def close(self) -> None:
        """Release the model / engine (the job calls it when done, also on error)."""
        ...
