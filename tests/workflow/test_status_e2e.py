"""`python -m repro.status` against a real Snakemake run on the tiny model (the built-in problems, which every
clone has): while it generates, the cell is "running" and the run alive; after a kill -9 of Snakemake
mid-generation (no process left) the table counts the partial file's records and says "stopped (rerun to resume)"
(it once said "running" for 600 s after a Ctrl-C); the run's start-up names the command (with the run's work
directory) and writes the plan of its cells; after the rerun
every cell is done."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from _e2e import Workflow
from repro.config import REPO_ROOT
from repro.data import BUILTIN_DIR
from repro.io import read_jsonl_tolerant

pytestmark = pytest.mark.slow


def _status(wf) -> str:
    r = subprocess.run([sys.executable, "-m", "repro.status", "--work", str(wf.work), "--suite", "smoke"],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_status_of_a_killed_run_and_of_its_rerun(tmp_path):
    wf = Workflow(tmp_path, BUILTIN_DIR, {"models": ["tiny-orl"], "benchmarks": ["gsm8k", "humaneval"], "limit": 4,
                                         "max_new_tokens": 64, "group_benchmarks": True})
    index = wf.work / "smoke/generations/tiny-orl/seed12345/shard0of1.json"
    partial = wf.work / "smoke/generations/tiny-orl/seed12345/shard0of1/gsm8k.jsonl.partial.jsonl"
    alive = []
    wf.kill_mid_generation(partial, 2, index, str(index), before_kill=lambda: alive.append(_status(wf)))
    rows = {tuple(line.split()[:2]): line for line in alive[0].splitlines()}
    assert rows[("tiny-orl", "gsm8k")].endswith(" running"), alive[0]
    assert alive[0].splitlines()[-1].startswith("run: alive (Snakemake pid "), alive[0]
    done = len(read_jsonl_tolerant(partial))
    text = _status(wf)
    rows = {tuple(line.split()[:2]): line.split() for line in text.splitlines()}
    assert 2 <= done < 4 and rows[("tiny-orl", "gsm8k")][2:4] == [f"{done}/4", f"{100 * done / 4:.0f}%"], rows
    assert " ".join(rows[("tiny-orl", "gsm8k")][6:]).startswith("stopped (rerun to resume; last write"), text
    assert rows[("tiny-orl", "humaneval")][2] == "0/4" and " ".join(rows[("tiny-orl", "humaneval")][6:]) == \
        "not started", text
    assert "run: stopped (no Snakemake holds this work directory); rerun the same command to resume" in text
    plan = json.loads((wf.work / "smoke" / "plan.json").read_text())
    assert {(c["model"], c["benchmark"]) for c in plan["cells"]} == {("tiny-orl", "gsm8k"), ("tiny-orl", "humaneval")}
    out = wf.run(str(index))
    assert (f"note: progress per model × benchmark (problems done, tokens/s, ETA): python -m repro.status --suite "
            f"smoke --work {wf.work} (from the checkout") in out, out[-3000:]
    text = _status(wf)
    for bench in ("gsm8k", "humaneval"):
        line = next(x for x in text.splitlines() if x.split()[:2] == ["tiny-orl", bench])
        assert line.split()[2:4] == ["4/4", "100%"] and line.endswith("done"), text
    assert text.splitlines()[-1] == "run: every cell done"
    assert Path(index).is_file()
