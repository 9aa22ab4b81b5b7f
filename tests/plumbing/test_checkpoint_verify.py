"""Checkpoint manifest + verify: byte flips, deleted and added files named; stamps; flat memory on 2 GB."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import pytest

from plumbing_util import env_with_repo, run_py
from repro.checkpoint.manifest import MANIFEST_NAME, build_manifest, files_digest, sha256_file, write_manifest
from repro.checkpoint.verify import ManifestError, require_verified, verify

# sha256 of 2 GiB (2**31 bytes) of zeros, checked with coreutils `sha256sum` on a sparse file.
ZEROS_2GIB_SHA256 = "a7c744c13cc101ed66c29f672f92455547889cc586ce6d44fe76ae824958ea51"


@pytest.fixture
def ckpt(tmp_path):
    d = tmp_path / "ckpt"
    (d / "sub").mkdir(parents=True)
    (d / "config.json").write_text('{"model_type": "llada2_moe"}\n')
    (d / "sub" / "model-00001-of-00002.safetensors").write_bytes(os.urandom(300_000))
    (d / "model-00002-of-00002.safetensors").write_bytes(os.urandom(200_000))
    (d / ".cache" / "huggingface").mkdir(parents=True)
    (d / ".cache" / "huggingface" / "x.metadata").write_text("ignored")
    write_manifest(d)
    return d


def verify_cli(d, *extra):
    return run_py(["-m", "repro.checkpoint", "verify", str(d), "--no-progress", *extra])


def test_manifest_schema_and_hash(ckpt):
    m = json.loads((ckpt / MANIFEST_NAME).read_text())
    assert [f["path"] for f in m["files"]] == ["config.json", "model-00002-of-00002.safetensors",
                                               "sub/model-00001-of-00002.safetensors"]
    assert m["manifest_sha256"] == files_digest(m["files"])
    assert m == build_manifest(ckpt, jobs=1)  # parallel and serial agree
    f = ckpt / "config.json"
    import hashlib
    assert sha256_file(f) == hashlib.sha256(f.read_bytes()).hexdigest()


def test_ok_writes_stamp_atomically(ckpt, tmp_path):
    stamp = tmp_path / "verified" / "m.json"
    r = verify_cli(ckpt, "--stamp", str(stamp))
    assert r.returncode == 0, r.stderr
    s = json.loads(stamp.read_text())
    man = json.loads((ckpt / MANIFEST_NAME).read_text())
    assert s["manifest_sha256"] == man["manifest_sha256"] and s["files"] == 3
    assert not [p for p in stamp.parent.iterdir() if p.name != "m.json"]  # no temp files left behind
    assert require_verified(ckpt, stamp)["manifest_sha256"] == man["manifest_sha256"]


def test_flipped_byte_named_with_expected_and_actual(ckpt, tmp_path):
    stamp = tmp_path / "stamp.json"
    stamp.write_text("{}")  # a stale stamp must not survive a failed verification
    target = ckpt / "sub" / "model-00001-of-00002.safetensors"
    expected = sha256_file(target)
    data = bytearray(target.read_bytes())
    data[12345] ^= 0x01
    target.write_bytes(bytes(data))
    r = verify_cli(ckpt, "--stamp", str(stamp))
    assert r.returncode == 1
    assert "altered: sub/model-00001-of-00002.safetensors: sha256" in r.stderr
    assert expected in r.stderr and sha256_file(target) in r.stderr
    assert not stamp.exists()


def test_deleted_and_added_files_named(ckpt):
    (ckpt / "config.json").unlink()
    (ckpt / "sub" / "stray.bin").write_bytes(b"x")
    rep = verify(ckpt)
    assert not rep.ok
    assert [m["path"] for m in rep.missing] == ["config.json"]
    assert [e["path"] for e in rep.extra] == ["sub/stray.bin"]
    r = verify_cli(ckpt)
    assert r.returncode == 1 and "missing: config.json" in r.stderr and "extra:   sub/stray.bin" in r.stderr


def test_truncated_file_reported_by_size(ckpt):
    target = ckpt / "model-00002-of-00002.safetensors"
    target.write_bytes(target.read_bytes()[:-10])
    rep = verify(ckpt)
    assert rep.altered == [{"path": "model-00002-of-00002.safetensors", "field": "size",
                            "expected": 200_000, "actual": 199_990}]


def test_edited_or_missing_manifest_is_an_error(ckpt):
    m = json.loads((ckpt / MANIFEST_NAME).read_text())
    m["files"][0]["size"] += 1
    (ckpt / MANIFEST_NAME).write_text(json.dumps(m))
    with pytest.raises(ManifestError, match="manifest_sha256 expected"):
        verify(ckpt)
    (ckpt / MANIFEST_NAME).unlink()
    r = verify_cli(ckpt)
    assert r.returncode == 2 and "no checkpoint manifest" in r.stderr and "repro.checkpoint manifest" in r.stderr


def test_pinned_manifest_sha256(ckpt):
    r = verify_cli(ckpt, "--expect-manifest-sha256", "0" * 64)
    man = json.loads((ckpt / MANIFEST_NAME).read_text())
    assert r.returncode == 2 and "pinned" in r.stderr
    # both fixes: the files from the pinned source, or this checkpoint pinned instead (a user who meant it)
    assert "repair or replace its files from the pinned source" in r.stderr, r.stderr
    assert (f"pin it: set manifest_sha256: {man['manifest_sha256']} in the model's source (config.yaml or your "
            "overlay)") in r.stderr, r.stderr
    assert verify_cli(ckpt, "--expect-manifest-sha256", man["manifest_sha256"]).returncode == 0


def test_path_escape_rejected(ckpt):
    m = json.loads((ckpt / MANIFEST_NAME).read_text())
    m["files"][0]["path"] = "../outside.json"
    m["manifest_sha256"] = files_digest(m["files"])
    (ckpt / MANIFEST_NAME).write_text(json.dumps(m))
    with pytest.raises(ManifestError, match="schema"):
        verify(ckpt)


def test_manifest_cli(ckpt):
    (ckpt / "new.txt").write_text("n")
    r = run_py(["-m", "repro.checkpoint", "manifest", str(ckpt), "--no-progress"])
    assert r.returncode == 0, r.stderr
    assert "4 files" in r.stdout
    assert verify(ckpt).ok


def test_2gib_sparse_file_verifies_with_bounded_rss(tmp_path):
    d = tmp_path / "big"
    d.mkdir()
    with open(d / "shard.safetensors", "wb") as f:
        f.truncate(2 << 30)  # sparse: no disk used, 2 GiB read through sha256
    files = [{"path": "shard.safetensors", "size": 2 << 30, "sha256": ZEROS_2GIB_SHA256}]
    (d / MANIFEST_NAME).write_text(json.dumps({"schema_version": 1, "files": files,
                                               "manifest_sha256": files_digest(files)}))
    # VmHWM is this process image's peak RSS. (ru_maxrss is not: Linux carries the forking parent's peak
    # across exec, so under a large pytest process it reports the parent's memory.)
    code = ("import re, sys\n"
            "from repro.checkpoint.__main__ import main\n"
            f"rc = main(['verify', {str(d)!r}, '--no-progress'])\n"
            "hwm = re.search(r'VmHWM:\\s+(\\d+) kB', open('/proc/self/status').read()).group(1)\n"
            "print('RSS_KB', hwm)\n"
            "sys.exit(rc)\n")
    r = subprocess.run([sys.executable, "-c", code], env=env_with_repo(), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rss_mb = int(r.stdout.split("RSS_KB")[1].split()[0]) / 1024
    assert rss_mb < 200, f"peak RSS {rss_mb:.0f} MB while hashing 2 GiB"


def test_require_verified_catches_changes_after_verification(ckpt, tmp_path):
    stamp = tmp_path / "stamp.json"
    assert verify_cli(ckpt, "--stamp", str(stamp)).returncode == 0
    from repro.checkpoint.verify import rerun_trigger
    assert rerun_trigger(ckpt, stamp) == "ok"
    target = ckpt / "config.json"
    target.write_text(target.read_text().replace("llada2_moe", "llada2_mof"))  # same size, new content
    assert rerun_trigger(ckpt, stamp).startswith("changed:")
    with pytest.raises(ManifestError, match="changed: config.json"):
        require_verified(ckpt, stamp)


def test_byte_changed_with_mtime_put_back_is_hashed_again_and_stays_failed_until_restored(ckpt, tmp_path):
    """Size and mtime as verified, one byte different (os.utime put the mtime back): the inode change time gives
    it away, the folder is hashed again and fails; the stamp goes, a .FAILED marker keeps the report (so a later
    check looks again), and the restored file verifies again with the marker dropped."""
    import os

    from repro.checkpoint.verify import failed_marker, refresh_stale_stamp, rerun_trigger
    stamp = tmp_path / "stamp.json"
    assert verify_cli(ckpt, "--stamp", str(stamp)).returncode == 0
    target = ckpt / "config.json"
    original, st = target.read_bytes(), target.stat()
    target.write_bytes(original.replace(b"llada2_moe", b"llada2_mof"))
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert rerun_trigger(ckpt, stamp).startswith("changed:")
    assert refresh_stale_stamp(ckpt, stamp) == "failed" and not stamp.exists()
    assert "altered: config.json" in failed_marker(stamp).read_text()
    assert refresh_stale_stamp(ckpt, stamp) == "failed"  # still bad: checked again, not forgotten
    target.write_bytes(original)
    assert refresh_stale_stamp(ckpt, stamp) == "refreshed" and stamp.exists() and not failed_marker(stamp).exists()
    assert rerun_trigger(ckpt, stamp) == "ok"


SNAKEFILE = """
import sys
from repro.checkpoint.verify import rerun_trigger
rule download:
    output: directory("ckpt")
    shell: "{sys.executable} -m repro.checkpoint download --name t --local-path src --out {output}"
rule verify:
    input: "ckpt"
    output: "verified.json"
    params: trigger=lambda wc: rerun_trigger("ckpt", "verified.json")
    shell: "{sys.executable} -m repro.checkpoint verify {input} --stamp {output} --no-progress"
rule generate:
    input: v="verified.json", c="ckpt"
    output: "gen.txt"
    shell: "echo generated >> {output}"
"""


def test_workflow_byte_flip_reruns_verify_and_blocks_generation(tmp_path):
    """The verify rule pattern proposed for workflow/rules/checkpoints.smk, in a 3-rule workflow."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "w.safetensors").write_bytes(os.urandom(50_000))
    (src / "config.json").write_text("{}")
    write_manifest(src)
    (tmp_path / "Snakefile").write_text(SNAKEFILE)
    smk = [str(os.path.join(os.path.dirname(sys.executable), "snakemake")), "gen.txt", "--cores", "1"]

    def run():
        return subprocess.run(smk, cwd=tmp_path, env=env_with_repo(), capture_output=True, text=True, timeout=120)

    assert run().returncode == 0
    r = run()
    assert r.returncode == 0 and "Nothing to be done" in r.stdout + r.stderr  # unchanged: a no-op rerun
    w = tmp_path / "ckpt" / "w.safetensors"
    data = bytearray(w.read_bytes())
    data[100] ^= 0xFF
    (tmp_path / "ckpt" / "w.safetensors").unlink()  # (a new file: the source shares the hard link)
    w.write_bytes(bytes(data))
    r = run()
    assert r.returncode != 0
    assert "altered: w.safetensors: sha256" in r.stdout + r.stderr
    assert (tmp_path / "gen.txt").read_text() == "generated\n"  # generation did not run again
    assert not (tmp_path / "verified.json").exists()
