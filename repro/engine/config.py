"""Model configuration: the LLaDA2 MoE ``config.json`` as a validated dataclass, plus the ORL adapter block.

Field names are the real Hugging Face ones (docs/engine.md §1). Only the fields the forward pass needs are
kept; every one is required (no silent defaults for architecture) except those fixed for this family
(docs/engine.md §1), whose defaults are the LLaDA2.1-mini values. Settings the engine does not implement
(biases, tied/normalised heads, non-sigmoid routers, rope scaling) are refused with a clear error.

Not here: tensors (:mod:`repro.engine.weights`), the adapter maths (:mod:`repro.engine.adapter`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path


class ConfigError(ValueError):
    """A ``config.json`` the engine cannot run: missing field, unsupported setting, bad adapter block."""


#: Names of the adapter mapping file looked for next to a checkpoint (docs/adapter_map.md): the
#: ``orl_residual_adapter`` block (this project's format, :class:`AdapterConfig`) for a checkpoint whose
#: config.json has none — it names the checkpoint's own adapter tensors.
ADAPTER_MAP_FILES = ("adapter_map.json", "adapter_map.yaml")

#: ORL adapter forms this engine implements: form → {role: shape as a tuple of config symbols}.
#: ``D`` = hidden_size, ``r`` = adapter rank. See :mod:`repro.engine.adapter` for the maths.
ADAPTER_FORMS: dict[str, dict[str, tuple[str, str]]] = {
    "mlp_silu": {"down": ("r", "D"), "up": ("D", "r")},
    "linear": {"proj": ("D", "D")},
}


@dataclass(frozen=True)
class AdapterConfig:
    """The ORL residual adapter g of ``config.json`` key ``orl_residual_adapter`` (this project's format).

    ``type``: a key of :data:`ADAPTER_FORMS`; ``tensors``: role → checkpoint tensor name; ``rank``: inner
    width r (``mlp_silu`` only); ``alpha``: output scale α in ẽ = E[x] + α·g(z) (ORL site, docs/engine.md §8);
    ``temperature``: T_res of the normalised-entropy weight (RCD, docs/engine.md §7).
    """

    type: str
    tensors: dict
    alpha: float
    temperature: float
    rank: int | None = None

    @classmethod
    def from_dict(cls, d: dict) -> "AdapterConfig":
        """Validate the ``orl_residual_adapter`` dict. Raises :class:`ConfigError` naming the bad key."""
        if not isinstance(d, dict):
            raise ConfigError(f"orl_residual_adapter must be an object, got {type(d).__name__}")
        for k in ("type", "tensors", "alpha", "temperature"):
            if k not in d:
                raise ConfigError(f"orl_residual_adapter is missing key {k!r} (has {sorted(d)})")
        form = ADAPTER_FORMS.get(d["type"])
        if form is None:
            raise ConfigError(f"orl_residual_adapter.type {d['type']!r} unknown; known: {sorted(ADAPTER_FORMS)}")
        if not isinstance(d["tensors"], dict) or set(d["tensors"]) != set(form):
            raise ConfigError(f"orl_residual_adapter.tensors for type {d['type']!r} must have roles "
                              f"{sorted(form)}, got {sorted(d['tensors']) if isinstance(d['tensors'], dict) else d['tensors']}")
        rank = d.get("rank")
        if any("r" in s for s in form.values()) and (not isinstance(rank, int) or rank <= 0):
            raise ConfigError(f"orl_residual_adapter.rank must be a positive int for type {d['type']!r}, got {rank!r}")
        if float(d["temperature"]) <= 0:
            raise ConfigError(f"orl_residual_adapter.temperature must be > 0, got {d['temperature']}")
        return cls(type=d["type"], tensors=dict(d["tensors"]), alpha=float(d["alpha"]),
                   temperature=float(d["temperature"]), rank=rank)

    def shapes(self, hidden: int) -> dict[str, tuple[int, int]]:
        """Checkpoint tensor name → expected shape ``[out, in]`` for hidden size ``hidden``."""
        sym = {"D": hidden, "r": self.rank}
        return {self.tensors[role]: tuple(sym[s] for s in shp) for role, shp in ADAPTER_FORMS[self.type].items()}


@dataclass(frozen=True)
class LLaDA2Config:
    """Architecture of a LLaDA2 MoE model (docs/engine.md §1–§2); sizes in elements, not bytes."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    moe_intermediate_size: int
    num_experts: int
    num_experts_per_tok: int
    num_shared_experts: int
    n_group: int
    topk_group: int
    first_k_dense_replace: int = 1
    routed_scaling_factor: float = 2.5
    norm_topk_prob: bool = True
    moe_router_enable_expert_bias: bool = True
    rope_theta: float = 600000.0
    partial_rotary_factor: float = 0.5
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 32768
    adapter: AdapterConfig | None = None
    quantization: dict | None = field(default=None, compare=False)

    @property
    def rotary_dim(self) -> int:
        """Rotary channels per head: head_dim × partial_rotary_factor (64 of 128 for LLaDA2.1-mini, §2)."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def moe_layers(self) -> range:
        """Indices of the MoE layers (layers ≥ first_k_dense_replace; layer 0 is dense, §1)."""
        return range(self.first_k_dense_replace, self.num_hidden_layers)

    @classmethod
    def from_dict(cls, d: dict) -> "LLaDA2Config":
        """Build from a parsed ``config.json``. Raises :class:`ConfigError` on missing/unsupported fields."""
        if d.get("model_type") != "llada2_moe":
            raise ConfigError(f"model_type must be 'llada2_moe', got {d.get('model_type')!r}")
        refuse = {"use_qkv_bias": False, "use_bias": False, "tie_word_embeddings": False, "norm_head": False,
                  "score_function": "sigmoid", "use_qk_norm": True, "rope_scaling": None, "hidden_act": "silu"}
        for k, ok in refuse.items():
            if k in d and d[k] != ok:
                raise ConfigError(f"config.{k}={d[k]!r} is not supported by this engine (needs {ok!r})")
        names = [f for f in cls.__dataclass_fields__ if f not in ("adapter", "quantization")]
        required = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                    "num_key_value_heads", "head_dim", "intermediate_size", "moe_intermediate_size",
                    "num_experts", "num_experts_per_tok", "num_shared_experts", "n_group", "topk_group"]
        missing = [k for k in required if k not in d]
        if missing:
            raise ConfigError(f"config.json is missing required fields: {missing}")
        kw = {k: d[k] for k in names if k in d}
        ad = d.get("orl_residual_adapter")
        cfg = cls(**kw, adapter=AdapterConfig.from_dict(ad) if ad is not None else None,
                  quantization=d.get("quantization_config"))
        cfg.validate()
        return cfg

    @classmethod
    def from_file(cls, path: str | Path, adapter_map: str | Path | None = None) -> "LLaDA2Config":
        """Read ``path`` (a config.json or a checkpoint directory containing one).

        The adapter block comes from config.json's ``orl_residual_adapter``, else from the adapter mapping
        file ``adapter_map`` (a path), else from :data:`ADAPTER_MAP_FILES` next to config.json
        (docs/adapter_map.md). Raises ConfigError for a bad file, a given map that does not exist, or an
        adapter declared both in config.json and in a map file.
        """
        p = Path(path)
        if p.is_dir():
            p = p / "config.json"
        elif p.name != "config.json":
            raise ConfigError(f"{p} is not a checkpoint directory (expected a directory holding config.json, "
                              f"the tokenizer files and the safetensors weights)")
        if not p.is_file():
            raise ConfigError(f"no config.json at {p}")
        try:
            d = json.loads(p.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ConfigError(f"{p}: not valid JSON ({e}); re-download the checkpoint or fix the file") from None
        if not isinstance(d, dict):
            raise ConfigError(f"{p}: must hold a JSON object of model settings, got a {type(d).__name__}")
        map_path = find_adapter_map(p.parent, adapter_map)
        if map_path is not None:
            if d.get("orl_residual_adapter") is not None:
                raise ConfigError(f"{p} declares orl_residual_adapter and {map_path} maps an adapter too; keep "
                                  "one of them")
            d = {**d, "orl_residual_adapter": read_adapter_map(map_path)}
        try:
            return cls.from_dict(d)
        except ConfigError as e:
            raise ConfigError(f"{map_path if map_path and 'orl_residual_adapter' in str(e) else p}: {e}") from None

    def validate(self) -> None:
        """Check divisibility constraints of docs/engine.md §2. Raises :class:`ConfigError`."""
        errs = []
        if self.num_attention_heads % self.num_key_value_heads:
            errs.append("num_attention_heads must be a multiple of num_key_value_heads")
        if self.num_experts % self.n_group:
            errs.append("num_experts must be a multiple of n_group")
        if not 0 < self.topk_group <= self.n_group:
            errs.append("topk_group must be in 1..n_group")
        if self.num_experts_per_tok > self.topk_group * (self.num_experts // self.n_group):
            errs.append("num_experts_per_tok exceeds the experts available in topk_group groups")
        if self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.head_dim:
            errs.append(f"rotary_dim {self.rotary_dim} must be even and in 1..head_dim")
        if (self.num_experts // self.n_group) < 2:
            errs.append("group score needs ≥ 2 experts per group (sum of top-2, docs/engine.md §2)")
        if errs:
            raise ConfigError("; ".join(errs))


def find_adapter_map(checkpoint_dir: str | Path, adapter_map: str | Path | None = None) -> Path | None:
    """The adapter mapping file in effect: ``adapter_map`` if given (ConfigError if it does not exist), else
    the first of :data:`ADAPTER_MAP_FILES` in ``checkpoint_dir``, else None."""
    if adapter_map is not None:
        m = Path(adapter_map)
        if not m.is_file():
            raise ConfigError(f"adapter mapping file {m} does not exist (see docs/adapter_map.md)")
        return m
    for name in ADAPTER_MAP_FILES:
        m = Path(checkpoint_dir) / name
        if m.is_file():
            return m
    return None


def read_adapter_map(path: Path) -> dict:
    """The ``orl_residual_adapter`` dict in an adapter mapping file (JSON or YAML; validated later by
    :meth:`AdapterConfig.from_dict`). Raises ConfigError for unreadable content."""
    import yaml

    try:
        d = yaml.safe_load(Path(path).read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not valid JSON/YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(d, dict):
        raise ConfigError(f"{path}: an adapter mapping file holds one object (type, tensors, rank, alpha, "
                          "temperature; docs/adapter_map.md)")
    return d
