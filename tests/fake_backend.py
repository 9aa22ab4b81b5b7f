"""A stand-in generation backend for the generation driver's tests (repro.backends.generation_job), so a test is
about the driver (resume, writes, provenance), not a model.

``FakeBackend.generate`` yields one fixed record per prompt (completion = the first 20 characters of the last
message); with ``die_after=k`` it raises :class:`Killed` before the (k+1)-th prompt, as a killed job stops.
``describe()`` is ``{"backend": "fake"}`` (tests compare the meta's ``backend_info`` to it); ``close()`` sets
``closed``. Import it as ``from fake_backend import FakeBackend`` (tests/ is on sys.path, as for ``eval_data``).
"""

from __future__ import annotations


class Killed(Exception):
    """Raised by :class:`FakeBackend` once ``die_after`` prompts were generated."""


class FakeBackend:
    """Deterministic stand-in for a model: completion = the question's start; can 'die' after k problems."""

    name = "engine"

    def __init__(self, die_after: int | None = None):
        self.die_after, self.calls, self.closed = die_after, 0, False

    def generate(self, prompts, decoder):
        for p in prompts:
            if self.die_after is not None and self.calls >= self.die_after:
                raise Killed()
            self.calls += 1
            text = p.messages[-1]["content"][:20]
            yield {"prompt_text": text, "completion": text, "prompt_tokens": 5, "generated_tokens": 4,
                   "forwards": {"prefill": 1, "denoise": 1, "commit": 1}, "tpf": 2.0, "wall_s": 0.01,
                   "tokens_per_s": 400.0, "finish_reason": "eos", "device": "cpu"}

    def describe(self) -> dict:
        return {"backend": "fake"}

    def close(self) -> None:
        self.closed = True
