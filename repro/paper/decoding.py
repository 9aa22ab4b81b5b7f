"""Load, validate and resolve `paper_decoding.json`; map engine decoder settings to SGLang's.

Contract
--------
* ``load_paper_decoding(checkpoint=None)`` returns ``PaperDecoding`` (the parsed dict, the file it came
  from, ``source_kind`` = ``"checkpoint"`` | ``"packaged"``, and the file's sha256). The checkpoint's own
  ``paper_decoding.json`` is authoritative (model card); the packaged copy
  (``repro/paper/paper_decoding.json``) is used only when the checkpoint has none (the base model
  LLaDA2.1-mini ships none). The file is validated against ``paper_decoding.schema.json`` (draft 2020-12);
  every error names the file and the key.
* ``resolve_decoder(pd, suite, model, benchmark, seed, overrides)`` merges, in this order (later wins):
  engine-level ``block_size`` and ``temperature`` -> the model's ``defaults`` -> the benchmark's overrides
  -> ``--set`` overrides; then validates the result. The returned dict has exactly the engine decoder keys
  of docs/interfaces.md, in a fixed order: ``algorithm, block_size, threshold, edit_threshold, editing,
  max_post_steps, max_new_tokens, temperature, self_conditioning, [residual_temperature], exclude_mask_token,
  seed`` (``exclude_mask_token`` defaults to false — the mask token is a candidate, as in the references —
  and is always written, so the rule in effect is part of the file's sha256).
  Numbers are normalised (``threshold=1`` and ``threshold=1.0`` give the same value) so rendering is
  byte-stable.
* ``to_sglang(decoder, extra)`` maps an engine decoder dict to ``(dllm_algorithm, yaml_dict, notes)`` with
  exactly the keys SGLang's algorithm reads (docs/engine.md §9, from
  ``sgl-project/sglang:python/sglang/srt/dllm/algorithm/{low_confidence,joint_threshold}.py``):

  ====================  ===============  ==========================================================
  engine ``algorithm``  dllm_algorithm   YAML keys
  ====================  ===============  ==========================================================
  ``low_confidence``    LowConfidence    ``block_size``, ``threshold``
  ``joint_threshold``   JointThreshold   ``block_size``, ``threshold``, ``edit_threshold``,
                                         ``max_post_edit_steps``, ``penalty_lambda``
  ``orl``               JointThreshold   same as joint_threshold (see the note below)
  ====================  ===============  ==========================================================

  - ``max_post_edit_steps`` = engine ``max_post_steps``; ``penalty_lambda`` = 0.0 (the engine has no
    repetition penalty) unless ``--set penalty_lambda=X`` is given for the SGLang backend.
  - ``editing: false`` -> ``edit_threshold: 1.0``: SGLang edits a token when ``p > edit_threshold``; a
    probability never exceeds 1, so editing is off. (``edit_threshold: 0.0`` means *full* editing in SGLang,
    as in our engine.)
  - ``orl``: mainline SGLang has no self-conditioning / residual-adapter algorithm for LLaDA2 (docs/engine.md
    §8/§9); the mapping runs the ORL checkpoint with JointThreshold at the ORL thresholds and says so in
    ``notes``. A site with an ORL-aware SGLang algorithm can name it with ``--set sglang_algorithm=NAME``
    (the YAML keys stay those of JointThreshold).
  - SGLang's dLLM algorithms are argmax-only: ``temperature`` other than 0 is refused; they take the full
    vocabulary, so ``exclude_mask_token: true`` is refused too.
  ``max_new_tokens`` and ``seed`` are not YAML keys: they go to SGLang's ``sampling_params`` and to the
  record (see ``sglang_sampling_params``).

This module reads no checkpoint weights and imports no SGLang.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema

from . import DEFAULT_PAPER_DECODING

SCHEMA_PATH = Path(__file__).with_name("paper_decoding.schema.json")
FILE_NAME = "paper_decoding.json"

# Engine decoder keys (docs/interfaces.md), in rendering order.
ENGINE_KEYS = ("algorithm", "block_size", "threshold", "edit_threshold", "editing", "max_post_steps",
               "max_new_tokens", "temperature", "self_conditioning", "residual_temperature", "exclude_mask_token",
               "seed")
#: Engine keys given a default when neither paper_decoding.json nor --set sets them (written into every
#: rendered file, so the rule in effect is in the decoder's sha256 and provenance).
RENDERED_DEFAULTS = {"exclude_mask_token": False}
OPTIONAL_ENGINE_KEYS = ("residual_temperature",)
FLOAT_KEYS = ("threshold", "edit_threshold", "temperature", "residual_temperature", "penalty_lambda")
INT_KEYS = ("block_size", "max_post_steps", "max_new_tokens", "seed")
BOOL_KEYS = ("editing", "self_conditioning", "exclude_mask_token")
# Keys accepted by --set only for the SGLang backend (not engine decoder keys).
SGLANG_ONLY_KEYS = ("penalty_lambda", "sglang_algorithm")

SGLANG_ALGORITHMS = {"low_confidence": "LowConfidence", "joint_threshold": "JointThreshold",
                     "orl": "JointThreshold"}
SGLANG_KEYS = {
    "LowConfidence": ("block_size", "threshold"),
    "JointThreshold": ("block_size", "threshold", "edit_threshold", "max_post_edit_steps", "penalty_lambda"),
}

_DECODER_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": [k for k in ENGINE_KEYS if k not in OPTIONAL_ENGINE_KEYS],
    "properties": {
        "algorithm": {"enum": ["low_confidence", "joint_threshold", "orl"]},
        "block_size": {"type": "integer", "minimum": 1},
        "threshold": {"type": "number", "minimum": 0, "maximum": 1},
        "edit_threshold": {"type": "number", "minimum": 0, "maximum": 1},
        "editing": {"type": "boolean"},
        "max_post_steps": {"type": "integer", "minimum": 0},
        "max_new_tokens": {"type": "integer", "minimum": 1},
        "temperature": {"type": "number", "minimum": 0},
        "self_conditioning": {"type": "boolean"},
        "residual_temperature": {"type": "number", "exclusiveMinimum": 0},
        "exclude_mask_token": {"type": "boolean"},
        "seed": {"type": "integer"},
    },
}


class PaperDecodingError(ValueError):
    """A problem with paper_decoding.json or a requested decoder; one line naming the file and the fix."""


@dataclass(frozen=True)
class PaperDecoding:
    data: dict
    path: Path
    source_kind: str  # "checkpoint" | "packaged"
    sha256: str


def _where(path) -> str:
    return "/".join(str(p) for p in path) or "(top level)"


def validate_paper_decoding(data: Any, source: str = FILE_NAME) -> None:
    """Raise ``PaperDecodingError`` listing every schema violation of ``data`` (one per line)."""
    schema = json.loads(SCHEMA_PATH.read_text())
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(data), key=lambda e: list(e.path))
    if errors:
        lines = [f"{source}: {_where(e.absolute_path)}: {e.message}" for e in errors]
        raise PaperDecodingError("invalid paper_decoding.json (schema "
                                 f"{SCHEMA_PATH.name}):\n  " + "\n  ".join(lines))


def load_paper_decoding(checkpoint: str | os.PathLike | None = None) -> PaperDecoding:
    """The checkpoint's paper_decoding.json if it has one, else the packaged default; validated."""
    path, kind = Path(DEFAULT_PAPER_DECODING), "packaged"
    if checkpoint is not None:
        ckpt = Path(checkpoint)
        if not ckpt.is_dir():
            raise PaperDecodingError(f"--checkpoint {ckpt}: not a directory; pass the checkpoint folder "
                                     "(the one holding config.json) or leave --checkpoint out")
        if (ckpt / FILE_NAME).is_file():
            path, kind = ckpt / FILE_NAME, "checkpoint"
    raw = path.read_bytes()
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as e:
        raise PaperDecodingError(f"{path}: not valid JSON ({e}); fix the file or remove it to use the "
                                 "packaged default") from None
    validate_paper_decoding(data, str(path))
    return PaperDecoding(data, path, kind, hashlib.sha256(raw).hexdigest())


def _coerce(key: str, value: Any, source: str) -> Any:
    if key in FLOAT_KEYS:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise PaperDecodingError(f"{source}: {key} must be a number, got {value!r}")
        return float(value)
    if key in INT_KEYS:
        if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, float)
                                                                      and value.is_integer())):
            raise PaperDecodingError(f"{source}: {key} must be an integer, got {value!r}")
        return int(value)
    if key in BOOL_KEYS and not isinstance(value, bool):
        raise PaperDecodingError(f"{source}: {key} must be true or false, got {value!r}")
    return value


def parse_overrides(items: list[str] | None, backend: str = "engine") -> dict:
    """Parse ``--set key=value`` items (values read as YAML scalars: 0.9, 64, true, orl)."""
    import yaml

    allowed = set(ENGINE_KEYS) | (set(SGLANG_ONLY_KEYS) if backend == "sglang" else set())
    out: dict = {}
    for item in items or []:
        if "=" not in item:
            raise PaperDecodingError(f"--set {item!r}: expected key=value, e.g. --set max_new_tokens=64")
        key, _, text = item.partition("=")
        key = key.strip()
        if key not in allowed:
            hint = (f" ({key} is only meaningful with --backend sglang)" if key in SGLANG_ONLY_KEYS else "")
            raise PaperDecodingError(f"--set {key}: unknown decoder key{hint}; allowed: "
                                     + ", ".join(sorted(allowed)))
        value = yaml.safe_load(text) if text.strip() else None
        if value is None:
            raise PaperDecodingError(f"--set {key}: empty value")
        out[key] = value
    return out


def resolve_decoder(pd: PaperDecoding, suite: str, model: str, benchmark: str, seed: int,
                    overrides: dict | None = None) -> dict:
    """Merge engine -> model defaults -> benchmark -> overrides; return the validated engine decoder dict."""
    data = pd.data
    src = str(pd.path)
    if suite not in data["suites"]:
        raise PaperDecodingError(f"{src}: no suite {suite!r}; available: {', '.join(sorted(data['suites']))} (the "
                                 "workflow passes config.yaml's suites.<suite>.decoder_suite, default main)")
    models = data["suites"][suite]
    if model not in models:
        raise PaperDecodingError(f"{src}: suite {suite!r} has no decoder model {model!r}; available: "
                                 f"{', '.join(sorted(models))}")
    entry = models[model]
    if benchmark not in entry["benchmarks"]:
        raise PaperDecodingError(f"{src}: suites/{suite}/{model} has no benchmark {benchmark!r}; available: "
                                 f"{', '.join(sorted(entry['benchmarks']))}")
    merged: dict = {"block_size": data["engine"]["block_size"], "temperature": data["engine"]["temperature"],
                    **RENDERED_DEFAULTS}
    merged.update(copy.deepcopy(entry["defaults"]))
    merged.update(copy.deepcopy(entry["benchmarks"][benchmark]))
    engine_over = {k: v for k, v in (overrides or {}).items() if k in ENGINE_KEYS}
    merged.update(engine_over)
    merged["seed"] = seed if "seed" not in engine_over else engine_over["seed"]
    out = {}
    for key in ENGINE_KEYS:
        if key in merged:
            out[key] = _coerce(key, merged[key], src if key not in engine_over else f"--set {key}")
    errors = list(jsonschema.Draft202012Validator(_DECODER_SCHEMA).iter_errors(out))
    if errors:
        lines = [f"{_where(e.absolute_path)}: {e.message}" for e in errors]
        raise PaperDecodingError(f"decoder for suite={suite} model={model} benchmark={benchmark} (from {src}"
                                 f" + --set) is invalid:\n  " + "\n  ".join(lines))
    return out


def to_sglang(decoder: dict, extra: dict | None = None) -> tuple[str, dict, list[str]]:
    """Map an engine decoder dict to ``(dllm_algorithm, yaml_dict, notes)`` (see module docstring)."""
    extra = dict(extra or {})
    algo = decoder["algorithm"]
    if algo not in SGLANG_ALGORITHMS:
        raise PaperDecodingError(f"algorithm {algo!r} has no SGLang equivalent; allowed: "
                                 + ", ".join(SGLANG_ALGORITHMS))
    if float(decoder.get("temperature", 0.0)) != 0.0:
        raise PaperDecodingError(f"temperature={decoder['temperature']}: SGLang's dLLM algorithms decode by "
                                 "argmax only; use --set temperature=0 or the engine backend")
    if decoder.get("exclude_mask_token"):
        raise PaperDecodingError("exclude_mask_token: true is an engine-only option: SGLang's dLLM algorithms "
                                 "take argmax and softmax over the full vocabulary, <|mask|> included; drop the "
                                 "setting or use the engine backend")
    name = SGLANG_ALGORITHMS[algo]
    notes: list[str] = []
    keys = SGLANG_KEYS[name]
    cfg: dict = {"block_size": int(decoder["block_size"]), "threshold": float(decoder["threshold"])}
    if name == "JointThreshold":
        editing = bool(decoder.get("editing", True))
        cfg["edit_threshold"] = float(decoder["edit_threshold"]) if editing else 1.0
        if not editing:
            notes.append("editing=false -> edit_threshold 1.0 (SGLang edits when p > edit_threshold; p <= 1)")
        cfg["max_post_edit_steps"] = int(decoder["max_post_steps"])
        cfg["penalty_lambda"] = _coerce("penalty_lambda", extra.pop("penalty_lambda", 0.0), "--set")
    else:
        if extra.pop("penalty_lambda", None) is not None:
            raise PaperDecodingError("--set penalty_lambda: LowConfidence has no penalty_lambda key")
        if decoder.get("editing") and algo == "low_confidence":
            notes.append("LowConfidence has no T2T editing; editing/edit_threshold are not used")
    if algo == "orl":
        notes.append("ORL decoder mapped to JointThreshold: mainline SGLang has no self-conditioning / "
                     "residual-adapter algorithm for LLaDA2; self_conditioning="
                     f"{str(decoder.get('self_conditioning')).lower()} is not applied by SGLang")
    override = extra.pop("sglang_algorithm", None)
    if override is not None:
        if not isinstance(override, str) or not override:
            raise PaperDecodingError(f"--set sglang_algorithm={override!r}: expected a class name")
        notes.append(f"dllm_algorithm overridden to {override} (--set sglang_algorithm); YAML keys stay "
                     f"those of {name}")
        name = override
    if extra:
        raise PaperDecodingError(f"unknown SGLang settings: {', '.join(sorted(extra))}")
    assert tuple(cfg) == keys, (tuple(cfg), keys)
    return name, cfg, notes


def sglang_sampling_params(decoder: dict) -> dict:
    """``sampling_params`` for ``sgl.Engine.generate`` from an engine decoder dict."""
    return {"temperature": 0.0, "max_new_tokens": int(decoder["max_new_tokens"])}
