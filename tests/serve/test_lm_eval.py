"""lm-evaluation-harness, a harness nobody here wrote, runs GSM8K through the server: ``lm_eval --model
local-chat-completions`` with the shipped local task (docs/lm_eval/gsm8k_local.yaml: the rows of
``$ORL_EVAL_DATA/gsm8k.jsonl``, else the built-in practice problems every clone has), ``--limit 5``, as the README
runs it; it must finish and write its results file, and the server must have answered its 5 chat requests. The
task's rows follow ``$ORL_EVAL_DATA`` through lm-eval's own task loading."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from repro.config import REPO_ROOT
from repro.data import BUILTIN_DIR

import eval_data

pytest.importorskip("lm_eval", reason="lm-eval is in the 'dev' extra (scripts/setup.sh installs it)")
TASKS = REPO_ROOT / "docs" / "lm_eval"


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_the_task_reads_orl_eval_data_else_the_builtin_problems(tmp_path, monkeypatch, capsys):
    """No path in the YAML: lm-eval's task loading gets ``$ORL_EVAL_DATA/gsm8k.jsonl`` (relative to the working
    directory), the built-in file without it (said on stderr), and a folder without the file is one error naming
    it and the fix."""
    from lm_eval.tasks import TaskManager

    assert "shared" not in (TASKS / "gsm8k_local.yaml").read_text()
    builtin = _rows(BUILTIN_DIR / "gsm8k.jsonl")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "gsm8k.jsonl").write_text("".join(json.dumps(r) + "\n" for r in builtin[3:]))
    monkeypatch.chdir(tmp_path)
    tm = TaskManager(include_path=str(TASKS))

    def docs():
        return list(tm.load(["gsm8k_local"])["tasks"]["gsm8k_local"].test_docs())

    monkeypatch.setenv("ORL_EVAL_DATA", "data")
    assert docs() == builtin[3:]
    monkeypatch.delenv("ORL_EVAL_DATA")
    assert docs() == builtin and "ORL_EVAL_DATA is not set: the 5 built-in practice problems" in capsys.readouterr().err
    monkeypatch.setenv("ORL_EVAL_DATA", str(tmp_path / "empty"))
    with pytest.raises(FileNotFoundError, match=rf"{tmp_path / 'empty' / 'gsm8k.jsonl'} not found: set ORL_EVAL_DATA"):
        docs()


@pytest.mark.slow
def test_lm_eval_local_chat_completions_gsm8k(server, tmp_path):
    """The README's command with the shipped task: GSM8K's rows where the real data is, the built-in ones on a
    clone without it."""
    out = tmp_path / "results"
    name = server.health()["model"]
    log_before = server.log.read_text().count("start chat:")
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               HF_DATASETS_CACHE=str(tmp_path / "hf_datasets"))
    data = eval_data.real_data()
    if data is not None:
        env["ORL_EVAL_DATA"] = str(data)
    cmd = [sys.executable, "-m", "lm_eval", "--model", "local-chat-completions", "--model_args",
           f"model={name},base_url={server.url}/v1/chat/completions,num_concurrent=1,max_retries=1,"
           f"tokenizer_backend=None,max_gen_toks=32", "--tasks", "gsm8k_local", "--include_path", str(TASKS),
           "--limit", "5", "--apply_chat_template", "--output_path", str(out)]
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    files = list(out.rglob("results_*.json"))
    assert len(files) == 1, list(out.rglob("*"))
    res = json.loads(files[0].read_text())
    scores = res["results"]["gsm8k_local"]
    assert {"exact_match,strict-match", "exact_match,flexible-extract"} <= set(scores)
    assert res["n-samples"]["gsm8k_local"]["effective"] == 5
    log = server.log.read_text()
    assert log.count("start chat:") - log_before == 5
    assert len(re.findall(r"POST /v1/chat/completions HTTP/1.1\" 200", log)) >= 5
