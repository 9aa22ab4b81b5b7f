"""SGLang backend without SGLang: exact sgl.Engine arguments, decoder mapping, output parsing.

The outputs parsed here are CONSTRUCTED fixtures (fixtures/sglang_outputs_CONSTRUCTED.json), not recordings
of a real SGLang run; a stub ``sglang`` module stands in for the package.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import types
from pathlib import Path

import pytest
import yaml

from repro.backends.sglang import (SGLangBackend, SGLangBackendError, engine_kwargs, map_decoder, parse_output,
                                   server_arg_names, stop_token_ids)
from repro.paper.decoding import load_paper_decoding, resolve_decoder
from repro.paper.render_config import render

FIX = Path(__file__).with_name("fixtures")
CASES = json.loads((FIX / "sglang_outputs_CONSTRUCTED.json").read_text())["cases"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_parse_constructed_outputs(case):
    rec = parse_output(case["output"], "PROMPT", wall_s=0.5)
    for k, v in case["expected"].items():
        assert rec[k] == (pytest.approx(v) if isinstance(v, float) else v), k
    assert rec["completion"] == case["output"]["text"]
    assert rec["tokens_per_s"] == pytest.approx(rec["generated_tokens"] / 0.5)
    if rec["forwards"] is None:
        assert rec["tpf"] is None
        assert "TPF not computed" in rec["forwards_note"] or "TPF not measured" in rec["forwards_note"]


RELEASED_FIELDS = ("model_path", "trust_remote_code", "tp_size", "mem_fraction_static", "attention_backend",
                   "disable_radix_cache", "disable_cuda_graph", "dllm_algorithm", "dllm_algorithm_config",
                   "dllm_fdfo", "max_running_requests", "cuda_graph_max_bs_decode", "cuda_graph_max_bs_prefill")
CARD_FIELDS = RELEASED_FIELDS + ("sdar_rollout_cuda_graph", "sdar_rollout_cuda_graph_capture_sizes")


def test_engine_kwargs_exactly_as_model_card():
    kw = engine_kwargs("/ckpt", "ignored", "/w/decoder.yaml", frozenset(CARD_FIELDS), card=True)
    assert kw == {"model_path": "/ckpt", "trust_remote_code": True, "tp_size": 1,
                  "dllm_algorithm": "SDARPrefixKV", "sdar_rollout_cuda_graph": True,
                  "sdar_rollout_cuda_graph_capture_sizes": [1, 2], "attention_backend": "flashinfer",
                  "mem_fraction_static": 0.60, "disable_radix_cache": True,
                  "dllm_algorithm_config": "/w/decoder.yaml"}
    with pytest.raises(SGLangBackendError, match="no field sdar_rollout_cuda_graph, .*ORL build"):
        engine_kwargs("/ckpt", "x", "/d.yaml", frozenset(RELEASED_FIELDS), card=True)


def test_engine_kwargs_mainline_limits_under_the_released_names():
    kw = engine_kwargs("/ckpt", "JointThreshold", "/c.yaml", frozenset(RELEASED_FIELDS), max_running_requests=4,
                       cuda_graph_max_bs=8)
    assert kw["dllm_algorithm"] == "JointThreshold" and kw["max_running_requests"] == 4
    assert kw["cuda_graph_max_bs_decode"] == kw["cuda_graph_max_bs_prefill"] == 8 and "cuda_graph_max_bs" not in kw
    old = frozenset(RELEASED_FIELDS[:-2] + ("cuda_graph_max_bs",))
    assert engine_kwargs("/c", "LowConfidence", "/c.yaml", old, cuda_graph_max_bs=8)["cuda_graph_max_bs"] == 8


def test_server_arg_names_reads_msgspec_struct_and_dataclass_and_fails_loudly():
    import msgspec

    Struct = msgspec.defstruct("ServerArgs", [(f, object, None) for f in RELEASED_FIELDS])
    with pytest.raises(TypeError):
        dataclasses.fields(Struct)  # what the backend used to call (error swallowed, options dropped)
    assert server_arg_names(Struct) == frozenset(RELEASED_FIELDS)
    DC = dataclasses.make_dataclass("ServerArgs", [(f, object, None) for f in RELEASED_FIELDS])
    assert server_arg_names(DC) == frozenset(RELEASED_FIELDS)
    with pytest.raises(SGLangBackendError, match="neither a dataclass nor a msgspec struct"):
        server_arg_names(type("ServerArgs", (), {}))


def test_stop_ids_are_every_eos_of_the_checkpoint_and_tokenizer(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [156892, 156900]}))
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 156892}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": "<|role_end|>", "added_tokens_decoder": {"156901": {"content": "<|role_end|>"}}}))
    assert stop_token_ids(tmp_path) == (156892, 156900, 156901)
    out = {"text": "ab", "output_ids": [5, 6, 156900],
           "meta_info": {"completion_tokens": 3, "finish_reason": {"type": "stop", "matched": 156900}}}
    assert parse_output(out, "P", 1.0, stop_token_ids(tmp_path))["generated_tokens"] == 2  # not 3
    assert parse_output(out, "P", 1.0, (156892,))["generated_tokens"] == 3  # the old first-id-only count


def test_map_decoder_matches_render_config():
    pd = load_paper_decoding()
    dec = resolve_decoder(pd, "main", "llada-orl", "humaneval", 7)
    name, cfg, sampling, notes = map_decoder(dec)
    text, meta = render("main", "llada-orl", "humaneval", 7, backend="sglang")
    assert name == meta["dllm_algorithm"] == "JointThreshold"
    assert cfg == yaml.safe_load(text) == meta["sglang_config"]
    assert sampling == {"temperature": 0.0, "max_new_tokens": 4096}
    with pytest.raises(SGLangBackendError, match="--backend engine"):
        map_decoder(dict(cfg, seed=7))  # an SGLang-keyed dict is refused with the fix


def _install_stub(monkeypatch, build: str):
    """A stand-in ``sglang`` package shaped as 0.5.23 as released (``build="0.5.23"``: ServerArgs a msgspec
    struct, Engine(**kw) = ServerArgs(**kw) so an unknown keyword is a TypeError, the four released
    algorithms, outputs with the released meta_info keys) or as the model card's ORL build (``"orl"``: also
    ``SDARPrefixKV`` and the ``sdar_*`` fields). Records Engine kwargs, generate calls and shutdowns."""
    import msgspec

    calls = {"engine": [], "generate": [], "shutdown": 0}
    outputs = [c["output"] for c in CASES]
    fields = CARD_FIELDS if build == "orl" else RELEASED_FIELDS
    ServerArgs = msgspec.defstruct("ServerArgs", [(f, object, None) for f in fields], kw_only=True)

    class Engine:
        def __init__(self, **kw):
            ServerArgs(**kw)
            calls["engine"].append(kw)
            calls["config_text"] = Path(kw["dllm_algorithm_config"]).read_text()

        def generate(self, prompt, sampling_params):
            calls["generate"].append((prompt, sampling_params))
            if isinstance(prompt, list):
                return [outputs[(len(calls["generate"]) + i) % len(outputs)] for i in range(len(prompt))]
            return outputs[(len(calls["generate"]) - 1) % len(outputs)]

        def shutdown(self):
            calls["shutdown"] += 1

    algos = {"LowConfidence": object, "JointThreshold": object, "JointThresholdInDel": object,
             "Gemma4Renoise": object}
    if build == "orl":
        algos["SDARPrefixKV"] = object
    sgl = types.ModuleType("sglang")
    sgl.Engine, sgl.__version__ = Engine, ("0.5.23" if build == "0.5.23" else "0.5.23+orl")
    mods = {"sglang": sgl, "sglang.srt": types.ModuleType("sglang.srt"),
            "sglang.srt.server_args": types.ModuleType("sglang.srt.server_args"),
            "sglang.srt.dllm": types.ModuleType("sglang.srt.dllm"),
            "sglang.srt.dllm.algorithm": types.ModuleType("sglang.srt.dllm.algorithm")}
    mods["sglang.srt.server_args"].ServerArgs = ServerArgs
    mods["sglang.srt.dllm.algorithm"].algo_name_to_cls = algos
    for k, v in mods.items():
        monkeypatch.setitem(sys.modules, k, v)
    return calls


@pytest.fixture
def stub_sglang(monkeypatch):
    return _install_stub(monkeypatch, "0.5.23")


@pytest.fixture
def stub_orl_build(monkeypatch):
    return _install_stub(monkeypatch, "orl")


@pytest.fixture
def ckpt(tmp_path):
    d = tmp_path / "ckpt"
    d.mkdir()
    shutil.copy(FIX / "tokenizer_config_CONSTRUCTED.json", d / "tokenizer_config.json")
    (d / "config.json").write_text(json.dumps({"eos_token_id": 156892}))
    return d


class P:
    def __init__(self, text):
        self.messages = [{"role": "user", "content": text}]
        self.stop = []


def test_base_role_on_released_sglang_end_to_end(stub_sglang, ckpt, tmp_path):
    be = SGLangBackend(str(ckpt), role="base", device="cuda", precision="bf16", work_dir=str(tmp_path / "w"))
    assert be.describe()["engine_started"] is False
    dec = resolve_decoder(load_paper_decoding(), "main", "llada", "gsm8k", 12345, {"max_new_tokens": 256})
    recs = list(be.generate([P("What is 2+2?"), P("Hi")], dec))
    assert len(recs) == 2 and len(stub_sglang["engine"]) == 1
    kw = stub_sglang["engine"][0]
    assert kw["dllm_algorithm"] == "JointThreshold" and kw["mem_fraction_static"] == 0.60
    assert "max_running_requests" not in kw and not any(k.startswith("sdar_") for k in kw)
    assert yaml.safe_load(stub_sglang["config_text"]) == {"block_size": 32, "threshold": 0.5,
                                                          "edit_threshold": 0.0, "max_post_edit_steps": 16,
                                                          "penalty_lambda": 0.0}
    prompt, sp = stub_sglang["generate"][0]
    assert prompt == ("<role>SYSTEM</role>detailed thinking off<|role_end|><role>HUMAN</role>What is 2+2?"
                      "<|role_end|><role>ASSISTANT</role>")
    assert sp == {"temperature": 0.0, "max_new_tokens": 256}
    assert recs[0]["prompt_text"] == prompt and recs[0]["forwards"]["commit"] == 3
    assert recs[0]["device"] == "cuda" and recs[0]["wall_s"] > 0
    info = be.describe()  # after generate: the engine's provenance is there
    assert info["engine_started"] and info["dllm_algorithm"] == "JointThreshold" and info["sglang"] == "0.5.23"
    assert info["engine_kwargs"]["dllm_algorithm_config"].endswith("dllm_algorithm_config.yaml")
    assert info["max_running_requests"].startswith("unset: SGLang runs dLLM requests one at a time")
    assert len(info["dllm_algorithm_config_sha256"]) == 64
    be.close()
    assert stub_sglang["shutdown"] == 1


def test_released_meta_info_gives_no_tpf_and_says_why(stub_sglang, ckpt, tmp_path):
    be = SGLangBackend(str(ckpt), role="base", work_dir=str(tmp_path / "w"))
    dec = resolve_decoder(load_paper_decoding(), "main", "llada", "gsm8k", 1)
    rec = [r for r in be.generate([P(str(i)) for i in range(len(CASES))], dec)][-1]  # the 0.5.23 case
    assert rec["forwards"] is None and rec["tpf"] is None and rec["generated_tokens"] == 6
    assert "SGLang reported no forward counts" in rec["forwards_note"]


def test_orl_role_refused_on_released_sglang(stub_sglang, ckpt, tmp_path):
    be = SGLangBackend(str(ckpt), role="orl", work_dir=str(tmp_path / "w"))
    dec = resolve_decoder(load_paper_decoding(), "main", "llada-orl", "gsm8k", 1)
    with pytest.raises(SGLangBackendError, match=r"role 'orl' refused .*lacks algorithm SDARPrefixKV.*adapter "
                                                 r"would be dropped without a word.*PYTHONPATH"):
        list(be.generate([P("x")], dec))
    assert stub_sglang["engine"] == []  # refused before loading the model


def test_orl_role_on_the_card_build_reproduces_the_card(stub_orl_build, ckpt, tmp_path):
    be = SGLangBackend(str(ckpt), role="orl", work_dir=str(tmp_path / "w"))
    dec = resolve_decoder(load_paper_decoding(), "main", "llada-orl", "gsm8k", 7)
    recs = list(be.generate([P("x")], dec))
    kw = stub_orl_build["engine"][0]
    assert {k: kw[k] for k in ("dllm_algorithm", "sdar_rollout_cuda_graph", "sdar_rollout_cuda_graph_capture_sizes",
                               "attention_backend", "mem_fraction_static", "disable_radix_cache")} == {
        "dllm_algorithm": "SDARPrefixKV", "sdar_rollout_cuda_graph": True,
        "sdar_rollout_cuda_graph_capture_sizes": [1, 2], "attention_backend": "flashinfer",
        "mem_fraction_static": 0.60, "disable_radix_cache": True}
    assert kw["dllm_algorithm_config"].endswith("decoder.yaml")
    assert yaml.safe_load(stub_orl_build["config_text"]) == dec  # the engine-format decoder.yaml
    info = be.describe()
    assert info["orl_build"] is True and info["sdar_server_args_available"] == list(
        ("sdar_rollout_cuda_graph", "sdar_rollout_cuda_graph_capture_sizes"))
    assert len(recs) == 1
    with pytest.raises(SGLangBackendError, match="runs the model card's SDARPrefixKV"):
        list(be.generate([P("x")], dict(dec, sglang_algorithm="JointThreshold")))


def test_batched_calls_use_e2e_latency(stub_sglang, ckpt, tmp_path):
    be = SGLangBackend(str(ckpt), role="base", work_dir=str(tmp_path / "w"), batch_size=2)
    dec = resolve_decoder(load_paper_decoding(), "main", "llada", "gsm8k", 1)
    recs = list(be.generate([P("a"), P("b"), P("c")], dec))
    assert [isinstance(p, list) for p, _ in stub_sglang["generate"]] == [True, False]
    assert len(recs) == 3
    assert stub_sglang["engine"][0]["max_running_requests"] == 2 and be.describe()["max_running_requests"] == 2


def test_unknown_algorithm_refused_before_loading(stub_sglang, ckpt, tmp_path):
    be = SGLangBackend(str(ckpt), role="base", work_dir=str(tmp_path / "w"))
    dec = resolve_decoder(load_paper_decoding(), "main", "llada-orl", "gsm8k", 1)
    with pytest.raises(SGLangBackendError, match="SDARPrefixKV.*not in the installed SGLang"):
        list(be.generate([P("x")], dict(dec, sglang_algorithm="SDARPrefixKV")))
    assert stub_sglang["engine"] == []


def test_cpu_and_missing_sglang_fail_clearly(ckpt, monkeypatch):
    with pytest.raises(SGLangBackendError, match="CUDA"):
        SGLangBackend(str(ckpt), device="cpu", precision="fp32")
    monkeypatch.setitem(sys.modules, "sglang", None)  # import sglang -> ImportError
    be = SGLangBackend(str(ckpt))
    dec = resolve_decoder(load_paper_decoding(), "main", "llada", "gsm8k", 1)
    with pytest.raises(SGLangBackendError, match="not importable"):
        list(be.generate([P("x")], dec))


def test_module_import_does_not_import_sglang():
    import subprocess

    from plumbing_util import env_with_repo
    code = "import sys, repro.backends.sglang; print('sglang' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], env=env_with_repo(), capture_output=True, text=True)
    assert r.stdout.strip() == "False", r.stderr


def test_chat_format_matches_engine_on_tiny_checkpoint(tmp_path):
    """The SGLang backend formats prompts exactly as our engine does (same checkpoint chat template)."""
    pytest.importorskip("torch")
    from repro.checkpoint.tiny import write_tiny
    from repro.backends.sglang import ChatFormatter
    from repro.engine import LLM

    write_tiny(tmp_path / "tiny", seed=0)
    llm = LLM(str(tmp_path / "tiny"), role="orl", precision="fp32", device="cpu")
    fmt = ChatFormatter(tmp_path / "tiny")
    for msgs in ([{"role": "user", "content": "What is 2+2?"}],
                 [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "a\nb"}]):
        assert fmt(msgs) == llm.apply_chat_template(msgs)
