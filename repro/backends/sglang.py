"""The SGLang backend: the paper's own serving path (``sgl.Engine`` offline engine, dLLM algorithms).

NOT RUN HERE: SGLang cannot be installed on the development machines (no GPU). What is tested
(``tests/plumbing/test_sglang_backend.py``) is the argument mapping and the parsing of outputs, against stubs
shaped as SGLang 0.5.23 as released (``ServerArgs`` a ``msgspec`` struct, the real ``meta_info`` keys, several
EOS ids) and as the model card's ORL build — not outputs captured from SGLang.
Facts below are read from the SGLang 0.5.23 wheel (paths inside ``sglang/srt/``).

Contract (``repro.backends.base.GenerationBackend``)
----------------------------------------------------
``SGLangBackend(model_dir, role, device="cuda", precision="bf16", tp_size=1, work_dir=None, batch_size=1,
cuda_graph_max_bs=None)``; ``generate(prompts, decoder)`` yields one record per prompt, in order, with the
backend fields of the generation record (docs/interfaces.md): ``prompt_text, completion, prompt_tokens,
generated_tokens, forwards, tpf, wall_s, tokens_per_s, finish_reason, device`` and ``forwards_note`` when
forward counts are missing or partial; ``describe()`` (provenance, complete once ``generate`` has started
the engine) and ``close()`` (shuts the engine down).

* ``sglang`` is imported lazily (first ``generate``), so this module imports on any machine.
* ``ServerArgs`` fields are read for both layouts — a dataclass (older releases) or a ``msgspec`` struct
  (0.5.23, ``server_args.py``; SGLang's own ``arg_groups/arg_utils.record_fields`` when present) — and a
  layout that cannot be read is an error, never a silently shorter option list. ``Engine(**kw)`` passes
  every keyword to ``ServerArgs``; a keyword it lacks is refused here with its name.
* Two paths, chosen by ``role``:

  - ``role="base"``: mainline SGLang. The **engine** decoder dict (``render_config --backend engine``) is
    mapped with ``repro.paper.decoding.to_sglang`` to ``dllm_algorithm`` and the YAML keys SGLang reads,
    written to ``<work_dir>/dllm_algorithm_config.yaml`` (``dllm_algorithm_config`` is a path to a YAML
    file). The algorithm must be in the installed ``algo_name_to_cls``.
  - ``role="orl"``: SGLang's LLaDA2 loader skips tensor names it does not know
    (``models/llada2.py`` ``load_weights``), so on mainline SGLang the ORL residual adapter would be dropped
    without a word and the run would be the base model with ORL thresholds. Refused unless the installed
    build declares ORL support — the ORL repository's SGLang on ``PYTHONPATH``, as the model card runs it:
    ``SDARPrefixKV`` in ``algo_name_to_cls`` and the card's ``sdar_*`` fields in ``ServerArgs``. Then the
    engine is built exactly as the card shows (:data:`CARD_ENGINE_ARGS`) with ``dllm_algorithm_config`` the
    card's engine-format ``decoder.yaml`` (the engine decoder keys, written to ``<work_dir>/decoder.yaml``).
* NVFP4 checkpoints: SGLang runs them on Hopper as BF16 models (its FP4 kernels need Blackwell), so the
  workflow gives this backend the dequantized BF16 copy (``repro.checkpoint.dequantize``; rule
  ``dequantize_checkpoint``). A ``model_dir`` whose ``config.json`` still declares an NVFP4
  ``quantization_config`` is refused with the fix (declare ``quantization: nvfp4`` for the model in
  config.yaml, or run ``python -m repro.checkpoint dequantize``); a dequantized copy's
  ``quant_provenance.json`` goes into ``describe()`` as ``quant_provenance`` (source key and manifest hash,
  code version, dtype) and ``weights`` says "NVFP4 weights dequantized to BF16 before loading".
* ``max_running_requests`` is passed as ``batch_size`` when ``batch_size > 1``; unset, SGLang runs dLLM
  requests one at a time (``dllm/config.py``) — both recorded in ``describe()``. ``cuda_graph_max_bs`` (if
  given) goes to ``cuda_graph_max_bs_decode`` / ``cuda_graph_max_bs_prefill`` (0.5.23 names), or to the old
  single field on a build that has it.
* Prompts: the checkpoint's chat template, applied by ``transformers`` when installed, else rendered with
  jinja2 (``add_generation_prompt=True``). Stop strings are not applied (raw completions are kept).
* ``sampling_params = {"temperature": 0.0, "max_new_tokens": decoder["max_new_tokens"]}``.
* Stop ids: SGLang stops on every EOS id of the checkpoint's ``generation_config.json`` / ``config.json``
  and the tokenizer's EOS token, not only the first; :func:`stop_token_ids` collects them all and generated
  tokens are counted up to (excluding) the first of any. Without ``output_ids``:
  ``meta_info["completion_tokens"]`` (which includes the matched stop token) minus one when
  ``finish_reason`` matched a stop token id.
* Forward counts: released SGLang's ``meta_info`` (``managers/tokenizer_manager.py``: ``id, finish_reason,
  prompt_tokens, weight_version, num_retractions, reasoning_tokens, completion_tokens, cached_tokens,
  e2e_latency``) has **none**: ``forwards``/``tpf`` are ``None`` and ``forwards_note`` says why (the table
  prints "n/c" and its caption explains). Builds with a per-block list (:data:`FORWARD_LIST_KEYS`, from an
  unmerged SGLang change) put the prompt prefill first (one forward): counted as ``prefill``, the rest as
  blocks, each block's last forward (it persists the block's K/V) as ``commit`` — TPF = generated tokens /
  block forwards, prefill excluded, as the engine counts. A bare total cannot be split and gives no TPF.
* ``finish_reason``: ``{"type": "stop"}`` -> ``"eos"``, ``{"type": "length"}`` -> ``"length"``, other types
  kept as their name.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable, Iterator

from repro.paper.decoding import PaperDecodingError, sglang_sampling_params, to_sglang

#: The algorithm of the model card's ORL build (the ORL repository's SGLang; in no public SGLang).
CARD_ALGORITHM = "SDARPrefixKV"
#: The model card's engine arguments, exactly (besides model_path, trust_remote_code, tp_size and the
#: ``dllm_algorithm_config`` path to its ``decoder.yaml``).
CARD_ENGINE_ARGS: dict[str, Any] = {
    "dllm_algorithm": CARD_ALGORITHM, "sdar_rollout_cuda_graph": True,
    "sdar_rollout_cuda_graph_capture_sizes": [1, 2], "attention_backend": "flashinfer",
    "mem_fraction_static": 0.60, "disable_radix_cache": True}
CARD_SDAR_FIELDS = ("sdar_rollout_cuda_graph", "sdar_rollout_cuda_graph_capture_sizes")
#: Mainline engine arguments (the card's, without the ORL build's algorithm and sdar_* options).
MAINLINE_ENGINE_ARGS: dict[str, Any] = {"mem_fraction_static": 0.60, "disable_cuda_graph": False,
                                        "attention_backend": "flashinfer", "disable_radix_cache": True}

FORWARD_LIST_KEYS = ("dllm_forward_counts", "dllm_forward_counts_per_block")
FORWARD_TOTAL_KEYS = ("dllm_num_forward_passes",)
FORWARD_KEYS = FORWARD_LIST_KEYS + FORWARD_TOTAL_KEYS
DEFAULT_EOS_ID = 156892  # <|endoftext|> of LLaDA2.1 (config.json eos_token_id)


class SGLangBackendError(RuntimeError):
    """The SGLang backend cannot run as asked; the message says why and what to do."""


def server_arg_names(server_args_cls) -> frozenset[str]:
    """Field names of SGLang's ``ServerArgs`` class, dataclass or ``msgspec`` struct. Raises
    SGLangBackendError naming the class when neither layout can be read (never an empty set)."""
    names: set[str] = set()
    try:
        from sglang.srt.arg_groups.arg_utils import record_fields  # SGLang's reader for both layouts

        names = {f.name for f in record_fields(server_args_cls)}
    except ImportError:
        pass
    if not names and dataclasses.is_dataclass(server_args_cls):
        names = {f.name for f in dataclasses.fields(server_args_cls)}
    if not names:
        names = set(getattr(server_args_cls, "__struct_fields__", ()) or ())  # msgspec.Struct
    if not names:
        raise SGLangBackendError(
            f"cannot read the fields of {getattr(server_args_cls, '__qualname__', server_args_cls)!r}: it is "
            "neither a dataclass nor a msgspec struct; this SGLang layout is not supported — update "
            "repro.backends.sglang.server_arg_names for it")
    return frozenset(names)


def orl_support(fields: frozenset[str], algorithms) -> tuple[bool, str]:
    """(declared, why): True when the installed SGLang is the card's ORL build (:data:`CARD_ALGORITHM` in
    ``algorithms`` and every :data:`CARD_SDAR_FIELDS` in ``ServerArgs``)."""
    lacks = [] if algorithms is not None and CARD_ALGORITHM in algorithms else [f"algorithm {CARD_ALGORITHM}"]
    lacks += [f"ServerArgs.{f}" for f in CARD_SDAR_FIELDS if f not in fields]
    if not lacks:
        return True, f"{CARD_ALGORITHM} and {', '.join(CARD_SDAR_FIELDS)} present (the model card's ORL build)"
    return False, "no ORL support declared: lacks " + ", ".join(lacks)


def engine_kwargs(model_dir: str, algorithm: str, config_path: str, fields: frozenset[str], *, tp_size: int = 1,
                  card: bool = False, max_running_requests: int | None = None,
                  cuda_graph_max_bs: int | None = None) -> dict:
    """The ``sgl.Engine`` keyword arguments: the model card's (``card``) or the mainline ones, plus the
    optional request / CUDA-graph limits under the names ``fields`` (``ServerArgs``) has. Raises
    SGLangBackendError naming any keyword ``ServerArgs`` lacks (``Engine`` would raise TypeError)."""
    kw: dict[str, Any] = dict(model_path=str(model_dir), trust_remote_code=True, tp_size=int(tp_size))
    if card:
        kw.update(CARD_ENGINE_ARGS)
    else:
        kw.update(MAINLINE_ENGINE_ARGS, dllm_algorithm=algorithm)
    kw["dllm_algorithm_config"] = str(config_path)
    if max_running_requests is not None:
        kw["max_running_requests"] = int(max_running_requests)
    if cuda_graph_max_bs is not None:
        if {"cuda_graph_max_bs_decode", "cuda_graph_max_bs_prefill"} <= fields:
            kw["cuda_graph_max_bs_decode"] = kw["cuda_graph_max_bs_prefill"] = int(cuda_graph_max_bs)
        else:
            kw["cuda_graph_max_bs"] = int(cuda_graph_max_bs)
    unknown = sorted(k for k in kw if k not in fields)
    if unknown:
        raise SGLangBackendError(f"the installed SGLang's ServerArgs has no field {', '.join(unknown)}; "
                                 "sgl.Engine would refuse these arguments (a TypeError). "
                                 + ("The card's sdar_* options need the ORL build of SGLang."
                                    if any(k.startswith("sdar_") for k in unknown) else
                                    "Use an SGLang release with these arguments."))
    return kw


def sglang_config_text(cfg: dict) -> str:
    """The YAML bytes of a dllm_algorithm_config (fixed key order, normalised numbers)."""
    from repro.paper.render_config import yaml_scalar

    return "".join(f"{k}: {yaml_scalar(v)}\n" for k, v in cfg.items())


def map_decoder(decoder: dict) -> tuple[str, dict, dict, list[str]]:
    """Engine decoder dict -> (dllm_algorithm, yaml dict, sampling_params, notes) for mainline SGLang."""
    _require_engine_keys(decoder)
    extra = {k: decoder[k] for k in ("penalty_lambda", "sglang_algorithm") if k in decoder}
    engine_only = {k: v for k, v in decoder.items() if k not in extra}
    try:
        name, cfg, notes = to_sglang(engine_only, extra)
    except PaperDecodingError as e:
        raise SGLangBackendError(str(e)) from None
    return name, cfg, sglang_sampling_params(engine_only), notes


def _require_engine_keys(decoder: dict) -> None:
    if "algorithm" not in decoder:
        raise SGLangBackendError(
            "the SGLang backend takes the engine decoder config (keys algorithm, threshold, edit_threshold, "
            "editing, max_post_steps, max_new_tokens, ...); got keys " + ", ".join(sorted(decoder)) +
            ". Render it with `python -m repro.paper.render_config ... --backend engine`; the backend derives "
            "SGLang's dllm_algorithm and YAML itself")


def stop_token_ids(model_dir: str | os.PathLike) -> tuple[int, ...]:
    """Every id SGLang stops on, in order, without repeats: ``eos_token_id`` (int or list) of
    ``generation_config.json`` and ``config.json``, then the tokenizer's ``eos_token`` (looked up in
    ``tokenizer_config.json`` ``added_tokens_decoder`` or ``tokenizer.json`` ``added_tokens``).
    ``(DEFAULT_EOS_ID,)`` when none is found."""
    d = Path(model_dir)

    def read(name):
        p = d / name
        try:
            return json.loads(p.read_text()) if p.is_file() else {}
        except (OSError, json.JSONDecodeError):
            return {}

    ids: list[int] = []
    for name in ("generation_config.json", "config.json"):
        eos = read(name).get("eos_token_id")
        for e in (eos if isinstance(eos, list) else [eos]):
            if isinstance(e, int) and not isinstance(e, bool):
                ids.append(e)
    tc = read("tokenizer_config.json")
    tok = tc.get("eos_token")
    tok = tok.get("content") if isinstance(tok, dict) else tok
    if isinstance(tok, str):
        table = {v.get("content"): int(k) for k, v in (tc.get("added_tokens_decoder") or {}).items()
                 if isinstance(v, dict)}
        table.update({t.get("content"): int(t["id"]) for t in (read("tokenizer.json").get("added_tokens") or [])
                      if isinstance(t, dict) and "id" in t})
        if tok in table:
            ids.append(table[tok])
    return tuple(dict.fromkeys(ids)) or (DEFAULT_EOS_ID,)


def checkpoint_weights(model_dir: str | os.PathLike) -> dict | None:
    """The ``quant_provenance.json`` of a dequantized copy (``repro.checkpoint.dequantize``) in ``model_dir``,
    None for a plain checkpoint. Raises SGLangBackendError for a checkpoint whose ``config.json`` declares an
    NVFP4 ``quantization_config``: SGLang would need FP4 kernels (Blackwell) for it; the message names the fix."""
    d = Path(model_dir)
    try:
        cfg = json.loads((d / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        cfg = {}
    q = cfg.get("quantization_config") if isinstance(cfg, dict) else None
    if isinstance(q, dict) and str(q.get("quant_algo", "")).upper() == "NVFP4":
        raise SGLangBackendError(
            f"{d} is an NVFP4 checkpoint (config.json quantization_config.quant_algo NVFP4); SGLang runs it on "
            "Hopper only as its dequantized BF16 copy. Declare `quantization: nvfp4` for this model in "
            "config.yaml (the workflow then dequantizes it and passes the copy), or write the copy with "
            f"`python -m repro.checkpoint dequantize --src {d} --out DIR` and point the backend at DIR")
    prov = d / "quant_provenance.json"
    if not prov.is_file():
        return None
    try:
        return json.loads(prov.read_text())
    except json.JSONDecodeError as e:
        raise SGLangBackendError(f"{prov}: not valid JSON ({e}); write the copy again with "
                                 "`python -m repro.checkpoint dequantize`") from None


def parse_forwards(meta: dict, generated_tokens: int) -> tuple[dict | None, float | None, str | None]:
    """(forwards, tpf, note) from one output's ``meta_info`` (see the module docstring)."""
    for key in FORWARD_LIST_KEYS:
        counts = meta.get(key)
        if counts is None:
            continue
        if isinstance(counts, (int, float)) and not isinstance(counts, bool):
            return None, None, (f"meta_info[{key!r}] = {counts} is a total, not per-block counts; forwards "
                                "cannot be split into prefill/denoise/commit, TPF not computed")
        counts = [int(c) for c in counts]
        if len(counts) < 2 or sum(counts[1:]) == 0:
            return None, None, f"meta_info[{key!r}] = {counts} holds no decoded block; TPF not computed"
        prefill, blocks = counts[0], counts[1:]
        total = sum(blocks)
        fw = {"prefill": prefill, "denoise": total - len(blocks), "commit": len(blocks)}
        note = (f"forward counts from meta_info[{key!r}]: first entry the prompt prefill ({prefill}), then "
                f"{len(blocks)} blocks, each block's last forward counted as commit")
        return fw, generated_tokens / total, note
    for key in FORWARD_TOTAL_KEYS:
        if key in meta:
            return None, None, (f"meta_info[{key!r}] = {meta[key]} is a total that cannot be split into "
                                "prefill/denoise/commit; TPF not computed")
    return None, None, ("SGLang reported no forward counts (released SGLang's meta_info has none; looked for "
                        + ", ".join(FORWARD_KEYS) + "); TPF not measured by this backend")


def parse_output(out: dict, prompt_text: str, wall_s: float | None, eos_ids: Iterable[int] = (DEFAULT_EOS_ID,),
                 device: str = "cuda") -> dict:
    """One SGLang output dict (``text``, ``meta_info``, optional ``output_ids``) -> record fields;
    ``eos_ids``: every stop id (:func:`stop_token_ids`)."""
    stops = set(eos_ids)
    meta = out.get("meta_info") or {}
    notes = []
    fr = meta.get("finish_reason")
    ftype = fr.get("type") if isinstance(fr, dict) else fr
    finish = {"stop": "eos", "length": "length"}.get(ftype, str(ftype) if ftype is not None else "unknown")
    if out.get("output_ids") is not None:
        ids = list(out["output_ids"])
        generated = next((i for i, t in enumerate(ids) if t in stops), len(ids))
    else:
        generated = int(meta.get("completion_tokens", 0))
        matched = fr.get("matched") if isinstance(fr, dict) else None
        if ftype == "stop" and isinstance(matched, int) and not isinstance(matched, bool) and generated > 0:
            generated -= 1
            notes.append("generated_tokens = completion_tokens - 1 (matched stop token id excluded)")
    if wall_s is None:
        wall_s = float(meta.get("e2e_latency", 0.0)) or None
    forwards, tpf, fnote = parse_forwards(meta, generated)
    if fnote:
        notes.insert(0, fnote)
    rec = {
        "prompt_text": prompt_text,
        "completion": out.get("text", ""),
        "prompt_tokens": int(meta.get("prompt_tokens", 0)),
        "generated_tokens": generated,
        "forwards": forwards,
        "tpf": tpf,
        "wall_s": wall_s,
        "tokens_per_s": (generated / wall_s) if wall_s else None,
        "finish_reason": finish,
        "device": device,
    }
    if notes:
        rec["forwards_note"] = "; ".join(notes)
    return rec


class ChatFormatter:
    """The checkpoint's chat template applied to ``messages`` (transformers if present, else jinja2)."""

    def __init__(self, model_dir: str | os.PathLike):
        self.model_dir = Path(model_dir)
        self._tok = None
        self._template = None
        try:
            from transformers import AutoTokenizer  # present in the SGLang image

            self._tok = AutoTokenizer.from_pretrained(str(self.model_dir), trust_remote_code=True)
        except Exception:  # noqa: BLE001 - no transformers, or a tokenizer it cannot load: use jinja2
            self._tok = None
        if self._tok is None or not getattr(self._tok, "chat_template", None):
            self._tok = None
            cfg_path = self.model_dir / "tokenizer_config.json"
            if not cfg_path.is_file():
                raise SGLangBackendError(f"{cfg_path}: missing; the SGLang backend needs the checkpoint's chat "
                                         "template to format prompts")
            cfg = json.loads(cfg_path.read_text())
            tmpl = cfg.get("chat_template")
            if isinstance(tmpl, list):  # [{"name": "default", "template": ...}, ...]
                tmpl = next((t["template"] for t in tmpl if t.get("name") == "default"), None)
            if not tmpl:
                raise SGLangBackendError(f"{cfg_path}: no chat_template; add the model's template to the file")
            import jinja2

            def raise_exception(msg):
                raise jinja2.TemplateError(msg)

            env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
            env.globals["raise_exception"] = raise_exception
            self._template = env.from_string(tmpl)
            self._special = {k: (v if isinstance(v, str) else (v or {}).get("content"))
                             for k, v in cfg.items() if k in ("bos_token", "eos_token")}

    def __call__(self, messages: list[dict]) -> str:
        if self._tok is not None:
            return self._tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return self._template.render(messages=messages, add_generation_prompt=True, **self._special)


def _installed_version() -> str | None:
    """The installed SGLang's version from package metadata (no import), None when absent."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sglang")
    except PackageNotFoundError:
        return None


class SGLangBackend:
    """Generation through SGLang's offline engine (see the module docstring)."""

    name = "sglang"

    def __init__(self, model_dir: str, role: str = "orl", device: str = "cuda", precision: str = "bf16",
                 tp_size: int | None = None, work_dir: str | None = None, batch_size: int = 1,
                 cuda_graph_max_bs: int | None = None, adapter_map: str | None = None):
        if adapter_map is not None:
            raise SGLangBackendError(f"adapter_map={adapter_map!r} is read by the engine backend only; SGLang "
                                     "loads the checkpoint itself (role orl needs the ORL build of SGLang)")
        if not str(device).startswith("cuda"):
            raise SGLangBackendError(f"device={device!r}: SGLang runs on CUDA GPUs only; use the engine backend "
                                     "for CPU runs (the smoke suite)")
        if precision != "bf16":
            raise SGLangBackendError(f"precision={precision!r}: the SGLang backend runs the checkpoint in its own "
                                     "dtype (bf16); fp32 is an engine-backend option")
        if role not in ("orl", "base"):
            raise SGLangBackendError(f"role={role!r}: expected 'orl' or 'base'")
        self.model_dir, self.role, self.device, self.precision = str(model_dir), role, device, precision
        self.tp_size = int(tp_size or os.environ.get("REPRO_SGLANG_TP", 1))
        self.batch_size = max(1, int(batch_size))
        self.cuda_graph_max_bs = cuda_graph_max_bs
        self.work_dir = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="repro-sglang-"))
        self.engine = None
        self._engine_key = None
        self._info: dict = {}
        self._format = None
        self.eos_ids = stop_token_ids(self.model_dir)
        self.quant_provenance = checkpoint_weights(self.model_dir)

    def _sglang(self):
        try:
            import sglang as sgl
        except ImportError as e:
            raise SGLangBackendError(f"sglang is not importable here ({e}); run in the SGLang image "
                                     "(containers/sglang.def.j2, containers.enabled: true) or install sglang "
                                     "with its CUDA wheels") from None
        return sgl

    @staticmethod
    def _server_fields() -> frozenset[str]:
        """``ServerArgs`` field names of the installed SGLang (SGLangBackendError if unreadable)."""
        try:
            from sglang.srt.server_args import ServerArgs
        except ImportError as e:
            raise SGLangBackendError(f"cannot import sglang.srt.server_args.ServerArgs ({e}); the SGLang "
                                     "backend needs it to check the engine arguments") from None
        return server_arg_names(ServerArgs)

    @staticmethod
    def _algorithms() -> set[str] | None:
        """Names in the installed ``algo_name_to_cls`` (None when this SGLang does not expose it)."""
        try:
            from sglang.srt.dllm.algorithm import algo_name_to_cls
        except Exception:  # noqa: BLE001 - older/newer layout: SGLang itself reports unknown names
            return None
        known = algo_name_to_cls() if callable(algo_name_to_cls) else algo_name_to_cls
        return set(known) if known else None

    def _plan(self, decoder: dict, fields: frozenset[str], algorithms) -> tuple[str, str, str, bool, list[str]]:
        """(dllm_algorithm, config file name, config text, card build?, notes) for ``decoder``."""
        _require_engine_keys(decoder)
        ok, why = orl_support(fields, algorithms)
        if self.role == "orl":
            if not ok:
                raise SGLangBackendError(
                    f"role 'orl' refused on this SGLang ({why}). SGLang's LLaDA2 loader skips tensor names it "
                    "does not know, so the ORL residual adapter would be dropped without a word and the run "
                    "would be the base model with ORL thresholds. Put the ORL repository's SGLang on PYTHONPATH "
                    "(as the model card runs it), or use the engine backend (it loads the adapter)")
            if decoder.get("exclude_mask_token"):
                raise SGLangBackendError("exclude_mask_token: true is an engine-only option; drop it for SGLang")
            if decoder.get("sglang_algorithm", CARD_ALGORITHM) != CARD_ALGORITHM:
                raise SGLangBackendError(f"sglang_algorithm={decoder['sglang_algorithm']!r}: role 'orl' runs the "
                                         f"model card's {CARD_ALGORITHM}; drop the setting")
            cfg = {k: v for k, v in decoder.items() if k not in ("penalty_lambda", "sglang_algorithm")}
            return CARD_ALGORITHM, "decoder.yaml", sglang_config_text(cfg), True, [
                f"model card's ORL build: {why}; dllm_algorithm_config = the engine-format decoder.yaml"]
        name, cfg, _, notes = map_decoder(decoder)
        if algorithms is not None and name not in algorithms:
            raise SGLangBackendError(f"dllm_algorithm {name!r} is not in the installed SGLang; available: "
                                     + ", ".join(sorted(algorithms)))
        return name, "dllm_algorithm_config.yaml", sglang_config_text(cfg), False, notes

    def _ensure_engine(self, decoder: dict) -> None:
        sgl = self._sglang()
        fields, algorithms = self._server_fields(), self._algorithms()
        algorithm, fname, text, card, notes = self._plan(decoder, fields, algorithms)
        key = (algorithm, text)
        if self.engine is not None and self._engine_key == key:
            self._info["notes"] = notes
            return
        self.close()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        cfg_path = self.work_dir / fname
        cfg_path.write_text(text)
        mrr = self.batch_size if self.batch_size > 1 else None
        kw = engine_kwargs(self.model_dir, algorithm, str(cfg_path), fields, tp_size=self.tp_size, card=card,
                           max_running_requests=mrr, cuda_graph_max_bs=self.cuda_graph_max_bs)
        self.engine = sgl.Engine(**kw)
        self._engine_key = key
        self._info = {
            "dllm_algorithm": algorithm, "orl_build": card, "dllm_algorithm_config": text,
            "dllm_algorithm_config_sha256": hashlib.sha256(text.encode()).hexdigest(),
            "engine_kwargs": {k: v for k, v in kw.items() if k != "model_path"},
            "max_running_requests": mrr if mrr is not None else "unset: SGLang runs dLLM requests one at a time",
            "sdar_server_args_available": sorted(f for f in fields if f.startswith("sdar_")),
            "sglang": getattr(sgl, "__version__", None) or _installed_version() or "unknown", "notes": notes}

    def generate(self, prompts: Iterable, decoder: dict) -> Iterator[dict]:
        if self._format is None:
            self._format = ChatFormatter(self.model_dir)
        self._ensure_engine(decoder)
        sampling = sglang_sampling_params(decoder)
        batch: list[str] = []
        for p in prompts:
            batch.append(self._format(p.messages))
            if len(batch) == self.batch_size:
                yield from self._run(batch, sampling)
                batch = []
        if batch:
            yield from self._run(batch, sampling)

    def _run(self, texts: list[str], sampling: dict) -> Iterator[dict]:
        t0 = time.perf_counter()
        outs = self.engine.generate(texts if len(texts) > 1 else texts[0], sampling_params=dict(sampling))
        wall = time.perf_counter() - t0
        if isinstance(outs, dict):
            outs = [outs]
        if len(outs) != len(texts):
            raise SGLangBackendError(f"SGLang returned {len(outs)} outputs for {len(texts)} prompts")
        for text, out in zip(texts, outs):
            # one prompt per call: the measured wall time; batched: SGLang's per-request e2e_latency
            yield parse_output(out, text, wall if len(texts) == 1 else None, self.eos_ids, self.device)

    def describe(self) -> dict:
        """Provenance: always backend, device, precision, role, tp size, stop ids and the installed SGLang
        version; once ``generate`` has started the engine also its algorithm, config text and sha256, engine
        arguments and notes (``engine_started`` says which)."""
        dev = self.device
        try:
            import torch

            if torch.cuda.is_available():
                dev = torch.cuda.get_device_name(0)
        except Exception:  # noqa: BLE001
            pass
        weights = ({"weights": "NVFP4 weights dequantized to BF16 before loading",
                    "quant_provenance": self.quant_provenance} if self.quant_provenance else {})
        return {"backend": "sglang", "device": dev, "precision": self.precision, "role": self.role, **weights,
                "tp_size": self.tp_size, "stop_token_ids": list(self.eos_ids),
                "sglang": _installed_version() or "not installed", "engine_started": bool(self._info),
                **self._info}

    def close(self) -> None:
        """Shut the engine down (also registered by SGLang with atexit; calling it early frees the GPU)."""
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None
