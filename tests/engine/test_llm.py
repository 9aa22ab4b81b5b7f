"""The LLM API of docs/interfaces.md and the CLI (generate, bench suite on problem files in the benchmarks' original
layouts: the built-in ones of repro/data/builtin, which every clone has)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from repro.data import BUILTIN_DIR as DATA
from repro.engine import LLM

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def llm(tiny_dir):
    return LLM(tiny_dir, role="orl", precision="fp32", device="cpu")


def test_generate_messages_output_fields(llm, tiny_tok):
    msgs = [{"role": "user", "content": "What is 2+2?"}]
    o = llm.generate(msgs, max_new_tokens=40)
    assert o.prompt_text == llm.apply_chat_template(msgs)
    assert o.prompt_text.endswith("<|role_end|><role>ASSISTANT</role>")
    assert o.prompt_tokens == len(tiny_tok.encode(o.prompt_text))
    assert o.generated_tokens == len(o.token_ids) <= 40
    assert llm.eos_id not in o.token_ids and llm.mask_id not in o.token_ids
    assert o.text == tiny_tok.decode(o.token_ids)
    assert set(o.forwards) == {"prefill", "denoise", "commit"}
    assert o.tpf == pytest.approx(o.generated_tokens / (o.forwards["denoise"] + o.forwards["commit"]))
    assert o.request_tps == pytest.approx(o.generated_tokens / o.wall_s)
    assert o.finish_reason in ("eos", "length")
    assert o.decoder["algorithm"] == "orl" and o.decoder["max_new_tokens"] == 40


def test_string_prompt_is_used_as_is_and_matches_messages(llm):
    msgs = [{"role": "user", "content": "hello"}]
    a = llm.generate(msgs, max_new_tokens=16)
    b = llm.generate(llm.apply_chat_template(msgs), max_new_tokens=16)
    assert a.token_ids == b.token_ids and a.forwards == b.forwards
    with pytest.raises(TypeError):
        llm.generate(123)


def test_special_ids_found_by_name(llm, tiny_tok):
    assert llm.tokenizer.id_to_token(llm.mask_id) == "<|mask|>"
    assert llm.tokenizer.id_to_token(llm.eos_id) == "<|endoftext|>"


def test_roles_differ_through_the_adapter(tiny_dir, llm):
    base = LLM(tiny_dir, role="base", device="cpu")
    assert base.default_decoder().algorithm == "joint_threshold" and llm.default_decoder().algorithm == "orl"
    dec = {"algorithm": "orl", "max_new_tokens": 48}
    prompt = "<role>HUMAN</role>count to ten<|role_end|><role>ASSISTANT</role>"
    a, b = llm.generate(prompt, decoder=dec), base.generate(prompt, decoder=dec)
    assert a.raw_token_ids != b.raw_token_ids  # adapter g vs RCD interpolation
    with pytest.raises(ValueError, match="role"):
        LLM(tiny_dir, role="chat")


def _run(*args):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # tiny model: one thread is fastest (see conftest)
    return subprocess.run([sys.executable, "-m", "repro.engine", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=env)


def test_cli_generate(tiny_dir):
    r = _run("generate", "--model", str(tiny_dir), "--role", "orl", "--max-new-tokens", "24", "Hi there")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout.strip().splitlines()[-1])
    assert info["generated_tokens"] <= 24 and info["forwards"]["denoise"] >= 1
    bad = _run("generate", "--model", str(tiny_dir), "--threshold", "3", "x")
    assert bad.returncode == 2 and "threshold must be in" in bad.stderr


def test_cli_bench_suite_on_problem_files(tiny_dir, tmp_path):
    files = [str(DATA / f"{b}.jsonl") for b in ("gsm8k", "math500", "humaneval", "mbpp")]
    r = _run("bench", "suite", "--model", str(tiny_dir), "--role", "orl", "--threshold", "0.85",
             "--edit-threshold", "0.5", "--max-new-tokens", "40", "--problems", *files, "--out", str(tmp_path),
             "--limit", "2")
    assert r.returncode == 0, r.stderr
    recs = [json.loads(x) for x in (tmp_path / "records.jsonl").read_text().splitlines()]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [x["id"] for x in recs][:2] == ["gsm8k/0", "gsm8k/1"] and len(recs) == 8
    assert {x["benchmark"] for x in recs} == {"gsm8k", "math500", "humaneval", "mbpp"}
    for x in recs:
        assert x["generated_tokens"] == len(x["token_ids"]) <= 40
        assert x["decoder"]["threshold"] == 0.85 and x["decoder"]["edit_threshold"] == 0.5
        d = x["forwards"]["denoise"] + x["forwards"]["commit"]
        assert x["tpf"] == pytest.approx(x["generated_tokens"] / d)
        assert sum(x["block_forwards"]) == d
    ov = summary["overall"]
    assert ov["n"] == 8 and ov["generated_tokens"] == sum(x["generated_tokens"] for x in recs)
    for k in ("prefill", "denoise", "commit"):
        assert ov["forwards"][k] == sum(x["forwards"][k] for x in recs)
    assert ov["tpf"] == pytest.approx(ov["generated_tokens"] / (ov["forwards"]["denoise"] + ov["forwards"]["commit"]))
    assert summary["benchmarks"]["mbpp"]["n"] == 2


def test_graph_path_selection_on_cpu(tiny_dir, llm):
    assert llm.engine_path == "eager"  # CPU: the CUDA-graph path is not available, auto falls back
    with pytest.raises(ValueError, match="graphs must be"):
        LLM(tiny_dir, device="cpu", graphs="sometimes")
    with pytest.raises(ValueError, match="CUDA-graph engine path cannot run here: device cpu is not CUDA"):
        LLM(tiny_dir, device="cpu", graphs="on")


def test_device_and_kernel_choices_are_checked(tiny_dir):
    with pytest.raises(ValueError, match="device must be 'cpu', 'cuda' or 'cuda:N', got 'gpu'"):
        LLM(tiny_dir, device="gpu")
    with pytest.raises(ValueError, match="kernels='triton' needs a CUDA device"):
        LLM(tiny_dir, device="cpu", kernels="triton")


def test_empty_prompt_list_and_limit_0_are_refused_naming_the_fix(tiny_dir, llm):
    for kw in ({}, {"batch_size": 2}):
        with pytest.raises(ValueError, match="got an empty list: nothing to generate"):
            llm.generate([], **kw)
    r = _run("bench", "suite", "--model", str(tiny_dir), "--problems", str(DATA / "gsm8k.jsonl"), "--out", "x",
             "--limit", "0")
    assert r.returncode == 2 and "--limit 0: give N >= 1" in r.stderr, r.stderr


def test_bench_suite_names_a_bad_problem_file_and_batch_size(tmp_path, monkeypatch, capsys):
    """A problem file that is not JSONL is named with its line (before any model load: the checkpoint here
    does not exist); --batch-size 0 is an argument error naming the flag."""
    from repro.engine.__main__ import main

    bad = tmp_path / "notes.md"
    bad.write_text('{"question": "1+1?", "answer": "#### 2"}\n# a heading\n')
    args = ["bench", "suite", "--model", str(tmp_path / "no-checkpoint"), "--out", str(tmp_path / "o"), "--device",
            "cpu", "--threads", "1"]
    assert main(args + ["--problems", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:2: not valid JSON" in err and "benchmark JSONL files" in err and "checkpoint" not in err, err
    with pytest.raises(SystemExit):
        main(args + ["--problems", str(DATA / "gsm8k.jsonl"), "--batch-size", "0"])
    assert "--batch-size 0: give N >= 1" in capsys.readouterr().err


def test_a_request_over_the_context_is_refused_before_any_cache_is_allocated(tiny_dir, llm, tmp_path):
    """`generate --max-new-tokens 100000000` asked the allocator for 38 GB, and a 40k-token prompt crashed in
    attention; both now get the server's one-line refusal, from the CLI and from LLM.generate (one or a list)."""
    ctx = int(llm.config.max_position_embeddings)
    with pytest.raises(ValueError, match=rf"max_new_tokens=100000000 does not fit: .* model context is {ctx}; "
                                         r"ask for at most \d+"):
        llm.generate("Hi", max_new_tokens=10 ** 8)
    with pytest.raises(ValueError, match=rf"prompt 1: the prompt has \d+ tokens, the model context is {ctx}"):
        llm.generate(["Hi", "a " * ctx], max_new_tokens=4)
    r = _run("generate", "--model", str(tiny_dir), "--max-new-tokens", "100000000", "hi")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "does not fit" in r.stderr, r.stderr
    (tmp_path / "f.txt").write_text("x")
    r = _run("bench", "suite", "--model", str(tiny_dir), "--problems", str(DATA / "gsm8k.jsonl"),
             "--out", str(tmp_path / "f.txt"), "--limit", "1")
    assert r.returncode == 2 and "is a file; give a directory" in r.stderr and "Traceback" not in r.stderr
    r = _run("bench", "suite", "--model", str(tiny_dir), "--problems", str(DATA / "gsm8k.jsonl"),
             str(DATA / "gsm8k.jsonl"), "--out", str(tmp_path / "o"), "--limit", "1")
    assert r.returncode == 2 and "problem file given more than once" in r.stderr and not (tmp_path / "o").exists()
    for again in (False, True):  # a rerun into the same --out replaces its records, and says so
        r = _run("bench", "suite", "--model", str(tiny_dir), "--problems", str(DATA / "gsm8k.jsonl"),
                 "--out", str(tmp_path / "o"), "--limit", "1", "--max-new-tokens", "8")
        assert r.returncode == 0 and (f"note: {tmp_path / 'o' / 'records.jsonl'} exists (1 records)" in r.stderr) == again
