"""Grouped generation jobs (suite `group_benchmarks`): one backend for several benchmarks, and the trust rules —
a benchmark whose inputs did not change keeps its records when the job re-runs, one whose inputs changed (or
whose shard file was altered) is generated afresh, a killed job resumes per record, and the merge refuses a
shard that no longer matches the job's index. Real GSM8K and HumanEval problems; a counting stand-in backend
(the real engine's grouped path runs end to end in test_grouped_e2e.py)."""

import json
from pathlib import Path

import pytest

from repro.backends import generation_job as gen
from repro.backends.merge import group_shards
from repro.checkpoint.manifest import write_manifest


class Killed(Exception):
    pass


class CountingBackend:
    """Completion = the prompt's first 20 characters; counts builds and generated prompts; can die."""

    built = 0
    generated: list = []
    die_after = None

    def __init__(self, **kw):
        CountingBackend.built += 1
        self.load_s = 1.5

    def generate(self, prompts, decoder):
        for p in prompts:
            if CountingBackend.die_after is not None and len(CountingBackend.generated) >= CountingBackend.die_after:
                raise Killed()
            text = p.messages[-1]["content"][:20]
            CountingBackend.generated.append(text)
            yield {"prompt_text": text, "completion": text, "prompt_tokens": 5, "generated_tokens": 4,
                   "forwards": {"prefill": 1, "denoise": 1, "commit": 1}, "tpf": 2.0, "wall_s": 0.01,
                   "tokens_per_s": 400.0, "finish_reason": "eos", "device": "cpu"}

    def describe(self):
        return {"backend": "counting", "load_s": self.load_s}

    def close(self):
        pass


@pytest.fixture
def group(tmp_path, data_dir, monkeypatch):
    from repro.data import load_problems

    monkeypatch.setattr(gen, "get_backend", lambda name, **kw: CountingBackend(**kw))
    CountingBackend.built, CountingBackend.generated, CountingBackend.die_after = 0, [], None
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    stamp = tmp_path / "stamp.json"
    stamp.write_text(json.dumps({"manifest_sha256": write_manifest(ckpt)["manifest_sha256"]}))
    files = {}
    for bench, n in (("gsm8k", 5), ("humaneval", 4)):
        pf = tmp_path / f"{bench}.jsonl"
        pf.write_text("".join(json.dumps(p) + "\n" for p in load_problems(bench, data_dir, limit=n).problems))
        dec = tmp_path / f"{bench}.yaml"
        dec.write_text("algorithm: low_confidence\nthreshold: 0.9\n")
        files[bench] = (dec, pf, tmp_path / "g" / "shard0of2" / f"{bench}.jsonl")
    index = tmp_path / "g" / "shard0of2.json"

    def args():
        return gen.argparse.Namespace(
            backend="engine", model="m", model_dir=str(ckpt), role="base", verified=str(stamp), seed=1, shard=0,
            num_shards=2, device="cpu", precision="fp32", group_index=str(index), benchmark=list(files),
            decoder=[str(d) for d, _, _ in files.values()], problems=[str(p) for _, p, _ in files.values()])
    return args, files, index


def test_one_load_serves_every_benchmark_and_the_index_lists_them(group):
    args, files, index = group
    assert gen.run(args()) == 0
    assert CountingBackend.built == 1 and len(CountingBackend.generated) == 3 + 2  # shard 0 of 2: 3 + 2 problems
    idx = json.loads(index.read_text())
    assert sorted(idx["benchmarks"]) == ["gsm8k", "humaneval"]
    for bench, (_, _, out) in files.items():
        meta = json.loads(Path(str(out) + ".meta.json").read_text())
        assert meta["job"]["benchmarks_sharing_load"] == 2 and meta["job"]["model_load_s"] == 1.5
        assert meta["job"]["id"] == idx["job"]["id"] and meta["benchmark"] == bench
        assert idx["benchmarks"][bench]["sha256"] == meta["records_sha256"]
        assert not Path(str(out) + ".partial.jsonl").exists()
    # the merge takes each benchmark's shard through the index
    assert [p.name for p in group_shards([index], "humaneval")] == ["humaneval.jsonl"]


def test_rerun_keeps_unchanged_benchmarks_and_regenerates_a_changed_one(group):
    args, files, index = group
    gen.run(args())
    gsm_out = files["gsm8k"][2]
    gsm_bytes, gsm_mtime = gsm_out.read_bytes(), gsm_out.stat().st_mtime_ns
    index.unlink()  # what Snakemake does before re-running the job
    files["humaneval"][0].write_text("algorithm: low_confidence\nthreshold: 0.8\n")  # HumanEval's decoder changed
    CountingBackend.generated = []
    assert gen.run(args()) == 0
    assert len(CountingBackend.generated) == 2  # HumanEval's 2 problems only
    assert gsm_out.read_bytes() == gsm_bytes and gsm_out.stat().st_mtime_ns == gsm_mtime
    idx = json.loads(index.read_text())
    he_meta = json.loads(Path(str(files["humaneval"][2]) + ".meta.json").read_text())
    assert he_meta["job"]["benchmarks_sharing_load"] == 1 and he_meta["job"]["id"] == idx["job"]["id"]
    assert idx["benchmarks"]["gsm8k"]["job"]["id"] != idx["job"]["id"]  # GSM8K's records: the first job's
    # nothing changed: nothing generated and no model loaded
    index.unlink()
    CountingBackend.built, CountingBackend.generated = 0, []
    assert gen.run(args()) == 0 and CountingBackend.built == 0 and CountingBackend.generated == []
    assert json.loads(index.read_text())["job"]["benchmarks_sharing_load"] == 0


def test_an_altered_shard_is_generated_again_and_the_merge_refuses_it(group):
    args, files, index = group
    gen.run(args())
    out = files["gsm8k"][2]
    out.write_text(out.read_text().replace('"completion": "', '"completion": "X', 1))
    with pytest.raises(ValueError, match="changed since the grouped job"):
        group_shards([index], "gsm8k")
    index.unlink()
    CountingBackend.generated = []
    gen.run(args())
    assert len(CountingBackend.generated) == 3  # GSM8K again: its file no longer had the recorded sha256


def test_a_corrupt_index_is_named_with_the_fix_and_rebuilt_without_generating(group):
    args, files, index = group
    gen.run(args())
    index.write_text(index.read_text()[:100])  # truncated
    with pytest.raises(ValueError, match=rf"{index}: unreadable grouped-job index .*delete it and run again"):
        group_shards([index], "gsm8k")
    index.unlink()
    CountingBackend.generated = []
    gen.run(args())
    assert CountingBackend.generated == [] and group_shards([index], "gsm8k")  # every shard kept
    (shard,) = group_shards([index], "gsm8k")  # the index vouches for the new file
    recs = [json.loads(l) for l in shard.read_text().splitlines()]
    assert len(recs) == 3 and not any(r["completion"].startswith("X") for r in recs)


def test_killed_grouped_job_resumes_each_benchmark_exactly_once(group):
    args, files, index = group
    CountingBackend.die_after = 4  # GSM8K's 3 records, then one of HumanEval's 2
    with pytest.raises(Killed):
        gen.run(args())
    assert files["gsm8k"][2].is_file() and not index.exists()
    assert len(Path(str(files["humaneval"][2]) + ".partial.jsonl").read_text().splitlines()) == 1
    CountingBackend.die_after, CountingBackend.generated = None, []
    assert gen.run(args()) == 0
    assert len(CountingBackend.generated) == 1  # the one HumanEval problem left
    for bench, (_, pf, out) in files.items():
        want = [json.loads(l)["id"] for l in pf.read_text().splitlines()][0::2]
        assert [json.loads(l)["id"] for l in out.read_text().splitlines()] == want


def test_bad_task_lists_are_refused(group):
    args, files, _ = group
    a = args()
    a.benchmark, a.decoder, a.problems = a.benchmark + ["gsm8k"], a.decoder * 2, a.problems + a.problems[:1]
    a.decoder = a.decoder[:3]
    with pytest.raises(gen.GenerationError, match=r"names \['gsm8k'\] more than once"):
        gen.run(a)
    a = args()
    a.decoder = a.decoder[:1]
    with pytest.raises(gen.GenerationError, match="one --decoder and one --problems per --benchmark"):
        gen.run(a)
    a = args()
    a.group_index = None
    with pytest.raises(gen.GenerationError, match="--group-index"):
        gen.run(a)


def test_a_new_batch_size_or_adapter_map_generates_again(group, tmp_path):
    """Reused only when made the same way: a job re-run for another batch size or adapter map generates."""
    args, files, index = group
    gen.run(args())
    (tmp_path / "map.json").write_text('{"type": "linear"}')
    amap = {"adapter_map": str(tmp_path / "map.json")}
    # each step differs from the one before in one setting only; the repeat changes nothing
    for change, generated in ((amap, 5), (dict(amap, batch_size=4), 5), (dict(amap, batch_size=4), 0)):
        index.unlink()
        CountingBackend.generated = []
        a = args()
        for k, v in change.items():
            setattr(a, k, v)
        assert gen.run(a) == 0 and len(CountingBackend.generated) == generated, change
        meta = json.loads(Path(str(files["gsm8k"][2]) + ".meta.json").read_text())
        assert meta["batch_size"] == change.get("batch_size", 1) and meta["inputs"]["adapter_map"].startswith("sha256:")


def test_a_role_change_regenerates_every_benchmark(group):
    """The role decides the adapter (orl) or none (base): shards made under another role are not kept."""
    args, files, index = group
    gen.run(args())
    n_first = len(CountingBackend.generated)
    index.unlink()
    CountingBackend.generated = []
    orl = args()
    orl.role = "orl"
    gen.run(orl)
    assert len(CountingBackend.generated) == n_first > 0  # every benchmark again, none kept


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # stalled blocks of the random tiny model
def test_capture_seconds_per_benchmark_add_up_across_a_batched_engine_rebuild(tmp_path, data_dir):
    """The real engine on the tiny checkpoint in one grouped job at batch size 2: GSM8K (3 problems: 2 slots),
    then HumanEval (1 problem: 1 slot, so the batched engine is rebuilt between them). Each benchmark's capture
    seconds are the difference of the model's cumulative counter (repro.engine.llm.LLM.graph_capture_s) over
    its generation: on a GPU what its own batched call captured (the rebuilt engine's capture in full, not its
    difference to the old engine's), adding up to the job's; on the CPU no graph path runs and every figure is
    None (the speed table's "-"), never a made-up 0."""
    import torch

    from repro.checkpoint.tiny import write_tiny
    from repro.data import load_problems

    device = "cuda" if torch.cuda.is_available() else "cpu"
    ckpt = tmp_path / "tiny"
    write_tiny(ckpt, seed=1)
    stamp = tmp_path / "stamp.json"
    stamp.write_text(json.dumps({"manifest_sha256": json.loads((ckpt / "checkpoint_manifest.json").read_text())[
        "manifest_sha256"]}))
    dec = tmp_path / "dec.yaml"
    dec.write_text("algorithm: orl\nmax_new_tokens: 32\n")
    benches = {"gsm8k": 3, "humaneval": 1}
    for b, n in benches.items():
        (tmp_path / f"{b}.jsonl").write_text(
            "".join(json.dumps(p) + "\n" for p in load_problems(b, data_dir, limit=n).problems))
    index = tmp_path / "g" / "shard0of1.json"
    a = gen.argparse.Namespace(
        backend="engine", model="tiny", model_dir=str(ckpt), role="orl", verified=str(stamp), seed=1, shard=0,
        num_shards=1, device=device, precision="bf16" if device == "cuda" else "fp32", batch_size=2,
        group_index=str(index), benchmark=list(benches), decoder=[str(dec)] * 2,
        problems=[str(tmp_path / f"{b}.jsonl") for b in benches])
    assert gen.run(a) == 0
    metas = {b: json.loads((tmp_path / "g" / "shard0of1" / f"{b}.jsonl.meta.json").read_text()) for b in benches}
    per = [metas[b]["job"]["graph_capture_s"] for b in benches]
    assert per == [metas[b]["generation_sessions"][-1]["graph_capture_s"] for b in benches]
    total = json.loads(index.read_text())["job"]["graph_capture_s"]
    if device == "cpu":
        assert metas["gsm8k"]["backend_info"]["engine_path"] == "batched-eager"
        assert per == [None, None] and total is None
    else:
        assert metas["gsm8k"]["backend_info"]["engine_path"] == "batched-cuda-graph"
        for b, p in zip(benches, per):  # each benchmark: what its own batched call captured
            assert p > 0 and p == pytest.approx(metas[b]["backend_info"]["batch"]["capture_s"], abs=1e-6), b
        assert sum(per) == pytest.approx(total, abs=1e-6)
