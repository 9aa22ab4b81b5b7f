"""Decoder settings and the block-decoder interface shared by all algorithms.

A decoder sees one block of ``block_size`` tokens at a time and is driven by
:func:`repro.engine.decode_loop.generate_ids`:

0. ``bind(model)`` — once per request: the :class:`~repro.engine.model.LLaDA2Model` whose embedding table
   and adapter self-conditioning uses;
1. ``start_block()`` — reset per-block state;
2. ``before_forward(tokens, editable)`` → True when the block is final **without** running a forward;
3. ``input_embeds(tokens, editable)`` → optional ``[B, D]`` input embeddings (self-conditioning);
4. one forward → ``logits [B, V]`` fp32; ``step(logits, tokens, editable, gen)`` updates ``tokens`` in place
   and returns True when the block is final (the forward just run saw the final tokens).

Shared conventions (engine_spec.md §6): ``tokens`` ``[B]`` int64 on the model device; ``editable`` ``[B]`` bool
(False at prompt positions, which are never changed); the ``<|mask|>`` logit is excluded (−inf) before any
softmax, so a decoder never commits ``<|mask|>`` (an engine choice, documented); greedy proposals are
``x̂ = argmax``, ``p = softmax(logits)[x̂]``; with ``temperature > 0`` ``x̂`` is sampled from
``softmax(logits / T)`` with the request's seeded generator and ``p`` is its probability under that
distribution (HF/diffusers convention, §6).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import torch


class DecoderConfigError(ValueError):
    """Unknown decoder key, unknown algorithm, a setting of the wrong type, or an out-of-range setting."""


#: Value kind of each setting (``algorithm`` is checked against the known names instead).
_KINDS = {"block_size": "int", "threshold": "float", "edit_threshold": "float", "editing": "bool",
          "max_post_steps": "int", "num_to_transfer": "int", "max_new_tokens": "int", "temperature": "float",
          "self_conditioning": "bool", "residual_temperature": "float", "seed": "int"}
_KIND_WORDS = {"bool": "true or false", "int": "an integer", "float": "a number"}


#: Per-algorithm defaults (sources: SGLang LowConfidence threshold 0.95 §6.4; SGLang JointThreshold
#: threshold 0.5 / edit 0.0 / 16 post steps = LLaDA2.1 S mode §6.5–6.6; ORL model card: threshold 0.85,
#: edit threshold 0.5, 16 refine steps, 4096 new tokens, self-conditioning on — issue 5).
ALGORITHM_DEFAULTS = {
    "low_confidence": dict(threshold=0.95, editing=False, self_conditioning=False),
    "joint_threshold": dict(threshold=0.5, edit_threshold=0.0, editing=True, max_post_steps=16,
                            self_conditioning=False),
    "orl": dict(threshold=0.85, edit_threshold=0.5, editing=True, max_post_steps=16, max_new_tokens=4096,
                self_conditioning=True),
}


@dataclass(frozen=True)
class DecoderConfig:
    """Decoder settings, the engine keys of docs/interfaces.md "Decoder dict".

    ``algorithm``: ``low_confidence`` | ``joint_threshold`` | ``orl``; ``block_size`` (tokens, 32 §4);
    ``threshold`` τ_mask (commit masked positions with p > τ); ``edit_threshold`` τ_edit (edit committed
    positions with p > τ_edit and x̂ ≠ current); ``editing`` (False = T2T off, distinct from
    ``edit_threshold = 0`` which edits every disagreement, §6.6); ``max_post_steps`` (forwards allowed after
    the block has no masks); ``num_to_transfer`` (fallback commit count, 1); ``max_new_tokens``;
    ``temperature`` (0 = greedy); ``self_conditioning`` (ORL residual on/off); ``residual_temperature``
    (T_res; None = the adapter's configured temperature, 1.0 without adapter); ``seed`` (sampling seed).
    """

    algorithm: str = "joint_threshold"
    block_size: int = 32
    threshold: float = 0.95
    edit_threshold: float = 0.0
    editing: bool = False
    max_post_steps: int = 16
    num_to_transfer: int = 1
    max_new_tokens: int | None = None
    temperature: float = 0.0
    self_conditioning: bool = False
    residual_temperature: float | None = None
    seed: int = 0

    @classmethod
    def from_dict(cls, d: dict) -> "DecoderConfig":
        """Build from the interface dict; algorithm defaults fill missing keys. Raises DecoderConfigError."""
        if not isinstance(d, dict):
            raise DecoderConfigError(f"decoder must be a dict or DecoderConfig, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise DecoderConfigError(f"unknown decoder keys {unknown}; known keys: {sorted(known)}")
        algo = d.get("algorithm", "joint_threshold")
        if algo not in ALGORITHM_DEFAULTS:
            raise DecoderConfigError(f"unknown decoder algorithm {algo!r}; known: {sorted(ALGORITHM_DEFAULTS)}")
        kw = {**ALGORITHM_DEFAULTS[algo], **{k: v for k, v in d.items() if v is not None or k == "residual_temperature"}}
        kw["algorithm"] = algo
        cfg = cls(**kw)
        cfg.validate()
        return cfg

    @classmethod
    def coerce(cls, d) -> "DecoderConfig":
        """Return ``d`` if already a DecoderConfig (validated), else :meth:`from_dict`."""
        if isinstance(d, cls):
            d.validate()
            return d
        return cls.from_dict(d)

    def validate(self) -> None:
        """Type and range checks; raises DecoderConfigError naming the key."""
        for f in fields(self):
            v = getattr(self, f.name)
            kind = _KINDS.get(f.name)
            if kind is None or (v is None and f.name in ("max_new_tokens", "residual_temperature")):
                continue
            ok = {"bool": isinstance(v, bool),
                  "int": isinstance(v, int) and not isinstance(v, bool),
                  "float": isinstance(v, (int, float)) and not isinstance(v, bool)}[kind]
            if not ok:
                raise DecoderConfigError(f"decoder key {f.name!r} must be {_KIND_WORDS[kind]}, got {v!r} "
                                         f"({type(v).__name__})")
        if self.algorithm not in ALGORITHM_DEFAULTS:
            raise DecoderConfigError(f"unknown decoder algorithm {self.algorithm!r}")
        if self.block_size < 1:
            raise DecoderConfigError(f"block_size must be ≥ 1, got {self.block_size}")
        if not 0.0 <= self.threshold <= 1.0:
            raise DecoderConfigError(f"threshold must be in [0, 1], got {self.threshold}")
        if not 0.0 <= self.edit_threshold <= 1.0:
            raise DecoderConfigError(f"edit_threshold must be in [0, 1] (0 edits every disagreement), got "
                                     f"{self.edit_threshold}")
        if self.max_post_steps < 0 or self.num_to_transfer < 1:
            raise DecoderConfigError("max_post_steps must be ≥ 0 and num_to_transfer ≥ 1")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise DecoderConfigError(f"max_new_tokens must be ≥ 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise DecoderConfigError(f"temperature must be ≥ 0, got {self.temperature}")
        if self.residual_temperature is not None and self.residual_temperature <= 0:
            raise DecoderConfigError(f"residual_temperature must be > 0, got {self.residual_temperature}")
        if self.self_conditioning and self.algorithm != "orl":
            raise DecoderConfigError("self_conditioning is only implemented by the 'orl' decoder")

    def to_dict(self) -> dict:
        """Plain dict of every setting (for records)."""
        return asdict(self)


def exclude_mask(logits: torch.Tensor, mask_id: int) -> torch.Tensor:
    """fp32 copy of ``logits`` ``[B, V]`` with the ``<|mask|>`` column set to −inf."""
    lg = logits.float().clone()
    lg[:, mask_id] = float("-inf")
    return lg


def propose(logits: torch.Tensor, temperature: float, gen: torch.Generator | None):
    """Proposed tokens and their confidences from mask-excluded logits ``[B, V]`` fp32.

    Greedy (``temperature == 0``): ``x̂ = argmax``, ``p = max softmax``. Sampling: ``x̂ ~ softmax(logits/T)``
    drawn with ``gen``, ``p`` = its probability. Returns ``(x̂ [B] int64, p [B] fp32)``.
    """
    if temperature <= 0:
        p, x = torch.softmax(logits, dim=-1).max(dim=-1)
        return x, p
    probs = torch.softmax(logits / temperature, dim=-1)
    x = torch.multinomial(probs, 1, generator=gen).squeeze(-1)
    return x, probs.gather(-1, x[:, None]).squeeze(-1)


def commit_masked(tokens: torch.Tensor, masked: torch.Tensor, x: torch.Tensor, p: torch.Tensor,
                  threshold: float, num_to_transfer: int) -> torch.Tensor:
    """M2T: write ``x̂`` into masked positions with ``p > threshold``; if fewer than ``num_to_transfer``
    qualify, write the ``num_to_transfer`` most confident masked positions instead (§6.1, §6.2 step 4,
    §6.4). Updates ``tokens`` in place; returns the bool ``[B]`` set written."""
    sel = masked & (p > threshold)
    if int(sel.sum()) < num_to_transfer:
        k = min(num_to_transfer, int(masked.sum()))
        conf = torch.where(masked, p, torch.full_like(p, -1.0))
        sel = torch.zeros_like(masked)
        sel[conf.topk(k).indices] = True
    tokens[sel] = x[sel]
    return sel


class BlockDecoder:
    """Interface (see module docstring). Subclasses set ``name`` and implement the hooks."""

    name = "base"

    def __init__(self, cfg: DecoderConfig, mask_id: int):
        self.cfg, self.mask_id = cfg, mask_id

    def bind(self, model) -> None:
        """Remember the model (embedding table, adapter) for this request."""
        self.model = model

    def start_block(self) -> None:
        """Reset per-block state."""

    def masked(self, tokens: torch.Tensor, editable: torch.Tensor) -> torch.Tensor:
        """Bool ``[B]``: generation positions still holding ``<|mask|>``."""
        return (tokens == self.mask_id) & editable

    def before_forward(self, tokens: torch.Tensor, editable: torch.Tensor) -> bool:
        """True → the block is final without another forward."""
        raise NotImplementedError

    def input_embeds(self, tokens: torch.Tensor, editable: torch.Tensor) -> torch.Tensor | None:
        """Optional ``[B, D]`` input embeddings replacing ``E[tokens]``; None = plain token embeddings."""
        return None

    def step(self, logits: torch.Tensor, tokens: torch.Tensor, editable: torch.Tensor,
             gen: torch.Generator | None) -> bool:
        """Update ``tokens`` in place from ``logits`` ``[B, V]``; True → block final (no commit needed if the
        input of this forward equals the final tokens)."""
        raise NotImplementedError
