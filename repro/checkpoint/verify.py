"""Verify a checkpoint directory against its `checkpoint_manifest.json`; write the verified stamp.

Contract
--------
``verify(ckpt_dir, manifest_path=None, jobs=None, progress=None, expect_manifest_sha256=None)`` returns
a ``VerifyReport``. It

1. loads the manifest (default ``<ckpt_dir>/checkpoint_manifest.json``), validates its schema and checks
   that its ``manifest_sha256`` matches its ``files`` list (an edited manifest is reported, not trusted);
   with ``expect_manifest_sha256`` (e.g. pinned in config) the manifest must also carry that value;
2. lists the files on disk (``repro.checkpoint.manifest.list_files``: everything except the manifest and
   ``.cache/``) and reports **missing** files (in the manifest, not on disk) and **extra** files (on disk,
   not in the manifest) by name;
3. compares sizes first (a size mismatch is reported without hashing), then streams every remaining file
   through sha256 (flat memory, several files in parallel, a tqdm bar over bytes) and reports **altered**
   files with the expected and actual values.

``write_stamp`` writes the stamp JSON atomically (the workflow's verify-rule output; generation rules take
it as input, so generation never starts on an unverified checkpoint)::

    {"schema_version": 1, "checkpoint": "<abs dir>", "manifest": "<abs manifest path>",
     "manifest_sha256": "...", "files": N, "bytes": B, "verified_at": "<UTC ISO-8601>",
     "seconds": s, "tool": "repro.checkpoint.verify", "stat_fingerprint": "<sha256>",
     "stat": {"<rel path>": [size, mtime_ns, ctime_ns, inode], ...}}

On failure the CLI removes a stale stamp at the same path, so an old stamp can never vouch for a changed
directory.

A file edited *after* verification changes nothing Snakemake sees (a directory input's mtime does not
move when a file inside it is rewritten). Two cheap guards close that gap without re-hashing:

* ``rerun_trigger(dir, stamp)``: ``"ok"`` while the stamp is absent or every file still has the size,
  mtime, inode change time and inode recorded in the stamp; ``"changed:<stat fingerprint>"`` otherwise.
  At start-up the workflow
  (workflow/rules/common.smk) verifies a checkpoint whose stamp is not "ok" again by content: a fresh stamp
  when it passes (a touched file, a copied work directory), the stamp removed when it fails (a byte flip),
  and the run stops naming the files and the fix (``refresh_stale_stamp``, ``failed_marker``: later runs check
  that folder again until it is repaired or deleted). An unchanged checkpoint keeps "ok", so reruns stay
  no-ops. (``stat_fingerprint(dir)`` is the sha256 over every file's (path, size, mtime_ns).)
* ``require_verified(ckpt_dir, stamp)`` (for the generation step): the stamp exists, names the
  manifest_sha256 the manifest carries now, and every file still has the size and mtime it had when it
  was verified (not the inode change time, which a hard link made by another download also moves); otherwise it raises naming the changed files.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import jsonschema

from .manifest import MANIFEST_NAME, MANIFEST_SCHEMA, files_digest, hash_files, list_files, write_json

STAMP_SCHEMA_VERSION = 1


class ManifestError(ValueError):
    """The manifest is missing, unreadable or inconsistent; the message names the file and the fix."""


@dataclass
class VerifyReport:
    checkpoint: Path
    manifest_path: Path
    manifest_sha256: str = ""
    n_files: int = 0
    n_bytes: int = 0
    seconds: float = 0.0
    missing: list[dict] = field(default_factory=list)   # {path, size, sha256} expected
    extra: list[dict] = field(default_factory=list)     # {path, size}
    altered: list[dict] = field(default_factory=list)   # {path, field, expected, actual}

    @property
    def ok(self) -> bool:
        return not (self.missing or self.extra or self.altered)

    def lines(self) -> list[str]:
        """Human-readable result, one problem per line, every file by name."""
        if self.ok:
            return [f"verify {self.checkpoint}: OK ({self.n_files} files, {self.n_bytes} bytes, "
                    f"manifest_sha256 {self.manifest_sha256}, {self.seconds:.1f} s)"]
        out = [f"verify {self.checkpoint}: FAILED against {self.manifest_path} "
               f"({len(self.missing)} missing, {len(self.extra)} extra, {len(self.altered)} altered)"]
        for m in self.missing:
            out.append(f"  missing: {m['path']} (expected size {m['size']}, sha256 {m['sha256']})")
        for e in self.extra:
            out.append(f"  extra:   {e['path']} (size {e['size']}; not in the manifest)")
        for a in self.altered:
            out.append(f"  altered: {a['path']}: {a['field']} expected {a['expected']}, actual {a['actual']}")
        out.append("  fix: re-download the checkpoint (python -m repro.checkpoint download ...) or restore the "
                   "named files; if the change is intended, rewrite the manifest on a trusted copy with "
                   "`python -m repro.checkpoint manifest DIR`")
        return out


def load_manifest(path: str | Path, expect_manifest_sha256: str | None = None) -> dict:
    """Read and check a manifest; raise ``ManifestError`` naming the file and the fix."""
    path = Path(path)
    if not path.is_file():
        raise ManifestError(f"{path}: no checkpoint manifest. Write one on a trusted copy with "
                            f"`python -m repro.checkpoint manifest {path.parent}` (download does this "
                            "when the repository ships none)")
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ManifestError(f"{path}: not valid JSON ({e}); rewrite it with "
                            f"`python -m repro.checkpoint manifest {path.parent}` on a trusted copy") from None
    errors = list(jsonschema.Draft202012Validator(MANIFEST_SCHEMA).iter_errors(manifest))
    if errors:
        msgs = "; ".join(f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}" for e in errors[:5])
        raise ManifestError(f"{path}: does not match the manifest schema (version 1): {msgs}")
    paths = [f["path"] for f in manifest["files"]]
    if len(set(paths)) != len(paths):
        dup = sorted({p for p in paths if paths.count(p) > 1})
        raise ManifestError(f"{path}: lists these paths more than once: {', '.join(dup)}")
    actual = files_digest(manifest["files"])
    if actual != manifest["manifest_sha256"]:
        raise ManifestError(f"{path}: manifest_sha256 expected {manifest['manifest_sha256']}, actual {actual} "
                            "(the manifest's file list was edited); restore the manifest from the source")
    if expect_manifest_sha256 and manifest["manifest_sha256"] != expect_manifest_sha256:
        raise ManifestError(f"{path}: manifest_sha256 expected {expect_manifest_sha256} (pinned), actual "
                            f"{manifest['manifest_sha256']}; this is not the pinned checkpoint: repair or replace "
                            "its files from the pinned source, or, if this checkpoint is the one you mean to use, "
                            f"pin it: set manifest_sha256: {manifest['manifest_sha256']} in the model's source "
                            "(config.yaml or your overlay)")
    return manifest


def verify(ckpt_dir: str | Path, manifest_path: str | Path | None = None, jobs: int | None = None,
           progress: bool | None = None, expect_manifest_sha256: str | None = None) -> VerifyReport:
    """Check every file of ``ckpt_dir`` against the manifest (see the module docstring)."""
    t0 = time.perf_counter()
    root = Path(ckpt_dir)
    if not root.is_dir():
        raise ManifestError(f"{root}: checkpoint directory does not exist; download it first "
                            "(python -m repro.checkpoint download ...)")
    mpath = Path(manifest_path) if manifest_path else root / MANIFEST_NAME
    manifest = load_manifest(mpath, expect_manifest_sha256)
    rep = VerifyReport(root.resolve(), mpath.resolve(), manifest["manifest_sha256"])
    expected = {f["path"]: f for f in manifest["files"]}
    on_disk = set(list_files(root))
    rep.missing = [expected[p] for p in sorted(set(expected) - on_disk)]
    rep.extra = [{"path": p, "size": (root / p).stat().st_size} for p in sorted(on_disk - set(expected))]
    to_hash = []
    for p in sorted(set(expected) & on_disk):
        size = (root / p).stat().st_size
        if size != expected[p]["size"]:
            rep.altered.append({"path": p, "field": "size", "expected": expected[p]["size"], "actual": size})
        else:
            to_hash.append(p)
    digests = hash_files(root, to_hash, jobs=jobs, progress=progress, desc=f"verify {root.name}")
    for p in to_hash:
        if digests[p] != expected[p]["sha256"]:
            rep.altered.append({"path": p, "field": "sha256", "expected": expected[p]["sha256"],
                                "actual": digests[p]})
    rep.altered.sort(key=lambda a: a["path"])
    rep.n_files = len(expected)
    rep.n_bytes = sum(f["size"] for f in manifest["files"])
    rep.seconds = time.perf_counter() - t0
    return rep


def stat_table(ckpt_dir: str | Path, identity: bool = True) -> dict[str, list[int]]:
    """``{rel path: [size, mtime_ns, ctime_ns, inode]}`` of every file ``list_files`` sees, plus the manifest
    itself (``identity=False``: ``[size, mtime_ns]``). The inode change time catches a file rewritten with its
    size kept and its mtime put back (``os.utime``, ``touch -r``), which size + mtime alone miss: no program
    can set it; the inode catches a file replaced by another. (A copied or restored folder therefore reads as
    changed and is verified again by content, which passes for the same bytes.)"""
    root = Path(ckpt_dir)
    rels = list_files(root) + ([MANIFEST_NAME] if (root / MANIFEST_NAME).is_file() else [])
    out = {}
    for rel in sorted(rels):
        st = (root / rel).stat()
        out[rel] = [st.st_size, st.st_mtime_ns] + ([st.st_ctime_ns, st.st_ino] if identity else [])
    return out


def stat_fingerprint(ckpt_dir: str | Path) -> str:
    """sha256 over (path, size, mtime_ns) of every file; "absent" when the directory does not exist. Size and
    mtime only: this fingerprints a user's local folder in the checkpoint source key
    (repro.provenance.checkpoint_source_key), whose files' inode change times move whenever the pipeline
    hard-links them into its copy (repro.checkpoint.download) -- with them the key would change on every run."""
    if not Path(ckpt_dir).is_dir():
        return "absent"
    blob = json.dumps(stat_table(ckpt_dir, identity=False), sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


def rerun_trigger(ckpt_dir: str | Path, stamp: str | Path) -> str:
    """``"ok"`` unless the files changed since ``stamp`` was written (see the module docstring)."""
    stamp = Path(stamp)
    if not stamp.is_file() or not Path(ckpt_dir).is_dir():
        return "ok"
    try:
        then = json.loads(stamp.read_text()).get("stat")
    except (OSError, json.JSONDecodeError):
        return "changed:unreadable-stamp"
    if then is None:
        return "ok"
    now = stat_table(ckpt_dir)
    if now == {k: list(v) for k, v in then.items()}:
        return "ok"
    return "changed:" + stat_fingerprint(ckpt_dir)


def stamp_dict(rep: VerifyReport) -> dict:
    table = stat_table(rep.checkpoint)
    fp = hashlib.sha256(json.dumps(table, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    return {"schema_version": STAMP_SCHEMA_VERSION, "checkpoint": str(rep.checkpoint),
            "manifest": str(rep.manifest_path), "manifest_sha256": rep.manifest_sha256,
            "files": rep.n_files, "bytes": rep.n_bytes,
            "verified_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "seconds": round(rep.seconds, 3), "tool": "repro.checkpoint.verify",
            "stat_fingerprint": fp, "stat": table}


def write_stamp(rep: VerifyReport, stamp: str | Path) -> dict:
    """Atomically write the stamp of a successful verification; refuse a failed report."""
    if not rep.ok:
        raise ValueError("refusing to stamp a checkpoint that failed verification")
    d = stamp_dict(rep)
    write_json(stamp, d)
    failed_marker(stamp).unlink(missing_ok=True)  # the folder verifies now
    return d


def require_verified(ckpt_dir: str | Path, stamp: str | Path) -> dict:
    """Raise ``ManifestError`` unless ``stamp`` vouches for the manifest ``ckpt_dir`` carries now."""
    stamp = Path(stamp)
    if not stamp.is_file():
        raise ManifestError(f"{stamp}: no verified stamp; run `python -m repro.checkpoint verify {ckpt_dir} "
                            f"--stamp {stamp}` first (generation never starts on an unverified checkpoint)")
    s = json.loads(stamp.read_text())
    m = json.loads((Path(ckpt_dir) / MANIFEST_NAME).read_text())
    if s.get("manifest_sha256") != m.get("manifest_sha256"):
        raise ManifestError(f"{stamp}: manifest_sha256 expected {m.get('manifest_sha256')} (current manifest "
                            f"of {ckpt_dir}), actual {s.get('manifest_sha256')}; verify again")
    if "stat" in s:
        # size and mtime only: the inode change time also moves when another model's download hard-links the
        # same hub blob (repro.checkpoint.download) while this run generates; the start-up check
        # (rerun_trigger, every field) re-hashes such a folder before the next run plans its jobs
        now = stat_table(ckpt_dir, identity=False)
        then = {k: list(v)[:2] for k, v in s["stat"].items()}
        changed = sorted(k for k in set(now) & set(then) if now[k] != then[k])
        gone, new = sorted(set(then) - set(now)), sorted(set(now) - set(then))
        if changed or gone or new:
            parts = ([f"changed: {', '.join(changed)}"] if changed else []) + \
                    ([f"missing: {', '.join(gone)}"] if gone else []) + ([f"extra: {', '.join(new)}"] if new else [])
            raise ManifestError(f"{ckpt_dir}: files differ from when {stamp} was written ({'; '.join(parts)}); "
                                f"run `python -m repro.checkpoint verify {ckpt_dir} --stamp {stamp}` again")
    return s


def failed_marker(stamp: str | Path) -> Path:
    """``<stamp>.FAILED``: written beside a stamp that :func:`refresh_stale_stamp` removed because the folder
    failed verification (its report lines), so later runs keep checking that folder until it is repaired or
    deleted; removed when a stamp is written again (:func:`write_stamp`)."""
    stamp = Path(stamp)
    return stamp.with_name(stamp.name + ".FAILED")


def refresh_stale_stamp(ckpt_dir: str | Path, stamp: str | Path, expect_manifest_sha256: str | None = None) -> str:
    """Check a folder again by content when its stamp no longer vouches for it: the stamp's recorded file
    sizes, mtimes, ctimes and inodes differ (:func:`rerun_trigger`), or an earlier check failed
    (:func:`failed_marker` exists). Returns ``"ok"`` (nothing to do: no stamp and no marker, or files
    unchanged), ``"refreshed"`` (they verify: a fresh stamp, so nothing reading the folder re-runs),
    ``"gone"`` (a failed folder was deleted: the marker is dropped; the next job that needs the folder fetches
    and verifies it again) or ``"failed"`` (they fail, or the manifest is unusable: the stamp is deleted and the
    marker holds the report, one problem per line, every file by name)."""
    stamp, marker = Path(stamp), failed_marker(stamp)
    if marker.is_file() and not stamp.is_file():
        if not Path(ckpt_dir).is_dir():
            marker.unlink(missing_ok=True)
            return "gone"
    elif not stamp.is_file() or rerun_trigger(ckpt_dir, stamp) == "ok":
        if stamp.is_file():
            marker.unlink(missing_ok=True)
        return "ok"
    try:
        rep = verify(ckpt_dir, expect_manifest_sha256=expect_manifest_sha256)
        lines = [line for line in rep.lines() if not line.lstrip().startswith("fix:")]
    except (ManifestError, OSError) as e:
        rep, lines = None, [f"verify {ckpt_dir}: FAILED: {e}"]
    if rep is not None and rep.ok:
        write_stamp(rep, stamp)
        return "refreshed"
    stamp.unlink(missing_ok=True)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text("\n".join(lines) + "\n")
    return "failed"
