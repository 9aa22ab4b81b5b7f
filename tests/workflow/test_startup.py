"""Start-up: bad inputs stop early with one clear line, and a run started elsewhere works on the checkout.

* ``--cores 0`` stops at once naming the option (Snakemake alone waits at "Select jobs to execute" forever);
* ``snakemake -s path/to/Snakefile`` from another directory runs against the Snakefile's checkout: its
  ``.snakemake`` state (recorded params, locks) and default work directory, not new ones where it was typed;
* a data directory lacking a benchmark file the suite needs stops at start-up with one line naming the files;
* an empty data file stops prepare naming the file, and leaves no problems file behind;
* a dry run (``-n``) changes nothing: a stamp whose checkpoint changed since it was written and locks left by
  a killed Snakemake stay as they are, and the dry run says what a real run would re-verify and remove;
* a replayed model whose samples file does not exist stops at start-up naming the file (no traceback); braces
  in a label or samples path and an apostrophe in a label reach the table rules' command intact;
* a work directory that is (or lies under) a file, or a data directory that is a file, stops at start-up;
* a live run from another Snakemake directory on the same work directory stops a real run at start-up;
* a batched suite's speed_benchmarks that are not among its benchmarks (no speed probe for them) are said;
* a work, results or data directory whose path holds a space or a shell special character (the jobs' commands
  carry it unquoted) stops at start-up with one line per path, before anything is written;
* a malformed overlay (``--configfile config.yaml my.yaml``) names its file, line and column, and a missing one is
  one line, not Snakemake's "Config file is not valid JSON or YAML" or its 27-line traceback: the workflow profile,
  which Snakemake reads before the config files, checks them (repro/overlays.py);
* a local checkpoint folder (``{type: local, path: ...}``) that does not exist is said at start-up, once (it was
  found only when its download job ran, printed once per retry);
* a benchmark file in the data directory that is a dangling symlink or a folder is said for what it is (it was
  "lacks gsm8k.jsonl")."""

import json
import os
import shlex
import subprocess
import sys

import pytest

from _e2e import Workflow, checkout_copy
from repro.config import REPO_ROOT
from repro.overlays import configfile_errors


@pytest.fixture
def checkout(tmp_path):
    """A checkout of its own (its .snakemake and work/ are the test's): Snakefile + config copied, the rest linked."""
    return checkout_copy(tmp_path, link=("repro", "workflow", "profiles"), copy=("Snakefile", "config.yaml"))


def snakemake(cwd, *args, env=None):
    return subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, **(env or {})))


@pytest.mark.slow
@pytest.mark.parametrize("cores", ["0", "-1"])
def test_cores_below_one_stops_with_one_line(checkout, cores):
    r = snakemake(checkout, "--cores", cores, "main_table")
    assert r.returncode != 0
    assert f"Error: --cores {cores} lets no job run" in r.stderr and "--cores N with N >= 1" in r.stderr, r.stderr[-2000:]
    assert "Select jobs to execute..." not in r.stdout + r.stderr  # stopped before scheduling


@pytest.mark.slow
def test_snakefile_from_another_directory_runs_against_the_checkout(checkout, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = snakemake(elsewhere, "-n", "-s", str(checkout / "Snakefile"), "main_table", env={"ORL_EVAL_WORK": "w"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"note: running in the checkout {checkout}" in r.stderr
    assert (checkout / ".snakemake").is_dir() and not (elsewhere / ".snakemake").exists()
    # a relative ORL_EVAL_WORK is taken relative to where the command was typed
    assert str(elsewhere / "w" / "smoke" / "problems") in r.stdout


@pytest.mark.slow
def test_data_dir_missing_a_benchmark_file_stops_at_start_up(checkout, tmp_path, data_dir):
    data = tmp_path / "data"
    data.mkdir()
    os.symlink(data_dir / "gsm8k.jsonl", data / "gsm8k.jsonl")  # the smoke suite reads all four benchmarks
    r = snakemake(checkout, "-n", "main_table", env={"ORL_EVAL_DATA": str(data), "ORL_EVAL_WORK": str(tmp_path / "w")})
    assert r.returncode != 0
    errors = [line for line in r.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, r.stderr[-2000:]
    assert errors[0].startswith(f"Config error: data directory {data} (from $ORL_EVAL_DATA) lacks "
                                "math500.jsonl, humaneval.jsonl, mbpp.jsonl, which suite 'smoke' needs"), errors[0]
    assert "gsm8k.jsonl" not in errors[0] and "prepare_problems" not in r.stdout + r.stderr  # no job planned


def test_empty_data_file_stops_prepare_naming_it(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "humaneval.jsonl").write_text("\n\n")
    out = tmp_path / "problems" / "humaneval.jsonl"
    r = subprocess.run([sys.executable, "-m", "repro.data.prepare", "--benchmark", "humaneval", "--data-dir",
                        str(data), "--out", str(out)], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {data / 'humaneval.jsonl'}: holds no problems"), r.stderr
    assert not out.exists() and not out.with_name(out.name + ".meta.json").exists()
    # header-only (a CSV-style header line, no records): one line naming the file and line
    (data / "humaneval.jsonl").write_text("task_id,prompt,entry_point,canonical_solution,test\n")
    r = subprocess.run([sys.executable, "-m", "repro.data.prepare", "--benchmark", "humaneval", "--data-dir",
                        str(data), "--out", str(out)], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith(f"error: {data / 'humaneval.jsonl'}:1: not valid JSON"), r.stderr
    assert not out.exists()


@pytest.mark.parametrize("overlay, expect", [
    ("models: {tiny-orl-nvfp4: {precision: nvfp4}}",
     "model tiny-orl-nvfp4: precision nvfp4 (FP4 weights and activations on FP4 tensor cores) needs a Blackwell"),
    ("models: {tiny: {precision: nvfp4-w4a16}}",
     "model tiny: precision nvfp4-w4a16 keeps NVFP4 experts packed, but its checkpoint is not declared NVFP4"),
    ("backend: sglang", "backend sglang runs on CUDA GPUs only, but suite 'smoke' has device: cpu"),
])
def test_impossible_precision_or_backend_stops_at_startup(checkout, overlay, expect):
    """Choices the generation jobs could only refuse with a traceback (after a download, on the paper suite)
    stop the dry run at once, naming the config files, the model and the fix."""
    (checkout / "p.yaml").write_text(overlay + "\n")
    r = snakemake(checkout, "-n", "--cores", "1", "main_table", "--configfile", "config.yaml", "p.yaml")
    assert r.returncode != 0
    assert f"Config error (config.yaml + p.yaml): {expect}" in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr


def test_replayed_model_without_its_samples_file_stops_at_start_up_naming_it(checkout):
    """A replay model whose samples file is missing (here for one benchmark of two, `{bench}` in the path): one
    line per missing file naming the model, the absolute path and the fix. Before, Snakemake found no rule to
    replay the cell, planned its generation instead and stopped with a traceback (KeyError 'role')."""
    (checkout / "s_gsm8k.jsonl").write_text('{"id": "gsm8k/0", "completion": "42"}\n')
    (checkout / "p.yaml").write_text('models: {byhand: {label: H, source: {type: replay, samples: "s_{bench}.jsonl"}}}\n'
                                     "suites: {smoke: {models: [tiny, byhand], benchmarks: [gsm8k, mbpp]}}\n")
    r = snakemake(checkout, "-n", "--cores", "1", "main_table", "--configfile", "config.yaml", "p.yaml")
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    errors = [line for line in r.stderr.splitlines() if "error" in line.lower()]
    assert errors == [f"Config error (config.yaml + p.yaml): model byhand replays samples from {checkout / 's_mbpp.jsonl'}, "
                      "which does not exist; set models.byhand.source.samples to an existing JSONL of {id, completion} "
                      "records (an absolute path, or relative to the checkout; '{bench}' in it picks one file per "
                      "benchmark), or drop the model from suite 'smoke'"], r.stderr[-2000:]


def test_label_with_braces_and_apostrophe_and_samples_path_with_bench_reach_the_table_command(checkout):
    """Braces in a label or in a samples path (`{bench}`, as documented) and an apostrophe in a label: the table
    rules' command carries the spec intact. Before, Snakemake read the braces as wildcards of write_table's
    params (WildcardError at start-up) and the apostrophe ended the command's quoted --spec (the job failed)."""
    for bench in ("gsm8k", "mbpp"):
        (checkout / f"s_{bench}.jsonl").write_text("")
    (checkout / "p.yaml").write_text('models: {tiny: {label: "tiny\'s {v2} run"}, '
                                     'byhand: {label: H, source: {type: replay, samples: "s_{bench}.jsonl"}}}\n'
                                     "suites: {smoke: {models: [tiny, byhand], benchmarks: [gsm8k, mbpp]}}\n")
    r = snakemake(checkout, "-n", "-p", "--cores", "1", "main_table", "--configfile", "config.yaml", "p.yaml")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout[-2000:] + r.stderr[-2000:]
    commands = [line for line in r.stdout.splitlines() if " -m repro.tables" in line and "--spec" in line]
    assert len(commands) == 2, r.stdout[-3000:]  # write_table and speed_table
    for line in commands:
        words = shlex.split(line.split("set -euo pipefail;", 1)[-1])
        spec = json.loads(words[words.index("--spec") + 1])
        labels = {m["name"]: m["label"] for m in spec["models"]}
        assert labels == {"tiny": "tiny's {v2} run", "byhand": "H"}, labels
    assert "rule replay_samples" in r.stdout and "/generations/byhand/gsm8k/seed12345/shard" not in r.stdout


@pytest.mark.parametrize("var, sub, expect", [
    ("ORL_EVAL_WORK", "", "Config error: the work directory (work_dir / ORL_EVAL_WORK) {f} cannot be made: {f} is a "
                          "file, not a folder; point it at a folder (made when missing) or move that file away"),
    ("ORL_EVAL_WORK", "sub/w", "Config error: the work directory (work_dir / ORL_EVAL_WORK) {f}/sub/w cannot be made: "
                               "{f} is a file, not a folder; point it at a folder (made when missing) or move that "
                               "file away"),
    ("ORL_EVAL_DATA", "", "Config error: data directory {f} (from $ORL_EVAL_DATA) is a file, not a folder; point "
                          "ORL_EVAL_DATA at a folder"),
])
def test_a_work_or_data_directory_that_is_a_file_stops_at_start_up(checkout, tmp_path, var, sub, expect):
    """A work directory that is (or lies under) a file: one line naming it, not Snakemake's NotADirectoryError
    traceback while it builds the DAG; a data directory that is a file is called one (not "does not exist")."""
    f = tmp_path / "afile"
    f.write_text("")
    r = snakemake(checkout, "-n", "--cores", "1", "main_table", env={var: str(f / sub) if sub else str(f)})
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    errors = [line for line in r.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith(expect.format(f=f)), r.stderr[-2000:]


_HOLD = """
import fcntl, json, os, sys, time
path = sys.argv[1]
os.makedirs(os.path.dirname(path), exist_ok=True)
fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_TRUNC)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, json.dumps({"pid": os.getpid(), "directory": sys.argv[2]}).encode())
print("ready", flush=True)
time.sleep(60)
"""


def test_a_run_from_another_directory_on_the_same_work_directory_stops_at_start_up(checkout, tmp_path):
    """Two Snakemake directories (`--directory DIR`, or two checkouts with one ORL_EVAL_WORK) on one work
    directory do not see each other's locks: a live run's claim in <work>/.repro-runs/ naming another directory
    stops a real run at start-up, naming it (before, both generated into the same shards and both failed); a dry
    run only says so; a claim from the same directory is left to Snakemake's own locks; a dead run's is removed."""
    work = tmp_path / "w"
    env = {"ORL_EVAL_WORK": str(work)}
    target = str(work / "smoke" / "problems" / "gsm8k.jsonl")  # one cheap job (the shipped problems)
    cfg = checkout / "config.yaml"  # the results directory is claimed too: the test's own
    cfg.write_text(cfg.read_text().replace("\nresults_dir: null\n", f"\nresults_dir: {tmp_path / 'results'}\n", 1))
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(work / ".repro-runs" / "1.lock"), "/elsewhere"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        r = snakemake(checkout, "--cores", "1", target, env=env)
        assert r.returncode == 1, r.stderr[-2000:]
        errors = [line for line in r.stderr.splitlines() if "error" in line.lower()]
        assert errors == [f"Error: the work directory (work_dir / ORL_EVAL_WORK) {work} is in use by a Snakemake "
                          f"running in /elsewhere (pid {holder.pid}), whose locks this run in {checkout} cannot see "
                          "(each directory keeps its own .snakemake/locks), so both would write the same files; wait "
                          "for it to end and run again, run this command from that directory, or give this run its "
                          "own work and results directories (ORL_EVAL_WORK / work_dir, results_dir)"], r.stderr[-2000:]
        assert not os.path.exists(target) and "Select jobs" not in r.stdout + r.stderr
        r = snakemake(checkout, "-n", "--cores", "1", target, env=env)
        assert r.returncode == 0 and "note: dry run: the work directory" in r.stderr, r.stderr[-2000:]
    finally:
        holder.kill()
        holder.wait()
    # the holder is gone: its claim is stale, removed, and the run goes ahead
    r = snakemake(checkout, "--cores", "1", target, env=env)
    assert r.returncode == 0 and os.path.isfile(target), r.stderr[-2000:]
    assert not (work / ".repro-runs" / "1.lock").exists() and not list((work / ".repro-runs").glob("*.lock"))
    # a live run from this same directory: no refusal (Snakemake's locks decide, as for any two runs here)
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(work / ".repro-runs" / "2.lock"),
                               os.path.realpath(checkout)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        r = snakemake(checkout, "--cores", "1", target, "--forcerun", "prepare_problems", env=env)
        assert r.returncode == 0 and "is in use by a Snakemake" not in r.stderr, r.stderr[-2000:]
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.slow
def test_dry_run_keeps_a_stale_stamp_and_stale_locks_and_says_what_a_run_would_do(tmp_path, data_dir):
    wf = Workflow(tmp_path, data_dir, {"models": ["tiny-orl"], "benchmarks": ["gsm8k"], "limit": 1},
                  target=tmp_path / "work/verified/tiny-orl.json")  # the tiny checkpoint, written and verified
    wf.run()
    ckpt, stamp = wf.work / "hf/tiny-orl", wf.work / "verified/tiny-orl.json"
    weights = next(ckpt.glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # one byte of the weights changed: the checkpoint no longer verifies
    weights.write_bytes(bytes(data))
    locks = tmp_path / ".snakemake" / "locks"
    locks.mkdir()
    (locks / "0.input.lock").write_text(str(weights) + "\n")  # as left by a killed Snakemake
    before = (stamp.read_bytes(), stamp.stat().st_mtime_ns)

    out = wf.run("-n")
    assert f"note: dry run: {ckpt} changed since {stamp} was written; a real run verifies it again by content" in out, out
    assert f"note: dry run: {locks} holds the locks of a Snakemake that was killed" in out, out
    assert "run the same command without -n" in out and "--unlock" in out, out
    assert "failed verification" not in out and "verifying it again by content" not in out
    assert (stamp.read_bytes(), stamp.stat().st_mtime_ns) == before and (locks / "0.input.lock").is_file()

    # the real run: locks removed, the checkpoint verified again, its stamp removed, the run stops naming it
    out = wf.run(check=False)
    assert wf.returncode != 0, out[-3000:]
    assert "removed the locks left" in out and f"Error: checkpoint {ckpt} failed verification" in out, out[-3000:]
    assert not (locks / "0.input.lock").exists() and not stamp.exists()


@pytest.mark.slow
def test_speed_benchmarks_outside_a_batched_suites_benchmarks_are_said_at_start_up(tmp_path, data_dir):
    """A batched suite whose speed_benchmarks are none of its benchmarks runs no speed probe: said at start-up
    (silent before); with some of them among its benchmarks, the others are named."""
    wf = Workflow(tmp_path, data_dir, {"models": ["tiny-orl"], "benchmarks": ["math500"], "limit": 1,
                                       "batch_size": 2, "speed_benchmarks": ["gsm8k"]})
    out = wf.run("-n")
    assert "note: suite 'smoke' runs no speed probe: its speed_benchmarks (gsm8k) are none of its benchmarks " \
           "(math500)" in out, out[-3000:]
    wf.configure({"models": ["tiny-orl"], "benchmarks": ["math500"], "limit": 1, "batch_size": 2,
                  "speed_benchmarks": ["gsm8k", "math500"]})
    out = wf.run("-n")
    assert "speed_benchmarks gsm8k not among its benchmarks: no speed probe for it" in out, out[-3000:]


@pytest.mark.slow
def test_relative_target_paths_stop_with_the_absolute_path_to_give(checkout):
    """The outputs are absolute paths: a relative target or --forcerun / --until file (Snakemake alone: "No rule
    to produce") stops at start-up naming the absolute path to give; rule names and absolute paths run."""
    work = checkout / "w"
    env = {"ORL_EVAL_WORK": str(work)}
    problems, decoder = "w/smoke/problems/gsm8k.jsonl", "w/smoke/decoders/tiny/gsm8k/seed12345.yaml"
    r = snakemake(checkout, "-n", "main_table", "--forcerun", problems, "prepare_problems", "--until", decoder, env=env)
    assert r.returncode != 0 and "No rule to produce" not in r.stderr
    for flag, rel in (("--forcerun", problems), ("--until", decoder)):
        assert f"Error: {flag} {rel}: the workflow's outputs are absolute paths; give {checkout / rel}" in r.stderr, \
            r.stderr[-2000:]
    r = snakemake(checkout, "-n", "nowhere/x.json", env=env)
    assert r.returncode != 0 and "Error: target nowhere/x.json: no output of the workflow is there" in r.stderr
    r = snakemake(checkout, "-n", "main-table", env=env)  # a rule name typed with a hyphen
    assert r.returncode != 0 and "Error: target main-table: nothing of that name (rule names use underscores, " \
        "e.g. main_table)" in r.stderr, r.stderr[-2000:]
    r = snakemake(checkout, "-n", "main_table", "--forcerun", str(checkout / problems), env=env)
    assert r.returncode == 0 and "prepare_problems" in r.stdout, r.stderr[-2000:]


@pytest.mark.slow
def test_a_path_with_a_space_or_shell_character_stops_at_start_up(tmp_path, data_dir):
    """Before: every job failed mid-run with "unrecognized arguments" (the path split by the shell)."""
    wf = Workflow(tmp_path, data_dir, {"models": ["tiny"], "benchmarks": ["gsm8k"], "limit": 1}, target="main_table")
    wf.work, wf.results = tmp_path / "my work", tmp_path / "results$1"
    wf.configure({"models": ["tiny"], "benchmarks": ["gsm8k"], "limit": 1})
    out = wf.run(check=False)
    assert wf.returncode == 1, out[-3000:]
    lines = [ln for ln in out.splitlines() if ln.startswith("Config error:")]
    assert lines == [
        f"Config error: the work directory (work_dir / ORL_EVAL_WORK) '{tmp_path}/my work' holds a space: the jobs' "
        "shell commands carry it unquoted, so every job would fail; move or rename it to a path without whitespace "
        "or any of '\"\\$`!*?[]{}()<>|&; (a symlink does not help: the path is resolved)",
        f"Config error: the results directory (results_dir) '{tmp_path}/results$1' holds '$': the jobs' shell "
        "commands carry it unquoted, so every job would fail; move or rename it to a path without whitespace or any "
        "of '\"\\$`!*?[]{}()<>|&; (a symlink does not help: the path is resolved)"], out[-3000:]
    assert "Traceback" not in out and not wf.work.exists() and not wf.results.exists()


def test_a_mistyped_target_names_the_targets_there_are(checkout):
    """`main_tabel`: one line with the nearest target and the list, not Snakemake's MissingRuleException block."""
    r = snakemake(checkout, "-n", "--cores", "1", "main_tabel")
    assert r.returncode == 1 and "MissingRuleException" not in r.stderr, r.stderr[-2000:]
    errors = [line for line in r.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("Error: 'main_tabel' is neither a target nor a file; did "
                                                     "you mean main_table? the targets are "), errors
    assert "speed_table" in errors[0] and "sweep" in errors[0]


def test_an_overlay_is_named_after_the_config_it_overrides(checkout, tmp_path):
    """The config files in an error are listed in the order they apply: config.yaml, then the overlay."""
    overlay = tmp_path / "o3.yaml"
    overlay.write_text("suite: nonesuch\n")
    r = snakemake(checkout, "-n", "--cores", "1", "main_table", "--configfile", str(overlay))
    assert r.returncode == 1, r.stderr[-2000:]
    assert "Config error: config.yaml + o3.yaml: suite = 'nonesuch' is not defined" in r.stderr, r.stderr[-2000:]


def test_data_dir_in_the_config_says_it_wins_over_the_environment(checkout, data_dir):
    """Both set and different: one note says which folder is read and that $ORL_EVAL_DATA is not used."""
    r = snakemake(checkout, "-n", "--cores", "1", "main_table", "--config", f"data_dir={data_dir}",
                  env={"ORL_EVAL_DATA": "/nonexistent-data"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert (f"note: data directory {data_dir.resolve()} (data_dir in the config); $ORL_EVAL_DATA=/nonexistent-data is "
            "not used (data_dir wins)") in r.stderr, r.stderr[-2000:]


def _said(r) -> list[str]:
    """stderr without Snakemake's "Using workflow specific profile ..." line."""
    return [line for line in r.stderr.splitlines() if line.strip() and not line.startswith("Using ")]


def test_a_malformed_or_missing_overlay_is_one_line_naming_file_line_and_column(checkout):
    (checkout / "my.yaml").write_text("suites:\n  smoke:\n    limit 2\n    shards: 1\n")
    r = snakemake(checkout, "-n", "main_table", "--configfile", "config.yaml", "my.yaml")
    assert r.returncode == 1, r.stderr[-2000:]
    assert len(_said(r)) == 1, r.stderr
    assert _said(r)[0].startswith("Config error: my.yaml, line 4, column 11: not valid YAML"), r.stderr
    assert _said(r)[0].endswith("line 3 ('limit 2') has no ':' (a missing colon?)"), r.stderr
    assert "not valid JSON or YAML" not in r.stderr
    r = snakemake(checkout, "-n", "main_table", "--configfile", "config.yaml", "my.yml")  # a typo
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert _said(r) == [f"Config error: --configfile my.yml: no such file (looked in {checkout}); give the path of "
                        "an existing config overlay"], r.stderr
    (checkout / "my.yaml").write_text("suites:\n  smoke:\n    limit: 1\n")  # fixed: the run goes on
    r = snakemake(checkout, "-n", "main_table", "--configfile", "config.yaml", "my.yaml",
                  env={"ORL_EVAL_WORK": str(checkout / "w")})
    assert r.returncode == 0, r.stderr[-2000:]


def test_configfile_errors_say_what_is_wrong_with_each_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "good.json").write_text(json.dumps({"suite": "smoke"}))
    (tmp_path / "dir.yaml").mkdir()
    os.symlink(tmp_path / "gone.yaml", tmp_path / "link.yaml")
    assert configfile_errors(["good.json", str(tmp_path / "good.json")]) == []
    assert configfile_errors(["dir.yaml", "link.yaml"]) == [
        "Config error: --configfile dir.yaml: is a folder, not a file; give the path of a YAML overlay",
        f"Config error: --configfile link.yaml: no such file (a symlink to a missing file) (looked in {tmp_path}); "
        "give the path of an existing config overlay"]


@pytest.mark.slow
def test_a_missing_local_checkpoint_folder_is_said_at_start_up_once(checkout, tmp_path):
    gone = tmp_path / "LLaDA2.1-mini-ORL"  # never made
    (checkout / "mine.yaml").write_text(json.dumps({
        "models": {"mine": {"label": "mine", "role": "orl", "decoder": "llada-orl",
                            "source": {"type": "local", "path": str(gone)}}},
        "suites": {"smoke": {"models": ["mine"], "benchmarks": ["gsm8k"], "limit": 1}}}))
    r = snakemake(checkout, "main_table", "--cores", "1", "--configfile", "config.yaml", "mine.yaml",
                  env={"ORL_EVAL_WORK": str(tmp_path / "w")})
    assert r.returncode == 1, (r.stdout + r.stderr)[-3000:]
    errors = [line for line in r.stderr.splitlines() if "rror" in line]
    assert errors == [f"Config error: models.mine.source.path {gone} (config.yaml + mine.yaml) does not exist; point "
                      "it at the checkpoint folder (the one holding config.json, the *.safetensors and "
                      "checkpoint_manifest.json), e.g. models: {mine: {source: {type: local, path: "
                      "/data/LLaDA2.1-mini-ORL}}} in your overlay, or drop mine from suite 'smoke'"], r.stderr[-3000:]
    assert "download_checkpoint" not in r.stdout + r.stderr and not (tmp_path / "w" / "hf").exists()  # no job ran


@pytest.mark.slow
def test_a_dangling_link_or_a_folder_as_a_benchmark_file_is_said_for_what_it_is(checkout, tmp_path, data_dir):
    data = tmp_path / "data"
    data.mkdir()
    os.symlink(tmp_path / "moved" / "gsm8k.jsonl", data / "gsm8k.jsonl")  # the file moved away
    (data / "humaneval.jsonl").mkdir()  # unpacked into a folder of that name
    for b in ("math500", "mbpp"):
        os.symlink(data_dir / f"{b}.jsonl", data / f"{b}.jsonl")
    r = snakemake(checkout, "-n", "main_table", env={"ORL_EVAL_DATA": str(data), "ORL_EVAL_WORK": str(tmp_path / "w")})
    assert r.returncode == 1
    errors = [line for line in r.stderr.splitlines() if "rror" in line]
    assert errors == [f"Config error: data directory {data} (from $ORL_EVAL_DATA): gsm8k.jsonl is a symlink to "
                      f"{tmp_path / 'moved' / 'gsm8k.jsonl'}, which does not exist (a dangling link); humaneval.jsonl "
                      "is a folder, not a file; suite 'smoke' reads them as benchmark files: put the JSON Lines "
                      "file(s) there (or a link to an existing one), point ORL_EVAL_DATA at another folder, or drop "
                      "those benchmarks from the suite"], r.stderr[-2000:]
