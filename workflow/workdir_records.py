"""Snakemake's job records kept inside the work and results directories, so a copied or moved directory keeps them.

Snakemake decides that a job must run again from what it recorded when the job last ran: its params (decoder
settings, rendered prompts' sha256, data sha256, code versions, checkpoint source, backend, precision ...), its
rule's code and its list of input files. It keeps these records in ``.snakemake/metadata`` of the working
directory, one per output file, named by the output's absolute path (FilePersistence; the rules' outputs are
absolute paths under the work directory). A work directory copied (``cp -a``, ``cp -r``, ``rsync``) or moved
has new absolute paths, hence no records: Snakemake then sees no params change at all, and a config change made
after the copy re-ran nothing (the old shards were reused, the table silently stale).

:func:`install` replaces Snakemake's file persistence with :class:`RootedPersistence`: every record of an output
under one of the given roots (the work directory, the results directory) is also written inside that root, at
``<root>/.snakemake-records/<path relative to the root>.json``, with that root's absolute path written as a token
(``<work>``, ``<results>``) wherever a path starts with it (input list, input checksums, log, shell command, params;
the other root's paths stay absolute: a table made from another work directory is made again). A record is read from
there (the tokens replaced by the root's current path) and from Snakemake's own store; when both hold one and they
differ (another writer -- a checkout without these records, another worktree sharing the work directory -- updated
the store only, or a kill fell between the two writes), the one whose ``endtime`` equals the output's current mtime
is taken (Snakemake sets it from that mtime), else the later one. So the records travel with the directory: in a
copy or at a new place Snakemake compares params, code and input lists exactly as it would have at the old place,
and re-runs exactly the jobs a config change affects (what they feed follows by date, as always). Snakemake's own
store is still written, so its commands (``--summary``, ``--list-changes``, ``--cleanup-metadata``) work as before.
A record file that exists but cannot be read (truncated, not JSON, a field of the wrong type: a disk filled up, a
hand edit) is never taken for "no record" when Snakemake's store has none either (a copied directory): that would
make Snakemake see no change and reuse the output whatever changed since; its job runs again instead (a note names
the file). So does the job of an existing output with no record at all while the DAG is planned (a directory copied
without its records folder, e.g. ``cp -r work/* dest``, or that folder deleted; one note per directory): ``--touch``
adopts such outputs as they are by recording the current settings. Under ``--drop-metadata`` no record is written,
so neither stand-in is used (the job would run on every run): such an output is reused, as by Snakemake alone.
``--cleanup-metadata FILE`` (Snakemake's advice for skipping a trigger) replaces FILE's record by one that records
nothing, so FILE is kept as it is, as before.

A failed job whose outputs are all ``update()``-flagged (the problems copies and decoder configs: Snakemake
does not delete them before the job runs and puts the previous version back when it fails) keeps the records
of the run that made that version, and the version put back keeps its mtime (Snakemake records the failed run's
params and copies the backup back with a new date, snakemake/jobs.py ``postprocess``, FileBackupMixin): so a
failed re-run followed by a good one with the same inputs re-runs nothing below it. :func:`install` tags each
job's ``postprocess`` call with its ``error`` flag for this.

:func:`export_existing` copies, once per directory, the records Snakemake's store already holds for outputs
under a root into that root (a work directory made before these records existed gets them on its next real run).

When a run ends it removes its own lock files only (Snakemake removes the whole locks folder, another live run's
locks included, so a third run could start on that run's outputs); ``--unlock`` still removes every lock.

Relies on Snakemake's ``PersistenceBase`` interface (``_read_record`` / ``_write_record`` / ``_delete_record`` /
``_clear_cache`` / ``started``, snakemake/persistence/__init__.py, Snakemake 9), on its ``FilePersistence``'s
``_delete_locks`` / ``cleanup_locks`` / ``_lockfile`` / ``_lockdir`` (snakemake/persistence/file.py) and on
``snakemake.workflow`` looking up ``FilePersistence`` by name when it builds the persistence (snakemake/workflow.py,
``match persistence_backend``). With ``--persistence-backend db`` nothing is replaced (a note says so).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
from base64 import urlsafe_b64decode
from pathlib import Path

RECORDS_DIR = ".snakemake-records"
_REPORTED: set[str] = set()  # outputs whose unreadable record, and roots whose record-less outputs, were named


# where a path can start in a record's string (its start, or after whitespace, '=', ':', a quote, '[' or ',': a
# shell command, ``--opt=PATH``, a list's repr) and where it can end (the end, '/', or one of those delimiters)
_PATH_START, _PATH_END = r"(?:^|(?<=[\s=:'\"\[,]))", r"(?=$|/|[\s'\",\]:;])"


def _swap(value, pairs):
    """``value`` (a str, list or dict, nested) with path ``old`` replaced by ``new`` for each ``(old, new)`` of
    ``pairs`` wherever a path starts with it (the whole path ``old``, or ``old/...``): ``/nfs/scratch/work`` and
    ``/scratch/workshop`` are left as they are when ``old`` is ``/scratch/work``."""
    if isinstance(value, str):
        for old, new in pairs:
            if old in value:
                value = re.sub(_PATH_START + re.escape(old) + _PATH_END, lambda _: new, value)
        return value
    if isinstance(value, list):
        return [_swap(v, pairs) for v in value]
    if isinstance(value, dict):
        return {_swap(k, pairs): _swap(v, pairs) for k, v in value.items()}
    return value


class Roots:
    """The directories whose outputs' records live inside them: ``{token: absolute path}``."""

    adopt_on_delete = False  # `--cleanup-metadata`: a deleted record of an existing output records nothing instead

    def __init__(self, roots: dict[str, str]):
        # longest first: a root inside another (results under the work directory) is matched before it
        self.roots = sorted(((t, os.path.abspath(p)) for t, p in roots.items()), key=lambda r: -len(r[1]))

    def root_of(self, key: str) -> tuple[str, str] | None:
        """``(token, root)`` of the root holding output ``key`` (an absolute path); None outside every root."""
        return next(((t, r) for t, r in self.roots if key.startswith(r + os.sep)), None)

    def local(self, key: str) -> Path | None:
        """Where the record of output ``key`` lives inside its root; None outside every root."""
        tr = self.root_of(key)
        return Path(tr[1], RECORDS_DIR, os.path.relpath(key, tr[1]) + ".json") if tr else None

    # Only the record's own root becomes a token: a table's record (results directory) keeps the absolute paths
    # of the work directory it read, so a table made from another work directory is made again (input list).
    def to_tokens(self, key: str, rec: dict) -> dict:
        token, root = self.root_of(key)
        return _swap(rec, [(root, token)])

    def from_tokens(self, key: str, rec: dict) -> dict:
        token, root = self.root_of(key)
        return _swap(rec, [(token, root)])


def _read_json(path: Path) -> dict | None:
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):  # missing, or torn by a kill mid-write (written atomically, so rare)
        return None
    return rec if isinstance(rec, dict) and rec else None


UNREADABLE = "unreadable record"  # the params and code of the stand-in record of a damaged record file
NO_RECORD = "no job record"  # ... of an existing output that has no record at all


def _stand_in_record(record_cls, what: str):
    """A record whose params and code (``what``) differ from any job's, so Snakemake runs the job again (reason:
    "Params have changed", quoting ``what``) instead of taking an output of unknown settings as up to date."""
    from snakemake.persistence import RECORD_FORMAT_VERSION

    return record_cls(rule=None, params=[what], code=what, input=None, record_format_version=RECORD_FORMAT_VERSION)


def _unreadable_record(record_cls, path: Path):
    """The stand-in for a record file that exists but cannot be read (truncated, not JSON, fields of the wrong
    type): see :func:`_stand_in_record`."""
    return _stand_in_record(record_cls, f"{UNREADABLE} {path} (torn or edited): the job runs again")


def _output_mtime(key: str) -> float | None:
    """The mtime (seconds since the epoch) Snakemake records as a job's ``endtime`` for output ``key``: the
    file's own (a symlink's, not its target's), a directory's ``.snakemake_timestamp`` where it has one
    (snakemake/io ``_IOFile.mtime``, ``Mtime.local_or_storage``); None when the output does not exist."""
    try:
        st = os.lstat(key)
    except OSError:
        return None
    if os.path.isdir(key) and not os.path.islink(key):
        try:
            return os.stat(os.path.join(key, ".snakemake_timestamp")).st_mtime
        except OSError:
            pass
    return st.st_mtime


def _current(key: str, local, stored):
    """Of two readable records of output ``key`` -- the one kept in its root (``local``) and Snakemake's own
    (``stored``) -- the one written when the output as it is now was made. They differ when another writer
    updated Snakemake's store only (a checkout without these records, another worktree sharing the work
    directory) or a kill fell between the two writes (the store is written first). Snakemake sets a record's
    ``endtime`` from the output's mtime (snakemake/persistence ``finished``), so the record whose ``endtime``
    equals the output's current mtime is taken; when neither or both do, the later ``endtime`` (``local`` on a
    tie or when neither has one)."""
    def matches(rec) -> bool:
        return mtime is not None and rec.endtime is not None and abs(rec.endtime - mtime) < 1e-3

    mtime = _output_mtime(key)
    if matches(local) != matches(stored):
        return local if matches(local) else stored
    return stored if (stored.endtime or float("-inf")) > (local.endtime or float("-inf")) else local


#: top-level folders of the work directory whose outputs are kept without a job record: what they hold is
#: checked by content, not by the settings a record keeps (checkpoints and their sha256 stamps and source keys,
#: dequantized checkpoints), or made from versioned definitions (container images); re-making them would fetch
#: or build again (tens of GB, a registry) for nothing
KEPT_WITHOUT_RECORD = ("hf", "verified", "sources", "dequantized", "images")


def _kept_without_record(key: str, roots) -> bool:
    """Whether output ``key`` under the work directory lies in one of :data:`KEPT_WITHOUT_RECORD`."""
    hit = roots.root_of(key)
    if hit is None or hit[0] != "<work>":
        return False
    return Path(os.path.relpath(key, hit[1])).parts[0] in KEPT_WITHOUT_RECORD


def _write_json(path: Path, rec: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(rec, f)
        os.replace(tmp, path)
    except BaseException:  # a full disk: no half-written temp file left
        Path(tmp).unlink(missing_ok=True)
        raise


def _disk_full(e: OSError, folder, what: str) -> None:
    """Raise Snakemake's WorkflowError with one line naming the full ``folder`` (repro.io.disk_full) when ``e``
    is a full disk; Snakemake's own message ("Error recording metadata ... Please ensure write permissions for
    the directory .../.snakemake") names .snakemake whichever disk is full."""
    from snakemake.exceptions import WorkflowError

    from repro.io import disk_full

    line = disk_full(e, folder, what=what)
    if line is not None:
        raise WorkflowError(f"{line} (writing Snakemake's job record)") from None


def persistence_class(base: type, roots: Roots) -> type:
    """A subclass of Snakemake's ``FilePersistence`` (``base``) keeping the records of outputs under ``roots``
    inside them as well (module docstring)."""
    from snakemake.io import is_flagged
    from snakemake.persistence import MetadataRecord

    class RootedPersistence(base):
        def __init__(self, *args, **kwargs):
            self._rooted_cache = {}  # key -> MetadataRecord or None, read from the roots
            self._planning = True  # no job started yet: the records read are those the DAG is planned on
            super().__init__(*args, **kwargs)

        def started(self, job, external_jobid=None) -> None:
            self._planning = False  # from now on an output may exist before its record is written
            super().started(job, external_jobid)

        async def finished(self, job) -> None:
            # A failed job whose outputs are all update()-flagged: Snakemake has put their previous versions back
            # (snakemake/jobs.py postprocess); keep the records of the run that made them, instead of recording
            # the failed run's params, which would re-run the job -- and, planned before it runs, everything
            # below it -- on the next run although nothing changed since the last success.
            if getattr(job, "_repro_failed", False) and all(is_flagged(f, "update") for f in job.output):
                self._clear_cache()
                for f in job.output:
                    self._unmark_incomplete(self._get_key(f))
                return
            await super().finished(job)

        def backup_output(self, path: Path) -> None:
            # as Snakemake's (update() outputs, before the job runs), with the file's mtime kept, so a version put
            # back after a failure is as old as it was, and nothing below it re-runs by date
            if path.is_dir():
                return super().backup_output(path)
            backup = self._get_backup_path(path)
            backup.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, backup)

        def restore_output(self, path: Path) -> bool:
            backup = self._get_backup_path(path)
            if path.is_dir() or not backup.is_file():
                return super().restore_output(path)
            shutil.copy2(backup, path)
            backup.unlink()
            return True

        def _delete_locks(self) -> None:
            # A run's end: its own lock files only. Snakemake's removes the whole locks folder
            # (snakemake/persistence/file.py ``_delete_locks``: shutil.rmtree), the locks of another run still
            # alive on other outputs of this checkout included; a third run could then start on that run's outputs
            # (two generation jobs writing one shard). The folder goes once it is empty.
            for lockfile in self._lockfile.values():
                try:
                    os.remove(lockfile)
                except FileNotFoundError:
                    pass
            self._lockfile.clear()
            try:
                os.rmdir(self._lockdir)
            except OSError:  # another run's locks are left, or the folder is gone
                pass

        def cleanup_locks(self) -> None:
            super()._delete_locks()  # --unlock: every lock, as Snakemake's

        def _clear_cache(self) -> None:
            super()._clear_cache()
            self._rooted_cache = {}

        def _read_local(self, key: str, local: Path):
            """The record kept in the root (tokens replaced), None when there is none, or the string
            :data:`UNREADABLE` when the file exists but is torn, not JSON or not a valid record."""
            if not local.exists():
                return None
            rec = _read_json(local)
            try:
                return MetadataRecord.model_validate(roots.from_tokens(key, rec)) if rec else UNREADABLE
            except ValueError:  # pydantic's ValidationError: a field of the wrong type
                return UNREADABLE

        def _read_record(self, key: str):
            local = roots.local(key)
            if local is None:
                return super()._read_record(key)
            if key not in self._rooted_cache:
                self._rooted_cache[key] = self._read_local(key, local)
            rec, bad = self._rooted_cache[key], local
            try:
                stored = super()._read_record(key)
            except ValueError:  # Snakemake's own record has fields of the wrong type (a torn one it skips itself)
                stored = None
                if rec is None or rec is UNREADABLE:
                    rec, bad = UNREADABLE, Path(self._record_path(self._metadata_path, key))
            if rec is not None and rec is not UNREADABLE:
                return rec if stored is None else _current(key, rec, stored)
            if stored is not None or rec is None:
                if stored is None and self._planning and os.path.lexists(key) and self._keeps_records() \
                        and not _kept_without_record(key, roots):
                    return self._no_record(key)
                return stored
            if not self._keeps_records():
                # --drop-metadata: no record is written, so a stand-in would re-run the job on every run
                return None
            # the root's record is damaged and Snakemake's store has none (a copied or moved directory): the
            # output's settings are unknown, so its job runs again rather than the output being reused
            if key not in _REPORTED:
                _REPORTED.add(key)
                print(f"note: the job record {bad} cannot be read (torn or edited): the job that made {key} "
                      "runs again", file=sys.stderr)
            return _unreadable_record(MetadataRecord, bad)

        def _keeps_records(self) -> bool:
            """False under ``--drop-metadata`` (Snakemake's ``execution_settings.keep_metadata``): no job record
            is written, so an output's missing or damaged record stays so and is read as "no record", as by
            Snakemake alone; a stand-in would make its job (GPU generation, a checkpoint fetch) run on every run.
            The Snakefile says so once at start-up (workflow/rules/common.smk)."""
            dag = getattr(self, "dag", None)
            return dag is None or dag.workflow.execution_settings.keep_metadata

        def _no_record(self, key: str):
            # An existing output under a root with no record anywhere: its directory was copied without its
            # records folder (`cp -r work/* dest`: the glob skips hidden folders), the folder was deleted, or the
            # directory was copied before records were kept. Snakemake would read "no record" as "nothing
            # changed" and reuse the output whatever changed since; its job runs again instead.
            _, root = roots.root_of(key)
            if root not in _REPORTED:
                _REPORTED.add(root)
                print(f"note: outputs under {root} have no job record in {root}/{RECORDS_DIR} (copied without that "
                      "hidden folder, e.g. `cp -r dir/* dest`, or it was deleted), so the settings they were made "
                      "with are unknown: their jobs run again. To keep the records, copy the folder as a whole "
                      "(`cp -a dir dest`, `rsync -a dir/ dest/`); to adopt outputs you know are current instead, "
                      "run the same command once with --touch (docs/workflow.md 7.2a)", file=sys.stderr)
            return _stand_in_record(MetadataRecord, f"{NO_RECORD} of this output in {root}/{RECORDS_DIR}: "
                                                    "the job runs again")

        def _write_record(self, key: str, record) -> None:
            try:
                super()._write_record(key, record)
            except OSError as e:
                _disk_full(e, self.path, "Snakemake's state")
                raise
            local = roots.local(key)
            if local is not None:
                try:
                    _write_json(local, roots.to_tokens(key, dict(record.items())))
                except OSError as e:
                    token, root = roots.root_of(key)
                    _disk_full(e, root, {"<work>": "the work directory", "<results>": "the results folder"}.get(
                        token, "the folder"))
                    raise
                self._rooted_cache.pop(key, None)

        def _delete_record(self, key: str) -> bool:
            local = roots.local(key)
            if roots.adopt_on_delete and local is not None and os.path.lexists(key):
                # `--cleanup-metadata FILE` (Snakemake's advice for skipping a trigger): an output without any
                # record would now run again (_no_record), so the record is replaced by one that records nothing
                # -- no params, code or input list to compare, as Snakemake's "no record" -- and the output stays
                super()._delete_record(key)
                from snakemake.persistence import RECORD_FORMAT_VERSION

                _write_json(local, {"rule": None, "record_format_version": RECORD_FORMAT_VERSION})
                self._rooted_cache.pop(key, None)
                return True
            deleted = super()._delete_record(key)
            if local is not None and local.is_file():
                local.unlink()
                deleted = True
            self._rooted_cache.pop(key, None)
            return deleted

    return RootedPersistence


def install(roots: dict[str, str], cleanup_metadata: bool = False) -> Roots:
    """Make the Snakemake of this process keep the records of outputs under ``roots`` (``{token: path}``)
    inside them (module docstring). Call before Snakemake builds its persistence (from the Snakefile).
    ``cleanup_metadata``: the command is ``--cleanup-metadata``, whose records of existing outputs are replaced by
    records of nothing (Snakemake's way to skip a trigger keeps working: an output without a record would run)."""
    import snakemake.jobs as smj
    import snakemake.workflow as smw

    r = Roots(roots)
    installed = getattr(smw.FilePersistence, "_repro_roots", None)
    if installed is not None:  # a second workflow in this process: the same class, this workflow's roots
        installed.roots = r.roots
        r = installed
    else:
        smw.FilePersistence = persistence_class(smw.FilePersistence, r)
        smw.FilePersistence._repro_roots = r
    r.adopt_on_delete = cleanup_metadata
    if not getattr(smj.Job.postprocess, "_repro_tags_failure", False):
        original = smj.Job.postprocess

        async def postprocess(self, *args, error: bool = False, **kwargs):
            self._repro_failed = error  # read by RootedPersistence.finished
            return await original(self, *args, error=error, **kwargs)

        postprocess._repro_tags_failure = True
        smj.Job.postprocess = postprocess
    return r


def _decode_record_name(rel: Path) -> str | None:
    """The key (output path) of a record of Snakemake's file store from its path under ``metadata/``: the
    urlsafe base64 of the key, cut into parts of which all but the last start with ``@``
    (snakemake/persistence/file.py ``_record_path``)."""
    parts = rel.parts
    if not all(p.startswith("@") for p in parts[:-1]):
        return None
    try:
        return urlsafe_b64decode("".join(p[1:] for p in parts[:-1]) + parts[-1]).decode()
    except (ValueError, UnicodeDecodeError):
        return None


def export_existing(roots: Roots, metadata_dir: Path, write: bool = True) -> int:
    """Copy the records of Snakemake's store ``metadata_dir`` (``.snakemake/metadata``) for outputs under a root
    into that root, for each root without a records folder yet (once: later records are written by
    :class:`RootedPersistence` as jobs finish). Returns how many were (``write=False``: would be) copied."""
    todo = [(token, root) for token, root in roots.roots
            if not Path(root, RECORDS_DIR).exists() and Path(root).is_dir()]
    if not todo or not metadata_dir.is_dir():
        for _, root in todo if write else ():
            Path(root, RECORDS_DIR).mkdir(exist_ok=True)
        return 0
    n = 0
    for dirpath, _, files in os.walk(metadata_dir):
        for name in files:
            key = _decode_record_name(Path(dirpath, name).relative_to(metadata_dir))
            local = roots.local(key) if key else None
            if local is None or not any(key.startswith(root + os.sep) for _, root in todo) or not os.path.exists(key):
                continue
            rec = _read_json(Path(dirpath, name))
            if rec and not rec.get("incomplete"):
                if write:
                    _write_json(local, roots.to_tokens(key, rec))
                n += 1
    for _, root in todo if write else ():
        Path(root, RECORDS_DIR).mkdir(exist_ok=True)
    return n
