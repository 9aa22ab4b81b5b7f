"""Embedded block-diffusion engine for LLaDA2 MoE models (LLaDA2.1-mini, -ORL), PyTorch on CPU or CUDA.

Public API (docs/interfaces.md "Engine API"): ``from repro.engine import LLM``. Modules, one concept each:
``config`` (config.json dataclass), ``weights`` (layout + rename table + loader), ``layers/`` (norm, rotary,
mlp, attention seam, MoE seam), ``cache`` (preallocated KV), ``model`` (cached forward), ``adapter`` (ORL
residual), ``decoders/`` (one per algorithm), ``request`` (one request's block-diffusion program + forward
counts), ``loop`` (the one engine loop every request goes through), ``batch`` / ``batch_graph`` /
``decode_loop`` (its executors: eager batched forward, batched CUDA graph, one backend such as the
single-request graph path), ``ranks`` (tensor parallelism in step), ``reference`` (naive no-cache oracle),
``tokenizer`` (tokenizer + chat template), ``llm`` (the API), ``serve/`` (HTTP server), ``suite`` (bench suite).
"""

__all__ = ["LLM", "GenerateOutput"]


def __getattr__(name):  # lazy, so `python -m repro.checkpoint.tiny` etc. do not import the engine
    if name in __all__:
        from repro.engine import llm
        return getattr(llm, name)
    raise AttributeError(name)
