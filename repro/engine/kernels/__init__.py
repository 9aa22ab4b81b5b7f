"""Triton kernels of the embedded engine, each beside its plain PyTorch reference.

* ``route``: MoE router + group-limited top-k + token-expert alignment (and the MoE workspace), reference.
* ``moe``: grouped SwiGLU expert GEMMs (routed + shared expert) and the top-k sum, references.
* ``logits``: decode statistics of the block's logits (argmax, max probability, entropy), reference.
* ``attention``: QK-norm + partial RoPE + in-place KV write; split-KV block attention over the cache.
* ``norm``: residual add + RMSNorm (with the MoE top-k sum fused in).
* ``fastpath``: graph-capturable block forward built from them (+ the reference forward).
* ``fastpath_batch``: the same over S request slots in one graph, each slot bit-identical to it alone.
* ``tune``: the small tuner writing ``configs/*.json``.

Kernels need triton (``_triton.HAS_TRITON``); the references need only torch.
"""


def register_with_seams(select: bool = True) -> None:
    """Register (and select) the Triton MoE and attention implementations in the engine model's seams
    (``repro.engine.layers.moe`` / ``repro.engine.layers.attention``, impl name "triton"). Each falls back
    to the seam's torch implementation outside its fast case (large token counts, multi-block prefill, CPU).
    """
    from . import attention, moe

    moe.register_with_seam(select)
    attention.register_with_seam(select)
