"""Batched generation on the CUDA-graph path: one graph replay per round over all slots.

Contract:

* :class:`GraphExecutor` is the engine loop's executor (:mod:`repro.engine.loop`) over a
  :class:`BatchGraphEngine`: every round is **one** replay of a CUDA graph over ``S`` static slots — the batched
  block forward (``BatchedBlockForward`` of ``repro/engine/kernels/fastpath_batch.py`` when present, else
  :class:`PerSlotForward`) followed by the on-device decoder step of every slot
  (:class:`repro.engine.decoders.device_batch.BatchedDeviceStep`). It runs ``LLM.generate_batch`` on a GPU with a
  greedy decoder and 32-token blocks, and the server's scheduler there; :func:`generate_batch_graph` decodes a
  fixed list on a private loop on the calling thread (continuous batching; results in input order; the first
  error of any request stops the others and is re-raised).
* A round, on the host: per slot a mode — idle (no request: its forward runs at position 0 of its own,
  unused KV cache, which the slot's next request writes before it reads it), forward only (a prompt block
  of its prefill, one block per round, or its block's commit forward: ids copied into the slot's row),
  forward + step (a denoising round) or forward with logits returned (host decoders, used only when a
  request's decoder is not the engine's) — written as one ``[3, S]`` int32 control tensor (cache length,
  embeddings in, step) in one host→device copy; the replay; then **one** device→host copy of the
  ``[2, S]`` flags (block final, last forward reused). The only other read is one ``[1]`` flag per block
  start (the "final before any forward" check of the new block).
* Host work per round: a request's program is resumed only at block boundaries — a prefill chunk
  (:class:`PrefillJob`, one block per round) and each block's denoising loop (:class:`StepJob`) are single ops
  that the executor advances round by round from the flags, so a round costs one Python pass over the slots.
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

from repro.engine.batch import BatchRequest, run_requests
from repro.engine.decoders import DecoderConfig
from repro.engine.decoders.device import device_step_problem
from repro.engine.decoders.device_batch import BatchedDeviceStep
from repro.engine.loop import PENDING, BatchStats, EngineLoop
from repro.engine.request import Begin, Commit, Denoise, Prefill, canvas_positions, steps_reply

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
    eagerly; ``forward``: the batched forward's kind (:func:`make_forward`). Raises ValueError (one line) for a
    ``cfg`` the on-device step does not implement (sampling; a decoder that declares no on-device step).
    ``capture_s``: seconds spent capturing; ``rounds``: rounds run.
    """

    def __init__(self, model, mask_id: int, cfg: DecoderConfig, slots: int, max_len: int,
                 use_graphs: bool | None = None, forward: str = "auto"):
        why = device_step_problem(cfg)
        if why is not None:
            raise ValueError(f"the batched CUDA-graph path runs the on-device step, and {why}; it runs on the eager "
                             "batched path")
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
    """A prefill op as one job: its full blocks ``ids`` at ``base`` onwards, one FORWARD round each, in order."""

    def __init__(self, ids: torch.Tensor, block_size: int, base: int = 0):
        self.ids, self.B, self.base, self.start = ids, block_size, base, 0

    def mode(self) -> tuple:
        """This round's mode for the slot (:meth:`BatchGraphEngine.run_round`)."""
        return (FORWARD, self.ids[self.start:self.start + self.B], self.base + self.start, True)

    def advance(self, final: bool, reuse: bool):
        """After the round: :data:`~repro.engine.loop.PENDING` or None (done)."""
        self.start += self.B
        return PENDING if self.start < self.ids.shape[0] else None


class StepJob:
    """A block's denoising rounds as one job (a :class:`~repro.engine.request.Steps` op): one STEP round after
    another until the flags say final or ``cap`` rounds ran. Output: ``(forwards, finished)``."""

    def __init__(self, stepper, start: int, cap: int):
        self.stepper, self.start, self.cap, self.n = stepper, start, cap, 0

    def mode(self) -> tuple:
        """This round's mode for the slot."""
        return (STEP, self.start)

    def advance(self, final: bool, reuse: bool):
        """After the round: the slot's flags; :data:`~repro.engine.loop.PENDING` or ``(forwards, finished)``."""
        self.stepper.set_flags(final, reuse)
        self.n += 1
        if final:
            return self.n, True
        return (self.n, False) if self.n >= self.cap else PENDING


class _Slot:
    """A request's slot row, its step view (None: host decoders) and its pending job."""

    def __init__(self, row: int):
        self.row, self.stepper, self.job = row, None, None


class GraphExecutor:
    """The loop's executor over a :class:`BatchGraphEngine` (module docstring): ``slots`` = the engine's ``S``;
    ``kind``: ``"cuda-graph"`` (captured) or ``"graph-path eager"``. A request whose decoder settings are the
    engine's runs its blocks as :class:`StepJob`\\ s on the batched on-device step; another decoder (e.g.
    sampling) runs the host decoders on the logits of the same replay."""

    def __init__(self, engine: BatchGraphEngine):
        self.engine, self.model, self.slots = engine, engine.model, engine.S
        self.kind = "cuda-graph" if engine.use_graphs else "graph-path eager"
        self.free = list(range(engine.S - 1, -1, -1))
        self._st: dict = {}

    @property
    def capture_s(self) -> float:
        """Seconds the engine spent capturing its round graph."""
        return self.engine.capture_s

    def start(self, req, op):
        """``Begin`` takes a slot row (ValueError when the request does not fit a slot); a commit without forward
        and a block final before any round answer at once; other ops become the slot's job."""
        e = self.engine
        if isinstance(op, Begin):
            if op.block_size != e.T or op.capacity > e.max_len:
                raise ValueError(f"request needs block size {op.block_size} and {op.capacity} positions; the batched "
                                 f"graph engine has {e.T}-token blocks and {e.max_len} positions per slot")
            st = self._st[req] = _Slot(self.free.pop())
            if settings_key(op.decoder) == e.key:
                st.stepper = e.step.view(st.row)
            return st.stepper is not None
        st = self._st[req]
        if isinstance(op, Prefill):
            st.job = PrefillJob(op.ids, e.T, op.start)
        elif isinstance(op, Denoise):
            st.job = (LOGITS, op.ids, op.start, op.embeds)
        elif isinstance(op, Commit):
            if not op.run_forward:
                return None
            st.job = (FORWARD, op.ids, op.start, False)
        else:  # Steps
            st.stepper.start_block(op.tokens, op.editable)
            done = steps_reply(st.stepper, 0, op.cap)
            if done is not None:
                return done
            st.job = StepJob(st.stepper, op.start, op.cap)
        return PENDING

    def round(self, reqs: list) -> None:
        """One :meth:`BatchGraphEngine.run_round` over the slots' jobs; each job advanced from the flags."""
        e = self.engine
        sts = [self._st[r] for r in reqs]
        modes: list[tuple] = [(IDLE,)] * e.S
        for st in sts:
            modes[st.row] = st.job if isinstance(st.job, tuple) else st.job.mode()
        flags = e.run_round(modes)
        for r, st in zip(reqs, sts):
            final, reuse = flags[0][st.row], flags[1][st.row]
            job = st.job
            if isinstance(job, tuple):
                r.reply = e.fw.logits[st.row].to(torch.float32, copy=True) if job[0] == LOGITS else None
                continue
            out = job.advance(final, reuse)
            if out is PENDING:
                r.reply = PENDING
            elif isinstance(job, StepJob):
                n, done = out
                r.reply = (st.stepper.tokens.clone(), n, bool(st.stepper.reuse()), done)
            else:
                r.reply = None

    def rows(self, req) -> int:
        """Token rows a slot runs per round (its block)."""
        return self.engine.T

    def release(self, req) -> None:
        """The request left: its row is free for the next one."""
        st = self._st.pop(req, None)
        if st is not None:
            self.free.append(st.row)


def graph_max_len(model, need: int, block_size: int) -> int:
    """KV rows per slot for ``need`` positions: whole 1024s on a GPU (fewer recaptures), whole blocks elsewhere."""
    rnd = 1024 if model.device.type == "cuda" else block_size
    return -(-max(need, block_size) // rnd) * rnd


def batch_positions(requests: list[BatchRequest], block_size: int) -> int:
    """Largest canvas (positions) of ``requests`` (:func:`repro.engine.request.canvas_positions`)."""
    need = 0
    for r in requests:
        G = r.max_new_tokens if r.max_new_tokens is not None else DecoderConfig.coerce(r.decoder).max_new_tokens
        need = max(need, canvas_positions(len(r.prompt_ids), int(G or 0), block_size))
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
    max_len = graph_max_len(model, batch_positions(requests, cfg.block_size), cfg.block_size)
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
    loop = EngineLoop()
    sched = loop.scheduler(lambda: GraphExecutor(engine), slots=S, mask_id=mask_id, eos_id=eos_id)
    out = run_requests(loop, sched, requests, stats, on_result)
    stats.capture_s = engine.capture_s - cap0
    stats.wall_s = time.perf_counter() - t0
    return out, engine
