"""NVFP4 (ModelOpt export) path: quantizer/dequantizer, the tiny NVFP4 variant, loading, and parity."""

import json
import random

import pytest
import torch
from safetensors.torch import load_file

from repro.checkpoint.nvfp4 import E2M1_VALUES, dequantize, quantize
from repro.checkpoint.tiny import write_tiny
from repro.engine.decode_loop import CachedBackend, generate_ids
from repro.engine.model import LLaDA2Model
from repro.engine.reference import ReferenceBackend
from repro.engine.weights import WeightLoadError


@pytest.fixture(scope="module")
def nvfp4_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_nvfp4")
    write_tiny(d, seed=1, nvfp4=True)
    return d


def test_packing_order_and_values_by_hand():
    w = torch.zeros(1, 16)
    w[0, :4] = torch.tensor([6.0, -0.5, 1.5, 3.0])
    q = quantize(w)
    assert q["weight"].dtype == torch.uint8 and q["weight"].shape == (1, 8)
    assert q["weight_scale"].dtype == torch.float8_e4m3fn and q["weight_scale"].shape == (1, 1)
    # global scale = 6 / (6·448); block scale = 6/6/gs = 448 (exact in E4M3) → effective scale 1
    assert float(q["weight_scale_2"]) == pytest.approx(6 / (6 * 448))
    # codes: 6.0 → 7, -0.5 → 8|1 = 9, 1.5 → 3, 3.0 → 5; low nibble holds the even element
    assert q["weight"][0, :2].tolist() == [7 | (9 << 4), 3 | (5 << 4)]
    assert torch.equal(dequantize(q["weight"], q["weight_scale"], q["weight_scale_2"]), w)


def test_dequantized_values_are_the_nearest_fp4_grid_points():
    w = torch.randn(32, 64, generator=torch.Generator().manual_seed(0)) * 0.2
    q = quantize(w)
    deq = dequantize(q["weight"], q["weight_scale"], q["weight_scale_2"])
    eff = (q["weight_scale"].float() * q["weight_scale_2"]).repeat_interleave(16, 1)
    x = (w / eff).abs().clamp(max=6.0)
    nearest = E2M1_VALUES[(x[..., None] - E2M1_VALUES).abs().argmin(-1)]
    assert torch.allclose(deq.abs() / eff, nearest, atol=1e-6)
    # error within FP4 rounding: at most half the widest grid gap (1.0 between 4 and 6) per unit of scale
    assert ((deq - w).abs() <= eff * 1.0 + 1e-7).all()
    assert (deq - w).abs().mean() < 0.1 * w.abs().mean()


def test_tiny_nvfp4_checkpoint_layout_and_dequantized_load(tiny_dir, nvfp4_dir, tiny_model):
    cfg = json.loads((nvfp4_dir / "config.json").read_text())
    assert cfg["quantization_config"]["quant_algo"] == "NVFP4"
    hq = json.loads((nvfp4_dir / "hf_quant_config.json").read_text())
    assert hq["quantization"]["quant_algo"] == "NVFP4" and hq["quantization"]["group_size"] == 16
    idx = json.loads((nvfp4_dir / "model.safetensors.index.json").read_text())["weight_map"]
    p = "model.layers.1.mlp.experts.0.gate_proj."
    assert {p + s for s in ("weight", "weight_scale", "weight_scale_2", "input_scale")} <= set(idx)
    assert "model.layers.1.mlp.shared_experts.gate_proj.weight_scale" not in idx
    m = LLaDA2Model.from_pretrained(nvfp4_dir)
    for k, v in tiny_model.params.items():
        if ".moe.w_" in k:
            # the dequantized experts equal dequantize(quantize(bf16 weights)) and stay close to them
            assert not torch.equal(m.params[k], v)
            assert (m.params[k] - v).abs().max() <= v.abs().max() / 6 * 1.07
        else:
            assert torch.equal(m.params[k], v), k
    bf = load_file(str(tiny_dir / idx[p + "weight"]))[p + "weight"]
    q = quantize(bf.float())
    assert torch.equal(m.params["layers.1.moe.w_gate_up"][0][:32],
                       dequantize(q["weight"], q["weight_scale"], q["weight_scale_2"]))


def test_incomplete_nvfp4_group_is_listed(nvfp4_dir, tmp_path):
    from ckpt_edit import edited_copy

    d = tmp_path / "broken"
    name = "model.layers.2.mlp.experts.3.down_proj.weight_scale_2"
    wm = edited_copy(nvfp4_dir, d, name, lambda t: t.pop(name))
    del wm[name]
    idx = json.loads((d / "model.safetensors.index.json").read_text())
    (d / "model.safetensors.index.json").write_text(json.dumps({**idx, "weight_map": wm}))
    with pytest.raises(WeightLoadError) as e:
        LLaDA2Model.from_pretrained(d)
    assert "model.layers.2.mlp.experts.3.down_proj.weight_scale" in str(e.value)


@pytest.mark.parametrize("dec", [{"algorithm": "low_confidence", "threshold": 0.9},
                                 {"algorithm": "joint_threshold", "threshold": 0.7, "edit_threshold": 0.9,
                                  "max_post_steps": 4},
                                 {"algorithm": "orl"}])
def test_nvfp4_dequantized_model_parity(nvfp4_dir, tiny_tok, dec):
    m = LLaDA2Model.from_pretrained(nvfp4_dir)
    rng = random.Random(7)
    for _ in range(6):
        prompt = [rng.randrange(256) for _ in range(rng.randint(1, 70))]
        G = rng.randint(1, 40)
        kw = dict(mask_id=tiny_tok.mask_id, eos_id=tiny_tok.eos_id, max_new_tokens=G)
        a = generate_ids(CachedBackend(m), prompt, dec, **kw)
        b = generate_ids(ReferenceBackend(m), prompt, dec, **kw)
        assert a.raw_ids == b.raw_ids and a.forwards == b.forwards


# ---------------------------------------------------------------- precision nvfp4-w4a16 (experts kept packed)

def test_w4a16_keeps_experts_packed_with_the_dequantized_values(nvfp4_dir):
    from repro.checkpoint.nvfp4 import NVFP4Experts

    deq = LLaDA2Model.from_pretrained(nvfp4_dir, "cpu", "fp32")
    w4 = LLaDA2Model.from_pretrained(nvfp4_dir, "cpu", "nvfp4-w4a16")
    assert w4.precision == "nvfp4-w4a16" and w4.dtype == torch.float32  # activations fp32 on the CPU
    for k, v in deq.params.items():
        if k.endswith((".moe.w_gate_up", ".moe.w_down")):
            p = w4.params[k]
            assert isinstance(p, NVFP4Experts) and p.shape == tuple(v.shape)
            assert p.nbytes < v.numel()  # ~0.57 byte per weight (vs 4 in fp32)
            assert torch.equal(p.dequantize(), v), k  # bit-identical to dequantize-at-load
        else:
            assert torch.equal(w4.params[k], v), k


def test_w4a16_greedy_tokens_identical_to_dequantize_at_load_on_cpu(nvfp4_dir, tiny_tok):
    deq = LLaDA2Model.from_pretrained(nvfp4_dir, "cpu", "fp32")
    w4 = LLaDA2Model.from_pretrained(nvfp4_dir, "cpu", "nvfp4-w4a16")
    rng = random.Random(3)
    for dec in ({"algorithm": "low_confidence", "threshold": 0.9}, {"algorithm": "orl"}):
        prompt = [rng.randrange(256) for _ in range(rng.randint(5, 40))]
        kw = dict(mask_id=tiny_tok.mask_id, eos_id=tiny_tok.eos_id, max_new_tokens=24)
        a = generate_ids(CachedBackend(deq), prompt, dec, **kw)
        b = generate_ids(CachedBackend(w4), prompt, dec, **kw)
        assert a.raw_ids == b.raw_ids and a.forwards == b.forwards


def test_precision_errors_name_the_fix(tiny_dir, nvfp4_dir, tmp_path):
    import shutil

    with pytest.raises(WeightLoadError, match="not NVFP4.*use precision bf16"):
        LLaDA2Model.from_pretrained(tiny_dir, "cpu", "nvfp4-w4a16")
    with pytest.raises(ValueError, match="Blackwell.*nvfp4-w4a16"):
        LLaDA2Model.from_pretrained(nvfp4_dir, "cpu", "nvfp4")
    d = tmp_path / "no_hq"
    shutil.copytree(nvfp4_dir, d)
    (d / "hf_quant_config.json").unlink()
    with pytest.raises(WeightLoadError, match="hf_quant_config.json is missing"):
        LLaDA2Model.from_pretrained(d, "cpu", "nvfp4-w4a16")


@pytest.mark.parametrize("precision", ["fp32", "nvfp4-w4a16"])
def test_malformed_scale_dtype_is_named(nvfp4_dir, tmp_path, precision):
    """A weight_scale stored as fp32 instead of E4M3 (a hand-made, non-ModelOpt export) is refused by name."""
    from ckpt_edit import edited_copy

    d = tmp_path / "bad_scale"
    name = "model.layers.1.mlp.experts.2.up_proj.weight_scale"
    edited_copy(nvfp4_dir, d, name, lambda t: t.update({name: t[name].float()}))
    with pytest.raises(WeightLoadError, match=r"experts\.2\.up_proj.*float8_e4m3fn"):
        LLaDA2Model.from_pretrained(d, "cpu", precision)


def test_dequantize_cli_writes_a_hashed_bf16_checkpoint(nvfp4_dir, tmp_path):
    """The SGLang backend's input: the NVFP4 checkpoint dequantized to BF16 once, with provenance and manifest."""
    from repro.checkpoint.__main__ import main as ckpt_main
    from repro.checkpoint.verify import verify

    out = tmp_path / "deq"
    assert ckpt_main(["dequantize", "--src", str(nvfp4_dir), "--out", str(out)]) == 0
    cfg = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in cfg and not (out / "hf_quant_config.json").exists()
    prov = json.loads((out / "quant_provenance.json").read_text())
    assert prov["dtype"] == "bfloat16" and prov["groups_dequantized"] > 0
    assert prov["dequantized_from"]["manifest_sha256"] == json.loads(
        (nvfp4_dir / "checkpoint_manifest.json").read_text())["manifest_sha256"]
    assert verify(out).ok and not (tmp_path / "deq.partial").exists()
    a = LLaDA2Model.from_pretrained(out, "cpu", "bf16")
    b = LLaDA2Model.from_pretrained(nvfp4_dir, "cpu", "bf16")  # dequantize at load
    assert all(torch.equal(a.params[k], b.params[k]) for k in b.params)
    assert ckpt_main(["dequantize", "--src", str(out), "--out", str(tmp_path / "again")]) == 2  # not NVFP4
