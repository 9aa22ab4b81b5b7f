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

from repro.backends.sglang import (SGLangBackend, SGLangBackendError, engine_kwargs, map_decoder, parse_output)
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
        assert "TPF not computed" in rec["forwards_note"] or "not available" in rec["forwards_note"]


def test_engine_kwargs_exactly_as_model_card():
    kw, card = engine_kwargs("/ckpt", "JointThreshold", "/w/cfg.yaml", tp_size=1,
                             server_fields={"sdar_rollout_cuda_graph", "tp_size"})
    assert kw == {"model_path": "/ckpt", "trust_remote_code": True, "tp_size": 1, "mem_fraction_static": 0.60,
                  "disable_cuda_graph": False, "attention_backend": "flashinfer", "disable_radix_cache": True,
                  "dllm_algorithm": "JointThreshold", "dllm_algorithm_config": "/w/cfg.yaml",
                  "sdar_rollout_cuda_graph": True}
    kw, card = engine_kwargs("/ckpt", "LowConfidence", "/c.yaml", server_fields={"tp_size"})
    assert "sdar_rollout_cuda_graph" not in kw and card == {"passed": [], "dropped": ["sdar_rollout_cuda_graph"]}


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


@pytest.fixture
def stub_sglang(monkeypatch):
    """A stand-in ``sglang`` package recording Engine(...) kwargs and generate(...) calls."""
    calls = {"engine": [], "generate": []}
    outputs = [c["output"] for c in CASES]

    class Engine:
        def __init__(self, **kw):
            calls["engine"].append(kw)
            calls["config_text"] = Path(kw["dllm_algorithm_config"]).read_text()

        def generate(self, prompt, sampling_params):
            calls["generate"].append((prompt, sampling_params))
            if isinstance(prompt, list):
                return [outputs[(len(calls["generate"]) + i) % len(outputs)] for i in range(len(prompt))]
            return outputs[(len(calls["generate"]) - 1) % len(outputs)]

        def shutdown(self):
            calls["shutdown"] = True

    @dataclasses.dataclass
    class ServerArgs:
        model_path: str = ""
        tp_size: int = 1
        dllm_algorithm: str = ""

    sgl = types.ModuleType("sglang")
    sgl.Engine, sgl.__version__ = Engine, "0.0-stub"
    mods = {"sglang": sgl, "sglang.srt": types.ModuleType("sglang.srt"),
            "sglang.srt.server_args": types.ModuleType("sglang.srt.server_args"),
            "sglang.srt.dllm": types.ModuleType("sglang.srt.dllm"),
            "sglang.srt.dllm.algorithm": types.ModuleType("sglang.srt.dllm.algorithm")}
    mods["sglang.srt.server_args"].ServerArgs = ServerArgs
    mods["sglang.srt.dllm.algorithm"].algo_name_to_cls = {"LowConfidence": object, "JointThreshold": object}
    for k, v in mods.items():
        monkeypatch.setitem(sys.modules, k, v)
    return calls


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


def test_backend_end_to_end_with_stub(stub_sglang, ckpt, tmp_path):
    be = SGLangBackend(str(ckpt), role="orl", device="cuda", precision="bf16", work_dir=str(tmp_path / "w"))
    dec = resolve_decoder(load_paper_decoding(), "main", "llada-orl", "gsm8k", 12345, {"max_new_tokens": 256})
    recs = list(be.generate([P("What is 2+2?"), P("Hi")], dec))
    assert len(recs) == 2 and len(stub_sglang["engine"]) == 1
    kw = stub_sglang["engine"][0]
    assert kw["dllm_algorithm"] == "JointThreshold" and kw["mem_fraction_static"] == 0.60
    assert "sdar_rollout_cuda_graph" not in kw  # the stub's ServerArgs does not know it
    assert yaml.safe_load(stub_sglang["config_text"]) == {"block_size": 32, "threshold": 0.85,
                                                          "edit_threshold": 0.5, "max_post_edit_steps": 16,
                                                          "penalty_lambda": 0.0}
    prompt, sp = stub_sglang["generate"][0]
    assert prompt == ("<role>SYSTEM</role>detailed thinking off<|role_end|><role>HUMAN</role>What is 2+2?"
                      "<|role_end|><role>ASSISTANT</role>")
    assert sp == {"temperature": 0.0, "max_new_tokens": 256}
    assert recs[0]["prompt_text"] == prompt and recs[0]["forwards"]["commit"] == 3
    assert recs[0]["device"] == "cuda" and recs[0]["wall_s"] > 0
    info = be.describe()
    assert info["card_options"]["dropped"] == ["sdar_rollout_cuda_graph"] and info["notes"]
    assert len(info["dllm_algorithm_config_sha256"]) == 64


def test_batched_calls_use_e2e_latency(stub_sglang, ckpt, tmp_path):
    be = SGLangBackend(str(ckpt), work_dir=str(tmp_path / "w"), batch_size=2)
    dec = resolve_decoder(load_paper_decoding(), "main", "llada", "gsm8k", 1)
    recs = list(be.generate([P("a"), P("b"), P("c")], dec))
    assert [isinstance(p, list) for p, _ in stub_sglang["generate"]] == [True, False]
    assert len(recs) == 3


def test_unknown_algorithm_refused_before_loading(stub_sglang, ckpt, tmp_path):
    be = SGLangBackend(str(ckpt), work_dir=str(tmp_path / "w"))
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
