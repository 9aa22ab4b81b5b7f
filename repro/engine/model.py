"""LLaDA2 MoE forward pass with a prefix KV cache — wires the layer functions, nothing else.

Architecture (docs/engine.md §2): ``h = E[ids]`` (no scaling); per layer (pre-norm)
``h += Attn(RMSNorm(h))``, ``h += MLP_or_MoE(RMSNorm(h))``; ``logits = lm_head(RMSNorm(h))`` cast to fp32.
Layer ``l < first_k_dense_replace`` uses the dense SwiGLU MLP; the others the MoE block: sigmoid
group-limited router (fp32) + routed experts (:func:`repro.engine.layers.moe.moe_forward`, the Triton seam)
+ one always-on shared expert. Attention: fused QKV (rows Q, then K, then V), per-head RMSNorm on Q and K
before partial NeoX RoPE, GQA, block-causal mask (:func:`repro.engine.layers.attention.attention_forward`,
the other Triton seam). Logits at position i predict the token at position i (no shift, §2 item 4).

Weights live in one flat dict ``model.params`` in the layout of :mod:`repro.engine.weights`; the model is
built empty (:meth:`LLaDA2Model.empty`), then filled from a checkpoint (:meth:`LLaDA2Model.from_pretrained`)
or with deterministic random values (:meth:`LLaDA2Model.random`, for full-size GPU benchmarks without a
checkpoint).

Not here: decoding (``repro.engine.decode_loop`` / ``decoders``), the no-cache oracle (``repro.engine.reference``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from repro.engine.cache import KVCache
from repro.engine.config import LLaDA2Config
from repro.engine.layers.attention import attention_forward
from repro.engine.layers.linear import linear
from repro.engine.layers.mlp import swiglu
from repro.engine.layers.moe import moe_forward, route
from repro.engine.layers.norm import rms_norm
from repro.engine.layers.rotary import apply_rope, rope_cos_sin
from repro.engine.weights import FP32_PARAMS, load_weights, param_specs

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "float32": torch.float32,
          "bfloat16": torch.bfloat16, torch.float32: torch.float32, torch.bfloat16: torch.bfloat16}


#: Precision modes (names of the LLaDA2.1-mini-ORL-NVFP4 model card): ``fp32`` / ``bf16`` (an NVFP4 checkpoint
#: is dequantized once at load), ``nvfp4-w4a16`` (weights-only 4-bit: routed experts stay packed in NVFP4 and
#: on a GPU the MoE kernels dequantize them in registers to the same values; on the CPU each expert is
#: dequantized per forward in torch; activations bf16 on a GPU, fp32 on the CPU), ``nvfp4`` (native FP4 tensor-core GEMMs: refused, see :data:`NVFP4_NATIVE`).
PRECISIONS = ("fp32", "bf16", "nvfp4-w4a16", "nvfp4")

#: Why ``precision="nvfp4"`` is refused, rather than silently run in another mode whose numbers differ.
NVFP4_NATIVE = ("precision 'nvfp4' means FP4 weights and FP4 activations on FP4 tensor cores (NVIDIA Blackwell, "
                "compute capability 10.x), which this engine does not implement; use 'nvfp4-w4a16' (the "
                "checkpoint's 4-bit experts kept packed and dequantized inside the MoE kernels on a GPU: the exact values "
                "of the dequantized checkpoint, fp32 accumulation, ~3x fewer bytes per round) or 'bf16' (the "
                "experts dequantized once at load)")


def resolve_dtype(dtype) -> torch.dtype:
    """``"fp32" | "bf16"`` (or the torch dtype) → torch dtype. Raises ValueError otherwise."""
    if dtype not in DTYPES:
        raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {dtype!r}")
    return DTYPES[dtype]


@dataclass
class Chunk:
    """One request's rows in a :meth:`LLaDA2Model.forward_chunks` call: positions ``start .. start+n-1``
    (``start`` a multiple of ``block_size``) of the request whose prefix K/V live in ``cache``; ``ids``
    ``[n]`` int64 or ``embeds`` ``[n, D]`` model dtype (wins when given); ``logits``: return its logits."""

    start: int
    cache: KVCache
    block_size: int
    ids: torch.Tensor | None = None
    embeds: torch.Tensor | None = None
    logits: bool = True


def resolve_precision(precision, device="cpu") -> tuple[torch.dtype, bool]:
    """``precision`` (a :data:`PRECISIONS` name or a torch dtype) → (model dtype, routed experts kept packed).

    Raises ValueError for ``"nvfp4"`` (:data:`NVFP4_NATIVE`) or an unknown name."""
    if precision == "nvfp4":
        raise ValueError(NVFP4_NATIVE)
    if precision == "nvfp4-w4a16":
        return (torch.bfloat16 if str(device).startswith("cuda") else torch.float32), True
    return resolve_dtype(precision), False


class LLaDA2Model:
    """The LLaDA2 MoE network over a flat parameter dict (see :mod:`repro.engine.weights` for the layout).

    Attributes: ``cfg`` (:class:`LLaDA2Config`), ``params`` (name → tensor), ``dtype`` (model dtype; router
    and expert bias are fp32), ``device``, ``with_adapter`` (whether the ORL adapter weights are loaded).
    """

    def __init__(self, cfg: LLaDA2Config, params: dict[str, torch.Tensor], dtype: torch.dtype,
                 device: torch.device, with_adapter: bool):
        self.cfg, self.params, self.dtype, self.device = cfg, params, dtype, torch.device(device)
        self.with_adapter = with_adapter

    # ---------------------------------------------------------------- construction
    @classmethod
    def empty(cls, cfg: LLaDA2Config, device="cpu", dtype="fp32", with_adapter: bool = True) -> "LLaDA2Model":
        """Allocate uninitialised parameters (``torch.empty``) on ``device``; router/expert bias in fp32.

        ``dtype``: a :data:`PRECISIONS` name; ``"nvfp4-w4a16"`` allocates each MoE layer's ``moe.w_gate_up`` /
        ``moe.w_down`` as :class:`~repro.checkpoint.nvfp4.NVFP4Experts` (zeros) instead of dense tensors."""
        dt, packed = resolve_precision(dtype, device)
        params = {}
        for n, s in param_specs(cfg, with_adapter).items():
            if packed and n.endswith((".moe.w_gate_up", ".moe.w_down")):
                from repro.checkpoint.nvfp4 import NVFP4Experts

                params[n] = NVFP4Experts(*s, 2 if n.endswith("w_gate_up") else 1, dt, device)
            else:
                params[n] = torch.empty(s, dtype=torch.float32 if FP32_PARAMS.match(n) else dt, device=device)
        m = cls(cfg, params, dt, torch.device(device), with_adapter and cfg.adapter is not None)
        m.precision = dtype if isinstance(dtype, str) else {torch.float32: "fp32", torch.bfloat16: "bf16"}[dt]
        return m

    @classmethod
    def from_pretrained(cls, path: str | Path, device="cpu", dtype="fp32", with_adapter: bool = True,
                        cfg: LLaDA2Config | None = None, adapter_map: str | Path | None = None) -> "LLaDA2Model":
        """Load a Hugging Face LLaDA2 checkpoint directory (config.json + safetensors, single or sharded).

        ``with_adapter=False`` (base role) leaves the ORL adapter unloaded (its tensors are still checked).
        ``adapter_map``: adapter mapping file naming the checkpoint's adapter tensors (docs/adapter_map.md;
        default: ``adapter_map.json`` next to config.json when present). Raises ConfigError /
        WeightLoadError with the offending names (unknown tensors: listed, flagged when they look like an
        adapter, with the mapping file to write).
        """
        cfg = cfg or LLaDA2Config.from_file(path, adapter_map)
        model = cls.empty(cfg, device, dtype, with_adapter)
        load_weights(path, cfg, model.params, with_adapter=model.with_adapter)
        return model

    @classmethod
    def random(cls, cfg: LLaDA2Config, device="cpu", dtype="bf16", seed: int = 0,
               with_adapter: bool = True) -> "LLaDA2Model":
        """Deterministic random weights from ``cfg`` alone (full-size benchmarks need no checkpoint).

        Each tensor is drawn from its own ``torch.Generator`` on ``device`` seeded with ``seed`` + its index
        in sorted-name order: norms ``1 + N(0, 0.1²)``, expert bias ``N(0, 0.1²)``, embeddings ``N(0, 1)``,
        matrices ``N(0, 1/fan_in)`` (lm_head ×6 for non-degenerate confidences). Values are reproducible
        per device type, not across CPU/CUDA.
        """
        if resolve_precision(dtype, device)[1]:
            raise ValueError("LLaDA2Model.random builds dense weights; for random 4-bit experts see "
                             "repro.engine.kernels.moe_w4.random_nvfp4_experts")
        model = cls.empty(cfg, device, dtype, with_adapter)
        for i, name in enumerate(sorted(model.params)):
            t = model.params[name]
            g = torch.Generator(device=t.device).manual_seed(int(seed) * 1_000_003 + i)
            buf = torch.empty(t.shape, dtype=torch.float32, device=t.device)
            if name.endswith(("norm", "_norm")):
                buf.normal_(1.0, 0.1, generator=g)
            elif name.endswith("expert_bias"):
                buf.normal_(0.0, 0.1, generator=g)
            elif name == "embed":
                buf.normal_(0.0, 1.0, generator=g)
            else:
                buf.normal_(0.0, (6.0 if name == "lm_head" else 1.0) / t.shape[-1] ** 0.5, generator=g)
            t.copy_(buf)
            del buf
        return model

    # ---------------------------------------------------------------- pieces used by decoders
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Input embeddings ``E[ids]``: ids ``[n]`` int64 → ``[n, D]`` model dtype (no scaling, docs/engine.md §2)."""
        return self.params["embed"][ids]

    def new_cache(self, capacity: int) -> KVCache:
        """A zeroed :class:`KVCache` for ``capacity`` positions (allocate once per request)."""
        c = self.cfg
        return KVCache(c.num_hidden_layers, capacity, c.num_key_value_heads, c.head_dim, self.dtype, self.device)

    # ---------------------------------------------------------------- forward
    def forward(self, ids: torch.Tensor, start: int, cache: KVCache, block_size: int,
                embeds: torch.Tensor | None = None, logits: bool = True) -> torch.Tensor | None:
        """Run positions ``start .. start+n-1`` against the cached prefix ``0 .. start-1``.

        ids: ``[n]`` int64 (used when ``embeds`` is None); embeds: optional ``[n, D]`` model-dtype input
        embeddings (self-conditioning); ``start`` must be a multiple of ``block_size`` and the chunk whole
        blocks or the final partial one. Writes this chunk's K/V into ``cache`` at its positions. Returns
        logits ``[n, V]`` fp32, or None when ``logits=False`` (prefill/commit skip the lm_head).
        Raises ValueError for a misaligned start. One-chunk case of :meth:`forward_chunks`.
        """
        return self.forward_chunks([Chunk(start, cache, block_size, ids, embeds, logits)])[0]

    def forward_chunks(self, chunks: list["Chunk"]) -> list[torch.Tensor | None]:
        """One forward over several chunks (each one request's block(s) against its own KV cache), as
        :meth:`forward` does for each alone: token-wise layers run over all rows stacked, attention per chunk
        over its own cache. Row-invariant (:mod:`repro.engine.layers.linear`; norms, RoPE and routing are
        per row), so each chunk's logits and K/V are bit-identical to running it alone on the torch path.
        Returns per chunk logits ``[n_i, V]`` fp32 or None (``logits=False``). Raises ValueError for a
        misaligned start."""
        c, p = self.cfg, self.params
        for ch in chunks:
            if ch.start % ch.block_size:
                raise ValueError(f"forward start {ch.start} is not a multiple of block_size {ch.block_size}")
        hs = [ch.embeds if ch.embeds is not None else self.embed(ch.ids) for ch in chunks]
        sizes = [x.shape[0] for x in hs]
        h = hs[0] if len(hs) == 1 else torch.cat(hs)
        n = h.shape[0]
        (H, K), hd = self._local_heads(), c.head_dim
        pos = torch.cat([torch.arange(ch.start, ch.start + m, device=h.device) for ch, m in zip(chunks, sizes)])
        cos, sin = rope_cos_sin(pos, c.rotary_dim, c.rope_theta, h.dtype)
        bounds = [0]
        for m in sizes:
            bounds.append(bounds[-1] + m)
        for l in range(c.num_hidden_layers):
            q_ = f"layers.{l}."
            a = rms_norm(h, p[q_ + "attn_norm"], c.rms_norm_eps)
            qkv = linear(a, p[q_ + "wqkv"]).view(n, H + 2 * K, hd)
            q, k, v = qkv[:, :H], qkv[:, H:H + K], qkv[:, H + K:]
            q = apply_rope(rms_norm(q, p[q_ + "q_norm"], c.rms_norm_eps), cos, sin)
            k = apply_rope(rms_norm(k, p[q_ + "k_norm"], c.rms_norm_eps), cos, sin)
            outs = []
            for i, ch in enumerate(chunks):
                r0, r1 = bounds[i], bounds[i + 1]
                ch.cache.write(l, ch.start, k[r0:r1], v[r0:r1])
                kk, vv = ch.cache.view(l, ch.start + r1 - r0)
                outs.append(attention_forward(q[r0:r1], kk, vv, ch.start, ch.block_size))
            o = outs[0] if len(outs) == 1 else torch.cat(outs)
            h = h + self._combine(linear(o.reshape(n, H * hd), p[q_ + "wo"]), h.dtype)
            m = rms_norm(h, p[q_ + "mlp_norm"], c.rms_norm_eps)
            h = h + self._combine(self._dense(l, m) if l < c.first_k_dense_replace else self._moe(l, m), h.dtype)
        want = [i for i, ch in enumerate(chunks) if ch.logits]
        result: list[torch.Tensor | None] = [None] * len(chunks)
        if not want:
            return result
        rows = h if len(want) == len(chunks) else torch.cat([h[bounds[i]:bounds[i + 1]] for i in want])
        lg = linear(rms_norm(rows, p["final_norm"], c.rms_norm_eps), p["lm_head"]).float()
        at = 0
        for i in want:
            result[i] = lg[at:at + sizes[i]]
            at += sizes[i]
        return result

    def _local_heads(self) -> tuple[int, int]:
        """(query heads, KV heads) this model computes: all of them here; a rank's share in
        :class:`repro.engine.parallel.ShardedModel`."""
        return self.cfg.num_attention_heads, self.cfg.num_key_value_heads

    def _combine(self, partial: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """A layer's attention or MLP output ``[n, D]`` before the residual add: unchanged here (one device holds
        the whole sum); the sum over ranks, cast to ``dtype``, in :class:`repro.engine.parallel.ShardedModel`."""
        return partial

    def _dense(self, l: int, x: torch.Tensor) -> torch.Tensor:
        return swiglu(x, self.params[f"layers.{l}.mlp.w_gate_up"], self.params[f"layers.{l}.mlp.w_down"])

    def _moe(self, l: int, x: torch.Tensor) -> torch.Tensor:
        """MoE block (docs/engine.md §2): routed experts (seam) + shared expert; returns ``[n, D]`` model dtype."""
        c, p, q = self.cfg, self.params, f"layers.{l}.moe."
        w, ids = route(x, p[q + "router"], p.get(q + "expert_bias"), c.num_experts_per_tok, c.n_group,
                       c.topk_group, c.routed_scaling_factor, c.norm_topk_prob)
        out = moe_forward(x, p[q + "w_gate_up"], p[q + "w_down"], w, ids)
        if q + "shared_gate_up" in p:
            out = out + swiglu(x, p[q + "shared_gate_up"], p[q + "shared_down"])
        return out
