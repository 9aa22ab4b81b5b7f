"""The embedded-engine backend: ``repro.engine.LLM`` on CPU (fp32) or GPU (bf16).

Stop strings are not applied here (raw completions are kept; the scorer cuts at stop strings), so a
scorer fix never needs regeneration.
"""

from __future__ import annotations

import platform
from typing import Iterable, Iterator


class EngineBackend:
    """Generation with ``repro.engine.LLM``; one record per prompt (``repro.backends.base``)."""

    name = "engine"

    def __init__(self, model_dir: str, role: str, device: str = "cpu", precision: str = "fp32",
                 adapter_map: str | None = None):
        from repro.engine import LLM

        self.device, self.precision = device, precision
        self.llm = LLM(str(model_dir), role=role, precision=precision, device=device, adapter_map=adapter_map)

    def generate(self, prompts: Iterable, decoder: dict) -> Iterator[dict]:
        for p in prompts:
            prompt_text = self.llm.apply_chat_template(p.messages)
            out = self.llm.generate(prompt_text, decoder=decoder, max_new_tokens=decoder.get("max_new_tokens"),
                                    seed=decoder.get("seed"))
            rec = {
                "prompt_text": prompt_text,
                "completion": out.text,
                "prompt_tokens": out.prompt_tokens,
                "generated_tokens": out.generated_tokens,
                "forwards": dict(out.forwards),
                "tpf": out.tpf,
                "wall_s": out.wall_s,
                "tokens_per_s": out.request_tps,
                "finish_reason": out.finish_reason,
                "device": self.device,
            }
            if out.note:  # a block stopped at the decoder's forward cap (repro.engine.decode_loop)
                rec["forwards_note"] = out.note
            yield rec

    def close(self) -> None:
        """Drop the loaded model (GPU memory is freed with it)."""
        self.llm = None

    def describe(self) -> dict:
        import torch

        if self.device.startswith("cuda") and torch.cuda.is_available():
            dev = f"cuda ({torch.cuda.get_device_name(0)})"
        else:
            dev = f"cpu ({platform.machine()}, {torch.get_num_threads()} threads)"
        return {"backend": "engine", "device": dev, "precision": self.precision, "torch": torch.__version__,
                "engine_path": self.llm.engine_path, "kernels": self.llm.kernels, "adapter": self.llm.adapter_note}
