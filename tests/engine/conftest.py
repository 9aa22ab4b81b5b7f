"""Shared fixtures: one tiny checkpoint per session (written by repro.checkpoint.tiny) and its model."""

import pytest
import torch

from repro.checkpoint.tiny import write_tiny
from repro.engine.model import LLaDA2Model
from repro.engine.tokenizer import ChatTokenizer

torch.set_num_threads(1)  # tiny matrices: threads only add sync overhead (and stall under CPU contention)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_ckpt")
    write_tiny(d, seed=1)
    return d


@pytest.fixture(scope="session")
def tiny_model(tiny_dir):
    return LLaDA2Model.from_pretrained(tiny_dir, "cpu", "fp32", with_adapter=True)


@pytest.fixture(scope="session")
def tiny_tok(tiny_dir):
    return ChatTokenizer(tiny_dir)
