"""The NVFP4 model through the workflow, on the smoke suite's tiny NVFP4 checkpoint (`tiny-orl-nvfp4`) and one real
GSM8K problem:

* engine backend: the 4-bit mode runs end to end on the CPU, no dequantized copy is made, and the main table,
  the speed table and provenance name the row's precision as the model card does;
* SGLang backend (SGLang stubbed as the model card's ORL build, as in test_sglang_backend.py): the rule
  dequantize_checkpoint writes the BF16 copy (hashed, provenance with the source's key and manifest hash), it
  is verified, and the generation job's command line -- run here in-process -- gives SGLang that copy, not
  the NVFP4 directory; a new tiny seed or new dequantize code makes the copy again and regenerates its cells,
  a touched file of the copy re-verifies and regenerates nothing.

The run uses a copy of the checkout (the test edits the dequantize code) and its own work directory.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import eval_data
from plumbing_util import ROOT

pytestmark = pytest.mark.slow

MODEL = "tiny-orl-nvfp4"
PREC_4BIT = "nvfp4-w4a16 (NVFP4 weights kept in 4 bits, each expert dequantized per forward in torch on the CPU)"


def job_counts(out: str) -> dict:
    return {k: int(v) for k, v in re.findall(r"^(\w+)\s+(\d+)$", out, re.M)}


class Run:
    def __init__(self, root: Path, data: Path):
        self.root, self.data = root, data
        self.checkout, self.work, self.results = root / "checkout", root / "work", root / "results"

    def overlay(self, backend="engine", seed=0) -> Path:
        model = {"source": {"type": "tiny", "seed": seed, "nvfp4": True}}
        suite = {"models": [MODEL], "benchmarks": ["gsm8k"], "limit": 1, "max_new_tokens": 16}
        if backend == "sglang":  # SGLang runs on CUDA, the NVFP4 checkpoint as its BF16 copy
            model["precision"], suite["device"], suite["precision"] = "bf16", "cuda", "bf16"
        p = self.root / f"overlay-{backend}-{seed}.json"
        p.write_text(json.dumps({"data_dir": str(self.data), "results_dir": str(self.results),
                                 "work_dir": str(self.work), "backend": backend, "models": {MODEL: model},
                                 "suites": {"smoke": suite}}))
        return p

    def snakemake(self, *args, backend="engine", seed=0, check=True) -> str:
        cmd = [sys.executable, "-m", "snakemake", *args, "--cores", "2", "--snakefile",
               str(self.checkout / "Snakefile"), "--configfile", str(self.checkout / "config.yaml"),
               str(self.overlay(backend, seed))]
        r = subprocess.run(cmd, cwd=self.root, capture_output=True, text=True, timeout=600,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
        out = r.stdout + r.stderr
        if check:
            assert r.returncode == 0, out[-3000:]
        return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    data = eval_data.require()
    r = Run(tmp_path_factory.mktemp("nvfp4"), data)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("repro", "workflow", "profiles"):
        shutil.copytree(ROOT / name, r.checkout / name, ignore=ignore)
    for name in ("Snakefile", "config.yaml"):
        shutil.copy(ROOT / name, r.checkout / name)
    r.engine_out = r.snakemake("main_table")
    return r


def test_engine_backend_runs_the_4bit_mode_and_the_tables_name_it(run):
    assert not (run.work / "dequantized").exists()  # the engine reads the NVFP4 export itself
    res = run.results / "smoke"
    md = (res / "main_table.md").read_text()
    assert f"Precision: {PREC_4BIT}." in md.split("\n\n")[0]
    tex = (res / "main_table.tex").read_text()
    assert f"Precision: {PREC_4BIT}." in tex[tex.index("\\caption{"):tex.index("\\label{")]
    import pandas as pd

    row = pd.read_csv(res / "main_table.csv").iloc[0]
    assert (row["model"], row["precision"]) == (MODEL, PREC_4BIT)
    speed = (res / "speed_table.md").read_text().splitlines()[0]
    assert f", {PREC_4BIT}, engine path" in speed
    cell = json.loads((res / "provenance.json").read_text())["cells"][0]
    assert (cell["precision"], cell["quantization"], cell["precision_label"]) == ("nvfp4-w4a16", "nvfp4", PREC_4BIT)
    assert cell["quant_provenance"] is None


def test_sglang_reads_the_dequantized_bf16_copy(run, monkeypatch):
    from test_sglang_backend import _install_stub

    from repro.backends import generation_job

    # everything before generation: the copy is written and verified (generation needs SGLang and a GPU)
    out = run.snakemake("main_table", "--omit-from", "generate_shard", backend="sglang")
    deq, stamp = run.work / "dequantized" / MODEL, run.work / "verified" / "dequantized" / f"{MODEL}.json"
    assert stamp.is_file() and "rule dequantize_checkpoint" in out
    prov = json.loads((deq / "quant_provenance.json").read_text())
    src_manifest = json.loads((run.work / "hf" / MODEL / "checkpoint_manifest.json").read_text())
    assert prov["dequantized_from"]["manifest_sha256"] == src_manifest["manifest_sha256"]
    assert prov["dequantized_from"]["source_key"]["nvfp4"] is True and prov["dtype"] == "bfloat16"
    assert len(prov["code_version"]) == 64 and str(run.root) not in json.dumps(prov)  # no machine path
    assert "quantization_config" not in json.loads((deq / "config.json").read_text())

    dry = run.snakemake("-n", "-p", "main_table", backend="sglang")
    assert "dequantize_checkpoint" not in job_counts(dry) and job_counts(dry)["generate_shard"] == 1
    cmd = next(l for l in dry.splitlines() if "repro.backends.generation_job" in l)
    argv = shlex.split(cmd.split(" 2> ")[0])
    argv = argv[argv.index("repro.backends.generation_job") + 1:]
    assert argv[argv.index("--model-dir") + 1] == str(deq) and argv[argv.index("--verified") + 1] == str(stamp)

    calls = _install_stub(monkeypatch, "orl")
    monkeypatch.setattr(generation_job, "check_device", lambda *a, **k: None)  # no GPU here; SGLang is a stub
    assert generation_job.main(argv) == 0
    assert [kw["model_path"] for kw in calls["engine"]] == [str(deq)]
    shard = Path(argv[argv.index("--out") + 1])
    info = json.loads(Path(str(shard) + ".meta.json").read_text())["backend_info"]
    assert info["weights"] == "NVFP4 weights dequantized to BF16 before loading"
    assert info["quant_provenance"]["dequantized_from"]["manifest_sha256"] == src_manifest["manifest_sha256"]


def test_a_new_source_or_dequantize_code_makes_the_copy_again(run):
    if not (run.work / "verified" / "dequantized" / f"{MODEL}.json").is_file():
        pytest.skip("needs test_sglang_reads_the_dequantized_bf16_copy first")
    again = {"dequantized_source": 1, "dequantize_checkpoint": 1, "verify_dequantized_checkpoint": 1}
    counts = job_counts(run.snakemake("-n", "main_table", backend="sglang", seed=1))
    assert {k: counts.get(k) for k in again} == again and counts["download_checkpoint"] == 1
    code = run.checkout / "repro" / "checkpoint" / "dequantize.py"
    text = code.read_text()
    code.write_text(text + "\n# a dequantize fix\n")
    try:
        counts = job_counts(run.snakemake("-n", "main_table", backend="sglang"))
        assert {k: counts.get(k) for k in again} == again and "download_checkpoint" not in counts
        assert counts["generate_shard"] == 1
    finally:
        code.write_text(text)
    # a touched file of the copy: a dry run says a real run verifies it again and changes nothing; a real run
    # verifies it again by content at start-up, and nothing is re-made
    os.utime(run.work / "dequantized" / MODEL / "config.json")
    stamp = run.work / "verified" / "dequantized" / f"{MODEL}.json"
    before = stamp.read_bytes()
    out = run.snakemake("-n", "main_table", backend="sglang")
    assert f"note: dry run: {run.work / 'dequantized' / MODEL} changed since {stamp} was written" in out, out[-3000:]
    assert not set(again) & set(job_counts(out)) and stamp.read_bytes() == before
    out = run.snakemake(str(stamp), backend="sglang")
    assert "verifying it again by content" in out and stamp.read_bytes() != before
    assert "Nothing to be done" in out or not set(again) & set(job_counts(out))


def test_sglang_refuses_an_nvfp4_directory(run):
    from repro.backends.sglang import SGLangBackend, SGLangBackendError

    with pytest.raises(SGLangBackendError, match=r"NVFP4 checkpoint.*quantization: nvfp4.*repro.checkpoint dequantize"):
        SGLangBackend(str(run.work / "hf" / MODEL), role="orl")


def test_sglang_runs_the_4bit_setting_as_bf16_and_refuses_other_precisions(run, tmp_path):
    """nvfp4-w4a16 (the engine's 4-bit mode) becomes bf16 under SGLang, which runs the dequantized copy: a
    start-up note, and the model's jobs get --precision bf16; fp32 for such a model is one config error."""
    def dry_run(precision):
        cfg = json.loads(run.overlay("sglang", 0).read_text())  # SGLang: a CUDA suite
        cfg["models"][MODEL]["precision"] = precision
        overlay = tmp_path / f"{precision}.json"
        overlay.write_text(json.dumps(cfg))
        r = subprocess.run([sys.executable, "-m", "snakemake", "-n", "-p", "main_table", "--cores", "2",
                            "--snakefile", str(run.checkout / "Snakefile"), "--configfile",
                            str(run.checkout / "config.yaml"), str(overlay)], cwd=run.root, capture_output=True,
                           text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
        return r.returncode, r.stdout + r.stderr

    rc, out = dry_run("nvfp4-w4a16")
    assert rc == 0, out[-3000:]
    assert "note: backend sglang runs tiny-orl-nvfp4 as its dequantized BF16 copy (precision bf16" in out
    jobs = [l for l in out.splitlines() if "repro.backends.generation_job" in l and f"--model {MODEL} " in l]
    assert jobs and all("--precision bf16 " in l for l in jobs), out[-3000:]
    rc, out = dry_run("fp32")
    assert rc != 0
    assert f"Config error: backend sglang runs an NVFP4 checkpoint dequantized to BF16, but {MODEL} " \
           "(precision fp32)" in out, out[-2000:]


def test_dequantize_cli_refuses_unverified_input_and_is_reproducible(run, tmp_path, capsys):
    """The copy's manifest hash depends on the source and the code only (no paths, no times); an unverified
    source or a malformed --source-key is refused by name."""
    from repro.checkpoint.__main__ import main as ckpt_main

    src, stamp = run.work / "hf" / MODEL, run.work / "verified" / f"{MODEL}.json"
    key = '{"type": "tiny", "seed": 0, "nvfp4": true}'
    assert ckpt_main(["dequantize", "--src", str(src), "--out", str(tmp_path / "a"), "--verified", str(stamp),
                      "--source-key", key]) == 0
    assert ckpt_main(["dequantize", "--src", str(src), "--out", str(tmp_path / "b"), "--source-key", key]) == 0
    hashes = {json.loads((tmp_path / d / "checkpoint_manifest.json").read_text())["manifest_sha256"] for d in "ab"}
    assert len(hashes) == 1
    capsys.readouterr()
    assert ckpt_main(["dequantize", "--src", str(src), "--out", str(tmp_path / "c"), "--verified",
                      str(tmp_path / "none.json")]) == 2
    assert "no verified stamp" in capsys.readouterr().err and not (tmp_path / "c").exists()
    assert ckpt_main(["dequantize", "--src", str(src), "--out", str(tmp_path / "c"), "--source-key", "{x"]) == 2
    assert "--source-key is not JSON" in capsys.readouterr().err
