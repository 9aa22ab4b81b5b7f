"""The batched CUDA-graph path (repro.engine.batch_graph, repro.engine.decoders.device_batch) on the CPU: the
scheduler, the per-slot on-device step and the round protocol run unchanged over the torch forward
(TorchSlotForward; graphs need CUDA), on the tiny checkpoint and real problems from ../shared/data."""

import threading

import pytest
import torch

from repro.engine.batch import BatchRequest, BatchStats
from repro.engine.batch_graph import generate_batch_graph
from repro.engine.decode_loop import EagerStepBackend, generate_ids
from repro.engine.decoders import DecoderConfig
from repro.engine.decoders.device import DeviceStep
from repro.engine.decoders.device_batch import BatchedDeviceStep

import eval_data


@pytest.mark.parametrize("algorithm,extra", [("orl", {}), ("joint_threshold", {"max_post_steps": 1}),
                                             ("low_confidence", {"num_to_transfer": 2})])
def test_batched_step_equals_single_steps_on_the_same_logits(tiny_model, tiny_tok, algorithm, extra):
    """S slots of one BatchedDeviceStep vs S DeviceSteps fed the same logits, only the masked-in slots
    stepping each round: identical tokens, embeddings, flags — and the other slots untouched."""
    m, mask = tiny_model, tiny_tok.mask_id
    cfg = DecoderConfig.from_dict({"algorithm": algorithm, "threshold": 0.3, "edit_threshold": 0.2, **extra})
    S, B, V, D = 4, 32, m.cfg.vocab_size, m.cfg.hidden_size
    g = torch.Generator().manual_seed(0)
    tok = torch.zeros(S, B, dtype=torch.long)
    emb = torch.zeros(S, B, D, dtype=m.dtype)
    bat = BatchedDeviceStep(cfg, mask, m, tok, emb)
    singles = [DeviceStep(cfg, mask, m, torch.zeros(B, dtype=torch.long), torch.zeros(B, D, dtype=m.dtype))
               for _ in range(S)]
    for s in range(S):
        start = torch.randint(0, 256, (B,), generator=g)
        start[4 * s:] = mask
        editable = torch.arange(B) >= 4 * s
        bat.start_block(s, start, editable)
        singles[s].start_block(start, editable)
    steps = [0] * S
    for r in range(8):
        logits = torch.randn(S, B, V, generator=g) * 4
        before = (tok.clone(), emb.clone())
        stepping = [(r + s) % 3 != 0 and not bool(singles[s].final) for s in range(S)]
        bat.step_mask.copy_(torch.tensor(stepping))
        bat.step(logits)
        for s in range(S):
            if stepping[s]:
                singles[s].step(logits[s])
                steps[s] += 1
            else:
                assert torch.equal(tok[s], before[0][s]) and torch.equal(emb[s], before[1][s])
            assert torch.equal(tok[s], singles[s].tokens), (r, s)
            assert bool(bat.flags[0, s]) == bool(singles[s].final) == bool(bat.final[s])
            assert bool(bat.flags[1, s]) == bool(singles[s].reuse())
            if cfg.self_conditioning:
                assert torch.equal(emb[s], singles[s].embeds), (r, s)
    assert min(steps) >= 2 and len({tuple(t.tolist()) for t in tok}) == S


class _BlockPrefill(EagerStepBackend):
    """The single-request on-device-step engine with its prompt prefilled block by block, as the graph paths
    do (one forward over all prompt blocks is equal in exact arithmetic, not in fp32 bits)."""

    def prefill(self, ids, start=0):
        for s in range(0, ids.shape[0], self.block_size):
            self.model.forward(ids[s:s + self.block_size], start + s, self.cache, self.block_size, logits=False)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # stalled blocks of the random tiny model: counted alike
@pytest.mark.parametrize("algorithm", ["orl", "joint_threshold"])
def test_graph_path_batch_invariance_and_continuous_batching(tiny_model, tiny_tok, algorithm):
    """10 real GSM8K/HumanEval prompts through the batched graph path at batch 1 and 3 (more requests than
    slots, requests finishing early): token ids, forward counts and per-block forwards equal those of the
    single-request on-device-step engine (EagerStepBackend, prompt prefilled block by block)."""
    m, tok = tiny_model, tiny_tok
    dec = {"algorithm": algorithm, "max_new_tokens": 48}
    prompts = [tok.encode(tok.apply_chat_template(p, add_generation_prompt=True)) for p in eval_data.chat_prompts(5)]
    kw = dict(mask_id=tok.mask_id, eos_id=tok.eos_id)
    alone = [generate_ids(_BlockPrefill(m, tok.mask_id), p, dec, **kw) for p in prompts]
    assert len({a.generated_tokens for a in alone}) > 1 and len({sum(a.forwards.values()) for a in alone}) > 1
    reqs = [BatchRequest(p, dec) for p in prompts]
    engine = None
    for bs in (1, 3):
        stats = BatchStats()
        out, engine = generate_batch_graph(m, reqs, batch_size=bs, stats=stats, engine=engine, **kw)
        assert [r.token_ids for r, _ in out] == [a.token_ids for a in alone], bs
        assert [r.forwards for r, _ in out] == [a.forwards for a in alone], bs
        assert [r.block_forwards for r, _ in out] == [a.block_forwards for a in alone], bs
        assert [r.stalled_blocks for r, _ in out] == [a.stalled_blocks for a in alone], bs
        assert stats.max_active == bs and stats.engine == "graph-path eager" and engine.S == bs
        # one round per forward of the busiest slot sequence; prefill is one round per prompt block
        per_request = [a.forwards["denoise"] + a.forwards["commit"] + len(p) // 32 for a, p in zip(alone, prompts)]
        if bs == 1:
            assert stats.rounds == sum(per_request)
        else:
            assert max(per_request) <= stats.rounds < sum(per_request)
            assert any(r > 0 for r in stats.admitted_at_round[bs:])  # a freed slot took the next request


def test_graph_path_error_in_one_request_stops_the_batch(tiny_model, tiny_tok):
    """A request whose prompt is invalid fails the batch with its own error; no thread was started for it."""
    tok = tiny_tok
    dec = {"algorithm": "joint_threshold", "max_new_tokens": 32}
    ok = BatchRequest(tok.encode("2+2=" * 12), dec)
    bad = BatchRequest([tiny_model.cfg.vocab_size + 5], dec)
    before = threading.active_count()
    with pytest.raises(ValueError, match="outside vocabulary"):
        generate_batch_graph(tiny_model, [ok, ok, bad, ok], mask_id=tok.mask_id, eos_id=tok.eos_id, batch_size=2)
    assert threading.active_count() == before
    with pytest.raises(ValueError, match="one decoder"):
        generate_batch_graph(tiny_model, [ok, BatchRequest(ok.prompt_ids, {"algorithm": "orl"})],
                             mask_id=tok.mask_id, eos_id=tok.eos_id)
    with pytest.raises(ValueError, match=r"sampling \(temperature 0.5\) runs on the host decoders"):
        generate_batch_graph(tiny_model, [BatchRequest(ok.prompt_ids, {**dec, "temperature": 0.5})],
                             mask_id=tok.mask_id, eos_id=tok.eos_id)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_llm_generate_list_takes_the_batched_graph_path_on_the_graph_engine(tiny_dir, monkeypatch):
    """LLM.generate([...], batch_size=N) on the CUDA-graph engine runs repro.engine.batch_graph (here its CPU
    form): batch 3 equals batch 1, the engine is kept for the next call with the same shape, sampling and
    other block sizes stay on the eager batched path."""
    from repro.engine import LLM

    llm = LLM(tiny_dir, role="orl", precision="fp32", device="cpu")
    monkeypatch.setattr(llm, "engine_path", "cuda-graph")
    prompts = eval_data.chat_prompts(2)
    dec = {"algorithm": "orl", "max_new_tokens": 40}
    one = llm.generate(prompts, decoder=dec, batch_size=1)
    assert llm.batch_engine.S == 1
    engines, done = [], []
    for _ in range(2):
        stats = BatchStats()
        three = llm.generate_batch(prompts, decoder=dec, batch_size=3, stats=stats,
                                   on_result=lambda i, o: done.append(i))
        engines.append(llm.batch_engine)
        assert stats.engine == "graph-path eager" and llm.batch_engine.S == 3
        assert [o.token_ids for o in three] == [o.token_ids for o in one]
        assert [o.forwards for o in three] == [o.forwards for o in one]
    engine = engines[0]
    assert engines[1] is engine and sorted(done) == [0, 0, 1, 1, 2, 2, 3, 3]
    for other in ({**dec, "temperature": 0.7}, {**dec, "block_size": 16}):
        stats = BatchStats()
        llm.generate_batch(prompts[:2], decoder=other, batch_size=2, stats=stats)
        assert stats.engine == "eager" and llm.batch_engine is engine


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_bench_batch_graph_sections_run_on_the_tiny_model(tiny_model, tiny_tok):
    """bench batch's batched-graph, invariance-graph and handoff sections on the CPU (torch forward, no
    capture): fixed schedule, figures present, invariance passes — the H200 run has no untested code path."""
    from repro.engine.bench import batch as bb

    quiet = lambda m: None  # noqa: E731
    rows = bb.bench_batched_graph(tiny_model, tiny_tok.mask_id, prefix=64, tokens=64, batch_sizes=[1, 3], steps=8,
                                  copy_gbps=10.0, seed=0, log=quiet, forward="torch", use_graphs=False)
    assert [r["batch_size"] for r in rows] == [1, 3] and rows[0]["speedup_vs_batch1"] == 1.0
    for r in rows:
        assert r["forwards_per_request"] == {"prefill": 1, "denoise": 16, "commit": 2}
        assert r["generated_tokens"] == r["requests"] * 64 and r["floor_ms"] > 0 and r["capture_s"] == 0.0
        assert r["decode_rounds"] == 18 * (r["requests"] // r["batch_size"]) and r["forward"] == "TorchSlotForward"
    inv = bb.bench_invariance(tiny_model, tiny_tok.mask_id, tiny_tok.eos_id, n_prompts=4, prefix=80, tokens=32,
                              algorithms=("orl",), seed=0, log=quiet, path="graph", use_graphs=False)
    assert inv["orl"]["pass"], inv
    hand = bb.bench_handoff(tiny_model, tiny_tok.mask_id, [1, 4], tokens=32, steps=4, seed=0, log=quiet)
    # 2·b requests of 40 prompt tokens + 32 new, 8 tokens a round: prefill 1 + block 1 (24 masks) 3 + commit
    # + block 2 (32 masks) 4 + commit = 10 rounds each, two waves of b
    assert [h["rounds"] for h in hand] == [20, 20] and all(h["rounds_per_s"] > 0 for h in hand)
    text = bb.table({"gpu": "cpu", "copy_GBps": 10.0, "batched_graph": rows, "invariance_graph": inv})
    assert "batched CUDA-graph path" in text and "invariance (batched graph path) orl: PASS" in text


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("forward", ["auto", "per-slot"])
def test_cuda_graph_batch_invariance_on_the_tiny_model(tiny_dir, forward):
    """On a GPU (bf16, captured graphs): 6 real prompts at batch 1, 3 and 6 through the batched graph path:
    identical token ids and forward counts; the round graph is captured once per batch size. (The tiny
    vocabulary, 262, is not a multiple of BatchedBlockForward's lm_head tile: "auto" falls back to per-slot.)"""
    from repro.engine import LLM

    llm = LLM(tiny_dir, role="orl", precision="bf16", device="cuda")
    assert llm.engine_path == "cuda-graph"
    tok = llm.tokenizer_
    prompts = [tok.encode(llm.apply_chat_template(p)) for p in eval_data.chat_prompts(3)]
    kw = dict(mask_id=llm.mask_id, eos_id=llm.eos_id, forward=forward)
    for algorithm in ("orl", "joint_threshold"):
        reqs = [BatchRequest(p, {"algorithm": algorithm, "max_new_tokens": 64}) for p in prompts]
        alone, _ = generate_batch_graph(llm.model, reqs, batch_size=1, **kw)
        for bs in (3, 6):
            stats = BatchStats()
            out, engine = generate_batch_graph(llm.model, reqs, batch_size=bs, stats=stats, **kw)
            assert stats.engine == "cuda-graph" and stats.capture_s > 0 and engine.graph is not None
            assert [r.token_ids for r, _ in out] == [r.token_ids for r, _ in alone], (algorithm, bs)
            assert [r.forwards for r, _ in out] == [r.forwards for r, _ in alone], (algorithm, bs)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_request_with_other_decoder_settings_gets_host_decoders_over_the_graph_forward(tiny_model, tiny_tok):
    """The graph executor's logits mode: a request whose decoder is not the engine's runs the host decoders on
    the logits of the same batched round (beside a stepping request), with the results of running alone."""
    from repro.engine.batch import run_requests
    from repro.engine.batch_graph import BatchGraphEngine, GraphExecutor
    from repro.engine.loop import EngineLoop

    m, tok = tiny_model, tiny_tok
    kw = dict(mask_id=tok.mask_id, eos_id=tok.eos_id)
    engine = BatchGraphEngine(m, tok.mask_id, DecoderConfig.from_dict({"algorithm": "joint_threshold"}), 2, 256,
                              use_graphs=False)
    reqs = [BatchRequest(tok.encode("2+2=" * 10), {"algorithm": "orl", "max_new_tokens": 40}),  # embeddings in
            BatchRequest(tok.encode("hello " * 7), {"algorithm": "joint_threshold", "max_new_tokens": 40})]
    alone = [generate_ids(_BlockPrefill(m, tok.mask_id), r.prompt_ids, r.decoder, **kw) for r in reqs]
    loop = EngineLoop()
    out = run_requests(loop, loop.scheduler(lambda: GraphExecutor(engine), 2, **kw), reqs, BatchStats())
    assert [r.token_ids for r, _ in out] == [a.token_ids for a in alone]
    assert [r.forwards for r, _ in out] == [a.forwards for a in alone]
    assert all(a.forwards["denoise"] > 2 for a in alone)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_cuda_graph_batch_invariance_with_the_batched_forward_at_model_width():
    """On a GPU: LLaDA2.1-mini's layer width (4 layers, vocabulary 16384, random bf16 weights) through
    BatchedBlockForward + the batched step as captured graphs: 12 random prompts of varied length, ``orl`` and
    ``joint_threshold``, batch 1 vs 4 vs 12 — identical token ids and forward counts."""
    from repro.engine.config import LLaDA2Config
    from repro.engine.model import LLaDA2Model
    from repro.engine.presets import PRESETS

    cfg = LLaDA2Config.from_dict({**PRESETS["llada2.1-mini"], "vocab_size": 16384, "num_hidden_layers": 4})
    model = LLaDA2Model.random(cfg, device="cuda", dtype="bf16", seed=3, with_adapter=False)
    mask_id, eos_id = 16383, 16382
    g = torch.Generator().manual_seed(11)
    lengths = torch.randint(20, 300, (12,), generator=g).tolist()
    prompts = [torch.randint(0, 16000, (n,), generator=g).tolist() for n in lengths]
    kw = dict(mask_id=mask_id, eos_id=eos_id, forward="batched")
    for algorithm in ("orl", "joint_threshold"):
        reqs = [BatchRequest(p, {"algorithm": algorithm, "max_new_tokens": 64}) for p in prompts]
        alone, _ = generate_batch_graph(model, reqs, batch_size=1, **kw)
        for bs in (4, 12):
            stats = BatchStats()
            out, engine = generate_batch_graph(model, reqs, batch_size=bs, stats=stats, **kw)
            assert engine.forward_kind == "BatchedBlockForward" and stats.engine == "cuda-graph"
            assert [r.token_ids for r, _ in out] == [r.token_ids for r, _ in alone], (algorithm, bs)
            assert [r.forwards for r, _ in out] == [r.forwards for r, _ in alone], (algorithm, bs)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_graph_path_resumes_a_request_only_at_block_boundaries(tiny_model, tiny_tok, monkeypatch):
    """A request's program is resumed once per prefill chunk and once per block's denoising loop (plus its commit
    forward), not once per round: the graph executor advances PrefillJob / StepJob itself. The rounds and
    results stay those of the per-round loop (test above)."""
    from repro.engine.loop import EngineLoop

    m, tok = tiny_model, tiny_tok
    dec = {"algorithm": "joint_threshold", "max_new_tokens": 64}
    prompts = [tok.encode(tok.apply_chat_template(p, add_generation_prompt=True)) for p in eval_data.chat_prompts(2)]
    resumed: list = []
    real = EngineLoop._advance
    monkeypatch.setattr(EngineLoop, "_advance",
                        lambda self, req, value: resumed.append(req.op) or real(self, req, value))
    stats = BatchStats()
    out, _ = generate_batch_graph(m, [BatchRequest(p, dec) for p in prompts], mask_id=tok.mask_id,
                                  eos_id=tok.eos_id, batch_size=2, stats=stats)
    blocks = sum(len(r.block_forwards) for r, _ in out)
    commits = sum(r.forwards["commit"] for r, _ in out)
    prefills = sum(-(-(len(p) // 32 * 32) // 512) for p in prompts)  # 512-token prefill chunks
    steps = [op for op in resumed if type(op).__name__ == "Steps"]
    assert len(resumed) == len(prompts) + prefills + len(steps) + commits and len(steps) <= blocks
    assert sum(r.forwards["denoise"] for r, _ in out) > len(steps)
    assert stats.rounds > len(resumed) / 2  # many rounds per resumption
