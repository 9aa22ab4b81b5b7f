"""Problem loading and normalization on the real benchmark files, the shipped problems, and bad input."""

import json

import pytest

from repro import benchmarks
from repro.data import DataError, load_problems, spec
from repro.data.prepare import main as prepare_main


@pytest.mark.parametrize("bench,total,first_id", [("gsm8k", 1319, "gsm8k/0"), ("math500", 500, "test/precalculus/807.json"),
                                                   ("humaneval", 164, "HumanEval/0"), ("mbpp", 500, "mbpp/11")])
def test_real_files_normalize_with_published_hash(data_dir, bench, total, first_id):
    lp = load_problems(bench, data_dir)
    assert lp.total == total and len(lp.problems) == total and lp.source == "data_dir"
    assert lp.sha256 == spec(bench).published_sha256 and not lp.notes
    assert lp.problems[0]["id"] == first_id
    assert len({p["id"] for p in lp.problems}) == total


def test_gold_fields(data_dir):
    g = load_problems("gsm8k", data_dir, limit=1).problems[0]
    assert g["gold"] == "18" and g["source"]["question"].startswith("Janet")
    m = load_problems("mbpp", data_dir).problems
    assert [p["source"]["task_id"] for p in (m[0], m[-1])] == [11, 510]
    assert load_problems("math500", data_dir, limit=1).problems[0]["gold"] == r"\left( 3, \frac{\pi}{2} \right)"


def test_limit_takes_the_first_n(data_dir):
    lp = load_problems("humaneval", data_dir, limit=3)
    assert [p["id"] for p in lp.problems] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"] and lp.total == 164


@pytest.mark.parametrize("bench", benchmarks.names())
def test_shipped_problems_when_offline(bench, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    lp = load_problems(bench, None)
    assert lp.source == "builtin" and len(lp.problems) >= 4
    assert any("shipped problems" in n for n in lp.notes)


def test_missing_file_in_data_dir_names_it(tmp_path):
    with pytest.raises(DataError, match=r"math500\.jsonl: missing"):
        load_problems("math500", tmp_path)


def test_bad_record_names_field(tmp_path):
    (tmp_path / "gsm8k.jsonl").write_text(json.dumps({"question": "q"}) + "\n")
    with pytest.raises(DataError, match="line 1 lacks field.*answer"):
        load_problems("gsm8k", tmp_path)


def test_altered_file_is_flagged(tmp_path, data_dir):
    lines = (data_dir / "gsm8k.jsonl").read_text().splitlines()[:10]
    (tmp_path / "gsm8k.jsonl").write_text("\n".join(lines) + "\n")
    lp = load_problems("gsm8k", tmp_path)
    assert any("not comparable" in n for n in lp.notes)


def test_prepare_cli_writes_problems_and_meta(tmp_path, data_dir, capsys):
    out = tmp_path / "p" / "mbpp.jsonl"
    assert prepare_main(["--benchmark", "mbpp", "--out", str(out), "--data-dir", str(data_dir), "--limit", "4"]) == 0
    rows = [json.loads(l) for l in out.read_text().splitlines()]
    meta = json.loads((tmp_path / "p" / "mbpp.jsonl.meta.json").read_text())
    assert len(rows) == 4 and meta["source"] == "data_dir" and meta["kept"] == 4 and meta["total"] == 500
    assert "from data_dir" in capsys.readouterr().out


def test_hub_path_through_datasets(monkeypatch, data_dir):
    """The hub source calls datasets.load_dataset with the benchmark's repo/config/split (no network here:
    the call is answered from the real file) and records a hash of what it got."""
    import sys
    import types

    import repro.data as d

    calls = []

    def load_dataset(path, name=None, split=None, revision=None):
        calls.append((path, name, split, revision))
        return [json.loads(l) for l in (data_dir / "mbpp.jsonl").read_text().splitlines()]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    monkeypatch.setattr(d, "hub_reachable", lambda timeout_s=3.0: True)
    for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "ORL_EVAL_NO_HUB"):
        monkeypatch.delenv(k, raising=False)
    lp = load_problems("mbpp", None, limit=2)
    assert calls == [("google-research-datasets/mbpp", "full", "test", None)]
    assert lp.source == "hub" and lp.total == 500 and [p["id"] for p in lp.problems] == ["mbpp/11", "mbpp/12"]
    assert len(lp.sha256) == 64
    # no pinned revision: said in the notes (printed by prepare) and in the location
    assert lp.location.endswith("@unpinned") and any("no pinned revision" in n for n in lp.notes)
    # a pinned revision in the declaration is passed to the hub loader and recorded
    import dataclasses

    pinned = dataclasses.replace(spec("mbpp"), hub_revision="0123abcd" * 5)
    monkeypatch.setattr(d, "spec", lambda b: pinned)
    lp = load_problems("mbpp", None, limit=1)
    assert calls[-1] == ("google-research-datasets/mbpp", "full", "test", "0123abcd" * 5)
    assert lp.location.endswith("@" + "0123abcd" * 5) and not any("pinned" in n for n in lp.notes)


@pytest.mark.parametrize("bench,total", [("gsm8k", 1319), ("math500", 500), ("humaneval", 164), ("mbpp", 500)])
def test_start_up_check_reads_the_real_files(data_dir, bench, total):
    from repro.data import check_file

    assert check_file(bench, data_dir / spec(bench).file) == total


@pytest.mark.parametrize("content, says", [
    ("", "holds no problems"),
    ("\n\n", "holds no problems"),
    ('{"question": "cut short\n', ":1: line 1 is cut off mid-record (file truncated?)"),
    ('{"question": "q", "answer": "#### 4"}\n{"question": "cut\n{"question": "q", "answer": "#### 4"}\n',
     ":2: line 2 is cut off mid-record (the line ends before its JSON object does)"),
    ('{"question": "q"} x\n', ":1: not valid JSON (Extra data"),
    ('[1, 2]\n', ":1: expected a JSON object"),
    (b"\xff\xfe not utf-8\n", "cannot be read (UnicodeDecodeError"),
])
def test_start_up_check_names_a_broken_file(tmp_path, data_dir, content, says):
    """One DataError naming the file (and line) for every kind of broken file a prepare job would fail on."""
    from repro.data import check_file

    f = tmp_path / "gsm8k.jsonl"
    f.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(DataError) as e:
        check_file("gsm8k", f)
    assert str(e.value).startswith(str(f)) and says in str(e.value), str(e.value)
    # a real record without the benchmark's answer field: the field is named
    real = json.loads((data_dir / "gsm8k.jsonl").read_text().split("\n", 1)[0])
    f.write_text(json.dumps({"question": real["question"]}) + "\n")
    with pytest.raises(DataError, match=r"line 1 lacks field\(s\) answer"):
        check_file("gsm8k", f)
    # a value the benchmark cannot read (a GSM8K answer without its "#### <number>" line; a number): named, no traceback
    for answer in ("no final answer line", 42):
        f.write_text(json.dumps(real) + "\n" + json.dumps({"question": "q", "answer": answer}) + "\n")
        with pytest.raises(DataError, match=r"line 2: not a gsm8k record as published \((ValueError|TypeError)"):
            check_file("gsm8k", f)
    with pytest.raises(DataError, match="missing"):
        check_file("gsm8k", tmp_path / "nothing.jsonl")


def test_data_dir_origin_names_where_the_path_came_from(tmp_path):
    from repro.config import data_dir_origin

    fix_cfg = "data_dir (in config.yaml, an overlay or --config)"
    none = data_dir_origin({}, environ={})
    assert (none.source, none.fix, none.env_unused) == (None, fix_cfg, None)
    env = data_dir_origin({}, environ={"ORL_EVAL_DATA": "/d"})
    assert (env.source, env.fix, env.env_unused) == ("$ORL_EVAL_DATA", "ORL_EVAL_DATA", None)
    cfg = data_dir_origin({"data_dir": "/c"}, environ={})
    assert (cfg.source, cfg.fix, cfg.env_unused) == ("data_dir in the config", fix_cfg, None)
    both = data_dir_origin({"data_dir": "/c"}, environ={"ORL_EVAL_DATA": "/d"})
    assert both.source == "data_dir in the config, which wins over $ORL_EVAL_DATA=/d"
    assert (both.fix, both.env_unused) == (fix_cfg, "/d")
    # the same folder in both places, spelled differently: nothing is left unused
    (tmp_path / "data").mkdir()
    same = data_dir_origin({"data_dir": str(tmp_path / "data")}, environ={"ORL_EVAL_DATA": f"{tmp_path}/./data/"})
    assert same.env_unused is None
