"""The analysis targets of workflow/rules/analysis.smk: the sweep overrides decoder settings only inside its
own suites (and records them), a real CPU sweep writes the CSV, PNG and PDF; `compare` resolves to the
suite's pairs; the main table's DAG is untouched by either."""

import csv
import json
import os
import re
import subprocess
import sys

import pytest

from repro.config import REPO_ROOT


def snakemake(tmp_path, *args, overlay=None, dry=True):
    cmd = [sys.executable, "-m", "snakemake", *args, "--cores", "2", "--snakefile", str(REPO_ROOT / "Snakefile"),
           "--directory", str(tmp_path), "--configfile", str(REPO_ROOT / "config.yaml")]
    if overlay:
        (tmp_path / "overlay.yaml").write_text(json.dumps(overlay))
        cmd.append(str(tmp_path / "overlay.yaml"))
    cmd += ["--config", f"work_dir={tmp_path / 'work'}", f"results_dir={tmp_path / 'results'}"]
    # jobs run in tmp_path: PYTHONPATH makes them import this checkout's `repro`, whatever the venv points at
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    r = subprocess.run(cmd + (["-n", "-p"] if dry else []), cwd=tmp_path, capture_output=True, text=True, timeout=600,
                       env=env)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    return r.stdout + r.stderr


def test_sweep_dag_overrides_thresholds_only_in_its_own_suites(tmp_path):
    out = snakemake(tmp_path, "sweep")
    renders = re.findall(r"repro\.paper\.render_config .*?--out (\S+)", out)
    by_suite = {}
    for line in re.findall(r"(repro\.paper\.render_config .*)", out):
        suite = re.search(r"/work/([^/]+)/decoders/", line).group(1)
        by_suite.setdefault(suite, []).append(line)
    # 3 thresholds × 2 models × 2 benchmarks, plus the paper setting (the smoke suite itself)
    assert sorted(by_suite) == ["smoke", "smoke-sweep-t0p5", "smoke-sweep-t0p7", "smoke-sweep-t0p9"], sorted(by_suite)
    assert len(renders) == 4 * 2 * 2
    for t in ("0.5", "0.7", "0.9"):
        lines = by_suite[f"smoke-sweep-t{t.replace('.', 'p')}"]
        assert all(f"--set threshold={t}" in l for l in lines) and all("edit_threshold" not in l for l in lines)
    assert all("threshold" not in l for l in by_suite["smoke"])  # the paper's setting, untouched
    main = snakemake(tmp_path, "main_table")
    assert "smoke-sweep-" not in main and "sweep_plot" not in main and "--set threshold" not in main


def test_compare_target_builds_the_suites_pairs_and_any_named_pair(tmp_path):
    out = snakemake(tmp_path, "compare")
    assert "compare/tiny_vs_tiny-orl.md" in out and "repro.tables compare" in out
    out = snakemake(tmp_path, "results/smoke/compare/tiny_vs_tiny-s1.md")  # a target relative to the checkout
    assert re.search(r"^generate_shard\s+8$", out, re.M), out[-2000:]  # tiny-s1 is generated for the comparison


@pytest.mark.slow
def test_cpu_sweep_writes_plot_csv_and_provenance(tmp_path):
    overlay = {"suites": {"smoke": {"limit": 1, "max_new_tokens": 16, "models": ["tiny-orl"],
                                    "sweep": {"models": ["tiny-orl"], "benchmarks": ["gsm8k"],
                                              "threshold": [0.5, 0.9]}}}}
    out = snakemake(tmp_path, "sweep", overlay=overlay, dry=False)
    d = tmp_path / "results" / "smoke" / "sweep"
    # the run ends saying where the sweep went, not naming a main table it did not build
    done = [line for line in out.splitlines() if line.startswith(("Sweep: ", "Table: "))]
    assert done == [f"Sweep: {d / 'sweep.png'} (.pdf, .csv, sweep.json beside it)"], out[-2000:]
    rows = list(csv.DictReader((d / "sweep.csv").open()))
    assert [(r["point"], r["paper_setting"], r["threshold"], r["edit_threshold"]) for r in rows] == [
        ("smoke", "True", "0.85", "0.5"), ("smoke-sweep-t0p5", "False", "0.5", "0.5"),
        ("smoke-sweep-t0p9", "False", "0.9", "0.5")]
    assert all(float(r["tpf"]) > 0 and r["decoder_sha256"] for r in rows)
    assert len({r["decoder_sha256"] for r in rows}) == 3
    assert (d / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (d / "sweep.pdf").read_bytes()[:5] == b"%PDF-"
    prov = json.loads((d / "sweep.json").read_text())
    assert [p["overrides"] for p in prov["points"]] == [{}, {"threshold": 0.5}, {"threshold": 0.9}]
    cell = prov["points"][1]["cells"][0]
    assert cell["decoder"]["threshold"] == 0.5 and cell["decoder_sha256"] == rows[1]["decoder_sha256"]
    # the override never reaches the suite's own (main table) decoder
    assert prov["points"][0]["cells"][0]["decoder"]["threshold"] == 0.85


@pytest.mark.slow
def test_compare_run_ends_naming_its_outputs(tmp_path):
    # two replayed models (no generation): the run ends with where each comparison went, and no "Table:" line
    overlay = {"models": {"reference-2": {"label": "reference again", "source": {"type": "replay", "samples": "reference"}}},
               "suites": {"smoke": {"limit": 1, "models": ["reference", "reference-2"], "benchmarks": ["gsm8k"],
                                    "compare": [["reference", "reference-2"]]}}}
    out = snakemake(tmp_path, "compare", overlay=overlay, dry=False)
    d = tmp_path / "results" / "smoke" / "compare"
    done = [line for line in out.splitlines() if line.startswith(("Compare: ", "Table: "))]
    assert done == [f"Compare: {d / 'reference_vs_reference-2.md'} (.json, .csv, _problems.csv beside it)"], out[-2000:]
    assert (d / "reference_vs_reference-2.md").is_file()
