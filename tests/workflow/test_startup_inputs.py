"""Start-up checks of inputs a new user gets wrong, each one line naming the file and the fix, before any job runs:

* a malformed overlay (``--configfile config.yaml my.yaml``) names its file, line and column, and a missing one is
  one line, not Snakemake's "Config file is not valid JSON or YAML" or its 27-line traceback: the workflow profile,
  which Snakemake reads before the config files, checks them (repro/overlays.py);
* a local checkpoint folder (``{type: local, path: ...}``) that does not exist is said at start-up, once (it was
  found only when its download job ran, printed once per retry);
* a benchmark file in the data directory that is a dangling symlink or a folder is said for what it is (it was
  "lacks gsm8k.jsonl")."""

import json
import os
import subprocess
import sys

import pytest

from _e2e import checkout_copy
from repro.overlays import configfile_errors


@pytest.fixture
def checkout(tmp_path):
    """A checkout of its own (its .snakemake and work/ are the test's), the workflow profiles linked."""
    return checkout_copy(tmp_path, link=("repro", "workflow", "profiles"), copy=("Snakefile", "config.yaml"))


def snakemake(cwd, *args, env=None):
    return subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, **(env or {})))


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
