"""Atomic file writes and append-only JSON Lines, so a killed job never leaves a half-written output; a file's
sha256; the one line said when a disk is full (:func:`disk_full`); what a path that should be a file or a folder
is instead (:func:`not_a`: missing, a dangling symlink, the other kind); a JSON Lines line cut off mid-record said
as such (:func:`read_jsonl`). Imports nothing of repro (the bottom layer:
data, provenance, backends read and write through it)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)  # no space left on the device; disk quota exceeded


def disk_full(exc: BaseException, folder: str | os.PathLike, keep: str = "", what: str = "") -> str | None:
    """One line for an OSError that says the disk (or the quota) holding ``folder`` is full, naming the folder
    (after ``what``, e.g. "the work directory"), its free space (MB, ``shutil.disk_usage``) and what to free;
    ``keep`` is appended (what was kept and how the run goes on). None for any other exception."""
    if not isinstance(exc, OSError) or exc.errno not in DISK_FULL_ERRNOS:
        return None
    folder = Path(folder).resolve()
    try:
        free = f"{shutil.disk_usage(_existing(folder)).free / 1e6:.0f} MB free"
    except OSError:
        free = "free space unknown"
    full = "disk quota exceeded" if exc.errno == errno.EDQUOT else "no space left on the device"
    return (f"{full} for {what + ' ' if what else ''}{folder} ({free}): free space on that disk (old runs' "
            "work/<suite> folders, results/ or checkpoints no longer needed, other users' files) or point the work "
            f"directory elsewhere (work_dir in the config, or $ORL_EVAL_WORK), then run again"
            f"{'; ' + keep if keep else ''}")


def _existing(path: Path) -> Path:
    """``path`` or its nearest existing parent folder."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def full_disks(folders: dict[str, str | os.PathLike], min_free: float = 64e6) -> list[str]:
    """After a failed run: one line per disk with less than ``min_free`` bytes free (default 64 MB) among
    ``folders`` (``{what: folder}``, e.g. the work directory first), naming the first folder on that disk and
    what to free (:func:`disk_full`). [] when every disk has room (or none can be read)."""
    out, seen = [], set()
    for what, folder in folders.items():
        probe = _existing(Path(folder).resolve())
        try:
            dev, free = probe.stat().st_dev, shutil.disk_usage(probe).free
        except OSError:
            continue
        if dev not in seen and free < min_free:
            seen.add(dev)
            out.append(f"Error: {disk_full(OSError(errno.ENOSPC, 'full'), folder, what='the ' + what)}")
    return out


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` via a unique temp file in the same directory, fsync, ``os.replace``.

    The file gets the permissions a plain ``open()`` would give (0666 & ~umask), not mkstemp's 0600.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def sha256_path(path: str | os.PathLike) -> str:
    """sha256 of a (small) file's bytes, hex. FileNotFoundError names a missing file."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8, ``\\n`` line ends as given) to ``path`` atomically (``atomic_write_bytes``)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def not_a(path: str | os.PathLike, kind: str = "file") -> str | None:
    """What ``path``, which should be a ``kind`` (``"file"`` or ``"folder"``), is instead, as words to follow the
    path: ``"does not exist"``, ``"is a symlink to X, which does not exist"``, ``"is a folder, not a file"``, ...;
    None when it is one (a symlink to one counts)."""
    p = Path(path)
    if kind == "file" and p.is_file() or kind == "folder" and p.is_dir():
        return None
    if p.is_symlink() and not p.exists():
        return f"is a symlink to {os.readlink(p)}, which does not exist (a dangling link)"
    if not p.exists():
        return "does not exist"
    other = "a folder" if p.is_dir() else "a file" if p.is_file() else "neither a file nor a folder"
    return f"is {other}, not a {kind}"


def read_jsonl(path: str | os.PathLike, error: type[Exception] = ValueError) -> list[dict]:
    """Read JSON Lines strictly: every non-blank line must be a JSON object. ``error`` (default
    ValueError) is raised naming the file and 1-based line: a line whose JSON ends before its record does (the
    parser ran out of text: ``{"a": 1, "b": "x``) is "cut off mid-record", the file's last line adding "(file
    truncated?)"; FileNotFoundError names a missing file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    out = []
    with path.open(encoding="utf-8") as f:
        lines = f.read().split("\n")
    last = max((i for i, line in enumerate(lines, 1) if line.strip()), default=0)
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            ran_out = exc.pos >= len(line.rstrip()) or exc.msg.startswith("Unterminated string")
            if ran_out and line.lstrip().startswith(("{", "[")):
                why = "file truncated?" if n == last else "the line ends before its JSON object does"
                raise error(f"{path}:{n}: line {n} is cut off mid-record ({why}); restore the file from its "
                            "source") from None
            raise error(f"{path}:{n}: not valid JSON ({exc.msg}, column {exc.colno})") from None
        if not isinstance(rec, dict):
            raise error(f"{path}:{n}: expected a JSON object, got {type(rec).__name__}")
        out.append(rec)
    return out


def read_jsonl_tolerant(path: str | os.PathLike) -> list[dict]:
    """Read JSON Lines, dropping a truncated last line (a record a killed writer did not finish)."""
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    lines = path.read_text(encoding="utf-8").split("\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if i >= len(lines) - 2:  # only the last, unterminated record may be partial
                break
            raise
    return rows


def append_jsonl(f, record: dict) -> None:
    """Append one record as a full line and flush + fsync, so it is durable before the next begins."""
    f.write(json.dumps(record, ensure_ascii=False) + "\n")
    f.flush()
    os.fsync(f.fileno())
