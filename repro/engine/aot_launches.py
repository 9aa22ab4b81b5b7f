"""What the engine launches, for :mod:`repro.engine.aot`: the engine's own host code driven at the real model shapes.

Contract
--------
* :func:`scenarios` — ``(name, run(cfg, weights_by_precision))`` pairs, each driving one launch site of the engine
  on CPU tensors: the single-request graph path (``graph.GraphBackend`` over ``fastpath.BlockForward``: a denoising
  forward, or a prefill for the 4-bit precisions), the batched graph path (``fastpath_batch.BatchedBlockForward``
  with ``graph.kernel_configs``, at every slot count of :func:`slot_counts`) and the eager path's Triton seams
  (``layers.moe.moe_forward`` / ``layers.attention.attention_forward``, one rank's share of heads and experts for
  1, 2, 4 and 8 ranks), for each precision of :data:`PRECISIONS`. Run them inside ``repro.engine.aot.recording``: the
  kernels are then recorded, not run, and the host code answers for the recorded card.
* :func:`weights` — the kernel-layout weights (``fastpath.random_weights``' dict, ``graph.kernel_weights``'
  layout) at a :class:`~.fastpath.ModelShape`, allocated but never filled (nothing reads them while recording).
* :func:`model_shape` / :func:`config` — LLaDA2.1-mini (``presets``) with :data:`LAYERS` layers: every width real.

Imports: torch, the engine (``graph``, ``layers``, ``parallel``, ``cache``, ``checkpoint.nvfp4``) and its kernels;
nothing imports this module but :mod:`repro.engine.aot`.
"""
from __future__ import annotations

import json


#: T: the block size the graph paths run (graph.unsupported_reason: 32 only); layers: one dense + two MoE layers
#: (the MoE layers' launches differ only by the counts row, and one MoE layer alone takes another branch)
T = 32
LAYERS = 3
#: KV rows of the recorded forwards (graph.GraphBackend's smallest capacity)
MAX_LEN = 1024


def model_shape():
    """LLaDA2.1-mini's kernel shape (``fastpath.preset_shape``) with :data:`LAYERS` layers."""
    from repro.engine.kernels.fastpath import preset_shape

    return preset_shape(num_hidden_layers=LAYERS)


def _empty(*shape, dtype):
    import torch

    return torch.empty(*shape, dtype=dtype)  # never written: its pages are never touched


def weights(shape, dtype, precision: str = "bf16", g: float = 1.0) -> dict:
    """Kernel-layout weights (the dict of ``fastpath.random_weights``, the layout ``graph.kernel_weights`` makes of
    a loaded model) at ``shape``, allocated but not filled, the MoE layers sharing one set of tensors. ``precision``
    ``"nvfp4-w4a16"``: the routed experts as ``NVFP4Experts`` (layout "lut", global scales ``g``) with the shared
    expert attached, as ``kernel_weights`` builds them."""
    import torch

    from repro.checkpoint.nvfp4 import NVFP4Experts

    H, D, N, E = shape.hidden, shape.head_dim, shape.moe_inter, shape.experts

    def w4(out_f, in_f, parts, shared):
        w = NVFP4Experts(E, out_f, in_f, parts, dtype, device="meta")
        w.q, w.s = _empty(*w.q.shape, dtype=torch.uint8), _empty(*w.s.shape, dtype=torch.uint8)
        w.g = torch.full(tuple(w.g.shape), g, dtype=torch.float32)
        return w.with_shared(shared)

    attn = {"attn_norm": _empty(H, dtype=dtype), "mlp_norm": _empty(H, dtype=dtype),
            "wqkv": _empty(shape.qkv_out, H, dtype=dtype), "q_norm": _empty(D, dtype=dtype),
            "k_norm": _empty(D, dtype=dtype), "wo": _empty(H, H, dtype=dtype)}
    if precision == "nvfp4-w4a16":
        w13, w2 = w4(2 * N, H, 2, _empty(2 * N, H, dtype=dtype)), w4(H, N, 1, _empty(H, N, dtype=dtype))
    else:
        w13, w2 = _empty(E + 1, 2 * N, H, dtype=dtype), _empty(E + 1, H, N, dtype=dtype)
    moe = dict(attn, router=_empty(E, H, dtype=torch.float32), expert_bias=_empty(E, dtype=torch.float32),
               w13=w13, w2=w2)
    layers = [dict(attn, w13=_empty(1, 2 * shape.dense_inter, H, dtype=dtype),
                   w2=_empty(1, H, shape.dense_inter, dtype=dtype)) if i < shape.first_dense else moe
              for i in range(shape.layers)]
    return {"embed": _empty(shape.vocab, H, dtype=dtype), "lm_head": _empty(shape.vocab, H, dtype=dtype),
            "final_norm": _empty(H, dtype=dtype), "layers": layers}


class _Model:
    """The parts of a loaded ``LLaDA2Model`` that ``graph.GraphBackend`` reads, over :func:`weights`."""

    def __init__(self, cfg, W, precision):
        import torch

        self.cfg, self._kernel_weights, self.precision, self.params = cfg, W, precision, {}
        self.device = torch.device("cpu")


def config():
    from repro.engine.config import LLaDA2Config
    from repro.engine.presets import PRESETS

    return LLaDA2Config.from_dict({**PRESETS["llada2.1-mini"], "num_hidden_layers": LAYERS})


def slot_counts() -> list[int]:
    """The batched forward's slot counts to record: 1, 32 (the paper's batch), every count from which a tile file's
    ``by_slots`` step or the batched attention's "whole" mode starts (``attention_slots.WHOLE_MIN_SLOTS``): the
    launches between two of these differ only in sizes of the same code."""
    from repro.engine.kernels import attention_slots, configs

    out = {1, 32, attention_slots.WHOLE_MIN_SLOTS}
    for path in configs.CONFIG_DIR.glob("batched_*.json"):
        for entry in json.loads(path.read_text()).values():
            for kname, kern in (entry.items() if isinstance(entry, dict) else ()):
                if not kname.startswith("_") and isinstance(kern, dict):
                    out.update(int(s) for s in (kern.get("by_slots") or {}))
    return sorted(out)


def _single(cfg, W, precision, head=True, options=None):
    """The single-request graph path (``graph.GraphBackend``, eager replays of its ``BlockForward``): one
    denoising forward (lm_head and decode statistics included), or with ``head`` False one prompt-block prefill
    (the commit forward: the same launches without the head's two, and no CPU lm_head GEMM to wait for).
    ``options``: ``BlockForward`` attributes set first (its variants: ``fused_attn``, ``fused_route`` — the router
    tiles' ``FUSED`` key —, ``triton_linear``, ``fuse_norm``, ``norm_in_route``), and ``"prefetch"``: its L2 prefetch
    launch (``BlockForward`` runs it on a CUDA side stream only), with the arguments it passes."""
    import torch

    from repro.engine.graph import GraphBackend
    from repro.engine.kernels import moe as M

    gb = GraphBackend(_Model(cfg, W, precision), mask_id=_mask_id(), use_graphs=False)
    gb.begin(MAX_LEN - T, T)
    opts = dict(options or {})
    if opts.pop("prefetch", False):
        L = W["layers"][-1]
        M.l2_prefetch([L["wqkv"], L["wo"], L["router"]], gb.fw.pf_dummy)
    for k, v in opts.items():
        if not hasattr(gb.fw, k):
            raise AttributeError(f"BlockForward has no option {k!r}")
        setattr(gb.fw, k, v)
    ids = torch.full((T,), _mask_id(), dtype=torch.long)
    if head:
        gb.denoise(ids, T, None)
    else:
        gb.prefill(ids)


def _batched(cfg, W, precision, slots, fused_route=False):
    """The batched graph path (``batch_graph.make_forward("batched")``: ``BatchedBlockForward`` with the model's
    kernel configs) over ``slots`` slots: one forward with lm_head; ``fused_route``: its one-launch router + route
    (the router tiles' ``FUSED`` key)."""
    from repro.engine.graph import kernel_configs

    from repro.engine.kernels.fastpath import ModelShape
    from repro.engine.kernels.fastpath_batch import BatchedBlockForward

    fw = BatchedBlockForward(W, ModelShape.from_config(cfg, _mask_id()), MAX_LEN, slots, T, "cpu",
                             configs=kernel_configs(_Model(cfg, W, precision)))
    fw.fused_route = fw.fused_route or fused_route
    fw.forward(head=True)


def _seams(cfg, W, ranks):
    """The eager path's Triton seams (``LLM(kernels="triton")`` without graphs, and the ranks of tensor/expert
    parallelism): MoE over the routed experts (``layers.moe.moe_forward``: row groups of 128) and attention of a
    32-token block over a ``KVCache`` prefix, with one rank's heads and experts of ``ranks``."""
    import torch

    from repro.engine.cache import KVCache
    from repro.engine.layers import attention as attn_seam
    from repro.engine.layers import moe as moe_seam

    from repro.engine.kernels import register_with_seams

    from repro.engine.parallel import ShardPlan

    register_with_seams(select=True)
    L = W["layers"][-1]
    w13, w2 = L["w13"], L["w2"]
    plan = ShardPlan(cfg, ranks, 0)
    E = len(plan.experts)
    if hasattr(w13, "with_shared"):  # packed experts: a rank's slice, no shared expert (ShardedModel adds it)
        w13, w2 = _w4_slice(w13, E), _w4_slice(w2, E)
    else:
        w13, w2 = w13[:E], w2[:E]
    n, k = T, cfg.num_experts_per_tok
    x = _empty(n, cfg.hidden_size, dtype=W["embed"].dtype)
    ids = torch.zeros(n, k, dtype=torch.long)
    moe_seam.moe_forward(x, w13, w2, torch.zeros(n, k), ids)
    hq, hkv = len(plan.q_heads), len(plan.kv_heads)
    cache = KVCache(1, 2 * T, hkv, cfg.head_dim, W["embed"].dtype, "cpu")
    qkv = _empty(n, hq + 2 * hkv, cfg.head_dim, dtype=W["embed"].dtype)
    k_, v_ = cache.view(0, 2 * T)
    attn_seam.attention_forward(qkv[:, :hq], k_, v_, T, T)


def _w4_slice(w, E):
    """Experts [0, E) of packed experts ``w`` as views (``parallel.shard_nvfp4_experts`` copies them: same shapes,
    dtypes and alignment), without the shared expert."""
    from repro.checkpoint.nvfp4 import NVFP4Experts

    o = object.__new__(NVFP4Experts)
    o.__dict__.update(w.__dict__)
    o.E, o.q, o.s, o.g, o.shared = E, w.q[:E], w.s[:E], w.g[:E], None
    o.__dict__.pop("_derived_ok", None)
    return o


def _mask_id() -> int:
    from repro.engine.presets import PRESET_MASK_IDS

    return PRESET_MASK_IDS["llada2.1-mini"]


#: precisions of the recorded launches: the model dtype and the routed experts' form (``LLM(precision=...)`` on a
#: GPU); "nvfp4-w4a16" twice: global scales inside the range of the derived-table decode (4) and outside it (3)
PRECISIONS = {"bf16": ("bf16", 1.0), "nvfp4-w4a16": ("nvfp4-w4a16", 1.0),
              "nvfp4-w4a16 (g outside decode 4's range)": ("nvfp4-w4a16", 2.0 ** 120)}


def scenarios() -> list[tuple[str, object]]:
    """``(name, run(cfg, W_by_precision))`` of everything :func:`record` drives, in order."""
    out = []
    for p in PRECISIONS:  # the head's launches do not depend on the experts: recorded once
        out.append((f"single {p}", lambda cfg, Ws, p=p: _single(cfg, Ws[p], PRECISIONS[p][0], p == "bf16")))
    for p in ("bf16", "nvfp4-w4a16"):
        for s in slot_counts():
            out.append((f"batched S={s} {p}", lambda cfg, Ws, p=p, s=s: _batched(cfg, Ws[p], PRECISIONS[p][0], s)))
    for p in ("bf16", "nvfp4-w4a16"):
        for r in (1, 2, 4, 8):
            out.append((f"eager seams {p} ranks={r}", lambda cfg, Ws, p=p, r=r: _seams(cfg, Ws[p], r)))
    # the variants a flag or a tile key turns on (off in the engine today; the router / route kernels do not see the
    # experts' precision, the folded norm is refused for 4-bit experts): BF16
    for name, opts in OPTIONS.items():
        out.append((f"single bf16 {name}", lambda cfg, Ws, o=opts: _single(cfg, Ws["bf16"], "bf16", False, o)))
    for s in (1, max(slot_counts())):
        out.append((f"batched S={s} bf16 fused route", lambda cfg, Ws, s=s: _batched(cfg, Ws["bf16"], "bf16", s, True)))
    return out


#: ``BlockForward`` variants recorded besides its defaults (:func:`_single`'s ``options``)
OPTIONS = {"fused attention, route and linear": dict(fused_attn=True, fused_route=True, triton_linear=True),
           "folded norm, prefetch": dict(fuse_norm=True, norm_in_route=False, prefetch=True)}
