"""Apptainer images: render the definition files, build them with spython's client, record their sha256.

Commands::

    python -m repro.containers render NAME --out X.def [--allow-unpinned]
    python -m repro.containers build  NAME --def X.def --sif Y.sif --sidecar Y.sif.json
    python -m repro.containers check                  # is an apptainer/singularity binary usable?

Contract
--------
* ``containers/images.yaml`` lists each image (``base``, ``digest``, ``gpu``); ``containers/<NAME>.def.j2``
  is its jinja2 template, rendered with ``stack`` = :data:`repro.stack.TESTED` (the engine image pins
  exactly those torch/Triton versions). ``render`` writes a byte-stable ``.def`` whose ``From:`` is ``base@digest``. The
  digests are NOT filled in (no registry access where this was written; see images.yaml): without a
  digest, ``render`` exits 2 naming the fix, unless ``--allow-unpinned`` / ``REPRO_ALLOW_UNPINNED_BASE=1``,
  which renders ``From: base`` and marks the image unpinned.
* ``build`` drives ``spython.main.Client.build`` with the measured workarounds (docs/workflow.md §1.5):
  spython runs a binary literally named ``singularity``; when only ``apptainer`` is on PATH a private
  ``singularity -> apptainer`` symlink directory is put first on PATH for the call. ``sudo=False``,
  ``options=["--fakeroot"]``, always an explicit ``image=``. spython returns ``None`` (and raises nothing)
  when the build fails: that, or a missing/empty output, raises ``ContainerError``. The image is built to
  a temp name beside the target and renamed (atomic). The build runs with the checkout as working
  directory (the definitions' ``%files`` paths are relative to it); ``APPTAINER_CACHEDIR`` /
  ``APPTAINER_TMPDIR`` default to ``<sif dir>/.apptainer-{cache,tmp}`` so multi-GB layers stay off $HOME.
* The sidecar JSON (atomic): ``{image, sif, sif_sha256, size, def_sha256, base, base_digest, base_pinned,
  apptainer_version, build_command}``.
* ``apptainer_binary()`` / ``require_apptainer()``: the workflow calls these when ``containers.enabled`` is
  true, so a machine without Apptainer stops with a clear message instead of running natively by surprise.

Nothing here runs containers; the workflow does that (``--sdm apptainer``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import jinja2
import yaml

from repro.checkpoint.manifest import atomic_write_bytes, sha256_file, write_json
from repro.stack import TESTED

REPO_ROOT = Path(__file__).resolve().parent.parent
CONTAINERS = REPO_ROOT / "containers"
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


class ContainerError(RuntimeError):
    """An image cannot be rendered or built; the message names the file and the fix."""


def load_images(path: Path | None = None) -> dict:
    path = path or CONTAINERS / "images.yaml"
    data = yaml.safe_load(path.read_text())
    images = data.get("images") if isinstance(data, dict) else None
    if not isinstance(images, dict) or not images:
        raise ContainerError(f"{path}: expected a mapping `images: {{NAME: {{base, digest, gpu}}}}`")
    for name, spec in images.items():
        if not isinstance(spec, dict) or not isinstance(spec.get("base"), str):
            raise ContainerError(f"{path}: images.{name}.base must be an image reference like "
                                 "docker.io/library/python:3.11-slim-bookworm")
        d = spec.get("digest")
        if d is not None and not DIGEST_RE.match(str(d)):
            raise ContainerError(f"{path}: images.{name}.digest = {d!r}; expected 'sha256:<64 hex>' or null")
    return images


def allow_unpinned_env() -> bool:
    return os.environ.get("REPRO_ALLOW_UNPINNED_BASE", "") in ("1", "true", "yes")


def render_def(name: str, allow_unpinned: bool = False, containers_dir: Path | None = None) -> tuple[str, dict]:
    """Return ``(def_text, info)`` for image ``name``; refuses an unpinned base unless allowed."""
    cdir = containers_dir or CONTAINERS
    images = load_images(cdir / "images.yaml")
    if name not in images:
        raise ContainerError(f"{cdir / 'images.yaml'}: no image {name!r}; available: {', '.join(sorted(images))}")
    spec = images[name]
    base, digest = spec["base"], spec.get("digest")
    if digest is None and not allow_unpinned:
        raise ContainerError(
            f"{cdir / 'images.yaml'}: images.{name}.digest is not set, so the base image {base} is not pinned. "
            f"Look the digest up on a machine with registry access (skopeo inspect docker://{base.split('docker.io/')[-1]}"
            " | jq -r .Digest) and write it there, or set REPRO_ALLOW_UNPINNED_BASE=1 to build from the moving "
            "tag (recorded as base_pinned: false)")
    from_ref = f"{base}@{digest}" if digest else base
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(cdir)), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True)
    text = env.get_template(f"{name}.def.j2").render(from_ref=from_ref, base=base, digest=digest, stack=TESTED)
    if not text.startswith("Bootstrap:"):
        raise ContainerError(f"{cdir / (name + '.def.j2')}: 'Bootstrap:' must be the first line")
    return text, {"image": name, "base": base, "base_digest": digest, "base_pinned": digest is not None,
                  "gpu": bool(spec.get("gpu"))}


def apptainer_binary() -> str | None:
    """Path of ``apptainer`` (preferred) or ``singularity`` on PATH, else None."""
    return shutil.which("apptainer") or shutil.which("singularity")


def require_apptainer() -> str:
    b = apptainer_binary()
    if b is None:
        raise ContainerError("containers.enabled is true but neither `apptainer` nor `singularity` is on PATH. "
                             "Install Apptainer (>= 1.1, https://apptainer.org/docs/admin/main/installation.html) "
                             "or set `containers: {enabled: false}` in config.yaml to run natively")
    return b


def apptainer_version(binary: str) -> str:
    try:
        r = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60)
        return (r.stdout or r.stderr).strip()
    except OSError as e:
        return f"unknown ({e})"


def build_image(name: str, def_path: str | os.PathLike, sif: str | os.PathLike, sidecar: str | os.PathLike,
                fakeroot: bool = True) -> dict:
    """Build ``sif`` from ``def_path`` through spython; write the sidecar; return it (see module docstring)."""
    from spython.main import Client

    def_path, sif, sidecar = Path(def_path).resolve(), Path(sif).resolve(), Path(sidecar)
    if not def_path.is_file():
        raise ContainerError(f"{def_path}: no definition file; render it with `python -m repro.containers render "
                             f"{name} --out {def_path}`")
    binary = require_apptainer()
    sif.parent.mkdir(parents=True, exist_ok=True)
    tmp_sif = sif.with_name(f".{sif.stem}.tmp-{os.getpid()}.sif")
    shim = None
    env_backup = dict(os.environ)
    cwd = os.getcwd()
    try:
        if shutil.which("singularity") is None:  # spython hard-codes the binary name `singularity`
            shim = tempfile.mkdtemp(prefix="repro-singularity-shim-")
            os.symlink(binary, os.path.join(shim, "singularity"))
            os.environ["PATH"] = shim + os.pathsep + os.environ.get("PATH", "")
        for var, sub in (("APPTAINER_CACHEDIR", ".apptainer-cache"), ("APPTAINER_TMPDIR", ".apptainer-tmp")):
            if not os.environ.get(var):
                os.environ[var] = str(sif.parent / sub)
                Path(os.environ[var]).mkdir(parents=True, exist_ok=True)
        options = ["--fakeroot"] if fakeroot else []
        os.chdir(REPO_ROOT)  # %files paths in the definitions are relative to the checkout
        result = Client.build(recipe=str(def_path), image=str(tmp_sif), sudo=False, options=options,
                              force=True, quiet=False)
        if result is None or not tmp_sif.is_file() or tmp_sif.stat().st_size == 0:
            raise ContainerError(f"building {sif.name} from {def_path} failed (spython returned {result!r}; see "
                                 "the apptainer output above). Common fixes: enable unprivileged user namespaces "
                                 "or subuid mappings for --fakeroot, or build on a host where you have root")
        os.replace(tmp_sif, sif)
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env_backup)
        if shim:
            shutil.rmtree(shim, ignore_errors=True)
        if tmp_sif.exists():
            tmp_sif.unlink()
    text = def_path.read_text()
    m = re.search(r"^From:\s*(\S+)", text, re.M)
    from_ref = m.group(1) if m else ""
    base, _, digest = from_ref.partition("@")
    info = {"image": name, "sif": str(sif), "sif_sha256": sha256_file(sif), "size": sif.stat().st_size,
            "def_sha256": sha256_file(def_path), "base": base, "base_digest": digest or None,
            "base_pinned": bool(digest), "apptainer_version": apptainer_version(binary),
            "build_command": ["singularity", "build", "--force", *options, str(sif), str(def_path)]}
    write_json(sidecar, info)
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m repro.containers", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("render", help="render containers/<name>.def.j2 to a .def")
    r.add_argument("name")
    r.add_argument("--out", required=True)
    r.add_argument("--allow-unpinned", action="store_true", default=None,
                   help="render From: <tag> when no digest is pinned (default: $REPRO_ALLOW_UNPINNED_BASE)")
    b = sub.add_parser("build", help="build a .sif from a rendered .def (spython, --fakeroot)")
    b.add_argument("name")
    b.add_argument("--def", dest="def_path", required=True)
    b.add_argument("--sif", required=True)
    b.add_argument("--sidecar", required=True)
    b.add_argument("--no-fakeroot", action="store_true", help="build as root (no --fakeroot)")
    sub.add_parser("check", help="exit 0 if apptainer/singularity is on PATH")
    a = ap.parse_args(argv)
    try:
        if a.cmd == "render":
            allow = allow_unpinned_env() if a.allow_unpinned is None else a.allow_unpinned
            text, info = render_def(a.name, allow_unpinned=allow)
            atomic_write_bytes(a.out, text.encode())
            if not info["base_pinned"]:
                print(f"containers: WARNING: {a.name}: base image {info['base']} is NOT pinned by digest",
                      file=sys.stderr)
            print(f"rendered {a.out} (From: {info['base']}{'@' + info['base_digest'] if info['base_pinned'] else ''})")
        elif a.cmd == "build":
            info = build_image(a.name, a.def_path, a.sif, a.sidecar, fakeroot=not a.no_fakeroot)
            print(f"built {info['sif']} sha256 {info['sif_sha256']}")
        else:
            b = require_apptainer()
            print(f"{b}: {apptainer_version(b)}")
    except ContainerError as e:
        print(f"containers: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
