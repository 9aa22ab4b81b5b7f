"""download: local path, pre-seeded hub cache offline, unreachable hub -> exit 3 with pre-seed advice."""

from __future__ import annotations

import json
import os

from plumbing_util import run_py
from repro.checkpoint.manifest import MANIFEST_NAME, write_manifest
from repro.checkpoint.verify import verify

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def fake_hub_cache(root):
    """A hub cache laid out as huggingface_hub writes it (blobs + snapshot symlinks + refs/main)."""
    repo = root / "models--org--tiny"
    snap = repo / "snapshots" / COMMIT
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    for name, data in (("config.json", b'{"model_type": "llada2_moe"}'), ("model.safetensors", os.urandom(5000))):
        blob = repo / "blobs" / f"blob-{name}"
        blob.write_bytes(data)
        os.symlink(os.path.relpath(blob, snap), snap / name)
    return root


def download(*args, **env):
    return run_py(["-m", "repro.checkpoint", "download", *args], **env)


def test_local_path_copies_and_keeps_shipped_manifest(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text("{}")
    (src / "w.safetensors").write_bytes(os.urandom(1000))
    man = write_manifest(src)
    out = tmp_path / "work" / "hf" / "m"
    r = download("--name", "m", "--local-path", str(src), "--out", str(out), "--stamp", str(tmp_path / "d.json"))
    assert r.returncode == 0, r.stderr
    info = json.loads((tmp_path / "d.json").read_text())
    assert info["source"] == "local" and info["manifest_origin"] == "repository"
    assert info["manifest_sha256"] == man["manifest_sha256"]
    assert verify(out).ok
    assert not [p for p in out.parent.iterdir() if p.name != "m"]  # no temp dirs left


def test_offline_from_preseeded_cache(tmp_path):
    cache = fake_hub_cache(tmp_path / "cache")
    out = tmp_path / "hf" / "tiny"
    r = download("--name", "tiny", "--repo-id", "org/tiny", "--revision", "main", "--out", str(out),
                 "--cache-dir", str(cache), "--stamp", str(tmp_path / "d.json"), HF_HUB_OFFLINE="1")
    assert r.returncode == 0, r.stderr
    info = json.loads((tmp_path / "d.json").read_text())
    assert info["resolved_commit"] == COMMIT and info["manifest_origin"] == "generated"
    assert "not a commit hash" in r.stderr  # 'main' moves: warned
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint_manifest.json", "config.json",
                                                     "model.safetensors"]
    assert not (out / "config.json").is_symlink()
    assert verify(out).ok
    # the same revision pinned by commit works the same way, without the warning
    r = download("--name", "tiny", "--repo-id", "org/tiny", "--revision", COMMIT, "--out", str(out),
                 "--cache-dir", str(cache), HF_HUB_OFFLINE="1")
    assert r.returncode == 0 and "not a commit hash" not in r.stderr


def test_offline_not_cached_says_how_to_preseed(tmp_path):
    r = download("--name", "x", "--repo-id", "org/absent", "--revision", COMMIT, "--out", str(tmp_path / "o"),
                 "--cache-dir", str(tmp_path / "cache"), HF_HUB_OFFLINE="1")
    assert r.returncode == 3
    assert "HF_HUB_OFFLINE=1" in r.stderr and "pre-seed" in r.stderr and "hf download org/absent" in r.stderr
    assert not (tmp_path / "o").exists()


def test_unreachable_hub_falls_back_to_cache_or_fails_clearly(tmp_path):
    cache = fake_hub_cache(tmp_path / "cache")
    dead = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "0"}  # connection refused at once
    r = download("--name", "tiny", "--repo-id", "org/tiny", "--revision", COMMIT, "--out", str(tmp_path / "a"),
                 "--cache-dir", str(cache), **dead)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "a" / MANIFEST_NAME).is_file()
    # (a branch revision: huggingface_hub fails at once; an uncached commit costs ~23 s of its own retries)
    r = download("--name", "y", "--repo-id", "org/other", "--revision", "main", "--out", str(tmp_path / "b"),
                 "--cache-dir", str(cache), **dead)
    assert r.returncode == 3
    assert "cannot be reached" in r.stderr and "pre-seed" in r.stderr


def test_bad_local_path(tmp_path):
    r = download("--name", "z", "--local-path", str(tmp_path / "nope"), "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and "not a directory" in r.stderr
