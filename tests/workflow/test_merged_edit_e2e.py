"""A hand-edited merged generation file is refused, not re-scored: on a copy of the shared smoke run (conftest.py:
the tiny model on one real GSM8K and one HumanEval problem), the completion of the merged GSM8K file edited, the
rerun stops naming the file and the fix (delete it), and after the fix the file is merged again from the unchanged
shards and the table is as before."""

import json

import pytest

pytestmark = pytest.mark.slow


def test_edited_merged_file_is_refused_and_deleting_it_re_merges(tmp_path, smoke_run):
    wf = smoke_run.copy_to(tmp_path)
    wf.run()  # the copy's tables made again (their records name the work directory they read)
    table = wf.results / "smoke" / "main_table.csv"
    before = table.read_text()
    merged = wf.work / "smoke" / "generations" / "tiny" / "gsm8k" / "seed12345.jsonl"
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
