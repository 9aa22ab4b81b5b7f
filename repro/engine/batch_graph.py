"""Batched generation on the CUDA-graph path: one graph replay per round over all slots.

Contract:

* :func:`generate_batch_graph` decodes a list of :class:`~repro.engine.batch.BatchRequest` (greedy, one
  shared :class:`~repro.engine.decoders.DecoderConfig`, 32-token blocks) with up to ``batch_size`` of them
  active, like :func:`repro.engine.batch.generate_batch` (same scheduler: a worker thread per request runs the
  unchanged :func:`repro.engine.decode_loop.generate_ids`; continuous batching; results in input order; the
  first error of any request stops the batch and is re-raised), but every round is **one** replay of a
  CUDA graph over ``S`` static slots (:class:`BatchGraphEngine`): the batched block forward
  (``BatchedBlockForward`` of ``repro/engine/kernels/fastpath_batch.py`` when present, else
  :class:`PerSlotForward`) followed by the on-device decoder step of every slot
  (:class:`repro.engine.decoders.device_batch.BatchedDeviceStep`).
* A round, on the host: per slot a mode — idle (no request: its forward runs at position 0 of its own,
  unused KV cache, which the slot's next request writes before it reads it), forward only (a prompt block
  of its prefill, one block per round, or its block's commit forward: ids copied into the slot's row),
  forward + step (a denoising round) or forward with logits returned (host decoders, used only when a
  request's decoder is not the engine's) — written as one ``[3, S]`` int32 control tensor (cache length,
  embeddings in, step) in one host→device copy; the replay; then **one** device→host copy of the
  ``[2, S]`` flags (block final, last forward reused). The only other read is one ``[1]`` flag per block
  start (the "final before any forward" check of the new block).
* Host work per round: a request's worker thread is woken only at block boundaries — its prefill
  (:class:`PrefillJob`) and each block's denoising loop (:class:`StepJob`, the loop of
  ``decode_loop._device_block``) are single submissions that the scheduler advances round by round from the
  flags, so a round costs one Python pass over the slots, not one thread handoff per slot.
* Capture once per (slots, decoder settings, cache length) on first use (``capture_s``; the engine is kept
  by :class:`repro.engine.llm.LLM` between calls). ``use_graphs=False`` runs the same body eagerly (CPU tests
  use it with :class:`TorchSlotForward`).
* Batch invariance: a slot's forward and step never depend on the other slots (:class:`PerSlotForward` by
  construction; the step: :mod:`repro.engine.decoders.device_batch`), so greedy token ids and forward counts
  are those of the same request through this engine with ``batch_size=1`` ("alone" for this path). The
  single-request :class:`~repro.engine.graph.GraphBackend` runs other kernels and is not bit-identical to it
  (docs/perf_history.md "Batched generation").
"""

from __future__ import annotations

import time

import torch

from repro.engine.batch import CONTINUE, BatchRequest, BatchStats, _Scheduler, _Slot
from repro.engine.decoders import DecoderConfig
from repro.engine.decoders.device import supported
from repro.engine.decoders.device_batch import BatchedDeviceStep

IDLE, FORWARD, STEP, LOGITS = 0, 1, 2, 3


class PerSlotForward:
    """Reference batched block forward: ``slots`` independent :class:`repro.engine.kernels.fastpath.BlockForward`
    with the buffers of the batched interface (each slot's buffers are views of these).

    Inputs: ``ids`` ``[S, T]`` int64, ``embeds_in`` ``[S, T, H]`` (model dtype), ``use_embeds`` ``[S]`` bool
    (the slot's layer-0 input is ``embeds_in[s]`` instead of ``E[ids[s]]``), ``cache_len`` ``[S]`` int32
    (prefix length per slot). Outputs of :meth:`forward`: ``logits`` ``[S, T, V]``, ``pred`` ``[S, T]`` int64,
    ``conf`` / ``entropy`` ``[S, T]`` fp32; each slot's K/V in its own cache of ``max_len`` rows. No host sync
    (graph-capturable). Costs ``S`` times the weight reads of one block: the oracle and the fallback, not the
    fast path.
    """

    def __init__(self, W, shape, max_len: int, slots: int, T: int = 32, device="cuda", configs=None):
        from repro.engine.kernels.fastpath import BlockForward

        self.W, self.T, self.max_len, self.S = W, T, max_len, slots
        self.slots = [BlockForward(W, shape, max_len, T=T, device=device, configs=configs) for _ in range(slots)]
        f0 = self.slots[0]
        self.ids = torch.full((slots, T), shape.mask_id, dtype=torch.long, device=device)
        self.embeds_in = torch.zeros((slots,) + tuple(f0.embeds_in.shape), dtype=f0.dtype, device=device)
        self.use_embeds = torch.zeros(slots, dtype=torch.bool, device=device)
        self.cache_len = torch.zeros(slots, dtype=torch.int32, device=device)
        self.logits = torch.zeros((slots,) + tuple(f0.logits.shape), dtype=f0.logits.dtype, device=device)
        self.pred = torch.zeros(slots, T, dtype=torch.long, device=device)
        self.conf = torch.zeros(slots, T, dtype=torch.float32, device=device)
        self.entropy = torch.zeros(slots, T, dtype=torch.float32, device=device)
        for s, f in enumerate(self.slots):
            f.ids, f.cache_len, f.logits = self.ids[s], self.cache_len[s:s + 1], self.logits[s]
            f.pred, f.conf, f.entropy = self.pred[s], self.conf[s], self.entropy[s]
            f.from_embeds = True  # the slot's private embeds_in gets E[ids] or embeds_in[s] (forward)

    def forward(self, head: bool = True) -> None:
        """All ``S`` slots' block forwards (and lm_head + statistics when ``head``)."""
        E = self.W["embed"]
        for s, f in enumerate(self.slots):
            torch.where(self.use_embeds[s], self.embeds_in[s], E[self.ids[s]], out=f.embeds_in)
            f.forward(head=head)


def slot_buffers(fw, model, slots: int, T: int) -> None:
    """Give ``fw`` the batched forward's input/output buffers (the interface of
    :class:`~repro.engine.kernels.fastpath_batch.BatchedBlockForward`): ``ids`` [S, T] int64, ``embeds_in``
    [S, T, H] and ``logits`` [S, T, V] in the model's dtype, ``use_embeds`` [S] bool, ``cache_len`` [S] int32."""
    dev, dt, c = model.device, model.dtype, model.cfg
    fw.ids = torch.zeros(slots, T, dtype=torch.long, device=dev)
    fw.embeds_in = torch.zeros(slots, T, c.hidden_size, dtype=dt, device=dev)
    fw.use_embeds = torch.zeros(slots, dtype=torch.bool, device=dev)
    fw.cache_len = torch.zeros(slots, dtype=torch.int32, device=dev)
    fw.logits = torch.zeros(slots, T, c.vocab_size, dtype=dt, device=dev)


class TorchSlotForward:
    """The batched forward's interface over the torch layer functions: one
    :meth:`~repro.engine.model.LLaDA2Model.forward_chunks` over the ``S`` slots, each with its own
    :class:`~repro.engine.cache.KVCache` (row-invariant, so a slot's logits do not depend on the others).
    Reads ``cache_len`` / ``use_embeds`` on the host, so it is not capturable: the CPU form of the graph path
    (its scheduler and on-device step run unchanged; ``tests/engine/test_batch_graph.py``). Buffers as
    :class:`PerSlotForward` (``logits`` fp32 in the model dtype)."""

    def __init__(self, model, max_len: int, slots: int, T: int = 32):
        from repro.engine.model import Chunk

        self.model, self.T, self.max_len, self.S, self._chunk = model, T, max_len, slots, Chunk
        self.caches = [model.new_cache(max_len) for _ in range(slots)]
        slot_buffers(self, model, slots, T)

    def forward(self, head: bool = True) -> None:
        """All slots' block forwards (logits when ``head``); host reads of the slot positions."""
        starts, use = self.cache_len.tolist(), self.use_embeds.tolist()
        chunks = [self._chunk(starts[s], self.caches[s], self.T, ids=self.ids[s],
                              embeds=self.embeds_in[s] if use[s] else None, logits=head) for s in range(self.S)]
        for s, out in enumerate(self.model.forward_chunks(chunks)):
            if out is not None:
                self.logits[s].copy_(out)


FORWARDS = ("auto", "batched", "per-slot", "torch")


def make_forward(kind: str, model, mask_id: int, max_len: int, slots: int, T: int):
    """The batched block forward of ``kind`` (:data:`FORWARDS`): ``"batched"`` = ``BatchedBlockForward`` of
    repro/engine/kernels/fastpath_batch.py, ``"per-slot"`` = :class:`PerSlotForward` (Triton kernels, one
    :class:`~repro.engine.kernels.fastpath.BlockForward` per slot), ``"torch"`` = :class:`TorchSlotForward`;
    ``"auto"``: on CUDA batched when that module exists and takes the model's shape (one eager forward checks
    it; the tiny checkpoint's 262-token vocabulary is not a multiple of its lm_head tile), else per-slot (its
    ``fallback_reason`` says why); torch elsewhere; or a callable
    ``kind(model, mask_id, max_len, slots, T)`` returning an object with these buffers. Raises ValueError
    for an unknown kind and ImportError for ``"batched"`` without its module."""
    if callable(kind):  # a factory with this signature (benchmarks: a null forward to time the scheduler)
        return kind(model, mask_id, max_len, slots, T)
    if kind not in FORWARDS:
        raise ValueError(f"forward must be one of {FORWARDS}, got {kind!r}")
    if kind == "auto" and model.device.type != "cuda":
        kind = "torch"
    if kind == "torch":
        return TorchSlotForward(model, max_len, slots, T)
    from repro.engine.graph import kernel_configs, kernel_weights
    from repro.engine.kernels.fastpath import ModelShape

    args = (kernel_weights(model), ModelShape.from_config(model.cfg, mask_id), max_len)
    kw = dict(slots=slots, T=T, device=model.device, configs=kernel_configs(model))
    if kind in ("auto", "batched"):
        try:
            from repro.engine.kernels.fastpath_batch import BatchedBlockForward

            fw = BatchedBlockForward(*args, **kw)
            if kind == "auto":
                fw.forward(head=True)  # shape checks of its kernels (e.g. the lm_head tiles) run at the first call
            return fw
        except (ImportError, ValueError) as e:
            if kind == "batched":
                raise
            why = f"{type(e).__name__}: {e}"
    else:
        why = None
    fw = PerSlotForward(*args, **kw)
    fw.fallback_reason = why  # why "auto" did not take BatchedBlockForward (None when asked for per-slot)
    return fw


def settings_key(cfg: DecoderConfig) -> str:
    """The decoder settings a captured step reads (``max_new_tokens`` and ``seed`` do not change the graph)."""
    return repr(sorted((k, v) for k, v in cfg.to_dict().items() if k not in ("max_new_tokens", "seed")))


class BatchGraphEngine:
    """Static buffers + the round graph for ``slots`` slots and greedy decoder ``cfg`` (module docstring).

    ``model``: a loaded :class:`~repro.engine.model.LLaDA2Model`; ``max_len``: KV rows per slot (every
    request's canvas must fit); ``use_graphs``: capture and replay (default: on CUDA) or run the body
    eagerly; ``forward``: the batched forward's kind (:func:`make_forward`). Raises ValueError for a
    sampling ``cfg``. ``capture_s``: seconds spent capturing; ``rounds``: rounds run.
    """

    def __init__(self, model, mask_id: int, cfg: DecoderConfig, slots: int, max_len: int,
                 use_graphs: bool | None = None, forward: str = "auto"):
        if not supported(cfg):
            raise ValueError("the batched CUDA-graph path needs greedy decoding (temperature 0); "
                             "sampling runs on the eager batched path")
        self.model, self.mask_id, self.cfg, self.S, self.T = model, mask_id, cfg, slots, cfg.block_size
        self.key = settings_key(cfg)
        dev = model.device
        self.use_graphs = dev.type == "cuda" if use_graphs is None else use_graphs
        self.fw = make_forward(forward, model, mask_id, max_len, slots, self.T)
        self.forward_kind, self.forward_arg = type(self.fw).__name__, forward
        self.forward_note = getattr(self.fw, "fallback_reason", None)
        if self.use_graphs and isinstance(self.fw, TorchSlotForward):
            raise ValueError("forward 'torch' reads slot positions on the host and cannot be captured; "
                             "use use_graphs=False or a Triton forward ('batched' / 'per-slot')")
        self.max_len = max_len
        self.step = BatchedDeviceStep(cfg, mask_id, model, self.fw.ids, self.fw.embeds_in)
        pin = dev.type == "cuda"
        self.ctrl = torch.zeros(3, slots, dtype=torch.int32, device=dev)
        self.ctrl_host = torch.zeros(3, slots, dtype=torch.int32, pin_memory=pin)
        self._ctrl_np = self.ctrl_host.numpy()  # the same memory: element writes without torch's per-item cost
        self.flags_host = torch.zeros(2, slots, dtype=torch.bool, pin_memory=pin)
        self.graph = None
        self.capture_s = 0.0
        self.rounds = 0

    def _body(self) -> None:
        fw, st = self.fw, self.step
        fw.cache_len.copy_(self.ctrl[0])
        fw.use_embeds.copy_(self.ctrl[1] != 0)
        st.step_mask.copy_(self.ctrl[2] == STEP)
        fw.forward(head=True)
        st.step(fw.logits)

    def capture(self) -> None:
        """Capture the round graph (idempotent; nothing for an eager engine). Called before any request
        holds a slot: the warm-up and capture runs are idle rounds (K/V rows [0, T) of every slot, no step)."""
        if not self.use_graphs or self.graph is not None:
            return
        t0 = time.perf_counter()
        self.ctrl.copy_(self._ctrl_idle())
        st = torch.cuda.Stream()
        st.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(st):
            for _ in range(2):
                self._body()
        torch.cuda.current_stream().wait_stream(st)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            self._body()
        torch.cuda.synchronize()
        self.graph = g
        self.capture_s += time.perf_counter() - t0

    def _ctrl_idle(self) -> torch.Tensor:
        return torch.zeros(3, self.S, dtype=torch.int32, device=self.ctrl.device)  # every slot idle at 0

    def run_round(self, modes: list[tuple]) -> list[list[bool]]:
        """One round. ``modes[s]``: ``(IDLE,)`` | ``(FORWARD, ids [T], start, is_prefill)`` | ``(STEP, start)`` |
        ``(LOGITS, ids [T], start, embeds [T, H] or None)``. Returns the host flags ``[[final]*S, [reuse]*S]``
        (one device→host read)."""
        fw, c = self.fw, self._ctrl_np
        for s, m in enumerate(modes):
            kind = m[0]
            c[2, s] = kind
            c[1, s] = 0
            if kind == IDLE:
                c[0, s] = 0  # the slot holds no request: rows [0, T) of its unused cache, a short attention
                continue
            if kind in (FORWARD, LOGITS):
                fw.ids[s].copy_(m[1])
                if kind == LOGITS and m[3] is not None:
                    fw.embeds_in[s].copy_(m[3])
                    c[1, s] = 1
            elif self.step.self_conditioning:
                c[1, s] = 1
            c[0, s] = m[2] if kind != STEP else m[1]
        cuda = self.ctrl.device.type == "cuda"
        self.ctrl.copy_(self.ctrl_host, non_blocking=cuda)
        if self.graph is not None:
            self.graph.replay()
        else:
            self._body()
        self.flags_host.copy_(self.step.flags, non_blocking=cuda)
        if cuda:
            torch.cuda.current_stream().synchronize()
        self.rounds += 1
        return self.flags_host.tolist()


class PrefillJob:
    """A prompt's prefill as one submission: its full blocks, one FORWARD round each, in order."""

    def __init__(self, ids: torch.Tensor, block_size: int):
        self.ids, self.B, self.start = ids, block_size, 0

    def mode(self) -> tuple:
        """This round's mode for the slot (:meth:`BatchGraphEngine.run_round`)."""
        return (FORWARD, self.ids[self.start:self.start + self.B], self.start, True)

    def advance(self, final: bool, reuse: bool):
        """After the round: :data:`~repro.engine.batch.CONTINUE` or None (done)."""
        self.start += self.B
        return CONTINUE if self.start < self.ids.shape[0] else None


class StepJob:
    """A block's denoising rounds as one submission (``decode_loop._device_block``'s loop, run by the
    scheduler): one STEP round after another until the flags say final or ``cap`` rounds ran; the worker
    sleeps meanwhile. Output: ``(forwards, finished)``."""

    def __init__(self, stepper, start: int, cap: int):
        self.stepper, self.start, self.cap, self.n = stepper, start, cap, 0

    def mode(self) -> tuple:
        """This round's mode for the slot."""
        return (STEP, self.start)

    def advance(self, final: bool, reuse: bool):
        """After the round: the slot's flags; :data:`~repro.engine.batch.CONTINUE` or ``(forwards, finished)``."""
        self.stepper.set_flags(final, reuse)
        self.n += 1
        if final:
            return self.n, True
        return (self.n, False) if self.n >= self.cap else CONTINUE


class _GraphSlotBackend:
    """:class:`repro.engine.decode_loop.ForwardBackend` of one request on a :class:`BatchGraphEngine` slot:
    every forward is submitted to the scheduler and runs inside the round's replay."""

    def __init__(self, sched: "_GraphScheduler", slot: _Slot):
        self.sched, self.slot, self.model = sched, slot, sched.model

    def begin(self, capacity: int, block_size: int) -> None:
        """Check the request fits its slot (the engine is sized for every request of the batch)."""
        e = self.sched.engine
        if block_size != e.T or capacity > e.max_len:
            raise ValueError(f"request needs block size {block_size} and {capacity} positions; the batched graph "
                             f"engine has {e.T}-token blocks and {e.max_len} positions per slot")
        self.block_size = block_size

    def prefill(self, ids: torch.Tensor) -> None:
        """Full prompt blocks, one commit-style forward per block (one block per round; one submission)."""
        self.sched.submit(self.slot, PrefillJob(ids, self.block_size))

    def denoise(self, ids, start, embeds):
        """Logits ``[B, V]`` fp32 of the block at ``start`` (host decoders)."""
        return self.sched.submit(self.slot, (LOGITS, ids, start, embeds))

    def commit_block(self, ids, start, run_forward):
        """The commit forward (K/V of the final tokens) when needed."""
        if run_forward:
            self.sched.submit(self.slot, (FORWARD, ids, start, False))

    def device_stepper(self, cfg: DecoderConfig):
        """This slot's view of the engine's batched step; None (host decoders) for other decoder settings."""
        e = self.sched.engine
        if settings_key(cfg) != e.key:
            return None
        self.slot.stepper = e.step.view(self.slot.row)
        return self.slot.stepper

    def denoise_step(self, stepper, start: int) -> None:
        """One denoising round (forward + on-device step) of the block at ``start``."""
        self.sched.submit(self.slot, (STEP, start))

    def denoise_steps(self, stepper, start: int, cap: int) -> tuple[int, bool]:
        """The block's denoising rounds until final or ``cap`` (:class:`StepJob`): ``(forwards, finished)``."""
        return self.sched.submit(self.slot, StepJob(stepper, start, cap))


class _GraphScheduler(_Scheduler):
    """:class:`repro.engine.batch._Scheduler` whose rounds are :meth:`BatchGraphEngine.run_round`."""

    def __init__(self, model, mask_id: int, eos_id: int, engine: BatchGraphEngine):
        super().__init__(model, mask_id, eos_id)
        self.engine = engine
        self.free = list(range(engine.S - 1, -1, -1))

    def _backend(self, slot: _Slot):
        return _GraphSlotBackend(self, slot)

    def _admit(self, slot: _Slot) -> None:
        slot.row, slot.stepper = self.free.pop(), None

    def _release(self, slot: _Slot) -> None:
        self.free.append(slot.row)

    def _round(self, active: list[_Slot], stats: BatchStats) -> list:
        e = self.engine
        modes: list[tuple] = [(IDLE,)] * e.S
        for s in active:
            modes[s.row] = s.pending if isinstance(s.pending, tuple) else s.pending.mode()
        flags = e.run_round(modes)
        stats.rows += e.T * len(active)
        stats.round_prefill.append(any(modes[s.row][0] == FORWARD and modes[s.row][3] for s in active))
        outs = []
        for s in active:
            final, reuse = flags[0][s.row], flags[1][s.row]
            if not isinstance(s.pending, tuple):  # a multi-round job: CONTINUE, or its output when done
                outs.append(s.pending.advance(final, reuse))
                continue
            kind = s.pending[0]
            if kind == STEP:
                s.stepper.set_flags(final, reuse)
            outs.append(e.fw.logits[s.row].to(torch.float32, copy=True) if kind == LOGITS else None)
        return outs


def canvas_positions(requests: list[BatchRequest], block_size: int) -> int:
    """Largest canvas (positions) of ``requests``: ``ceil((P + G) / B) · B`` (decode_loop's layout)."""
    need = 0
    for r in requests:
        G = r.max_new_tokens if r.max_new_tokens is not None else DecoderConfig.coerce(r.decoder).max_new_tokens
        need = max(need, -(-(len(r.prompt_ids) + int(G or 0)) // block_size) * block_size)
    return need


def generate_batch_graph(model, requests: list[BatchRequest], *, mask_id: int, eos_id: int, batch_size: int = 8,
                         on_result=None, stats: BatchStats | None = None, engine: BatchGraphEngine | None = None,
                         use_graphs: bool | None = None, forward: str = "auto") -> tuple[list, BatchGraphEngine]:
    """Decode ``requests`` on the batched graph path (module docstring); returns ``(results, engine)`` where
    ``results`` is as :func:`repro.engine.batch.generate_batch` returns it and ``engine`` the
    :class:`BatchGraphEngine` used — pass it back as ``engine`` to reuse its capture (it is rebuilt when the
    slots, decoder settings, needed positions, ``use_graphs`` or ``forward`` differ). ``use_graphs`` /
    ``forward``: as :class:`BatchGraphEngine`. All requests must share one greedy decoder
    (ValueError otherwise: run :func:`~repro.engine.batch.generate_batch`); ``batch_size`` as there."""
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer ≥ 1, got {batch_size!r}")
    requests = list(requests)
    if not requests:
        return [], engine
    cfgs = {settings_key(DecoderConfig.coerce(r.decoder)) for r in requests}
    if len(cfgs) != 1:
        raise ValueError("the batched graph path needs one decoder for all requests; use generate_batch")
    cfg = DecoderConfig.coerce(requests[0].decoder)
    stats = stats if stats is not None else BatchStats()
    S = min(batch_size, len(requests))
    rnd = 1024 if model.device.type == "cuda" else cfg.block_size
    need = max(canvas_positions(requests, cfg.block_size), cfg.block_size)
    max_len = -(-need // rnd) * rnd
    if engine is None or engine.S != S or engine.key != settings_key(cfg) or engine.max_len < max_len \
            or (use_graphs is not None and engine.use_graphs != use_graphs) or engine.forward_arg != forward:
        engine = None
        if model.device.type == "cuda":
            torch.cuda.empty_cache()
        with torch.inference_mode():
            engine = BatchGraphEngine(model, mask_id, cfg, S, max_len, use_graphs=use_graphs, forward=forward)
    t0 = time.perf_counter()
    cap0 = engine.capture_s
    with torch.inference_mode():
        engine.capture()
        stats.engine = "cuda-graph" if engine.use_graphs else "graph-path eager"
        out = _GraphScheduler(model, mask_id, eos_id, engine).run(requests, batch_size, stats, on_result)
    stats.capture_s = engine.capture_s - cap0
    stats.wall_s = time.perf_counter() - t0
    return out, engine
