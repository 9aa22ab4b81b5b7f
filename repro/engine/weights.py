"""Weight layout of the engine and loading of Hugging Face safetensors by the real tensor names.

Internal layout (what :class:`repro.engine.model.LLaDA2Model` holds, one flat ``name → tensor`` dict):

=====================================  ==========================  =====================================
internal name                          shape                       checkpoint source (docs/engine.md §3)
=====================================  ==========================  =====================================
``embed``                              [V, D]                      ``model.word_embeddings.weight``
``layers.{l}.attn_norm``               [D]                         ``…input_layernorm.weight``
``layers.{l}.wqkv``                    [(H+2K)·hd, D]              ``…attention.query_key_value.weight``
``layers.{l}.q_norm`` / ``k_norm``     [hd]                        ``…attention.query_/key_layernorm.weight``
``layers.{l}.wo``                      [D, H·hd]                   ``…attention.dense.weight``
``layers.{l}.mlp_norm``                [D]                         ``…post_attention_layernorm.weight``
``layers.{l}.mlp.w_gate_up``           [2I, D]  (dense layers)     ``…mlp.gate_proj`` rows 0..I-1, ``up_proj`` rows I..
``layers.{l}.mlp.w_down``              [D, I]                      ``…mlp.down_proj.weight``
``layers.{l}.moe.router``              [E, D]   fp32               ``…mlp.gate.weight``
``layers.{l}.moe.expert_bias``         [E]      fp32               ``…mlp.gate.expert_bias``
``layers.{l}.moe.w_gate_up``           [E, 2Im, D]                 ``…mlp.experts.{e}.gate_proj`` / ``up_proj``
``layers.{l}.moe.w_down``              [E, D, Im]                  ``…mlp.experts.{e}.down_proj.weight``
``layers.{l}.moe.shared_gate_up``      [2S, D]                     ``…mlp.shared_experts.gate_proj`` / ``up_proj``
``layers.{l}.moe.shared_down``         [D, S]                      ``…mlp.shared_experts.down_proj.weight``
``final_norm``                         [D]                         ``model.norm.weight``
``lm_head``                            [V, D]                      ``lm_head.weight``
``adapter.{role}``                     per adapter form            names given in config ``orl_residual_adapter.tensors``
=====================================  ==========================  =====================================

Renames are the data table :data:`RENAMES` (regex → internal template, row part), not code branches.
Loading checks the file's tensor names against the names the config implies and fails with the **full**
lists of missing and unexpected names, then checks every shape (full list of mismatches), then copies
each tensor into the preallocated destination, casting to the model dtype (router and expert bias: fp32).

NVFP4 (ModelOpt) checkpoints: when ``config.quantization`` says NVFP4 (checked against
``hf_quant_config.json``), each quantized expert weight arrives as ``weight`` (packed uint8) +
``weight_scale`` (E4M3) + ``weight_scale_2`` (+ ``input_scale``); each group is checked (dtypes, shapes) and
either dequantized by :mod:`repro.checkpoint.nvfp4` before the table lookup (precision fp32 / bf16), or
copied packed into the :class:`~repro.checkpoint.nvfp4.NVFP4Experts` the model holds for
``moe.w_gate_up`` / ``moe.w_down`` (precision ``nvfp4-w4a16``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from repro.engine.config import LLaDA2Config


class WeightLoadError(ValueError):
    """A checkpoint whose tensors do not match the configured architecture (message lists the names)."""


#: Checkpoint-name pattern → (internal name template, row part). Row part "gate"/"up" selects the first /
#: second half of a fused ``w_gate_up`` destination; ``{e}`` in a pattern indexes the stacked expert dim.
_L = r"model\.layers\.(?P<l>\d+)\."
RENAMES: list[tuple[str, str, str | None]] = [
    (r"model\.word_embeddings\.weight", "embed", None),
    (_L + r"input_layernorm\.weight", "layers.{l}.attn_norm", None),
    (_L + r"attention\.query_key_value\.weight", "layers.{l}.wqkv", None),
    (_L + r"attention\.query_layernorm\.weight", "layers.{l}.q_norm", None),
    (_L + r"attention\.key_layernorm\.weight", "layers.{l}.k_norm", None),
    (_L + r"attention\.dense\.weight", "layers.{l}.wo", None),
    (_L + r"post_attention_layernorm\.weight", "layers.{l}.mlp_norm", None),
    (_L + r"mlp\.gate_proj\.weight", "layers.{l}.mlp.w_gate_up", "gate"),
    (_L + r"mlp\.up_proj\.weight", "layers.{l}.mlp.w_gate_up", "up"),
    (_L + r"mlp\.down_proj\.weight", "layers.{l}.mlp.w_down", None),
    (_L + r"mlp\.gate\.weight", "layers.{l}.moe.router", None),
    (_L + r"mlp\.gate\.expert_bias", "layers.{l}.moe.expert_bias", None),
    (_L + r"mlp\.experts\.(?P<e>\d+)\.gate_proj\.weight", "layers.{l}.moe.w_gate_up", "gate"),
    (_L + r"mlp\.experts\.(?P<e>\d+)\.up_proj\.weight", "layers.{l}.moe.w_gate_up", "up"),
    (_L + r"mlp\.experts\.(?P<e>\d+)\.down_proj\.weight", "layers.{l}.moe.w_down", None),
    (_L + r"mlp\.shared_experts\.gate_proj\.weight", "layers.{l}.moe.shared_gate_up", "gate"),
    (_L + r"mlp\.shared_experts\.up_proj\.weight", "layers.{l}.moe.shared_gate_up", "up"),
    (_L + r"mlp\.shared_experts\.down_proj\.weight", "layers.{l}.moe.shared_down", None),
    (r"model\.norm\.weight", "final_norm", None),
    (r"lm_head\.weight", "lm_head", None),
]
_COMPILED = [(re.compile(p + r"\Z"), t, part) for p, t, part in RENAMES]

#: Kernel layout (:mod:`repro.engine.kernels.fastpath`, built by ``repro.engine.graph.kernel_weights``): the
#: per-layer kernel key → internal name under ``layers.{l}.``. Keys are the internal names themselves where the
#: tensor is used as is; the MoE router and bias drop their ``moe.`` prefix. Model-level tensors (``embed``,
#: ``lm_head``, ``final_norm``) keep their names. The FFN weights are rebuilt, not renamed: see
#: :data:`KERNEL_FFN`.
KERNEL_LAYER_NAMES: dict[str, str] = {
    "attn_norm": "attn_norm", "wqkv": "wqkv", "q_norm": "q_norm", "k_norm": "k_norm", "wo": "wo",
    "mlp_norm": "mlp_norm", "router": "moe.router", "expert_bias": "moe.expert_bias",
}
#: Kernel FFN weights → (dense-layer source, routed-expert source, shared-expert source): ``w13`` [E1, 2I, D]
#: stacks gate rows over up rows per expert, ``w2`` [E1, D, I]; a dense layer is one expert (E1 = 1), an
#: MoE layer E routed experts with the shared expert at index E (E1 = E + 1).
KERNEL_FFN: dict[str, tuple[str, str, str]] = {
    "w13": ("mlp.w_gate_up", "moe.w_gate_up", "moe.shared_gate_up"),
    "w2": ("mlp.w_down", "moe.w_down", "moe.shared_down"),
}

#: Checkpoint tensors that carry no weights and are skipped by name (SGLang skips names containing
#: ``inv_freq``, docs/engine.md §3). Everything else not in the expected set is an error.
IGNORED = re.compile(r".*rotary_emb\.inv_freq\Z")

#: Internal names kept in fp32 regardless of the model dtype (docs/engine.md §1 ``router_dtype`` fp32).
FP32_PARAMS = re.compile(r"layers\.\d+\.moe\.(router|expert_bias)\Z")


def param_specs(cfg: LLaDA2Config, with_adapter: bool) -> dict[str, tuple[int, ...]]:
    """Internal name → shape for ``cfg`` (table in the module docstring)."""
    D, V, hd = cfg.hidden_size, cfg.vocab_size, cfg.head_dim
    H, K = cfg.num_attention_heads, cfg.num_key_value_heads
    E, Im, S = cfg.num_experts, cfg.moe_intermediate_size, cfg.moe_intermediate_size * cfg.num_shared_experts
    p: dict[str, tuple[int, ...]] = {"embed": (V, D)}
    for l in range(cfg.num_hidden_layers):
        q = f"layers.{l}."
        p.update({q + "attn_norm": (D,), q + "wqkv": ((H + 2 * K) * hd, D), q + "q_norm": (hd,),
                  q + "k_norm": (hd,), q + "wo": (D, H * hd), q + "mlp_norm": (D,)})
        if l < cfg.first_k_dense_replace:
            p.update({q + "mlp.w_gate_up": (2 * cfg.intermediate_size, D),
                      q + "mlp.w_down": (D, cfg.intermediate_size)})
        else:
            p.update({q + "moe.router": (E, D), q + "moe.w_gate_up": (E, 2 * Im, D),
                      q + "moe.w_down": (E, D, Im)})
            if cfg.moe_router_enable_expert_bias:
                p[q + "moe.expert_bias"] = (E,)
            if S:
                p.update({q + "moe.shared_gate_up": (2 * S, D), q + "moe.shared_down": (D, S)})
    p["final_norm"] = (D,)
    p["lm_head"] = (V, D)
    if with_adapter and cfg.adapter is not None:
        for role, shape in _adapter_roles(cfg).items():
            p[f"adapter.{role}"] = shape
    return p


def _adapter_roles(cfg: LLaDA2Config) -> dict[str, tuple[int, ...]]:
    shapes = cfg.adapter.shapes(cfg.hidden_size)
    return {role: shapes[name] for role, name in cfg.adapter.tensors.items()}


def expected_checkpoint_shapes(cfg: LLaDA2Config) -> dict[str, tuple[int, ...]]:
    """Checkpoint tensor name → shape that ``cfg`` implies (docs/engine.md §3 plus the adapter tensors).

    Adapter tensors are always expected when the config declares an adapter, whatever the role loaded.
    """
    D, hd = cfg.hidden_size, cfg.head_dim
    H, K = cfg.num_attention_heads, cfg.num_key_value_heads
    I, Im, S = cfg.intermediate_size, cfg.moe_intermediate_size, cfg.moe_intermediate_size * cfg.num_shared_experts
    n: dict[str, tuple[int, ...]] = {"model.word_embeddings.weight": (cfg.vocab_size, D)}
    for l in range(cfg.num_hidden_layers):
        q = f"model.layers.{l}."
        n.update({q + "input_layernorm.weight": (D,), q + "attention.query_key_value.weight": ((H + 2 * K) * hd, D),
                  q + "attention.query_layernorm.weight": (hd,), q + "attention.key_layernorm.weight": (hd,),
                  q + "attention.dense.weight": (D, H * hd), q + "post_attention_layernorm.weight": (D,)})
        if l < cfg.first_k_dense_replace:
            n.update({q + "mlp.gate_proj.weight": (I, D), q + "mlp.up_proj.weight": (I, D),
                      q + "mlp.down_proj.weight": (D, I)})
            continue
        n[q + "mlp.gate.weight"] = (cfg.num_experts, D)
        if cfg.moe_router_enable_expert_bias:
            n[q + "mlp.gate.expert_bias"] = (cfg.num_experts,)
        for e in range(cfg.num_experts):
            x = f"{q}mlp.experts.{e}."
            n.update({x + "gate_proj.weight": (Im, D), x + "up_proj.weight": (Im, D), x + "down_proj.weight": (D, Im)})
        if S:
            n.update({q + "mlp.shared_experts.gate_proj.weight": (S, D), q + "mlp.shared_experts.up_proj.weight": (S, D),
                      q + "mlp.shared_experts.down_proj.weight": (D, S)})
    n["model.norm.weight"] = (D,)
    n["lm_head.weight"] = (cfg.vocab_size, D)
    if cfg.adapter is not None:
        n.update(cfg.adapter.shapes(D))
    return n


def rename(name: str, cfg: LLaDA2Config) -> tuple[str, int | None, str | None]:
    """Map a checkpoint name to ``(internal name, expert index or None, row part or None)`` via the table.

    Adapter names (from the config) map to ``adapter.{role}``. Raises KeyError if no table entry matches.
    """
    if cfg.adapter is not None:
        for role, tname in cfg.adapter.tensors.items():
            if name == tname:
                return f"adapter.{role}", None, None
    for pat, tmpl, part in _COMPILED:
        m = pat.match(name)
        if m:
            g = m.groupdict()
            return tmpl.format(l=g.get("l")), (int(g["e"]) if g.get("e") is not None else None), part
    raise KeyError(f"no rename-table entry for checkpoint tensor {name!r}")


def checkpoint_files(path: str | Path) -> dict[str, Path]:
    """Checkpoint tensor name → safetensors file, for a single ``model.safetensors`` or a sharded index.

    Raises WeightLoadError when neither exists, the index names a missing shard, or a shard does not hold a
    tensor the index assigns to it (only the shards' headers are read).
    """
    root = Path(path)
    index = root / "model.safetensors.index.json"
    if index.is_file():
        try:
            wm = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
            raise WeightLoadError(f"{index}: not a safetensors index with a weight_map ({e!r}); re-download "
                                  f"it") from None
        missing = sorted({f for f in wm.values() if not (root / f).is_file()})
        if missing:
            raise WeightLoadError(f"{index} names shard files that do not exist: {missing}")
        by_file: dict[str, list[str]] = {}
        for k, f in wm.items():
            by_file.setdefault(f, []).append(k)
        absent = []
        for f, names in sorted(by_file.items()):
            with _open(root / f) as h:
                held = set(h.keys())
            absent += [(k, f) for k in names if k not in held]
        if absent:
            k, f = absent[0]
            raise WeightLoadError(f"{index} lists {len(absent)} tensor(s) that their shard file does not hold, e.g. "
                                  f"{k} in {f}: the shard is damaged or the index belongs to other files; "
                                  "re-download the checkpoint and re-run the checkpoint verification")
        return {k: root / f for k, f in wm.items()}
    single = root / "model.safetensors"
    if single.is_file():
        with _open(single) as h:
            return {k: single for k in h.keys()}
    raise WeightLoadError(f"no model.safetensors or model.safetensors.index.json in {root}")


def _open(f: Path):
    """``safe_open`` that names the file when it is not a readable safetensors file (truncated, corrupt)."""
    from safetensors import safe_open

    try:
        return safe_open(str(f), "pt")
    except Exception as e:  # noqa: BLE001 - SafetensorError and OSError variants
        raise WeightLoadError(f"{f}: not a readable safetensors file ({e}); re-download it and re-run the "
                              f"checkpoint verification") from None


def _names(items: list[str], limit: int = 20) -> str:
    """The first ``limit`` entries of a list for an error message, with the count of the rest."""
    if len(items) <= limit:
        return str(items)
    return f"{items[:limit]} … and {len(items) - limit} more"


def _shape(files: dict[str, Path], handles: dict, name: str) -> tuple[int, ...]:
    f = files[name]
    if f not in handles:
        handles[f] = _open(f)
    return tuple(handles[f].get_slice(name).get_shape())


#: Name fragments of residual-adapter tensors (ORL "residual adapter", RCD "residual", self-conditioning).
_ADAPTER_WORDS = ("adapter", "residual", "orl", "rcd", "self_cond", "selfcond")


def looks_like_adapter(names_shapes: dict[str, tuple[int, ...]], hidden: int) -> list[str]:
    """Why these unknown tensors look like a residual adapter (empty list: they do not). Outside the
    backbone's ``model.layers.N.`` blocks and either named like one (:data:`_ADAPTER_WORDS`) or matrices with
    the hidden size on one side (``[r, D]`` / ``[D, r]`` / ``[D, D]``: a map from the hidden space to itself,
    the adapter forms of :data:`repro.engine.config.ADAPTER_FORMS`)."""
    outside = {n: s for n, s in names_shapes.items() if not re.match(r"model\.layers\.\d+\.", n)}
    if not outside:
        return []
    why = []
    named = [n for n in outside if any(w in n.lower() for w in _ADAPTER_WORDS)]
    if named:
        why.append(f"names mention an adapter/residual ({', '.join(named[:4])})")
    mats = [s for s in outside.values() if len(s) == 2 and hidden in s]
    if mats and len(mats) == len(outside):
        why.append(f"every one is a matrix with the hidden size {hidden} on one side "
                   f"({', '.join('x'.join(map(str, s)) for s in mats[:4])})")
    return why


def unknown_tensors_message(path, cfg: LLaDA2Config, names_shapes: dict[str, tuple[int, ...]]) -> str:
    """The error for a checkpoint whose tensors are all known except ``names_shapes``: lists them with
    shapes, says whether they look like a residual adapter, and points at the mapping file."""
    listed = "; ".join(f"{n} {list(s)}" for n, s in list(names_shapes.items())[:20])
    more = f"; … and {len(names_shapes) - 20} more" if len(names_shapes) > 20 else ""
    msg = f"checkpoint {path} has {len(names_shapes)} tensor(s) the loader does not know: {listed}{more}."
    why = looks_like_adapter(names_shapes, cfg.hidden_size)
    if why:
        msg += (" They look like a residual adapter (" + "; ".join(why) + "), e.g. the ORL adapter in a "
                "format this config does not declare; the ORL decoder is not run without it.")
    if cfg.adapter is not None:
        msg += " config.json declares an adapter, but with other tensor names."
    msg += (" Map them with an adapter mapping file: adapter_map.json next to the checkpoint (or "
            "adapter_map: <file> for the model in config.yaml) holding {\"type\": \"mlp_silu\" | \"linear\", "
            "\"tensors\": {role: checkpoint name}, \"rank\", \"alpha\", \"temperature\"} — see "
            "docs/adapter_map.md.")
    return msg


def load_weights(path: str | Path, cfg: LLaDA2Config, params: dict[str, torch.Tensor],
                 with_adapter: bool) -> None:
    """Fill the preallocated ``params`` (internal layout, on their device/dtype) from the checkpoint at ``path``.

    Raises WeightLoadError listing **all** missing/unexpected tensor names, or all shape mismatches
    (adapter tensors of another form/shape included: a checkpoint whose adapter tensors do not match the
    configured form is refused, docs/engine.md §13). With ``with_adapter=False`` the adapter tensors named by the
    config are checked but not loaded.
    """
    from repro.checkpoint import nvfp4

    files = checkpoint_files(path)
    expected = expected_checkpoint_shapes(cfg)
    quant_groups: dict[str, dict[str, str]] = {}
    packed = any(isinstance(t, nvfp4.NVFP4Experts) for t in params.values())
    if cfg.quantization is not None:
        try:
            nvfp4.check_export(path, cfg.quantization)
        except ValueError as e:
            raise WeightLoadError(str(e)) from None
        quant_groups, files_named = nvfp4.group_quantized_names(list(files), expected)
    elif packed:
        raise WeightLoadError(f"checkpoint {path} is not NVFP4 (config.json has no quantization_config), but "
                              f"precision nvfp4-w4a16 keeps NVFP4 experts packed: use precision bf16 or fp32")
    else:
        files_named = list(files)
    present = {n for n in files_named if not IGNORED.match(n)}
    missing = sorted(set(expected) - present)
    unexpected = sorted(present - set(expected))
    handles: dict[Path, object] = {}
    if unexpected and not missing:
        raise WeightLoadError(unknown_tensors_message(path, cfg, {n: _shape(files, handles, n) for n in unexpected}))
    if missing or unexpected:
        raise WeightLoadError(
            f"checkpoint {path} does not match config: {len(missing)} missing tensors {_names(missing)}; "
            f"{len(unexpected)} unexpected tensors {_names(unexpected)}")

    def get(name: str) -> torch.Tensor:
        f = files[name]
        if f not in handles:
            handles[f] = _open(f)
        return handles[f].get_tensor(name)

    def group(name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The checked (weight, weight_scale, weight_scale_2) of NVFP4 group ``name``."""
        g = quant_groups[name]
        parts = get(g["weight"]), get(g["weight_scale"]), get(g["weight_scale_2"])
        try:
            nvfp4.check_group(*parts, *expected[name])
        except ValueError as e:
            raise WeightLoadError(f"{name}: {e}") from None
        return parts

    def fetch(name: str) -> torch.Tensor:
        if name in quant_groups:  # dequantize at load (precision bf16 / fp32)
            return nvfp4.dequantize(*group(name), dtype=torch.float32)
        return get(name)

    bad_shapes = []
    shapes: dict[str, tuple[int, ...]] = {}
    for name in sorted(expected):
        f = files[name]
        if f not in handles:
            handles[f] = _open(f)
        shp = tuple(handles[f].get_slice(name).get_shape())
        if name in quant_groups:  # packed FP4: two values per byte along `in`
            shp = (shp[0], shp[1] * 2) if len(shp) == 2 else shp
        shapes[name] = shp
        if shp != expected[name]:
            bad_shapes.append(f"{name}: file {list(shp)} != expected {list(expected[name])}")
    if bad_shapes:
        more = f"; … and {len(bad_shapes) - 20} more" if len(bad_shapes) > 20 else ""
        raise WeightLoadError(f"checkpoint {path} has {len(bad_shapes)} tensors of the wrong shape (does "
                              f"config.json belong to these weights?): " + "; ".join(bad_shapes[:20]) + more)
    for name in sorted(expected):
        internal, e, part = rename(name, cfg)
        if internal.startswith("adapter.") and not with_adapter:
            continue
        if internal not in params:
            raise WeightLoadError(f"tensor {name} maps to {internal!r}, which this model does not have")
        dst = params[internal]
        if isinstance(dst, nvfp4.NVFP4Experts):  # nvfp4-w4a16: keep the group packed
            if name not in quant_groups:
                raise WeightLoadError(f"{name} is not an NVFP4 group (weight + weight_scale + weight_scale_2) in "
                                      f"{path}, but precision nvfp4-w4a16 keeps the routed experts packed")
            dst.load_part(e, 1 if part == "up" else 0, *group(name))
            continue
        if e is not None:
            dst = dst[e]
        if part is not None:
            half = dst.shape[0] // 2
            dst = dst[:half] if part == "gate" else dst[half:]
        src = fetch(name)
        if tuple(src.shape) != tuple(dst.shape):
            raise WeightLoadError(f"{name} {list(src.shape)} does not fit {internal} slice {list(dst.shape)}")
        dst.copy_(src.to(device=dst.device, dtype=dst.dtype))
