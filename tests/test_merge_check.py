"""The merge records the merged file's sha256, and every reader of a merged file (scoring, tables, compare)
refuses one edited since; a replayed cell's generation file (no merge record) is read as before."""

import json
from pathlib import Path

import pytest

from repro.backends.merge import MergedFileChanged, check_merged, merge
from repro.provenance import sha256_path
from repro.scoring.__main__ import main as score_main
from repro.tables.aggregate import cell_tpf


def _jsonl(path: Path, recs: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def _shards(tmp_path, data_dir, records_sha256: bool):
    """Two shards of three real GSM8K problems; their metas record records_sha256 (as generation jobs write it)
    or not (older jobs)."""
    probs = [json.loads(line) for line in (data_dir / "gsm8k.jsonl").read_text().splitlines()[:3]]
    problems = _jsonl(tmp_path / "problems.jsonl", [{"id": f"gsm8k/{i}", "source": p} for i, p in enumerate(probs)])
    recs = [{"id": f"gsm8k/{i}", "benchmark": "gsm8k", "completion": f"So the answer is {i}.",
             "generated_tokens": 8, "forwards": {"prefill": 1, "denoise": 4, "commit": 1}} for i in range(3)]
    shards = [_jsonl(tmp_path / "shard0of2.jsonl", recs[0::2]), _jsonl(tmp_path / "shard1of2.jsonl", recs[1::2])]
    for s in shards:
        meta = {"shard": s.name, **({"records_sha256": sha256_path(s)} if records_sha256 else {})}
        Path(str(s) + ".meta.json").write_text(json.dumps(meta))
    return problems, shards


@pytest.fixture
def merged(tmp_path, data_dir):
    problems, shards = _shards(tmp_path, data_dir, records_sha256=False)
    out = tmp_path / "seed12345.jsonl"
    merge(problems, shards, out)
    return problems, out


def test_merge_records_its_sha256_and_an_edit_is_refused_by_every_reader(merged, tmp_path, capsys):
    problems, out = merged
    meta = json.loads(Path(str(out) + ".meta.json").read_text())
    assert meta["sha256"] == sha256_path(out) and [m["shard"] for m in meta["shards"]] == ["shard0of2.jsonl",
                                                                                          "shard1of2.jsonl"]
    check_merged(out)  # unchanged: accepted
    assert cell_tpf(out) == (24 / 15, 24, 15)

    out.write_text(out.read_text().replace("answer is 1.", "answer is 18."))
    with pytest.raises(MergedFileChanged, match="delete it to merge again from the shards"):
        check_merged(out)
    with pytest.raises(MergedFileChanged):
        cell_tpf(out)
    rc = score_main(["score", "--benchmark", "gsm8k", "--problems", str(problems), "--generations", str(out),
                     "--out", str(tmp_path / "s.jsonl"), "--summary", str(tmp_path / "s.summary.json")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and str(out) in err and "delete it" in err
    assert not (tmp_path / "s.jsonl").exists()


def test_compare_refuses_an_edited_merged_file(merged, tmp_path):
    from repro import paths
    from repro.tables.compare import CompareError, Run, _cell

    _, out = merged
    g = tmp_path / "w" / paths.GENERATIONS.format(suite="s", model="m", bench="gsm8k", seed=12345)
    g.parent.mkdir(parents=True)
    g.write_text(out.read_text().replace("answer is 2.", "answer is 3."))
    Path(str(g) + ".meta.json").write_text(Path(str(out) + ".meta.json").read_text())
    with pytest.raises(CompareError, match=f"{g}: changed since repro.backends.merge wrote it"):
        _cell(Run("s/m", tmp_path / "w", "s", "m", 12345), "gsm8k", 12345)


def test_generation_files_without_a_merge_record_are_not_checked(tmp_path):
    replayed = _jsonl(tmp_path / "seed1.jsonl", [{"id": "gsm8k/0", "completion": "x"}])
    Path(str(replayed) + ".meta.json").write_text(json.dumps({"samples_sha256": "0" * 64, "note": "by hand"}))
    check_merged(replayed)  # a replay's meta names its samples file, not a merge
    old = _jsonl(tmp_path / "seed2.jsonl", [{"id": "gsm8k/0", "completion": "x"}])
    Path(str(old) + ".meta.json").write_text(json.dumps({"shards": []}))
    check_merged(old)  # merged before the sha256 was recorded: nothing to compare with
    check_merged(tmp_path / "absent.jsonl")


def test_a_shard_without_its_meta_is_refused_by_the_merge(merged, tmp_path):
    """A shard whose .meta.json was deleted: the merge stops naming it and the fix (its provenance would be
    unknown in every table cell built from it), and writes nothing."""
    problems, _ = merged
    shards = [tmp_path / "shard0of2.jsonl", tmp_path / "shard1of2.jsonl"]
    Path(f"{shards[1]}.meta.json").unlink()
    out = tmp_path / "again.jsonl"
    with pytest.raises(ValueError, match=r"shard1of2\.jsonl\.meta\.json: missing.*delete .*shard1of2\.jsonl"):
        merge(problems, shards, out)
    assert not out.exists() and not Path(f"{out}.meta.json").exists()


@pytest.mark.parametrize("damage", ["edit", "garbage", "truncate"])
def test_a_shard_changed_since_its_job_wrote_it_is_refused_by_the_merge(tmp_path, data_dir, capsys, damage):
    from repro.backends.merge import main as merge_main

    problems, shards = _shards(tmp_path, data_dir, records_sha256=True)
    out = tmp_path / "seed12345.jsonl"
    assert merge_main(["--problems", str(problems), "--out", str(out), *map(str, shards)]) == 0
    out.unlink()
    text = shards[1].read_text()
    shards[1].write_text({"edit": text.replace("answer is 1.", "answer is 75."), "garbage": text + "garbage\n",
                          "truncate": text[: len(text) // 2]}[damage])
    rc = merge_main(["--problems", str(problems), "--out", str(out), *map(str, shards)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and not out.exists()
    assert f"{shards[1]}: changed since its generation job wrote it" in err
    assert f"delete {shards[1]} and {shards[1]}.meta.json" in err


def test_a_line_that_is_no_record_is_named_when_the_meta_has_no_sha(merged, tmp_path, capsys):
    from repro.backends.merge import main as merge_main

    problems, out = merged  # these shards' metas record no records_sha256 (older jobs)
    shard = tmp_path / "shard1of2.jsonl"
    shard.write_text(shard.read_text() + "garbage\n")
    rc = merge_main(["--problems", str(problems), "--out", str(out), str(tmp_path / "shard0of2.jsonl"), str(shard)])
    err = capsys.readouterr().err
    assert rc == 2 and f"{shard}, line 2: not a generation record" in err and "delete" in err
