"""config.yaml validation: every mistake is one line naming the key and the allowed values."""

import copy
import subprocess
import sys

import pytest
import yaml

from repro.config import REPO_ROOT, ConfigError, load_config, suite_cells, validate_config

RAW = yaml.safe_load((REPO_ROOT / "config.yaml").read_text())


def bad(mutate):
    cfg = copy.deepcopy(RAW)
    mutate(cfg)
    with pytest.raises(ConfigError) as e:
        validate_config(cfg)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_shipped_config_is_valid_and_resolves_both_suites():
    cfg = load_config()
    assert cfg["suite"] == "smoke"
    assert len(suite_cells(cfg, "paper")) == 8
    assert {c.model for c in suite_cells(cfg, "paper")} == {"llada", "llada-orl"}


def test_unknown_top_level_key():
    msg = bad(lambda c: c.update(limt=3))
    assert "unknown key 'limt'" in msg and "allowed:" in msg and "suites" in msg


def test_unknown_nested_key_names_its_place():
    msg = bad(lambda c: c["suites"]["smoke"].update(limt=3))
    assert "'limt' in suites.smoke" in msg and "limit" in msg


def test_unknown_benchmark_lists_allowed():
    msg = bad(lambda c: c["suites"]["smoke"].update(benchmarks=["gsm8k", "gsm9k"]))
    assert "suites.smoke.benchmarks[1] = 'gsm9k'" in msg and "math500" in msg


def test_unknown_model_in_suite():
    msg = bad(lambda c: c["suites"]["paper"].update(models=["llada", "llada-rl"]))
    assert "'llada-rl'" in msg and "llada-orl" in msg


def test_wrong_type():
    msg = bad(lambda c: c["suites"]["smoke"].update(limit="five"))
    assert "suites.smoke.limit must be integer or null" in msg


def test_unknown_suite_and_backend():
    assert "allowed: paper, smoke" in bad(lambda c: c.update(suite="full"))
    assert "allowed: engine, sglang" in bad(lambda c: c.update(backend="vllm"))


def test_snakemake_stops_with_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "snakemake", "-n", "main_table", "--config", "backend=vllm"],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "Config error: config.yaml: backend = 'vllm' is not allowed; allowed: engine, sglang" in r.stderr
