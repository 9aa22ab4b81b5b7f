"""Batched generation (repro.engine.batch): batch invariance on real problems, continuous batching, errors."""

import json

import pytest
import torch

from repro.engine import LLM
from repro.engine.batch import BatchRequest, BatchStats, generate_batch
from repro.engine.layers.linear import ROW_TILE, linear
from repro.engine.model import Chunk

import eval_data

DATA = eval_data.looked_at()


@pytest.fixture(scope="module")
def llm(tiny_dir):
    return LLM(tiny_dir, role="orl", precision="fp32", device="cpu")


def test_linear_rows_do_not_depend_on_the_other_rows():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(48, 64, generator=g)
    x = torch.randn(3 * ROW_TILE + 5, 64, generator=g)
    full = linear(x, w)
    for m in (1, 2, 3, 7, ROW_TILE, ROW_TILE + 1):
        assert torch.equal(linear(x[:m], w), full[:m]), m
    assert torch.allclose(full, x @ w.t(), atol=1e-5)
    assert linear(x[:0], w).shape == (0, 48)


def test_forward_chunks_bit_identical_to_each_chunk_alone(tiny_model):
    """Logits and K/V of a request's block are the same bits alone or stacked with others (different
    prefix lengths, a prefill and a logits-free commit in the same forward)."""
    m = tiny_model

    def make():  # same prompts and prefix caches each call (the forward is deterministic)
        g = torch.Generator().manual_seed(3)
        chunks = []
        for i in range(5):
            P = 32 * (1 + i % 3)
            cache = m.new_cache(P + 32)
            ids = torch.randint(0, 256, (P + 32,), generator=g)
            m.forward(ids[:P], 0, cache, 32, logits=False)
            chunks.append(Chunk(P, cache, 32, ids=ids[P:], logits=i != 2))
        chunks.append(Chunk(0, m.new_cache(64), 32, ids=torch.randint(0, 256, (64,), generator=g), logits=False))
        return chunks

    with torch.inference_mode():
        a, b = make(), make()
        alone = [m.forward(c.ids, c.start, c.cache, 32, logits=c.logits) for c in a]
        batched = m.forward_chunks(b)
    assert batched[2] is None and batched[5] is None
    for x, y, ca, cb in zip(alone, batched, a, b):
        assert (x is None) == (y is None)
        if x is not None:
            assert torch.equal(x, y)
        assert torch.equal(ca.cache.k, cb.cache.k) and torch.equal(ca.cache.v, cb.cache.v)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # stalled blocks of the random tiny model: counted alike
@pytest.mark.parametrize("algorithm", ["orl", "joint_threshold"])
def test_greedy_batch_invariance_on_real_problems(llm, algorithm):
    """10 real GSM8K/HumanEval prompts: token ids and forward counts equal one at a time, batch 1, 3, 8."""
    prompts = eval_data.chat_prompts(5)
    dec = {"algorithm": algorithm, "max_new_tokens": 64}
    single = [llm.generate(p, decoder=dec) for p in prompts]
    lengths = {o.generated_tokens for o in single}
    assert len(lengths) > 1, "all requests the same length: continuous batching not exercised"
    for bs in (1, 3, 8):
        stats = BatchStats()
        outs = llm.generate_batch(prompts, decoder=dec, batch_size=bs, stats=stats)
        assert [o.token_ids for o in outs] == [o.token_ids for o in single], bs
        assert [o.forwards for o in outs] == [o.forwards for o in single], bs
        assert [o.block_forwards for o in outs] == [o.block_forwards for o in single], bs
        assert stats.max_active == min(bs, len(prompts))
        if bs > 1:  # a finished slot was refilled before the slowest request ended
            assert stats.rounds < sum(o.forwards["prefill"] + o.forwards["denoise"] + o.forwards["commit"]
                                      for o in single)
            assert any(0 < r for r in stats.admitted_at_round[bs:])


def test_generate_list_api(llm):
    prompts = ["2+2=", [{"role": "user", "content": "hi"}], "x" * 70]
    outs = llm.generate(prompts, decoder={"algorithm": "low_confidence", "max_new_tokens": 16}, batch_size=2)
    assert isinstance(outs, list) and len(outs) == 3
    alone = llm.generate("x" * 70, decoder={"algorithm": "low_confidence", "max_new_tokens": 16})
    assert outs[2].token_ids == alone.token_ids and outs[2].prompt_text == "x" * 70
    assert outs[1].prompt_text == llm.apply_chat_template(prompts[1])
    one = llm.generate([{"role": "user", "content": "hi"}], decoder={"max_new_tokens": 8})  # messages: single
    assert not isinstance(one, list)
    with pytest.raises(ValueError, match="batch_size"):
        llm.generate(prompts, batch_size=0)
    with pytest.raises(ValueError, match="single prompt"):
        llm.generate("2+2=", batch_size=4)
    with pytest.raises(ValueError, match="on_block"):
        llm.generate(prompts, on_block=lambda ids: False)


def test_one_bad_request_fails_the_batch_with_its_error(llm):
    ok = BatchRequest(llm.tokenizer_.encode("2+2="), {"max_new_tokens": 8})
    bad = BatchRequest([llm.model.cfg.vocab_size + 5], {"max_new_tokens": 8})
    with pytest.raises(ValueError, match="outside vocabulary"):
        generate_batch(llm.model, [ok, ok, bad, ok], mask_id=llm.mask_id, eos_id=llm.eos_id, batch_size=2)


def test_sampling_with_seeds_is_batch_invariant(llm):
    prompts = ["a" * 40, "bcd", "hello world " * 3]
    dec = {"algorithm": "joint_threshold", "temperature": 0.8, "max_new_tokens": 32}
    single = [llm.generate(p, decoder=dec, seed=7) for p in prompts]
    outs = llm.generate(prompts, decoder=dec, seed=7, batch_size=3)
    assert [o.token_ids for o in outs] == [o.token_ids for o in single]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_bench_suite_batch_size_8_records_equal_batch_1(tiny_dir, tmp_path):
    """`python -m repro.engine bench suite --batch-size 8` on real problems: same token ids as --batch-size 1.
    On the CPU (pinned): on a GPU batch 1 runs the single-request graph path and batch 8 the batched graph
    path, which are not bit-identical to each other (docs/perf_history.md "Batched generation")."""
    from repro.engine.__main__ import main

    eval_data.require("humaneval.jsonl")  # skips without the real problem files
    recs = {}
    for bs in (1, 8):
        out = tmp_path / f"bs{bs}"
        assert main(["bench", "suite", "--model", str(tiny_dir), "--role", "orl", "--max-new-tokens", "40",
                     "--problems", str(DATA / "gsm8k.jsonl"), str(DATA / "humaneval.jsonl"), "--limit", "5",
                     "--out", str(out), "--batch-size", str(bs), "--device", "cpu"]) == 0
        recs[bs] = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
        summary = json.loads((out / "summary.json").read_text())
        assert summary["batch"]["batch_size"] == bs
    assert len(recs[1]) == 10
    assert [(r["id"], r["token_ids"], r["forwards"]) for r in recs[8]] == \
        [(r["id"], r["token_ids"], r["forwards"]) for r in recs[1]]
    assert summary["batch"]["rounds"] > 0 and summary["batch"]["throughput_tokens_per_s"] > 0
    assert summary["threads"] == torch.get_num_threads()


def test_bench_suite_cpu_threads(tiny_dir, tmp_path, monkeypatch, capsys):
    """On the CPU `bench suite` (and `serve`) runs torch with 1 thread per operation unless `--threads` or
    $OMP_NUM_THREADS says otherwise (more threads slowed the tiny model's batched rounds several-fold). The
    suite itself is replaced (summary.json's `threads` is checked above)."""
    import repro.engine.suite as S
    from repro.engine.__main__ import main

    monkeypatch.setattr(S, "run_suite", lambda *a, **kw: {"threads": torch.get_num_threads()})

    def threads(*extra):
        assert main(["bench", "suite", "--model", str(tiny_dir), "--problems", "x.jsonl", "--out", str(tmp_path),
                     "--device", "cpu", *extra]) == 0
        return json.loads(capsys.readouterr().out.splitlines()[-1])["threads"]

    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        torch.set_num_threads(2)
        assert threads() == 1
        assert threads("--threads", "2") == 2
        monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the user's own setting is kept
        torch.set_num_threads(2)
        assert threads() == 2
        with pytest.raises(SystemExit):
            threads("--threads", "0")
        assert "--threads 0: give N >= 1" in capsys.readouterr().err
        import repro.engine.serve as SV  # `serve` takes the same default

        seen = []
        monkeypatch.setattr(SV, "serve_main", lambda a, precision: seen.append(torch.get_num_threads()) or 0)
        monkeypatch.delenv("OMP_NUM_THREADS")
        torch.set_num_threads(2)
        assert main(["serve", "--model", str(tiny_dir), "--device", "cpu"]) == 0
        assert main(["serve", "--model", str(tiny_dir), "--device", "cpu", "--threads", "2"]) == 0
        assert seen == [1, 2]
    finally:
        torch.set_num_threads(1)


def test_row_grouped_moe_impl_sees_one_shape_and_pads_without_new_experts(tiny_model):
    """An implementation listed in ROW_GROUPS (the Triton seam) is called with exactly that many rows; the
    pad rows use row 0's experts, so no other expert is read; results equal the direct call."""
    from repro.engine.layers import moe

    p, q = tiny_model.params, "layers.1.moe."
    g = torch.Generator().manual_seed(5)
    x = torch.randn(40, tiny_model.cfg.hidden_size, generator=g)
    w, ids = moe.route(x, p[q + "router"], p.get(q + "expert_bias"), 4, tiny_model.cfg.n_group,
                       tiny_model.cfg.topk_group, 2.5)
    seen = []

    def fake(x_, a, b, w_, i_):
        seen.append((x_.shape[0], set(i_.unique().tolist())))
        return moe.moe_forward_torch(x_, a, b, w_, i_)
    moe.register_moe_impl("triton", fake)
    moe.set_moe_impl("triton")
    try:
        out = moe.moe_forward(x, p[q + "w_gate_up"], p[q + "w_down"], w, ids)
    finally:
        moe.set_moe_impl("torch")
    assert [n for n, _ in seen] == [moe.ROW_GROUPS["triton"]]
    assert seen[0][1] == set(ids.unique().tolist())
    assert torch.equal(out, moe.moe_forward_torch(x, p[q + "w_gate_up"], p[q + "w_down"], w, ids))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_bench_batch_sections_run_on_the_tiny_model(tiny_model, tiny_tok):
    """The GPU benchmark's sections (repro/engine/bench/batch.py) on the CPU with the tiny model: fixed
    schedule, figures present, invariance passes — so the one H200 run has no untested code path."""
    from repro.engine.bench import batch as bb

    thr = bb.bench_throughput(tiny_model, tiny_tok.mask_id, prefix=64, tokens=64, batch_sizes=[1, 3], steps=8,
                              copy_gbps=10.0, seed=0, log=lambda m: None)
    assert [r["batch_size"] for r in thr] == [1, 3] and thr[0]["speedup_vs_batch1"] == 1.0
    for r in thr:
        assert r["forwards_per_request"] == {"prefill": 1, "denoise": 16, "commit": 2}  # 8 rounds + commit per block
        assert r["generated_tokens"] == r["requests"] * 64 and r["floor_ms"] > 0 and r["rows_per_round"] > 0
    assert thr[1]["rows_per_round"] == 3 * thr[0]["rows_per_round"]
    inv = bb.bench_invariance(tiny_model, tiny_tok.mask_id, tiny_tok.eos_id, n_prompts=4, prefix=80, tokens=32,
                              algorithms=("joint_threshold", "orl"), seed=0, log=lambda m: None)
    assert all(r["pass"] for r in inv.values()), inv
    text = bb.table({"gpu": "cpu", "copy_GBps": 10.0, "throughput": thr, "invariance": inv})
    assert "invariance orl: PASS" in text and "batch" in text
    assert not hasattr(tiny_model.__dict__, "forward_chunks") and "forward_chunks" not in tiny_model.__dict__


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_bench_batch_run_writes_its_json_and_table(tiny_model, tiny_tok, tmp_path, monkeypatch, capsys):
    """`bench batch`'s driver end to end on the CPU (the model builder swapped for the tiny model)."""
    import argparse

    from repro.engine.bench import batch as bb

    monkeypatch.setattr(bb, "_model", lambda seed, precision="bf16": (tiny_model, tiny_tok.mask_id, tiny_tok.eos_id))
    out = tmp_path / "b.json"
    a = argparse.Namespace(prefix=64, batch_tokens=32, batch_sizes="1,2", steps_per_block=8, seed=0,
                           sections="throughput,invariance", algorithms="orl", invariance_prompts=3,
                           invariance_tokens=32, json=str(out))
    assert bb.run(a, lambda: {"gpu": "cpu-test"}, lambda: 10.0) == 0
    doc = json.loads(out.read_text())
    assert [r["batch_size"] for r in doc["throughput"]] == [1, 2] and doc["invariance"]["orl"]["pass"]
    assert json.loads(capsys.readouterr().out.splitlines()[-1]) == doc
