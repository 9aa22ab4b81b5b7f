"""The one engine loop (repro.engine.loop) on the CPU: a long prompt is prefilled in chunks between the other
requests' rounds, a failed round fails only the request whose op fails, no thread is started per request, one
thread owns every capture and round of a shared LLM, and a decoder the on-device step does not know is refused
by it in one line and decoded by the host decoders instead."""

import sys
import threading
import types

import pytest
import torch

from repro.engine import LLM
from repro.engine.batch import BatchRequest, BatchStats, generate_batch

import eval_data


@pytest.fixture(scope="module")
def llm(tiny_dir):
    return LLM(tiny_dir, role="orl", precision="fp32", device="cpu")


class _Rounds:
    """Records, per call of ``model.forward_chunks`` (one round), each chunk's (start, rows, cache capacity)."""

    def __init__(self, model, fail_if=None):
        self.model, self.inner, self.rounds, self.fail_if = model, model.forward_chunks, [], fail_if
        model.forward_chunks = self

    def __call__(self, chunks):
        self.rounds.append([(c.start, int(c.ids.shape[0]) if c.ids is not None else int(c.embeds.shape[0]),
                             c.cache.capacity) for c in chunks])
        if self.fail_if is not None and self.fail_if(chunks):
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 16384000000 bytes")
        return self.inner(chunks)

    def close(self):
        del self.model.forward_chunks


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_long_prompt_is_prefilled_in_chunks_while_a_short_request_keeps_its_pace(tiny_model, tiny_tok):
    """A 2,000-token prompt beside a short request: its prefill is spread over several rounds, each also running
    the short request (it was one 1,984-row forward with a [heads, P, P] attention, during which nobody else
    advanced); the short request finishes in as many rounds as it takes alone; both give their tokens alone."""
    tok = tiny_tok
    short = BatchRequest(tok.encode("2+2=" * 4), {"algorithm": "orl", "max_new_tokens": 64})
    long = BatchRequest(tok.encode("once upon a time " * 120)[:2000], {"algorithm": "orl", "max_new_tokens": 32})
    kw = dict(mask_id=tok.mask_id, eos_id=tok.eos_id)
    alone = [generate_batch(tiny_model, [r], batch_size=1, **kw)[0][0] for r in (short, long)]
    rec = _Rounds(tiny_model)
    ended = {}
    stats = BatchStats()
    try:
        out = generate_batch(tiny_model, [short, long], batch_size=2, stats=stats,
                             on_result=lambda i, r, w: ended.setdefault(i, stats.rounds), **kw)
    finally:
        rec.close()
    assert [r.token_ids for r, _ in out] == [a.token_ids for a in alone]
    assert [r.forwards for r, _ in out] == [a.forwards for a in alone]
    prefill_rounds = [i for i, rnd in enumerate(rec.rounds) if any(n > 32 for _, n, _ in rnd)]
    assert len(prefill_rounds) >= 3, [rec.rounds[i] for i in prefill_rounds]
    assert all(len(rec.rounds[i]) == 2 for i in prefill_rounds)  # the short request decoded in those rounds
    short_ops = alone[0].forwards["denoise"] + alone[0].forwards["commit"] + alone[0].forwards["prefill"]
    assert ended[0] == short_ops  # its pace: one op per round, the long prefill never held it
    from repro.engine.request import PREFILL_CHUNK

    assert max(n for rnd in rec.rounds for _, n, _ in rnd) == PREFILL_CHUNK
    assert len(prefill_rounds) == -(-(len(long.prompt_ids) // 32 * 32) // PREFILL_CHUNK)


def test_a_failed_round_fails_only_the_request_whose_own_op_fails(tiny_model, tiny_tok):
    """A round's forward that fails (an allocation of the long request) is retried op by op: the long request
    fails with its error, the other requests of that round finish with the tokens they give alone."""
    tok = tiny_tok
    kw = dict(mask_id=tok.mask_id, eos_id=tok.eos_id)
    small = [BatchRequest(tok.encode(f"story {i}: " * 3), {"algorithm": "joint_threshold", "max_new_tokens": 48})
             for i in range(3)]
    big = BatchRequest(tok.encode("hi"), {"algorithm": "joint_threshold", "max_new_tokens": 3000})
    alone = [generate_batch(tiny_model, [r], batch_size=1, **kw)[0][0] for r in small]
    rec = _Rounds(tiny_model, fail_if=lambda chunks: any(c.cache.capacity >= 3000 for c in chunks))
    done, failed = {}, []
    try:
        from repro.engine.batch import EagerExecutor
        from repro.engine.loop import EngineLoop, Request

        loop = EngineLoop()
        sched = loop.scheduler(lambda: EagerExecutor(tiny_model, tok.mask_id), 4, **kw)
        reqs = [sched.submit(Request(r.prompt_ids, r.decoder, on_done=lambda q: (failed if q.error else done)
                                     .append(q))) for r in small + [big]]
        loop.run(lambda: all(q.done for q in reqs))
    finally:
        rec.close()
    assert [q.result.token_ids for q in reqs[:3]] == [a.token_ids for a in alone]
    assert failed == [reqs[3]] and "can't allocate memory" in str(reqs[3].error)
    assert any(len(r) == 4 for r in rec.rounds)  # the failing round held all four


def test_no_thread_per_request(llm):
    """A batch of 8 requests starts no thread (the LLM's loop thread at most, once)."""
    prompts = eval_data.chat_prompts(4)
    llm.generate(prompts[:1], decoder={"max_new_tokens": 8})  # the loop's thread exists now
    started = []
    real = threading.Thread.start

    def counting(self):
        started.append(self.name)
        return real(self)

    threading.Thread.start = counting
    try:
        outs = llm.generate(prompts, decoder={"max_new_tokens": 16}, batch_size=8)
    finally:
        threading.Thread.start = real
    assert len(outs) == 8 and len(started) <= 1, started


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_one_thread_owns_every_capture_and_round_of_a_shared_llm(tiny_dir):
    """LLM.generate_batch, LLM.generate and a server scheduler share one LLM from two threads (on the graph path,
    here its CPU form): every engine build (CUDA-graph capture) and every round runs on the LLM's loop thread,
    so a capture never meets another thread's GPU work (bench serve's "operation cannot be performed in the
    present state")."""
    from repro.engine.batch_graph import BatchGraphEngine

    llm = LLM(tiny_dir, role="orl", precision="fp32", device="cpu")
    llm.engine_path = "cuda-graph"  # the batched graph path's scheduling, eager forward (no CUDA here)
    seen = []
    real_capture, real_round = BatchGraphEngine.capture, BatchGraphEngine.run_round

    def capture(self):
        seen.append(("capture", threading.current_thread().name))
        return real_capture(self)

    def run_round(self, modes):
        seen.append(("round", threading.current_thread().name))
        return real_round(self, modes)

    BatchGraphEngine.capture, BatchGraphEngine.run_round = capture, run_round
    try:
        server = llm.scheduler(2, 1024)  # built (captured) before it returns
        assert server.kind == "graph-path eager"
        served, batched, one = _share(llm, server, 40)
    finally:
        BatchGraphEngine.capture, BatchGraphEngine.run_round = real_capture, real_round
        llm.close()
    names = {name for _, name in seen}
    assert names == {"repro-engine"} and sum(k == "capture" for k, _ in seen) == 2, seen[:5]
    assert [r.token_ids for r in served] == [o.token_ids for o in batched[:2]] and one.generated_tokens > 0


def _share(llm, server, budget: int):
    """Two real prompts submitted to ``server`` (a scheduler of ``llm``) while another thread runs
    ``llm.generate_batch`` over four (batch 3) and this one ``llm.generate``: (the server's results, the batched
    outputs, the single output)."""
    from repro.engine.loop import Request

    prompts = eval_data.chat_prompts(2)
    ids = [llm.tokenizer_.encode(llm.apply_chat_template(p)) for p in prompts[:2]]
    served = [server.submit(Request(x, llm.default_decoder(), budget)) for x in ids]
    got = {}
    other = threading.Thread(target=lambda: got.setdefault("b", llm.generate_batch(prompts, max_new_tokens=budget,
                                                                                  batch_size=3)))
    other.start()
    one = llm.generate(prompts[0], max_new_tokens=budget)
    other.join(600)
    return [r.wait(600) for r in served], got["b"], one


def test_a_decoder_the_device_step_does_not_know_is_refused_there_and_runs_on_the_host(llm, tiny_model, tiny_tok):
    """A fourth greedy decoder (a subclass of joint_threshold whose module declares no ON_DEVICE): the on-device
    steps refuse it in one line, the path rule sends a batch of it to the eager engine, and it decodes with its
    own host rules (here: joint_threshold's) — never silently with the device step's."""
    from repro.engine.batch_graph import BatchGraphEngine
    from repro.engine.decoders import DecoderConfig, algorithms
    from repro.engine.decoders.device import DeviceStep, device_step_problem, supported
    from repro.engine.decoders.joint_threshold import DEFAULTS, JointThreshold

    mod = types.ModuleType("repro.engine.decoders.fourth")
    mod.Decoder = type("Fourth", (JointThreshold,), {"name": "fourth"})
    mod.DEFAULTS = dict(DEFAULTS)
    algorithms()["fourth"] = mod
    sys.modules[mod.__name__] = mod
    try:
        cfg = DecoderConfig.from_dict({"algorithm": "fourth", "max_new_tokens": 40})
        why = device_step_problem(cfg)
        assert not supported(cfg) and "'fourth' has no on-device step" in why and "\n" not in why
        B, D = 32, tiny_model.cfg.hidden_size
        with pytest.raises(ValueError, match="DeviceStep cannot run this decoder: decoder 'fourth' has no on-device"):
            DeviceStep(cfg, tiny_tok.mask_id, tiny_model, torch.zeros(B, dtype=torch.long), torch.zeros(B, D))
        with pytest.raises(ValueError, match="has no on-device step"):
            BatchGraphEngine(tiny_model, tiny_tok.mask_id, cfg, 2, 256, use_graphs=False)
        from repro.engine.decode_loop import EagerStepBackend, generate_ids

        class Offering(EagerStepBackend):  # an executor that would run any decoder on the device step
            def device_stepper(self, c):
                return object()

        with pytest.raises(ValueError, match="the on-device step was offered for this request, but decoder 'fourth'"):
            generate_ids(Offering(tiny_model, tiny_tok.mask_id), [5, 6, 7], cfg, mask_id=tiny_tok.mask_id,
                         eos_id=tiny_tok.eos_id)
        llm.engine_path = "cuda-graph"
        assert llm.engine_for(cfg, batch=True) == "eager"
        assert llm.engine_for(DecoderConfig.from_dict({"algorithm": "joint_threshold"}), batch=True) \
            == "batched-cuda-graph"
        llm.engine_path = "eager"
        p = eval_data.chat_prompts(1)[0]
        same = {"algorithm": "joint_threshold", "max_new_tokens": 40}
        assert llm.generate(p, cfg).token_ids == llm.generate(p, same).token_ids
    finally:
        llm.engine_path = "eager"
        del algorithms()["fourth"]
        sys.modules.pop(mod.__name__, None)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_cuda_graph_captures_of_a_shared_llm_do_not_collide(tiny_dir):
    """On a GPU (graph capture safe with several users of one LLM): a server scheduler (its batched graph
    captured), LLM.generate_batch from another thread (a second batched graph captured while the server's
    requests decode) and LLM.generate (the single-request graphs) share one LLM: no capture fails ("operation
    cannot be performed in the present state"), and the server's tokens equal the batched call's."""
    llm = LLM(tiny_dir, role="orl", precision="bf16", device="cuda")
    try:
        assert llm.engine_path == "cuda-graph"
        server = llm.scheduler(4, 1024)
        assert server.kind == "cuda-graph"
        served, batched, one = _share(llm, server, 64)
        assert [r.token_ids for r in served] == [o.token_ids for o in batched[:2]] and one.generated_tokens > 0
        assert llm.graph_capture_s > 0
    finally:
        llm.close()
