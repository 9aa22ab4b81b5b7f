"""config.yaml validation: every mistake is one line naming the key and the allowed values."""

import copy
import re
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
    assert len(suite_cells(cfg, "paper")) == 12
    assert {c.model for c in suite_cells(cfg, "paper")} == {"llada", "llada-orl", "llada-orl-nvfp4"}
    assert cfg["models"]["llada-orl-nvfp4"]["source"]["repo_id"] == "yifanyu/LLaDA2.1-mini-ORL-NVFP4"
    assert cfg["models"]["tiny-orl-nvfp4"]["source"]["nvfp4"] is True  # the smoke suite runs the NVFP4 path


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
    assert "Config error: config.yaml + --config: backend = 'vllm' is not allowed; allowed: engine, sglang" in r.stderr


def test_error_names_every_config_file_and_missing_data_dir(tmp_path):
    ov = tmp_path / "overlay.yaml"
    ov.write_text("suit: paper\n")
    r = subprocess.run([sys.executable, "-m", "snakemake", "-n", "main_table", "--configfile", "config.yaml", str(ov)],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "Config error: config.yaml + overlay.yaml: unknown key 'suit'" in r.stderr
    env = dict(__import__("os").environ, ORL_EVAL_DATA=str(tmp_path / "nope"))
    r = subprocess.run([sys.executable, "-m", "snakemake", "-n", "main_table"], cwd=REPO_ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and f"data directory {tmp_path / 'nope'}" in r.stderr and "does not exist" in r.stderr


def test_config_yaml_named_first_is_read_once_and_merges_the_same(tmp_path, data_dir):
    """`--configfile config.yaml overlay.yaml` (the README's form) listed config.yaml twice in Snakemake's header, as
    the Snakefile's `configfile:` read it again; it is now read once, and the merged config (its MD5) is the one
    of `--configfile overlay.yaml`, where the Snakefile reads config.yaml first."""
    import snakemake
    from packaging.version import Version

    if Version(snakemake.__version__) < Version("9.22"):  # the header came with 9.22 (snakemake/snakemake#4079)
        pytest.skip(f"Snakemake {snakemake.__version__} prints no config-file header")
    ov = tmp_path / "overlay.yaml"
    ov.write_text("suites:\n  smoke:\n    limit: 1\n")
    env = dict(__import__("os").environ, ORL_EVAL_DATA=str(data_dir), ORL_EVAL_WORK=str(tmp_path / "work"))
    header = {}
    for files in (["config.yaml", str(ov)], [str(ov)]):
        r = subprocess.run([sys.executable, "-m", "snakemake", "-n", "main_table", "--configfile", *files],
                           cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        out = r.stdout + r.stderr
        header[len(files)] = (re.search(r"Config file\(s\): (.*)", out).group(1),
                              re.search(r"Config MD5: (\w+)", out).group(1))
    assert header[2][0].count("config.yaml") == 1 and "overlay.yaml" in header[2][0], header
    assert header[2][1] == header[1][1], header  # the same merged config


def test_paper_suite_refuses_shipped_problems(tmp_path, monkeypatch):
    from repro.data import DataError, load_problems

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError, match="builtin_data is false"):
        load_problems("gsm8k", None, allow_builtin=False)
    cfg = load_config()
    assert cfg["suites"]["paper"]["builtin_data"] is False and cfg["suites"]["smoke"]["builtin_data"] is True
