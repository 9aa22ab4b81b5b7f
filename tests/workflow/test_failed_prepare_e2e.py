"""A failed re-preparation followed by a good one with the same content re-runs nothing; a real edit is still seen.

The tiny model on one real GSM8K problem (and one HumanEval problem: the shared smoke run, conftest.py). (1) A broken data file stops the run at start-up with one line naming the
file and line (workflow/rules/common.smk, repro.data.check_file), before any job: the problems files are left as
they were, and with the file restored nothing re-runs. (2) A re-preparation that fails as a job (here: its
``.meta.json`` cannot be written, after the problems file itself was replaced) puts the previous problems file back
with its mtime (workflow/rules/prepare.smk: update() outputs; workflow/workdir_records.py keeps the records of the
version put back), so with the data edit undone nothing re-runs -- before update(), the file was gone and re-making
it regenerated every model's shards of the benchmark. (3) A real edit after the failures is still seen."""

import json

import pytest

from _e2e import job_counts

pytestmark = pytest.mark.slow


def test_failed_then_good_preparation_regenerates_nothing(tmp_path, smoke_run):
    wf = smoke_run.copy_to(tmp_path)  # the shared smoke run (conftest.py): one GSM8K and one HumanEval problem
    wf.run()  # the copy brought up to date (its tables name the copy's work directory)
    problems = [wf.work / "smoke/problems/gsm8k.jsonl", wf.work / "smoke/problems/gsm8k.for-generation.jsonl"]
    before = [(p.read_bytes(), p.stat().st_mtime_ns) for p in problems]
    gsm = wf.data / "gsm8k.jsonl"
    original = gsm.read_text()
    gsm.write_text('{"question": "a line cut short\n' + original)
    out = wf.run(check=False)
    errors = [line for line in out.splitlines() if line.startswith("Config error:")]
    assert wf.returncode != 0 and len(errors) == 1, out[-3000:]
    assert f"{gsm}:1: line 1 is cut off mid-record" in errors[0] and "Error in rule" not in out, out[-3000:]
    assert [(p.read_bytes(), p.stat().st_mtime_ns) for p in problems] == before  # untouched: no job ran
    gsm.write_text(original)
    assert "Nothing to be done" in wf.run("-n")
    # (2) a gold edit that passes start-up, with the job failing after it replaced the problems file: put back
    first, rest = original.split("\n", 1)
    row = json.loads(first)
    gsm.write_text(json.dumps(dict(row, answer=row["answer"].rsplit("####", 1)[0] + "#### 123456")) + "\n" + rest)
    meta = problems[0].with_name(problems[0].name + ".meta.json")
    meta_text = meta.read_text()
    meta.unlink()
    meta.mkdir()  # the job's last write (its .meta.json) fails, even as root
    out = wf.run(check=False)
    assert wf.returncode != 0 and "Error in rule prepare_problems" in out, out[-3000:]
    assert [(p.read_bytes(), p.stat().st_mtime_ns) for p in problems] == before  # put back as they were
    meta.rmdir()
    meta.write_text(meta_text)
    gsm.write_text(original)
    assert "Nothing to be done" in wf.run("-n")
    # (3) a real change after the failures is still seen: a gold answer re-prepares and re-scores, regenerates nothing
    gsm.write_text(json.dumps(dict(row, answer=row["answer"].rsplit("####", 1)[0] + "#### 987654")) + "\n" + rest)
    dry = job_counts(wf.run("-n"))
    assert dry.get("prepare_problems") == 1 and dry.get("score") == 1 and "generate_shard" not in dry, dry
