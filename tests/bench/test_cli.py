"""The GPU micro-benchmark CLIs (``python -m repro.engine.bench route | slot-attention | graph-round``) share one
argument / CUDA / JSON plumbing (repro/engine/bench/cli.py); on the CPU their parsing, errors and JSON tail are checked with the
timed parts replaced."""

import json

import pytest
import torch

import repro.engine.bench.attention as AT
import repro.engine.bench.cli as C
import repro.engine.bench.graph_round as G
import repro.engine.bench.route as R
import repro.engine.bench.slot_attention as SA


def _exit_code(fn, *a):
    with pytest.raises(SystemExit) as e:
        fn(*a)
    return e.value.code


@pytest.mark.parametrize("main,argv,words", [
    (R.main, ["--rows", "32,x"], ["--rows '32,x'", "comma-separated integers", "32,256,1024"]),
    (R.main, ["--rows", "32,33"], ["--rows '32,33'", "multiple of 32"]),
    (SA.main, ["--slots", "1;8"], ["--slots '1;8'", "1,8,32"]),
    (G.main, ["--slots", "eight"], ["--slots 'eight'", "1,8,32"]),
    (AT.main, ["--prefixes", "1k"], ["--prefixes '1k'", "0,1024,4096"]),
])
def test_bad_list_named_before_the_cuda_check(main, argv, words, capsys):
    assert _exit_code(main, argv) == 2
    err = capsys.readouterr().err
    assert all(w in err for w in words), err


@pytest.mark.parametrize("main", [R.main, SA.main, G.main, AT.main])
def test_no_cuda_prints_the_error_json(main, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _exit_code(main, []) == 2
    assert json.loads(capsys.readouterr().out.splitlines()[-1]) == {"error": "CUDA not available"}


def test_read_json_object_errors(tmp_path, capsys):
    import argparse

    ap = argparse.ArgumentParser(prog="b")
    good = tmp_path / "good.json"
    good.write_text('{"a": {"moe": {}}}')
    assert C.read_json_object(ap, "--sweep", str(good), "{name: configs}") == {"a": {"moe": {}}}
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "bad.json").write_text("{not json")
    for name, words in [("list.json", "got list"), ("bad.json", "Expecting property name"),
                        ("missing.json", "No such file")]:
        assert _exit_code(C.read_json_object, ap, "--sweep", str(tmp_path / name), "{name: configs}") == 2
        err = capsys.readouterr().err
        assert f"--sweep {tmp_path / name}" in err and words in err and "{name: configs}" in err, err


def _fake_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


def test_slot_attention_json_tail(tmp_path, monkeypatch, capsys):
    """Last stdout line = the document = the ``--json`` file; the table and progress go to stderr."""
    _fake_cuda(monkeypatch)
    seen = {}

    def fake_bench(slots, prefix, layers, iters, log):
        seen.update(slots=slots, prefix=prefix, layers=layers, iters=iters)
        log("progress line")
        return {"rows": [{"slots": S, "variant": "attn_split", "us_per_layer": 2.0 * S, "floor_us": 1.0}
                         for S in slots], "checks": {"S=8 split==whole": True}}

    monkeypatch.setattr(SA, "bench", fake_bench)
    out = tmp_path / "sa.json"
    assert SA.main(["--slots", "1,8", "--prefix", "64", "--json", str(out)]) == 0
    cap = capsys.readouterr()
    doc = json.loads(cap.out.splitlines()[-1])
    assert seen == {"slots": [1, 8], "prefix": 64, "layers": 20, "iters": 50}
    assert json.loads(out.read_text()) == doc and doc["rows"][1]["us_per_layer"] == 16.0
    assert "progress line" in cap.err and "| attn_split | 2.0 (1.0) | 16.0 (1.0) |" in cap.err


def test_route_reads_sets_and_keeps_the_table(tmp_path, monkeypatch, capsys):
    _fake_cuda(monkeypatch)
    sets = {"mine": {"mode": "batched", "tiles": "fused", "module": "after", "configs": {}}}
    f = tmp_path / "sets.json"
    f.write_text(json.dumps(sets))
    got = {}

    def fake_bench(sets_, rows, layers, iters, before, log, json_path=None):
        got.update(sets=sets_, rows=rows, json_path=json_path)
        return {"results": [{"set": "mine", "R": 32, "error": "x"}]}

    monkeypatch.setattr(R, "bench", fake_bench)
    assert R.main(["--rows", "32", "--sets", str(f), "--json", str(tmp_path / "r.json")]) == 0
    doc = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert got == {"sets": sets, "rows": [32], "json_path": str(tmp_path / "r.json")}
    assert doc["table"].splitlines()[2].startswith("| mine | err |")
    assert json.loads((tmp_path / "r.json").read_text()) == doc
    assert R.main(["--rows", "32"]) == 0 and got["sets"] is R.DEFAULT_SETS
    assert R.main(["--rows", "32", "--sets", "fused"]) == 0 and got["sets"] is R.FUSED_SETS
    for name, spec in R.FUSED_SETS.items():  # every fused set is compared with a two-kernel set of the same tiles
        if spec.get("fused"):
            partner = R.FUSED_SETS[spec["compare"]]
            assert not partner.get("fused") and partner["configs"] == spec["configs"], name
    f.write_text("[]")
    assert _exit_code(R.main, ["--sets", str(f)]) == 2
    assert "want a JSON object {name: variant}, got list" in capsys.readouterr().err


def test_attention_reads_sets_and_keeps_the_table(tmp_path, monkeypatch, capsys):
    _fake_cuda(monkeypatch)
    got = {}

    def fake_bench(sets, prefixes, layers, iters, log, json_path=None):
        got.update(sets=sets, prefixes=prefixes, layers=layers)
        return {"rows": [{"variant": "unfused", "prefix": 0, "us_per_layer": 9.0, "rel_err": 0.0, "v_equal": True,
                          "repeat_equal": True, "tickets_zero": None},
                         {"variant": "mine", "prefix": 0, "error": "x"}]}

    monkeypatch.setattr(AT, "bench", fake_bench)
    f = tmp_path / "sets.json"
    f.write_text(json.dumps({"mine": {"BLOCK_M": 32}}))
    assert AT.main(["--prefixes", "0", "--sets", str(f), "--layers", "3"]) == 0
    doc = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert got == {"sets": {"mine": {"BLOCK_M": 32}}, "prefixes": [0], "layers": 3}
    assert "| unfused | 9.00 | True |" in doc["table"] and "| mine | err | None |" in doc["table"]
    assert AT.main([]) == 0 and got["sets"] is AT.FUSED_SETS and got["prefixes"] == [0, 1024, 4096]


def test_graph_round_sweep_file_checked(tmp_path, monkeypatch, capsys):
    _fake_cuda(monkeypatch)
    f = tmp_path / "sweep.json"
    f.write_text('"m64"')
    assert _exit_code(G.main, ["--sweep", str(f)]) == 2
    assert "--sweep" in (err := capsys.readouterr().err) and "got str" in err
    called = []
    monkeypatch.setattr(G, "sweep", lambda sets, slots, *a, **kw: called.append((sets, slots)) or
                        {"table": "T", "sets": {}, "family_tables": {1: "F1", 8: "F8"}})
    f.write_text('{"m64": {}}')
    assert G.main(["--sweep", str(f), "--slots", "1,8"]) == 0
    out, err = capsys.readouterr()
    assert called == [({"m64": {}}, [1, 8])] and json.loads(out.splitlines()[-1])["table"] == "T"
    assert "F1" in err and "F8" in err  # the per-S family tables, then the sets' table


def test_bench_batch_precision_runs_only_the_graph_sections(capsys, tmp_path):
    """``bench batch --precision nvfp4-w4a16`` packs the routed experts for the CUDA-graph sections; asked for an
    eager section too it stops before building anything, naming the sections to drop (it used to time BF16 experts
    under a 4-bit label)."""
    import argparse

    import repro.engine.bench.batch as BB

    built = []
    args = argparse.Namespace(precision="nvfp4-w4a16", sections="batched-graph,throughput,invariance", prefix=1024,
                              batch_tokens=256, invariance_tokens=32, invariance_prompts=32,
                              json=str(tmp_path / "b.json"))
    assert BB.run(args, lambda: {}, lambda: built.append(1)) == 2
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert not built and doc["precision"] == "nvfp4-w4a16"
    assert json.loads((tmp_path / "b.json").read_text()) == doc  # --json gets the refusal too
    assert "drop invariance, throughput from --sections" in doc["error"]
    assert "batched-graph, invariance-graph" in doc["error"]


def test_one_entry_point_dispatches_every_benchmark(monkeypatch, capsys):
    """``python -m repro.engine.bench NAME``: a NAME with a parser of its own gets the rest of the command line (its
    own usage in its errors); the modes share one parser that lists every NAME; an option before a NAME is refused
    with the order to use; without CUDA a mode ends in the error JSON, exit 2."""
    from repro.engine.bench import COMMANDS
    from repro.engine.bench.__main__ import main

    assert _exit_code(main, ["--help"]) == 0
    out = capsys.readouterr().out
    assert "usage: python -m repro.engine.bench" in out
    for name in ("round", "generate", "decode", "all", "batch", *COMMANDS):
        assert name in out, name
    assert _exit_code(main, ["graph-round", "--slots", "eight"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: python -m repro.engine.bench graph-round") and "--slots 'eight'" in err
    assert _exit_code(main, ["--iters", "3", "route"]) == 2
    assert "route: put its name first, python -m repro.engine.bench route [options]" in capsys.readouterr().err
    assert _exit_code(main, ["sute"]) == 2
    assert "invalid choice: 'sute'" in capsys.readouterr().err
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for argv in (["round"], ["batch"], ["w4"]):
        assert main(argv) == 2, argv
        assert json.loads(capsys.readouterr().out.splitlines()[-1])["error"] == "CUDA not available"


def test_the_engine_package_holds_no_benchmark_module():
    """The benchmarks live in repro/engine/bench/, apart from the engine: no ``bench*`` module beside the engine's
    own modules or in its subpackages."""
    from pathlib import Path

    engine = Path(__file__).resolve().parents[2] / "repro" / "engine"
    stray = [p.name for p in engine.glob("bench*.py")] + [p.relative_to(engine).as_posix()
                                                          for p in engine.glob("*/bench*.py")]
    assert stray == [] and (engine / "bench" / "__main__.py").is_file(), stray
