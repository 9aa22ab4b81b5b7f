"""A hand-edited merged generation file is refused, not re-scored: the tiny model on two real GSM8K problems
through the workflow, one completion of the merged file edited, the rerun stops naming the file and the fix
(delete it), and after the fix the file is merged again from the unchanged shards and the table is as before."""

import json
import subprocess
import sys

import pytest

from repro.config import REPO_ROOT

pytestmark = pytest.mark.slow


def snakemake(tmp_path, data_dir):
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(json.dumps({
        "data_dir": str(data_dir), "results_dir": str(tmp_path / "results"),
        "suites": {"smoke": {"models": ["tiny-orl"], "benchmarks": ["gsm8k"], "limit": 2, "max_new_tokens": 32}}}))
    cmd = [sys.executable, "-m", "snakemake", "main_table", "--cores", "2",
           "--snakefile", str(REPO_ROOT / "Snakefile"), "--directory", str(tmp_path),
           "--configfile", str(REPO_ROOT / "config.yaml"), str(overlay), "--config", f"work_dir={tmp_path / 'work'}"]
    return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)


def test_edited_merged_file_is_refused_and_deleting_it_re_merges(tmp_path, data_dir):
    r = snakemake(tmp_path, data_dir)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    table = tmp_path / "results" / "smoke" / "main_table.csv"
    before = table.read_text()
    merged = tmp_path / "work" / "smoke" / "generations" / "tiny-orl" / "gsm8k" / "seed12345.jsonl"
    original = merged.read_bytes()
    meta = json.loads((merged.parent / (merged.name + ".meta.json")).read_text())
    assert meta["shards"] and len(meta["sha256"]) == 64

    recs = [json.loads(line) for line in original.decode().splitlines()]
    recs[0]["completion"] = "The answer is \\boxed{72}."
    merged.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in recs))
    r = snakemake(tmp_path, data_dir)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out[-3000:]
    assert f"{merged}: changed since repro.backends.merge wrote it" in out, out[-3000:]
    assert "delete it to merge again from the shards" in out
    assert table.read_text() == before  # nothing downstream was rewritten from the edited file

    merged.unlink()  # the fix the message names
    r = snakemake(tmp_path, data_dir)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert merged.read_bytes() == original and table.read_text() == before
