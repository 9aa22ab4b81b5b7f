"""Apptainer definitions parse with spython; the build command line, checked with a stub `apptainer`."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from spython.main.parse.parsers import SingularityParser

from plumbing_util import ROOT, run_py
from repro.containers import ContainerError, build_image, load_images, render_def

STUB = """#!/bin/sh
echo "$(basename "$0") $*" >> "$STUB_LOG"
case "$1" in --version) echo "apptainer version 1.3.4"; exit 0;; esac
if [ "$1" = build ] && [ -z "$STUB_FAIL" ]; then eval "out=\\${$(($#-1))}"; echo image-bytes > "$out"; fi
[ -n "$STUB_FAIL" ] && exit 255
exit 0
"""


@pytest.fixture
def stub_apptainer(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "apptainer").write_text(STUB)
    (bindir / "apptainer").chmod(0o755)
    log = tmp_path / "apptainer.log"
    # only the stub's directory and the system dirs: no real apptainer/singularity can be found
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    monkeypatch.setenv("STUB_LOG", str(log))
    return log


@pytest.mark.parametrize("name", sorted(load_images()))
def test_definitions_render_and_parse_with_spython(name, tmp_path):
    with pytest.raises(ContainerError, match="not pinned"):
        render_def(name)  # the digests are not filled in: refused unless explicitly allowed
    text, info = render_def(name, allow_unpinned=True)
    assert text == render_def(name, allow_unpinned=True)[0]  # byte-stable
    assert info["base_pinned"] is False
    f = tmp_path / f"{name}.def"
    f.write_text(text)
    recipe = SingularityParser(str(f)).recipe["spython-base"]
    assert recipe.fromHeader == info["base"]
    assert [f.split()[0] for f in recipe.files] == ["pyproject.toml", "repro"]  # relative to the checkout
    assert all((ROOT / f.split()[0]).exists() for f in recipe.files)
    assert f"org.repro.image {name}" in recipe.labels
    assert recipe.install  # %post parsed
    assert "pip install --no-deps /opt/repro-src" in "\n".join(recipe.install)


def test_pinned_digest_lands_in_from_line(tmp_path):
    cdir = tmp_path / "containers"
    cdir.mkdir()
    for p in (ROOT / "containers").glob("*.def.j2"):
        (cdir / p.name).write_text(p.read_text())
    digest = "sha256:" + "ab" * 32  # a syntactically valid digest made up for this test only
    (cdir / "images.yaml").write_text(f"images:\n  scoring:\n    base: docker.io/library/python:3.11-slim\n"
                                      f"    digest: '{digest}'\n    gpu: false\n")
    text, info = render_def("scoring", containers_dir=cdir)
    assert f"From: docker.io/library/python:3.11-slim@{digest}\n" in text and info["base_pinned"]
    (cdir / "images.yaml").write_text("images:\n  scoring:\n    base: x\n    digest: latest\n")
    with pytest.raises(ContainerError, match="sha256:<64 hex>"):
        render_def("scoring", containers_dir=cdir)


def test_build_command_line_with_stub_apptainer(stub_apptainer, tmp_path):
    d = tmp_path / "engine.def"
    d.write_text(render_def("engine", allow_unpinned=True)[0])
    sif, side = tmp_path / "images" / "engine.sif", tmp_path / "images" / "engine.sif.json"
    info = build_image("engine", d, sif, side)
    calls = stub_apptainer.read_text().splitlines()
    build = [c for c in calls if " build " in f" {c} "]
    assert len(build) == 1
    argv = build[0].split()
    # spython calls `singularity`: our shim maps it to the apptainer binary; no sudo; --fakeroot
    assert argv[:4] == ["singularity", "build", "--force", "--fakeroot"]
    assert argv[-1] == str(d.resolve()) and argv[-2].endswith(".sif") and argv[-2] != str(sif)
    assert sif.read_bytes() == b"image-bytes\n"
    meta = json.loads(side.read_text())
    import hashlib
    assert meta["sif_sha256"] == hashlib.sha256(b"image-bytes\n").hexdigest() == info["sif_sha256"]
    assert meta["apptainer_version"] == "apptainer version 1.3.4" and meta["base_pinned"] is False
    assert not [p for p in sif.parent.iterdir() if p.name.startswith(".engine.tmp")]


def test_failed_build_raises(stub_apptainer, tmp_path, monkeypatch):
    monkeypatch.setenv("STUB_FAIL", "1")
    d = tmp_path / "scoring.def"
    d.write_text(render_def("scoring", allow_unpinned=True)[0])
    with pytest.raises(ContainerError, match="failed"):
        build_image("scoring", d, tmp_path / "s.sif", tmp_path / "s.sif.json")
    assert not (tmp_path / "s.sif").exists() and not (tmp_path / "s.sif.json").exists()


def test_no_apptainer_clear_message(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    d = tmp_path / "x.def"
    d.write_text("Bootstrap: docker\nFrom: x\n")
    with pytest.raises(ContainerError, match="neither `apptainer` nor `singularity`"):
        build_image("scoring", d, tmp_path / "s.sif", tmp_path / "s.sif.json")
    r = run_py(["-m", "repro.containers", "check"], PATH=str(tmp_path))
    assert r.returncode == 2 and "containers.enabled" in r.stderr
