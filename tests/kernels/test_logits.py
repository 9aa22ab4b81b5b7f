"""The decode statistics kernel (kernels/logits.py) with an excluded column, and the batched decoder step's fused
proposals built on it (decoders/device_batch.py): the same tokens as the torch step, row by row independent of S."""

import pytest
import torch

pytest.importorskip("triton")


@pytest.mark.parametrize("exclude", [-1, 3, 150])
def test_logits_stats_excluded_column_matches_reference(dev, exclude):
    from repro.engine.kernels import logits as Lg

    g = torch.Generator().manual_seed(exclude + 7)
    T, V = 6, 333
    x = torch.randn(T, V, generator=g)
    if exclude >= 0:
        x[:, exclude] = 50.0  # would be every row's argmax if it were not excluded
    x = x.to(dev)
    part = torch.full((T, 4, 4), float("nan"), device=dev)
    pred = torch.full((T,), -1, dtype=torch.long, device=dev)
    conf = torch.full((T,), float("nan"), device=dev)
    ent = torch.full((T,), float("nan"), device=dev)
    Lg.logits_stats(x, part, pred, conf, ent, nchunk=4, block_v=64, exclude=exclude)
    p_ref, c_ref, e_ref = Lg.logits_stats_reference(x, exclude=exclude)
    assert torch.equal(pred.cpu(), p_ref.cpu()) and (pred != exclude).all()
    torch.testing.assert_close(conf.cpu(), c_ref.cpu(), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(ent.cpu(), e_ref.cpu(), rtol=1e-4, atol=1e-5)
    # rows are reduced independently: the first two rows alone give the same bits
    pred2, conf2 = pred[:2].clone().fill_(-1), conf[:2].clone().fill_(float("nan"))
    Lg.logits_stats(x[:2].contiguous(), part[:2].clone(), pred2, conf2, ent[:2].clone(), nchunk=4, block_v=64,
                    exclude=exclude)
    assert torch.equal(pred2, pred[:2]) and torch.equal(conf2, conf[:2])


@pytest.mark.parametrize("algorithm", ["joint_threshold", "low_confidence"])
def test_batched_step_fused_proposals_equal_the_torch_step(dev, algorithm):
    """Three slots of random logits over a few rounds: the fused-proposal step and the torch step (per slot
    softmax) give the same tokens and flags; the mask token is excluded as the decoder says."""
    from types import SimpleNamespace

    from repro.engine.decoders import DecoderConfig
    from repro.engine.decoders.device_batch import BatchedDeviceStep

    S, B, V, mask = 3, 8, 300, 299
    cfg = DecoderConfig.coerce({"algorithm": algorithm, "block_size": B, "exclude_mask_token": True,
                                "threshold": 0.02, "max_new_tokens": B})
    model = SimpleNamespace(params={}, with_adapter=False, cfg=None)
    g = torch.Generator().manual_seed(0)
    steps = []
    for fused in (False, True):
        tokens = torch.full((S, B), mask, dtype=torch.long, device=dev)
        st = BatchedDeviceStep(cfg, mask, model, tokens, None, fused_stats=fused)
        for s in range(S):
            st.start_block(s, tokens[s].clone(), torch.ones(B, dtype=torch.bool, device=dev))
        st.step_mask.fill_(True)
        steps.append((st, tokens))
    for _ in range(4):
        logits = torch.randn(S, B, V, generator=g) * 3
        logits[..., mask] = 40.0  # the excluded <|mask|> column would win every row
        logits = logits.to(dev)
        for st, _ in steps:
            st.step(logits)
        (a, ta), (b, tb) = steps
        assert torch.equal(ta, tb) and torch.equal(a.flags, b.flags)
        assert torch.equal(a._x, b._x) and (b._x != mask).all()
        torch.testing.assert_close(a._p, b._p, rtol=1e-5, atol=1e-7)
    assert (steps[1][1] != mask).any()  # tokens were committed
