"""A data file broken for a while, then restored, re-runs nothing; a real edit after it is still seen.

The tiny model on one real GSM8K problem. A broken data file now stops the run at start-up with one line naming
the file and line (workflow/rules/common.smk, repro.data.check_file), before any job: the problems files are
left as they were. (Before that check, the re-preparation failed as a job and workflow/rules/prepare.smk's
update() outputs put the previous files back; before *that*, both problems files were gone and re-making them
regenerated every model's shards of the benchmark.) With the file restored nothing re-runs."""

import json

import pytest

from _e2e import Workflow, job_counts

pytestmark = pytest.mark.slow


def test_failed_then_good_preparation_regenerates_nothing(tmp_path, data_dir):
    wf = Workflow(tmp_path, data_dir, {"models": ["tiny"], "benchmarks": ["gsm8k"], "limit": 1, "max_new_tokens": 8},
                  target="main_table")
    wf.run()
    problems = [wf.work / "smoke/problems/gsm8k.jsonl", wf.work / "smoke/problems/gsm8k.for-generation.jsonl"]
    before = [(p.read_bytes(), p.stat().st_mtime_ns) for p in problems]
    gsm = wf.data / "gsm8k.jsonl"
    original = gsm.read_text()
    gsm.write_text('{"question": "a line cut short\n' + original)
    out = wf.run(check=False)
    errors = [line for line in out.splitlines() if line.startswith("Config error:")]
    assert wf.returncode != 0 and len(errors) == 1, out[-3000:]
    assert f"{gsm}:1: not valid JSON" in errors[0] and "Error in rule" not in out, out[-3000:]
    assert [(p.read_bytes(), p.stat().st_mtime_ns) for p in problems] == before  # put back as they were
    gsm.write_text(original)
    assert "Nothing to be done" in wf.run("-n")
    # a real change after the failure is still seen: a gold answer re-prepares and re-scores, regenerates nothing
    first, rest = original.split("\n", 1)
    row = json.loads(first)
    gsm.write_text(json.dumps(dict(row, answer=row["answer"].rsplit("####", 1)[0] + "#### 987654")) + "\n" + rest)
    dry = job_counts(wf.run("-n"))
    assert dry.get("prepare_problems") == 1 and dry.get("score") == 1 and "generate_shard" not in dry, dry
