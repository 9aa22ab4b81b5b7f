"""The on-device decoder step (repro.engine.decoders.device) against the host-driven decoders: same logits in,
same tokens, forward counts and commit decisions out, for every algorithm and setting family. Runs the eager
torch model on CPU (the CUDA-graph replay of the same step runs in tests/engine/test_gpu.py)."""

import random

import pytest
import torch

from repro.engine.decoders import DecoderConfig
from repro.engine.decoders.device import DeviceStep, supported
from repro.engine.decode_loop import CachedBackend, EagerStepBackend, generate_ids


SETTINGS = [
    {"algorithm": "low_confidence"},
    {"algorithm": "low_confidence", "threshold": 0.3, "num_to_transfer": 3},
    {"algorithm": "joint_threshold"},
    {"algorithm": "joint_threshold", "threshold": 0.9, "edit_threshold": 0.6, "max_post_steps": 2},
    {"algorithm": "joint_threshold", "editing": False},
    {"algorithm": "joint_threshold", "exclude_mask_token": True},
    {"algorithm": "orl"},
    {"algorithm": "orl", "self_conditioning": False},
    {"algorithm": "orl", "residual_temperature": 0.5, "max_post_steps": 0},
]


@pytest.mark.parametrize("dec", SETTINGS, ids=lambda d: "-".join(f"{k}={v}" for k, v in d.items()))
def test_device_step_equals_host_decoders(tiny_model, tiny_tok, dec):
    rng = random.Random(hash(str(sorted(dec.items()))) % 1000)
    for _ in range(4):
        prompt = [rng.randrange(256) for _ in range(rng.randint(1, 75))]
        kw = dict(mask_id=tiny_tok.mask_id, eos_id=tiny_tok.eos_id, max_new_tokens=rng.randint(1, 70))
        dev_be = EagerStepBackend(tiny_model, tiny_tok.mask_id)
        a = generate_ids(CachedBackend(tiny_model), prompt, dec, **kw)
        b = generate_ids(dev_be, prompt, dec, **kw)
        assert b.raw_ids == a.raw_ids and b.token_ids == a.token_ids
        assert b.forwards == a.forwards and b.block_forwards == a.block_forwards
        assert dev_be.rounds == a.forwards["denoise"]


def test_sampling_stays_on_the_host_path():
    assert not supported(DecoderConfig.from_dict({"algorithm": "orl", "temperature": 0.7}))
    with pytest.raises(ValueError, match="greedy"):
        DeviceStep(DecoderConfig.from_dict({"algorithm": "orl", "temperature": 0.7}), 0, None,
                   torch.zeros(4, dtype=torch.long), None)
