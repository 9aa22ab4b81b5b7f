"""render_config: the model card's command, byte stability, schema validation, engine and SGLang keys."""

from __future__ import annotations

import hashlib
import json

import pytest
import yaml

from plumbing_util import run_py
from repro.paper import DEFAULT_PAPER_DECODING
from repro.paper.decoding import (ENGINE_KEYS, PaperDecodingError, load_paper_decoding, resolve_decoder,
                                  to_sglang, validate_paper_decoding)
from repro.paper.render_config import render

CARD = ["-m", "repro.paper.render_config", "--suite", "main", "--model", "llada-orl", "--benchmark", "gsm8k",
        "--seed", "12345", "--out", "decoder.yaml"]


def test_model_card_command_works_and_is_byte_stable(tmp_path):
    r1 = run_py(CARD, cwd=tmp_path)
    assert r1.returncode == 0, r1.stderr
    first = (tmp_path / "decoder.yaml").read_bytes()
    r2 = run_py(CARD, cwd=tmp_path)
    assert r2.returncode == 0, r2.stderr
    assert (tmp_path / "decoder.yaml").read_bytes() == first
    digest = hashlib.sha256(first).hexdigest()
    assert r1.stdout.split() == [digest, "decoder.yaml"]
    dec = yaml.safe_load(first)
    # the model card's ORL decoder: threshold 0.85, edit 0.5, 16 refine steps, 4096 tokens, self-conditioning
    assert dec == {"algorithm": "orl", "block_size": 32, "threshold": 0.85, "edit_threshold": 0.5,
                   "editing": True, "max_post_steps": 16, "max_new_tokens": 4096, "temperature": 0.0,
                   "self_conditioning": True, "exclude_mask_token": False, "seed": 12345}
    assert list(dec) == [k for k in ENGINE_KEYS if k in dec]


def test_hash_and_meta_out(tmp_path):
    r = run_py(CARD + ["--hash-out", "h.txt", "--meta-out", "m.json"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    digest = hashlib.sha256((tmp_path / "decoder.yaml").read_bytes()).hexdigest()
    assert (tmp_path / "h.txt").read_text() == digest + "\n"
    meta = json.loads((tmp_path / "m.json").read_text())
    assert meta["sha256"] == digest and meta["source_kind"] == "packaged"


def test_sglang_yaml_has_exactly_the_keys_sglang_reads():
    text, meta = render("main", "llada-orl", "gsm8k", 12345, backend="sglang")
    cfg = yaml.safe_load(text)
    assert list(cfg) == ["block_size", "threshold", "edit_threshold", "max_post_edit_steps", "penalty_lambda"]
    assert cfg == {"block_size": 32, "threshold": 0.85, "edit_threshold": 0.5, "max_post_edit_steps": 16,
                   "penalty_lambda": 0.0}
    assert meta["dllm_algorithm"] == "JointThreshold"
    assert meta["sampling_params"] == {"temperature": 0.0, "max_new_tokens": 4096}
    assert any("self_conditioning" in n for n in meta["notes"])  # the ORL gap is said, not hidden


def test_sglang_low_confidence_and_editing_off():
    pd = load_paper_decoding()
    dec = resolve_decoder(pd, "main", "llada", "mbpp", 1, {"algorithm": "low_confidence"})
    name, cfg, _ = to_sglang(dec)
    assert name == "LowConfidence" and list(cfg) == ["block_size", "threshold"]
    dec = resolve_decoder(pd, "main", "llada", "mbpp", 1, {"editing": False})
    name, cfg, notes = to_sglang(dec)
    # SGLang edits when p > edit_threshold: 1.0 turns editing off; 0.0 would mean full editing
    assert name == "JointThreshold" and cfg["edit_threshold"] == 1.0 and notes
    dec = resolve_decoder(pd, "main", "llada", "mbpp", 1, {"temperature": 0.7})
    with pytest.raises(PaperDecodingError, match="argmax"):
        to_sglang(dec)


def test_set_overrides_normalised_and_validated(tmp_path):
    a, _ = render("main", "llada", "gsm8k", 7, overrides={"threshold": 1, "max_new_tokens": 64})
    b, _ = render("main", "llada", "gsm8k", 7, overrides={"threshold": 1.0, "max_new_tokens": 64.0})
    assert a == b
    assert yaml.safe_load(a)["max_new_tokens"] == 64
    r = run_py(CARD[:-2] + ["--out", "x.yaml", "--set", "threshold=1.5"], cwd=tmp_path)
    assert r.returncode == 2 and "threshold" in r.stderr and "maximum" in r.stderr
    r = run_py(CARD[:-2] + ["--out", "x.yaml", "--set", "thresold=0.9"], cwd=tmp_path)
    assert r.returncode == 2 and "unknown decoder key" in r.stderr and "threshold" in r.stderr
    r = run_py(CARD[:-2] + ["--out", "x.yaml", "--set", "penalty_lambda=3"], cwd=tmp_path)
    assert r.returncode == 2 and "--backend sglang" in r.stderr
    assert not (tmp_path / "x.yaml").exists()


def test_checkpoint_file_wins_and_is_validated(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    text_default, meta = render("main", "llada-orl", "gsm8k", 1, checkpoint=ckpt)
    assert meta["source_kind"] == "packaged"
    data = json.loads(DEFAULT_PAPER_DECODING.read_text())
    data["suites"]["main"]["llada-orl"]["benchmarks"]["gsm8k"] = {"threshold": 0.9}
    (ckpt / "paper_decoding.json").write_text(json.dumps(data))
    text, meta = render("main", "llada-orl", "gsm8k", 1, checkpoint=ckpt)
    assert meta["source_kind"] == "checkpoint" and yaml.safe_load(text)["threshold"] == 0.9
    assert text != text_default
    data["suites"]["main"]["llada-orl"]["defaults"]["treshold"] = 0.9
    (ckpt / "paper_decoding.json").write_text(json.dumps(data))
    with pytest.raises(PaperDecodingError, match="treshold"):
        render("main", "llada-orl", "gsm8k", 1, checkpoint=ckpt)


def test_packaged_default_values_are_the_model_card_ones():
    data = json.loads(DEFAULT_PAPER_DECODING.read_text())
    validate_paper_decoding(data)
    d = data["suites"]["main"]["llada-orl"]["defaults"]
    assert (d["threshold"], d["edit_threshold"], d["max_post_steps"], d["max_new_tokens"],
            d["self_conditioning"]) == (0.85, 0.5, 16, 4096, True)
    bad = json.loads(DEFAULT_PAPER_DECODING.read_text())
    bad["engine"]["block_size"] = "32"
    with pytest.raises(PaperDecodingError, match="engine/block_size"):
        validate_paper_decoding(bad)


def test_unknown_suite_model_benchmark_named(tmp_path):
    for args, word in ((["--suite", "mian"], "no suite"), (["--model", "orl"], "no decoder model"),
                       (["--benchmark", "gsmk"], "no benchmark")):
        cmd = list(CARD)
        i = cmd.index(args[0])
        cmd[i + 1] = args[1]
        r = run_py(cmd, cwd=tmp_path)
        assert r.returncode == 2 and word in r.stderr and "available" in r.stderr
        if word == "no suite":  # a workflow run shows this in the job's log tail: it names the config key
            assert "suites.<suite>.decoder_suite" in r.stderr, r.stderr


def test_sglang_out_beside_engine_config(tmp_path):
    r = run_py(CARD + ["--sglang-out", "sglang.yaml", "--meta-out", "m.json"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert yaml.safe_load((tmp_path / "decoder.yaml").read_text())["algorithm"] == "orl"
    text, meta = render("main", "llada-orl", "gsm8k", 12345, backend="sglang")
    assert (tmp_path / "sglang.yaml").read_text() == text
    assert json.loads((tmp_path / "m.json").read_text())["sglang"]["sha256"] == meta["sha256"]
