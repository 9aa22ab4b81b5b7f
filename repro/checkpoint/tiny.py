"""Write a tiny, real-format LLaDA2 MoE checkpoint (LLaDA2.1-mini-ORL layout at toy size).

What it writes into ``--out`` (byte-identical for the same ``--seed``):

* ``config.json`` — ``model_type`` ``llada2_moe`` with the real field names of docs/engine.md §1 at tiny
  values (hidden 64, 3 layers with ``first_k_dense_replace`` 1, 4 query / 2 KV heads, head_dim 16,
  partial rotary 0.5, 16 experts, 4 per token, ``n_group`` 4 / ``topk_group`` 2, sigmoid router with
  expert bias, routed scaling 2.5, 1 shared expert), plus ``orl_residual_adapter`` — this project's
  definition of the ORL residual adapter g (the real one is not public, docs/engine.md §8/§11); see
  :mod:`repro.engine.adapter` for the form and its keys.
* ``model-00001-of-00002.safetensors``, ``model-00002-of-00002.safetensors`` and
  ``model.safetensors.index.json`` — the real tensor names and ``[out, in]`` layouts of docs/engine.md §3
  (bf16 weights; router ``mlp.gate.weight`` and ``expert_bias`` stored fp32 — a documented choice, the real
  storage dtype is unknown), plus the adapter tensors.
* ``tokenizer.json`` — byte-level (256 byte tokens, id = byte value, so any UTF-8 text round-trips) plus
  the real special tokens as added special tokens; ``tokenizer_config.json`` with the LLaDA2.1 chat
  template (docs/engine.md §5) and special-token names; ``generation_config.json``;
  ``paper_decoding.json`` (copy of the packaged :data:`repro.paper.DEFAULT_PAPER_DECODING`);
  finally ``checkpoint_manifest.json`` (:func:`repro.checkpoint.manifest.write_manifest`).

Weights are a deterministic random init (``torch.Generator`` seeded with ``--seed``) scaled so that the
model's predictive distributions are neither uniform nor one-hot: the ``lm_head`` scale is chosen so a
sizeable fraction of positions pass a 0.85 confidence threshold while others do not, which makes the
decoders commit at varied confidences.

Not a model of language: the tiny model is random; it exists to exercise every code path on CPU.

CLI: ``python -m repro.checkpoint.tiny --out DIR [--seed S] [--nvfp4]``.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from repro.checkpoint.manifest import write_manifest
from repro.paper import DEFAULT_PAPER_DECODING

#: Special tokens of the LLaDA2 tokenizer family (docs/engine.md §1, §5), in the order they get ids
#: after the 256 byte tokens. The engine finds them by string, never by id.
SPECIAL_TOKENS = ["<|endoftext|>", "<|startoftext|>", "<|mask|>", "<role>", "</role>", "<|role_end|>"]

#: LLaDA2.1 chat template restated from docs/engine.md §5 (LLaDA2.1-flash tokenizer_config.json):
#: ``<role>SYSTEM</role>`` [system content + "\n"] ``detailed thinking off<|role_end|>``, then
#: ``<role>HUMAN</role>…<|role_end|>`` / ``<role>ASSISTANT</role>…<|role_end|>`` turns, generation prompt
#: ``<role>ASSISTANT</role>``. The optional tool block of the original is not reproduced.
CHAT_TEMPLATE = (
    "{%- set ns = namespace(start=0) -%}"
    "<role>SYSTEM</role>"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{{ messages[0]['content'] }}{{ '\\n' }}"
    "{%- set ns.start = 1 -%}"
    "{%- endif -%}"
    "detailed thinking off<|role_end|>"
    "{%- for message in messages[ns.start:] -%}"
    "{%- if message['role'] == 'user' -%}"
    "<role>HUMAN</role>{{ message['content'] }}<|role_end|>"
    "{%- elif message['role'] == 'assistant' -%}"
    "<role>ASSISTANT</role>{{ message['content'] }}<|role_end|>"
    "{%- else -%}"
    "{{ raise_exception('unsupported chat role: ' + message['role']) }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<role>ASSISTANT</role>{%- endif -%}"
)

#: Scale of the lm_head rows (logit std ≈ LM_HEAD_SCALE); see module docstring. Together with
#: QK_NORM_GAIN it was tuned so that ~35% of masked positions pass a 0.85 confidence threshold.
LM_HEAD_SCALE = 6.0
#: Mean of the QK-norm weights (attention logits ∝ its square).
QK_NORM_GAIN = 3.0


def tiny_config(vocab_size: int, eos_id: int) -> dict:
    """The tiny ``config.json`` dict: real LLaDA2.1-mini field names (docs/engine.md §1) at toy values.

    ``vocab_size``: tokenizer size (256 bytes + specials); ``eos_id``: id of ``<|endoftext|>`` (= pad, as
    in the real config). The ``orl_residual_adapter`` block is this project's adapter definition.
    """
    return {
        "architectures": ["LLaDA2MoeModelLM"],
        "model_type": "llada2_moe",
        "auto_map": {
            "AutoConfig": "configuration_llada2_moe.LLaDA2MoeConfig",
            "AutoModel": "modeling_llada2_moe.LLaDA2MoeModel",
            "AutoModelForCausalLM": "modeling_llada2_moe.LLaDA2MoeModelLM",
        },
        "dtype": "bfloat16",
        "transformers_version": "4.57.1",
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 128,
        "first_k_dense_replace": 1,
        "moe_intermediate_size": 32,
        "num_experts": 16,
        "num_experts_per_tok": 4,
        "num_shared_experts": 1,
        "n_group": 4,
        "topk_group": 2,
        "routed_scaling_factor": 2.5,
        "score_function": "sigmoid",
        "moe_router_enable_expert_bias": True,
        "norm_topk_prob": True,
        "router_dtype": "fp32",
        "rope_theta": 600000,
        "partial_rotary_factor": 0.5,
        "rotary_dim": 8,
        "rope_scaling": None,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "use_qk_norm": True,
        "use_qkv_bias": False,
        "use_bias": False,
        "use_rmsnorm": True,
        "tie_word_embeddings": False,
        "norm_head": False,
        "norm_softmax": False,
        "hidden_act": "silu",
        "pad_token_id": eos_id,
        "eos_token_id": eos_id,
        "sliding_window": 4096,
        "max_window_layers": 28,
        "use_sliding_window": False,
        "embedding_dropout": 0.0,
        "attention_dropout": 0.0,
        "output_dropout": 0.0,
        "output_router_logits": False,
        "initializer_range": 0.02,
        "orl_residual_adapter": {
            "type": "mlp_silu",
            "rank": 16,
            "alpha": 1.0,
            "temperature": 0.92,
            "tensors": {
                "down": "model.orl_adapter.down_proj.weight",
                "up": "model.orl_adapter.up_proj.weight",
            },
        },
    }


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2 byte→printable-unicode map used by byte-level BPE (bytes 0..255 → 256 distinct chars)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def build_tokenizer():
    """A byte-level ``tokenizers.Tokenizer``: id b (0..255) is byte b; specials get ids 256.. in
    :data:`SPECIAL_TOKENS` order. Encoding then decoding any UTF-8 string returns it unchanged."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    b2u = _bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return tok


def _randn(gen: torch.Generator, shape, std: float, mean: float = 0.0) -> torch.Tensor:
    return torch.randn(shape, generator=gen, dtype=torch.float32) * std + mean


def random_tensors(cfg: dict, seed: int) -> dict[str, torch.Tensor]:
    """Checkpoint-named random tensors for ``cfg`` (docs/engine.md §3 names and ``[out, in]`` shapes).

    Deterministic for ``seed``. Returned in fp32; :func:`write_tiny` casts for storage.
    Scales: embeddings N(0,1); projections N(0, 1/in); down projections halved; norms 1 + N(0, 0.1²)
    (non-unit so a mis-mapped norm changes outputs); router N(0, 1/in) (logits ~ N(0,1)); expert bias
    N(0, 0.1²); QK-norm weights N(QK_NORM_GAIN, 0.3²) (sharp, position-dependent attention, so masked
    positions of one block do not all predict the same token); ``lm_head`` N(0, (LM_HEAD_SCALE²)/hidden); adapter down N(0, 1/hidden), up N(0, 0.25/rank).
    """
    g = torch.Generator().manual_seed(int(seed))
    D, V = cfg["hidden_size"], cfg["vocab_size"]
    H, KV, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    I, MI, E = cfg["intermediate_size"], cfg["moe_intermediate_size"], cfg["num_experts"]
    S = cfg["num_shared_experts"] * MI
    t: dict[str, torch.Tensor] = {}

    def lin(out_f, in_f, scale=1.0):
        return _randn(g, (out_f, in_f), scale / in_f ** 0.5)

    def norm(n):
        return _randn(g, (n,), 0.1, 1.0)

    t["model.word_embeddings.weight"] = _randn(g, (V, D), 1.0)
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        t[p + "input_layernorm.weight"] = norm(D)
        t[p + "attention.query_key_value.weight"] = lin((H + 2 * KV) * hd, D)
        t[p + "attention.query_layernorm.weight"] = _randn(g, (hd,), 0.3, QK_NORM_GAIN)
        t[p + "attention.key_layernorm.weight"] = _randn(g, (hd,), 0.3, QK_NORM_GAIN)
        t[p + "attention.dense.weight"] = lin(D, H * hd)
        t[p + "post_attention_layernorm.weight"] = norm(D)
        if l < cfg["first_k_dense_replace"]:
            t[p + "mlp.gate_proj.weight"] = lin(I, D)
            t[p + "mlp.up_proj.weight"] = lin(I, D)
            t[p + "mlp.down_proj.weight"] = lin(D, I, 0.5)
            continue
        t[p + "mlp.gate.weight"] = lin(E, D)
        t[p + "mlp.gate.expert_bias"] = _randn(g, (E,), 0.1)
        for e in range(E):
            q = f"{p}mlp.experts.{e}."
            t[q + "gate_proj.weight"] = lin(MI, D)
            t[q + "up_proj.weight"] = lin(MI, D)
            t[q + "down_proj.weight"] = lin(D, MI, 0.5)
        t[p + "mlp.shared_experts.gate_proj.weight"] = lin(S, D)
        t[p + "mlp.shared_experts.up_proj.weight"] = lin(S, D)
        t[p + "mlp.shared_experts.down_proj.weight"] = lin(D, S, 0.5)
    t["model.norm.weight"] = norm(D)
    t["lm_head.weight"] = lin(V, D, LM_HEAD_SCALE)
    ad = cfg.get("orl_residual_adapter")
    if ad:
        r = ad["rank"]
        t[ad["tensors"]["down"]] = lin(r, D)
        t[ad["tensors"]["up"]] = lin(D, r, 0.5)
    return t


#: Tensors stored in fp32 in the tiny checkpoint (router, docs/engine.md §1 ``router_dtype`` fp32).
FP32_SUFFIXES = ("mlp.gate.weight", "mlp.gate.expert_bias")


def storage_dtype(name: str) -> torch.dtype:
    """Storage dtype of a tiny-checkpoint tensor: fp32 for the router, bf16 for everything else."""
    return torch.float32 if name.endswith(FP32_SUFFIXES) else torch.bfloat16


def shard_of(name: str, cfg: dict) -> int:
    """Shard index (0 or 1): embeddings and the first half of the layers go to shard 0, the rest to 1."""
    if name.startswith("model.layers."):
        layer = int(name.split(".")[2])
        return 0 if layer < (cfg["num_hidden_layers"] + 1) // 2 else 1
    return 0 if name.startswith("model.word_embeddings") else 1


def _write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def write_shards(out: Path, tensors: dict[str, torch.Tensor], cfg: dict, n_shards: int = 2) -> None:
    """Write ``tensors`` (already in storage dtype) as ``n_shards`` safetensors files + index JSON."""
    names = sorted(tensors)
    files = [f"model-{i + 1:05d}-of-{n_shards:05d}.safetensors" for i in range(n_shards)]
    weight_map, groups = {}, [dict() for _ in range(n_shards)]
    for n in names:
        s = min(shard_of(n, cfg), n_shards - 1)
        groups[s][n] = tensors[n].contiguous()
        weight_map[n] = files[s]
    total = 0
    for f, grp in zip(files, groups):
        save_file(grp, str(out / f), metadata={"format": "pt"})
        total += sum(v.numel() * v.element_size() for v in grp.values())
    _write_json(out / "model.safetensors.index.json",
                {"metadata": {"total_size": total}, "weight_map": weight_map})


def write_tokenizer_files(out: Path) -> dict[str, int]:
    """Write ``tokenizer.json`` and ``tokenizer_config.json``; return special token → id."""
    tok = build_tokenizer()
    tok.save(str(out / "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    _write_json(out / "tokenizer_config.json", {
        "add_bos_token": False,
        "add_eos_token": False,
        "bos_token": "<|startoftext|>",
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "mask_token": "<|mask|>",
        "additional_special_tokens": ["<role>", "</role>", "<|role_end|>"],
        "added_tokens_decoder": {str(i): {"content": t, "special": True, "normalized": False,
                                          "lstrip": False, "rstrip": False, "single_word": False}
                                 for t, i in ids.items()},
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 32768,
        "tokenizer_class": "PreTrainedTokenizerFast",
    })
    return ids


def write_tiny(out: str | Path, seed: int = 0, nvfp4: bool = False,
               mask_head: tuple[int, float] | None = None) -> dict:
    """Write the tiny checkpoint into ``out`` (created; existing files overwritten). Returns the manifest.

    ``mask_head=(t, s)`` sets the ``lm_head`` row of ``<|mask|>`` to ``s ×`` the row of token ``t``, so the
    mask token wins the argmax (over the full vocabulary) wherever ``t`` is a strong candidate — a checkpoint
    on which the references' "mask is a candidate" rule matters (``(196, 1.05)`` with seed 1: the mask wins at
    a few percent of the positions a decoder sees and blocks still finish).

    ``nvfp4=True`` writes the NVFP4 (ModelOpt-export layout) variant: routed-expert weights quantized by
    :mod:`repro.checkpoint.nvfp4` from the same bf16 weights, ``quantization_config`` in config.json,
    ``hf_quant_config.json`` and ``quant_provenance.json`` (how it was made); the manifest hashes them all.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ids = write_tokenizer_files(out)
    cfg = tiny_config(vocab_size=256 + len(SPECIAL_TOKENS), eos_id=ids["<|endoftext|>"])
    raw = random_tensors(cfg, seed)
    if mask_head is not None:
        t, scale = mask_head
        raw["lm_head.weight"][ids["<|mask|>"]] = float(scale) * raw["lm_head.weight"][int(t)]
    tensors = {n: v.to(storage_dtype(n)) for n, v in raw.items()}
    if nvfp4:
        from repro.checkpoint import nvfp4 as q
        tensors = q.quantize_experts(tensors)
        cfg["quantization_config"] = q.quantization_config()
        _write_json(out / "hf_quant_config.json", q.hf_quant_config())
        _write_json(out / "quant_provenance.json", {
            "quantized_from": f"the tiny BF16 checkpoint of seed {seed} (python -m repro.checkpoint.tiny --seed {seed})",
            "quantizer": "repro.checkpoint.nvfp4.quantize (global scale amax/(6*448), E4M3 block scales per 16 "
                         "inputs, E2M1 round to nearest, ties to the lower magnitude)",
            "quantized_tensors": "routed experts' gate_proj / up_proj / down_proj",
            "layout": "NVIDIA ModelOpt NVFP4 Hugging Face export"})
    _write_json(out / "config.json", cfg)
    write_shards(out, tensors, cfg)
    _write_json(out / "generation_config.json", {
        "bos_token_id": ids["<|startoftext|>"], "eos_token_id": ids["<|endoftext|>"],
        "pad_token_id": ids["<|endoftext|>"], "mask_token_id": ids["<|mask|>"],
        "transformers_version": "4.57.1"})
    shutil.copyfile(DEFAULT_PAPER_DECODING, out / "paper_decoding.json")
    return write_manifest(out)


def main(argv=None) -> int:
    """CLI entry: ``python -m repro.checkpoint.tiny --out DIR [--seed S] [--nvfp4]``."""
    ap = argparse.ArgumentParser(prog="python -m repro.checkpoint.tiny", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output directory (created)")
    ap.add_argument("--seed", type=int, default=0, help="weight-init seed (same seed → same bytes)")
    ap.add_argument("--nvfp4", action="store_true", help="write the NVFP4 (ModelOpt) variant")
    a = ap.parse_args(argv)
    if Path(a.out).exists() and not Path(a.out).is_dir():
        ap.error(f"--out {a.out}: is a file; give a directory (created when missing)")
    m = write_tiny(a.out, a.seed, a.nvfp4)
    print(json.dumps({"out": str(a.out), "seed": a.seed, "manifest_sha256": m["manifest_sha256"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
