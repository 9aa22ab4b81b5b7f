"""Triton kernels of the embedded engine, each beside its plain PyTorch reference.

* ``moe``: fused MoE for small token counts (routing + alignment + grouped SwiGLU GEMMs), references.
* ``attention``: QK-norm + partial RoPE + in-place KV write; split-KV block attention over the cache.
* ``norm``: residual add + RMSNorm (with the MoE top-k sum fused in).
* ``fastpath``: graph-capturable block forward built from them (+ the reference forward).
* ``tune``: the small tuner writing ``configs/*.json``.

Kernels need triton (``_triton.HAS_TRITON``); the references need only torch.
"""
