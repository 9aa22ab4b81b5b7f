"""The block-diffusion generation loop over token ids, with forward counting and TPF.

Layout (docs/engine.md §4): ``num_blocks = ceil((P + G) / B)``; the canvas is the prompt followed by
``<|mask|>`` up to ``num_blocks·B``; blocks are aligned to absolute multiples of B from position 0. The full
prompt blocks ``[0, floor(P/B)·B)`` are prefilled in **one** forward with the block-causal mask (counted
``prefill``; none when P < B). Decoding starts at block ``floor(P/B)``, whose prompt positions are never
edited. Per block the decoder (:mod:`repro.engine.decoders`) runs denoising forwards (``denoise``); when the
block is final, one ``commit`` forward writes its K/V — unless the last denoising forward already saw
exactly the final tokens (then its K/V is kept and no commit runs, docs/engine.md §6.5). Counts say what ran.

Stopping (§6.9): after each block, stop if an ``<|endoftext|>`` appears in the generated region, or when
``max_new_tokens`` generated positions exist. The last block is decoded whole; the output is truncated to
``max_new_tokens`` (so hitting the budget mid-block truncates) and then cut before the first EOS.

Bounded blocks: a block runs at most ``cfg.max_denoise_forwards()`` denoising forwards (the LLaDA2.0
reference's ``steps`` for ``low_confidence``, SGLang's ``max_steps`` with editing; docs/engine.md §6.5).
With the mask token a candidate (the default), a decoder whose proposals at the remaining masked positions
stay ``<|mask|>`` makes no progress; at the cap the block ends with its tokens as they are (masks included,
as the references emit them), its commit forward runs unless the last denoising forward already saw exactly
those tokens (then its K/V is kept, as for any block), the block index is listed in
``GenerationResult.stalled_blocks`` and a warning names it.

TPF (§6.10, the project convention): ``generated tokens up to the first EOS (EOS excluded) /
(denoise + commit forwards)``; prefill forwards are reported separately and not in the denominator.

Decoder steps: greedy decoding on a backend with ``device_stepper`` (the CUDA-graph engine,
:mod:`repro.engine.graph`) runs each round as forward + on-device step (:mod:`repro.engine.decoders.device`)
and reads one device flag per round; otherwise the host-driven decoders run (identical results, tested).

Backends: the loop talks to a :class:`ForwardBackend` — :class:`CachedBackend` (the engine: prefix KV cache) or
:class:`repro.engine.reference.ReferenceBackend` (no cache, naive) — so both run the same decoders.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import warnings

import torch

from repro.engine.decoders import DecoderConfig, make_decoder
from repro.engine.model import LLaDA2Model


class ForwardBackend(Protocol):
    """What the loop needs from a model implementation (positions are absolute token indices)."""

    model: LLaDA2Model

    def begin(self, capacity: int, block_size: int) -> None:
        """Prepare a request whose canvas has ``capacity`` positions (allocate caches here, once)."""

    def prefill(self, ids: torch.Tensor) -> None:
        """Process the full prompt blocks ``ids`` ``[n]`` (n a multiple of B) at positions 0..n-1."""

    def denoise(self, ids: torch.Tensor, start: int, embeds: torch.Tensor | None) -> torch.Tensor:
        """Logits ``[B, V]`` fp32 for the block at ``start`` given the final prefix ``< start``."""

    def commit_block(self, ids: torch.Tensor, start: int, run_forward: bool) -> None:
        """Block at ``start`` is final with tokens ``ids``; ``run_forward`` → run the commit forward."""


class CachedBackend:
    """The engine: one preallocated :class:`~repro.engine.cache.KVCache` per request (docs/engine.md §4)."""

    def __init__(self, model: LLaDA2Model):
        self.model = model
        self.cache = None

    def begin(self, capacity: int, block_size: int) -> None:
        """Allocate the KV cache for ``capacity`` positions."""
        self.cache = self.model.new_cache(capacity)
        self.block_size = block_size

    def prefill(self, ids: torch.Tensor) -> None:
        """One block-causal forward over the full prompt blocks, K/V kept."""
        self.model.forward(ids, 0, self.cache, self.block_size, logits=False)

    def denoise(self, ids, start, embeds):
        """Block forward against the cached prefix; its provisional K/V land in the block's slots."""
        return self.model.forward(ids, start, self.cache, self.block_size, embeds=embeds)

    def commit_block(self, ids, start, run_forward):
        """Commit forward (K/V of the final tokens) when needed; otherwise the last forward's K/V stay."""
        if run_forward:
            self.model.forward(ids, start, self.cache, self.block_size, logits=False)


class EagerStepBackend(CachedBackend):
    """:class:`CachedBackend` whose rounds run as forward + on-device step (:mod:`repro.engine.decoders.device`)
    eagerly, without CUDA graphs: the on-device step's decisions on any device (tests compare it with the
    host decoders on CPU). ``mask_id``: the ``<|mask|>`` id; ``rounds`` counts forward + step rounds."""

    def __init__(self, model: LLaDA2Model, mask_id: int):
        super().__init__(model)
        self.mask_id, self.rounds = mask_id, 0

    def device_stepper(self, cfg: DecoderConfig):
        """A DeviceStep over this backend's own ``[B]`` ids / ``[B, D]`` embeds buffers; None when sampling."""
        from repro.engine.decoders.device import DeviceStep, supported

        if not supported(cfg):
            return None
        m = self.model
        self.ids = torch.zeros(self.block_size, dtype=torch.long, device=m.device)
        self.emb = torch.zeros(self.block_size, m.cfg.hidden_size, dtype=m.dtype, device=m.device)
        return DeviceStep(cfg, self.mask_id, m, self.ids, self.emb)

    def denoise_step(self, st, start: int) -> None:
        """One round: block forward from the step's buffers, then its on-device step."""
        self.rounds += 1
        st.step(self.model.forward(st.tokens, start, self.cache, self.block_size,
                                   embeds=st.embeds if st.self_conditioning else None))


@dataclass
class GenerationResult:
    """Outcome of :func:`generate_ids`.

    ``token_ids``: generated ids up to (excluding) the first EOS, within ``max_new_tokens``;
    ``raw_ids``: the decoded generated positions, at most ``max_new_tokens`` (EOS and after included);
    ``forwards``: ``{"prefill", "denoise", "commit"}`` counts; ``block_forwards``: denoise + commit per
    decoded block; ``finish_reason``: ``"eos"`` | ``"length"`` | ``"stop"`` (an ``on_block`` hook stopped it);
    ``stalled_blocks``: indices of blocks that reached the forward cap without finishing (module docstring).
    """

    token_ids: list[int]
    raw_ids: list[int]
    forwards: dict[str, int]
    finish_reason: str
    block_forwards: list[int] = field(default_factory=list)
    stalled_blocks: list[int] = field(default_factory=list)

    @property
    def stall_note(self) -> str | None:
        """One readable line when blocks stalled (for records' ``forwards_note``), else None."""
        if not self.stalled_blocks:
            return None
        return (f"decoder did not finish block(s) {self.stalled_blocks} within the forward cap; their tokens were "
                "kept as they stood (the mask token is a candidate, so fills and re-masks can repeat; "
                "exclude_mask_token: true avoids it)")

    @property
    def generated_tokens(self) -> int:
        """``len(token_ids)``."""
        return len(self.token_ids)

    @property
    def tpf(self) -> float | None:
        """Tokens per forward: generated_tokens / (denoise + commit); None if no such forward ran."""
        d = self.forwards["denoise"] + self.forwards["commit"]
        return self.generated_tokens / d if d else None



def _ordinal(n: int) -> str:
    """1 -> "1st", 2 -> "2nd", 11 -> "11th" (for messages)."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"

def generate_ids(backend: ForwardBackend, prompt_ids: list[int], decoder: DecoderConfig | dict, *,
                 mask_id: int, eos_id: int, max_new_tokens: int | None = None,
                 seed: int | None = None, on_block=None) -> GenerationResult:
    """Decode a completion of ``prompt_ids`` with ``decoder`` on ``backend`` (module docstring).

    ``max_new_tokens`` overrides the decoder's (one of them must be set); ``seed`` overrides the decoder's
    sampling seed (used only when temperature > 0). ``on_block(ids: list[int]) -> bool``, if given, is called
    once per committed block with the generated ids that block adds (within ``max_new_tokens``; EOS and
    what follows included, as decoded); returning True stops decoding after that block (finish reason
    ``"stop"`` unless an EOS was decoded) — the streaming hook of :mod:`repro.engine.serve`. Raises
    ValueError on an empty prompt, a prompt token outside the vocabulary, or a missing budget. A block that
    reaches the forward cap ends there, is listed in ``stalled_blocks`` and warned about (RuntimeWarning).
    """
    cfg = DecoderConfig.coerce(decoder)
    G = max_new_tokens if max_new_tokens is not None else cfg.max_new_tokens
    if G is None or G < 1:
        raise ValueError(f"max_new_tokens must be a positive int (got {G!r}; decoder has {cfg.max_new_tokens!r})")
    P = len(prompt_ids)
    if P < 1:
        raise ValueError("prompt must contain at least one token")
    model = backend.model
    V = model.cfg.vocab_size
    bad = [t for t in prompt_ids if not 0 <= int(t) < V]
    if bad:
        raise ValueError(f"prompt token ids outside vocabulary [0, {V}): {bad[:10]}")
    B = cfg.block_size
    dev = model.device
    n_blocks = -(-(P + G) // B)
    T = n_blocks * B
    canvas = torch.full((T,), mask_id, dtype=torch.long, device=dev)
    canvas[:P] = torch.tensor(prompt_ids, dtype=torch.long, device=dev)
    dec = make_decoder(cfg, mask_id)
    dec.bind(model)
    gen = None
    if cfg.temperature > 0:
        gen = torch.Generator(device=dev).manual_seed(int(seed if seed is not None else cfg.seed))
    counts = {"prefill": 0, "denoise": 0, "commit": 0}
    per_block: list[int] = []
    stalled: list[int] = []
    backend.begin(T, B)
    first = P // B
    if first > 0:
        backend.prefill(canvas[: first * B])
        counts["prefill"] += 1
    positions = torch.arange(T, device=dev)
    cap = cfg.max_denoise_forwards()
    make_stepper = getattr(backend, "device_stepper", None)  # backends with an on-device decoder step
    stepper = make_stepper(cfg) if make_stepper is not None else None
    finish = "length"
    end = P
    for b in range(first, n_blocks):
        s = b * B
        end = s + B
        editable = positions[s:s + B] >= P
        if stepper is not None:
            tokens, n_fwd, reuse, done = _device_block(backend, stepper, canvas[s:s + B], editable, s, cap)
        else:
            tokens, n_fwd, reuse, done = _host_block(backend, dec, canvas[s:s + B].clone(), editable, s, cap, gen)
        if not done:
            stalled.append(b)
            left = int(((tokens == mask_id) & editable).sum())
            why = (f"{left} <|mask|> left as they are (the mask token is a candidate; set exclude_mask_token: true "
                   "to exclude it)" if left else
                   f"no <|mask|> left, but edits kept changing tokens (edit threshold {cfg.edit_threshold}); the "
                   "tokens are kept as they stood")
            warnings.warn(f"decoder {cfg.algorithm} did not finish block {b} (counted over prompt + generation; the "
                          f"{_ordinal(b - first + 1)} generated) within {cap} denoising forwards; {why}",
                          RuntimeWarning, stacklevel=2)
        backend.commit_block(tokens, s, run_forward=not reuse)
        counts["denoise"] += n_fwd
        counts["commit"] += 0 if reuse else 1
        per_block.append(n_fwd + (0 if reuse else 1))
        canvas[s:s + B] = tokens
        if on_block is not None and on_block(canvas[max(s, P):min(P + G, s + B)].tolist()):
            finish = "stop"
            break
        if bool((canvas[P:s + B] == eos_id).any()):
            break
        if s + B - P >= G:
            break
    raw = canvas[P:min(P + G, end)].tolist()
    out = raw
    if eos_id in raw:
        out = raw[: raw.index(eos_id)]
        finish = "eos"
    return GenerationResult(token_ids=out, raw_ids=raw, forwards=counts, finish_reason=finish,
                            block_forwards=per_block, stalled_blocks=stalled)


def _host_block(backend, dec, tokens, editable, s, cap, gen):
    """Decode one block with the host-driven decoder; returns (tokens, denoise forwards, reuse, finished)
    — ``finished`` False when the block stopped at ``cap`` forwards."""
    dec.start_block()
    last_input = None
    n_fwd = 0
    done = True
    while not dec.before_forward(tokens, editable):
        if n_fwd >= cap:
            done = False
            break
        logits = backend.denoise(tokens, s, dec.input_embeds(tokens, editable))
        n_fwd += 1
        last_input = tokens.clone()
        if dec.step(logits, tokens, editable, gen):
            break
    return tokens, n_fwd, last_input is not None and bool(torch.equal(last_input, tokens)), done


def _device_block(backend, stepper, tokens, editable, s, cap):
    """Decode one block with the on-device step (:mod:`repro.engine.decoders.device`): one host read of the
    device "final" flag per round, nothing else; returns (tokens, denoise forwards, reuse, finished).
    A backend with ``denoise_steps(stepper, start, cap) -> (forwards, finished)`` runs the loop itself (the
    batched graph scheduler: no thread handoff per round); it must stop exactly where this loop stops — after
    the round whose flags say final, or after ``cap`` rounds (``finished`` False) — and is called only when
    the block is not final before its first round and ``cap > 0``."""
    stepper.start_block(tokens, editable)
    many = getattr(backend, "denoise_steps", None)  # backends that run the whole loop below in one call
    if many is not None:
        if bool(stepper.final):
            n_fwd, done = 0, True
        elif cap <= 0:
            n_fwd, done = 0, False
        else:
            n_fwd, done = many(stepper, s, cap)
        return stepper.tokens.clone(), n_fwd, bool(stepper.reuse()), done
    n_fwd = 0
    done = True
    while not bool(stepper.final):
        if n_fwd >= cap:
            done = False
            break
        backend.denoise_step(stepper, s)
        n_fwd += 1
    return stepper.tokens.clone(), n_fwd, bool(stepper.reuse()), done
