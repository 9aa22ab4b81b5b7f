"""Tuned-tile lookup by card (repro/engine/kernels/configs): the card's own entry, else the nearest tuned card of
the same architecture, else defaults, with one line once per process naming what ran. The CUDA device is patched
(no GPU here): the lookup reads only its name, compute capability, SM count and memory bandwidth."""
from __future__ import annotations

import json

import pytest

import repro.engine.kernels.configs as C

H100 = C.Card("NVIDIA H100 80GB HBM3", (9, 0), 132, 3352.3, 85.0)
H100_PCIE = C.Card("NVIDIA H100 PCIe", (9, 0), 114, 2039.0, 85.0)
A100 = C.Card("NVIDIA A100-SXM4-80GB", (8, 0), 108, 2039.0, 85.0)


@pytest.fixture
def card(monkeypatch, tmp_path):
    """``use(card)`` makes ``card`` the current device; config files are read from a copy of the shipped ones."""
    for p in C.CONFIG_DIR.glob("*.json"):
        (tmp_path / p.name).write_text(p.read_text())
    monkeypatch.setattr(C, "CONFIG_DIR", tmp_path)
    monkeypatch.setattr(C, "_warned", set())

    def use(c):
        monkeypatch.setattr(C, "current_card", lambda device=None: c)
        return c

    return use


def _shipped(family: str, **shape) -> dict:
    return json.loads(C.config_path(family, **shape).read_text())


def test_every_shipped_entry_records_its_card():
    """The nearest-card step needs each tuned entry's card: every entry of every shipped file has one."""
    files = sorted(C.CONFIG_DIR.glob("*.json"))
    assert len(files) >= 5
    for p in files:
        for name, entry in json.loads(p.read_text()).items():
            if name == "default":
                continue
            rec = C.Card.from_meta(name, entry["_meta"]["card"])
            assert rec is not None and rec.name == name and rec.sms > 0, (p.name, name)


def test_own_entry_is_used_silently(card, capsys):
    h200 = json.loads((C.CONFIG_DIR / "moe_E=257_N=512_H=2048_T=32.json").read_text())["NVIDIA H200"]
    card(C.Card("NVIDIA H200", (9, 0), 132, 4800.0, 150.0))
    cfg = C.load_config("moe", "down", {"BLOCK_M": 99, "extra": 1}, E=257, N=512, H=2048, T=32)
    assert cfg == {**{"BLOCK_M": 99, "extra": 1}, **h200["down"]}
    rep = C.tiles_report()
    assert rep["status"] == "tuned" and rep["summary"] == "tiles tuned on this card (NVIDIA H200)"
    assert capsys.readouterr().err == ""


def test_a_card_without_entry_borrows_the_nearest_of_its_architecture_and_says_so_once(card, capsys):
    """An H100 without entries gets the Hopper card's tiles (not the built-in defaults), one line, once."""
    h200 = json.loads((C.CONFIG_DIR / "moe_E=257_N=512_H=2048_T=32.json").read_text())["NVIDIA H200"]
    for p in C.CONFIG_DIR.glob("*.json"):  # the H100 untuned (the shipped files may already hold it)
        d = json.loads(p.read_text())
        d.pop(H100.name, None)
        p.write_text(json.dumps(d))
    card(H100)
    assert C.load_config("moe", "gate_up", {}, E=257, N=512, H=2048, T=32) == h200["gate_up"]
    assert C.load_config("moe", "down", {}, E=257, N=512, H=2048, T=32) == h200["down"]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    line = err[0]
    for words in ("NVIDIA H100 80GB HBM3", "sm_90", "Hopper", "tuned on NVIDIA H200, used on NVIDIA H100 80GB HBM3",
                  C.TUNE_COMMAND):
        assert words in line, (words, line)
    rep = C.tiles_report()
    assert rep["status"] == "borrowed" and set(rep["files"].values()) == {"NVIDIA H200"}


def test_nearest_of_several_tuned_cards_by_sms_and_bandwidth(card, tmp_path):
    """Two Hopper entries: the PCIe H100 (114 SMs, 2.0 TB/s) takes the nearer one; an entry without a card record
    or of another architecture is never borrowed."""
    p = tmp_path / "linear_H=2048_T=32.json"
    data = json.loads(p.read_text())
    data[H100.name] = {"qkv": {"BLOCK_N": 111}, "_meta": {"card": H100.meta()}}
    data["NVIDIA A100-SXM4-80GB"] = {"qkv": {"BLOCK_N": 80}, "_meta": {"card": A100.meta()}}
    data["NVIDIA mystery"] = {"qkv": {"BLOCK_N": 7}}
    p.write_text(json.dumps(data))
    assert C.nearest_cards(data, H100_PCIE) == [H100.name, "NVIDIA H200"]
    card(H100_PCIE)
    assert C.load_config("linear", "qkv", {}, H=2048, T=32)["BLOCK_N"] == 111
    assert C.nearest_cards(data, C.Card("NVIDIA A100 80GB PCIe", (8, 0), 108, 1935.0)) == [A100.name]


def test_a_card_of_another_architecture_falls_back_to_defaults_and_says_so(card, capsys):
    rtx = card(C.Card("NVIDIA GeForce RTX 5090", (12, 0), 170, 1792.0, 34.0))
    default = {"BLOCK_M": 16, "BLOCK_N": 32}
    assert C.load_config("dense", "down", default, N=5120, H=2048, T=32) == default
    rep = C.tiles_report()
    assert rep["status"] == "default" and rep["arch"] == "sm_120"
    assert rep["summary"] == f"built-in default tiles: no tuned entry for {rtx.name} (sm_120)"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "sm_120" in err and C.TUNE_COMMAND in err


def test_cpu_reads_no_file_and_prints_nothing(card, capsys):
    card(None)
    assert C.load_config("moe", "down", {"BLOCK_M": 16}, E=257, N=512, H=2048, T=32) == {"BLOCK_M": 16}
    assert C.tiles_report()["summary"] == "no GPU tiles (CPU)" and capsys.readouterr().err == ""


def test_save_config_records_the_card(card, tmp_path):
    card(H100)
    path = C.save_config("dense", {"down": {"BLOCK_N": 64}}, extra={"source": "test"}, N=5120, H=2048, T=32)
    entry = json.loads(path.read_text())[H100.name]
    assert entry["down"] == {"BLOCK_N": 64} and entry["_meta"]["source"] == "test"
    assert C.Card.from_meta(H100.name, entry["_meta"]["card"]) == H100
    assert "NVIDIA H200" in json.loads(path.read_text())  # other cards' entries kept
    card(None)
    with pytest.raises(RuntimeError, match="no CUDA card"):
        C.save_config("dense", {}, N=5120, H=2048, T=32)


def test_speed_caption_names_the_tiles_that_ran():
    from repro.tables.speed import tiles_sentence

    assert tiles_sentence([]) == ""
    s = tiles_sentence(["tiles tuned on NVIDIA H200, used on NVIDIA H100 80GB HBM3"])
    assert s == " Kernel tiles: tuned on NVIDIA H200, used on NVIDIA H100 80GB HBM3."


def test_a_kernel_no_entry_has_keeps_its_defaults_silently(card, capsys):
    """A kernel no card's entry has is not a fallback: defaults, no line (the H100 printed 'no kernel tiles tuned'
    while running its own tiles, for the batched file's optional ``attn`` entry when no card had one). Every tuned
    card has its own batched ``attn`` entry now, so none borrows another's."""
    h200 = card(C.Card("NVIDIA H200", (9, 0), 132, 4800.0, 150.0))
    assert C.load_config("batched", "attn_not_in_any_entry", {"x": 1}, E=257, N=512, H=2048, T=32) == {"x": 1}
    batched = _shipped("batched", E=257, N=512, H=2048, T=32)
    for name, entry in batched.items():
        if isinstance(entry, dict) and "_meta" in entry:
            assert "attn" in entry, name
    assert C.load_config("batched", "attn", {}, E=257, N=512, H=2048, T=32) == batched[h200.name]["attn"]
    assert capsys.readouterr().err == ""
