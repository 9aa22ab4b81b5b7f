"""``LLM``: the user-facing engine API (docs/interfaces.md "Engine API"; mirrors the model-card usage).

    llm = LLM(path, role="orl" | "base", precision="fp32" | "bf16", device="cpu" | "cuda")
    out = llm.generate(prompt_or_messages, decoder=None, max_new_tokens=None, seed=None)

* ``role="orl"`` loads the ORL residual adapter (when config.json declares one) and defaults to the
  ``llada-orl`` decoder of the checkpoint's ``paper_decoding.json`` (packaged copy if absent); ``"base"``
  skips the adapter and defaults to the ``llada`` decoder (LLaDA2.1 S mode).
* ``prompt_or_messages``: a ``str`` is used **as is** (already chat-formatted, as SGLang expects); a list of
  ``{"role", "content"}`` messages is rendered with the checkpoint's chat template (jinja2) with the
  generation prompt appended.
* Timing: ``wall_s`` covers decoding (from the request taking its slot in the engine loop through its last
  op, CUDA synchronised), not tokenisation or template rendering; ``request_tps = generated_tokens / wall_s``.
* Every request goes through the LLM's one engine loop (:mod:`repro.engine.loop`, its own thread): one rule,
  :meth:`LLM.engine_for`, picks the engine; ``generate``, ``generate_batch`` and the server
  (:meth:`LLM.scheduler`) may share one LLM from several threads — the loop's thread alone touches the model
  and the GPU (CUDA-graph captures included).
* TPF = generated tokens up to the first EOS (EOS excluded) / (denoise + commit forwards); prefill
  forwards are reported separately (docs/engine.md §6.10; :mod:`repro.engine.decode_loop`).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from repro.engine.batch import EagerExecutor
from repro.engine.config import LLaDA2Config
from repro.engine.decoders import DecoderConfig
from repro.engine.decoders.device import device_step_problem
from repro.engine.decode_loop import BackendExecutor, CachedBackend
from repro.engine.loop import BatchStats, EngineLoop, Request, Scheduler
from repro.engine.model import LLaDA2Model, resolve_precision
from repro.engine.request import budget_of, canvas_positions
from repro.engine.tokenizer import ChatTokenizer

log = logging.getLogger("repro.engine")

ROLES = {"orl": "llada-orl", "base": "llada"}


@dataclass
class GenerateOutput:
    """Result of :meth:`LLM.generate` (fields of docs/interfaces.md).

    ``text`` (completion up to the first EOS, special tokens skipped), ``token_ids`` (ids up to, excluding,
    the first EOS), ``prompt_tokens``, ``generated_tokens`` (== len(token_ids)), ``forwards``
    (``{"prefill", "denoise", "commit"}``), ``tpf`` (tokens per denoise+commit forward, None if none ran),
    ``wall_s`` (seconds), ``request_tps`` (tokens/s), ``finish_reason`` (``"eos"`` | ``"length"`` |
    ``"stop"``: stopped by an ``on_block`` hook),
    ``prompt_text``, ``decoder`` (settings used), ``raw_token_ids`` (decoded positions incl. EOS and after),
    ``block_forwards`` (denoise + commit per block), ``stalled_blocks`` (blocks stopped at the decoder's
    forward cap, :mod:`repro.engine.decode_loop`) and ``note`` (one line saying so, else None).
    """

    text: str
    token_ids: list[int]
    prompt_tokens: int
    generated_tokens: int
    forwards: dict
    tpf: float | None
    wall_s: float
    request_tps: float
    finish_reason: str
    prompt_text: str = ""
    decoder: dict = field(default_factory=dict)
    raw_token_ids: list[int] = field(default_factory=list)
    block_forwards: list[int] = field(default_factory=list)
    stalled_blocks: list[int] = field(default_factory=list)
    note: str | None = None

    def to_dict(self) -> dict:
        """JSON-ready dict of all fields."""
        return dict(self.__dict__)


def _default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _select_kernels(kernels: str, device: str) -> str:
    """Select the MoE/attention implementations in the layer seams; return the name in use."""
    from repro.engine.layers import attention, moe

    want = kernels
    if kernels == "auto":
        want = "torch"
        if str(device).startswith("cuda"):
            try:
                import triton  # noqa: F401

                want = "triton"
            except ImportError:
                pass
    if want == "triton":
        from repro.engine.kernels import register_with_seams
        from repro.engine.kernels._triton import require_tested_triton

        if str(device).startswith("cuda"):
            require_tested_triton()  # the GPU kernels run only on the tested Triton (repro/stack.py)

        register_with_seams(select=True)
    else:
        moe.set_moe_impl("torch")
        attention.set_attention_impl("torch")
    return want


def adapter_note(path, role: str, cfg: LLaDA2Config) -> str:
    """One line saying what ``role`` runs on this checkpoint's adapter (recorded in provenance)."""
    if role == "base":
        return "role base: the ORL adapter (if any) is not loaded; LLaDA2.1 decoder defaults"
    if cfg.adapter is not None:
        return (f"role orl: ORL residual adapter loaded ({cfg.adapter.type}, tensors "
                f"{sorted(cfg.adapter.tensors.values())})")
    return (f"role orl on {path}: the checkpoint declares no ORL residual adapter (no orl_residual_adapter in "
            "config.json, no adapter_map.json); this runs the ORL decoder settings with adapter-free "
            "self-conditioning, the RCD interpolation (1 - w)·E[mask] + w·Δ at T_res = 1.0 — not the ORL model. "
            "Use role base for the base model, or map the checkpoint's adapter tensors (docs/adapter_map.md)")



def context_problem(n_prompt: int, budget: int | None, context: int, budget_name: str = "max_new_tokens") -> str | None:
    """Why a prompt of ``n_prompt`` tokens plus ``budget`` new tokens does not fit a model ``context`` (tokens,
    ``max_position_embeddings``), or None when it fits (``budget`` None: the prompt alone). The one wording of
    :meth:`LLM.generate` and the server (``budget_name``: the request field it names)."""
    if n_prompt >= context:
        return f"the prompt has {n_prompt} tokens, the model context is {context}; shorten it"
    if budget is not None and budget > context - n_prompt:
        return (f"{budget_name}={budget} does not fit: the prompt has {n_prompt} tokens and the model context is "
                f"{context}; ask for at most {context - n_prompt}")
    return None

class LLM:
    """A loaded LLaDA2 checkpoint plus tokenizer and default decoder.

    ``path``: checkpoint directory (config.json, safetensors, tokenizer files). ``role``: ``"orl"`` |
    ``"base"``. ``precision``: ``"fp32"`` | ``"bf16"`` | ``"nvfp4-w4a16"`` (router always fp32; None = bf16 on
    CUDA, fp32 on the CPU; :data:`repro.engine.model.PRECISIONS`): on an NVFP4 checkpoint ``fp32``/``bf16``
    dequantize the experts once at load, ``nvfp4-w4a16`` keeps them packed (4 bits) and dequantizes them
    to the same values (on a GPU inside the MoE kernels, on the CPU per forward in torch); ``"nvfp4"`` (native FP4, Blackwell) raises ValueError saying
    so. ``device``: ``"cpu"`` |
    ``"cuda"`` | ``"cuda:N"`` (default: cuda when available). ``backend``: ``"engine"`` (cached) or
    ``"reference"`` (the naive oracle, for tests). ``graphs``: ``"auto"`` (every forward a CUDA-graph replay of
the Triton block forward, :mod:`repro.engine.graph`, when on CUDA with triton and a supported shape; the
chosen path is in ``engine_path``: ``"cuda-graph"`` | ``"eager"`` | ``"reference"``), ``"on"`` (required; raises
ValueError when unsupported) or ``"off"``. ``tensor_parallel_size``: N > 1 splits every request over N ranks
    (experts, heads, dense widths, vocabulary; :mod:`repro.engine.parallel`): this process is rank 0 and spawns
    ranks 1..N-1 (:mod:`repro.engine.ranks`; GPUs ``cuda:0..N-1``, or N gloo processes on the CPU); the eager
    path runs (``engine_path`` ``"eager"``); ``tp_timeout_s`` bounds each collective; :meth:`close` stops the
    ranks. ValueError when N does not divide the model or exceeds the GPUs, TensorParallelError when a rank
    fails. ``kernels``: ``"auto"`` (Triton MoE + block attention
    from ``repro.engine.kernels`` on CUDA when triton imports, else torch), ``"torch"`` or ``"triton"``;
    the Triton implementations register into the same seams as the torch ones and fall back to them
    outside their fast case. Raises ValueError for a bad role/precision/kernels, and the
    ConfigError / WeightLoadError / TokenizerError of the loaders for a bad checkpoint.
    """

    def __init__(self, path: str | Path, role: str = "orl", precision: str | None = None, device: str | None = None,
                 backend: str = "engine", kernels: str = "auto", graphs: str = "auto",
                 adapter_map: str | Path | None = None, tensor_parallel_size: int = 1,
                 tp_timeout_s: float | None = None):
        if kernels not in ("auto", "torch", "triton"):
            raise ValueError(f"kernels must be 'auto', 'torch' or 'triton', got {kernels!r}")
        if graphs not in ("auto", "on", "off"):
            raise ValueError(f"graphs must be 'auto', 'on' or 'off', got {graphs!r}")
        if role not in ROLES:
            raise ValueError(f"role must be one of {sorted(ROLES)}, got {role!r}")
        if backend not in ("engine", "reference"):
            raise ValueError(f"backend must be 'engine' or 'reference', got {backend!r}")
        self.device = device or _default_device()
        if precision is None:  # the CLI's and the pipeline's default: bf16 on a GPU, fp32 on the CPU
            precision = "bf16" if str(self.device).startswith("cuda") else "fp32"
        self.path, self.role, self.precision = Path(path), role, precision
        dev = str(self.device)
        if not (dev == "cpu" or dev == "cuda" or (dev.startswith("cuda:") and dev[5:].isdigit())):
            raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")
        if kernels == "triton" and not dev.startswith("cuda"):
            raise ValueError("kernels='triton' needs a CUDA device (on the CPU the engine runs its torch "
                             "implementations); use kernels='auto' or 'torch'")
        if str(self.device).startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device {self.device!r} requested but no CUDA GPU is usable here "
                             f"(torch {torch.__version__}, torch.cuda.is_available() is False); use the CPU "
                             "(device='cpu'; on the command line --device cpu)")
        self.kernels = _select_kernels(kernels, self.device)
        resolve_precision(precision, self.device)
        self.config = LLaDA2Config.from_file(self.path, adapter_map)
        self.tokenizer_ = ChatTokenizer(self.path)
        if self.tokenizer_.vocab_size > self.config.vocab_size:
            raise ValueError(f"tokenizer has {self.tokenizer_.vocab_size} tokens but config vocab_size is "
                             f"{self.config.vocab_size}")
        self.tensor_parallel_size, self.ranks = tensor_parallel_size, None
        if tensor_parallel_size != 1:
            self.model = self._start_ranks(tensor_parallel_size, backend, graphs, adapter_map, tp_timeout_s)
        else:
            self.model = LLaDA2Model.from_pretrained(self.path, self.device, precision,
                                                     with_adapter=(role == "orl"), cfg=self.config)
        self.adapter_note = adapter_note(self.path, role, self.config)
        if role == "orl" and self.config.adapter is None:
            warnings.warn(self.adapter_note, UserWarning, stacklevel=2)
        # capture seconds of every batched CUDA-graph engine built so far, rebuilt ones included (graph_capture_s)
        self._batch_capture_s, self._batch_running = 0.0, False
        if self.ranks is not None:
            self.backend, self.engine_path = None, "eager"  # every rank runs the eager engine in step
        elif backend == "engine":
            self.backend, self.engine_path = self._engine_backend(graphs)
        else:
            self.engine_path = "reference"
            from repro.engine.reference import ReferenceBackend
            self.backend = ReferenceBackend(self.model)
        self.paper_decoding = self._paper_decoding()
        sync = None
        if self.ranks is not None:  # rank 0 broadcasts each iteration's admissions; followers run the same loop
            from repro.engine.ranks import RankSync
            sync = RankSync(self.ranks)
        self.loop = EngineLoop(threaded=True, device=self.model.device, sync=sync)
        self._scheds: dict = {}
        self._sched_lock = threading.Lock()

    def _start_ranks(self, n, backend: str, graphs: str, adapter_map, timeout_s):
        """Check that ``n`` ranks can split this model here, start them; returns rank 0's model."""
        from repro.engine.parallel import parallel_problem
        from repro.engine.ranks import DEFAULT_TIMEOUT_S, Ranks, check_devices

        why = parallel_problem(self.config, n)
        if why:
            raise ValueError(f"{self.path}: {why}")
        if backend != "engine" or graphs == "on":
            raise ValueError("tensor_parallel_size > 1 runs the eager engine (backend='engine', graphs 'auto' or "
                             "'off'); the CUDA-graph and reference paths run on one rank")
        if self.precision == "nvfp4-w4a16" and self.config.quantization is None:
            raise ValueError(f"{self.path}: precision 'nvfp4-w4a16' keeps an NVFP4 checkpoint's routed experts "
                             "packed, but config.json has no quantization_config (not an NVFP4 checkpoint); use "
                             "precision 'bf16' or 'fp32'")
        check_devices(self.device, n)
        spec = dict(path=str(self.path), role=self.role, precision=self.precision, device=str(self.device),
                    adapter_map=None if adapter_map is None else str(adapter_map), kernels=self.kernels)
        self.ranks = Ranks(spec, n, DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s)
        return self.ranks.model

    def close(self) -> None:
        """Close the engine loop (queued and running requests fail) and stop the ranks of a tensor-parallel LLM.
        Idempotent."""
        loop = getattr(self, "loop", None)
        if loop is not None:
            loop.close(RuntimeError("the LLM is closed"))
        if self.ranks is not None:
            self.ranks.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _engine_backend(self, graphs: str):
        """(backend, name): the CUDA-graph path (:mod:`repro.engine.graph`) when ``graphs`` allows and the
        model/device support it, else the eager cached path. ``graphs="on"`` raises ValueError naming why
        the graph path cannot run."""
        from repro.engine.graph import GraphBackend, unsupported_reason

        if graphs != "off":
            block = self.default_decoder_block_size()
            why = unsupported_reason(self.config, block, self.device)
            if why is None and self.kernels != "triton":
                why = f"kernels={self.kernels!r} (the graph path runs the Triton kernels)"
            if why is None:
                return GraphBackend(self.model, self.tokenizer_.mask_id), "cuda-graph"
            if graphs == "on":
                raise ValueError(f"graphs='on' but the CUDA-graph engine path cannot run here: {why}")
        return CachedBackend(self.model), "eager"

    def default_decoder_block_size(self) -> int:
        """Block size of the packaged/checkpoint ``paper_decoding.json`` engine block (32 unless it says)."""
        return int(self._paper_decoding().get("engine", {}).get("block_size", 32))

    # ------------------------------------------------------------------ properties of the interface
    @property
    def tokenizer(self):
        """The ``tokenizers.Tokenizer`` of the checkpoint."""
        return self.tokenizer_.tokenizer

    @property
    def mask_id(self) -> int:
        """Id of ``<|mask|>`` (found by string)."""
        return self.tokenizer_.mask_id

    @property
    def eos_id(self) -> int:
        """Id of ``<|endoftext|>`` (found by string)."""
        return self.tokenizer_.eos_id

    def apply_chat_template(self, messages: list[dict]) -> str:
        """Chat-formatted prompt string (generation prompt appended)."""
        return self.tokenizer_.apply_chat_template(messages, add_generation_prompt=True)

    @property
    def graph_capture_s(self) -> float | None:
        """Seconds this loaded model has spent capturing CUDA graphs since it was loaded: the single-request
        graph path's (:class:`repro.engine.graph.GraphBackend`, whose graphs live as long as the model) plus
        every batched graph engine's (:mod:`repro.engine.batch_graph`), engines since rebuilt for another batch
        size, decoder or cache length included. Cumulative: it never goes down, so the difference of two
        reads is what was captured in between (e.g. per benchmark of a job serving several). A batched call's
        capture is counted when the call returns: None while one runs (what it captured is not known yet), and
        None when no graph path can run here (``engine_path`` not ``"cuda-graph"``: the CPU, eager, reference)."""
        if self.engine_path != "cuda-graph" or self._batch_running:
            return None
        return float(getattr(self.backend, "capture_s", 0.0)) + self._batch_capture_s

    # ------------------------------------------------------------------ decoder defaults
    def _paper_decoding(self) -> dict:
        p = self.path / "paper_decoding.json"
        if not p.is_file():
            from repro.paper import DEFAULT_PAPER_DECODING
            p = DEFAULT_PAPER_DECODING
        return json.loads(Path(p).read_text())

    def default_decoder(self) -> DecoderConfig:
        """The role's decoder from ``paper_decoding.json`` (suite ``main``, defaults) plus its engine block."""
        pd = self.paper_decoding
        eng = pd.get("engine", {})
        d = dict(pd["suites"]["main"][ROLES[self.role]]["defaults"])
        d.setdefault("block_size", eng.get("block_size", 32))
        d.setdefault("temperature", eng.get("temperature", 0.0))
        return DecoderConfig.from_dict(d)

    # ------------------------------------------------------------------ the path rule and the schedulers
    def engine_for(self, cfg: DecoderConfig, batch: bool) -> str:
        """The one rule that decides which engine decodes a request with decoder ``cfg``; ``batch``: it decodes
        beside others (``generate_batch``, the server) rather than alone (``generate``). Returns
        ``"reference"`` (``backend="reference"``), ``"cuda-graph"`` (alone, on the single-request graph path
        :class:`~repro.engine.graph.GraphBackend`: ``engine_path`` ``"cuda-graph"`` and 32-token blocks; sampling
        runs the host decoders over its graphs), ``"batched-cuda-graph"`` (beside others on the same conditions,
        with a decoder the on-device step implements: :mod:`repro.engine.batch_graph`; in the server, requests
        with another decoder run the host decoders on its replays) or ``"eager"`` (everything else: the CPU,
        tensor parallelism, other block sizes, sampling in a batch: :mod:`repro.engine.batch`)."""
        if self.engine_path == "reference":
            return "reference"
        if self.engine_path != "cuda-graph" or cfg.block_size != 32:
            return "eager"
        if not batch:
            return "cuda-graph"
        return "batched-cuda-graph" if device_step_problem(cfg) is None else "eager"

    def _executor(self, path: str, cfg: DecoderConfig | None = None, slots: int = 1, max_len: int = 0):
        """The executor of ``path`` (built on the loop's thread): graph engines are captured here."""
        if path in ("cuda-graph", "reference"):
            return BackendExecutor(self.backend)
        if path == "eager":
            tp = self.ranks is not None  # every rank steps on the device, and no rank retries a round alone
            return EagerExecutor(self.model, self.mask_id, device_steps=tp, isolate=not tp)
        from repro.engine.batch_graph import BatchGraphEngine, GraphExecutor

        if self.model.device.type == "cuda":
            torch.cuda.empty_cache()
        engine = BatchGraphEngine(self.model, self.mask_id, cfg, slots, max_len)
        engine.capture()
        return GraphExecutor(engine)

    def _scheduler(self, key: tuple, spec, build, slots: int) -> Scheduler:
        """The kept scheduler ``key`` if it was built for ``spec`` (a graph engine also when it has at least the
        positions asked), else a new one (the old one retires: freed once its requests ended)."""
        with self._sched_lock:
            s = self._scheds.get(key)
            fits = s is not None and not s.retired and (
                s.spec == spec or (isinstance(spec, tuple) and len(spec) == 3 and s.spec[:2] == spec[:2]
                                   and s.spec[2] >= spec[2]))
            if fits:
                return s
            if s is not None:
                s.retire()
            s = self._scheds[key] = self.loop.scheduler(build, slots, self.mask_id, self.eos_id, name="/".join(key))
            s.spec = spec
            return s

    def _single(self, path: str) -> Scheduler:
        return self._scheduler(("single", path), path, lambda: self._executor(path), 1)

    def scheduler(self, max_batch: int, positions: int | None = None) -> Scheduler:
        """A new scheduler of ``max_batch`` slots for the default decoder (the server's; public factory): on the
        batched graph path (:meth:`engine_for`) a :class:`~repro.engine.batch_graph.BatchGraphEngine` whose slots hold
        ``positions`` positions (default: the context; rounded up to 1024s), captured before this returns
        (falls back to the eager engine, logged, when it cannot be built); otherwise the eager batched forward.
        Submit :class:`~repro.engine.loop.Request`\\ s to it; ``retire()`` it when done."""
        cfg = self.default_decoder()
        path = self.engine_for(cfg, batch=True)

        def build():
            if path == "batched-cuda-graph":
                from repro.engine.batch_graph import graph_max_len

                try:
                    need = positions or int(self.config.max_position_embeddings)
                    return self._executor(path, cfg, max_batch, graph_max_len(self.model, need, cfg.block_size))
                except Exception:  # noqa: BLE001 - e.g. no memory for the slots: serve on the eager engine
                    log.exception("cannot build the batched CUDA-graph engine; serving on the eager batched engine")
            return self._executor("eager")

        s = self.loop.scheduler(build, max_batch, self.mask_id, self.eos_id, name=f"server/{path}")
        s.ready()
        return s

    @property
    def batch_engine(self):
        """The batched CUDA-graph engine :meth:`generate_batch` keeps (None before one ran, or off the graph path)."""
        s = self._scheds.get(("batch", "batched-cuda-graph"))
        return getattr(s.executor, "engine", None) if s is not None and not s.retired else None

    def _submit(self, sched: Scheduler, req: Request) -> Request:
        if threading.current_thread() is self.loop.thread:
            raise RuntimeError("LLM.generate / generate_batch called from the engine loop's own thread (an on_block "
                               "hook?); call it from another thread")
        return sched.submit(req)

    # ------------------------------------------------------------------ generation
    def generate(self, prompt_or_messages, decoder=None, max_new_tokens: int | None = None,
                 seed: int | None = None, on_block=None, batch_size: int | None = None):
        """Generate one completion (see module docstring), or a list of them batched.

        ``prompt_or_messages``: a ``str`` / a list of chat-message dicts → one :class:`GenerateOutput`; a list
        of prompts (each a ``str`` or a message list) → a list of :class:`GenerateOutput` in input order,
        decoded together ``batch_size`` at a time (default 8) with continuous batching (:meth:`generate_batch`:
        the batched CUDA-graph path or the eager batched engine; greedy outputs are bit-identical at every batch
        size of the path that runs — on the CPU also to one at a time). ``decoder``: dict of
        engine keys or :class:`DecoderConfig` (None → :meth:`default_decoder`); ``max_new_tokens`` / ``seed``
        override the decoder's; ``on_block``: per-block streaming hook of :func:`repro.engine.request.decode`
        (single prompt only; called on the engine loop's thread; its time is inside ``wall_s``; returning True
        stops decoding, finish reason ``"stop"``). The path: :meth:`engine_for`. Raises TypeError for a prompt of
        another type, ValueError for an empty list, ``on_block`` with a list, a bad ``batch_size``, or a prompt
        plus ``max_new_tokens`` over the model's context, DecoderConfigError for bad settings."""
        if isinstance(prompt_or_messages, list) and not prompt_or_messages:
            raise ValueError("got an empty list: nothing to generate; pass a prompt (a str or a list of chat-message "
                             "dicts) or a non-empty list of prompts")
        if isinstance(prompt_or_messages, list) and prompt_or_messages and all(
                isinstance(x, (str, list)) for x in prompt_or_messages):
            if on_block is not None:
                raise ValueError("on_block streams one request; pass a single prompt, not a list")
            return self.generate_batch(prompt_or_messages, decoder, max_new_tokens, seed,
                                       batch_size=8 if batch_size is None else batch_size)
        if batch_size is not None:
            raise ValueError("batch_size applies to a list of prompts; got a single prompt")
        prompt_text = self._prompt_text(prompt_or_messages)
        cfg = self.default_decoder() if decoder is None else DecoderConfig.coerce(decoder)
        ids = self.tokenizer_.encode(prompt_text)
        self._check_fits(len(ids), cfg, max_new_tokens)
        req = self._submit(self._single(self.engine_for(cfg, batch=False)),
                           Request(ids, cfg, max_new_tokens, seed, on_block=on_block))
        try:
            res = req.wait()
        except KeyboardInterrupt:
            req.cancel()  # the caller gave up: the loop stops the request at its next round
            raise
        return self._output(res, req.wall_s, prompt_text, len(ids), cfg, max_new_tokens, seed)

    def generate_batch(self, prompts: list, decoder=None, max_new_tokens: int | None = None,
                       seed: int | None = None, batch_size: int = 8, on_result=None, stats=None):
        """Batched :meth:`generate` over ``prompts`` (each a ``str`` or a message list; one decoder for all):
        a list of :class:`GenerateOutput` in input order. ``on_result(index, GenerateOutput)`` is called on the
        calling thread as each finishes; ``stats``: a :class:`repro.engine.loop.BatchStats` to fill (rounds,
        round times, ``engine``, ``capture_s``; the latter is also added to :attr:`graph_capture_s`). Path
        (:meth:`engine_for` with ``batch``): the batched graph path (:mod:`repro.engine.batch_graph`: one replay per
        round over ``min(batch_size, len(prompts))`` slots, captured once and kept for the next call with the
        same slots and decoder), or the eager batched forward (:mod:`repro.engine.batch`; also every rank under
        tensor parallelism), ``batch_size`` requests at a time. ``wall_s`` = the request's time from admission
        to its last op. The first request error stops the others and is raised. Raises as :meth:`generate`."""
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer ≥ 1, got {batch_size!r}")
        cfg = self.default_decoder() if decoder is None else DecoderConfig.coerce(decoder)
        texts = [self._prompt_text(p) for p in prompts]
        ids = [self.tokenizer_.encode(t) for t in texts]
        for i, x in enumerate(ids):
            self._check_fits(len(x), cfg, max_new_tokens, f"prompt {i}: ")
        stats = stats if stats is not None else BatchStats()
        path = self.engine_for(cfg, batch=True)
        if path == "batched-cuda-graph":
            from repro.engine.batch_graph import graph_max_len, settings_key

            S = min(batch_size, len(ids))
            need = max(canvas_positions(len(x), budget_of(cfg, max_new_tokens) or 0, cfg.block_size) for x in ids)
            max_len = graph_max_len(self.model, need, cfg.block_size)
            sched = self._scheduler(("batch", path), (S, settings_key(cfg), max_len),
                                    lambda: self._executor(path, cfg, S, max_len), S)
        elif path == "eager":
            sched = self._scheduler(("batch", path), batch_size, lambda: self._executor(path), batch_size)
        else:  # the reference: one at a time
            sched = self._single(path)
        done: queue.Queue = queue.Queue()
        reqs = [Request(x, cfg, max_new_tokens, seed, stats=stats, index=i, on_done=done.put)
                for i, x in enumerate(ids)]
        stats.admitted_at_round = [0] * len(reqs)
        before = getattr(sched.executor, "capture_s", 0.0)
        graph = path == "batched-cuda-graph"
        self._batch_running = self._batch_running or graph
        t0 = time.perf_counter()
        outs: list = [None] * len(reqs)
        error = None
        try:
            for r in reqs:
                self._submit(sched, r)
            for _ in reqs:
                r = done.get()
                if r.error is not None and error is None:
                    error = r.error
                    for other in reqs:
                        other.cancel()
                elif error is None:
                    outs[r.index] = self._output(r.result, r.wall_s, texts[r.index], len(ids[r.index]), cfg,
                                                 max_new_tokens, seed)
                    if on_result is not None:
                        on_result(r.index, outs[r.index])
        except BaseException:
            for r in reqs:
                r.cancel()
            raise
        finally:
            stats.wall_s = time.perf_counter() - t0
            stats.capture_s = getattr(sched.executor, "capture_s", 0.0) - before if sched.executor else 0.0
            if graph:
                self._batch_running = False
                self._batch_capture_s += stats.capture_s  # this call's capture (a rebuilt engine's all of it)
        if error is not None:
            raise error
        return outs

    def _check_fits(self, n_prompt: int, cfg, max_new_tokens: int | None, where: str = "") -> None:
        """Refuse a request the model's context cannot hold, before any cache is allocated (a 10^8-token budget
        once asked the allocator for 38 GB): ValueError with :func:`context_problem`'s words, as the server's 400."""
        budget = cfg.max_new_tokens if max_new_tokens is None else max_new_tokens
        problem = context_problem(n_prompt, budget, int(self.config.max_position_embeddings))
        if problem:
            raise ValueError(where + problem)

    def _prompt_text(self, prompt_or_messages) -> str:
        if isinstance(prompt_or_messages, str):
            return prompt_or_messages
        if isinstance(prompt_or_messages, list):
            return self.apply_chat_template(prompt_or_messages)
        raise TypeError(f"prompt must be str or list of chat messages, got {type(prompt_or_messages).__name__}")

    def _output(self, res, wall: float, prompt_text: str, prompt_tokens: int, cfg: DecoderConfig,
                max_new_tokens, seed) -> GenerateOutput:
        used = cfg.to_dict()
        if max_new_tokens is not None:
            used["max_new_tokens"] = max_new_tokens
        if seed is not None:
            used["seed"] = seed
        return GenerateOutput(
            text=self.tokenizer_.decode(res.token_ids), token_ids=res.token_ids, prompt_tokens=prompt_tokens,
            generated_tokens=res.generated_tokens, forwards=dict(res.forwards), tpf=res.tpf, wall_s=wall,
            request_tps=res.generated_tokens / wall if wall > 0 else 0.0, finish_reason=res.finish_reason,
            prompt_text=prompt_text, decoder=used, raw_token_ids=res.raw_ids, block_forwards=res.block_forwards,
            stalled_blocks=res.stalled_blocks, note=res.stall_note)
