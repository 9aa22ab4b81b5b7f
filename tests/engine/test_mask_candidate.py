"""The mask token is a candidate (the references' rule, the default): hand-checked fill and edit rules on
scripted logits and on a tiny checkpoint whose lm_head lets ``<|mask|>`` win at some positions; host
decoders ≡ on-device step ≡ the naive reference loop (tokens, forward counts, stalled blocks).

References: LLaDA2.1 ``generate`` (HF remote code of inclusionAI/LLaDA2.1-mini) and SGLang
``python/sglang/srt/dllm/algorithm/{low_confidence,joint_threshold}.py``: argmax and softmax over the full
vocabulary; a fill may write ``<|mask|>`` (position stays masked), an edit may re-mask a written position.
"""

import random

import pytest
import torch

from repro.checkpoint.tiny import write_tiny
from repro.engine.decode_loop import CachedBackend, EagerStepBackend, generate_ids
from repro.engine.model import LLaDA2Model
from repro.engine.reference import ReferenceBackend, reference_generate
from repro.engine.tokenizer import ChatTokenizer

pytestmark = pytest.mark.filterwarnings("ignore:decoder .* did not finish block:RuntimeWarning")

V, MASK, B = 262, 258, 32
S_MODE = {"algorithm": "joint_threshold", "threshold": 0.5, "edit_threshold": 0.0, "max_post_steps": 16}
Q_MODE = {"algorithm": "joint_threshold", "threshold": 0.7, "edit_threshold": 0.5, "max_post_steps": 16}


class Recording(CachedBackend):
    """CachedBackend (or a scripted one) that records each denoise input/logits and each final block."""

    def __init__(self, model, fn=None):
        super().__init__(model)
        self.fn, self.steps, self.finals = fn, [], []

    def begin(self, capacity, block_size):
        if self.fn is None:
            super().begin(capacity, block_size)
        self.block_size = block_size

    def prefill(self, ids, start=0):
        if self.fn is None:
            super().prefill(ids, start)

    def denoise(self, ids, start, embeds):
        lg = self.fn(len(self.steps)) if self.fn is not None else super().denoise(ids, start, embeds)
        self.steps.append((start, ids.clone(), lg.clone()))
        return lg

    def commit_block(self, ids, start, run_forward):
        self.finals.append((start, ids.clone()))
        if self.fn is None:
            super().commit_block(ids, start, run_forward)


# ------------------------------------------------------------------------------------ scripted, by hand
def _script(step):
    lg = torch.zeros(B, V)
    if step == 0:
        lg[0, MASK] = 10.0  # p(mask) = e^10 / (e^10 + 261) = 0.988
        lg[1, 70], lg[1, MASK] = 8.5, 8.0  # p(70) = e^8.5 / (e^8.5 + e^8 + 260) = 0.603 (0.950 without mask)
        lg[2, 71] = 12.0  # p(71) = 0.998
    elif step == 1:
        lg[:, 72] = 12.0
        lg[2, 72], lg[2, MASK] = 0.0, 10.0  # the written 71 at position 2: mask proposed with p = 0.988
    else:
        lg[:, 72] = 12.0
    return lg


def _run_script(dec):
    be = Recording(None, _script)
    be.model = type("M", (), {"cfg": type("C", (), {"vocab_size": V})(), "device": torch.device("cpu")})()
    r = generate_ids(be, [1] * 32, dec, mask_id=MASK, eos_id=256, max_new_tokens=32)
    return r, [ids for _, ids, _ in be.steps], be.finals[-1][1]


def test_fill_writes_mask_back_and_confidence_counts_the_mask_share():
    r, inputs, final = _run_script(Q_MODE)
    after0 = inputs[1]
    assert after0[0] == MASK  # mask proposed at a masked position with p 0.988 > 0.7: written back, still masked
    assert after0[1] == MASK  # 70 has p 0.603 ≤ 0.7 once the mask's share is in the softmax: not filled
    assert after0[2] == 71 and (after0[3:] == MASK).all()  # fill set non-empty (0 and 2): no top-1 fallback


def test_edit_with_mask_proposal_remasks_a_written_position():
    r, inputs, final = _run_script(Q_MODE)
    after1 = inputs[2]
    assert after1[2] == MASK  # 71 written; mask proposed with p 0.988 > edit threshold 0.5: re-masked
    assert (torch.cat([after1[:2], after1[3:]]) == 72).all()
    assert final.tolist() == [72] * 32  # step 2 refills it; step 3 (post step 1) changes nothing: final
    assert r.forwards == {"prefill": 1, "denoise": 4, "commit": 0} and r.stalled_blocks == []


def test_exclusion_option_restores_the_mask_free_rules():
    r, inputs, final = _run_script({**Q_MODE, "exclude_mask_token": True})
    after0, after1 = inputs[1], inputs[2]
    assert after0[1] == 70 and after0[2] == 71 and after0[0] == MASK  # 70 has p 0.950 > 0.7 without the mask
    assert after1[2] == 71  # the mask cannot be proposed, so no re-mask (every other token has p 1/261)


# ------------------------------------------------------------------------------------ tiny checkpoint
@pytest.fixture(scope="module")
def mask_ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_mask_wins")
    write_tiny(d, seed=1, mask_head=(196, 1.05))
    return LLaDA2Model.from_pretrained(d, "cpu", "fp32", with_adapter=True), ChatTokenizer(d)


def _prompts(n, seed):
    rng = random.Random(seed)
    return [([rng.randrange(256) for _ in range(rng.randint(5, 60))], rng.randint(20, 40)) for _ in range(n)]


def test_rules_hold_step_by_step_where_the_mask_wins(mask_ckpt):
    """Every recorded step's output against the rules computed by hand from its logits (full vocabulary)."""
    model, tok = mask_ckpt
    events = {"mask_fill": 0, "remask": 0}
    for dec in (S_MODE, Q_MODE):
        for prompt, G in _prompts(4, 7):
            be = Recording(model)
            generate_ids(be, prompt, dec, mask_id=MASK, eos_id=tok.eos_id, max_new_tokens=G)
            outs = {}
            for i, (s, ids, lg) in enumerate(be.steps):
                nxt = be.steps[i + 1] if i + 1 < len(be.steps) and be.steps[i + 1][0] == s else None
                outs[i] = nxt[1] if nxt is not None else dict(be.finals)[s]
            for i, (s, ids, lg) in enumerate(be.steps):
                p, x = torch.softmax(lg, -1).max(-1)
                gen = torch.arange(s, s + B) >= len(prompt)
                masked = (ids == MASK) & gen
                fill = masked & (p > dec["threshold"])
                if masked.any() and not fill.any():
                    fill[torch.where(masked, p, torch.tensor(-1.0)).argmax()] = True
                edit = gen & ~masked & (x != ids) & (p > dec["edit_threshold"])
                want = torch.where(fill | edit, x, ids)
                if i == len(be.steps) - 1 or be.steps[i + 1][0] == s:
                    assert torch.equal(outs[i], want), (dec, prompt, i)
                events["mask_fill"] += int((fill & (x == MASK)).sum())
                events["remask"] += int((edit & (x == MASK)).sum())
    assert events["mask_fill"] > 0 and events["remask"] > 0, events  # the checkpoint exercises both rules


SETTINGS = [S_MODE, Q_MODE, {"algorithm": "low_confidence"}, {"algorithm": "orl", "self_conditioning": False},
            {**S_MODE, "exclude_mask_token": True}]


@pytest.mark.parametrize("dec", SETTINGS, ids=lambda d: "-".join(f"{k}={v}" for k, v in d.items()))
def test_host_device_step_and_naive_reference_agree(mask_ckpt, dec):
    model, tok = mask_ckpt
    for prompt, G in _prompts(3, 11):
        kw = dict(mask_id=MASK, eos_id=tok.eos_id, max_new_tokens=G)
        host = generate_ids(CachedBackend(model), prompt, dec, **kw)
        dev_be = EagerStepBackend(model, MASK)
        dev = generate_ids(dev_be, prompt, dec, **kw)
        ref = reference_generate(model, prompt, dec, **kw)
        for other in (dev, ref):
            assert other.raw_ids == host.raw_ids and other.forwards == host.forwards
            assert other.block_forwards == host.block_forwards and other.stalled_blocks == host.stalled_blocks
        assert dev_be.rounds == host.forwards["denoise"]


def test_orl_self_conditioning_host_device_and_naive_backend_agree(mask_ckpt):
    model, tok = mask_ckpt
    for prompt, G in _prompts(2, 5):
        kw = dict(mask_id=MASK, eos_id=tok.eos_id, max_new_tokens=G)
        host = generate_ids(CachedBackend(model), prompt, {"algorithm": "orl"}, **kw)
        dev = generate_ids(EagerStepBackend(model, MASK), prompt, {"algorithm": "orl"}, **kw)
        ref = generate_ids(ReferenceBackend(model), prompt, {"algorithm": "orl"}, **kw)
        for other in (dev, ref):
            assert (other.raw_ids, other.forwards, other.stalled_blocks) == \
                (host.raw_ids, host.forwards, host.stalled_blocks)


def test_default_differs_from_exclusion_on_this_checkpoint(mask_ckpt):
    model, tok = mask_ckpt
    differ = 0
    for prompt, G in _prompts(4, 3):
        kw = dict(mask_id=MASK, eos_id=tok.eos_id, max_new_tokens=G)
        a = generate_ids(CachedBackend(model), prompt, S_MODE, **kw)
        b = generate_ids(CachedBackend(model), prompt, {**S_MODE, "exclude_mask_token": True}, **kw)
        differ += a.raw_ids != b.raw_ids
    assert differ >= 3, differ


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_round_graph_device_step_equals_host_decoders_where_mask_wins(tmp_path):
    """On CUDA (bf16, Triton kernels, CUDA graphs): the round graph (forward + on-device step) and the same
    forward graphs driven by the host decoders see bitwise-identical logits on the mask-wins checkpoint, so
    tokens, forward counts and stalled blocks must be identical, for every decoder family.
    Run: ``python -m pytest -q tests/engine/test_mask_candidate.py -k gpu``."""
    from repro.engine import LLM
    from repro.engine.graph import GraphBackend

    write_tiny(tmp_path, seed=1, mask_head=(196, 1.05))
    fast = LLM(tmp_path, role="orl", precision="bf16", device="cuda")
    assert fast.engine_path == "cuda-graph" and isinstance(fast.backend, GraphBackend)
    mask = fast.mask_id
    host = GraphBackend(fast.model, mask, device_steps=False)  # host decoders over the same forward graphs
    wins = {"masked": 0, "written": 0}
    graph_denoise = host.denoise

    def counting(ids, start, embeds):
        lg = graph_denoise(ids, start, embeds)
        top = lg.argmax(-1) == mask
        wins["masked"] += int((top & (ids == mask)).sum())
        wins["written"] += int((top & (ids != mask)).sum())
        return lg

    host.denoise = counting
    for dec in SETTINGS + [{"algorithm": "orl"}]:
        for prompt, G in _prompts(3, 13):
            kw = dict(mask_id=mask, eos_id=fast.eos_id, max_new_tokens=G)
            with torch.inference_mode():
                a = generate_ids(fast.backend, prompt, dec, **kw)
                b = generate_ids(host, prompt, dec, **kw)
            assert (a.raw_ids, a.forwards, a.block_forwards, a.stalled_blocks) == \
                (b.raw_ids, b.forwards, b.block_forwards, b.stalled_blocks), dec
    print(f"\nmask won the argmax at {wins['masked']} masked and {wins['written']} written positions")
    assert wins["masked"] > 0 and wins["written"] > 0
