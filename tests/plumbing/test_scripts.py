"""Wrapper scripts: main_table.sh MODEL CKPT_DIR builds a local-source model and runs main_table (dry run)."""

from __future__ import annotations

import subprocess

import yaml

from plumbing_util import ROOT, env_with_repo


def sh(args, tmp_path, **env):
    e = env_with_repo(ORL_EVAL_WORK=str(tmp_path / "work"), **env)
    return subprocess.run(["bash", *args], cwd=tmp_path, env=e, capture_output=True, text=True, timeout=120)


def test_main_table_sh_dry_run(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    r = sh([str(ROOT / "scripts/main_table.sh"), "tiny-orl", str(ckpt), "-n"], tmp_path, SUITE="smoke")
    assert r.returncode == 0, r.stderr[-3000:]
    overlay = yaml.safe_load((tmp_path / "work/overlays/main_table.tiny-orl.yaml").read_text())
    assert overlay["models"]["tiny-orl-local"]["source"] == {"type": "local", "path": str(ckpt)}
    assert overlay["suites"]["smoke"]["models"] == ["tiny-orl-local"]
    out = r.stdout + r.stderr
    # target first, options after it; the checkpoint is copied and verified before generation
    assert "snakemake main_table --workflow-profile workflow/profiles/local --cores all" in out
    assert f"repro.checkpoint download --name tiny-orl-local --local-path {ckpt}" in out
    assert "rule verify_checkpoint" in out and "rule generate_shard" in out


def test_main_table_sh_unknown_model(tmp_path):
    r = sh([str(ROOT / "scripts/main_table.sh"), "nope", str(tmp_path), "-n"], tmp_path)
    assert r.returncode != 0 and "not in config.yaml" in r.stderr and "llada-orl" in r.stderr


def test_main_table_sh_missing_checkpoint_dir_is_one_line(tmp_path):
    r = sh([str(ROOT / "scripts/main_table.sh"), "tiny-orl", str(tmp_path / "nope"), "-n"], tmp_path)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"error: CKPT_DIR {tmp_path / 'nope'} is not a directory; give the checkpoint folder (the one holding "
        "config.json)"], r.stderr


def test_prepare_sh_stops_before_generation(tmp_path):
    r = sh([str(ROOT / "scripts/prepare.sh"), "paper", "-n"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout + r.stderr
    assert "rule render_decoder" in out and "rule prepare_problems" in out
    assert "rule generate_shard" not in out and "rule generate_group" not in out and "rule score" not in out


def test_main_table_sh_combines_the_callers_configfiles_with_its_overlay(tmp_path):
    """`--configfile config.yaml my.yaml` in the extra args: Snakemake keeps only the last --configfile option,
    so the script passes config.yaml, my.yaml (from the caller's directory), then its overlay, in one."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (tmp_path / "my.yaml").write_text("suites:\n  smoke:\n    limit: 2\n")
    r = sh([str(ROOT / "scripts/main_table.sh"), "tiny-orl", str(ckpt), "--configfile", "config.yaml", "my.yaml", "-n"],
           tmp_path, SUITE="smoke")
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout + r.stderr
    overlay = tmp_path / "work/overlays/main_table.tiny-orl.yaml"
    assert f"--configfile config.yaml {tmp_path / 'my.yaml'} {overlay} -n" in out
    assert out.count("rule generate_shard") == 4  # the overlay's one model × 4 benchmarks, not the whole suite
    assert "--limit 2 " in out and "--limit 3 " not in out  # my.yaml's setting too


def test_bench_scoring_without_the_benchmark_files_names_the_folder_and_the_fix(tmp_path):
    """A clone has no ../shared/data: the scorer benchmark stops with one line, before any timing."""
    import sys

    r = subprocess.run([sys.executable, str(ROOT / "scripts/bench_scoring.py")], cwd=tmp_path, capture_output=True,
                       text=True, timeout=60, env=env_with_repo(ORL_EVAL_DATA=str(tmp_path / "none")))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.splitlines()[-1] == (f"bench_scoring.py: error: {tmp_path / 'none'} lacks humaneval.jsonl and "
                                         "mbpp.jsonl (the benchmarks' original files): give --data-dir DIR or set "
                                         "ORL_EVAL_DATA")
