"""One request's block-diffusion decoding as a program the engine loop advances: :func:`decode`.

Where things stand: every request — ``LLM.generate``, ``LLM.generate_batch``, the pipeline's generation jobs,
the server, one rank or N — runs this program inside the one engine loop (:mod:`repro.engine.loop`). The
program is a Python generator: it yields an **op** (what it needs from the engine next) and is resumed with
the op's result. The loop hands ops to an executor (the eager batched forward, :mod:`repro.engine.batch`; the
batched CUDA-graph engine, :mod:`repro.engine.batch_graph`; one backend such as the single-request graph path,
:mod:`repro.engine.decode_loop`), which runs the ops of all active requests together, one round at a time.
No thread per request: a request is its generator plus a few plain fields.

Ops (tensors on the model device): :class:`Begin` (capacity, block size, decoder → the executor allocates the
request's KV cache or slot and answers whether its on-device step runs this decoder), :class:`Prefill` (full
prompt blocks ``ids [n]`` at ``start``, K/V kept; a prompt is prefilled in chunks of at most
:data:`PREFILL_CHUNK` tokens, one op each, so that others keep decoding between them), :class:`Denoise`
(logits ``[B, V]`` fp32 of the block at ``start``), :class:`Commit` (the block's commit forward when
``run_forward``), :class:`Steps` (the whole denoising loop of one block on the on-device step:
``(tokens [B], forwards, reuse, finished)``). The program refuses (one line) an executor's offer of the
on-device step for a decoder whose module does not declare ``ON_DEVICE``
(:func:`repro.engine.decoders.device.device_step_problem`): such a decoder runs on its host rules only.

Layout (docs/engine.md §4): ``num_blocks = ceil((P + G) / B)``; the canvas is the prompt followed by
``<|mask|>`` up to ``num_blocks·B``; blocks are aligned to absolute multiples of B from position 0. The full
prompt blocks ``[0, floor(P/B)·B)`` are prefilled with the block-causal mask (one ``prefill`` pass, counted
once, whatever its chunks; none when P < B). Decoding starts at block ``floor(P/B)``, whose prompt positions
are never edited. Per block the decoder (:mod:`repro.engine.decoders`) runs denoising forwards (``denoise``);
when the block is final, one ``commit`` forward writes its K/V — unless the last denoising forward already saw
exactly the final tokens (then its K/V is kept and no commit runs, docs/engine.md §6.5).

Stopping (§6.9): after each block, stop if an ``<|endoftext|>`` appears in the generated region, or when
``max_new_tokens`` generated positions exist. The last block is decoded whole; the output is truncated to
``max_new_tokens`` and then cut before the first EOS. A :class:`Cancelled` thrown into the program ends it at
once with the committed blocks so far (finish reason ``"cancelled"``).

Bounded blocks: a block runs at most ``cfg.max_denoise_forwards()`` denoising forwards; at the cap it ends with
its tokens as they are, is listed in ``GenerationResult.stalled_blocks`` and a RuntimeWarning names it.

TPF (§6.10): ``generated tokens up to the first EOS (EOS excluded) / (denoise + commit forwards)``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch

from repro.engine.decoders import DecoderConfig, make_decoder
from repro.engine.decoders.device import device_step_problem

#: Most prompt tokens one prefill op carries (rounded down to whole blocks, at least one block): a long prompt
#: is prefilled in chunks between the other requests' rounds (as SGLang's chunked prefill), and a chunk's
#: attention workspace is ``[heads, chunk, prefix]`` instead of ``[heads, P, P]``.
PREFILL_CHUNK = 512


@dataclass
class Begin:
    """First op: allocate for ``capacity`` positions of ``block_size`` blocks; reply: True when the executor's
    on-device step runs ``decoder`` (then each block is one :class:`Steps`), else False (host decoders)."""

    capacity: int
    block_size: int
    decoder: DecoderConfig


@dataclass
class Prefill:
    """Full prompt blocks ``ids`` ``[n]`` int64 at positions ``start .. start+n-1`` (K/V kept, no logits)."""

    ids: torch.Tensor
    start: int


@dataclass
class Denoise:
    """One denoising forward of the block at ``start``: ``ids`` ``[B]``, optional ``embeds`` ``[B, D]``;
    reply: logits ``[B, V]`` fp32."""

    ids: torch.Tensor
    start: int
    embeds: torch.Tensor | None


@dataclass
class Commit:
    """The block at ``start`` is final with ``ids`` ``[B]``; ``run_forward``: run its commit forward."""

    ids: torch.Tensor
    start: int
    run_forward: bool


@dataclass
class Steps:
    """A block's denoising loop on the on-device step: load ``tokens`` ``[B]`` / ``editable`` ``[B]``, then
    forward + step rounds until the step's flag says final or ``cap`` rounds ran. Reply:
    ``(tokens [B] int64, forwards, reuse, finished)``."""

    tokens: torch.Tensor
    editable: torch.Tensor
    start: int
    cap: int


class Cancelled(Exception):
    """Thrown into a program to end it now (the loop's cancel): it returns what its committed blocks hold."""


@dataclass
class GenerationResult:
    """Outcome of one request.

    ``token_ids``: generated ids up to (excluding) the first EOS, within ``max_new_tokens``;
    ``raw_ids``: the decoded generated positions, at most ``max_new_tokens`` (EOS and after included);
    ``forwards``: ``{"prefill", "denoise", "commit"}`` counts; ``block_forwards``: denoise + commit per
    decoded block; ``finish_reason``: ``"eos"`` | ``"length"`` | ``"stop"`` (an ``on_block`` hook stopped it) |
    ``"cancelled"``; ``stalled_blocks``: indices of blocks that reached the forward cap without finishing.
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


def canvas_positions(n_prompt: int, budget: int, block_size: int) -> int:
    """Positions of a request's canvas: ``ceil((P + G) / B) · B`` (the KV cache it needs)."""
    return -(-(n_prompt + budget) // block_size) * block_size


def budget_of(decoder, max_new_tokens: int | None) -> int | None:
    """The request's new-token budget: ``max_new_tokens`` if given, else the decoder's."""
    return max_new_tokens if max_new_tokens is not None else DecoderConfig.coerce(decoder).max_new_tokens


def _ordinal(n: int) -> str:
    """1 -> "1st", 2 -> "2nd", 11 -> "11th" (for messages)."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def decode(model, prompt_ids: list[int], decoder, *, mask_id: int, eos_id: int, max_new_tokens: int | None = None,
           seed: int | None = None, on_block=None):
    """The program of one request (module docstring): a generator of ops returning a :class:`GenerationResult`.

    ``model``: the :class:`~repro.engine.model.LLaDA2Model` the executor runs (its vocabulary, device, embedding
    table and adapter; a rank's :class:`~repro.engine.parallel.ShardedModel` under tensor parallelism);
    ``decoder``: :class:`DecoderConfig` or dict; ``max_new_tokens`` / ``seed`` override the decoder's (seed used
    only when temperature > 0). ``on_block(ids: list[int]) -> bool``, if given, is called once per committed
    block with the generated ids that block adds (within ``max_new_tokens``; EOS and what follows included);
    returning True stops after that block (finish ``"stop"`` unless an EOS was decoded). Raises (at its first
    step, before any op) ValueError on an empty prompt, a prompt token outside the vocabulary or a missing budget.
    """
    cfg = DecoderConfig.coerce(decoder)
    G = max_new_tokens if max_new_tokens is not None else cfg.max_new_tokens
    if G is None or G < 1:
        raise ValueError(f"max_new_tokens must be a positive int (got {G!r}; decoder has {cfg.max_new_tokens!r})")
    P = len(prompt_ids)
    if P < 1:
        raise ValueError("prompt must contain at least one token")
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
    on_device = yield Begin(T, B, cfg)
    if on_device and (why := device_step_problem(cfg)) is not None:  # never the device step's rules by mistake
        raise ValueError(f"the on-device step was offered for this request, but {why}")
    first = P // B
    cap = cfg.max_denoise_forwards()
    finish, end = "length", P
    try:
        if first > 0:
            chunk = max(B, PREFILL_CHUNK // B * B)
            for s in range(0, first * B, chunk):
                yield Prefill(canvas[s:min(first * B, s + chunk)], s)
            counts["prefill"] += 1
        positions = torch.arange(T, device=dev)
        for b in range(first, n_blocks):
            s = b * B
            editable = positions[s:s + B] >= P
            if on_device:
                tokens, n_fwd, reuse, done = yield Steps(canvas[s:s + B], editable, s, cap)
            else:
                tokens, n_fwd, reuse, done = yield from _host_block(dec, canvas[s:s + B].clone(), editable, s, cap,
                                                                   gen)
            if not done:
                stalled.append(b)
                left = int(((tokens == mask_id) & editable).sum())
                why = (f"{left} <|mask|> left as they are (the mask token is a candidate; set exclude_mask_token: "
                       "true to exclude it)" if left else
                       f"no <|mask|> left, but edits kept changing tokens (edit threshold {cfg.edit_threshold}); "
                       "the tokens are kept as they stood")
                warnings.warn(f"decoder {cfg.algorithm} did not finish block {b} (counted over prompt + generation; "
                              f"the {_ordinal(b - first + 1)} generated) within {cap} denoising forwards; {why}",
                              RuntimeWarning, stacklevel=2)
            yield Commit(tokens, s, not reuse)
            counts["denoise"] += n_fwd
            counts["commit"] += 0 if reuse else 1
            per_block.append(n_fwd + (0 if reuse else 1))
            canvas[s:s + B] = tokens
            end = s + B
            if on_block is not None and on_block(canvas[max(s, P):min(P + G, s + B)].tolist()):
                finish = "stop"
                break
            if bool((canvas[P:s + B] == eos_id).any()):
                break
            if s + B - P >= G:
                break
    except Cancelled:
        finish = "cancelled"
    raw = canvas[P:min(P + G, end)].tolist()
    out = raw
    if eos_id in raw:
        out = raw[: raw.index(eos_id)]
        finish = "eos" if finish != "cancelled" else finish
    return GenerationResult(token_ids=out, raw_ids=raw, forwards=counts, finish_reason=finish,
                            block_forwards=per_block, stalled_blocks=stalled)


def _host_block(dec, tokens, editable, s, cap, gen):
    """One block with the host-driven decoder (a sub-program of :func:`decode`): returns (tokens, denoise
    forwards, reuse, finished) — ``finished`` False when the block stopped at ``cap`` forwards."""
    dec.start_block()
    last_input = None
    n_fwd = 0
    done = True
    while not dec.before_forward(tokens, editable):
        if n_fwd >= cap:
            done = False
            break
        logits = yield Denoise(tokens, s, dec.input_embeds(tokens, editable))
        n_fwd += 1
        last_input = tokens.clone()
        if dec.step(logits, tokens, editable, gen):
            break
    return tokens, n_fwd, last_input is not None and bool(torch.equal(last_input, tokens)), done


def steps_reply(stepper, n_fwd: int, cap: int):
    """The :class:`Steps` reply once the on-device loop of a block stops, else None (another round): final →
    finished; ``n_fwd >= cap`` → not finished. ``stepper``: a
    :class:`~repro.engine.decoders.device.DeviceStep` or a batched slot's view (``final``, ``tokens``,
    ``reuse()``); called right after ``start_block`` (``n_fwd`` 0) and after each round. The rule of the loop
    it replaces: ``while not final: if n >= cap: stop unfinished; round``."""
    if bool(stepper.final):
        return stepper.tokens.clone(), n_fwd, bool(stepper.reuse()), True
    if n_fwd >= cap:
        return stepper.tokens.clone(), n_fwd, bool(stepper.reuse()), False
    return None
