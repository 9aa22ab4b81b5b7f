"""A checkpoint whose adapter tensors the config does not declare (the published ORL checkpoint's format is
not public): the unknown tensors are listed with shapes, flagged as a likely residual adapter, and an adapter
mapping file (docs/adapter_map.md) makes it load and run; role "orl" without any adapter says what it runs."""

import json
import shutil
import warnings

import pytest
import torch
from safetensors.torch import load_file, save_file

from repro.engine import LLM
from repro.engine.config import ConfigError, LLaDA2Config
from repro.engine.model import LLaDA2Model
from repro.engine.weights import WeightLoadError

# the tiny checkpoint's adapter under other names, as an unknown (published) format might store it
RENAMED = {"model.orl_adapter.down_proj.weight": "orl.residual_head.0.weight",
           "model.orl_adapter.up_proj.weight": "orl.residual_head.2.weight"}


@pytest.fixture(scope="module")
def undeclared(tiny_dir, tmp_path_factory):
    """The tiny checkpoint with its adapter tensors renamed and config.json's adapter block removed."""
    d = tmp_path_factory.mktemp("orl_undeclared") / "ckpt"
    shutil.copytree(tiny_dir, d)
    cfg = json.loads((d / "config.json").read_text())
    block = cfg.pop("orl_residual_adapter")
    (d / "config.json").write_text(json.dumps(cfg))
    index = json.loads((d / "model.safetensors.index.json").read_text())
    for f in sorted(d.glob("model-*.safetensors")):
        t = load_file(str(f))
        if set(t) & set(RENAMED):
            t = {RENAMED.get(n, n): v for n, v in t.items()}
            save_file(t, str(f), metadata={"format": "pt"})
    index["weight_map"] = {RENAMED.get(n, n): f for n, f in index["weight_map"].items()}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    return d, block


def test_unknown_tensors_are_listed_flagged_and_pointed_at_the_mapping(undeclared):
    d, _ = undeclared
    with pytest.raises(WeightLoadError) as e:
        LLaDA2Model.from_pretrained(d)
    msg = str(e.value)
    assert "2 tensor(s) the loader does not know: orl.residual_head.0.weight [16, 64]; " \
           "orl.residual_head.2.weight [64, 16]." in msg
    assert "look like a residual adapter" in msg and "hidden size 64" in msg
    assert "adapter_map.json next to the checkpoint" in msg and "docs/adapter_map.md" in msg


def test_unknown_backbone_tensor_is_not_called_an_adapter(tiny_dir, tmp_path):
    d = tmp_path / "extra"
    shutil.copytree(tiny_dir, d)
    f = sorted(d.glob("model-*.safetensors"))[0]
    t = load_file(str(f))
    t["model.layers.1.attention.extra_bias"] = torch.zeros(3)
    save_file(t, str(f), metadata={"format": "pt"})
    index = json.loads((d / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.layers.1.attention.extra_bias"] = f.name
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(WeightLoadError) as e:
        LLaDA2Model.from_pretrained(d)
    assert "model.layers.1.attention.extra_bias [3]" in str(e.value) and "residual adapter" not in str(e.value)


def test_with_a_mapping_file_it_loads_and_runs_as_the_declared_checkpoint(undeclared, tiny_dir, tmp_path):
    d, block = undeclared
    mapped = tmp_path / "mapped"
    shutil.copytree(d, mapped)
    (mapped / "adapter_map.json").write_text(json.dumps({**block, "tensors": {
        "down": "orl.residual_head.0.weight", "up": "orl.residual_head.2.weight"}}))
    ours = LLM(mapped, role="orl", device="cpu", precision="fp32")
    ref = LLM(tiny_dir, role="orl", device="cpu", precision="fp32")
    assert ours.model.with_adapter and torch.equal(ours.model.params["adapter.down"], ref.model.params["adapter.down"])
    assert "ORL residual adapter loaded (mlp_silu" in ours.adapter_note
    dec = {"algorithm": "orl", "max_new_tokens": 24}
    a, b = ours.generate("2+2=", decoder=dec), ref.generate("2+2=", decoder=dec)
    assert a.raw_token_ids == b.raw_token_ids and a.forwards == b.forwards
    # the same file given explicitly (config.yaml `adapter_map:`) instead of next to the checkpoint
    elsewhere = tmp_path / "maps" / "orl.json"
    elsewhere.parent.mkdir()
    shutil.move(mapped / "adapter_map.json", elsewhere)
    assert LLaDA2Config.from_file(mapped, adapter_map=elsewhere).adapter == ours.config.adapter
    assert LLaDA2Model.from_pretrained(mapped, adapter_map=elsewhere).with_adapter
    with pytest.raises(ConfigError, match="does not exist"):
        LLaDA2Config.from_file(mapped, adapter_map=tmp_path / "nope.json")


def test_mapping_beside_a_declared_adapter_is_refused(tiny_dir, tmp_path):
    d = tmp_path / "both"
    shutil.copytree(tiny_dir, d)
    (d / "adapter_map.json").write_text(json.dumps({"type": "linear", "tensors": {"proj": "x"}, "alpha": 1,
                                                    "temperature": 1}))
    with pytest.raises(ConfigError, match="declares orl_residual_adapter and .*adapter_map.json maps an adapter"):
        LLaDA2Config.from_file(d)


def test_orl_role_without_adapter_says_what_it_runs(tiny_dir, tmp_path):
    d = tmp_path / "noadapter"
    shutil.copytree(tiny_dir, d)
    cfg = json.loads((d / "config.json").read_text())
    names = cfg.pop("orl_residual_adapter")["tensors"].values()
    (d / "config.json").write_text(json.dumps(cfg))
    index = json.loads((d / "model.safetensors.index.json").read_text())
    for f in sorted(d.glob("model-*.safetensors")):
        t = load_file(str(f))
        save_file({n: v for n, v in t.items() if n not in names}, str(f), metadata={"format": "pt"})
    index["weight_map"] = {n: f for n, f in index["weight_map"].items() if n not in names}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.warns(UserWarning, match=r"declares no ORL residual adapter.*RCD interpolation.*not the ORL model"):
        llm = LLM(d, role="orl", device="cpu", precision="fp32")
    assert not llm.model.with_adapter and "Use role base" in llm.adapter_note
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert "not loaded" in LLM(d, role="base", device="cpu", precision="fp32").adapter_note
