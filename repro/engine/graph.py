"""CUDA-graph block decoding: the engine's forward on a GPU as graph replays (design rules: docs/perf_model.md §4).

:class:`GraphBackend` implements the generate loop's backend protocol (:class:`repro.engine.decode_loop.ForwardBackend`)
with :class:`repro.engine.kernels.fastpath.BlockForward`: every forward of a request — prompt prefill (block by
block, block-causal, K/V kept), denoising forwards (lm_head over the block's positions only) and commit
forwards (K/V only) — is one replay of a CUDA graph captured once for the fixed block shape. The prefix length
lives in a device int32 tensor (``cache_len``), so one graph serves every position; the KV cache is a static
buffer grown (and the graphs recaptured) only when a request needs more positions than any before it.

Weights are the model's own tensors (no copy): :func:`kernel_weights` stacks each MoE layer's routed experts
and its shared expert into one ``[E+1, …]`` tensor (shared = index E, the kernels' layout) and re-points the
model's parameters at views of it, so the eager path and the graph path share storage.

What the graph path supports (:func:`unsupported_reason` says why not otherwise; ``LLM(graphs="auto")`` then
keeps the eager cached path): a CUDA device with triton, bf16 or fp32 weights (NVFP4 checkpoints
dequantised at load run too) or precision ``nvfp4-w4a16`` (routed experts packed, dequantized in the MoE kernels), power-of-two experts / groups / top-k, at most one shared expert, and
32-token blocks (the paper's and the model card's block size; other sizes run on the eager path).

Greedy decoding goes one step further (:meth:`GraphBackend.device_stepper`): the decoder step runs on the device
in the same graph as the denoising forward (:mod:`repro.engine.decoders.device`), so a round is one replay and
the loop reads one device flag per round.

Numerics: the kernels compute like the eager bf16 engine (fp32 accumulation, fp32 router, bf16 residual
stream), but not bit-identically: reductions are ordered differently, so greedy decoding can diverge from the
eager path at near-ties of the argmax or of the routing top-k (tests/engine/test_gpu.py measures agreement).
"""

from __future__ import annotations

import torch

from repro.engine.config import LLaDA2Config

#: Small-shape tiles (hidden < 1024, e.g. the tiny test checkpoint); full-size shapes use the tuned JSON
#: configs of repro/engine/kernels/configs.
SMALL_TILES = {
    "moe": {"router": dict(BLOCK_E=16, SPLIT_K=2, BLOCK_K=16), "route": dict(num_warps=4),
            "gate_up": dict(BLOCK_N=16, BLOCK_K=16, num_stages=2), "down": dict(BLOCK_N=16, BLOCK_K=16, num_stages=2),
            "sum": dict(BLOCK_H=32)},
    "dense": {"gate_up": dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, num_warps=4, num_stages=2),
              "down": dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, num_warps=4, num_stages=2)},
    "attn": dict(NSPLIT=4, BLOCK_N=16),
}


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def unsupported_reason(cfg: LLaDA2Config, block_size: int, device) -> str | None:
    """Why the graph path cannot run this model/device (a sentence), or None when it can."""
    if not str(device).startswith("cuda"):
        return f"device {device} is not CUDA"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not installed"
    if not (_pow2(cfg.num_experts) and _pow2(cfg.n_group) and _pow2(cfg.num_experts_per_tok)):
        return "num_experts, n_group and num_experts_per_tok must be powers of two for the MoE kernels"
    if cfg.num_shared_experts > 1:
        return "more than one shared expert"
    if block_size != 32:
        return f"block_size {block_size}: the graph path is built and tested for 32-token blocks"
    return None


def kernel_weights(model) -> dict:
    """The kernel-layout weight dict of :func:`repro.engine.kernels.fastpath.random_weights` for ``model``.

    Names from the tables :data:`repro.engine.weights.KERNEL_LAYER_NAMES` (dense tensors: the model's own,
    no copy) and :data:`~repro.engine.weights.KERNEL_FFN`: each MoE layer's ``moe.w_gate_up`` ``[E, 2I, H]`` /
    ``moe.w_down`` ``[E, H, I]`` and shared expert ``[2I, H]`` / ``[H, I]`` are copied once into stacked
    ``w13 [E+1, 2I, H]`` / ``w2 [E+1, H, I]`` (shared = index E; without a shared expert ``[E, …]``) and the
    model's parameters are replaced by views of them (storage shared, no lasting extra memory). With packed
    experts (precision ``nvfp4-w4a16``) ``w13``/``w2`` are the model's ``NVFP4Experts`` with the shared expert
    attached (:meth:`~repro.checkpoint.nvfp4.NVFP4Experts.with_shared`; no copy). Idempotent.
    """
    from repro.checkpoint.nvfp4 import NVFP4Experts
    from repro.engine.weights import KERNEL_FFN, KERNEL_LAYER_NAMES

    c, p = model.cfg, model.params
    cached = getattr(model, "_kernel_weights", None)
    if cached is not None:
        return cached
    W = {"embed": p["embed"], "lm_head": p["lm_head"], "final_norm": p["final_norm"], "layers": []}
    for l in range(c.num_hidden_layers):
        q = f"layers.{l}."
        L = {k: p[q + v] for k, v in KERNEL_LAYER_NAMES.items() if q + v in p}
        if l < c.first_k_dense_replace:
            L.update({k: p[q + dense][None] for k, (dense, _, _) in KERNEL_FFN.items()})
        else:
            E = c.num_experts
            for k, (_, routed, shared) in KERNEL_FFN.items():
                src, has_shared = p[q + routed], q + shared in p
                if isinstance(src, NVFP4Experts):  # nvfp4-w4a16: packed routed experts + the dense shared one
                    L[k] = src.with_shared(p[q + shared] if has_shared else None)
                    continue
                w = torch.empty((E + has_shared,) + tuple(src.shape[1:]), dtype=src.dtype, device=src.device)
                w[:E].copy_(src)
                p[q + routed] = w[:E]
                if has_shared:
                    w[E].copy_(p[q + shared])
                    p[q + shared] = w[E]
                del src
                L[k] = w
            L.setdefault("expert_bias", None)
        W["layers"].append(L)
    model._kernel_weights = W
    return W


def kernel_configs(model) -> dict | None:
    """Kernel tile settings for ``model``: :data:`SMALL_TILES` for small shapes (hidden < 1024), None (the tuned
    JSON configs) at full size."""
    configs = SMALL_TILES if model.cfg.hidden_size < 1024 else None
    if configs is not None and getattr(model, "precision", None) == "nvfp4-w4a16":
        # the 4-bit K loop takes BLOCK_K in multiples of 32 (two 16-wide dots of even / odd inputs)
        configs = {**SMALL_TILES, "moe": {**SMALL_TILES["moe"], **{
            k: dict(SMALL_TILES["moe"][k], BLOCK_K=32) for k in ("gate_up", "down")}}}
    return configs


class GraphBackend:
    """Forward backend of :func:`repro.engine.decode_loop.generate_ids` that runs every forward as a CUDA-graph replay.

    ``model``: a loaded :class:`~repro.engine.model.LLaDA2Model` on CUDA; ``mask_id``: the ``<|mask|>`` id;
    ``use_graphs=False`` runs the same kernels eagerly (CPU tests under ``TRITON_INTERPRET=1``);
    ``device_steps=False`` keeps greedy decoding on the host decoders (comparisons, benchmarks).
    Graphs: ``denoise`` (forward from token ids + lm_head + fp32 decode statistics), ``denoise_embeds`` (the
    same from ``embeds`` — self-conditioning), ``commit`` (forward without lm_head: K/V of final tokens; also
    prompt prefill, block by block), each captured on first use, and ``step:<decoder settings>`` (denoising
    forward + on-device decoder step, captured by :meth:`device_stepper`). ``capture_s`` accumulates the
    seconds spent capturing; ``forwards`` counts forwards run.
    """

    def __init__(self, model, mask_id: int, use_graphs: bool = True, min_capacity: int = 1024,
                 device_steps: bool = True):
        self.model, self.mask_id, self.use_graphs = model, mask_id, use_graphs
        self.device_steps = device_steps
        from repro.engine.kernels.fastpath import ModelShape

        self.shape = ModelShape.from_config(model.cfg, mask_id)
        self.W = kernel_weights(model)
        self.configs = kernel_configs(model)
        self.fw = None
        self.graphs: dict[str, torch.cuda.CUDAGraph] = {}
        self.steppers: dict = {}
        self.pool = None
        self.min_capacity = min_capacity
        self.capture_s = 0.0
        self.forwards = 0
        #: set to a list to collect (start, end) CUDA events around every replay (benchmarks: GPU busy time)
        self.events: list | None = None

    # ------------------------------------------------------------------ static buffers and graphs
    def begin(self, capacity: int, block_size: int) -> None:
        """Make sure the static KV cache holds ``capacity`` positions (grow + recapture only if needed)."""
        from repro.engine.kernels.fastpath import BlockForward

        self.block_size = block_size
        fw = self.fw
        if fw is not None and fw.T == block_size and fw.max_len >= capacity:
            return
        max_len = max(self.min_capacity, -(-capacity // 1024) * 1024)
        self.graphs.clear()
        self.steppers.clear()
        self.fw = None
        if self.model.device.type == "cuda":
            torch.cuda.empty_cache()
        self.fw = BlockForward(self.W, self.shape, max_len, T=block_size, device=self.model.device,
                               configs=self.configs)

    def _capture(self, name: str, head: bool, from_embeds: bool, extra=None) -> None:
        """Warm up (two eager runs on a side stream) and capture ``forward(head)`` + ``extra()`` as graph
        ``name``. The warm-up forwards write K/V at the last T rows of the cache (never a prefix row a request
        reads before its own forward rewrites it); ``extra`` must tolerate being run (its state is reset later)."""
        import time

        fw = self.fw
        t0 = time.perf_counter()
        fw.from_embeds = from_embeds
        keep = fw.cache_len.clone()  # a lazy capture happens between setting the position and the replay
        fw.cache_len.fill_(fw.max_len - fw.T)
        if self.use_graphs:
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
            st = torch.cuda.Stream()
            st.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(st):
                for _ in range(2):
                    fw.forward(head=head)
                    if extra is not None:
                        extra()
            torch.cuda.current_stream().wait_stream(st)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=self.pool):
                fw.forward(head=head)
                if extra is not None:
                    extra()
            torch.cuda.synchronize()
            self.graphs[name] = g
        fw.cache_len.copy_(keep)
        self.capture_s += time.perf_counter() - t0

    def _graph(self, name: str) -> torch.cuda.CUDAGraph:
        if name not in self.graphs:
            self._capture(name, head=name != "commit", from_embeds=name == "denoise_embeds")
        return self.graphs[name]

    def _run(self, name: str) -> None:
        fw = self.fw
        self.forwards += 1
        if name.startswith("step:") and not self.use_graphs:
            stepper = self.steppers[name]
            fw.from_embeds = stepper.self_conditioning
            fw.forward(head=True)
            stepper.step(fw.logits)
            return
        if self.use_graphs:
            g = self._graph(name)
            if self.events is None:
                g.replay()
            else:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                g.replay()
                b.record()
                self.events.append((a, b))
        else:
            fw.from_embeds = name == "denoise_embeds"
            fw.forward(head=name != "commit")

    # ------------------------------------------------------------------ ForwardBackend protocol
    def prefill(self, ids: torch.Tensor, start: int = 0) -> None:
        """Full prompt blocks ``ids`` ``[n]`` (n a multiple of B) at ``start``: one commit replay per block, in
        order."""
        B = self.block_size
        for s in range(0, ids.shape[0], B):
            self.fw.ids.copy_(ids[s:s + B])
            self.fw.cache_len.fill_(start + s)
            self._run("commit")

    def denoise(self, ids: torch.Tensor, start: int, embeds: torch.Tensor | None) -> torch.Tensor:
        """Logits ``[B, V]`` fp32 (a new tensor) of the block at ``start``; its provisional K/V are written."""
        fw = self.fw
        fw.ids.copy_(ids)
        fw.cache_len.fill_(start)
        if embeds is not None:
            fw.embeds_in.copy_(embeds)
            self._run("denoise_embeds")
        else:
            self._run("denoise")
        out = fw.logits.float()
        return out.clone() if out.data_ptr() == fw.logits.data_ptr() else out  # fp32 weights: .float() is the buffer

    def commit_block(self, ids: torch.Tensor, start: int, run_forward: bool) -> None:
        """Commit replay (K/V of the final tokens) when needed; otherwise the last forward's K/V stay."""
        if run_forward:
            self.fw.ids.copy_(ids)
            self.fw.cache_len.fill_(start)
            self._run("commit")

    # ------------------------------------------------------------------ on-device decoder steps
    def device_stepper(self, cfg):
        """A :class:`repro.engine.decoders.device.DeviceStep` for greedy ``cfg`` over this backend's input
        buffers, with its round graph (forward + step) captured; call after :meth:`begin`. Cached per
        decoder settings (a new block shape or capacity recaptures). None when ``cfg`` samples or
        ``device_steps`` is off (the loop then drives the host decoders over the forward graphs)."""
        from repro.engine.decoders.device import DeviceStep, supported

        if not (self.device_steps and supported(cfg)):
            return None
        # settings the step reads (max_new_tokens and seed do not change the graph: no recapture for them)
        name = "step:" + repr(sorted((k, v) for k, v in cfg.to_dict().items() if k not in ("max_new_tokens", "seed")))
        st = self.steppers.get(name)
        if st is None:
            fw = self.fw
            st = DeviceStep(cfg, self.mask_id, self.model, fw.ids, fw.embeds_in)
            st.graph_name = name
            self.steppers[name] = st
            if self.use_graphs:
                self._capture(name, head=True, from_embeds=st.self_conditioning, extra=lambda: st.step(fw.logits))
        return st

    def denoise_step(self, stepper, start: int) -> None:
        """One round of the block at ``start``: forward from the stepper's buffers + its on-device step."""
        self.fw.cache_len.fill_(start)
        self._run(stepper.graph_name)
