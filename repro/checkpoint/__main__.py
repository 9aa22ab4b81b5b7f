"""CLI: ``python -m repro.checkpoint {manifest,verify,download} ...``.

* ``manifest DIR [--jobs N] [--progress|--no-progress]`` — hash every file of DIR and write
  ``DIR/checkpoint_manifest.json`` atomically; prints the manifest_sha256.
* ``verify DIR [--stamp FILE] [--manifest FILE] [--expect-manifest-sha256 HEX] [--copy-of FOLDER] [--jobs N]
  [--progress|--no-progress]`` — see ``repro.checkpoint.verify``. ``--copy-of`` (a local checkpoint): DIR is
  the pipeline's copy of FOLDER; the output says which copy is checked and, on failure, to repair FOLDER
  (the workflow copies it again when a file there changes). Exit 0 and (with ``--stamp``) an atomic
  stamp JSON on success; exit 1 naming every missing / extra / altered file otherwise (a stale stamp is
  removed); exit 2 when the manifest itself is missing or invalid.
* ``download --name NAME (--repo-id ID --revision REV | --local-path DIR) --out DIR [--cache-dir DIR]
  [--stamp FILE]`` — see ``repro.checkpoint.download``; exit 3 when the hub is unreachable and the revision
  is not cached (the message says how to pre-seed).
* ``dequantize --src DIR --out DIR [--source-key JSON] [--verified STAMP]`` — the BF16 checkpoint of an NVFP4
  (ModelOpt) checkpoint, hashed, with ``quant_provenance.json`` (``repro.checkpoint.dequantize``; what the
  SGLang backend loads); ``--source-key``: what DIR is (recorded in the provenance); ``--verified``: refuse a
  DIR this verification stamp does not vouch for. Exit 2 when the source is not an NVFP4 export, is
  unverified, or the key is not JSON.
* ``tiny ...`` — forwarded to ``repro.checkpoint.tiny.main`` when that module exists.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _progress_flag(ap: argparse.ArgumentParser) -> None:
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--progress", dest="progress", action="store_true", default=None,
                   help="always show the tqdm bar (default: only on a terminal)")
    g.add_argument("--no-progress", dest="progress", action="store_false")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "tiny":
        try:
            from .tiny import main as tiny_main  # owned by the engine work; optional here
        except ImportError as e:
            print(f"repro.checkpoint tiny: not available ({e})", file=sys.stderr)
            return 2
        return tiny_main(argv[1:]) or 0

    ap = argparse.ArgumentParser(prog="python -m repro.checkpoint", description="checkpoint manifest, "
                                 "verification and download")
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("manifest", help="write DIR/checkpoint_manifest.json")
    m.add_argument("dir")
    m.add_argument("--jobs", type=int, default=None, help="files hashed in parallel (default min(4, CPUs))")
    _progress_flag(m)
    v = sub.add_parser("verify", help="verify DIR against its manifest; write a stamp on success")
    v.add_argument("dir")
    v.add_argument("--stamp", help="stamp JSON written atomically on success (removed on failure)")
    v.add_argument("--manifest", help="manifest path (default DIR/checkpoint_manifest.json)")
    v.add_argument("--expect-manifest-sha256", help="pinned manifest_sha256 the manifest must carry")
    v.add_argument("--copy-of", help="the user's folder DIR was copied from (named in the messages)")
    v.add_argument("--jobs", type=int, default=None)
    _progress_flag(v)
    d = sub.add_parser("download", help="fetch a checkpoint (hub, hub cache, or local path) into --out")
    d.add_argument("--name", required=True)
    d.add_argument("--repo-id")
    d.add_argument("--revision")
    d.add_argument("--local-path", help="use this folder instead of the hub (config source type: local)")
    d.add_argument("--out", required=True)
    d.add_argument("--cache-dir", help="hub cache (default $HF_HUB_CACHE or $HF_HOME/hub)")
    d.add_argument("--stamp", help="download info JSON written atomically")
    q = sub.add_parser("dequantize", help="write the dequantized BF16 checkpoint of an NVFP4 checkpoint")
    q.add_argument("--src", required=True)
    q.add_argument("--out", required=True)
    q.add_argument("--source-key", help="JSON naming what --src is (hub id + revision, ...): into the provenance")
    q.add_argument("--verified", help="verification stamp of --src: refuse to read an unverified checkpoint")
    args = ap.parse_args(argv)

    if args.cmd == "dequantize":
        import json

        from .dequantize import dequantize_checkpoint
        from .verify import ManifestError, require_verified

        try:
            if args.verified:
                require_verified(args.src, args.verified)
            try:
                key = json.loads(args.source_key) if args.source_key else None
            except ValueError as e:
                raise ValueError(f"--source-key is not JSON ({e}): {args.source_key[:200]!r}") from None
            man = dequantize_checkpoint(args.src, args.out, source_key=key)
        except (ValueError, FileNotFoundError, ManifestError) as e:
            print(f"dequantize: error: {e}", file=sys.stderr)
            return 2
        print(f"dequantize: {args.out}: {len(man['files'])} files, manifest_sha256 {man['manifest_sha256']}")
        return 0

    if args.cmd == "manifest":
        from .manifest import MANIFEST_NAME, write_manifest

        try:
            man = write_manifest(args.dir, jobs=args.jobs, progress=args.progress)
        except FileNotFoundError as e:
            print(f"manifest: error: {e}", file=sys.stderr)
            return 2
        total = sum(f["size"] for f in man["files"])
        print(f"manifest {Path(args.dir) / MANIFEST_NAME}: {len(man['files'])} files, {total} bytes, "
              f"manifest_sha256 {man['manifest_sha256']}")
        return 0

    if args.cmd == "verify":
        from .verify import ManifestError, verify, write_stamp

        stamp = Path(args.stamp) if args.stamp else None
        copy_note = ""
        if args.copy_of:
            copy_note = (f"  note: {args.dir} is the pipeline's copy of your folder {args.copy_of}; repair the files "
                         f"there and rerun the same command: the copy is refreshed when a file in {args.copy_of} "
                         "changes, then checked again")
            print(f"verify: checking {args.dir}, the pipeline's copy of {args.copy_of}")
        try:
            rep = verify(args.dir, args.manifest, jobs=args.jobs, progress=args.progress,
                         expect_manifest_sha256=args.expect_manifest_sha256)
        except ManifestError as e:
            if stamp is not None:
                stamp.unlink(missing_ok=True)
            print(f"verify: error: {e}", file=sys.stderr)
            if copy_note:
                print(copy_note, file=sys.stderr)
            return 2
        stream = sys.stdout if rep.ok else sys.stderr
        print("\n".join(rep.lines()), file=stream)
        if not rep.ok and copy_note:
            print(copy_note, file=stream)
        if not rep.ok:
            if stamp is not None:
                stamp.unlink(missing_ok=True)
            return 1
        if stamp is not None:
            write_stamp(rep, stamp)
            print(f"verify: stamp written to {stamp}")
        return 0

    from .download import DownloadError, download

    try:
        download(args.name, args.out, repo_id=args.repo_id, revision=args.revision, local_path=args.local_path,
                 cache_dir=args.cache_dir, stamp=args.stamp)
    except DownloadError as e:
        print(f"download: error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
