"""The tiny LLaDA2 checkpoint writer: determinism, real names and layouts, tokenizer, chat template."""

import json

import jinja2
import pytest
from safetensors import safe_open
from tokenizers import Tokenizer

from repro.checkpoint.manifest import build_manifest
from repro.checkpoint.tiny import SPECIAL_TOKENS, write_tiny


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    write_tiny(d, seed=7)
    return d


def test_same_seed_is_byte_identical_and_other_seed_differs(tiny, tmp_path):
    write_tiny(tmp_path / "a", seed=7)
    write_tiny(tmp_path / "b", seed=8)
    for f in sorted(p.name for p in tiny.iterdir()):
        assert (tmp_path / "a" / f).read_bytes() == (tiny / f).read_bytes(), f
    assert (tmp_path / "b" / "model-00001-of-00002.safetensors").read_bytes() != \
        (tiny / "model-00001-of-00002.safetensors").read_bytes()


def test_config_has_real_fields_at_tiny_values(tiny):
    cfg = json.loads((tiny / "config.json").read_text())
    assert cfg["model_type"] == "llada2_moe" and cfg["architectures"] == ["LLaDA2MoeModelLM"]
    expect = dict(hidden_size=64, num_hidden_layers=3, first_k_dense_replace=1, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, partial_rotary_factor=0.5, num_experts=16,
                  num_experts_per_tok=4, n_group=4, topk_group=2, moe_intermediate_size=32,
                  intermediate_size=128, num_shared_experts=1, routed_scaling_factor=2.5,
                  score_function="sigmoid", moe_router_enable_expert_bias=True, vocab_size=262)
    for k, v in expect.items():
        assert cfg[k] == v, k
    ad = cfg["orl_residual_adapter"]
    assert set(ad) >= {"type", "tensors", "alpha", "temperature"}


def test_sharded_index_maps_every_tensor_with_real_names(tiny):
    index = json.loads((tiny / "model.safetensors.index.json").read_text())
    files = set(index["weight_map"].values())
    assert len(files) == 2
    seen = {}
    for f in files:
        with safe_open(str(tiny / f), "pt") as h:
            for k in h.keys():
                seen[k] = (f, tuple(h.get_slice(k).get_shape()))
    assert {k: v[0] for k, v in seen.items()} == index["weight_map"]
    assert seen["model.layers.0.attention.query_key_value.weight"][1] == ((4 + 2 * 2) * 16, 64)
    assert seen["model.layers.0.mlp.gate_proj.weight"][1] == (128, 64)
    assert seen["model.layers.1.mlp.experts.15.down_proj.weight"][1] == (64, 32)
    assert seen["model.layers.2.mlp.gate.expert_bias"][1] == (16,)
    assert seen["lm_head.weight"][1] == (262, 64)
    assert "model.layers.0.mlp.gate.weight" not in seen  # layer 0 is dense
    assert "model.orl_adapter.down_proj.weight" in seen


def test_tokenizer_round_trips_and_has_special_tokens(tiny):
    tok = Tokenizer.from_file(str(tiny / "tokenizer.json"))
    text = "Ünïcode ✓ 日本語\n\ttabs  and  spaces; <|mask|> inside"
    ids = tok.encode(text).ids
    assert tok.decode(ids, skip_special_tokens=False) == text
    for t in SPECIAL_TOKENS:
        assert tok.token_to_id(t) is not None and tok.token_to_id(t) >= 256
    assert tok.token_to_id("<|mask|>") in ids


def test_chat_template_renders_canonical_llada21_string(tiny):
    tc = json.loads((tiny / "tokenizer_config.json").read_text())
    tmpl = jinja2.Environment().from_string(tc["chat_template"])
    out = tmpl.render(messages=[{"role": "user", "content": "2+2?"}], add_generation_prompt=True)
    assert out == ("<role>SYSTEM</role>detailed thinking off<|role_end|><role>HUMAN</role>2+2?"
                   "<|role_end|><role>ASSISTANT</role>")
    out = tmpl.render(messages=[{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "x"}], add_generation_prompt=False)
    assert out == "<role>SYSTEM</role>Be brief.\ndetailed thinking off<|role_end|><role>HUMAN</role>x<|role_end|>"


def test_manifest_and_paper_decoding_present(tiny):
    m = json.loads((tiny / "checkpoint_manifest.json").read_text())
    assert m == build_manifest(tiny)
    assert json.loads((tiny / "paper_decoding.json").read_text())["schema_version"] == 1


def test_tiny_cli_refuses_an_out_path_that_is_a_file(tmp_path, capsys):
    from repro.checkpoint.tiny import main as tiny_main

    f = tmp_path / "config.json"
    f.write_text("{}")
    with pytest.raises(SystemExit) as e:
        tiny_main(["--out", str(f)])
    assert e.value.code == 2 and "is a file; give a directory" in capsys.readouterr().err and f.read_text() == "{}"
