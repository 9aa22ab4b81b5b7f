"""lm-evaluation-harness, a harness nobody here wrote, runs GSM8K through the server: ``lm_eval --model
local-chat-completions`` with the shipped local task (docs/lm_eval/gsm8k_local.yaml, real rows of
../shared/data/gsm8k.jsonl through its ``json`` dataset path), ``--limit 5``; it must finish and write its
results file, and the server must have answered its 5 chat requests."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from repro.config import REPO_ROOT

pytest.importorskip("lm_eval", reason="lm-eval is in the 'dev' extra (scripts/setup.sh installs it)")
pytestmark = pytest.mark.slow


def test_lm_eval_local_chat_completions_gsm8k(server, data_dir, tmp_path):
    task = (REPO_ROOT / "docs" / "lm_eval" / "gsm8k_local.yaml").read_text()
    assert "../shared/data/gsm8k.jsonl" in task
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "gsm8k_local.yaml").write_text(task.replace("../shared/data/gsm8k.jsonl", str(data_dir / "gsm8k.jsonl")))
    out = tmp_path / "results"
    name = server.health()["model"]
    log_before = server.log.read_text().count("start chat:")
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               HF_DATASETS_CACHE=str(tmp_path / "hf_datasets"))
    cmd = [sys.executable, "-m", "lm_eval", "--model", "local-chat-completions", "--model_args",
           f"model={name},base_url={server.url}/v1/chat/completions,num_concurrent=1,max_retries=1,"
           f"tokenizer_backend=None,max_gen_toks=32", "--tasks", "gsm8k_local", "--include_path", str(tasks),
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
