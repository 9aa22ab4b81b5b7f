"""Tensor / expert parallelism: one request's forward split over N ranks of a ``torch.distributed`` group.

Layout of rank r of N (:class:`ShardPlan`; docs/engine.md §15):

* attention by heads: query heads ``[r·H/N, (r+1)·H/N)``; their KV heads — ``K/N`` per rank when N divides
  the ``K`` KV heads, else (N a multiple of K, e.g. LLaDA2.1-mini's 4 KV heads on 8 ranks) the one KV head
  serving the rank's query heads, replicated on ``N/K`` ranks. Each rank keeps only its KV heads in its
  cache. ``wo`` by columns (the rank's heads): a partial ``[n, D]`` sum;
* the dense SwiGLU layer and the shared expert by the intermediate dimension (gate/up rows, down columns):
  partial sums;
* routed experts by expert (expert parallelism): experts ``[r·E/N, (r+1)·E/N)``. The router (fp32) runs on
  every rank over every token, so every rank knows every token's experts; a rank computes the tokens routed to
  its experts and the partial outputs are combined with the other partials of the layer (for the 32-row
  rounds of block decoding a sum of partials moves as few bytes as an all-to-all dispatch would). Packed
  4-bit experts (precision ``nvfp4-w4a16``, :class:`~repro.checkpoint.nvfp4.NVFP4Experts`) split the same way
  and stay packed: each rank holds the bytes of its experts (:func:`shard_nvfp4_experts`) and runs them as the
  one-rank eager model does (dequantized per expert in torch on the CPU, the 4-bit Triton kernels on a GPU);
* ``lm_head`` by vocabulary rows ``[r·⌈V/N⌉, …)``: a rank's forward returns logits over its vocabulary slice
  only; the decoder step reduces argmax / softmax / confidence / the ORL residual across ranks on the device
  (:class:`VocabShard`). Embeddings, norms, router and adapter are replicated.

Reduction order (:meth:`Comm.sum`): every partial sum is an all-gather of the ranks' fp32 partials followed
by a sum over the rank axis, computed by the same kernel on the same data on every rank — so every rank
holds the same bits (a routing top-k or an argmax can never disagree between ranks, which an all-reduce
does not promise) and the result does not depend on the collective's algorithm. Partials are combined in
fp32 and cast to the model dtype once. Cost: N× the bytes of an all-reduce's input per rank; at batch-1
rounds (32 rows × D) that is latency, not bandwidth. N = 1 never builds this module's objects.

Every collective takes device tensors and returns device tensors without a host read, so on GPUs the NCCL
path is the same code and a CUDA graph can capture a round (forward + :class:`~repro.engine.decoders.device.
DeviceStep`) on every rank with the collectives inside; the launcher is :mod:`repro.engine.ranks`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from repro.checkpoint.nvfp4 import NVFP4Experts
from repro.engine.cache import KVCache
from repro.engine.config import LLaDA2Config
from repro.engine.layers.linear import linear
from repro.engine.layers.mlp import swiglu
from repro.engine.layers.moe import _ACTIVE_NAME, moe_forward, route
from repro.engine.model import LLaDA2Model, resolve_precision
from repro.engine.weights import FP32_PARAMS


def _split_problem(cfg: LLaDA2Config, n: int) -> str | None:
    H, K = cfg.num_attention_heads, cfg.num_key_value_heads
    checks = [("attention heads (num_attention_heads)", H), ("routed experts (num_experts)", cfg.num_experts),
              ("shared-expert width (moe_intermediate_size × num_shared_experts)",
               cfg.moe_intermediate_size * cfg.num_shared_experts)]
    if cfg.first_k_dense_replace > 0:
        checks.append(("dense-layer width (intermediate_size)", cfg.intermediate_size))
    for what, v in checks:
        if v % n:
            return f"does not divide the model's {v} {what}"
    if (n - 1) * -(-cfg.vocab_size // n) >= cfg.vocab_size:
        return f"leaves a rank without vocabulary rows (vocab_size {cfg.vocab_size})"
    if K % n and n % K:
        return f"neither divides the model's {K} KV heads nor is a multiple of them (KV heads are replicated past {K})"
    return None


def parallel_problem(cfg: LLaDA2Config, n) -> str | None:
    """Why ``cfg`` cannot be split over ``n`` ranks (one sentence naming the count and the sizes that work),
    or None. Conditions: N divides the query heads, the routed experts, the dense and shared-expert widths, and
    N divides the KV heads or is a multiple of them."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        return f"tensor_parallel_size must be an integer ≥ 1, got {n!r}"
    why = _split_problem(cfg, n)
    if why is None:
        return None
    ok = [d for d in range(1, 65) if _split_problem(cfg, d) is None]
    return f"tensor_parallel_size {n} {why}; this model splits over {ok}"


@dataclass(frozen=True)
class ShardPlan:
    """What rank ``rank`` of ``size`` holds (module docstring). Raises ValueError via :func:`parallel_problem`."""

    cfg: LLaDA2Config
    size: int
    rank: int

    def __post_init__(self):
        why = parallel_problem(self.cfg, self.size)
        if why:
            raise ValueError(why)

    @property
    def q_heads(self) -> range:
        """Query heads of this rank (``H/N`` consecutive)."""
        h = self.cfg.num_attention_heads // self.size
        return range(self.rank * h, (self.rank + 1) * h)

    @property
    def kv_heads(self) -> range:
        """KV heads of this rank: its share, or the single (replicated) one its query heads use."""
        c = self.cfg
        g = c.num_attention_heads // c.num_key_value_heads
        return range(self.q_heads.start // g, max(self.q_heads.start // g + 1, self.q_heads.stop // g))

    @property
    def experts(self) -> range:
        """Routed experts of this rank (``E/N`` consecutive)."""
        e = self.cfg.num_experts // self.size
        return range(self.rank * e, (self.rank + 1) * e)

    @property
    def vocab(self) -> range:
        """Vocabulary rows of this rank's lm_head slice (``⌈V/N⌉``, the last slice shorter)."""
        v = -(-self.cfg.vocab_size // self.size)
        return range(min(self.rank * v, self.cfg.vocab_size), min((self.rank + 1) * v, self.cfg.vocab_size))


class Comm:
    """The group's collectives on device tensors (no host reads). ``group``: a ``torch.distributed`` process
    group (None = the default group) of ``size`` ranks, this process being ``rank``."""

    def __init__(self, rank: int, size: int, group=None):
        self.rank, self.size, self.group = rank, size, group
        self.calls = 0  # collectives issued
        #: None, or a list that receives one timing per collective: a (start, end) CUDA event pair recorded on
        #: the current stream around the call, or seconds of the (synchronous) gloo call on the CPU.
        self.timings: list | None = None

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """``[size, *x.shape]``: every rank's ``x`` in rank order (all-gather)."""
        self.calls += 1
        out = torch.empty((self.size,) + tuple(x.shape), dtype=x.dtype, device=x.device)
        x = x.contiguous()
        if self.timings is not None:
            if x.is_cuda:
                ev = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                ev[0].record()
            else:
                t0 = time.perf_counter()
        if x.is_cuda:
            dist.all_gather_into_tensor(out, x, group=self.group)
        else:
            dist.all_gather(list(out.unbind(0)), x, group=self.group)
        if self.timings is not None:
            if x.is_cuda:
                ev[1].record()
                self.timings.append(ev)
            else:
                self.timings.append(time.perf_counter() - t0)
        return out

    def sum(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over ranks of ``x`` (fp32), identical bits on every rank (module docstring "Reduction order")."""
        return self.gather(x.float()).sum(0)

    def broadcast_flag(self, flag: bool | None) -> bool:
        """Rank 0's ``flag`` on every rank (one host read: used once per block for the stop hook)."""
        dev = "cpu" if dist.get_backend(self.group) == "gloo" else f"cuda:{torch.cuda.current_device()}"
        t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=dev)
        self.calls += 1
        dist.broadcast(t, 0, group=self.group)
        return bool(t.item())


def _gate_up_rows(t: torch.Tensor, plan: ShardPlan) -> torch.Tensor:
    """The rank's rows of a fused gate/up ``[2I, D]`` (dense layer, shared expert): ``I/N`` rows of each half."""
    half = t.shape[-2] // 2
    w = half // plan.size
    a, b = plan.rank * w, (plan.rank + 1) * w
    return torch.cat([t[..., a:b, :], t[..., half + a:half + b, :]], -2)


def _down_cols(t: torch.Tensor, plan: ShardPlan) -> torch.Tensor:
    """The rank's columns of a down projection ``[D, I]``: ``I/N`` columns (a partial sum over ranks)."""
    w = t.shape[-1] // plan.size
    return t[..., plan.rank * w:(plan.rank + 1) * w]


def shard_nvfp4_experts(w: NVFP4Experts, plan: ShardPlan, device, dtype: torch.dtype | None = None,
                        gate_up: bool = True) -> NVFP4Experts:
    """The rank's share of one layer's packed routed experts, still packed: experts ``plan.experts`` of
    ``w`` (``q`` ``[E_r, out, in/2]``, ``s`` ``[E_r, out, in/16]``, ``g`` ``[E_r, parts]``: slices along E, the
    bytes and the ``layout`` unchanged, so local expert ``e - plan.experts.start`` dequantizes to exactly the
    values of expert ``e``), copied to ``device``; values dequantize to ``dtype`` (default ``w.dtype``).
    ``w.shared`` (the dense shared expert a kernel layout attaches, :meth:`NVFP4Experts.with_shared`) is split as
    the bf16 shared expert is: ``gate_up`` True (``w_gate_up``, shared ``[2S, D]``) the rank's ``S/N`` rows of
    each half, False (``w_down``, shared ``[D, S]``) its ``S/N`` columns, so the ranks' outputs sum to the
    shared expert's. Raises ValueError when ``w`` does not hold the config's ``num_experts`` experts."""
    ex = plan.experts
    if w.E != plan.cfg.num_experts:
        raise ValueError(f"NVFP4 experts: {w.E} experts in the tensor, the config has {plan.cfg.num_experts} "
                         f"(split over {plan.size} ranks as experts [{ex.start}, {ex.stop}) on rank {plan.rank})")
    o = NVFP4Experts(len(ex), w.out_f, w.in_f, w.parts, w.dtype if dtype is None else dtype, device, w.layout)
    o.q.copy_(w.q[ex.start:ex.stop])
    o.s.copy_(w.s[ex.start:ex.stop])
    o.g.copy_(w.g[ex.start:ex.stop])
    if w.shared is not None:
        sh = _gate_up_rows(w.shared, plan) if gate_up else _down_cols(w.shared, plan)
        o.shared = sh.to(device=device, dtype=o.dtype).contiguous()
    return o


def shard_params(params: dict[str, torch.Tensor], plan: ShardPlan, device,
                 dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The rank's slices of a full parameter dict (layout of :mod:`repro.engine.weights`), copied to
    ``device`` (contiguous). Packed routed experts (:class:`~repro.checkpoint.nvfp4.NVFP4Experts`, precision
    ``nvfp4-w4a16``) are split by experts and stay packed (:func:`shard_nvfp4_experts`). ``dtype``: the model
    dtype on ``device`` when it differs from the loaded one (``nvfp4-w4a16`` is read as fp32 on the CPU and
    runs in bf16 on a GPU): floating tensors are cast to it, except the fp32 router and expert bias. Raises
    ValueError for a packed tensor anywhere but the routed experts."""
    c, hd = plan.cfg, plan.cfg.head_dim
    H, K = c.num_attention_heads, c.num_key_value_heads
    q, kv, ex, vo = plan.q_heads, plan.kv_heads, plan.experts, plan.vocab

    def rows(t, r: range, width: int = 1):
        return t[r.start * width:r.stop * width]

    out = {}
    for n, t in params.items():
        if isinstance(t, NVFP4Experts) and n.endswith(("moe.w_gate_up", "moe.w_down")):
            out[n] = shard_nvfp4_experts(t, plan, device, dtype, gate_up=n.endswith("w_gate_up"))
            continue
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{n}: a {type(t).__name__} cannot be split across ranks (only the routed experts "
                             "moe.w_gate_up / moe.w_down may be packed NVFP4Experts)")
        if n.endswith(".wqkv"):
            t = torch.cat([rows(t, q, hd), rows(t[H * hd:], kv, hd), rows(t[(H + K) * hd:], kv, hd)])
        elif n.endswith(".wo"):
            t = t[:, q.start * hd:q.stop * hd]
        elif n.endswith(("mlp.w_gate_up", "moe.shared_gate_up")):
            t = _gate_up_rows(t, plan)
        elif n.endswith(("mlp.w_down", "moe.shared_down")):
            t = _down_cols(t, plan)
        elif n.endswith(("moe.w_gate_up", "moe.w_down")):
            t = t[ex.start:ex.stop]
        elif n == "lm_head":
            t = t[vo.start:vo.stop]
        if dtype is not None and t.is_floating_point() and not FP32_PARAMS.match(n):
            t = t.to(dtype)
        out[n] = t.to(device).contiguous()
    return out


def _routed_local(x: torch.Tensor, w_gate_up, w_down, weights: torch.Tensor,
                  ids: torch.Tensor, lo: int) -> torch.Tensor:
    """This rank's routed-expert partial ``[n, D]`` fp32: experts ``lo .. lo+E_r-1`` (``w_gate_up`` /
    ``w_down`` are their ``[E_r, …]`` slices: tensors, or :class:`~repro.checkpoint.nvfp4.NVFP4Experts` of the
    rank's experts, precision ``nvfp4-w4a16``). The torch seam: the loop of ``moe_forward_torch`` over the
    local experts (same products, ascending order; ``w[e - lo]`` of packed experts dequantizes that one expert
    to the values dequantize-at-load holds, as on one rank). Another seam (Triton): the seam on local ids,
    tokens of other ranks' experts sent to local expert 0 with weight 0 — for packed experts the same 4-bit
    kernels (dequantizing in registers) the one-rank eager model runs, over ``E_r`` experts."""
    e_r = w_gate_up.shape[0]
    local = (ids >= lo) & (ids < lo + e_r)
    if _ACTIVE_NAME[0] != "torch":
        if getattr(w_gate_up, "shared", None) is not None:  # the shared expert is added by the caller
            w_gate_up, w_down = w_gate_up.with_shared(None), w_down.with_shared(None)
        lid = torch.where(local, ids - lo, torch.zeros_like(ids))
        return moe_forward(x, w_gate_up, w_down, torch.where(local, weights, torch.zeros_like(weights)),
                           lid).float()
    out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32, device=x.device)
    for e in torch.unique(ids[local]).tolist():
        tok, slot = torch.nonzero(ids == e, as_tuple=True)
        h = linear(x[tok], w_gate_up[e - lo])
        g, u = h.chunk(2, dim=-1)
        y = linear(F.silu(g) * u, w_down[e - lo])
        out.index_add_(0, tok, y.float() * weights[tok, slot][:, None])
    return out


class ShardedModel(LLaDA2Model):
    """One rank's :class:`~repro.engine.model.LLaDA2Model`: the slices of :func:`shard_params`, a KV cache of its
    own KV heads, and a forward whose logits are over the rank's vocabulary slice ``[n, |plan.vocab|]`` fp32
    (reduced in the decoder step through :attr:`vocab`). Every rank must run the same forwards in the same
    order (the collectives pair up): :mod:`repro.engine.ranks` drives that. ``dtype``: the rank's model dtype
    (default: the precision's on ``device``; ``full`` may have been read in another, see :func:`shard_params`)."""

    def __init__(self, full: LLaDA2Model, plan: ShardPlan, comm: Comm, device, dtype: torch.dtype | None = None):
        precision = getattr(full, "precision", None)
        if dtype is None:  # nvfp4-w4a16 is read on the CPU in fp32 and runs in bf16 on a GPU (resolve_precision)
            dtype = resolve_precision(precision, device)[0] if precision == "nvfp4-w4a16" else full.dtype
        params = shard_params(full.params, plan, device, None if dtype == full.dtype else dtype)
        super().__init__(full.cfg, params, dtype, device, full.with_adapter)
        self.precision = precision
        self.plan, self.comm = plan, comm
        self.vocab = VocabShard(plan, comm)

    @classmethod
    def random(cls, cfg: LLaDA2Config, plan: ShardPlan, comm: Comm, device, dtype="bf16",
               seed: int = 0) -> "ShardedModel":
        """This rank's slices of random weights in ``cfg``'s shapes, drawn on ``device`` without building the
        full model (shapes from slicing a ``meta``-device model): norms ``1 + N(0, 0.1²)``, expert bias ``N(0, 0.1²)``, embeddings ``N(0, 1)``, the rest
        ``N(0, 1/fan_in)`` (lm_head ×6), as :meth:`LLaDA2Model.random`. Replicated tensors (embeddings, norms,
        router, expert bias) are the same on every rank, split ones are seeded per rank. For benchmarks
        (:mod:`repro.engine.bench.parallel`). ``dtype`` ``"nvfp4-w4a16"``: the rank's routed experts are random
        packed NVFP4 (:func:`repro.engine.kernels.moe_w4.random_nvfp4_experts`), the rest as for bf16."""
        meta = LLaDA2Model.empty(cfg, "meta", dtype, with_adapter=False)
        self = cls(meta, plan, comm, "meta", resolve_precision(dtype, device)[0])
        for i, (name, t) in enumerate(sorted(self.params.items())):
            split = not name.endswith(("norm", "embed", "router", "expert_bias"))
            g = torch.Generator(device=device).manual_seed((int(seed) * 1_000_003 + i) * 64 + (plan.rank if split else 0))
            if isinstance(t, NVFP4Experts):
                from repro.engine.kernels.moe_w4 import random_nvfp4_experts

                self.params[name] = random_nvfp4_experts(t.E, t.out_f, t.in_f, t.parts, t.dtype, device, g)
                continue
            buf = torch.empty(t.shape, dtype=torch.float32, device=device)
            if name.endswith("norm"):
                buf.normal_(1.0, 0.1, generator=g)
            elif name.endswith("expert_bias") or name == "embed":
                buf.normal_(0.0, 0.1 if name != "embed" else 1.0, generator=g)
            else:
                buf.normal_(0.0, (6.0 if name == "lm_head" else 1.0) / t.shape[-1] ** 0.5, generator=g)
            self.params[name] = buf.to(t.dtype)
        self.device = torch.device(device)
        return self

    def new_cache(self, capacity: int) -> KVCache:
        """A zeroed cache of this rank's KV heads only."""
        c = self.cfg
        return KVCache(c.num_hidden_layers, capacity, len(self.plan.kv_heads), c.head_dim, self.dtype, self.device)

    def _local_heads(self) -> tuple[int, int]:
        """This rank's (query heads, KV heads): :meth:`LLaDA2Model.forward_chunks` runs unchanged on them."""
        return len(self.plan.q_heads), len(self.plan.kv_heads)

    def _combine(self, partial: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The sum over ranks of a layer's partial attention or MLP output (two all-reduces per layer), in
        ``dtype``; each rank's logits are then over its vocabulary slice ``[n, |plan.vocab|]`` fp32."""
        return self.comm.sum(partial).to(dtype)

    def _moe(self, l: int, x: torch.Tensor) -> torch.Tensor:
        """This rank's MoE partial ``[n, D]`` fp32: its routed experts plus its columns of the shared expert."""
        c, p, q = self.cfg, self.params, f"layers.{l}.moe."
        w, ids = route(x, p[q + "router"], p.get(q + "expert_bias"), c.num_experts_per_tok, c.n_group,
                       c.topk_group, c.routed_scaling_factor, c.norm_topk_prob)
        out = _routed_local(x, p[q + "w_gate_up"], p[q + "w_down"], w, ids, self.plan.experts.start)
        if q + "shared_gate_up" in p:
            out = out + swiglu(x, p[q + "shared_gate_up"], p[q + "shared_down"]).float()
        return out


class VocabShard:
    """The decoder step over vocabulary-sliced logits: what :mod:`repro.engine.decoders` compute from full
    ``[B, V]`` logits, from each rank's ``[B, V_r]`` slice, with small collectives and no host read. Every rank
    gets identical results (gathers, module docstring). Used by the decoders when the model has ``vocab``."""

    def __init__(self, plan: ShardPlan, comm: Comm):
        self.lo, self.hi, self.V, self.comm = plan.vocab.start, plan.vocab.stop, plan.cfg.vocab_size, comm

    def candidates(self, logits: torch.Tensor, mask_id: int, exclude_mask_token: bool) -> torch.Tensor:
        """:func:`~repro.engine.decoders.base.candidate_logits` on the slice (the mask column lives on one rank)."""
        lg = logits.float()
        if exclude_mask_token and self.lo <= mask_id < self.hi:
            lg = lg.clone()
            lg[:, mask_id - self.lo] = float("-inf")
        return lg

    def _max(self, lg: torch.Tensor):
        """(global max ``[B]``, global argmax ``[B]`` int64; ties → lowest id, as ``torch.max``)."""
        m, i = lg.max(dim=-1)
        g = self.comm.gather(torch.stack([m, (i + self.lo).float()], -1))  # [N, B, 2]; ids < 2^24 exact in fp32
        win = g[..., 0].argmax(0)  # first rank holding the max = lowest id
        return g[..., 0].max(0).values, g[..., 1].gather(0, win[None]).squeeze(0).long()

    def propose(self, lg: torch.Tensor, temperature: float, gen):
        """:func:`~repro.engine.decoders.base.propose`: greedy → ``(argmax [B], max softmax [B])`` from two
        gathers of ``[B]``-sized statistics; sampling gathers the full logits (every rank draws the same token
        from its identically seeded generator)."""
        if temperature > 0:
            from repro.engine.decoders.base import propose

            return propose(self.full(lg), temperature, gen)
        gmax, x = self._max(lg)
        s = self.comm.sum((lg - gmax[:, None]).exp().sum(-1))
        return x, 1.0 / s

    def full(self, lg: torch.Tensor) -> torch.Tensor:
        """All ranks' slices gathered into ``[B, V]`` (sampling only)."""
        w = -(-self.V // self.comm.size)
        pad = torch.full((lg.shape[0], w), float("-inf"), dtype=lg.dtype, device=lg.device)
        pad[:, :lg.shape[1]] = lg
        return self.comm.gather(pad).permute(1, 0, 2).reshape(lg.shape[0], -1)[:, :self.V]

    def residual(self, lg: torch.Tensor, embed: torch.Tensor, temperature: float):
        """:func:`repro.engine.adapter.residual` (``Δ = softmax(lg)ᵀE``, ``w = H(softmax(lg/T))/log V``) from the
        slice: ``embed`` is the full (replicated) table, this rank uses its rows. Returns ``(z, w, Δ)``."""
        gmax, _ = self._max(lg)
        e1 = (lg - gmax[:, None]).exp()
        y = lg / temperature
        et = (y - (gmax / temperature)[:, None]).exp()
        s = self.comm.sum(torch.stack([e1.sum(-1), et.sum(-1)], -1))  # [B, 2]
        p = e1 / s[:, :1]
        lp = y - ((gmax / temperature) + s[:, 1].log())[:, None]
        pt = lp.exp()
        h = -torch.where(pt > 0, pt * lp, torch.zeros_like(pt)).sum(-1)
        d = (p.to(embed.dtype) @ embed[self.lo:self.hi]).float()
        red = self.comm.sum(torch.cat([d, h[:, None]], -1))
        delta = red[:, :-1]
        w = red[:, -1] / math.log(self.V)
        return w[:, None] * delta, w, delta
