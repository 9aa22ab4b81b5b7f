"""`python -m repro.engine generate --decoder FILE` reads the YAML that render_config writes; flags override it."""

import json
import os
import subprocess
import sys

from repro.config import REPO_ROOT


def test_generate_reads_rendered_decoder_yaml(tiny_dir, tmp_path):
    dec = tmp_path / "d.yaml"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "repro.paper.render_config", "--suite", "main", "--model", "llada-orl",
                        "--benchmark", "gsm8k", "--seed", "1", "--out", str(dec), "--set", "max_new_tokens=24"],
                       cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr

    def gen(*extra):
        r = subprocess.run([sys.executable, "-m", "repro.engine", "generate", "--model", str(tiny_dir), "--role", "orl",
                            "--device", "cpu", "--decoder", str(dec), *extra, "Count to ten."],
                           cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout.strip().splitlines()[-1])

    assert gen()["generated_tokens"] <= 24
    assert gen("--max-new-tokens", "8")["generated_tokens"] <= 8
