"""The tuner's candidate selection (kernels/tune.py) without a GPU: timings are injected."""
import pytest

pytest.importorskip("triton")

from repro.engine.kernels import tune  # noqa: E402


def test_best_of_picks_the_fastest_candidate_and_skips_failures(monkeypatch):
    times = {16: 2.0, 32: 1.0, 64: None, 128: 3.0}  # by BLOCK_N; None: does not compile

    def fake_time(fn):
        ms = fn()
        if ms is None:
            raise RuntimeError("out of shared memory")
        return ms

    monkeypatch.setattr(tune, "graph_time_ms", fake_time)
    cands = [(16, n, 64, 4, 3) for n in times]
    rows = []
    ms, cfg = tune._best_of(cands, lambda c: f"k {c}", lambda cfg: (lambda: times[cfg["BLOCK_N"]]), 2e6, rows)
    assert (ms, cfg["BLOCK_N"]) == (1.0, 32) and cfg["num_stages"] == 3
    assert [r[1] for r in rows] == [2.0, 1.0, None, 3.0]
    assert rows[1][2] == "2 GB/s" and rows[2][2].startswith("RuntimeError")
    with pytest.raises(RuntimeError, match="no tile candidate ran"):
        tune._best_of(cands[2:3], lambda c: f"k {c}", lambda cfg: (lambda: None), 1.0, [])


# --- the batched round's tiles by slot count (repro/engine/bench/tune_batched.py), timings injected -------------

from repro.engine.bench import tune_batched as TB  # noqa: E402
from repro.engine.kernels.fastpath_batch import for_slots  # noqa: E402


def _times(table):
    """{candidate index: {S: ms}} -> the list unit_times returns."""
    return [table[j] for j in range(len(table))]


def test_choose_per_slot_keeps_the_previous_tile_within_the_hysteresis():
    times = _times({0: {1: 1.00, 8: 5.00, 32: 20.0}, 1: {1: 1.50, 8: 4.95, 32: 15.0}, 2: {1: 9.0, 8: 9.0}})
    # S=8: candidate 1 is 1 % faster than keeping 0 (within 2 %): keep 0; S=32: 25 % faster: switch
    assert TB.choose_per_slot(times, (1, 8, 32)) == [(1, 0), (8, 0), (32, 1)]
    with pytest.raises(RuntimeError, match="S=64"):
        TB.choose_per_slot(times, (1, 64))


def test_choose_writes_base_and_whole_steps_that_for_slots_reads_back():
    cands = [(TB._t(16, 32, 128, 4, 4), TB._t(16, 64, 64, 2, 4)), (TB._t(64, 64, 64, 4, 4), TB._t(64, 128, 64, 4, 3, 1))]
    times = _times({0: {1: 1.0, 8: 10.0, 32: 40.0}, 1: {1: 2.0, 8: 6.0, 32: 20.0}})
    out = TB.choose("moe", cands, times, (1, 8, 32))
    assert set(out) == {"moe_gate_up", "moe_down"}
    for side, name in enumerate(("moe_gate_up", "moe_down")):
        assert for_slots(out[name], 1) == cands[0][side]
        assert for_slots(out[name], 4) == cands[0][side]
        want = {**cands[1][side], "TMA": cands[1][side].get("TMA", 0)}  # TMA written out: no base key leaks in
        assert for_slots(out[name], 8) == want and for_slots(out[name], 32) == want
    assert out["moe_gate_up"]["by_slots"] == {"8": {**cands[1][0], "TMA": 0}}


def test_choose_w4_keeps_one_group_and_steps_only_block_m_and_stages():
    cands = TB.W4[:8]  # two groups (BLOCK_N/BLOCK_K/warps), each at BLOCK_M 16 / 32 and 3 / 4 stages
    ms = {}
    for j, (gu, _) in enumerate(cands):
        group_a = gu["BLOCK_N"] == 64
        # group A: fastest at S=1 (BLOCK_M 16, 3 stages) and at S=32 (BLOCK_M 32, 4 stages); group B wins only S=8
        ms[j] = {1: (1.0 if (gu["BLOCK_M"], gu["num_stages"]) == (16, 3) else 1.2) if group_a else 1.1,
                 8: 2.0 if group_a else 1.5,
                 32: ((3.0 if (gu["BLOCK_M"], gu["num_stages"]) == (32, 4) else 4.0) if group_a else 3.5)}
    out = TB.choose("w4", cands, _times(ms), (1, 8, 32))
    gu = out["moe_w4_gate_up"]
    assert (gu["BLOCK_N"], gu["BLOCK_M"], gu["num_stages"]) == (64, 16, 3)
    assert gu["by_slots"] == {"32": {"BLOCK_M": 32, "num_stages": 4}}
    got = for_slots(gu, 32, w4=True)
    assert (got["BLOCK_M"], got["num_stages"], got["BLOCK_N"]) == (32, 4, 64)
    assert for_slots(out["moe_w4_down"], 32, w4=True)["BLOCK_N"] == 128


def test_choose_router_takes_the_least_sum_over_slots_and_sets_of_the_cycle():
    times = _times({0: {1: 1.0, 32: 5.0}, 1: {1: 2.0, 32: 3.0}, 2: {1: 0.5}})  # 2 did not run at S=32
    out = TB.choose("router", TB.ROUTER[:3], times, (1, 32))
    assert out == {"moe_router": TB.ROUTER[1][0], "moe_route": {"num_warps": TB.ROUTER[1][1]}}
    cands = TB.candidates("bf16", quick=True)
    assert all(len(v) == TB.QUICK for v in cands.values())
    cfg = TB.set_configs(cands, 5)  # set 5 takes candidate 5 % 4 = 1 of each unit
    assert cfg["linear"]["qkv"] == TB.LINEAR[1] and cfg["moe"]["down"] == TB.MOE[1][1]
    assert cfg["moe"]["route"] == {"num_warps": TB.ROUTER[1][1]} and cfg["attn"] == TB.ATTN[1]
    attn = TB.choose("attn", TB.ATTN[:3], _times({0: {1: 1.0, 32: 9.0}, 1: {1: 2.0, 32: 5.0}, 2: {1: 0.1}}), (1, 32))
    assert attn == {"attn": TB.ATTN[1]}  # one setting for every S; a candidate that missed an S is not chosen
    assert TB.set_configs(TB.candidates("nvfp4-w4a16", quick=True), 0) == {"moe": dict(zip(("gate_up", "down"), TB.W4[0]))}


def test_unit_times_take_each_candidate_from_the_sets_that_ran_it():
    cands = {"qkv": [1, 2], "moe": [1, 2, 3]}
    bd = lambda q, g, d: {"qkv": q, "gate_up": g, "down": d}  # noqa: E731
    sets = [{1: bd(1.0, 1.0, 1.0)}, {1: bd(2.0, 2.0, 2.0)}, {"error": "x"}, {1: bd(0.5, 3.0, 3.0)}]
    assert TB.unit_times("qkv", cands, sets, (1,)) == [{1: 1.0}, {1: 0.5}]
    assert TB.unit_times("moe", cands, sets, (1,)) == [{1: 2.0}, {1: 4.0}, {}]


# --- the round check: the per-unit choice against other cards' entries, as whole rounds ---------------------------

import json  # noqa: E402

import repro.engine.kernels.configs as C  # noqa: E402

H100 = C.Card("NVIDIA H100 80GB HBM3", (9, 0), 132, 3352.3, 85.0)
BATCHED = dict(E=257, N=512, H=2048, T=32)
ATTN_FILE = dict(NQ=16, NKV=4, D=128, T=32)


def _per_unit_choice(h200: dict) -> dict:
    """A per-unit choice as the H100's quick tune made it: the H200's GEMM tiles, a 16-row batched attention tile."""
    tuned = {k: v for k, v in h200.items() if k in TB.unit_keys("bf16")}
    tuned["attn"] = dict(BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=2)
    return tuned


def test_seed_entries_from_the_shipped_files_take_a_cards_attention_from_its_attn_file():
    batched = json.loads(C.config_path("batched", **BATCHED).read_text())
    attn = json.loads(C.config_path("attn", **ATTN_FILE).read_text())
    h200 = batched["NVIDIA H200"]
    # the H100 entry as it shipped before its tuner ran: the H200's copied, from before the batched file had attn
    batched[H100.name] = {k: v for k, v in h200.items() if k != "attn"}
    attn[H100.name] = dict(attn["NVIDIA H200"])
    tuned = _per_unit_choice(h200)
    keys = TB.unit_keys("bf16")
    assert "attn" in keys and "moe_router" in keys and "moe_w4_gate_up" not in keys
    assert TB.unit_keys("nvfp4-w4a16") == ("moe_w4_gate_up", "moe_w4_down")
    cands = TB.seed_entries(tuned, keys, batched, attn, H100.name, ["NVIDIA H200"])
    # the H100's shipped entry is the H200's, so the H200's seed is the same entry and is left out
    assert list(cands) == ["tuned", "previous"]
    assert cands["tuned"]["attn"]["BLOCK_M"] == 16
    split = attn["NVIDIA H200"]["split"]
    assert cands["previous"]["attn"] == {k: split[k] for k in TB.ATTN_KEYS} and split["BLOCK_M"] == 64
    assert cands["previous"]["qkv"] == h200["qkv"] and set(cands["previous"]) == set(cands["tuned"])
    # a card with no previous entry gets the H200's as a seed; 4-bit keys only for the 4-bit check
    no_h100 = {k: v for k, v in batched.items() if k != H100.name}
    cands = TB.seed_entries(tuned, keys, no_h100, attn, H100.name, ["NVIDIA H200"])
    assert list(cands) == ["tuned", "NVIDIA H200"]
    w4 = TB.seed_entries({k: h200[k] for k in TB.unit_keys("nvfp4-w4a16")}, TB.unit_keys("nvfp4-w4a16"), no_h100,
                         attn, H100.name, ["NVIDIA H200"])
    assert list(w4) == ["tuned"]  # the same tiles as the H200's: one candidate


def test_pick_by_rounds_needs_a_gain_beyond_the_hysteresis_at_every_slot_count():
    tuned = {1: 4.50, 8: 8.90, 32: 14.97}
    assert TB.pick_by_rounds({"tuned": tuned, "NVIDIA H200": {1: 4.52, 8: 8.84, 32: 13.77}}) == "NVIDIA H200"
    assert TB.pick_by_rounds({"tuned": tuned, "NVIDIA H200": {1: 4.45, 8: 8.85, 32: 14.90}}) == "tuned"  # < 2 %
    # faster at 32 slots but much slower at one: the mean relative time decides
    assert TB.pick_by_rounds({"tuned": tuned, "x": {1: 6.0, 8: 8.9, 32: 13.5}}) == "tuned"
    # a seed that did not run, or ran only some slot counts, is out
    assert TB.pick_by_rounds({"tuned": tuned, "x": {}, "y": {32: 1.0}}) == "tuned"
    with pytest.raises(RuntimeError, match="did not run"):
        TB.pick_by_rounds({"tuned": {}, "x": tuned})


def test_round_check_times_each_seed_as_this_cards_entry_and_leaves_the_file_with_the_choice(monkeypatch, tmp_path):
    """bench_slots is replaced by a fake that reads the file the way BatchedBlockForward does (the card's entry):
    a 64-row attention tile runs 32 slots 8 % faster. The check must time the H200's seed under the H100's name,
    pick it, and leave the file holding the per-unit choice for the caller to overwrite."""
    from repro.engine.bench import common, graph_round

    for p in C.CONFIG_DIR.glob("*.json"):
        (tmp_path / p.name).write_text(p.read_text())
    monkeypatch.setattr(C, "CONFIG_DIR", tmp_path)
    monkeypatch.setattr(C, "_warned", set())
    monkeypatch.setattr(C, "current_card", lambda device=None: H100)
    path = C.config_path("batched", **BATCHED)
    data = json.loads(path.read_text())
    h200 = data["NVIDIA H200"]
    del data[H100.name]  # a card tuned for the first time
    path.write_text(json.dumps(data))
    seen = []

    def fake_bench(slots, *a, **kw):
        entry = json.loads(path.read_text())[H100.name]
        seen.append(entry["attn"]["BLOCK_M"])
        f = 0.92 if entry["attn"]["BLOCK_M"] == 64 else 1.0
        return {"rounds": [{"slots": S, "ms": (4.5 if S == 1 else 15.0 * f)} for S in slots]}

    monkeypatch.setattr(graph_round, "bench_slots", fake_bench)
    monkeypatch.setattr(graph_round, "_model", lambda *a: None)
    monkeypatch.setattr(common, "copy_bandwidth", lambda: 3000.0)
    win, rec = TB.round_check(_per_unit_choice(h200), (1, 32), "bf16", log=lambda m: None)
    assert seen == [16, 64] and rec["chosen"] == "NVIDIA H200"
    assert win["attn"]["BLOCK_M"] == 64 and win["qkv"] == h200["qkv"]
    assert rec["ms"]["NVIDIA H200"] == {"1": 4.5, "32": 13.8}
    assert json.loads(path.read_text())[H100.name]["attn"]["BLOCK_M"] == 16  # the choice, until the caller saves
