"""A copied or moved work directory sees config and data changes made after the copy (workflow/workdir_records.py).

Snakemake keeps its job records (params, code, input lists) by absolute output path; the records kept inside
the work directory travel with it. Unit tests of the record store on Snakemake's own FilePersistence, then one
end-to-end run (the tiny model, one real GSM8K and one HumanEval problem): in a `cp -a` copy an unchanged config
re-runs no job of the work directory, a decoder setting changed after the copy regenerates every cell's decoder
config and shard, a data file edited after the copy re-prepares and regenerates that benchmark only, a moved
directory regenerates with the new setting, and a copy made without the hidden records folder re-runs its jobs
(their settings are unknown) unless --touch adopts its outputs. A record file that cannot be read re-runs its job."""

import json
import os
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from snakemake.persistence import MetadataRecord
from snakemake.persistence.file import FilePersistence

from _e2e import SMOKE_SUITE, Workflow, job_counts
from repro.config import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "workflow"))
import workdir_records  # noqa: E402


def _store(root: Path, work: Path):
    cls = workdir_records.persistence_class(FilePersistence, workdir_records.Roots({"<work>": str(work)}))
    return cls(nolock=True, path=root / ".snakemake")


def test_records_travel_with_the_directory(tmp_path):
    work = tmp_path / "work"
    (work / "a").mkdir(parents=True)
    out = str(work / "a" / "shard.jsonl")
    rec = MetadataRecord(rule="generate_shard", params=["fp32", "--set max_new_tokens=16"],
                         input=[str(work / "decoder.yaml"), "/elsewhere/data.jsonl"], record_format_version=6,
                         input_checksums={str(work / "decoder.yaml"): "sha256:00"})
    _store(tmp_path / "run1", work)._write_record(out, rec)
    local = work / workdir_records.RECORDS_DIR / "a" / "shard.jsonl.json"
    stored = json.loads(local.read_text())
    assert stored["input"] == ["<work>/decoder.yaml", "/elsewhere/data.jsonl"]  # no absolute work path kept
    # moved, and read by another Snakemake directory (no record of the new path in its own store)
    moved = tmp_path / "moved"
    work.rename(moved)
    got = _store(tmp_path / "run2", moved)._read_record(str(moved / "a" / "shard.jsonl"))
    assert got.params == rec.params and got.rule == "generate_shard"
    assert got.input == [str(moved / "decoder.yaml"), "/elsewhere/data.jsonl"]
    assert got.input_checksums == {str(moved / "decoder.yaml"): "sha256:00"}
    # outside the root: Snakemake's own store only
    store = _store(tmp_path / "run2", moved)
    store._write_record(str(tmp_path / "results.md"), rec)
    assert not list((moved / workdir_records.RECORDS_DIR).glob("*results*"))
    assert store._read_record(str(tmp_path / "results.md")).params == rec.params
    # deleted from both (--cleanup-metadata)
    assert store._delete_record(str(moved / "a" / "shard.jsonl"))
    assert store._read_record(str(moved / "a" / "shard.jsonl")) is None


def test_a_newer_record_in_snakemakes_store_wins(tmp_path):
    """Two writers make the records diverge: a checkout without these records (plain FilePersistence) or another
    worktree sharing the work directory writes Snakemake's store only, and a kill can fall between the store write
    and the directory's. The record whose endtime is the output's mtime is the one read, else the later one: never
    the stale directory record with the store's output (with config A again nothing would re-run and the table would
    show B's cells labelled A)."""
    work = tmp_path / "work"
    out = work / "smoke" / "decoders" / "tiny.yaml"
    out.parent.mkdir(parents=True)
    out.write_text("threshold: 0.9\n")
    os.utime(out, (1_000_000, 1_000_000))

    def record(params):
        return MetadataRecord(rule="render_decoder", params=params, record_format_version=6,
                              endtime=os.stat(out).st_mtime)

    _store(tmp_path, work)._write_record(str(out), record(["A"]))
    out.write_text("threshold: 0.5\n")  # B made by a writer that updates Snakemake's store only
    os.utime(out, (2_000_000, 2_000_000))
    FilePersistence(nolock=True, path=tmp_path / ".snakemake")._write_record(str(out), record(["B"]))
    assert json.loads((work / workdir_records.RECORDS_DIR / "smoke/decoders/tiny.yaml.json").read_text())["params"] \
        == ["A"]
    assert _store(tmp_path, work)._read_record(str(out)).params == ["B"]
    # the directory's record is the current one (the store's is older): it is read
    out.write_text("threshold: 0.7\n")
    os.utime(out, (3_000_000, 3_000_000))
    _store(tmp_path / "other", work)._write_record(str(out), record(["C"]))
    assert _store(tmp_path, work)._read_record(str(out)).params == ["C"]
    # neither matches the output's mtime (touched by hand): the later endtime
    os.utime(out, (4_000_000, 4_000_000))
    assert _store(tmp_path, work)._read_record(str(out)).params == ["C"]
    # a copy: no record of its paths in the store, so the directory's record alone
    copy = tmp_path / "copy"
    shutil.copytree(work, copy)
    assert _store(tmp_path, copy)._read_record(str(copy / "smoke/decoders/tiny.yaml")).params == ["C"]


def test_only_paths_that_start_with_the_root_become_tokens(tmp_path):
    """The root is replaced where a path starts with it, not inside another path (``/nfs<root>/...`` would read back
    as another path at a new place: a spurious re-run in a copy) nor in a longer name (``<root>shop``)."""
    work = tmp_path / "work"
    out = str(work / "smoke" / "decoders" / "tiny.yaml")
    params = [f"--local-path /nfs{work}/models/llada", f"--work={work}/x {work}shop/y", f"'{work}'", str(work)]
    _store(tmp_path / "run1", work)._write_record(out, MetadataRecord(rule="r", params=params, record_format_version=6))
    stored = json.loads((work / workdir_records.RECORDS_DIR / "smoke/decoders/tiny.yaml.json").read_text())
    assert stored["params"] == [f"--local-path /nfs{work}/models/llada", f"--work=<work>/x {work}shop/y", "'<work>'",
                                "<work>"]
    moved = tmp_path / "moved"
    work.rename(moved)
    got = _store(tmp_path / "run2", moved)._read_record(str(moved / "smoke" / "decoders" / "tiny.yaml"))
    assert got.params == [f"--local-path /nfs{work}/models/llada", f"--work={moved}/x {work}shop/y", f"'{moved}'",
                          str(moved)]


def test_a_table_record_keeps_the_work_directory_it_read(tmp_path):
    """Only a record's own root is written as a token: a table (results directory) made from one work directory
    has another input list for a second one, so Snakemake makes it again when the work directory changes."""
    work, results = tmp_path / "work", tmp_path / "results"
    roots = workdir_records.Roots({"<work>": str(work), "<results>": str(results)})
    store = workdir_records.persistence_class(FilePersistence, roots)(nolock=True, path=tmp_path / ".snakemake")
    table = str(results / "smoke" / "main_table.md")
    store._write_record(table, MetadataRecord(rule="write_table", input=[str(work / "s.json"), str(results / "x")],
                                              record_format_version=6))
    stored = json.loads((results / workdir_records.RECORDS_DIR / "smoke" / "main_table.md.json").read_text())
    assert stored["input"] == [str(work / "s.json"), "<results>/x"]


def test_existing_records_are_exported_once(tmp_path):
    work = tmp_path / "work"
    (work / "x").mkdir(parents=True)
    (work / "x" / "f.json").write_text("{}")
    plain = FilePersistence(nolock=True, path=tmp_path / ".snakemake")  # records of a run before the store existed
    long_name = work / ("d" * 200) / "f.json"  # a record name Snakemake cuts into parts
    long_name.parent.mkdir()
    long_name.write_text("{}")
    for f in (work / "x" / "f.json", long_name, tmp_path / "other.json"):
        plain._write_record(str(f), MetadataRecord(rule="r", params=[str(f)], record_format_version=6))
    roots = workdir_records.Roots({"<work>": str(work)})
    assert workdir_records.export_existing(roots, tmp_path / ".snakemake" / "metadata") == 2
    assert json.loads((work / workdir_records.RECORDS_DIR / "x" / "f.json.json").read_text())["params"] == \
        ["<work>/x/f.json"]
    assert workdir_records.export_existing(roots, tmp_path / ".snakemake" / "metadata") == 0  # once


@pytest.mark.slow
def test_config_and_data_changes_after_a_copy_or_move(tmp_path, smoke_run):
    suite = SMOKE_SUITE  # the tiny model, one GSM8K and one HumanEval problem, 8 new tokens
    wf = smoke_run.copy_to(tmp_path)
    wf.run()
    copy = tmp_path / "work-copy"
    shutil.copytree(wf.work, copy, symlinks=True)  # `cp -a`: mtimes kept
    wf.work = copy
    wf.configure(suite)
    work_jobs = {"render_decoder", "prepare_problems", "prepare_generation_problems", "generate_shard",
                 "merge_shards", "score"}
    assert not work_jobs & set(job_counts(wf.run("-n")))  # an unchanged config: nothing of the copy re-runs
    # a decoder setting changed after the copy: every decoder config re-rendered, every shard regenerated
    wf.configure(dict(suite, max_new_tokens=6))
    dry = job_counts(wf.run("-n"))
    assert {k: dry.get(k) for k in work_jobs} == {"render_decoder": 2, "generate_shard": 2, "merge_shards": 2,
                                                  "score": 2, "prepare_problems": None,
                                                  "prepare_generation_problems": None}, dry
    # a question edited after the copy: that benchmark only
    wf.configure(suite)
    gsm = wf.data / "gsm8k.jsonl"
    first, rest = gsm.read_text().split("\n", 1)
    gsm.write_text(json.dumps(dict(json.loads(first), question="What is 2 + 3?")) + "\n" + rest)
    dry = job_counts(wf.run("-n"))
    assert {k: dry.get(k) for k in work_jobs} == {"prepare_problems": 1, "prepare_generation_problems": 1,
                                                  "generate_shard": 1, "merge_shards": 1, "score": 1,
                                                  "render_decoder": None}, dry
    # moved: the new setting is generated (shard meta) and the copy is then up to date
    moved = tmp_path / "work-moved"
    os.rename(copy, moved)
    wf.work = moved
    wf.configure(dict(suite, max_new_tokens=6))
    out = wf.run()
    assert job_counts(out).get("generate_shard") == 2, out[-3000:]
    meta = json.loads((moved / "smoke/generations/tiny/humaneval/seed12345/shard0of1.jsonl.meta.json").read_text())
    assert meta["decoder"]["max_new_tokens"] == 6
    assert "Nothing to be done" in wf.run("-n")
    # copied without the hidden records folder (`cp -r work/* dest`): the settings of its outputs are unknown, so
    # every job runs again (before: nothing did, whatever had changed); --touch adopts them as they are, and a
    # setting changed after that is seen
    glob = tmp_path / "work-glob"
    glob.mkdir()
    for entry in moved.iterdir():
        if not entry.name.startswith("."):
            (shutil.copytree if entry.is_dir() else shutil.copy2)(entry, glob / entry.name, symlinks=True)
    wf.work = glob
    wf.configure(dict(suite, max_new_tokens=6))
    out = wf.run("-n")
    dry = job_counts(out)
    assert {k: dry.get(k) for k in work_jobs} == {"render_decoder": 2, "generate_shard": 2, "merge_shards": 2,
                                                  "score": 2, "prepare_problems": 2,
                                                  "prepare_generation_problems": 2}, dry
    assert f"note: outputs under {glob} have no job record" in out
    wf.run("--touch")
    assert "Nothing to be done" in wf.run("-n")
    wf.configure(dict(suite, max_new_tokens=5))
    dry = job_counts(wf.run("-n"))
    assert (dry.get("render_decoder"), dry.get("generate_shard"), dry.get("prepare_problems")) == (2, 2, None), dry
    # Snakemake's advice for skipping a trigger still works: `--cleanup-metadata FILE` keeps FILE as it is
    wf.run("--cleanup-metadata", str(glob / "smoke/decoders/tiny/gsm8k/seed12345.yaml"))
    dry = job_counts(wf.run("-n"))
    assert (dry.get("render_decoder"), dry.get("generate_shard")) == (1, 1), dry


@pytest.mark.parametrize("damage", ["truncated", "wrong types"])
def test_a_damaged_record_reruns_its_job_in_a_copy(tmp_path, damage, capsys):
    """A record file that cannot be read is not "no record" (Snakemake would then see no change and reuse the output
    whatever changed since the copy): its job runs again, with a note naming the file; never a traceback. Where
    Snakemake's own store still holds the record (the directory was not moved), that one is used."""
    work = tmp_path / "work"
    out = str(work / "smoke" / "decoders" / "tiny.yaml")
    rec = MetadataRecord(rule="render_decoder", params=["--set max_new_tokens=64"], record_format_version=6)
    _store(tmp_path / "run1", work)._write_record(out, rec)
    local = work / workdir_records.RECORDS_DIR / "smoke" / "decoders" / "tiny.yaml.json"
    if damage == "truncated":
        local.write_text(local.read_text()[:40])
    else:
        local.write_text(json.dumps({"rule": "render_decoder", "params": 3, "record_format_version": "x"}))
    # the same place: Snakemake's own record is used
    assert _store(tmp_path / "run1", work)._read_record(out).params == rec.params
    # a copy (no record in this Snakemake directory's store): a record that differs from any job's settings
    copy = tmp_path / "copy"
    shutil.copytree(work, copy)
    store = _store(tmp_path / "run2", copy)
    got = store._read_record(str(copy / "smoke" / "decoders" / "tiny.yaml"))
    assert got.record_format_version >= 6 and got.params and workdir_records.UNREADABLE in got.params[0]
    assert got.code and got.code != rec.code
    assert f"the job record {copy / local.relative_to(work)} cannot be read" in capsys.readouterr().err
    # a missing record file is still "no record" (a directory made before the records existed)
    assert store._read_record(str(copy / "smoke" / "other.yaml")) is None


def test_snakemakes_own_record_with_wrong_types_reruns_its_job(tmp_path, capsys):
    """No record in the directory (made before they were kept) and Snakemake's own record of the output has a field of
    the wrong type: its job runs again, a note naming the file, instead of pydantic's traceback."""
    work = tmp_path / "work"
    out = str(work / "smoke" / "problems" / "gsm8k.jsonl")
    plain = FilePersistence(nolock=True, path=tmp_path / ".snakemake")
    plain._write_record(out, MetadataRecord(rule="prepare_problems", params=["x"], record_format_version=6))
    path = Path(plain._record_path(plain._metadata_path, out))
    path.write_text(json.dumps({"rule": "prepare_problems", "params": "x", "record_format_version": 6}))
    got = _store(tmp_path, work)._read_record(out)
    assert workdir_records.UNREADABLE in got.params[0]
    assert f"the job record {path} cannot be read" in capsys.readouterr().err


def test_an_output_without_any_record_reruns_its_job(tmp_path, capsys):
    """An output under a root that exists with no record anywhere (copied without the hidden records folder, or it
    was deleted): Snakemake would read "no record" as "nothing changed"; while the DAG is planned a stand-in record
    makes its job run again, one note per directory. Once a job has started, an output may exist before its record
    is written: then "no record" is as Snakemake's."""
    work = tmp_path / "work"
    outs = [work / "smoke" / "decoders" / f"{m}.yaml" for m in ("tiny", "tiny-orl")]
    for out in outs:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("threshold: 0.5\n")
    workdir_records._REPORTED.discard(str(work))
    store = _store(tmp_path, work)
    got = [store._read_record(str(out)) for out in outs]
    assert all(g.record_format_version >= 6 and workdir_records.NO_RECORD in g.params[0] and g.code for g in got)
    err = capsys.readouterr().err
    assert err.count("note: outputs under") == 1 and f"have no job record in {work}/.snakemake-records" in err, err
    assert "--touch" in err
    assert store._read_record(str(work / "smoke" / "absent.yaml")) is None  # no output: nothing to re-run
    store.started(type("Job", (), {"output": []})())
    store._clear_cache()
    assert store._read_record(str(outs[0])) is None


def test_checkpoints_and_images_without_a_record_are_kept(tmp_path, capsys):
    """Outputs checked by content or built from versioned definitions (checkpoint folders, their stamps and source
    keys, dequantized checkpoints, container images) are kept without a record: re-making them would download a
    checkpoint or build an image again for nothing. A suite's outputs beside them still re-run."""
    work = tmp_path / "work"
    kept = [work / "hf" / "tiny" / "config.json", work / "verified" / "tiny.json", work / "sources" / "tiny.json",
            work / "dequantized" / "tiny" / "config.json", work / "images" / "engine.sif"]
    rerun = work / "smoke" / "decoders" / "tiny.yaml"
    for out in kept + [rerun]:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("x\n")
    workdir_records._REPORTED.discard(str(work))
    store = _store(tmp_path, work)
    assert [store._read_record(str(out)) for out in kept] == [None] * len(kept)
    assert workdir_records.NO_RECORD in store._read_record(str(rerun)).params[0]


def test_drop_metadata_reuses_an_output_without_a_record(tmp_path, data_dir):
    """--drop-metadata writes no job record, so an output's missing (or damaged) record stays so: a stand-in
    record would re-run its job on every run, for ever. Under it "no record" is Snakemake's (the output is reused),
    and start-up says that config changes are then not seen."""
    work = tmp_path / "work"
    out = work / "smoke" / "decoders" / "tiny.yaml"
    out.parent.mkdir(parents=True)
    out.write_text("threshold: 0.5\n")
    store = _store(tmp_path, work)
    store.dag = SimpleNamespace(workflow=SimpleNamespace(execution_settings=SimpleNamespace(keep_metadata=False)))
    assert store._read_record(str(out)) is None
    local = work / workdir_records.RECORDS_DIR / "smoke" / "decoders" / "tiny.yaml.json"
    local.parent.mkdir(parents=True)
    local.write_text("{\"rule\": ")  # torn
    store._clear_cache()
    assert store._read_record(str(out)) is None
    # the whole workflow: a second run re-runs nothing
    (tmp_path / "wf").mkdir()
    wf = Workflow(tmp_path / "wf", data_dir, {"models": ["tiny"], "benchmarks": ["gsm8k"], "limit": 1},
                  target=str(tmp_path / "wf" / "work" / "smoke" / "problems" / "gsm8k.jsonl"))
    first = wf.run("--drop-metadata")
    assert "prepare_problems" in job_counts(first)
    assert "note: --drop-metadata: no job records are written" in first
    assert not list((wf.work / workdir_records.RECORDS_DIR).rglob("*.json"))
    again = wf.run("--drop-metadata", "-n")
    assert "Nothing to be done" in again and "have no job record" not in again, again[-2000:]


def test_cleanup_metadata_keeps_skipping_a_trigger(tmp_path):
    """`--cleanup-metadata FILE` is Snakemake's advice for skipping a trigger ("won't change the result"): the record
    is replaced by one that records nothing (no params, code or input list to compare), so FILE is kept rather than
    re-made as an output without any record would be."""
    work = tmp_path / "work"
    out = work / "smoke" / "decoders" / "tiny.yaml"
    out.parent.mkdir(parents=True)
    out.write_text("threshold: 0.5\n")
    roots = workdir_records.Roots({"<work>": str(work)})
    roots.adopt_on_delete = True
    store = workdir_records.persistence_class(FilePersistence, roots)(nolock=True, path=tmp_path / ".snakemake")
    store._write_record(str(out), MetadataRecord(rule="render_decoder", params=["--set max_new_tokens=64"],
                                                 code="render", record_format_version=6))
    assert store._delete_record(str(out))
    got = store._read_record(str(out))
    assert got is not None and (got.params, got.code, got.input) == (None, None, None)
    assert got.record_format_version >= 6  # not "outdated" either: Snakemake compares nothing, as without a record


def test_a_run_that_ends_leaves_the_locks_of_another_live_run(tmp_path):
    """Snakemake removes the whole locks folder when a run ends, the locks of another run still alive on other outputs
    included (a third run could then start on that run's outputs: two generation jobs wrote one shard). A run's end
    removes its own lock files; --unlock still removes every lock."""
    work = tmp_path / "work"
    first, second = (_store(tmp_path, work) for _ in range(2))
    first._write_locks("output", [str(work / "smoke/generations/tiny/gsm8k/seed12345/shard0of1.jsonl")])
    second._write_locks("output", [str(work / "smoke/generations/tiny-orl/gsm8k/seed12345/shard0of1.jsonl")])
    locks = tmp_path / ".snakemake" / "locks"
    assert sorted(p.name for p in locks.iterdir()) == ["0.output.lock", "1.output.lock"]
    second._delete_locks()  # what unlock() does at a run's end (these stores are nolock: their unlock is a no-op)
    assert [p.name for p in locks.iterdir()] == ["0.output.lock"]
    assert [k for t, k in second._read_locks()] == [str(work / "smoke/generations/tiny/gsm8k/seed12345/shard0of1.jsonl")]
    first._delete_locks()
    assert not locks.exists()
    third = _store(tmp_path, work)  # (a store makes the folder)
    third._write_locks("output", ["x"])
    _store(tmp_path, work).cleanup_locks()  # --unlock
    assert not locks.exists()
