"""Tensor / expert parallelism on the CPU (gloo, fp32, the tiny checkpoint): one request over 2 and 4 ranks
gives one rank's greedy tokens and forward counts on real benchmark prompts, also at precision nvfp4-w4a16 on the
tiny NVFP4 checkpoint (packed experts split by expert); bad sizes, missing devices, a dead rank and a hung rank
each end in one clear error without a hang (repro.engine.parallel, repro.engine.ranks)."""

import dataclasses
import os
import signal
import time
from pathlib import Path

import pytest

from repro.data import load_problems
from repro.engine.llm import LLM
from repro.engine.parallel import ShardPlan, parallel_problem
from repro.engine.ranks import TensorParallelError, check_devices, rank_device
from repro.prompts import build_prompt

BUDGET = 48  # new tokens per request: two decoded blocks of the tiny model's paper block size


@pytest.fixture(scope="module")
def prompts():
    """Two real problems (GSM8K, HumanEval) rendered with the project's prompt templates."""
    data_dir = Path(os.environ.get("ORL_EVAL_DATA", Path(__file__).resolve().parents[2].parent / "shared" / "data"))
    if not (data_dir / "gsm8k.jsonl").is_file():
        pytest.skip("real benchmark data not found (set ORL_EVAL_DATA or place it at ../shared/data)")
    out = []
    for bench in ("gsm8k", "humaneval"):
        p = load_problems(bench, data_dir, limit=1).problems[0]
        out.append(build_prompt(bench, p["source"]).messages)
    return out


@pytest.fixture(scope="module")
def one_rank(tiny_dir, prompts):
    """One rank's outputs: {(decoder, prompt index): (token ids, forwards)}."""
    llm = LLM(tiny_dir, role="orl", device="cpu", precision="fp32")
    return {(alg, i): (o.token_ids, o.forwards) for alg in ("joint_threshold", "orl")
            for i, o in enumerate(llm.generate(p, {"algorithm": alg, "max_new_tokens": BUDGET}) for p in prompts)}


def test_tiny_model_splits_over_2_and_4_ranks(tiny_model):
    cfg = tiny_model.cfg
    assert cfg.num_experts % 4 == 0 and cfg.num_attention_heads % 4 == 0
    assert parallel_problem(cfg, 2) is None and parallel_problem(cfg, 4) is None
    # 4 ranks > 2 KV heads: each rank holds the one KV head its query head uses (replicated on 2 ranks)
    plans = [ShardPlan(cfg, 4, r) for r in range(4)]
    assert [list(p.kv_heads) for p in plans] == [[0], [0], [1], [1]]
    assert [len(p.experts) for p in plans] == [cfg.num_experts // 4] * 4
    assert sum(len(p.vocab) for p in plans) == cfg.vocab_size  # uneven vocabulary slices cover every id once


@pytest.mark.parametrize("n", [2, 4])
def test_n_ranks_give_one_ranks_tokens_and_forwards(tiny_dir, prompts, one_rank, n):
    with LLM(tiny_dir, role="orl", device="cpu", precision="fp32", tensor_parallel_size=n) as llm:
        assert llm.tensor_parallel_size == n and len(llm.ranks.pids) == n - 1
        for alg in ("joint_threshold", "orl"):
            for i, p in enumerate(prompts):
                o = llm.generate(p, {"algorithm": alg, "max_new_tokens": BUDGET})
                assert (o.token_ids, o.forwards) == one_rank[(alg, i)], (alg, i)
                assert o.generated_tokens > 0


def test_two_ranks_host_decoder_paths(tiny_dir, prompts):
    """The host decoders under tensor parallelism: the mask column excluded on the rank that holds it (greedy),
    and sampling (full logits gathered; every rank draws from the same seed) — both as one rank."""
    ref = LLM(tiny_dir, role="base", device="cpu", precision="fp32")
    cases = [{"algorithm": "low_confidence", "exclude_mask_token": True, "max_new_tokens": BUDGET},
             {"algorithm": "joint_threshold", "temperature": 0.7, "seed": 3, "max_new_tokens": BUDGET}]
    want = [ref.generate(prompts[0], d) for d in cases]
    with LLM(tiny_dir, role="base", device="cpu", precision="fp32", tensor_parallel_size=2) as llm:
        for d, w in zip(cases, want):
            o = llm.generate(prompts[0], d)
            assert (o.token_ids, o.forwards) == (w.token_ids, w.forwards), d


def test_sizes_that_do_not_split_are_refused_before_any_rank_starts(tiny_dir, tiny_model):
    with pytest.raises(ValueError, match=r"tensor_parallel_size 3 does not divide the model's 4 attention heads.*"
                                         r"splits over \[1, 2, 4\]"):
        LLM(tiny_dir, device="cpu", tensor_parallel_size=3)
    cfg = dataclasses.replace(tiny_model.cfg, num_attention_heads=12, num_key_value_heads=4, num_experts=24,
                              intermediate_size=96, moe_intermediate_size=48)
    assert "neither divides the model's 4 KV heads" in parallel_problem(cfg, 6)
    assert parallel_problem(cfg, 12) is None  # 3 ranks share each KV head
    assert "integer ≥ 1" in parallel_problem(cfg, 0)


def test_fewer_gpus_than_ranks_is_refused():
    with pytest.raises(ValueError, match=r"needs GPUs cuda:0..cuda:3, but 2 GPU\(s\) are visible"):
        check_devices("cuda", 4, available=2)
    with pytest.raises(ValueError, match=r"cuda:1..cuda:4"):
        check_devices("cuda:1", 4, available=4)
    check_devices("cuda:4", 4, available=8)
    check_devices("cpu", 8)
    assert [rank_device("cuda:2", r) for r in range(2)] == ["cuda:2", "cuda:3"] and rank_device("cpu", 3) == "cpu"


@pytest.mark.parametrize("how", ["killed", "hung"])
def test_a_rank_lost_mid_request_is_one_error_not_a_hang(tiny_dir, prompts, how):
    """Rank 1 is killed (SIGKILL) or frozen (SIGSTOP) after the first decoded block: rank 0 raises
    TensorParallelError naming what happened (a closed peer at once, a frozen one at the collective timeout),
    returns nothing, stops the ranks, and refuses the next request."""
    llm = LLM(tiny_dir, role="orl", device="cpu", precision="fp32", tensor_parallel_size=2, tp_timeout_s=8)
    pid = llm.ranks.pids[0]
    sig = signal.SIGKILL if how == "killed" else signal.SIGSTOP

    def lose_rank_1(ids):
        os.kill(pid, sig)
        return False

    t0 = time.monotonic()
    with pytest.raises(TensorParallelError, match="request abandoned, nothing returned") as e:
        llm.generate(prompts[0], {"algorithm": "orl", "max_new_tokens": BUDGET}, on_block=lose_rank_1)
    assert time.monotonic() - t0 < 60
    if how == "killed":
        assert "rank 1" in str(e.value) and "exited with code -9" in str(e.value)
    else:
        assert "timed out" in str(e.value).lower() or "timeout" in str(e.value).lower(), str(e.value)
    assert llm.ranks.procs[0].poll() is not None  # stopped (a frozen rank is killed)
    with pytest.raises(TensorParallelError, match="closed"):
        llm.generate(prompts[0], {"max_new_tokens": 8})


def test_round_benchmark_runs_on_gloo_and_counts_its_collectives(tiny_dir):
    """The code of ``bench round --tensor-parallel-size N`` on the CPU: random weights in the tiny shapes, each rank
    drawing its slices; a greedy round makes 2 collectives per layer plus 2 for the argmax / confidence."""
    import json

    from repro.engine.bench.parallel import run

    cfg = json.loads((tiny_dir / "config.json").read_text())
    r = run(2, [0, 64], iters=3, device="cpu", precision="fp32", config=cfg, warmup=1, timeout_s=60)
    assert [x["prefix"] for x in r["rounds"]] == [0, 64]
    for x in r["rounds"]:
        assert x["collectives_per_round"] == 2 * cfg["num_hidden_layers"] + 2
        assert 0 < x["collective_ms_per_round"]["min"] <= x["collective_ms_per_round"]["max"] < 1e4
        assert len(x["collective_ms_per_round"]["by_rank"]) == 2
        assert x["ms_per_round"] >= x["collective_ms_per_round"]["by_rank"][0]


def test_generate_cli_with_two_ranks_prints_one_ranks_result(tiny_dir):
    import json
    import subprocess
    import sys

    def run(*extra):
        r = subprocess.run([sys.executable, "-m", "repro.engine", "generate", "--model", str(tiny_dir), "--device", "cpu",
                            "--max-new-tokens", "32", *extra, "What is 17 + 25?"], capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        doc = json.loads(r.stdout.strip().splitlines()[-1])
        return r.stdout.rsplit("\n", 2)[0], doc["generated_tokens"], doc["forwards"]

    assert run("--tensor-parallel-size", "2") == run()
    r = subprocess.run([sys.executable, "-m", "repro.engine", "generate", "--model", str(tiny_dir), "--device", "cpu",
                        "--tensor-parallel-size", "3", "hi"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "tensor_parallel_size 3 does not divide" in r.stderr


def test_generation_job_with_two_ranks_records_n_and_equals_one_rank(tiny_dir, tmp_path, monkeypatch):
    """The pipeline's generation job (repro.backends.generation_job) at --tensor-parallel-size 2: the records equal
    one rank's, the meta and the backend's device name N; a rank killed mid-job leaves no shard, only whole
    records in the partial file (resumable)."""
    import json

    from repro.backends import generation_job as gen
    from repro.checkpoint.manifest import write_manifest

    data_dir = Path(os.environ.get("ORL_EVAL_DATA", Path(__file__).resolve().parents[2].parent / "shared" / "data"))
    if not (data_dir / "gsm8k.jsonl").is_file():
        pytest.skip("real benchmark data not found")
    stamp = tmp_path / "stamp.json"
    stamp.write_text(json.dumps({"manifest_sha256": write_manifest(tiny_dir)["manifest_sha256"]}))
    pf = tmp_path / "problems.jsonl"
    pf.write_text("".join(json.dumps(p) + "\n" for p in load_problems("gsm8k", data_dir, limit=3).problems))
    dec = tmp_path / "dec.yaml"
    dec.write_text("algorithm: joint_threshold\nmax_new_tokens: 32\n")

    def args(out, tp):
        return gen.argparse.Namespace(backend="engine", model="tiny", model_dir=str(tiny_dir), role="base",
                                      verified=str(stamp), decoder=str(dec), problems=str(pf), benchmark="gsm8k",
                                      seed=1, shard=0, num_shards=1, device="cpu", precision="fp32", out=str(out),
                                      tensor_parallel_size=tp)

    def recs(p):
        return [{k: r[k] for k in ("id", "completion", "forwards")} for r in map(json.loads, p.read_text().splitlines())]

    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    assert gen.run(args(one, 1)) == 0 and gen.run(args(two, 2)) == 0
    assert recs(two) == recs(one) and len(recs(one)) == 3
    meta = json.loads(Path(str(two) + ".meta.json").read_text())
    assert meta["tensor_parallel_size"] == 2 and meta["backend_info"]["tensor_parallel_size"] == 2
    assert "x 2 ranks (tensor parallel)" in meta["backend_info"]["device"]

    real = gen.get_backend

    def dying(*a, **k):  # rank 1 is killed once the first problem is done
        b = real(*a, **k)
        gen_one = b.llm.generate

        def generate(*x, **y):
            if getattr(b, "_done", False):
                os.kill(b.llm.ranks.pids[0], signal.SIGKILL)
            b._done = True
            return gen_one(*x, **y)
        b.llm.generate = generate
        return b

    monkeypatch.setattr(gen, "get_backend", dying)
    three = tmp_path / "three.jsonl"
    with pytest.raises(TensorParallelError, match="rank 1 .* exited"):
        gen.run(args(three, 2))
    assert not three.exists()
    assert recs(Path(str(three) + ".partial.jsonl")) == recs(one)[:1]


@pytest.mark.parametrize("n", [1, 4])
def test_teacher_forced_logits_of_n_ranks_match_one_rank(tiny_dir, tiny_model, tiny_tok, prompts, n):
    """A real prompt's block-causal forward over n ranks (vocabulary slices gathered) against the plain model, fp32:
    the sharded code on one rank gives the same bits; on 4 ranks within 1e-4 (only the order of the fp32 partial
    sums differs), same argmax at every position."""
    import torch

    from repro.engine.ranks import Ranks

    ids = tiny_tok.encode(tiny_tok.apply_chat_template(prompts[1], add_generation_prompt=True))[:96]
    with torch.inference_mode():
        want = tiny_model.forward(torch.tensor(ids), 0, tiny_model.new_cache(96), 32)
    ranks = Ranks(dict(path=str(tiny_dir), role="orl", precision="fp32", device="cpu"), n, timeout_s=60)
    try:
        got, rest = ranks.call("repro.engine.bench.parallel:teacher_forced", {"ids": ids})
    finally:
        ranks.close()
    assert rest == [None] * (n - 1) and got.shape == want.shape
    assert torch.equal(got, want) if n == 1 else (got - want).abs().max().item() < 1e-4
    assert torch.equal(got.argmax(-1), want.argmax(-1))


# ---------------------------------------------------------------- precision nvfp4-w4a16: packed experts split

W4_BUDGET = 32  # one block of the tiny model's paper block size: prefill, denoising rounds and the commit


@pytest.fixture(scope="module")
def nvfp4_dir(tmp_path_factory):
    from repro.checkpoint.tiny import write_tiny

    d = tmp_path_factory.mktemp("tiny_nvfp4_tp")
    write_tiny(d, seed=1, nvfp4=True)
    return d


def test_split_nvfp4_experts_dequantize_to_the_full_experts_rows_and_columns(nvfp4_dir):
    """Each rank's packed shard holds the bytes of experts plan.experts (layout kept) and dequantizes to exactly
    those experts of the full tensor; the attached shared expert is split by gate/up rows and down columns, so the
    ranks' shared-expert outputs sum to the full one; the ranks' routed partials (torch loop and the local-id seam)
    sum to the one-rank MoE; a rank model built for a GPU casts to bf16 but keeps the router fp32."""
    import torch

    from repro.checkpoint.nvfp4 import NVFP4Experts
    from repro.engine.layers import moe as seam
    from repro.engine.layers.mlp import swiglu
    from repro.engine.model import LLaDA2Model
    from repro.engine.parallel import Comm, ShardedModel, _routed_local, shard_nvfp4_experts, shard_params

    full = LLaDA2Model.from_pretrained(nvfp4_dir, "cpu", "nvfp4-w4a16")
    cfg, p, q = full.cfg, full.params, "layers.1.moe."
    gu, dn = p[q + "w_gate_up"].with_shared(p[q + "shared_gate_up"]), p[q + "w_down"].with_shared(p[q + "shared_down"])
    deq = {"gu": gu.dequantize(), "dn": dn.dequantize()}
    S = p[q + "shared_down"].shape[1]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(20, cfg.hidden_size, generator=g)
    w, ids = seam.route(x, p[q + "router"], p.get(q + "expert_bias"), cfg.num_experts_per_tok, cfg.n_group,
                        cfg.topk_group, cfg.routed_scaling_factor, cfg.norm_topk_prob)
    want_routed = seam.moe_forward_torch(x, p[q + "w_gate_up"], p[q + "w_down"], w, ids)
    assert torch.unique(ids).numel() > cfg.num_experts // 2  # the routing reaches most experts, so every rank works
    seam.register_moe_impl("torch-by-local-ids", seam.moe_forward_torch)  # the non-torch branch, on the CPU
    try:
        for n in (2, 4):
            shared_sum, routed = 0, {"torch": 0, "torch-by-local-ids": 0}
            for r in range(n):
                plan = ShardPlan(cfg, n, r)
                ex = plan.experts
                a, b = shard_nvfp4_experts(gu, plan, "cpu"), shard_nvfp4_experts(dn, plan, "cpu", gate_up=False)
                for sh, src, key in ((a, gu, "gu"), (b, dn, "dn")):
                    assert isinstance(sh, NVFP4Experts) and sh.layout == src.layout == "lut"
                    assert sh.shape == (cfg.num_experts // n,) + src.shape[1:] and sh.parts == src.parts
                    assert torch.equal(sh.q, src.q[ex.start:ex.stop]) and torch.equal(sh.g, src.g[ex.start:ex.stop])
                    assert torch.equal(sh.dequantize(), deq[key][ex.start:ex.stop])
                    assert torch.equal(sh[1], src[ex.start + 1])
                w_ = S // n
                assert torch.equal(a.shared, torch.cat([gu.shared[r * w_:(r + 1) * w_],
                                                        gu.shared[S + r * w_:S + (r + 1) * w_]]))
                assert torch.equal(b.shared, dn.shared[:, r * w_:(r + 1) * w_])
                shared_sum = shared_sum + swiglu(x, a.shared, b.shared).float()
                for impl in routed:
                    seam.set_moe_impl(impl)
                    routed[impl] = routed[impl] + _routed_local(x, a, b, w, ids, ex.start)
                half = shard_nvfp4_experts(gu, plan, "cpu", torch.bfloat16)
                assert torch.equal(half.dequantize(), deq["gu"][ex.start:ex.stop].to(torch.bfloat16))
            torch.testing.assert_close(shared_sum, swiglu(x, gu.shared, dn.shared), rtol=0, atol=1e-5)
            for impl, got in routed.items():
                torch.testing.assert_close(got, want_routed, rtol=0, atol=1e-5, msg=impl)
    finally:
        seam.set_moe_impl("torch")
        seam._IMPLS.pop("torch-by-local-ids")

    plan = ShardPlan(cfg, 2, 1)  # a rank for a GPU: nvfp4-w4a16 runs in bf16 there (here built on the CPU)
    m = ShardedModel(full, plan, Comm(1, 2), "cpu", torch.bfloat16)
    assert m.dtype == torch.bfloat16 and m.precision == "nvfp4-w4a16"
    assert m.params[q + "router"].dtype == torch.float32 and m.params["embed"].dtype == torch.bfloat16
    assert m.params[q + "w_down"].dtype == torch.bfloat16 and m.params[q + "w_down"].E == cfg.num_experts // 2
    assert torch.equal(m.params["lm_head"], p["lm_head"][plan.vocab.start:plan.vocab.stop].to(torch.bfloat16))
    with pytest.raises(ValueError, match=r"layers.1.moe.shared_down: a NVFP4Experts cannot be split"):
        shard_params({q + "shared_down": dn}, plan, "cpu")
    rnd = ShardedModel.random(cfg, plan, Comm(1, 2), "cpu", "nvfp4-w4a16")  # bench round --precision nvfp4-w4a16
    assert isinstance(rnd.params[q + "w_gate_up"], NVFP4Experts) and rnd.params[q + "w_gate_up"].E == 8
    assert rnd.params[q + "w_gate_up"].q.any() and rnd.params[q + "shared_down"].dtype == torch.float32


@pytest.fixture(scope="module")
def w4_one_rank(nvfp4_dir, prompts):
    """One rank's nvfp4-w4a16 outputs on the GSM8K prompt: {decoder: (token ids, forwards)}."""
    llm = LLM(nvfp4_dir, role="orl", device="cpu", precision="nvfp4-w4a16")
    return {alg: (o.token_ids, o.forwards) for alg in ("joint_threshold", "orl")
            for o in [llm.generate(prompts[0], {"algorithm": alg, "max_new_tokens": W4_BUDGET})]}


@pytest.mark.parametrize("n", [2, 4])
def test_n_ranks_with_packed_4bit_experts_give_one_ranks_tokens_and_forwards(nvfp4_dir, prompts, w4_one_rank, n):
    with LLM(nvfp4_dir, role="orl", device="cpu", precision="nvfp4-w4a16", tensor_parallel_size=n) as llm:
        from repro.checkpoint.nvfp4 import NVFP4Experts

        w = llm.model.params["layers.1.moe.w_gate_up"]
        assert isinstance(w, NVFP4Experts) and w.E == llm.config.num_experts // n
        for alg in ("joint_threshold", "orl"):
            o = llm.generate(prompts[0], {"algorithm": alg, "max_new_tokens": W4_BUDGET})
            assert (o.token_ids, o.forwards) == w4_one_rank[alg], alg
            assert o.generated_tokens > 0 and o.forwards["denoise"] > 1


def test_packed_4bit_on_a_checkpoint_that_is_not_nvfp4_is_refused_before_ranks_start(tiny_dir):
    with pytest.raises(ValueError, match=r"no quantization_config \(not an NVFP4 checkpoint\); use precision 'bf16'"):
        LLM(tiny_dir, device="cpu", precision="nvfp4-w4a16", tensor_parallel_size=2)
