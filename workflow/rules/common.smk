# Start-up checks (config validation with one-line errors, --cores, stale locks of a killed run, stamps of
# checkpoints changed since their verification), suite lookup, paths, and every input/param helper the rules
# use (functions live here, rules in their .smk). A dry run (`-n`) changes nothing in the work directory or
# results (Snakemake may still write its own .snakemake/ bookkeeping): what a real run would remove or
# re-verify at start-up is only reported (DRY_RUN).
import fnmatch
import json
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, workflow.basedir)  # the checkout's `repro` package, also without `pip install`

from repro import benchmarks, paths as P
from repro.checkpoint.dequantize import declared_quantization
from repro.checkpoint.suspect import remove_generated_under
from repro.checkpoint.verify import failed_marker, refresh_stale_stamp, rerun_trigger
from repro.config import (
    ConfigError, data_dir, data_dir_origin, is_replay, missing_local_checkpoints, results_dir, suite_cells,
    validate_config, work_dir)
from repro.io import not_a
from repro.provenance import checkpoint_source_key, data_source_key, prompt_source_key, stage_code_version

# the config files in the order they apply (each overrides the ones before): the checkout's config.yaml (the
# Snakefile's `configfile:`, which Snakemake lists after the --configfile ones but applies first), then the rest
_default_cfg = os.path.realpath(os.path.join(workflow.basedir, "config.yaml"))
_files = [str(f) for f in (workflow.configfiles or [])]
_files = sorted(_files, key=lambda f: os.path.realpath(f) != _default_cfg)  # stable: config.yaml first
_sources = [os.path.basename(f) for f in _files]
_source = " + ".join(dict.fromkeys(_sources)) or "config.yaml"
if getattr(workflow.config_settings, "config", None):
    _source += " + --config"
try:
    config = validate_config(config, source=_source)
except ConfigError as e:
    print(f"Config error: {e}", file=sys.stderr)
    sys.exit(1)

# `-n` / `--dry-run`: the start-up work below only reports. Snakemake's `workflow.dryrun` is False while the
# Snakefile is read (it is set when the DAG is executed, after this file runs); the command line's setting is
# in `workflow.output_settings.dryrun` (snakemake/cli.py create_output_settings; snakemake/snakemake#2948).
# Commands that run no job (--unlock, --summary / -S, -D, --list-changes, --list-rules, --lint, --dag, --touch,
# --cleanup-metadata, --report, ...) only report too: `--unlock` must unlock even while a checkpoint is damaged,
# and a summary must not re-hash or remove stamps. Snakemake gives the Snakefile no sign of them but its command
# line, so it is read again with Snakemake's own parser (abbreviations such as --unl, combined flags such as -pS).
_NO_JOB_ARGS = ("unlock", "summary", "detailed_summary", "list_rules", "list_target_rules", "lint", "dag",
                "rulegraph", "filegraph", "d3dag", "list_changes", "list_input_changes", "list_params_changes",
                "list_untracked", "cleanup_metadata", "cleanup_shadow", "touch", "report", "archive", "containerize",
                "export_cwl", "generate_unit_tests", "print_compilation", "delete_all_output", "delete_temp_output")


def _cli_args():
    """Snakemake's command line read with its own parser; None when it is not Snakemake's (an API call)."""
    try:
        from snakemake.cli import get_argument_parser

        return get_argument_parser().parse_known_args(sys.argv[1:])[0]
    except (Exception, SystemExit):  # noqa: BLE001 - not Snakemake's command line
        return None


_CLI_ARGS = _cli_args()


def _no_job_flag():
    """The first option of the command line (Snakemake's parser) that makes it run no job, as ``--name``;
    None for a run (or a command line Snakemake's parser does not take: then the run is treated as a run)."""
    if _CLI_ARGS is None:
        return None
    return next((f"--{name.replace('_', '-')}" for name in _NO_JOB_ARGS if getattr(_CLI_ARGS, name, None)), None)


_DRY = bool(getattr(workflow.output_settings, "dryrun", False))
_NO_JOB_FLAG = None if _DRY else _no_job_flag()
DRY_RUN = _DRY or _NO_JOB_FLAG is not None
NO_RUN = "dry run" if _NO_JOB_FLAG is None else f"{_NO_JOB_FLAG} (runs no job)"  # the notes' prefix

_cores = workflow.resource_settings.cores
if isinstance(_cores, int) and _cores < 1:
    print(f"Error: --cores {_cores} lets no job run (with 0 Snakemake would wait at 'Select jobs to execute' "
          "forever; below 0 it starts jobs with invalid worker counts); give --cores N with N >= 1, or --cores all",
          file=sys.stderr)
    sys.exit(1)

SUITE = config["suite"]
WORK = str(work_dir(config))
DATA = data_dir(config)
_DATA_ORIGIN = data_dir_origin(config)
_DATA_FROM, _DATA_FIX = _DATA_ORIGIN.source, _DATA_ORIGIN.fix
if workflow.is_main_process and _DATA_ORIGIN.env_unused:
    print(f"note: data directory {DATA} (data_dir in the config); $ORL_EVAL_DATA={_DATA_ORIGIN.env_unused} is not "
          "used (data_dir wins)", file=sys.stderr)
if DATA is not None and not DATA.is_dir():
    print(f"Config error: data directory {DATA} (from {_DATA_FROM}) "
          f"{'is a file, not a folder' if DATA.exists() else 'does not exist'}; point {_DATA_FIX} at a folder "
          f"holding {', '.join(b.file for b in benchmarks.declarations())}, or unset it", file=sys.stderr)
    sys.exit(1)
# every benchmark file the selected suite reads from the data directory (its table; its sweep's too when
# `sweep` is a target), checked now -- present, readable, JSON Lines with the benchmark's fields, not empty:
# otherwise its prepare jobs fail one by one, the reason buried among Snakemake's error blocks
_needed = dict.fromkeys(config["suites"][SUITE]["benchmarks"] + list(
    (config["suites"][SUITE].get("sweep") or {}).get("benchmarks") or []
    if "sweep" in (getattr(_CLI_ARGS, "targets", None) or ()) else []))  # (workflow.dag_settings: None here)
_not_files = {benchmarks.get(b).file: not_a(DATA / benchmarks.get(b).file) for b in _needed} if DATA else {}
_missing = [f for f, why in _not_files.items() if why == "does not exist"]
_wrong = [f"{f} {why}" for f, why in _not_files.items() if why and why != "does not exist"]  # a dangling link, a folder
if _missing:
    print(f"Config error: data directory {DATA} (from {_DATA_FROM}) lacks {', '.join(_missing)}, which suite "
          f"{SUITE!r} needs; copy the file(s) there, point {_DATA_FIX} at a folder holding them, or drop those "
          "benchmarks from the suite", file=sys.stderr)
    sys.exit(1)
if _wrong:
    print(f"Config error: data directory {DATA} (from {_DATA_FROM}): {'; '.join(_wrong)}; suite {SUITE!r} reads "
          f"{'it' if len(_wrong) == 1 else 'them'} as benchmark files: put the JSON Lines file(s) there (or a link "
          f"to an existing one), point {_DATA_FIX} at another folder, or drop those benchmarks from the suite",
          file=sys.stderr)
    sys.exit(1)
if DATA is not None and workflow.is_main_process and _NO_JOB_FLAG is None:  # not in job processes, not --unlock
    from repro.data import DataError as _DataError, check_file as _check_data_file

    for _b in _needed:
        try:
            _check_data_file(_b, DATA / benchmarks.get(_b).file)
        except _DataError as _e:
            print(f"Config error: data directory {DATA} (from {_DATA_FROM}): {_e}; suite {SUITE!r} needs it. Fix "
                  f"or replace the file, point {_DATA_FIX} at another folder, or drop {_b} from the suite",
                  file=sys.stderr)
            sys.exit(1)
RESULTS = os.path.join(str(results_dir(config)), SUITE)


def unusable_dir_errors(named):
    """One error line per ``(what, path)`` of ``named`` that cannot hold the run's files: the path, or the
    nearest of its parents that exists, is a file, or that parent is not writable; [] when all can. (Snakemake
    alone stops with a NotADirectoryError traceback while it builds the DAG.)"""
    errors = []
    for what, path in named:
        existing = Path(path)
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir():
            errors.append(f"Config error: the {what} {path} cannot be made: {existing} is a file, not a folder; point "
                          "it at a folder (made when missing) or move that file away")
        elif not os.access(existing, os.W_OK | os.X_OK):
            errors.append(f"Config error: the {what} {path} is not writable ({existing} is not writable by this "
                          "user); point it at a folder you can write")
    return errors


_unusable = unusable_dir_errors([("work directory (work_dir / ORL_EVAL_WORK)", WORK),
                                 ("results directory (results_dir)", str(results_dir(config)))])
if _unusable:  # a dry run stops too: Snakemake could not plan on such a path
    print("\n".join(_unusable), file=sys.stderr)
    sys.exit(1)

# The jobs' shell commands carry these paths unquoted (`--out {output}`, `{PY} -m ...`): a space or a shell
# special character splits or rewrites the command, so every job would fail mid-run ("unrecognized arguments")
# after the DAG was planned. Checked at start-up instead, one line per path.
_SHELL_SPECIAL = re.compile(r"[\s'\"\\$`!*?\[\]{}()<>|&;]")


def shell_unsafe_paths(named):
    """One error line per ``(what, path)`` of ``named`` whose path holds whitespace or a shell special character
    (``'"\\$`!*?[]{}()<>|&;``), naming the characters and the fix; [] when all are safe."""
    errors = []
    for what, path in named:
        found = sorted(set(_SHELL_SPECIAL.findall(str(path)))) if path else []
        if found:
            chars = ", ".join("a space" if c == " " else repr(c) for c in found)
            errors.append(f"Config error: {what} {str(path)!r} holds {chars}: the jobs' shell commands carry it "
                          "unquoted, so every job would fail; move or rename it to a path without whitespace or "
                          "any of '\"\\$`!*?[]{}()<>|&; (a symlink does not help: the path is resolved)")
    return errors


_unsafe = shell_unsafe_paths(
    [("the work directory (work_dir / ORL_EVAL_WORK)", WORK),
     ("the results directory (results_dir)", results_dir(config)),
     (f"the data directory (from {_DATA_FROM})", DATA),
     ("the checkout", workflow.basedir), ("the Python running Snakemake", sys.executable)]
    + [(f"models.{m}.source.path", config["models"][m]["source"].get("path"))
       for m in config["suites"][SUITE]["models"] if config["models"][m]["source"]["type"] == "local"])
if _unsafe:
    print("\n".join(_unsafe), file=sys.stderr)
    sys.exit(1)

# Every independent grader the suite's benchmarks declare must run where the scoring jobs run (repro/scoring/
# graders/; docs/scoring.md): one line naming what is missing and the fix, before any job, never a thinner check.
# With containers the scoring image installs them (containers/scoring.def.j2 tests it when built).
if not config["containers"]["enabled"]:
    from repro.scoring.graders import missing_line as _graders_missing

    _graders_line = _graders_missing(_needed)
    if _graders_line:
        print(f"Setup error: {_graders_line}", file=sys.stderr)
        sys.exit(1)

# A local checkpoint folder ({type: local, path: ...}) that is not there: said now, once (repro/config.py)
_bad_local = missing_local_checkpoints(config, config["suites"][SUITE]["models"] + list(
    (config["suites"][SUITE].get("sweep") or {}).get("models") or []
    if "sweep" in (getattr(_CLI_ARGS, "targets", None) or ()) else []), _source, SUITE)
if _bad_local and workflow.is_main_process and _NO_JOB_FLAG is None:  # not for --unlock and the like
    print("\n".join(_bad_local), file=sys.stderr)
    sys.exit(1)

# Snakemake's job records (params, code, input lists: what makes it re-run a job whose settings changed) are
# also kept inside the work and results directories, so a copied or moved directory keeps them and a config
# change after the copy re-runs exactly what it affects (workflow/workdir_records.py; docs/workflow.md 7.2a).
# A directory made before gets the records Snakemake already holds for it on its first real run.
sys.path.insert(0, os.path.join(workflow.basedir, "workflow"))
import workdir_records

_ROOTS = workdir_records.install({"<work>": WORK, "<results>": str(results_dir(config))},
                                cleanup_metadata=bool(getattr(_CLI_ARGS, "cleanup_metadata", None)))
if getattr(getattr(workflow.workflow_settings, "persistence_backend", None), "name", "FILE") != "FILE" \
        and workflow.is_main_process:
    print("note: --persistence-backend other than file: Snakemake's job records stay in its database only, so a "
          "copied or moved work directory does not see config changes made after the copy", file=sys.stderr)
# --drop-metadata: no job record is written (Snakemake's keep_metadata), so an output without one is reused as it
# is rather than re-made on every run (RootedPersistence._keeps_records); say what that costs, once.
if getattr(_CLI_ARGS, "drop_metadata", False) and workflow.is_main_process:
    print("note: --drop-metadata: no job records are written, so an output without one (made under "
          "--drop-metadata, or in a work directory copied without its .snakemake-records folder) is reused as it "
          "is: a config change made since is not seen (docs/workflow.md 7.2a)", file=sys.stderr)


def _export_records():
    """Real runs: copy Snakemake's existing records into the directories once (a dry run counts them). (An output
    that then has no record at all -- a directory copied without its records folder, or before records were kept --
    has its job run again, with a note: workdir_records.RootedPersistence.)"""
    n = workdir_records.export_existing(_ROOTS, Path(".snakemake") / "metadata", write=not DRY_RUN)
    if n:
        print(f"note: {NO_RUN}: a real run copies " if DRY_RUN else "note: copied ", end="", file=sys.stderr)
        print(f"Snakemake's records of {n} outputs into {WORK}/{workdir_records.RECORDS_DIR} (and the results "
              "directory's): a copy or move of these directories keeps them", file=sys.stderr)


# --- Relative paths on the command line ---------------------------------------------------------------------
# The rules' outputs are absolute paths (under the work and results directories), so Snakemake finds no rule for
# a relative target or a relative --forcerun / --until / --omit-from / --prioritize file and stops with "No rule
# to produce ...". Snakemake hands the Snakefile no way to map them (its DAG settings are set after the Snakefile
# is read: snakemake/api.py DAGApi), so each relative path (anything that is not a rule name) is read from the
# command line with Snakemake's own parser and stops the run with one line naming the absolute path to give:
# the path taken relative to where the command was typed, else to the checkout, that lies under the work or
# results directory.
_TARGET_ARGS = (("targets", "target"), ("forcerun", "--forcerun"), ("until", "--until"),
                ("omit_from", "--omit-from"), ("prioritize", "--prioritize"))


def relative_target_errors(args, bases, roots, relative_ok=()):
    """One line per relative file path among the command line's targets and target options (``args``: Snakemake's
    parsed command line), naming the absolute path to give instead. Rule names (Python identifiers), absolute
    paths, URLs and paths matching a glob of ``relative_ok`` (outputs declared relative: the compare files,
    analysis_common.smk) are fine."""
    errors = []
    for field, flag in _TARGET_ARGS:
        for item in sorted(getattr(args, field, None) or ()):
            if not isinstance(item, str) or item.isidentifier() or os.path.isabs(item) or "://" in item or \
                    any(fnmatch.fnmatch(os.path.normpath(item), g) for g in relative_ok):
                continue
            cands = list(dict.fromkeys(os.path.normpath(os.path.join(b, item)) for b in bases))
            hit = next((c for c in cands for r in roots if c.startswith(r + os.sep)), None)
            if hit is not None:
                errors.append(f"{flag} {item}: the workflow's outputs are absolute paths; give {hit}")
            elif os.sep not in item and "." not in item and item.replace("-", "_").isidentifier():
                # `main-table`: a rule name typed with hyphens, not a path
                errors.append(f"{flag} {item}: nothing of that name (rule names use underscores, e.g. "
                              f"{item.replace('-', '_')})")
            else:
                errors.append(f"{flag} {item}: no output of the workflow is there ({' or '.join(cands)}): its outputs "
                              f"are absolute paths under the work directory {roots[0]} or the results directory "
                              f"{roots[1]}; give the output's absolute path (e.g. "
                              f"{roots[0]}/{SUITE}/problems/gsm8k.jsonl) or a rule name")
    return errors


if workflow.is_main_process and _CLI_ARGS is not None:
    # the compare files are declared relative to the working directory when the results directory lies in it
    _rel_results = os.path.relpath(results_dir(config))
    _rel_errors = relative_target_errors(_CLI_ARGS, [INVOKED_IN if "INVOKED_IN" in globals() else os.getcwd(),
                                                     workflow.basedir], [WORK, str(results_dir(config))],
                                         [] if _rel_results.startswith("..") else [f"{_rel_results}/*/compare/*"])
    for _e in _rel_errors:
        print(f"Error: {_e}", file=sys.stderr)
    if _rel_errors:
        sys.exit(1)


# Rules run on the host with the interpreter running Snakemake (PY); rules with a `container:` run the
# image's python (PY_IMAGE) when containers are enabled. Rules use {PY} directly, not as a param: it decides no
# result, and as a param moving the venv would re-run every job (the one `snakemake --lint` finding kept for
# it; scripts/lint_workflow.py lists each kept finding).
PY = sys.executable
PY_IMAGE = "python" if config["containers"]["enabled"] else sys.executable
# Jobs import this checkout's `repro` (the code whose versions the params below record), wherever they run.
os.environ.update(PYTHONPATH=os.pathsep.join([workflow.basedir] + [p for p in [os.getenv("PYTHONPATH")] if p]))


# --- Runs alive on this workflow's directories (workflow/run_claims.py) -------------------------------------
# Stale locks of a killed Snakemake are removed (no --unlock needed after `kill -9`); a live run from another
# Snakemake directory on the same work or results directory stops this one at start-up, naming it. A dry run
# claims and removes nothing. Generation jobs die with the Snakemake that started them: they watch the pid
# exported here (repro.backends.lifeline).
import run_claims

if workflow.is_main_process:
    run_claims.claim_run_and_clear_stale_locks(DRY_RUN, NO_RUN, unlock=_NO_JOB_FLAG == "--unlock",
                                               force=bool(getattr(_CLI_ARGS, "force", False)))
    run_claims.claim_work_and_results_dirs([("work directory (work_dir / ORL_EVAL_WORK)", WORK),
                                            ("results directory (results_dir)", str(results_dir(config)))],
                                           DRY_RUN, NO_RUN)
    _export_records()
os.environ.update(REPRO_SNAKEMAKE_PID=str(os.getpid()))  # read by repro.backends.lifeline in every job


wildcard_constraints:
    model="[A-Za-z0-9][A-Za-z0-9._-]*",
    bench="|".join(benchmarks.names()),
    seed=r"\d+",
    suite="[A-Za-z0-9_-]+",
    shard=r"\d+",
    nshards=r"\d+",


# Every rule's shell command goes through logged(): a change to the string it returns changes every command, so
# Snakemake's "code" rerun trigger re-runs every job of every existing work directory (generation included).
# Leave it as it is unless that is meant (two failing jobs' tails can interleave on the console; accepted).
def logged(cmd, streams="> {log} 2>&1"):
    """Shell command with its output in the rule's log; on failure the log's tail goes to the console, so
    the error message (which names the file and the fix) is seen without opening the log."""
    return f"{cmd} {streams} || {{{{ echo '--- last lines of {{log}}:' >&2; tail -n 15 {{log}} >&2; exit 1; }}}}"


def W(template, **kw):
    """Absolute path under the work directory for one of repro.paths' templates."""
    return os.path.join(WORK, template.format(**kw)) if kw else os.path.join(WORK, template)


# --- Config lookups ------------------------------------------------------------------------------------------
def suite_cfg(wildcards=None):
    """The config of a suite: by name (a str), of the suite a job belongs to (``wildcards.suite``), or of the
    selected suite."""
    name = wildcards if isinstance(wildcards, str) else getattr(wildcards, "suite", None)
    return config["suites"][name or SUITE]


def model_cfg(wildcards):
    return config["models"][wildcards.model]


S = suite_cfg()


# --- Content keys: every input that decides a cell, as params (repro.provenance) ------------------------------
def checkpoint_key(wildcards):
    """hub id + revision | local folder + manifest hash + file fingerprint | tiny seed + code version."""
    return checkpoint_source_key(model_cfg(wildcards)["source"])


def data_key(wildcards):
    """sha256 of the benchmark file prepare reads (data directory, or hub id + shipped fallback). A data
    directory's file by name and content only (``data_dir:<file name>:sha256:<hex>``): the same bytes in another
    folder re-prepare and re-score nothing (the problems' meta keeps the folder they were first read from)."""
    key = data_source_key(wildcards.bench, DATA, bool(suite_cfg(wildcards)["builtin_data"]))
    if DATA is not None:
        name = benchmarks.get(wildcards.bench).file
        key = key.replace(f"data_dir:{DATA / name}:", f"data_dir:{name}:", 1)
    return key


def prompt_key(wildcards):
    """sha256 of the rendered prompts of the kept problems: what generation depends on (not the gold)."""
    limit = suite_cfg(wildcards)["limit"]
    return prompt_source_key(wildcards.bench, DATA, bool(suite_cfg(wildcards)["builtin_data"]), limit)


def code_version(stage):
    """A params function: the sha256 of one stage's code, so a code fix re-runs that stage only."""
    return lambda wildcards: stage_code_version(stage, config["backend"] if stage == "generate" else None)


# --- Checkpoints ---------------------------------------------------------------------------------------------
def fetch_command(wildcards):
    src = model_cfg(wildcards)["source"]
    out = W(P.CHECKPOINT, model=wildcards.model)
    if src["type"] == "tiny":
        return f"{PY} -m repro.checkpoint.tiny --out {out} --seed {src['seed']}" + (" --nvfp4" if src.get("nvfp4") else "")
    if src["type"] == "local":
        return f"{PY} -m repro.checkpoint download --name {wildcards.model} --local-path {src['path']} --out {out}"
    return (f"{PY} -m repro.checkpoint download --name {wildcards.model} --repo-id {src['repo_id']} "
            f"--revision {src['revision']} --out {out}")


def checkpoint_content_key(wildcards):
    """What the verified checkpoint holds (rule checkpoint_source writes it for the rules that read the
    checkpoint): checkpoint_key without a local folder's size/mtime fingerprint, which re-copies and
    re-verifies, but regenerates nothing unless the manifest changed."""
    key = json.loads(checkpoint_key(wildcards))
    key.pop("files", None)
    return json.dumps(key, sort_keys=True, separators=(",", ":"))


def reverify_stale_stamps(pairs, what="checkpoint"):
    """``pairs``: ``(folder, stamp, manifest pin or None)``. A verified stamp whose folder's files no longer have
    the recorded sizes, mtimes, inode change times and inodes (a file touched, rewritten, or put back with its
    old mtime; a copied work directory, whose files are all new inodes and whose paths Snakemake has no record
    of) no longer vouches for them: generation would refuse it. Verify such a folder again by content here,
    before the DAG is built (repro.checkpoint.verify.refresh_stale_stamp): it passes -> a fresh stamp (the rules
    reading the folder take the stamp as ancient(), so nothing regenerates); it fails -> the stamp is removed,
    a ``.FAILED`` marker beside it keeps the report, what was generated under the removed stamp is removed
    (repro.checkpoint.suspect: shards, partial and merged files, a note per model x benchmark), and the run stops
    here naming the folder, the files and the fix (exit 1). (Not a re-run of the verify job: Snakemake would not
    run it -- the jobs reading the folder are
    up to date and take the stamp as ancient() -- nor examine any job below it.) Later runs check that folder
    again while the marker is there: they stop the same way until the files are restored (a fresh stamp) or the
    folder is deleted (the next job that needs it fetches and verifies it again). A dry run verifies and removes
    nothing: it names each folder a real run would verify again."""
    failed = []
    for folder, stamp, pin in pairs:
        marker = failed_marker(stamp)
        if os.path.isfile(stamp):
            if rerun_trigger(folder, stamp) == "ok":
                continue
            why = f"changed since {stamp} was written"
        elif marker.is_file():
            why = f"failed verification in an earlier run ({marker})"
        else:
            continue
        if DRY_RUN:
            print(f"note: {NO_RUN}: {folder} {why}; a real run verifies it again by content before planning its "
                  "jobs (passes: a fresh stamp; fails: the run stops naming the files); a dry run verifies and "
                  "removes nothing, so the jobs it lists are planned on the old stamp", file=sys.stderr)
            continue
        if not os.path.isdir(folder):
            refresh_stale_stamp(folder, stamp, expect_manifest_sha256=pin)  # drops the marker
            continue
        print(f"note: {folder} {why}; verifying it again by content", file=sys.stderr)
        try:
            old_stamp = json.loads(Path(stamp).read_text()) if os.path.isfile(stamp) else None
        except (OSError, ValueError):
            old_stamp = None
        if refresh_stale_stamp(folder, stamp, expect_manifest_sha256=pin) == "failed":
            failed.append((folder, stamp, marker))
            # what was generated under the stamp that no longer holds may have read the damaged bytes: removed
            # now (shards, partial files, merged files), so after the repair exactly those cells are made again
            if old_stamp is not None:
                for line in remove_generated_under(WORK, old_stamp, Path(stamp).stem):
                    print(f"note: {line}", file=sys.stderr)
    for folder, stamp, marker in failed:
        lines = "\n".join(f"  {line}" for line in marker.read_text().splitlines())
        # a pinned manifest_sha256 that the checkpoint does not carry: pinning the new one is a fix too
        pin_fix = ("if this checkpoint is the one you mean to use, pin its manifest_sha256 in the model's source "
                   "as the line above says, and run again; else " if "(pinned)" in lines else "")
        print(f"Error: {what} {folder} failed verification against its manifest, so no job may read it (its stamp "
              f"{stamp} is removed):\n{lines}\n  fix: {pin_fix}delete the folder (rm -rf {folder}): the next run that needs "
              f"it fetches or writes it again and verifies it (to do that now, run your command with {stamp} as its "
              "target); or restore the named files. A checkpoint fetched from the hub or a local folder is hard-linked "
              "to its source (the hub cache's blob, or your folder's file), which a file changed in place has changed "
              "too: delete that source copy as well (for the hub: `huggingface-cli delete-cache`, or its blobs under "
              "HF_HUB_CACHE), else it is linked again as it is. The generations written since it was last verified (they may "
              "have read the damaged bytes) were removed when this failure was first found (that run's notes name them): "
              "they are generated again after the repair. Until then every real run stops here.",
              file=sys.stderr)
    if failed:
        sys.exit(1)


if workflow.is_main_process:
    reverify_stale_stamps((W(P.CHECKPOINT, model=m), W(P.VERIFIED, model=m),
                           config["models"][m]["source"].get("manifest_sha256"))
                          for m in config["models"] if not is_replay(config, m))


def manifest_pin_arg(wildcards):
    pin = model_cfg(wildcards)["source"].get("manifest_sha256")
    return f"--expect-manifest-sha256 {pin}" if pin else ""


def copy_of_arg(wildcards):
    """``--copy-of FOLDER`` for a local checkpoint: verification names the user's folder it was copied from."""
    src = model_cfg(wildcards)["source"]
    return f"--copy-of {src['path']}" if src["type"] == "local" else ""


# --- Problems, decoders, generation, scoring -----------------------------------------------------------------
def data_arg(wildcards):
    return f"--data-dir {DATA}" if DATA else ""


def limit_arg(wildcards):
    limit = suite_cfg(wildcards)["limit"]
    return f"--limit {limit}" if limit else ""


def render_sets(wildcards):
    s = suite_cfg(wildcards)
    mnt = s.get("max_new_tokens")
    # a sweep point's suite (analysis.smk) carries its decoder overrides; nowhere else are they set
    sets = [f"--set max_new_tokens={mnt}"] if mnt else []
    sets += [f"--set {k}={v}" for k, v in sorted((s.get("_decoder_overrides") or {}).items())]
    return " ".join(sets)


def nshards(wildcards):
    return suite_cfg(wildcards)["shards"]


def grouped(wildcards):
    """Whether the suite generates all its benchmarks of a (model, seed, shard) in one job (generate_group)."""
    return bool(suite_cfg(wildcards).get("group_benchmarks"))


def generation_outputs(suite, model, bench, seed):
    """What the generation jobs of one cell write as Snakemake outputs: its shard files, or (grouped suite)
    the indexes of the jobs that generate its shards."""
    n = suite_cfg(suite)["shards"]
    if suite_cfg(suite).get("group_benchmarks"):
        return [W(P.GROUP, suite=suite, model=model, seed=seed, shard=k, nshards=n) for k in range(n)]
    return [W(P.SHARD, suite=suite, model=model, bench=bench, seed=seed, shard=k, nshards=n) for k in range(n)]


def shard_files(wildcards):
    return generation_outputs(wildcards.suite, wildcards.model, wildcards.bench, wildcards.seed)


def merge_group_args(wildcards):
    """What the merge puts before its inputs in a grouped suite: they are the jobs' indexes (no paths in
    params: a moved work directory re-runs nothing)."""
    return f"--benchmark {wildcards.bench} --group-index" if grouped(wildcards) else ""


def group_decoders(wildcards):
    return [W(P.DECODER, suite=wildcards.suite, model=wildcards.model, bench=b, seed=wildcards.seed)
            for b in suite_cfg(wildcards)["benchmarks"]]


def group_problems(wildcards):
    return [W(P.GENERATION_PROBLEMS, suite=wildcards.suite, bench=b) for b in suite_cfg(wildcards)["benchmarks"]]



def on_gpu(wildcards):
    return suite_cfg(wildcards)["device"] == "cuda"


# --- Speed probe (generate.smk: speed_probe) -----------------------------------------------------------------
def probe_seed(wildcards):
    """The seed a speed probe decodes with: the suite's first, the one the speed table reads."""
    return suite_cfg(wildcards)["seeds"][0]


def probe_benchmarks(suite):
    """The benchmarks the speed probe runs for ``suite`` (a name): its ``speed_benchmarks`` that are among its
    benchmarks, in the suite's order, when it generates batched (``batch_size`` > 1) with the engine backend;
    [] otherwise (at batch 1 the generation records measure single-request speed themselves; SGLang records
    carry no engine timings)."""
    s = suite_cfg(suite)
    if s.get("batch_size", 1) <= 1 or config["backend"] != "engine":
        return []
    wanted = set(s.get("speed_benchmarks", ["gsm8k", "humaneval"]))
    return [b for b in s["benchmarks"] if b in wanted]


def _speed_benchmark_notes():
    """A batched suite whose ``speed_benchmarks`` name benchmarks it does not run: those get no speed probe
    (silently, before); none left means no single-request speed at all. One note each, at start-up."""
    s = S
    if s.get("batch_size", 1) <= 1 or config["backend"] != "engine":
        return []
    wanted = list(s.get("speed_benchmarks", ["gsm8k", "humaneval"]))
    off = [b for b in wanted if b not in s["benchmarks"]]
    if not off:
        return []
    if len(off) == len(wanted):
        return [f"note: suite {SUITE!r} runs no speed probe: its speed_benchmarks ({', '.join(off)}) are none of its "
                f"benchmarks ({', '.join(s['benchmarks'])}), so the speed table has no single-request tokens/s; set "
                f"suites.{SUITE}.speed_benchmarks to some of its benchmarks ({_source})"]
    return [f"note: suite {SUITE!r}: speed_benchmarks {', '.join(off)} not among its benchmarks: no speed probe for "
            f"{'it' if len(off) == 1 else 'them'} ({_source})"]


if workflow.is_main_process:
    for _note in _speed_benchmark_notes():
        print(_note, file=sys.stderr)


def probe_files(suite):
    """The speed probes' record files of ``suite``: generated models x :func:`probe_benchmarks`."""
    return [W(P.SPEED_PROBE, suite=suite, model=m, bench=b)
            for m in suite_cfg(suite)["models"] if not is_replay(config, m) for b in probe_benchmarks(suite)]


# Benchmarks whose verdicts come from running programs in the sandbox (the ones scoring.timeout_s affects).
def score_timeout_arg(wildcards):
    """``--timeout S`` for benchmarks of kind ``code`` (programs run in the sandbox), empty otherwise."""
    return f"--timeout {config['scoring']['timeout_s']}" if benchmarks.get(wildcards.bench).kind == "code" else ""


# --- Table ---------------------------------------------------------------------------------------------------
def table_inputs(wildcards):
    cells = suite_cells(config)
    return {
        "summaries": [W(P.SUMMARY, suite=SUITE, model=c.model, bench=c.benchmark, seed=c.seed) for c in cells],
        # the independent graders' listed verdicts: the caption's band, listed_verdicts.md, provenance (repro/scoring/second_grader.py)
        "disagreements": [W(P.DISAGREEMENTS, suite=SUITE, model=c.model, bench=c.benchmark, seed=c.seed) for c in cells],
        "generations": [W(P.GENERATIONS, suite=SUITE, model=c.model, bench=c.benchmark, seed=c.seed) for c in cells],
        "images": image_sidecars(),
        # the paper's numbers, when the suite shows them: editing the file re-renders the table
        "reported": [os.path.join(workflow.basedir, "repro", "tables", "reported.json")] if S["reported"] else [],
        "shards": list(dict.fromkeys(f for c in cells if not is_replay(config, c.model)  # replay: no shards
                                     for f in generation_outputs(SUITE, c.model, c.benchmark, c.seed))),
    }


def table_spec():
    """What the table shows and the paper-facing words for it (labels, LaTeX label), plus each model's
    checkpoint source (for provenance)."""
    return json.dumps({
        "models": [{"name": m, "label": config["models"][m]["label"],
                    "quantization": declared_quantization(config["models"][m]),  # precision in the captions
                    "checkpoint_source": json.loads(checkpoint_source_key(config["models"][m]["source"])),
                    "repo_id": config["models"][m]["source"].get("repo_id"), "replay": is_replay(config, m)}
                   for m in S["models"]],
        "benchmarks": S["benchmarks"], "seeds": S["seeds"], "backend": config["backend"],
        "reported": S["reported"],
        "latex_label": config.get("table", {}).get("latex_label") or f"tab:main-{SUITE}"})
