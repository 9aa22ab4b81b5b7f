"""The embedded-engine backend: ``repro.engine.LLM`` on CPU (fp32) or GPU (bf16).

Stop strings are not applied here (raw completions are kept; the scorer cuts at stop strings), so a
scorer fix never needs regeneration.

``batch_size`` > 1 decodes the prompts together through the batched engine (:mod:`repro.engine.batch`;
greedy token ids are identical at every batch size of the batched engine, and to one at a time on the CPU; on a GPU
batch 1 runs the CUDA-graph path, which can differ from the batched eager path at near-ties — the record's
``engine_path`` says which ran): :meth:`EngineBackend.generate_each` hands each record
over as soon as its request finishes (finishing order), so the job's partial file grows as before and a
resumed job redoes only unfinished problems. A record's ``wall_s`` is then the request's latency inside
the batch (``batch_size`` is in the record).
"""

from __future__ import annotations

import platform
import time
from typing import Iterable, Iterator


class EngineBackend:
    """Generation with ``repro.engine.LLM``; one record per prompt (``repro.backends.base``)."""

    name = "engine"

    def __init__(self, model_dir: str, role: str, device: str = "cpu", precision: str = "fp32",
                 adapter_map: str | None = None, batch_size: int = 1, tensor_parallel_size: int = 1):
        from repro.engine import LLM

        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer ≥ 1, got {batch_size!r}")
        self.device, self.precision, self.batch_size = device, precision, batch_size
        self.batch_stats = None
        t0 = time.perf_counter()
        self.tensor_parallel_size = tensor_parallel_size
        self.llm = LLM(str(model_dir), role=role, precision=precision, device=device, adapter_map=adapter_map,
                       tensor_parallel_size=tensor_parallel_size)
        self.load_s = time.perf_counter() - t0  # fixed cost per job (speed table)

    @property
    def graph_capture_s(self) -> float | None:
        """Seconds the loaded model has spent capturing CUDA graphs since it was loaded, single-request and
        batched engines together, rebuilt engines included: a cumulative counter
        (:attr:`repro.engine.llm.LLM.graph_capture_s`), so a job serving several benchmarks takes differences of
        it. None on a path without graphs (CPU, eager), while a batched call runs, and after :meth:`close`."""
        return self.llm.graph_capture_s if self.llm is not None else None

    def generate(self, prompts: Iterable, decoder: dict) -> Iterator[dict]:
        for p in prompts:
            prompt_text = self.llm.apply_chat_template(p.messages)
            out = self.llm.generate(prompt_text, decoder=decoder, max_new_tokens=decoder.get("max_new_tokens"),
                                    seed=decoder.get("seed"))
            yield self._record(out)

    def generate_each(self, prompts: list, decoder: dict, emit) -> None:
        """Generate every prompt, calling ``emit(index, record)`` as each finishes (finishing order when
        batched, input order at batch 1)."""
        if self.batch_size == 1:
            for i, rec in enumerate(self.generate(prompts, decoder)):
                emit(i, rec)
            return
        from repro.engine.batch import BatchStats

        self.batch_stats = BatchStats()
        texts = [self.llm.apply_chat_template(p.messages) for p in prompts]
        self.llm.generate_batch(texts, decoder=decoder, max_new_tokens=decoder.get("max_new_tokens"),
                                seed=decoder.get("seed"), batch_size=self.batch_size,
                                on_result=lambda i, out: emit(i, self._record(out)), stats=self.batch_stats)

    def _record(self, out) -> dict:
        """The backend's part of a generation record for one :class:`repro.engine.llm.GenerateOutput`."""
        rec = {
            "prompt_text": out.prompt_text,
            "completion": out.text,
            "prompt_tokens": out.prompt_tokens,
            "generated_tokens": out.generated_tokens,
            "forwards": dict(out.forwards),
            "tpf": out.tpf,
            "wall_s": out.wall_s,
            "tokens_per_s": out.request_tps,
            "finish_reason": out.finish_reason,
            "device": self.device,
            "batch_size": self.batch_size,
        }
        if out.note:  # a block stopped at the decoder's forward cap (repro.engine.decode_loop)
            rec["forwards_note"] = out.note
        return rec

    def close(self) -> None:
        """Drop the loaded model (GPU memory is freed with it; a tensor-parallel model's ranks are stopped)."""
        if self.llm is not None:
            self.llm.close()
        self.llm = None

    def describe(self) -> dict:
        import torch

        if self.device.startswith("cuda") and torch.cuda.is_available():
            dev = f"cuda ({torch.cuda.get_device_name(0)})"
        else:
            n = torch.get_num_threads()
            dev = f"cpu ({platform.machine()}, {n} thread{'' if n == 1 else 's'})"
        if self.tensor_parallel_size > 1:  # named in the speed table's caption with the device
            dev += f" x {self.tensor_parallel_size} ranks (tensor parallel)"
        st = self.batch_stats
        if self.batch_size == 1:
            path = self.llm.engine_path
        elif st is not None and st.rounds:  # what ran: the batched CUDA-graph path or the eager batched engine
            path = "batched-cuda-graph" if st.engine == "cuda-graph" else "batched-eager"
        else:
            path = "batched-cuda-graph" if self.llm.engine_path == "cuda-graph" else "batched-eager"
        from repro.engine.kernels.configs import tiles_report

        return {"backend": "engine", "device": dev, "precision": self.precision, "torch": torch.__version__,
                "engine_path": path, "tiles": tiles_report()["summary"] if dev.startswith("cuda") else None,
                "kernels": self.llm.kernels, "adapter": self.llm.adapter_note, "batch_size": self.batch_size,
                "tensor_parallel_size": self.tensor_parallel_size, "load_s": self.load_s, "graph_capture_s": self.graph_capture_s,
                **({"batch": {"rounds": st.rounds, "wall_s": st.wall_s, "max_active": st.max_active,
                              "mean_round_s": sum(st.round_s) / len(st.round_s), "capture_s": st.capture_s}}
                   if st is not None and st.rounds else {})}
