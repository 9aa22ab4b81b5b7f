"""The SGLang backend: the paper's own serving path (``sgl.Engine`` offline engine, dLLM algorithms).

NOT RUN HERE: SGLang cannot be installed on the development machines (no GPU). What is tested
(``tests/plumbing/test_sglang_backend.py``) is the argument mapping and the parsing of example outputs that
we constructed by hand from the key names in engine_spec.md §6.10/§9 — not outputs captured from SGLang.

Contract (``repro.backends.base.GenerationBackend``)
-----------------------------------------
``SGLangBackend(model_dir, role, device="cuda", precision="bf16", tp_size=1, work_dir=None, batch_size=1,
card_options=None)``; ``generate(prompts, decoder)`` yields one record per prompt, in order, with the
backend fields of the generation record (docs/interfaces.md): ``prompt_text, completion, prompt_tokens,
generated_tokens, forwards, tpf, wall_s, tokens_per_s, finish_reason, device`` and ``forwards_note`` when
forward counts are missing or partial.

* ``sglang`` is imported lazily (first ``generate``), so this module imports on any machine.
* ``decoder`` is the **engine** decoder dict (``render_config --backend engine``); it is mapped with
  ``repro.paper.decoding.to_sglang`` to ``dllm_algorithm`` and the YAML keys SGLang reads, which are written
  to ``<work_dir>/dllm_algorithm_config.yaml`` (same bytes for the same settings; its sha256 is in
  ``describe()``). A decoder dict that already holds SGLang keys (no ``algorithm``) is refused with the fix.
* The engine is built exactly as the model card shows::

      sgl.Engine(model_path=model_dir, trust_remote_code=True, tp_size=tp_size, mem_fraction_static=0.60,
                 disable_cuda_graph=False, attention_backend="flashinfer", disable_radix_cache=True,
                 dllm_algorithm=<name>, dllm_algorithm_config=<yaml path>, **card_options_known)

  ``card_options`` (default ``CARD_OPTIONS``) are passed only when the installed SGLang's ``ServerArgs`` has
  a field of that name (``sdar_*`` options are not in any public SGLang, engine_spec.md §6.7); which were
  passed or dropped is in ``describe()``. If the installed SGLang exposes ``algo_name_to_cls`` and the
  algorithm is not in it, the backend refuses before loading the model.
* Prompts: the checkpoint's chat template (``tokenizer_config.json``), applied by ``transformers`` when
  installed, else rendered with jinja2 (``add_generation_prompt=True``); SGLang receives the formatted
  string. Stop strings are not applied (raw completions are kept, as in the engine backend).
* ``sampling_params = {"temperature": 0.0, "max_new_tokens": decoder["max_new_tokens"]}`` (dLLM algorithms
  are argmax-only).
* Forward counts are probed in ``meta_info`` (``FORWARD_KEYS``, in order):
  ``dllm_forward_counts_per_block`` / ``dllm_forward_counts`` (a list, one count per block, each including
  the block's final confirmation forward) -> ``forwards = {"prefill": None, "denoise": sum - blocks,
  "commit": blocks}``, ``tpf = generated_tokens / sum``; prompt prefill is not reported by SGLang, hence
  ``None``. A bare total (``dllm_num_forward_passes``) cannot be split by kind: ``forwards`` and ``tpf`` are
  ``None`` and ``forwards_note`` keeps the raw value. No key at all: ``forwards``/``tpf`` ``None`` and
  ``forwards_note`` names the keys looked for. A TPF is never estimated.
* Tokens: with ``output_ids`` in the output, generated tokens are counted up to (excluding) the first EOS;
  otherwise ``meta_info["completion_tokens"]``, minus one when ``finish_reason`` matched a stop *token id*
  (SGLang counts the matched stop token; assumption, noted in ``forwards_note``).
* ``finish_reason``: SGLang ``{"type": "stop"}`` -> ``"eos"``, ``{"type": "length"}`` -> ``"length"``, other
  types kept as their name.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable, Iterator

from repro.paper.decoding import PaperDecodingError, sglang_sampling_params, to_sglang

#: The card's CUDA-graph options for the SDAR-style rollout (names from issue 4; values assumed on). Passed
#: only if the installed SGLang's ServerArgs knows them.
CARD_OPTIONS: dict[str, Any] = {"sdar_rollout_cuda_graph": True}

FORWARD_LIST_KEYS = ("dllm_forward_counts_per_block", "dllm_forward_counts")
FORWARD_TOTAL_KEYS = ("dllm_num_forward_passes",)
FORWARD_KEYS = FORWARD_LIST_KEYS + FORWARD_TOTAL_KEYS
DEFAULT_EOS_ID = 156892  # <|endoftext|> (engine_spec.md §5)


class SGLangBackendError(RuntimeError):
    """The SGLang backend cannot run as asked; the message says why and what to do."""


def engine_kwargs(model_dir: str, algorithm: str, config_path: str, tp_size: int = 1,
                  card_options: dict | None = None, server_fields: set[str] | None = None) -> tuple[dict, dict]:
    """The ``sgl.Engine`` keyword arguments and ``{"passed": [...], "dropped": [...]}`` for card options."""
    kw = dict(model_path=str(model_dir), trust_remote_code=True, tp_size=int(tp_size), mem_fraction_static=0.60,
              disable_cuda_graph=False, attention_backend="flashinfer", disable_radix_cache=True,
              dllm_algorithm=algorithm, dllm_algorithm_config=str(config_path))
    passed, dropped = [], []
    for k, v in (CARD_OPTIONS if card_options is None else card_options).items():
        if server_fields is not None and k in server_fields:
            kw[k] = v
            passed.append(k)
        else:
            dropped.append(k)
    return kw, {"passed": passed, "dropped": dropped}


def sglang_config_text(cfg: dict) -> str:
    """The YAML bytes of a dllm_algorithm_config (fixed key order, normalised numbers)."""
    from repro.paper.render_config import yaml_scalar

    return "".join(f"{k}: {yaml_scalar(v)}\n" for k, v in cfg.items())


def map_decoder(decoder: dict) -> tuple[str, dict, dict, list[str]]:
    """Engine decoder dict -> (dllm_algorithm, yaml dict, sampling_params, notes)."""
    if "algorithm" not in decoder:
        raise SGLangBackendError(
            "the SGLang backend takes the engine decoder config (keys algorithm, threshold, edit_threshold, "
            "editing, max_post_steps, max_new_tokens, ...); got keys " + ", ".join(sorted(decoder)) +
            ". Render it with `python -m repro.paper.render_config ... --backend engine`; the backend derives "
            "SGLang's dllm_algorithm and YAML itself")
    extra = {k: decoder[k] for k in ("penalty_lambda", "sglang_algorithm") if k in decoder}
    engine_only = {k: v for k, v in decoder.items() if k not in extra}
    try:
        name, cfg, notes = to_sglang(engine_only, extra)
    except PaperDecodingError as e:
        raise SGLangBackendError(str(e)) from None
    return name, cfg, sglang_sampling_params(engine_only), notes


def parse_forwards(meta: dict, generated_tokens: int) -> tuple[dict | None, float | None, str | None]:
    """(forwards, tpf, note) from one output's ``meta_info`` (see module docstring)."""
    for key in FORWARD_LIST_KEYS:
        counts = meta.get(key)
        if counts is None:
            continue
        if isinstance(counts, (int, float)) and not isinstance(counts, bool):
            return None, None, (f"meta_info[{key!r}] = {counts} is a total, not per-block counts; forwards "
                                "cannot be split into denoise/commit, TPF not computed")
        counts = [int(c) for c in counts]
        total = sum(counts)
        if not counts or total == 0:
            return None, None, f"meta_info[{key!r}] is empty; TPF not computed"
        fw = {"prefill": None, "denoise": total - len(counts), "commit": len(counts)}
        note = (f"forward counts from meta_info[{key!r}] ({len(counts)} blocks); each block's last forward "
                "counted as commit; prompt prefill not reported by SGLang")
        return fw, generated_tokens / total, note
    for key in FORWARD_TOTAL_KEYS:
        if key in meta:
            return None, None, (f"meta_info[{key!r}] = {meta[key]} is a total that cannot be split into "
                                "denoise/commit; TPF not computed")
    return None, None, ("the installed SGLang reports none of the meta_info keys " + ", ".join(FORWARD_KEYS) +
                        "; forward counts and TPF not available")


def parse_output(out: dict, prompt_text: str, wall_s: float | None, eos_id: int = DEFAULT_EOS_ID,
                 device: str = "cuda") -> dict:
    """One SGLang output dict (``text``, ``meta_info``, optional ``output_ids``) -> record fields."""
    meta = out.get("meta_info") or {}
    notes = []
    fr = meta.get("finish_reason")
    ftype = fr.get("type") if isinstance(fr, dict) else fr
    finish = {"stop": "eos", "length": "length"}.get(ftype, str(ftype) if ftype is not None else "unknown")
    if out.get("output_ids") is not None:
        ids = list(out["output_ids"])
        generated = ids.index(eos_id) if eos_id in ids else len(ids)
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


class SGLangBackend:
    """Generation through SGLang's offline engine (see the module docstring)."""

    name = "sglang"

    def __init__(self, model_dir: str, role: str = "orl", device: str = "cuda", precision: str = "bf16",
                 tp_size: int | None = None, work_dir: str | None = None, batch_size: int = 1,
                 card_options: dict | None = None):
        if not str(device).startswith("cuda"):
            raise SGLangBackendError(f"device={device!r}: SGLang runs on CUDA GPUs only; use the engine backend "
                                     "for CPU runs (the smoke suite)")
        if precision != "bf16":
            raise SGLangBackendError(f"precision={precision!r}: the SGLang backend runs the checkpoint in its own "
                                     "dtype (bf16); fp32 is an engine-backend option")
        self.model_dir, self.role, self.device, self.precision = str(model_dir), role, device, precision
        self.tp_size = int(tp_size or os.environ.get("REPRO_SGLANG_TP", 1))
        self.batch_size = max(1, int(batch_size))
        self.work_dir = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="repro-sglang-"))
        self.card_options = CARD_OPTIONS if card_options is None else card_options
        self.engine = None
        self._engine_key = None
        self._info: dict = {}
        self._format = None
        self.eos_id = self._eos_id()

    def _eos_id(self) -> int:
        for name in ("generation_config.json", "config.json"):
            p = Path(self.model_dir) / name
            if p.is_file():
                eos = json.loads(p.read_text()).get("eos_token_id")
                if isinstance(eos, list) and eos:
                    return int(eos[0])
                if isinstance(eos, int):
                    return eos
        return DEFAULT_EOS_ID

    def _sglang(self):
        try:
            import sglang as sgl
        except ImportError as e:
            raise SGLangBackendError(f"sglang is not importable here ({e}); run in the SGLang image "
                                     "(containers/sglang.def, containers.enabled: true) or install sglang "
                                     "with its CUDA wheels") from None
        return sgl

    @staticmethod
    def _server_fields() -> set[str] | None:
        try:
            import dataclasses

            from sglang.srt.server_args import ServerArgs

            return {f.name for f in dataclasses.fields(ServerArgs)}
        except Exception:  # noqa: BLE001 - unknown layout: pass no optional options
            return None

    @staticmethod
    def _check_algorithm(name: str) -> None:
        try:
            from sglang.srt.dllm.algorithm import algo_name_to_cls
        except Exception:  # noqa: BLE001 - older/newer layout: SGLang itself will report unknown names
            return
        known = algo_name_to_cls() if callable(algo_name_to_cls) else algo_name_to_cls
        if known and name not in known:
            raise SGLangBackendError(f"dllm_algorithm {name!r} is not in the installed SGLang; available: "
                                     + ", ".join(sorted(known)))

    def _ensure_engine(self, algorithm: str, cfg: dict) -> None:
        text = sglang_config_text(cfg)
        key = (algorithm, text)
        if self.engine is not None and self._engine_key == key:
            return
        if self.engine is not None:
            self.engine.shutdown()
        sgl = self._sglang()
        self._check_algorithm(algorithm)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        cfg_path = self.work_dir / "dllm_algorithm_config.yaml"
        cfg_path.write_text(text)
        kw, card = engine_kwargs(self.model_dir, algorithm, str(cfg_path), self.tp_size, self.card_options,
                                 self._server_fields())  # (the sdar_* fields it has are listed in describe())
        self.engine = sgl.Engine(**kw)
        self._engine_key = key
        fields = self._server_fields()
        self._info = {"dllm_algorithm": algorithm, "dllm_algorithm_config": cfg,
                      "sdar_server_args_available": sorted(f for f in (fields or ()) if f.startswith("sdar_")),
                      "dllm_algorithm_config_sha256": hashlib.sha256(text.encode()).hexdigest(),
                      "engine_kwargs": {k: v for k, v in kw.items() if k != "model_path"},
                      "card_options": card, "sglang": getattr(sgl, "__version__", "unknown")}

    def generate(self, prompts: Iterable, decoder: dict) -> Iterator[dict]:
        algorithm, cfg, sampling, notes = map_decoder(decoder)
        if self._format is None:
            self._format = ChatFormatter(self.model_dir)
        self._ensure_engine(algorithm, cfg)
        self._info["notes"] = notes
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
            yield parse_output(out, text, wall if len(texts) == 1 else None, self.eos_id, self.device)

    def describe(self) -> dict:
        dev = self.device
        try:
            import torch

            if torch.cuda.is_available():
                dev = torch.cuda.get_device_name(0)
        except Exception:  # noqa: BLE001
            pass
        return {"backend": "sglang", "device": dev, "precision": self.precision, "role": self.role,
                "tp_size": self.tp_size, **self._info}

    def close(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None
