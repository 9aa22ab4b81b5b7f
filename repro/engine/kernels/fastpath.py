"""Graph-capturable forward of one diffusion block (T=32 tokens) for LLaDA2.1-mini, built from the kernels.

This is the benchmark's engine path and the engine's GPU path (``repro/engine/graph.py``): it takes a plain
weights structure in the kernel layout (:data:`repro.engine.weights.KERNEL_LAYER_NAMES`: random weights from
:func:`random_weights` here, or the loaded model's own tensors through ``graph.kernel_weights``) and the
kernel shape :class:`ModelShape` derived from the model's :class:`~repro.engine.config.LLaDA2Config`,
keeps every buffer static (ids, cache length, KV
cache, activations, MoE/attention workspaces) and runs, per layer (docs/engine.md §2):

  add+RMSNorm (Triton; fuses the previous MoE top-k sum + shared expert + residual) -> QKV GEMM (cuBLAS)
  -> QK-norm + RoPE + KV write (Triton) -> split-KV attention + combine (Triton; with ``fused_attn`` these three
  are one launch) -> O GEMM (cuBLAS)
  -> add+RMSNorm (Triton) -> router GEMM + route/align (Triton; two launches, or one with ``fused_route``)
  -> gate+up and down grouped GEMMs (Triton)

then the final norm, the lm_head over the T block positions only (cuBLAS, bf16 logits [T, V]) and the
decode statistics in fp32 on device (argmax, max probability, entropy). The layer-0 dense FFN runs
through the same grouped-GEMM kernels as one "expert" that all tokens select with weight 1.

The cache length is a device int32 tensor, so :meth:`BlockForward.capture` records one CUDA graph that is
valid for every prefix length P (P + T <= max_len). No host sync inside :meth:`forward`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from . import attention as A
from . import attention_fused as AF
from . import moe as M
from . import logits as Lg
from . import norm as Nm
from .configs import load_config

__all__ = ["ModelShape", "preset_shape", "random_weights", "BlockForward", "round_bytes", "reference_forward",
           "kernel_configs", "GraphCapture"]


#: Kernel shape field -> :class:`~repro.engine.config.LLaDA2Config` attribute (config.json names): the one
#: place the kernels' short names are defined.
SHAPE_FROM_CONFIG = {
    "vocab": "vocab_size", "hidden": "hidden_size", "layers": "num_hidden_layers", "nq": "num_attention_heads",
    "nkv": "num_key_value_heads", "head_dim": "head_dim", "dense_inter": "intermediate_size",
    "first_dense": "first_k_dense_replace", "moe_inter": "moe_intermediate_size", "experts": "num_experts",
    "top_k": "num_experts_per_tok", "n_group": "n_group", "topk_group": "topk_group",
    "scaling": "routed_scaling_factor", "rope_theta": "rope_theta", "rot_dim": "rotary_dim", "eps": "rms_norm_eps",
    "renormalize": "norm_topk_prob",
}


@dataclass(frozen=True)
class ModelShape:
    """The kernels' view of a model config: the fields of :data:`SHAPE_FROM_CONFIG` plus the ``<|mask|>`` id
    (a tokenizer fact, the initial block token). Build it with :meth:`from_config` or :func:`preset_shape`;
    there are no defaults, so no model's numbers can leak into another's shape."""

    vocab: int
    hidden: int
    layers: int
    nq: int
    nkv: int
    head_dim: int
    dense_inter: int
    first_dense: int
    moe_inter: int
    experts: int
    top_k: int
    n_group: int
    topk_group: int
    scaling: float
    rope_theta: float
    rot_dim: int
    eps: float
    renormalize: bool  # norm_topk_prob: top-k routing weights renormalised to sum 1 before the scaling
    mask_id: int

    @classmethod
    def from_config(cls, cfg, mask_id: int) -> "ModelShape":
        """Shape of ``cfg`` (a :class:`~repro.engine.config.LLaDA2Config`) with the tokenizer's mask id."""
        return cls(**{k: getattr(cfg, v) for k, v in SHAPE_FROM_CONFIG.items()}, mask_id=int(mask_id))

    @property
    def qkv_out(self) -> int:
        return (self.nq + 2 * self.nkv) * self.head_dim


def preset_shape(name: str = "llada2.1-mini", mask_id: int | None = None, **config_overrides) -> ModelShape:
    """Shape of a named preset of :mod:`repro.engine.presets`, with config.json fields overridden by name
    (``preset_shape(vocab_size=8192, num_hidden_layers=3)``); mask id default: the preset's own.
    Raises KeyError for an unknown preset and ConfigError for an invalid resulting config."""
    from repro.engine.config import LLaDA2Config
    from repro.engine.presets import PRESET_MASK_IDS, PRESETS

    cfg = LLaDA2Config.from_dict({**PRESETS[name], **config_overrides})
    return ModelShape.from_config(cfg, PRESET_MASK_IDS[name] if mask_id is None else mask_id)


def random_weights(shape: ModelShape, device, dtype=torch.bfloat16, seed: int = 0, std: float = 0.02):
    """Deterministic random weights in the kernel layout (bf16; router + expert bias fp32).

    Returns a dict with the names of :data:`repro.engine.weights.KERNEL_LAYER_NAMES`: embed [V,H], lm_head [V,H],
    final_norm [H], layers: list of dicts with attn_norm, mlp_norm [H], wqkv [(NQ+2NKV)·D, H], q_norm/k_norm
    [D], wo [H,H], and either (dense) w13 [1, 2·I, H], w2 [1, H, I] or (MoE) router [E,H] fp32, expert_bias
    [E] fp32, w13 [E+1, 2N, H], w2 [E+1, H, N] (index E = shared expert). Norm weights are 1 + 0.1·N(0,1)
    so that they are not trivially 1.
    """
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    H, D = shape.hidden, shape.head_dim

    def rn(*s, dt=dtype, scale=std):
        t = torch.empty(*s, dtype=dt, device=device)
        t.normal_(0.0, scale, generator=g)
        return t

    def nw(n):
        return (1.0 + rn(n, dt=torch.float32, scale=0.1)).to(dtype)

    W = {"embed": rn(shape.vocab, H, scale=1.0), "lm_head": rn(shape.vocab, H), "final_norm": nw(H), "layers": []}
    for layer in range(shape.layers):
        L = {"attn_norm": nw(H), "mlp_norm": nw(H), "wqkv": rn(shape.qkv_out, H), "q_norm": nw(D),
             "k_norm": nw(D), "wo": rn(H, H)}
        if layer < shape.first_dense:
            L["w13"] = rn(1, 2 * shape.dense_inter, H)
            L["w2"] = rn(1, H, shape.dense_inter)
        else:
            L["router"] = rn(shape.experts, H, dt=torch.float32)
            L["expert_bias"] = rn(shape.experts, dt=torch.float32, scale=0.01)
            L["w13"] = rn(shape.experts + 1, 2 * shape.moe_inter, H)
            L["w2"] = rn(shape.experts + 1, H, shape.moe_inter)
        W["layers"].append(L)
    return W


def round_bytes(shape: ModelShape, distinct: list[int], prefix: int, T: int = 32, wbytes: int = 2,
                expert_bytes: float | None = None) -> dict:
    """Bytes one round must read (each weight once, KV of [0, P+T) once); docs/perf.md "The two numbers".

    ``distinct``: touched routed experts per MoE layer (len = layers - first_dense). Router weights
    counted as stored (fp32). ``expert_bytes``: bytes per routed-expert weight (default ``wbytes``; NVFP4:
    0.5 + 1/16 for the E4M3 block scales, the per-tensor global scales are negligible). Returns a dict of
    byte counts by item and ``total``.
    """
    H, D = shape.hidden, shape.head_dim
    n_moe = shape.layers - shape.first_dense
    per_exp = 3 * shape.moe_inter * H * wbytes
    per_routed = 3 * shape.moe_inter * H * (wbytes if expert_bytes is None else expert_bytes)
    b = {
        "embed_rows": T * H * wbytes,
        "attention": shape.layers * (shape.qkv_out * H + H * H + 2 * D) * wbytes,
        "norms": (2 * shape.layers + 1) * H * wbytes,
        "dense_ffn": shape.first_dense * 3 * shape.dense_inter * H * wbytes,
        "router": n_moe * (shape.experts * H * 4 + shape.experts * 4),
        "shared_experts": n_moe * per_exp,
        "routed_experts": int(sum(distinct) * per_routed),
        "lm_head": shape.vocab * H * wbytes,
        "kv_cache": shape.layers * 2 * shape.nkv * D * wbytes * (prefix + T),
    }
    b["total"] = sum(b.values())
    return b


@dataclass
class _Stats:
    counts: list = field(default_factory=list)


def kernel_configs(W, shape: ModelShape, T: int, configs: dict | None = None) -> dict:
    """Launch configs of the block forward for ``T``-token blocks: ``{"attn", "attn_fused", "moe", "dense",
    "linear"}``.

    ``configs`` (optional) overrides per family: ``attn`` (keys merged into the tuned split-attention config),
    ``attn_fused`` (keys merged into the fused attention's: the tuned ``attn``/``fused`` entry, else
    :data:`.attention_fused.FUSED_DEFAULT`),
    ``moe`` (kernel name -> tiles; None here means "look the tuned files up by T at call time", or, when ``W``'s
    experts are packed, the moe file's tuned ``w4_gate_up`` / ``w4_down`` entries over the 4-bit kernels' own tiles
    :data:`~repro.engine.kernels.moe_w4.W4_TILES_DEFAULT`),
    ``dense`` (gate_up/down tiles of layer 0), ``linear`` (tiles of the Triton QKV/O GEMMs, merged). Without
    overrides the tuned JSON files of :mod:`repro.engine.kernels.configs` for this device and T, else defaults.
    """
    configs = configs or {}
    H, D = shape.hidden, shape.head_dim
    attn = load_config("attn", "split", dict(NSPLIT=32, BLOCK_N=64, num_warps=4, num_stages=3, MIN_KEYS=256),
                       NQ=shape.nq, NKV=shape.nkv, D=D, T=T)
    attn.update(configs.get("attn", {}))
    attn_fused = load_config("attn", "fused", AF.FUSED_DEFAULT, NQ=shape.nq, NKV=shape.nkv, D=D, T=T)
    attn_fused.update(configs.get("attn_fused", {}))
    moe = configs.get("moe")
    if moe is None and any(not isinstance(L["w13"], torch.Tensor) for L in W["layers"]):
        from .moe_w4 import W4_TILES_DEFAULT  # packed NVFP4 experts: the tuned 4-bit entries, else their own tiles

        key = dict(E=shape.experts + 1, N=shape.moe_inter, H=H, T=T)
        moe = {k: load_config("moe", "w4_" + k, W4_TILES_DEFAULT[k], **key) for k in ("gate_up", "down")}
    dense = configs.get("dense") or {
        "gate_up": load_config("dense", "gate_up", dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=128, num_warps=4,
                                                         num_stages=4), N=shape.dense_inter, H=H, T=T),
        "down": load_config("dense", "down", dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=256, num_warps=4,
                                                   num_stages=4), N=shape.dense_inter, H=H, T=T),
    }
    lin_default = dict(BLOCK_M=32, BLOCK_N=16, BLOCK_K=256, num_warps=4, num_stages=3)
    linear = {k: load_config("linear", k, lin_default, H=H, T=T) for k in ("qkv", "o")}
    linear.update(configs.get("linear", {}))
    return {"attn": attn, "attn_fused": attn_fused, "moe": moe, "dense": dense, "linear": linear}


class GraphCapture:
    """Warm-up and CUDA-graph capture of a static-buffer forward (``self.forward(head=...)``)."""

    def warmup(self, n: int = 2, head: bool = True):
        """Run ``forward`` ``n`` times on a side stream (compiles the kernels, settles the allocator)."""
        st = torch.cuda.Stream()
        st.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(st):
            for _ in range(n):
                self.forward(head=head)
        torch.cuda.current_stream().wait_stream(st)
        torch.cuda.synchronize()

    def capture(self, head: bool = True, extra=None, pool=None) -> torch.cuda.CUDAGraph:
        """Capture forward (+ ``extra()``, e.g. a decode step) into a CUDA graph and return it."""
        self.warmup(2, head)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool):
            self.forward(head=head)
            if extra is not None:
                extra()
        torch.cuda.synchronize()
        return g


class BlockForward(GraphCapture):
    """Static-buffer forward of a T-token block over a KV cache of ``max_len`` rows per layer.

    Inputs: ``self.ids`` [T] int64 (block tokens), ``self.cache_len`` [1] int32 (prefix length P); with
    ``from_embeds`` set, ``self.embeds_in`` [T, H] (model dtype) replaces ``E[ids]`` as the layer-0 input.
    Outputs after :meth:`forward` (or a graph replay): ``self.logits`` [T, V] bf16, ``self.pred`` [T]
    int64 argmax, ``self.conf`` [T] fp32 max probability, ``self.entropy`` [T] fp32 (nats);
    the block's K/V are in ``self.kv[l, 0/1, :, P:P+T]``.
    """

    def __init__(self, W, shape: ModelShape, max_len: int, T: int = 32, device="cuda",
                 configs: dict | None = None, attn_splits: int | None = None):
        self.W, self.s, self.T, self.max_len, self.device = W, shape, T, max_len, device
        dt = W["embed"].dtype
        H, D = shape.hidden, shape.head_dim
        self.dtype = dt
        self.configs = configs or {}
        self.ids = torch.full((T,), shape.mask_id, dtype=torch.long, device=device)
        # input embeddings [T, H] used instead of E[ids] when ``from_embeds`` is set (self-conditioning)
        self.embeds_in = torch.zeros(T, H, dtype=dt, device=device)
        self.from_embeds = False
        self.cache_len = torch.zeros(1, dtype=torch.int32, device=device)
        self.kv = torch.zeros(shape.layers, 2, shape.nkv, max_len, D, dtype=dt, device=device)
        self.h = torch.zeros(T, H, dtype=dt, device=device)
        self.a = torch.zeros(T, H, dtype=dt, device=device)
        self.qkv = torch.zeros(T, shape.qkv_out, dtype=dt, device=device)
        self.q = torch.zeros(T, shape.nq, D, dtype=dt, device=device)
        self.o = torch.zeros(T, shape.nq * D, dtype=dt, device=device)
        self.attn_out = torch.zeros(T, H, dtype=dt, device=device)
        self.cos, self.sin = A.rope_tables(max_len, shape.rot_dim, shape.rope_theta, device)
        kc = kernel_configs(W, shape, T, self.configs)
        ac = kc["attn"]
        if attn_splits is not None:
            ac["NSPLIT"] = attn_splits
        self.aws = A.AttnWorkspace(T, shape.nq, shape.nkv, D, device, nsplit=ac["NSPLIT"],
                                   block_n=ac["BLOCK_N"], num_warps=ac["num_warps"], num_stages=ac["num_stages"],
                                   min_keys=ac.get("MIN_KEYS", 256), block_m=ac.get("BLOCK_M"))
        E = shape.experts
        self.moe_cfg = kc["moe"]
        split = M._cfg("router", self.moe_cfg, H, shape.moe_inter, E + 1, T)["SPLIT_K"]
        n_moe = shape.layers - shape.first_dense
        self.ws = M.MoEWorkspace(T, H, shape.moe_inter, E, E + 1, shape.top_k, dt, device, split_k=split,
                                 n_slots=n_moe)
        # dense layer 0 as one always-selected expert (top_k=1, no shared): static routing
        self.dws = M.MoEWorkspace.create(T, H, shape.dense_inter, 1, 1, 1, dt, device, split_k=1)
        self.dws.counts.fill_(T)
        self.dws.pairs[0, :T] = torch.arange(T, device=device, dtype=torch.int32)
        self.dws.pair_w.fill_(1.0)
        self.dense_cfg = kc["dense"]
        self.graph = None
        # L2 prefetch of the next layer's attention + router weights on a side stream during the FFN
        self.prefetch = False
        # fold the post-attention RMSNorm into the router and gate+up GEMMs (O-proj adds into h in place)
        self.fuse_norm = False  # slower on the H200 (6.2 vs 4.35 ms: the K loop no longer pipelines); kept as an option
        # QKV and O projections through the Triton skinny GEMM (fp32 outputs consumed by the next kernels)
        self.triton_linear = False
        # QK-norm + RoPE + KV write + split attention + combine in one launch (attention_fused: its own
        # tiles, kernel_configs' "attn_fused"; the combine by the last program in a fixed chunk order). Its first
        # version was slower on the H200 (6.03 vs 5.56 ms at P=1k, docs/perf_history.md v9); the lead's call decides
        self.fused_attn = False
        self.aws_fused = AF.fused_workspace(T, shape.nq, shape.nkv, D, device, kc["attn_fused"])
        # MoE layers: O-proj adds into h in place; the route-select kernel writes RMSNorm(h) for the experts.
        # On by default: the fastest measured variant (H200, docs/perf_history.md v8/v9: 5.54 vs 5.61 ms at P=1k)
        self.norm_in_route = True
        # MoE layers: router GEMM + route/align in one launch (route_fused) instead of two; the same bits.
        # The router config's ``FUSED`` key (tile files; off unless set): the lead's device call chooses
        self.fused_route = bool(M._cfg("router", self.moe_cfg, H, shape.moe_inter, E + 1, T).get("FUSED", False))
        self.lin_cfg = kc["linear"]
        self.qkv32 = torch.zeros(T, shape.qkv_out, dtype=torch.float32, device=device)
        self.attn32 = torch.zeros(T, H, dtype=torch.float32, device=device)
        self.side = torch.cuda.Stream() if torch.cuda.is_available() and str(device).startswith("cuda") else None
        self.pf_dummy = torch.zeros(1 << 14, dtype=torch.int32, device=device)
        self.logits = torch.zeros(T, shape.vocab, dtype=dt, device=device)
        self.pred = torch.zeros(T, dtype=torch.long, device=device)
        self.conf = torch.zeros(T, dtype=torch.float32, device=device)
        self.entropy = torch.zeros(T, dtype=torch.float32, device=device)
        self.stat_nchunk = 16
        self.stat_part = torch.zeros(T, self.stat_nchunk, 4, dtype=torch.float32, device=device)

    # ------------------------------------------------------------------------------------------
    def forward(self, head: bool = True, stats: _Stats | None = None):
        s, W = self.s, self.W
        if self.from_embeds:
            self.h.copy_(self.embeds_in)
        else:
            torch.index_select(W["embed"], 0, self.ids, out=self.h)
        prev = None  # (workspace, top_k, shared) of the previous FFN
        joined = True
        for li, L in enumerate(W["layers"]):
            kc, vc = self.kv[li, 0], self.kv[li, 1]
            if not joined:
                torch.cuda.current_stream().wait_stream(self.side)
                joined = True
            if prev is None:
                Nm.add_rmsnorm(self.h, L["attn_norm"], self.a, eps=s.eps)
            else:
                Nm.add_rmsnorm(self.h, L["attn_norm"], self.a, pairs=prev[0].pair_out, top_k=prev[1],
                               shared=prev[2], eps=s.eps)
            if self.triton_linear:
                qkv = M.linear_rows(self.a, L["wqkv"], self.qkv32, self.dws.counts, self.dws.pairs, self.lin_cfg["qkv"])
            else:
                qkv = torch.mm(self.a, L["wqkv"].t(), out=self.qkv)
            if self.fused_attn:
                AF.block_attention_fused(qkv, L["q_norm"], L["k_norm"], self.cos, self.sin, self.cache_len, kc, vc,
                                         self.o, self.aws_fused, s.nq, s.nkv, rot=s.rot_dim, eps=s.eps)
            else:
                A.qk_norm_rope_kv(qkv, L["q_norm"], L["k_norm"], self.cos, self.sin, self.cache_len, self.q,
                                  kc, vc, s.nq, s.nkv, rot=s.rot_dim, eps=s.eps)
                A.block_attention(self.q, kc, vc, self.cache_len, self.o, self.aws)
            route_norm = self.norm_in_route and "router" in L
            if self.fuse_norm or route_norm:
                self.h.addmm_(self.o, L["wo"].t())
                x_ffn, nw = self.h, L["mlp_norm"]
            else:
                if self.triton_linear:
                    ao = M.linear_rows(self.o, L["wo"], self.attn32, self.dws.counts, self.dws.pairs, self.lin_cfg["o"])
                else:
                    ao = torch.mm(self.o, L["wo"].t(), out=self.attn_out)
                Nm.add_rmsnorm(self.h, L["mlp_norm"], self.a, delta=ao, eps=s.eps)
                x_ffn, nw = self.a, None
            if self.prefetch and self.side is not None and li + 1 < len(W["layers"]):
                nx = W["layers"][li + 1]
                self.side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(self.side):
                    M.l2_prefetch([nx["wqkv"], nx["wo"]] + ([nx["router"]] if "router" in nx else []), self.pf_dummy)
                joined = False
            if "router" not in L:
                M.moe_experts(x_ffn, L["w13"], L["w2"], self.dws, 1, self.dense_cfg, norm_w=nw, eps=s.eps)
                prev = (self.dws, 1, False)
            else:
                E1 = M.expert_slots(L["w13"])
                cslot = li - s.first_dense if s.layers - s.first_dense > 1 else None  # 1 MoE layer: own memset
                route = M.moe_route_align_fused if self.fused_route else M.moe_route_align
                route(x_ffn, L["router"], L["expert_bias"], self.ws, E1, s.top_k, s.n_group, s.topk_group, s.scaling,
                      s.renormalize, self.moe_cfg, slot=cslot, norm_w=nw, eps=s.eps,
                      norm_out=self.a if route_norm else None)
                if route_norm:
                    x_ffn, nw = self.a, None
                if stats is not None:
                    stats.counts.append(self.ws.counts[: s.experts].clone())
                M.moe_experts(x_ffn, L["w13"], L["w2"], self.ws, s.top_k, self.moe_cfg, norm_w=nw, eps=s.eps)
                prev = (self.ws, s.top_k, E1 == s.experts + 1)
        Nm.add_rmsnorm(self.h, W["final_norm"], self.a, pairs=prev[0].pair_out, top_k=prev[1], shared=prev[2],
                       eps=s.eps)
        if head:
            torch.mm(self.a, W["lm_head"].t(), out=self.logits)
            Lg.logits_stats(self.logits, self.stat_part, self.pred, self.conf, self.entropy, nchunk=self.stat_nchunk)

    def distinct_experts(self) -> list[int]:
        """Run one eager forward and return the touched routed experts per MoE layer (host sync)."""
        st = _Stats()
        self.forward(head=False, stats=st)
        return [int((c > 0).sum().item()) for c in st.counts]


# ----------------------------------------------------------------------------------------------
# Plain PyTorch reference of the same forward (HF remote-code style; the benchmark's naive baseline)
# ----------------------------------------------------------------------------------------------


def reference_forward(W, shape: ModelShape, kv: torch.Tensor, prefix: int, ids: torch.Tensor,
                      moe_fn=None) -> torch.Tensor:
    """Eager forward of a T-token block at positions [P, P+T) over ``kv[:, :, :, :P]``; returns logits [T, V].

    Computes in the weights' dtype like the HF code (bf16 on GPU; fp32 in CPU tests): RMSNorm casts,
    QK-norm before partial NeoX RoPE (cos/sin cast to the dtype), SDPA over [prefix | block] without a
    mask (GQA), SwiGLU dense layer 0, MoE through ``moe_fn`` (default :func:`moe.moe_naive_loop`, the
    per-expert loop with a host sync per expert). Does not write the cache.
    """
    moe_fn = moe_fn or M.moe_naive_loop
    s = shape
    T = ids.shape[0]
    D, half = s.head_dim, s.rot_dim // 2
    dt = W["embed"].dtype
    cos, sin = A.rope_tables(prefix + T, s.rot_dim, s.rope_theta, ids.device)
    c = torch.cat([cos[prefix:], cos[prefix:]], -1).to(dt)[:, None, :]
    si = torch.cat([sin[prefix:], sin[prefix:]], -1).to(dt)[:, None, :]

    def rope(x):
        xr, rest = x[..., : s.rot_dim], x[..., s.rot_dim:]
        rot = torch.cat([-xr[..., half:], xr[..., :half]], -1)
        return torch.cat([xr * c + rot * si, rest], -1)

    h = W["embed"][ids]
    for li, L in enumerate(W["layers"]):
        a = Nm.rmsnorm_reference(h, L["attn_norm"], s.eps)
        qkv = (a @ L["wqkv"].t()).view(T, s.nq + 2 * s.nkv, D)
        q = rope(Nm.rmsnorm_reference(qkv[:, : s.nq], L["q_norm"], s.eps))
        k = rope(Nm.rmsnorm_reference(qkv[:, s.nq: s.nq + s.nkv], L["k_norm"], s.eps))
        v = qkv[:, s.nq + s.nkv:]
        K = torch.cat([kv[li, 0, :, :prefix], k.transpose(0, 1)], 1)
        V = torch.cat([kv[li, 1, :, :prefix], v.transpose(0, 1)], 1)
        g = s.nq // s.nkv
        o = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1)[None], K.repeat_interleave(g, 0)[None], V.repeat_interleave(g, 0)[None])
        h = h + o[0].transpose(0, 1).reshape(T, s.nq * D) @ L["wo"].t()
        m = Nm.rmsnorm_reference(h, L["mlp_norm"], s.eps)
        if "router" not in L:
            n = L["w13"].shape[1] // 2
            w13 = L["w13"][0]
            h = h + (torch.nn.functional.silu(m @ w13[:n].t()) * (m @ w13[n:].t())) @ L["w2"][0].t()
        else:
            h = h + moe_fn(m, L["router"], L["expert_bias"], L["w13"], L["w2"], s.top_k, s.n_group, s.topk_group,
                           s.scaling).to(dt)
    f = Nm.rmsnorm_reference(h, W["final_norm"], s.eps)
    return f @ W["lm_head"].t()
