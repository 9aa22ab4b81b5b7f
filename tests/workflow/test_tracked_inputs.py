"""Every input that decides a cell is tracked by content: after one real run (three models -- the tiny model, a
local checkpoint folder, a checkpoint from a pre-seeded hub cache -- on one GSM8K problem), each kind of
change re-runs exactly the jobs it affects (asserted on the dry run's job list) and an unchanged tree is
"Nothing to be done": the data file edited in place, the local checkpoint switched to another folder, the
tiny model's seed, the hub revision, the scorer's code. A repaired local folder is copied and verified
again, and the failing verification says which copy it checked. Touching a checkpoint file re-verifies and
regenerates nothing (a dry run only says it would re-verify); a copied work directory (new mtimes, no
Snakemake record of its paths) re-verifies and generates again; a successful run ends with the table it built.

The run uses a copy of the checkout (so the test can change the scorer's code) and its own data folder,
hub cache and work directory."""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import eval_data
from _e2e import checkout_copy, job_counts

pytestmark = pytest.mark.slow

REV_A, REV_B = "a" * 40, "b" * 40


class Run:
    def __init__(self, root: Path):
        self.root = root
        self.checkout = root / "checkout"
        self.data = root / "data"
        self.work = root / "work"
        self.ckpt_a, self.ckpt_b = root / "ckpt_a", root / "ckpt_b"
        self.hub = root / "hub"

    def overlay(self, loc=None, seed=0, revision=REV_A, data=None, work=None) -> Path:
        p = self.root / "overlay.json"
        p.write_text(json.dumps({
            "data_dir": str(data or self.data), "results_dir": str(self.root / "results"), "work_dir": str(work or self.work),
            "models": {
                "tiny-orl": {"source": {"type": "tiny", "seed": seed}},
                "loc": {"label": "local", "role": "orl", "decoder": "llada-orl",
                        "source": {"type": "local", "path": str(loc or self.ckpt_a)}},
                "hub": {"label": "hub", "role": "orl", "decoder": "llada-orl",
                        "source": {"type": "hf", "repo_id": "org/tiny", "revision": revision}}},
            "suites": {"smoke": {"models": ["tiny-orl", "loc", "hub"], "benchmarks": ["gsm8k"], "limit": 1,
                                 "max_new_tokens": 16}}}))
        return p

    def snakemake(self, *args, target="main_table", check=True, **overlay) -> str:
        cmd = [sys.executable, "-m", "snakemake", target, *args, "--cores", "2", "--snakefile",
               str(self.checkout / "Snakefile"), "--configfile", str(self.checkout / "config.yaml"),
               str(self.overlay(**overlay))]
        env = dict(os.environ, HF_HUB_CACHE=str(self.hub), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
        r = subprocess.run(cmd, cwd=self.root, capture_output=True, text=True, timeout=600, env=env)
        self.last_stdout, self.returncode = r.stdout, r.returncode
        out = r.stdout + r.stderr
        if check:
            assert r.returncode == 0, out[-3000:]
        return out

    def dry(self, **overlay) -> dict:
        return job_counts(self.snakemake("-n", **overlay))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    data = eval_data.require()
    r = Run(tmp_path_factory.mktemp("tracked"))
    checkout_copy(r.root, copy=("repro", "workflow", "profiles", "Snakefile", "config.yaml"))  # r.checkout
    r.data.mkdir()
    shutil.copy(data / "gsm8k.jsonl", r.data / "gsm8k.jsonl")
    subprocess.run([sys.executable, "-m", "repro.checkpoint.tiny", "--out", str(r.ckpt_a), "--seed", "3"],
                   check=True, capture_output=True, cwd=r.checkout)
    shutil.copytree(r.ckpt_a, r.ckpt_b)
    for rev in (REV_A, REV_B):
        shutil.copytree(r.ckpt_a, r.hub / "models--org--tiny" / "snapshots" / rev)
    r.snakemake()
    return r


def test_unchanged_tree_and_each_kind_of_change(run):
    assert "Nothing to be done" in run.snakemake("-n")
    # the same checkpoint at another path, another tiny seed, another hub revision: that model's cells only
    # (no speed_probe job anywhere: the smoke suite generates at batch 1, so its generation records are the
    # single-request timings; a batched suite's probes: test_speed_probe_e2e.py)
    per_model = {"download_checkpoint": 1, "verify_checkpoint": 1, "checkpoint_source": 1, "render_decoder": 1,
                 "generate_shard": 1,
                 "merge_shards": 1, "score": 1, "write_table": 1, "speed_table": 1, "main_table": 1, "total": 10}
    assert run.dry(loc=run.ckpt_b) == per_model
    assert run.dry(seed=1) == per_model
    assert run.dry(revision=REV_B) == per_model
    # a scorer fix re-scores every cell, regenerates nothing
    scoring = run.checkout / "repro" / "scoring" / "__init__.py"
    text = scoring.read_text()
    scoring.write_text(text + "\n# a scorer fix\n")
    try:
        assert run.dry() == {"score": 3, "write_table": 1, "main_table": 1, "total": 5}
    finally:
        scoring.write_text(text)
    assert "Nothing to be done" in run.snakemake("-n")


def test_data_file_edited_in_place(run):
    gsm = run.data / "gsm8k.jsonl"
    original = gsm.read_bytes()
    lines = original.decode().splitlines(keepends=True)
    first = json.loads(lines[0])
    provenance = run.root / "results" / "smoke" / "provenance.json"
    try:
        # a question changed: both problem copies re-prepared, every model regenerates and re-scores GSM8K
        gsm.write_text(json.dumps(dict(first, question=first["question"] + " Explain.")) + "\n" + "".join(lines[1:]))
        assert run.dry() == {"prepare_problems": 1, "prepare_generation_problems": 1, "generate_shard": 3,
                             "merge_shards": 3, "score": 3, "write_table": 1, "speed_table": 1, "main_table": 1,
                             "total": 14}
        # only the gold answer changed (the reported case): re-prepared and re-scored, nothing regenerated
        gold = dict(first, answer=first["answer"].rsplit("####", 1)[0] + "#### 123456789")
        gsm.write_text(json.dumps(gold) + "\n" + "".join(lines[1:]))
        assert run.dry() == {"prepare_problems": 1, "score": 3, "write_table": 1, "main_table": 1, "total": 6}
        run.snakemake()
        cells = json.loads(provenance.read_text())["cells"]
        assert {c["data_sha256"] for c in cells} == {hashlib.sha256(gsm.read_bytes()).hexdigest()}
        problems = run.work / "smoke/problems/gsm8k.jsonl"
        assert json.loads(problems.read_text().splitlines()[0])["gold"] == "123456789"
    finally:
        gsm.write_bytes(original)
    run.snakemake()  # the original file back: re-scored against it
    cells = json.loads(provenance.read_text())["cells"]
    assert {c["data_sha256"] for c in cells} == {hashlib.sha256(original).hexdigest()}
    assert "Nothing to be done" in run.snakemake("-n")
    # the same files in another folder: data files are identified by content, wherever they are -- nothing
    # re-prepared or re-scored; an edit there re-prepares as in place
    moved = run.root / "data-moved"
    shutil.copytree(run.data, moved)
    assert "Nothing to be done" in run.snakemake("-n", data=moved)
    (moved / "gsm8k.jsonl").write_text(json.dumps(dict(first, answer=first["answer"] + " ")) + "\n" + "".join(lines[1:]))
    assert run.dry(data=moved).get("prepare_problems") == 1


def test_repaired_local_checkpoint_is_copied_and_verified_again(run):
    stamp = run.work / "verified" / "loc.json"
    gen_cfg = run.ckpt_a / "generation_config.json"
    saved = gen_cfg.read_bytes()
    gen_cfg.unlink()  # the user's folder loses a file
    try:
        assert run.dry().get("download_checkpoint") == 1
        out = run.snakemake(target=str(stamp), check=False)
        assert "missing: generation_config.json" in out, out[-3000:]
        assert f"the pipeline's copy of your folder {run.ckpt_a}" in out, out[-3000:]
        assert not stamp.exists()
    finally:
        gen_cfg.write_bytes(saved)  # repaired in the user's folder: copied again and verified
    out = run.snakemake(target=str(stamp))
    assert stamp.exists() and f"checking {run.work / 'hf' / 'loc'}, the pipeline's copy of" in \
        (run.work / "logs/verify/loc.log").read_text()


def test_touched_checkpoint_file_reverifies_and_regenerates_nothing(run):
    run.snakemake()  # up to date (an earlier test repaired a local checkpoint, which the table records)
    stamp = run.work / "verified" / "tiny-orl.json"
    before = json.loads(stamp.read_text())
    os.utime(run.work / "hf" / "tiny-orl" / "config.json")  # `touch`: same bytes, new mtime
    out = run.snakemake("-n")  # a dry run only says what a real run re-verifies: the stamp is kept as it is
    assert "note: dry run: " in out and "hf/tiny-orl changed since" in out, out[-3000:]
    assert "verifying it again by content" not in out and json.loads(stamp.read_text()) == before
    out = run.snakemake()
    assert "hf/tiny-orl changed since" in out and "verifying it again by content" in out
    assert "Nothing to be done" in out, out[-3000:]  # no render_decoder / generate_shard
    after = json.loads(stamp.read_text())  # verified again: the stamp vouches for the new mtime
    assert after["verified_at"] >= before["verified_at"] and after["stat"] != before["stat"]
    assert after["manifest_sha256"] == before["manifest_sha256"]
    assert "Nothing to be done" in run.snakemake("-n")


def failed_marker_exists(stamp):
    return (stamp.parent / f"{stamp.name}.FAILED").is_file()


def test_damaged_checkpoint_stops_every_real_run_until_repaired(run):
    """A byte flipped in a checkpoint file after a complete run, size and mtime put back (only the inode change
    time tells): the real run stops non-zero naming the checkpoint, the file and the fix, and so does every later
    run (none goes silent on the removed stamp); the first removes the shards generated under the stamp that no
    longer holds (they may have read the damaged bytes); a dry run only reports (rc 0, the stamp kept); commands
    that run no job only report; the restored file verifies again, that model's cell is generated again, and the
    tree is up to date. Then a byte flipped with the mtime left changed: found and handled the same way (the
    first run stops and removes the cell; the steps that follow the failure are the same code and are not
    repeated)."""
    run.snakemake()
    stamp = run.work / "verified" / "tiny-orl.json"
    # tiny-orl's cell made again under the current stamp (an earlier test may have verified the folder again since
    # the cell was made: a shard made under an earlier stamp is vouched for by that later check, and kept)
    shard = run.work / "smoke/generations/tiny-orl/gsm8k/seed12345/shard0of1.jsonl"
    others = [run.work / f"smoke/generations/{m}/gsm8k/seed12345/shard0of1.jsonl" for m in ("loc", "hub")]
    shard.unlink()
    run.snakemake()
    assert json.loads(Path(f"{shard}.meta.json").read_text())["checkpoint_stamp"]["stat_fingerprint"] == \
        json.loads(stamp.read_text())["stat_fingerprint"]
    weights = run.work / "hf" / "tiny-orl" / "model-00002-of-00002.safetensors"  # written by the tiny model's rule
    original = weights.read_bytes()
    for mtime_kept in (True, False):
        st = weights.stat()
        try:
            with open(weights, "r+b") as f:  # in place: same inode, same size
                f.seek(len(original) // 2)
                f.write(bytes([original[len(original) // 2] ^ 1]))
            if mtime_kept:  # size and mtime as verified: only the inode change time tells
                os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
            out = run.snakemake("-n")  # a dry run only reports
            assert "note: dry run: " in out and stamp.exists(), out[-3000:]
            for attempt in range(2 if mtime_kept else 1):  # the first run and a later one: both stop
                out = run.snakemake(check=False)
                assert run.returncode != 0, out[-3000:]
                assert f"checkpoint {run.work / 'hf' / 'tiny-orl'} failed verification" in out, out[-3000:]
                assert f"altered: {weights.name}" in out and "fix: delete the folder" in out, out[-3000:]
                assert not stamp.exists() and "Nothing to be done" not in out
                # the first failure removes what was generated under the stamp that no longer holds (it may have
                # read the damaged bytes): that model's shard and merged file, nothing of the other models
                removed = "note: removed the shards (seed 12345) of tiny-orl/gsm8k (suite smoke)" in out
                assert removed == (attempt == 0), out[-3000:]
                assert not shard.exists() and all(f.exists() for f in others)
                assert not (run.work / "smoke/generations/tiny-orl/gsm8k/seed12345.jsonl").exists()
            if mtime_kept:
                out = run.snakemake("-n")
                assert "failed verification in an earlier run" in out, out[-3000:]
                # commands that run no job only report (rc 0), also abbreviated (--unl) or combined (-pS), as
                # Snakemake's own parser reads them
                for flag, name in (("--unl", "--unlock"), ("-pS", "--summary"), ("--list-rules", "--list-rules")):
                    out = run.snakemake(flag)
                    assert f"note: {name} (runs no job): " in out and "Error:" not in out, (flag, out[-3000:])
            assert failed_marker_exists(stamp) and not stamp.exists()
        finally:
            weights.write_bytes(original)
        out = run.snakemake()  # restored: verified again, a fresh stamp; the removed cell (only) generated again
        assert "verifying it again by content" in out and job_counts(out).get("generate_shard") == 1, out[-3000:]
        assert shard.exists()
        assert stamp.exists() and not (stamp.parent / "tiny-orl.json.FAILED").exists()
    assert "Nothing to be done" in run.snakemake("-n")


def test_copied_work_dir_reverifies_and_generates_again(run):
    copy = run.root / "work-copy"
    shutil.copytree(run.work, copy, copy_function=shutil.copy)  # like `cp -r`: every file gets a new mtime
    shutil.rmtree(copy / "smoke" / "generations")  # the copy generates again (shards and merged files)
    try:
        # a dry run says which checkpoints a real run verifies again (and plans on the old stamps, changing nothing)
        out = run.snakemake("-n", work=copy)
        assert len(re.findall(r"note: dry run: \S+ changed since", out)) == 3, out[-3000:]
        assert "verifying it again by content" not in out, out[-3000:]
        out = run.snakemake(work=copy)  # asserts success: no "files differ from when ... was written"
        assert out.count("verifying it again by content") == 3 and job_counts(out)["generate_shard"] == 3, out[-3000:]
        assert "files differ" not in out
        stamp = json.loads((copy / "verified" / "tiny-orl.json").read_text())
        assert stamp["checkpoint"] == str((copy / "hf" / "tiny-orl").resolve())
        assert "Nothing to be done" in run.snakemake("-n", work=copy)
        # a byte changed in the copy's checkpoint: verification fails, and no generation starts
        weights = next((copy / "hf" / "tiny-orl").glob("*.safetensors"))
        data = bytearray(weights.read_bytes())
        data[-1] ^= 1
        weights.write_bytes(bytes(data))
        shutil.rmtree(copy / "smoke" / "generations" / "tiny-orl")
        out = run.snakemake(work=copy, check=False)
        assert f"altered: {weights.name}" in out and not (copy / "verified" / "tiny-orl.json").exists(), out[-3000:]
        assert not (copy / "smoke" / "generations" / "tiny-orl").exists()  # no generation job started
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def test_successful_run_ends_with_the_table_it_built(run):
    run.snakemake("--forcerun", "write_table")
    lines = run.last_stdout.rstrip().splitlines()
    table = run.root / "results" / "smoke" / "main_table.md"
    assert lines[-1].startswith(f"Table: {table} (.tex, .csv, main_table_long.csv, provenance.json beside it)"), \
        lines[-5:]
    body = table.read_text().rstrip().splitlines()
    assert lines[-2 - len(body):-2] == body  # the table itself, just above its path
    # a re-run with nothing to do (Snakemake skips onsuccess then) still ends with the table and where it is
    out = run.snakemake()
    assert "Nothing to be done" in out
    again = run.last_stdout.rstrip().splitlines()
    assert again[-1] == lines[-1] and again[-2 - len(body):-2] == body, again[-5:]
    run.snakemake("-n")  # a dry run prints no table
    assert "Table:" not in run.last_stdout
    # a run limited to part of the DAG does not check the table against its inputs: it says so instead of
    # printing a table that may be stale
    run.snakemake("--until", "score")
    limited = run.last_stdout.rstrip().splitlines()
    assert limited[-1].startswith(f"Table: {table} was not rebuilt by this run (--until limited it)"), limited[-5:]
    assert body[-1] not in limited
