"""Layer functions of the LLaDA2 forward pass, one concept per module: ``norm`` (RMSNorm), ``rotary``
(partial NeoX RoPE), ``mlp`` (SwiGLU), ``attention`` (block-causal attention over a KV prefix — a dispatch
seam), ``moe`` (sigmoid group-limited router + routed experts — a dispatch seam).

Each function works on plain tensors (no ``nn.Module`` state), so a Triton kernel can replace the PyTorch
implementation behind the same signature (see ``attention.set_attention_impl`` and ``moe.set_moe_impl``).
"""
