"""The generation driver: exactly-once records across kills and reruns, shards, refusal conditions."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from repro.backends import generation_job as gen
from repro.backends.merge import merge
from repro.checkpoint.manifest import write_manifest

from fake_backend import FakeBackend, Killed


class LazyBackend(FakeBackend):
    """Like SGLang's backend: its engine (and so most of its provenance) exists only once generate() ran."""

    def describe(self):
        return {"backend": "lazy", "engine_args": "set" if self.calls else None}


@pytest.fixture
def job(tmp_path, data_dir):
    from repro.data import load_problems

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    m = write_manifest(ckpt)
    stamp = tmp_path / "stamp.json"
    stamp.write_text(json.dumps({"manifest_sha256": m["manifest_sha256"]}))
    probs = load_problems("gsm8k", data_dir, limit=7).problems
    pf = tmp_path / "problems.jsonl"
    pf.write_text("".join(json.dumps(p) + "\n" for p in probs))
    dec = tmp_path / "dec.yaml"
    dec.write_text("algorithm: low_confidence\nthreshold: 0.9\n")

    def args(out, shard=0, n=1):
        return gen.argparse.Namespace(backend="engine", model="m", model_dir=str(ckpt), role="base",
                                      verified=str(stamp), decoder=str(dec), problems=str(pf), benchmark="gsm8k",
                                      seed=1, shard=shard, num_shards=n, device="cpu", precision="fp32", out=str(out))
    return args, probs, ckpt, stamp


def ids(path):
    return [json.loads(l)["id"] for l in Path(path).read_text().splitlines()]


def test_kill_then_rerun_gives_every_problem_once(job, tmp_path, monkeypatch):
    args, probs, *_ = job
    out = tmp_path / "g" / "shard0of1.jsonl"
    backend = FakeBackend(die_after=3)
    monkeypatch.setattr(gen, "get_backend", lambda *a, **k: backend)
    with pytest.raises(Killed):
        gen.run(args(out))
    assert not out.exists()                      # no half output for Snakemake to mistake as done
    partial = Path(str(out) + ".partial.jsonl")
    assert len(partial.read_text().splitlines()) == 3
    with open(partial, "a") as f:                # a record torn by the kill
        f.write('{"id": "gsm8k/3", "compl')
    backend2 = FakeBackend()
    monkeypatch.setattr(gen, "get_backend", lambda *a, **k: backend2)
    assert gen.run(args(out)) == 0
    assert backend2.calls == 4                   # only the missing problems were generated
    assert ids(out) == [p["id"] for p in probs] and not partial.exists()
    meta = json.loads(Path(str(out) + ".meta.json").read_text())
    assert meta["checkpoint_manifest_sha256"] and meta["decoder_sha256"] and meta["code_revision"]
    assert meta["backend_info"] == {"backend": "fake"} and len(meta["backend_sessions"]) == 2
    # both sessions' figures (the speed table sums them), the killed one's with its job's load
    killed, last = meta["generation_sessions"]
    assert (killed["problems"], killed["generated_tokens"], killed["finished"]) == (3, 12, False)
    assert (last["problems"], last["generated_tokens"], last["finished"]) == (4, 16, True)
    assert last == {**last, **meta["generated_last_session"]} and killed["wall_s"] > 0
    assert killed["job"]["id"] != last["job"]["id"] and "model_load_s" in killed["job"]
    assert not Path(str(out) + ".partial.backends.json").exists()
    assert not Path(str(out) + ".partial.sessions.json").exists()


def test_provenance_is_taken_after_generate_and_the_backend_is_closed(job, tmp_path, monkeypatch):
    args, probs, *_ = job
    out = tmp_path / "g" / "shard0of1.jsonl"
    dying = LazyBackend(die_after=2)
    monkeypatch.setattr(gen, "get_backend", lambda *a, **k: dying)
    with pytest.raises(Killed):
        gen.run(args(out))
    assert dying.closed  # closed on error too
    sessions = json.loads(Path(str(out) + ".partial.backends.json").read_text())
    assert sessions == [{"backend": "lazy", "engine_args": "set"}]
    backend = LazyBackend()
    monkeypatch.setattr(gen, "get_backend", lambda *a, **k: backend)
    assert gen.run(args(out)) == 0 and backend.closed
    meta = json.loads(Path(str(out) + ".meta.json").read_text())
    assert meta["backend_info"] == {"backend": "lazy", "engine_args": "set"}  # not the pre-generate view


def test_resume_with_nothing_left_keeps_the_backend_provenance(job, tmp_path, monkeypatch):
    """Killed after the last record but before the output was written: the rerun generates nothing and
    must still record which backend wrote the records."""
    args, probs, *_ = job
    out = tmp_path / "g" / "shard0of1.jsonl"
    monkeypatch.setattr(gen, "get_backend", lambda *a, **k: FakeBackend())
    real_complete = gen.complete_shard

    def die(*a, **k):
        raise Killed()
    monkeypatch.setattr(gen, "complete_shard", die)
    with pytest.raises(Killed):
        gen.run(args(out))
    monkeypatch.setattr(gen, "complete_shard", real_complete)
    monkeypatch.setattr(gen, "get_backend", lambda *a, **k: pytest.fail("nothing is left to generate"))
    assert gen.run(args(out)) == 0
    meta = json.loads(Path(str(out) + ".meta.json").read_text())
    assert meta["backend_info"] == {"backend": "fake"} and meta["backend_sessions"] == [{"backend": "fake"}]
    assert ids(out) == [p["id"] for p in probs]


def test_shards_merge_to_the_unsharded_order(job, tmp_path, monkeypatch):
    args, probs, *_ = job
    monkeypatch.setattr(gen, "get_backend", lambda *a, **k: FakeBackend())
    shards = []
    for k in range(3):
        out = tmp_path / f"shard{k}of3.jsonl"
        gen.run(args(out, k, 3))
        shards.append(out)
    merged = merge(Path(args(tmp_path / "x").problems), shards, tmp_path / "merged.jsonl")
    assert [r["id"] for r in merged] == [p["id"] for p in probs]
    with pytest.raises(ValueError, match="duplicated"):
        merge(Path(args(tmp_path / "x").problems), shards + [shards[0]], tmp_path / "bad.jsonl")


def test_refuses_unverified_or_changed_checkpoint(job, tmp_path):
    args, _, ckpt, stamp = job
    (ckpt / "extra.bin").write_bytes(b"x")
    write_manifest(ckpt)                         # manifest changed since the stamp
    with pytest.raises(gen.GenerationError, match="verify again"):
        gen.run(args(tmp_path / "o.jsonl"))
    stamp.unlink()
    with pytest.raises(gen.GenerationError, match="no verified stamp"):
        gen.run(args(tmp_path / "o.jsonl"))


def test_a_failing_job_log_ends_with_how_far_it_got(job, tmp_path, monkeypatch, capsys):
    """A log redraws the bar every 30 s at most, so a job that failed after 3 problems within those 30 s ended
    its log with the bar's first line, "0/7"; the failure's log tail (workflow `logged`) showed no progress."""
    args, *_ = job
    monkeypatch.setattr(gen, "get_backend", lambda *a, **k: FakeBackend(die_after=3))
    try:
        gen.run(args(tmp_path / "g" / "shard0of1.jsonl"))
    except Killed:  # read while the failure is being handled (the job's error message comes next in its log)
        err = capsys.readouterr().err
    bar_lines = [line for line in err.splitlines() if "m/gsm8k" in line]
    assert bar_lines and " 3/7 " in bar_lines[-1], bar_lines


def test_gpu_job_without_gpu_fails_clearly(job, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    a = job[0](tmp_path / "o.jsonl")
    cmd = [sys.executable, "-m", "repro.backends.generation_job"]
    for k, v in vars(a).items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    cmd[cmd.index("--device") + 1] = "cuda"
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "no CUDA GPU is visible" in r.stderr


def test_adapter_map_reaches_the_backend(job, tmp_path, monkeypatch):
    args, *_ = job
    seen = []
    monkeypatch.setattr(gen, "get_backend", lambda *a, **k: seen.append(k) or FakeBackend())
    a = args(tmp_path / "o.jsonl")
    gen.run(a)
    assert "adapter_map" not in seen[-1]
    a = args(tmp_path / "p.jsonl")
    a.adapter_map = str(tmp_path / "map.json")
    gen.run(a)
    assert seen[-1]["adapter_map"] == str(tmp_path / "map.json")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # stalled blocks of the random tiny model
def test_batched_engine_job_killed_and_resumed_equals_batch_1(job, tmp_path, monkeypatch):
    """The real engine on the tiny checkpoint over 7 GSM8K problems: batch 3, killed after 2 records (written
    in finishing order), rerun → every problem once, and the same completions and forward counts as batch 1."""
    from repro.checkpoint.tiny import write_tiny

    args, probs, _, _ = job
    ckpt = tmp_path / "tiny"
    write_tiny(ckpt, seed=1)
    stamp = tmp_path / "tiny-stamp.json"
    manifest = json.loads((ckpt / "checkpoint_manifest.json").read_text())
    stamp.write_text(json.dumps({"manifest_sha256": manifest["manifest_sha256"]}))
    dec = tmp_path / "tiny-dec.yaml"
    dec.write_text("algorithm: orl\nmax_new_tokens: 40\n")

    def tiny_args(out, bs):
        a = args(out)
        a.model_dir, a.verified, a.decoder, a.role, a.batch_size = str(ckpt), str(stamp), str(dec), "orl", bs
        return a

    one = tmp_path / "b1" / "shard0of1.jsonl"
    assert gen.run(tiny_args(one, 1)) == 0
    real_append, calls = gen.append_jsonl, []

    def append_then_die(f, rec):
        if len(calls) == 2:
            raise Killed()
        calls.append(rec["id"])
        real_append(f, rec)
    monkeypatch.setattr(gen, "append_jsonl", append_then_die)
    out = tmp_path / "b3" / "shard0of1.jsonl"
    with pytest.raises(Killed):
        gen.run(tiny_args(out, 3))
    assert len(Path(str(out) + ".partial.jsonl").read_text().splitlines()) == 2
    monkeypatch.setattr(gen, "append_jsonl", real_append)
    assert gen.run(tiny_args(out, 3)) == 0
    a = [json.loads(l) for l in one.read_text().splitlines()]
    b = [json.loads(l) for l in out.read_text().splitlines()]
    assert [r["id"] for r in b] == [p["id"] for p in probs]
    assert [(r["completion"], r["forwards"]) for r in b] == [(r["completion"], r["forwards"]) for r in a]
    assert {r["batch_size"] for r in b} == {3} and {r["batch_size"] for r in a} == {1}
    meta = json.loads(Path(str(out) + ".meta.json").read_text())
    assert meta["batch_size"] == 3 and meta["generated_last_session"]["problems"] == 5
    assert meta["backend_info"]["engine_path"] == "batched-eager" and meta["backend_info"]["batch"]["rounds"] > 0
