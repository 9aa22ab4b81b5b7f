"""Decoder contracts on scripted logits (a fake backend), plus forward-count and TPF bookkeeping."""

import pytest
import torch

from repro.engine.adapter import normalized_entropy, residual
from repro.engine.decoders import DecoderConfig, DecoderConfigError
from repro.engine.decode_loop import generate_ids

V, MASK, EOS, B = 262, 258, 256, 32


class Scripted:
    """Forward backend whose denoise logits come from ``fn(step, tokens, start)``; records calls."""

    def __init__(self, model, fn):
        self.model, self.fn, self.calls = model, fn, []

    def begin(self, capacity, block_size):
        self.step = 0

    def prefill(self, ids, start=0):
        self.calls.append(("prefill", len(ids)))

    def denoise(self, ids, start, embeds):
        self.calls.append(("denoise", start, ids.clone(), None if embeds is None else embeds.clone()))
        out = self.fn(self.step, ids, start)
        self.step += 1
        return out

    def commit_block(self, ids, start, run_forward):
        self.calls.append(("commit" if run_forward else "reuse", start))


def peaked(tokens_probs):
    """Logits [B, V] whose softmax gives token t probability ≈ p at each position (t, p)."""
    lg = torch.zeros(B, V)
    for i, (t, p) in enumerate(tokens_probs):
        lg[i, t] = torch.log(torch.tensor(p * (V - 2) / (1 - p)))  # other V-2 non-mask tokens at logit 0
    return lg


def run(model, fn, dec, prompt, G, seed=None):
    be = Scripted(model, fn)
    r = generate_ids(be, prompt, dec, mask_id=MASK, eos_id=EOS, max_new_tokens=G, seed=seed)
    return r, be


def test_low_confidence_threshold_and_top1_fallback(tiny_model):
    # step 0: positions 0..3 confident (0.99), others 0.5 → commit 4; step ≥1: all 0.5 → top-1 each step
    def fn(step, ids, start):
        return peaked([(65 + i, 0.99 if (step == 0 and i < 4) else 0.5 - 0.001 * i) for i in range(B)])
    r, be = run(tiny_model, fn, {"algorithm": "low_confidence", "threshold": 0.9}, [1] * 32, 32)
    # 1 prefill, block of 32 masks: 1 step commits 4, then 28 steps of 1, then one commit forward
    assert r.forwards == {"prefill": 1, "denoise": 29, "commit": 1}
    assert r.token_ids == [65 + i for i in range(32)]
    assert r.tpf == pytest.approx(32 / 30)
    # fallback order: most confident first → position 4 is committed at step 1
    assert be.calls[2][2][:4].tolist() == [65, 66, 67, 68] and be.calls[2][2][4] == MASK
    assert be.calls[3][2][4] == 65 + 4 and be.calls[3][2][5] == MASK


def _wants_mask(step, ids, start):
    lg = torch.zeros(B, V)
    lg[:, MASK] = 100.0  # the model "wants" <|mask|> everywhere
    lg[:, 70] = 5.0
    return lg


def test_excluded_mask_is_never_committed_and_prompt_never_edited(tiny_model):
    prompt = [10] * 40  # block 1 holds 8 prompt tokens
    r, be = run(tiny_model, _wants_mask, {"algorithm": "joint_threshold", "threshold": 0.5, "edit_threshold": 0.0,
                                          "exclude_mask_token": True}, prompt, 24)
    assert r.token_ids == [70] * 24 and r.stalled_blocks == []
    for c in be.calls:
        if c[0] == "denoise":
            assert c[2][:8].tolist() == [10] * 8


@pytest.mark.parametrize("algo", ["low_confidence", "joint_threshold", "orl"])
def test_mask_candidate_that_always_wins_stops_at_the_cap_and_says_so(tiny_model, algo):
    # the references write <|mask|> back (no progress); ours stops at SGLang's max_steps and reports the block
    prompt = [10] * 40
    dec = {"algorithm": algo, "max_post_steps": 3, "self_conditioning": False}
    with pytest.warns(RuntimeWarning, match=r"did not finish block 1 \(counted over prompt \+ generation; the 1st "
                                            r"generated\) within \d+ denoising forwards; 24 <\|mask\|>"):
        r, be = run(tiny_model, _wants_mask, dec, prompt, 24)
    # low_confidence: the LLaDA2.0 reference generate's 32 steps; editing decoders: SGLang's max_steps
    cap = 32 if algo == "low_confidence" else 32 + 3 + 1
    assert r.stalled_blocks == [1] and "exclude_mask_token" in r.stall_note
    assert r.raw_ids == [MASK] * 24 and r.forwards == {"prefill": 1, "denoise": cap, "commit": 0}
    assert be.calls[-1] == ("reuse", 32)  # the last forward saw the (unchanged) final tokens


def _llada20_reference_forwards(fn, block, is_prompt, threshold=0.95, steps=32):
    """Forwards of one block under the LLaDA2.0 reference generate (HF remote code of LLaDA2.0-mini, written
    out in docs/engine.md §6.1): up to ``steps`` iterations; stop if no masks remain; forward; commit every
    masked position with p > threshold, else the single most confident one (which may be ``<|mask|>``)."""
    x, n = block.clone(), 0
    for _ in range(steps):
        masked = (x == MASK) & ~is_prompt
        if not bool(masked.any()):
            break
        p, tok = torch.softmax(fn(n, x, 0), dim=-1).max(dim=-1)
        n += 1
        conf = torch.where(masked, p, torch.full_like(p, float("-inf")))
        fill = conf > threshold
        if not bool(fill.any()):
            fill = torch.zeros_like(masked)
            fill[int(conf.argmax())] = True
        x = torch.where(fill, tok, x)
    return n, x


def _stall_after_one_step(step, ids, start):
    lg = _wants_mask(step, ids, start)
    if step == 0:
        lg[8:14, 71] = 200.0  # the first step fills 6 positions, then the mask wins everywhere
    return lg


@pytest.mark.parametrize("fn", [_wants_mask, _stall_after_one_step], ids=["stalled-from-start", "stalled-later"])
def test_low_confidence_stalled_block_costs_the_reference_steps(tiny_model, fn):
    """A block where ``<|mask|>`` keeps winning costs exactly the LLaDA2.0 reference's 32 forwards (its
    ``steps``), not SGLang's 34: same tokens, same forward count, so the same TPF."""
    prompt = [10] * 40  # block 1: 8 prompt tokens, 24 masks
    with pytest.warns(RuntimeWarning, match="did not finish block 1"):
        r, be = run(tiny_model, fn, {"algorithm": "low_confidence"}, prompt, 24)
    block = torch.tensor([10] * 8 + [MASK] * 24)
    ref_n, ref_tokens = _llada20_reference_forwards(fn, block, torch.arange(32) < 8)
    assert ref_n == 32
    assert r.block_forwards == [ref_n] and r.forwards == {"prefill": 1, "denoise": ref_n, "commit": 0}
    assert r.raw_ids == ref_tokens[8:].tolist() and r.stalled_blocks == [1]
    assert DecoderConfig(algorithm="low_confidence").max_denoise_forwards() == 32


def test_editing_off_differs_from_edit_threshold_zero(tiny_model):
    # step 0: everything committed as 65 (conf 0.99); later forwards propose 66 with conf 0.3
    def fn(step, ids, start):
        return peaked([(65, 0.99) if step == 0 else (66, 0.3) for _ in range(B)])
    off, be_off = run(tiny_model, fn, {"algorithm": "joint_threshold", "threshold": 0.9, "editing": False}, [1] * 32, 32)
    assert off.token_ids == [65] * 32 and off.forwards["denoise"] == 1 and off.forwards["commit"] == 1
    on, be_on = run(tiny_model, fn, {"algorithm": "joint_threshold", "threshold": 0.9, "edit_threshold": 0.0,
                                     "max_post_steps": 16}, [1] * 32, 32)
    # edit_threshold 0: the first post step edits everything to 66; the next sees no change → final, K/V reused
    assert on.token_ids == [66] * 32
    assert on.forwards == {"prefill": 1, "denoise": 3, "commit": 0}
    assert be_on.calls[-1] == ("reuse", 32)


def test_post_steps_cap_then_commit(tiny_model):
    # forwards alternate proposals 65/66 with high confidence → edits forever; cap at max_post_steps
    def fn(step, ids, start):
        return peaked([(65 + step % 2, 0.99) for _ in range(B)])
    r, be = run(tiny_model, fn, {"algorithm": "joint_threshold", "threshold": 0.9, "edit_threshold": 0.5,
                                 "max_post_steps": 3}, [1] * 32, 32)
    # 1 M2T step + 3 post-edit steps, then post_steps 4 > 3 → final without forward → commit forward
    assert r.forwards == {"prefill": 1, "denoise": 4, "commit": 1}
    assert be.calls[-1] == ("commit", 32)


def test_max_new_tokens_mid_block_truncates_and_eos_cut(tiny_model):
    def fn(step, ids, start):
        return peaked([(EOS if start + i == 45 else 65, 0.99) for i in range(B)])
    r, _ = run(tiny_model, fn, {"algorithm": "low_confidence", "threshold": 0.9}, [1] * 20, 10)
    assert r.raw_ids == [65] * 10 and r.finish_reason == "length" and r.generated_tokens == 10
    r, _ = run(tiny_model, fn, {"algorithm": "low_confidence", "threshold": 0.9}, [1] * 20, 100)
    # EOS at absolute position 45 (block 1) = generated index 25; stop after block 1 of 4
    assert r.finish_reason == "eos" and r.token_ids == [65] * 25 and r.block_forwards == [2, 2]
    assert r.raw_ids[25] == EOS and len(r.raw_ids) == 44
    assert r.tpf == pytest.approx(25 / 4)


def test_orl_residual_only_at_masked_positions_and_reset_per_block(tiny_model):
    seen = []

    def fn(step, ids, start):
        seen.append(start)
        # commit position `step % 32` each step at high confidence, others diffuse-ish
        return peaked([(65 + i, 0.99 if i == (step % 32) else 0.2) for i in range(B)])
    dec = {"algorithm": "orl", "threshold": 0.9, "editing": False}
    r, be = run(tiny_model, fn, dec, [1] * 32, 64)
    den = [c for c in be.calls if c[0] == "denoise"]
    first_of_block = {}
    for c in den:
        first_of_block.setdefault(c[1], c)
    for start, c in first_of_block.items():
        assert c[3] is None, f"block {start}: residual must be reset (cold start)"
    c = den[1]
    ids, emb = c[2], c[3]
    plain = tiny_model.embed(ids)
    masked = ids == MASK
    assert emb is not None and masked.any() and (~masked).any()
    assert torch.equal(emb[~masked], plain[~masked])
    assert not torch.allclose(emb[masked], plain[masked])
    # with self-conditioning off no embeddings are passed
    _, be2 = run(tiny_model, fn, {**dec, "self_conditioning": False}, [1] * 32, 64)
    assert all(c[3] is None for c in be2.calls if c[0] == "denoise")


def test_orl_residual_formula_with_adapter(tiny_model):
    from repro.engine.adapter import adapter_g, residual_inputs
    lg = torch.randn(4, V)
    lg[:, MASK] = float("-inf")
    z, w, delta = residual(lg, tiny_model.params["embed"], 0.92)
    p = torch.softmax(lg, -1)
    assert torch.allclose(delta, p @ tiny_model.params["embed"], atol=1e-5)
    q = torch.softmax(lg / 0.92, -1)
    h = -(q * torch.where(q > 0, q.log(), torch.zeros_like(q))).sum(-1) / torch.log(torch.tensor(float(V)))
    assert torch.allclose(w, h, atol=1e-6) and torch.allclose(normalized_entropy(lg, 0.92), h)
    e_mask = tiny_model.params["embed"][MASK]
    a = tiny_model.cfg.adapter
    got = residual_inputs(e_mask, z, w, delta, a, tiny_model.params)
    assert torch.allclose(got, e_mask + a.alpha * adapter_g(a, tiny_model.params, z), atol=1e-5)
    rcd = residual_inputs(e_mask, z, w, delta, None, tiny_model.params)
    assert torch.allclose(rcd, (1 - w[:, None]) * e_mask + w[:, None] * delta, atol=1e-5)


def test_sampling_is_seeded(tiny_model):
    def fn(step, ids, start):
        torch.manual_seed(step)  # logits fixed per step, independent of the decoder's generator
        return torch.randn(B, V) * 2
    dec = {"algorithm": "low_confidence", "threshold": 0.3, "temperature": 1.0}
    a, _ = run(tiny_model, fn, dec, [1] * 5, 20, seed=1)
    b, _ = run(tiny_model, fn, dec, [1] * 5, 20, seed=1)
    c, _ = run(tiny_model, fn, dec, [1] * 5, 20, seed=2)
    assert a.raw_ids == b.raw_ids and a.raw_ids != c.raw_ids


@pytest.mark.parametrize("d,match", [
    ({"algorithm": "beam"}, "unknown decoder algorithm"),
    ({"algorithm": "orl", "treshold": 0.9}, r"unknown decoder keys \['treshold'\]"),
    ({"algorithm": "orl", "threshold": 1.5}, "threshold must be in"),
    ({"algorithm": "joint_threshold", "self_conditioning": True}, "only implemented by the 'orl'"),
    ({"algorithm": "orl", "temperature": -1}, "temperature"),
])
def test_bad_decoder_settings_are_named(d, match):
    with pytest.raises(DecoderConfigError, match=match):
        DecoderConfig.from_dict(d)


def test_orl_defaults_are_the_model_card_settings():
    c = DecoderConfig.from_dict({"algorithm": "orl"})
    assert (c.threshold, c.edit_threshold, c.editing, c.max_post_steps, c.max_new_tokens, c.self_conditioning) == \
        (0.85, 0.5, True, 16, 4096, True)


def test_kv_cache_allocated_once_per_request(tiny_model, monkeypatch):
    from repro.engine import cache as cache_mod
    from repro.engine.decode_loop import CachedBackend
    made = []
    orig = cache_mod.KVCache.__init__

    def counting(self, *a, **k):
        made.append(a[1])
        orig(self, *a, **k)
    monkeypatch.setattr(cache_mod.KVCache, "__init__", counting)
    r = generate_ids(CachedBackend(tiny_model), list(range(40)), {"algorithm": "low_confidence", "threshold": 0.9},
                     mask_id=MASK, eos_id=EOS, max_new_tokens=50)
    assert made == [96]  # ceil((40 + 50) / 32) · 32, allocated once
    assert sum(r.block_forwards) == r.forwards["denoise"] + r.forwards["commit"]
    with pytest.raises(ValueError, match="outside capacity"):
        tiny_model.new_cache(32).write(0, 16, torch.zeros(32, 2, 16), torch.zeros(32, 2, 16))


@pytest.mark.parametrize("bad,match", [
    ({"editing": "no"}, "'editing' must be true or false, got 'no'"),
    ({"threshold": "0.9"}, "'threshold' must be a number"),
    ({"max_new_tokens": 1.5}, "'max_new_tokens' must be an integer"),
    ({"seed": "abc"}, "'seed' must be an integer"),
    ({"self_conditioning": 1, "algorithm": "orl"}, "'self_conditioning' must be true or false"),
    ({"edit_threshold": -1}, r"edit_threshold must be in \[0, 1\]"),
])
def test_decoder_settings_of_the_wrong_type_or_range_are_named(bad, match):
    with pytest.raises(DecoderConfigError, match=match):
        DecoderConfig.from_dict({"algorithm": "joint_threshold", **bad})


def test_registry_finds_each_decoder_module_by_name_with_its_defaults():
    from repro.engine.decoders import algorithms, make_decoder
    from repro.engine.decoders import joint_threshold, low_confidence, orl
    mods = algorithms()
    assert mods == {"low_confidence": low_confidence, "joint_threshold": joint_threshold, "orl": orl}
    for name, mod in mods.items():
        cfg = DecoderConfig(algorithm=name)
        assert cfg == DecoderConfig.from_dict({"algorithm": name})
        assert {k: getattr(cfg, k) for k in mod.DEFAULTS} == mod.DEFAULTS
        assert type(make_decoder(cfg, MASK)) is mod.Decoder and mod.Decoder.name == name
    assert DecoderConfig.from_dict({"algorithm": "low_confidence"}).threshold == 0.95  # SGLang LowConfidence


def test_default_config_is_the_same_decoder_either_way():
    a, b = DecoderConfig(), DecoderConfig.from_dict({})
    assert a == b and a.to_dict() == b.to_dict()
    assert (a.algorithm, a.threshold, a.edit_threshold, a.editing, a.exclude_mask_token) == \
        ("joint_threshold", 0.5, 0.0, True, False)
    with pytest.raises(DecoderConfigError, match=r"unknown decoder algorithm 'beam'; known: \['joint_threshold'"):
        DecoderConfig(algorithm="beam")
