"""RMSNorm as LLaDA2 computes it (docs/engine.md §2, HF ``LLaDA2MoeRMSNorm``)."""

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``y = (x · rsqrt(mean(x², -1) + eps)).to(x.dtype) · weight``.

    x: ``[..., d]`` any float dtype; weight: ``[d]`` (model dtype). The normalisation runs in fp32 and is
    cast back to ``x.dtype`` before the weight multiply (docs/engine.md §2 "RMSNorm"). Used for the
    input/post/final norms (d = hidden) and per-head QK-norm (d = head_dim). Returns ``x``'s shape/dtype.
    """
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return y.to(x.dtype) * weight
