"""End to end through Snakemake on the tiny model: a Ctrl-C mid-generation ends with one line saying to rerun; kill -9
of Snakemake mid-generation leaves no orphaned generation process, and the same command again gives every problem
exactly once; `python -m repro.status` tells a running cell from a stopped one all along; a finished DAG reruns
nothing; deleting one generation output re-runs only it and its downstream jobs (on a copy of the shared smoke run,
conftest.py). Real problems (GSM8K) from the shared data directory."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from _e2e import Workflow, job_counts
from repro.config import REPO_ROOT
from repro.io import read_jsonl_tolerant

INTERRUPTED_LINE = ("Interrupted: the jobs were stopped; finished problems and outputs are kept. Rerun the same "
                    "command to resume.")  # workflow/rules/analysis_common.smk

pytestmark = pytest.mark.slow


@pytest.fixture
def setup(tmp_path, data_dir):
    wf = Workflow(tmp_path, data_dir, {"models": ["tiny-orl"], "benchmarks": ["gsm8k"], "limit": 6,
                                       "max_new_tokens": 256})
    gen = wf.work / "smoke/generations/tiny-orl/gsm8k/seed12345.jsonl"
    shard = wf.work / "smoke/generations/tiny-orl/gsm8k/seed12345/shard0of1.jsonl"
    return wf, gen, shard


def _status(wf) -> str:
    r = subprocess.run([sys.executable, "-m", "repro.status", "--work", str(wf.work), "--suite", "smoke"],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _row(text: str, model="tiny-orl", bench="gsm8k") -> list[str]:
    """The cell's columns: model, benchmark, done/total, %, tokens/s, ETA, state (split on 2+ spaces)."""
    return next(re.split(r"\s{2,}", line.strip()) for line in text.splitlines() if line.split()[:2] == [model, bench])


def test_ctrl_c_then_kill9_of_snakemake_then_the_same_command_recovers(setup):
    """A Ctrl-C mid-generation ends with one line saying to rerun the same command (no RuleException blocks);
    kill -9 of Snakemake alone (not its jobs): the generation job dies with it; rerunning the very same command
    (no --unlock, no --rerun-incomplete) finishes with every problem exactly once. `python -m repro.status` says
    "running" while the job runs, and "stopped (rerun to resume)" once nothing runs (it once said "running" for
    600 s after a Ctrl-C), with the partial file's records; the run's plan names its cells."""
    wf, gen, shard = setup
    partial = Path(str(shard) + ".partial.jsonl")
    out = wf.interrupt_mid_generation(partial, 1, str(gen))
    assert wf.returncode != 0 and out.rstrip().splitlines()[-1] == INTERRUPTED_LINE, out[-3000:]
    assert "RuleException" not in out and "did not complete successfully" not in out, out[-3000:]
    assert out.count("Rerun the same command") == 1
    assert (f"note: progress per model × benchmark (problems done, tokens/s, ETA): python -m repro.status --suite "
            f"smoke --work {wf.work} (from the checkout") in out, out[-3000:]
    kept = partial.read_text().count("\n")
    assert kept >= 1 and not shard.exists()
    text = _status(wf)
    assert _row(text)[2] == f"{len(read_jsonl_tolerant(partial))}/6", text
    assert _row(text)[6].startswith("stopped (rerun to resume; last write"), text
    assert text.splitlines()[-1].startswith("run: stopped (no Snakemake holds this work directory); rerun the same "
                                            "command to resume"), text
    plan = json.loads((wf.work / "smoke" / "plan.json").read_text())
    assert [(c["model"], c["benchmark"]) for c in plan["cells"]] == [("tiny-orl", "gsm8k")]
    # Snakemake only, once one more record is in: its job processes are left to themselves, and must stop
    alive = []
    pid = wf.kill_mid_generation(partial, kept + 1, shard, str(gen), before_kill=lambda: alive.append(_status(wf)))
    assert _row(alive[0])[-1] == "running" and alive[0].splitlines()[-1].startswith("run: alive (Snakemake pid "), \
        alive[0]
    assert not shard.exists() and (wf.root / ".snakemake" / "locks").exists()
    log = wf.work / "logs/generate/smoke/tiny-orl/gsm8k/seed12345/shard0of1.log"
    assert f"Snakemake (pid {pid}) has exited: stopping this job" in log.read_text()
    text = _status(wf)  # no process left: stopped, with the records the partial file holds
    done = len(read_jsonl_tolerant(partial))
    assert _row(text)[2:4] == [f"{done}/6", f"{100 * done / 6:.0f}%"], text
    assert _row(text)[6].startswith("stopped (rerun to resume"), text
    # the same command again: stale locks removed, the incomplete output re-run, resumed from the partial file
    out = wf.run(str(gen))
    assert "removed the locks left" in out, out[-3000:]
    ids = [json.loads(l)["id"] for l in gen.read_text().splitlines()]
    assert ids == [f"gsm8k/{i}" for i in range(6)]
    text = _status(wf)
    assert _row(text)[2:4] == ["6/6", "100%"] and _row(text)[-1] == "done", text
    assert text.splitlines()[-1] == "run: every cell done"


def test_rerun_is_noop_and_deleting_one_output_reruns_only_downstream(tmp_path, smoke_run):
    wf = smoke_run.copy_to(tmp_path)  # the shared smoke run (conftest.py): the tiny model on GSM8K and HumanEval
    wf.target = []  # each command below names its target
    shard = wf.work / "smoke/generations/tiny/gsm8k/seed12345/shard0of1.jsonl"
    wf.run("main_table")  # the copy's tables made again (their records name the work directory they read)
    assert "Nothing to be done" in wf.run("main_table")
    shard.unlink()
    stats = job_counts(wf.run("-n", "main_table"))
    assert stats == {"generate_shard": 1, "merge_shards": 1, "score": 1, "write_table": 1, "speed_table": 1,
                     "main_table": 1, "total": 6}


def test_a_changed_config_lists_the_records_its_run_regenerates_in_the_plan(tmp_path, smoke_run):
    """A new max_new_tokens re-runs every generation job of the finished smoke run; the run's plan lists each
    shard's records file under ``regenerate`` (so `python -m repro.status` does not count the files left from the
    old setting while the run goes), and once the run is through, status counts the rewritten files as done."""
    wf = smoke_run.copy_to(tmp_path)
    wf.configure({**wf.suite, "max_new_tokens": 6}, wf.extra)
    wf.run("main_table")
    plan = json.loads((wf.work / "smoke" / "plan.json").read_text())
    cells = {(c["model"], c["benchmark"]): c for c in plan["cells"]}
    assert set(cells) == {("tiny", "gsm8k"), ("tiny", "humaneval")}
    for (model, bench), c in cells.items():
        assert c["records"] == [f"smoke/generations/{model}/{bench}/seed12345/shard0of1.jsonl"]
        assert c["regenerate"] == c["records"], c
        assert (wf.work / c["records"][0]).stat().st_mtime >= plan["written_at"]
    text = _status(wf)
    assert _row(text, "tiny", "gsm8k")[-1] == "done" and _row(text, "tiny", "humaneval")[-1] == "done", text
