"""Named architecture presets (gpt-fast style): real ``config.json`` dicts for building models without a checkpoint.

``LLADA21_MINI``: LLaDA2.1-mini (docs/engine.md §1, values from the HF config page); the ORL adapter is not
public, so the preset has none. Use with :meth:`repro.engine.model.LLaDA2Model.random` for full-size GPU
benchmarks::

    cfg = LLaDA2Config.from_dict(PRESETS["llada2.1-mini"])
    model = LLaDA2Model.random(cfg, device="cuda", dtype="bf16", seed=0)
"""

LLADA21_MINI = {
    "architectures": ["LLaDA2MoeModelLM"], "model_type": "llada2_moe", "vocab_size": 157184,
    "hidden_size": 2048, "num_hidden_layers": 20, "num_attention_heads": 16, "num_key_value_heads": 4,
    "head_dim": 128, "intermediate_size": 5120, "first_k_dense_replace": 1, "moe_intermediate_size": 512,
    "num_experts": 256, "num_experts_per_tok": 8, "num_shared_experts": 1, "n_group": 8, "topk_group": 4,
    "routed_scaling_factor": 2.5, "score_function": "sigmoid", "moe_router_enable_expert_bias": True,
    "norm_topk_prob": True, "router_dtype": "fp32", "rope_theta": 600000, "partial_rotary_factor": 0.5,
    "rotary_dim": 64, "rope_scaling": None, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
    "use_qk_norm": True, "use_qkv_bias": False, "use_bias": False, "tie_word_embeddings": False,
    "norm_head": False, "hidden_act": "silu", "pad_token_id": 156892, "eos_token_id": 156892,
}

#: name → config dict
PRESETS = {"llada2.1-mini": LLADA21_MINI}

#: name → id of ``<|mask|>`` in the preset's tokenizer (a tokenizer fact, not in config.json; LLaDA2.1-mini:
#: 156895: SGLang ``python/sglang/srt/dllm/config.py`` DLLM_PARAMS and the HF ``generate`` default mask_id)
PRESET_MASK_IDS = {"llada2.1-mini": 156895}
