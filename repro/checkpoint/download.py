"""Fetch a checkpoint into ``$ORL_EVAL_WORK/hf/<name>`` from the Hugging Face hub, its cache, or a local path.

Command::

    python -m repro.checkpoint download --name NAME --repo-id ID --revision REV --out DIR \
        [--local-path PATH] [--cache-dir DIR] [--stamp FILE]

Contract
--------
All three sources go through the same two steps, so online, offline and local runs behave alike:

1. **Snapshot.** ``--local-path PATH``: the folder itself. Otherwise
   ``huggingface_hub.snapshot_download(repo_id, revision=REV, cache_dir=...)`` (a commit revision already in
   the cache is used without contacting the hub: it is immutable): downloads into the hub
   cache (``--cache-dir``, else ``$HF_HUB_CACHE`` / ``$HF_HOME/hub``), or, with ``HF_HUB_OFFLINE=1`` or an
   unreachable hub, returns the cached snapshot of that revision. If the revision is in no cache and the hub
   cannot be reached, ``DownloadError`` says how to pre-seed the cache (exit status 3).
2. **Materialise.** Every file of the snapshot (symlinks of the hub cache resolved) is hard-linked, or
   copied when linking is impossible, into ``DIR.tmp-<pid>``, which then replaces ``DIR`` with a rename
   (atomic: a crash never leaves a half-filled ``DIR``). Hard links share storage with the source (the hub
   cache or ``--local-path``): nothing may edit ``DIR`` in place (replace a file instead). If the snapshot carries no
   ``checkpoint_manifest.json``, one is written from the materialised files and the stamp says
   ``"manifest_origin": "generated"`` (it then guards against later corruption, not against a different
   upload: pin its ``manifest_sha256`` in config and pass it to ``verify --expect-manifest-sha256``).

``--stamp FILE`` (atomic JSON): ``{name, repo_id, revision, resolved_commit, source: hub|local,
manifest_origin: repository|generated, manifest_sha256, out, files, bytes}``. A revision that is not a
40-hex commit (e.g. ``main``) is accepted with a warning: branches move, pin a commit for the paper.
Verification is a separate step (``python -m repro.checkpoint verify``).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

from .manifest import MANIFEST_NAME, IGNORED_PREFIXES, write_json, write_manifest

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")


class DownloadError(RuntimeError):
    """The checkpoint could not be obtained; the message says why and how to fix it."""

    exit_code = 2


class HubUnreachable(DownloadError):
    exit_code = 3


def _preseed_help(repo_id: str, revision: str, cache: str) -> str:
    return (f"To pre-seed it: on a machine with network run\n"
            f"    hf download {repo_id} --revision {revision} --cache-dir {cache}\n"
            f"  (older huggingface_hub: huggingface-cli download ...) and copy that folder to {cache} here "
            f"(or point HF_HUB_CACHE / --cache-dir at it), then rerun with HF_HUB_OFFLINE=1;\n"
            f"  or download the files into a folder and use a `local` model source "
            f"(python -m repro.checkpoint download ... --local-path FOLDER).")


def hub_snapshot(repo_id: str, revision: str, cache_dir: str | None = None) -> tuple[Path, str]:
    """Return (snapshot folder, resolved commit) via ``snapshot_download`` (hub, or cache when offline)."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError,
                                        RevisionNotFoundError)

    cache = str(cache_dir or constants.HF_HUB_CACHE)
    offline = bool(constants.HF_HUB_OFFLINE)
    try:
        path = None
        if COMMIT_RE.match(revision):
            # A commit's snapshot is immutable: when the cache has it, use it without asking the hub (fast
            # offline; an unreachable hub otherwise costs ~20 s of connection retries).
            try:
                path = snapshot_download(repo_id, revision=revision, cache_dir=cache, local_files_only=True)
            except LocalEntryNotFoundError:
                path = None
        if path is None:
            path = snapshot_download(repo_id, revision=revision, cache_dir=cache)
    except GatedRepoError as e:
        raise DownloadError(f"{repo_id}: gated repository; accept its terms on huggingface.co and log in "
                            f"(hf auth login / HF_TOKEN). Hub said: {e}") from None
    except RevisionNotFoundError:
        raise DownloadError(f"{repo_id}: revision {revision!r} does not exist on the hub; check the revision "
                            "pinned in config.yaml") from None
    except RepositoryNotFoundError:
        raise DownloadError(f"{repo_id}: repository not found on the hub (or private without a token); check "
                            "repo_id in config.yaml") from None
    except LocalEntryNotFoundError as e:
        why = ("HF_HUB_OFFLINE=1 is set" if offline
               else f"the hub ({constants.ENDPOINT}) cannot be reached from this machine")
        raise HubUnreachable(f"cannot obtain {repo_id}@{revision}: {why}, and that revision is not in the "
                             f"hub cache {cache}.\n  {_preseed_help(repo_id, revision, cache)}\n"
                             f"  (huggingface_hub: {type(e).__name__})") from None
    except Exception as e:  # noqa: BLE001 - other hub/network failures: same fix
        if type(e).__name__ in ("IncompleteSnapshotError", "ConnectError", "ConnectTimeout", "ReadTimeout"):
            raise HubUnreachable(f"cannot obtain a complete snapshot of {repo_id}@{revision} ({type(e).__name__}:"
                                 f" {e}).\n  {_preseed_help(repo_id, revision, cache)}") from None
        raise
    snap = Path(path)
    commit = snap.name if COMMIT_RE.match(snap.name) else revision
    return snap, commit


def _materialise(src: Path, out: Path) -> tuple[int, int]:
    """Hard-link (else copy) every file of ``src`` into a temp dir, then rename it to ``out``."""
    out = out.absolute()
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    n = total = 0
    try:
        for p in sorted(src.rglob("*")):
            rel = p.relative_to(src).as_posix()
            if any(rel.startswith(pre) or rel == pre.rstrip("/") for pre in IGNORED_PREFIXES + (".git/",)):
                continue
            if not p.is_file():
                continue
            real = p.resolve()
            dst = tmp / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(real, dst)
            except OSError:
                shutil.copy2(real, dst)
            n += 1
            total += dst.stat().st_size
        if n == 0:
            raise DownloadError(f"{src}: the snapshot holds no files; check the source")
        old = None
        if out.exists():
            old = out.with_name(f"{out.name}.old-{os.getpid()}")
            os.replace(out, old)
        os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return n, total


def download(name: str, out: str | Path, repo_id: str | None = None, revision: str | None = None,
             local_path: str | Path | None = None, cache_dir: str | None = None,
             stamp: str | Path | None = None, log=print) -> dict:
    """Obtain the checkpoint into ``out`` (see the module docstring); return the stamp dict."""
    out = Path(out)
    if local_path is not None:
        src = Path(local_path)
        if not src.is_dir():
            raise DownloadError(f"--local-path {src}: not a directory; point it at the checkpoint folder "
                                "(the one holding config.json)")
        source, commit = "local", None
    else:
        if not repo_id or not revision:
            raise DownloadError("give --repo-id and --revision (or --local-path)")
        if not COMMIT_RE.match(revision):
            log(f"download: warning: revision {revision!r} is not a commit hash; branches move — pin a "
                "40-hex commit in config.yaml for a reproducible run", file=sys.stderr)
        src, commit = hub_snapshot(repo_id, revision, cache_dir)
        source = "hub"
    n, total = _materialise(src, out)
    origin = "repository"
    if not (out / MANIFEST_NAME).is_file():
        origin = "generated"
        log(f"download: {MANIFEST_NAME} not shipped by the source; writing one from the downloaded files "
            "(pin its manifest_sha256 to detect a different upload later)", file=sys.stderr)
        manifest = write_manifest(out, progress=None)
    else:
        import json

        manifest = json.loads((out / MANIFEST_NAME).read_text())
    info = {"name": name, "repo_id": repo_id, "revision": revision, "resolved_commit": commit,
            "source": source, "local_path": str(Path(local_path).resolve()) if local_path else None,
            "out": str(out.resolve()), "files": n, "bytes": total, "manifest_origin": origin,
            "manifest_sha256": manifest.get("manifest_sha256")}
    if stamp:
        write_json(stamp, info)
    log(f"download {name}: {n} files, {total} bytes from {source} "
        f"{local_path or f'{repo_id}@{commit}'} -> {out} (manifest {origin}, "
        f"manifest_sha256 {info['manifest_sha256']})")
    return info
