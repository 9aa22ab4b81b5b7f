"""Cached engine vs the naive no-cache reference: identical token ids and forward counts (docs/engine.md §10 item 7).

fp32 CPU, tiny checkpoint, ≥ 30 random prompts per decoder family, prompts of varied length (shorter than
a block, ending mid-block, exact multiples of the block), budgets that end mid-block, greedy and seeded
sampling. Also checks that the runs cover EOS stops, length stops mid-block, and blocks whose final
forward was reused (no commit).
"""

import random

import pytest

from repro.engine.decode_loop import CachedBackend, generate_ids
from repro.engine.reference import ReferenceBackend

N_PROMPTS = 30

DECODERS = {
    "low_confidence": [{"algorithm": "low_confidence", "threshold": 0.9},
                       {"algorithm": "low_confidence", "threshold": 0.6, "temperature": 0.8}],
    "joint_threshold": [{"algorithm": "joint_threshold", "threshold": 0.5, "edit_threshold": 0.0},
                        {"algorithm": "joint_threshold", "threshold": 0.7, "edit_threshold": 0.9,
                         "max_post_steps": 4},
                        {"algorithm": "joint_threshold", "threshold": 0.7, "editing": False}],
    "orl": [{"algorithm": "orl"},
            {"algorithm": "orl", "threshold": 0.6, "edit_threshold": 0.95, "max_post_steps": 3,
             "temperature": 0.7, "residual_temperature": 1.3}],
}


def _cases(seed):
    rng = random.Random(seed)
    out = []
    for i in range(N_PROMPTS):
        P = [5, 31, 32, 33, 64, 70][i] if i < 6 else rng.randint(1, 80)
        G = [1, 20, 32, 40, 17, 58][i] if i < 6 else rng.randint(1, 48)
        out.append(([rng.randrange(256) for _ in range(P)], G, rng.randrange(1 << 30)))
    return out


SEEDS = {"low_confidence": 11, "joint_threshold": 22, "orl": 33}
EOS_STOPS: dict[str, int] = {}


@pytest.mark.parametrize("family", sorted(DECODERS))
def test_cached_engine_matches_reference(family, tiny_model, tiny_tok):
    stats = {"eos": 0, "length_mid_block": 0, "reused": 0, "prefill": 0}
    for i, (prompt, G, seed) in enumerate(_cases(SEEDS[family])):
        dec = DECODERS[family][i % len(DECODERS[family])]
        kw = dict(mask_id=tiny_tok.mask_id, eos_id=tiny_tok.eos_id, max_new_tokens=G, seed=seed)
        a = generate_ids(CachedBackend(tiny_model), prompt, dec, **kw)
        b = generate_ids(ReferenceBackend(tiny_model), prompt, dec, **kw)
        assert a.raw_ids == b.raw_ids, (family, i, dec)
        assert a.token_ids == b.token_ids
        assert a.forwards == b.forwards, (family, i, a.forwards, b.forwards)
        assert a.block_forwards == b.block_forwards
        assert a.finish_reason == b.finish_reason
        assert len(a.raw_ids) <= G and tiny_tok.eos_id not in a.token_ids and tiny_tok.mask_id not in a.token_ids
        stats["eos"] += a.finish_reason == "eos"
        stats["length_mid_block"] += a.finish_reason == "length" and (len(prompt) + G) % 32 != 0
        stats["reused"] += a.forwards["commit"] < len(a.block_forwards)
        stats["prefill"] += a.forwards["prefill"]
    assert stats["length_mid_block"] > 0 and stats["prefill"] > 0, stats
    if family != "low_confidence":  # low_confidence always needs a commit forward
        assert stats["reused"] > 0, stats
    EOS_STOPS[family] = stats["eos"]


def test_parity_runs_covered_eos_stops():
    """Runs after the parametrized test (file order): some parity case stopped at an EOS."""
    if len(EOS_STOPS) < len(DECODERS):
        pytest.skip("parity runs were deselected")
    assert sum(EOS_STOPS.values()) > 0, EOS_STOPS
