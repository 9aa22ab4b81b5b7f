"""A hand-edited merged generation file is refused, not re-scored: the tiny model on two real GSM8K problems
through the workflow, one completion of the merged file edited, the rerun stops naming the file and the fix
(delete it), and after the fix the file is merged again from the unchanged shards and the table is as before."""

import json

import pytest

from _e2e import Workflow

pytestmark = pytest.mark.slow


def test_edited_merged_file_is_refused_and_deleting_it_re_merges(tmp_path, data_dir):
    wf = Workflow(tmp_path, data_dir, {"models": ["tiny-orl"], "benchmarks": ["gsm8k"], "limit": 2,
                                       "max_new_tokens": 32}, target="main_table")
    wf.run()
    table = wf.results / "smoke" / "main_table.csv"
    before = table.read_text()
    merged = wf.work / "smoke" / "generations" / "tiny-orl" / "gsm8k" / "seed12345.jsonl"
    original = merged.read_bytes()
    meta = json.loads((merged.parent / (merged.name + ".meta.json")).read_text())
    assert meta["shards"] and len(meta["sha256"]) == 64

    recs = [json.loads(line) for line in original.decode().splitlines()]
    recs[0]["completion"] = "The answer is \\boxed{72}."
    merged.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in recs))
    out = wf.run(check=False)
    assert wf.returncode != 0, out[-3000:]
    assert f"{merged}: changed since repro.backends.merge wrote it" in out, out[-3000:]
    assert "delete it to merge again from the shards" in out
    assert table.read_text() == before  # nothing downstream was rewritten from the edited file

    merged.unlink()  # the fix the message names
    wf.run()
    assert merged.read_bytes() == original and table.read_text() == before
