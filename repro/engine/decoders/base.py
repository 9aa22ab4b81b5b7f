"""Decoder settings, the decoder registry and the block-decoder interface shared by all algorithms.

A decoder sees one block of ``block_size`` tokens at a time and is driven by
:func:`repro.engine.request.decode` (the program the engine loop advances):

0. ``bind(model)`` — once per request: the :class:`~repro.engine.model.LLaDA2Model` whose embedding table
   and adapter self-conditioning uses;
1. ``start_block()`` — reset per-block state;
2. ``before_forward(tokens, editable)`` → True when the block is final **without** running a forward;
3. ``input_embeds(tokens, editable)`` → optional ``[B, D]`` input embeddings (self-conditioning);
4. one forward → ``logits [B, V]`` fp32; ``step(logits, tokens, editable, gen)`` updates ``tokens`` in place
   and returns True when the block is final (the forward just run saw the final tokens).

Shared conventions: ``tokens`` ``[B]`` int64 on the model device; ``editable`` ``[B]`` bool
(False at prompt positions, which are never changed). Proposals ``x̂ = argmax`` and confidences
``p = softmax(logits)[x̂]`` are taken over the **full** vocabulary, ``<|mask|>`` included, as the official
LLaDA2.1 ``generate`` (Hugging Face remote code of ``inclusionAI/LLaDA2.1-mini``) and SGLang's
``LowConfidence`` / ``JointThreshold`` (``python/sglang/srt/dllm/algorithm/``) do: a step may write
``<|mask|>`` back (a no-op fill at a masked position, a re-mask through an edit). The setting
``exclude_mask_token`` (off by default) instead sets the mask logit to −inf before argmax and softmax (the
engine's earlier rule). With ``temperature > 0`` ``x̂`` is sampled from ``softmax(logits / T)`` with the
request's seeded generator and ``p`` is its probability under that distribution (HF/diffusers convention).

Registry (as SGLang's ``dllm/algorithm/__init__.py``): every module of this package that defines
``Decoder`` (a :class:`BlockDecoder` subclass with a ``name``) and ``DEFAULTS`` (its setting defaults) is an
algorithm, found by ``Decoder.name``; :func:`algorithms` lists them. A module whose greedy rules the on-device
step implements says so with ``ON_DEVICE = True`` (:func:`repro.engine.decoders.device.device_step_problem`);
without it the decoder runs on the host decoders only, never on the device step's rules.
:class:`DecoderConfig` fills every setting left unset from the algorithm's ``DEFAULTS``, then from
:data:`COMMON_DEFAULTS`, so ``DecoderConfig()`` and ``DecoderConfig.from_dict({})`` are the same decoder.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import asdict, dataclass, fields
from functools import lru_cache
from pathlib import Path

import torch


class DecoderConfigError(ValueError):
    """Unknown decoder key, unknown algorithm, a setting of the wrong type, or an out-of-range setting."""


#: Algorithm used when a config names none (LLaDA2.1's own decoder).
DEFAULT_ALGORITHM = "joint_threshold"

#: Defaults of settings no algorithm module sets (block size 32 and one fallback commit per step as in the
#: LLaDA2.1 reference generate and SGLang ``DllmConfig``; greedy; the mask token is a candidate).
COMMON_DEFAULTS = dict(block_size=32, threshold=0.95, edit_threshold=0.0, editing=False, max_post_steps=16,
                       num_to_transfer=1, max_new_tokens=None, temperature=0.0, self_conditioning=False,
                       exclude_mask_token=False, seed=0)

#: Value kind of each setting (``algorithm`` is checked against the registry instead).
_KINDS = {"block_size": "int", "threshold": "float", "edit_threshold": "float", "editing": "bool",
          "max_post_steps": "int", "num_to_transfer": "int", "max_new_tokens": "int", "temperature": "float",
          "self_conditioning": "bool", "residual_temperature": "float", "exclude_mask_token": "bool",
          "seed": "int"}
_KIND_WORDS = {"bool": "true or false", "int": "an integer", "float": "a number"}
#: Settings whose ``None`` is a value of its own (no budget; the adapter's temperature).
_NONE_ALLOWED = ("max_new_tokens", "residual_temperature")


@lru_cache(maxsize=1)
def algorithms() -> dict:
    """Algorithm name → decoder module, for every module of :mod:`repro.engine.decoders` that defines
    ``Decoder`` and ``DEFAULTS`` (discovered once, like SGLang's ``algo_name_to_cls``)."""
    package = __name__.rpartition(".")[0]  # this folder's package, found without importing it back (no cycle)
    found = {}
    for info in pkgutil.iter_modules([str(Path(__file__).parent)]):
        mod = importlib.import_module(f"{package}.{info.name}")
        cls = getattr(mod, "Decoder", None)
        if cls is not None and hasattr(mod, "DEFAULTS"):
            if cls.name in found:
                raise RuntimeError(f"two decoder modules register {cls.name!r}: {found[cls.name].__name__}, "
                                   f"{mod.__name__}")
            found[cls.name] = mod
    return found


def algorithm_defaults(name: str) -> dict:
    """Every setting's default for algorithm ``name`` (its module's ``DEFAULTS`` over
    :data:`COMMON_DEFAULTS`); DecoderConfigError naming the known algorithms if unknown."""
    mods = algorithms()
    if name not in mods:
        raise DecoderConfigError(f"unknown decoder algorithm {name!r}; known: {sorted(mods)}")
    return {**COMMON_DEFAULTS, **mods[name].DEFAULTS}


_UNSET = object()


@dataclass(frozen=True)
class DecoderConfig:
    """Decoder settings, the engine keys of docs/interfaces.md "Decoder dict".

    ``algorithm``: a registered name (:func:`algorithms`: ``low_confidence`` | ``joint_threshold`` | ``orl``);
    ``block_size`` (tokens); ``threshold`` τ_mask (commit masked positions with p > τ); ``edit_threshold``
    τ_edit (edit written positions with p > τ_edit and x̂ ≠ current); ``editing`` (False = T2T off,
    distinct from ``edit_threshold = 0`` which edits every disagreement); ``max_post_steps`` (forwards
    allowed after the block has no masks); ``num_to_transfer`` (fallback commit count, 1); ``max_new_tokens``;
    ``temperature`` (0 = greedy); ``self_conditioning`` (ORL residual on/off); ``residual_temperature``
    (T_res; None = the adapter's configured temperature, 1.0 without adapter); ``exclude_mask_token``
    (True = ``<|mask|>`` is never proposed, its logit −inf before argmax/softmax; False, the default = full
    vocabulary as the references); ``seed`` (sampling seed).

    A setting not given takes the algorithm's default (its module's ``DEFAULTS``), else
    :data:`COMMON_DEFAULTS`; ``DecoderConfig()`` is ``DecoderConfig.from_dict({})``.
    """

    algorithm: str = DEFAULT_ALGORITHM
    block_size: int = _UNSET
    threshold: float = _UNSET
    edit_threshold: float = _UNSET
    editing: bool = _UNSET
    max_post_steps: int = _UNSET
    num_to_transfer: int = _UNSET
    max_new_tokens: int | None = _UNSET
    temperature: float = _UNSET
    self_conditioning: bool = _UNSET
    residual_temperature: float | None = None
    exclude_mask_token: bool = _UNSET
    seed: int = _UNSET

    def __post_init__(self):
        defaults = algorithm_defaults(self.algorithm)
        for f in fields(self):
            if getattr(self, f.name) is _UNSET:
                object.__setattr__(self, f.name, defaults[f.name])

    @classmethod
    def from_dict(cls, d: dict) -> "DecoderConfig":
        """Build from the interface dict; unset (or None) keys take the algorithm's defaults.
        Raises DecoderConfigError."""
        if not isinstance(d, dict):
            raise DecoderConfigError(f"decoder must be a dict or DecoderConfig, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise DecoderConfigError(f"unknown decoder keys {unknown}; known keys: {sorted(known)}")
        kw = {k: v for k, v in d.items() if v is not None or k == "residual_temperature"}
        kw.setdefault("algorithm", DEFAULT_ALGORITHM)
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
            if kind is None or (v is None and f.name in _NONE_ALLOWED):
                continue
            ok = {"bool": isinstance(v, bool),
                  "int": isinstance(v, int) and not isinstance(v, bool),
                  "float": isinstance(v, (int, float)) and not isinstance(v, bool)}[kind]
            if not ok:
                raise DecoderConfigError(f"decoder key {f.name!r} must be {_KIND_WORDS[kind]}, got {v!r} "
                                         f"({type(v).__name__})")
        algorithm_defaults(self.algorithm)  # raises for an unknown name
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
        if self.self_conditioning and not algorithms()[self.algorithm].Decoder.self_conditions:
            raise DecoderConfigError(f"self_conditioning is only implemented by the 'orl' decoder, not "
                                     f"{self.algorithm!r}")

    def to_dict(self) -> dict:
        """Plain dict of every setting (for records)."""
        return asdict(self)

    @property
    def edits(self) -> bool:
        """True when the algorithm applies T2T edits under these settings."""
        return algorithms()[self.algorithm].Decoder.can_edit and self.editing

    def max_denoise_forwards(self) -> int:
        """Cap on a block's denoising forwards. A decoder class may set ``max_forwards(cfg)`` (``low_confidence``:
        ``block_size``, the LLaDA2.0 reference generate's ``steps`` per block, docs/engine.md §6.4); otherwise
        SGLang's ``max_steps`` — ``block_size + 1`` without editing (``DllmAlgorithm.max_steps``),
        ``block_size + max_post_steps + 1`` with it (``JointThreshold.max_steps``). With ``exclude_mask_token``
        every block finishes within ``block_size`` forwards; with the mask as a candidate a decoder that keeps
        proposing ``<|mask|>`` stops here, the block keeps its tokens (masks included, as the references emit
        them) and the loop reports it."""
        own = getattr(algorithms()[self.algorithm].Decoder, "max_forwards", None)
        if own is not None:
            return own(self)
        return self.block_size + (self.max_post_steps if self.edits else 0) + 1


# ---------------------------------------------------------------------------------------------- shared rules
# Tensor operations without host synchronisation, used both by the host decoders (with host branches around
# them) and by the on-device step (repro.engine.decoders.device), so both compute the same sets.

def candidate_logits(logits: torch.Tensor, mask_id: int, exclude_mask_token: bool) -> torch.Tensor:
    """fp32 logits ``[B, V]`` the proposals are drawn from: the forward's logits (full vocabulary, the
    references' rule), or a copy with the ``<|mask|>`` column at −inf when ``exclude_mask_token``."""
    lg = logits.float()
    if exclude_mask_token:
        lg = lg.clone()
        lg[:, mask_id] = float("-inf")
    return lg


def propose(logits: torch.Tensor, temperature: float, gen: torch.Generator | None):
    """Proposed tokens and their confidences from candidate logits ``[B, V]`` fp32.

    Greedy (``temperature == 0``): ``x̂ = argmax``, ``p = max softmax``. Sampling: ``x̂ ~ softmax(logits/T)``
    drawn with ``gen``, ``p`` = its probability. Returns ``(x̂ [B] int64, p [B] fp32)``.
    """
    if temperature <= 0:
        p, x = torch.softmax(logits, dim=-1).max(dim=-1)
        return x, p
    probs = torch.softmax(logits / temperature, dim=-1)
    x = torch.multinomial(probs, 1, generator=gen).squeeze(-1)
    return x, probs.gather(-1, x[:, None]).squeeze(-1)


def m2t_set(masked: torch.Tensor, p: torch.Tensor, threshold: float, num_to_transfer: int) -> torch.Tensor:
    """M2T (mask-to-token) positions, bool ``[B]``: masked positions with ``p > threshold``; if fewer than
    ``num_to_transfer`` qualify, the ``num_to_transfer`` most confident masked positions instead (LLaDA2.1
    reference generate; SGLang ``LowConfidence`` / ``JointThreshold`` with ``num_to_transfer = 1``). Empty
    when nothing is masked. No host sync."""
    sel = masked & (p > threshold)
    conf = torch.where(masked, p, torch.full_like(p, -1.0))
    k = min(num_to_transfer, masked.shape[0])
    fallback = torch.zeros_like(masked).scatter_(0, conf.topk(k).indices, True) & masked
    return torch.where(sel.sum() < num_to_transfer, fallback, sel)


def t2t_set(editable: torch.Tensor, masked: torch.Tensor, tokens: torch.Tensor, x: torch.Tensor,
            p: torch.Tensor, edit_threshold: float) -> torch.Tensor:
    """T2T (token-to-token) edits, bool ``[B]``: written generation positions (not prompt, not mask) whose
    proposal differs from the current token with ``p > edit_threshold`` (LLaDA2.1 report Eq. 2; SGLang
    ``JointThreshold``). With the mask as a candidate ``x̂`` may be ``<|mask|>``: a re-mask. No host sync."""
    return editable & ~masked & (x != tokens) & (p > edit_threshold)


def commit_masked(tokens: torch.Tensor, masked: torch.Tensor, x: torch.Tensor, p: torch.Tensor,
                  threshold: float, num_to_transfer: int) -> torch.Tensor:
    """Write ``x̂`` at :func:`m2t_set` in place; returns that bool ``[B]`` set (written even when ``x̂`` is
    ``<|mask|>``: then the position stays masked)."""
    sel = m2t_set(masked, p, threshold, num_to_transfer)
    tokens[sel] = x[sel]
    return sel


class BlockDecoder:
    """Interface (see module docstring). Subclasses set ``name`` and implement the hooks; ``can_edit`` /
    ``self_conditions`` say whether the algorithm uses ``editing`` / ``self_conditioning``."""

    name = "base"
    can_edit = False
    self_conditions = False
    #: The model's :class:`repro.engine.parallel.VocabShard` when its logits are one rank's vocabulary slice
    #: (tensor parallelism): candidates / proposals / the residual are then reduced across ranks. None: full logits.
    vocab = None

    def __init__(self, cfg: DecoderConfig, mask_id: int):
        self.cfg, self.mask_id = cfg, mask_id

    def bind(self, model) -> None:
        """Remember the model (embedding table, adapter; its ``vocab`` shard under tensor parallelism)."""
        self.model = model
        self.vocab = getattr(model, "vocab", None)

    def start_block(self) -> None:
        """Reset per-block state."""

    def masked(self, tokens: torch.Tensor, editable: torch.Tensor) -> torch.Tensor:
        """Bool ``[B]``: generation positions still holding ``<|mask|>``."""
        return (tokens == self.mask_id) & editable

    def candidates(self, logits: torch.Tensor) -> torch.Tensor:
        """:func:`candidate_logits` under this decoder's ``exclude_mask_token``."""
        if self.vocab is not None:
            return self.vocab.candidates(logits, self.mask_id, self.cfg.exclude_mask_token)
        return candidate_logits(logits, self.mask_id, self.cfg.exclude_mask_token)

    def propose(self, lg: torch.Tensor, gen: torch.Generator | None):
        """:func:`propose` at the decoder's temperature (across ranks when :attr:`vocab` is set)."""
        if self.vocab is not None:
            return self.vocab.propose(lg, self.cfg.temperature, gen)
        return propose(lg, self.cfg.temperature, gen)

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
