"""scripts/gpu/two_gpu_check.sh and its checker scripts/gpu/gpu_intervals.py: the per-GPU interval checks on
made-up job indexes (oversubscription, no overlap, a job seen by the driver on another GPU than it claimed),
and the whole script's CPU rehearsal through the real workflow: a stand-in nvidia-smi listing 2 GPUs, four
grouped jobs under --resources gpu=2, two at a time on distinct device slots, over real problems."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from plumbing_util import ROOT

sys.path.insert(0, str(ROOT / "scripts" / "gpu"))
import gpu_intervals  # noqa: E402


def write_jobs(work: Path, jobs: list[tuple]) -> None:
    """jobs: (model, shard, gpu, pid, start, end) -> the index files a grouped job writes."""
    for model, shard, gpu, pid, start, end in jobs:
        idx = work / "s" / "generations" / model / "seed1" / f"shard{shard}of4.json"
        idx.parent.mkdir(parents=True, exist_ok=True)
        idx.write_text(json.dumps({"model": model, "shard": shard, "benchmarks": {"gsm8k": {}, "mbpp": {}},
                                   "job": {"gpu": gpu, "pid": pid, "started_at": start, "ended_at": end}}))


def test_two_gpus_at_once_pass_and_oversubscription_or_serial_runs_fail(tmp_path, capsys):
    ok = tmp_path / "ok"
    write_jobs(ok, [("m", 0, "0", 10, 100.0, 110.0), ("m", 1, "1", 11, 101.0, 109.0), ("m", 2, "0", 12, 110.5, 120.0)])
    assert gpu_intervals.main(["--work", str(ok), "--suite", "s", "--out", str(tmp_path / "sum.json")]) == 0
    out = capsys.readouterr().out
    assert "GPU 0:" in out and "GPU 1:" in out and "most GPUs busy at once: 2" in out
    assert json.loads((tmp_path / "sum.json").read_text())["ok"] is True
    bad = tmp_path / "bad"
    write_jobs(bad, [("m", 0, "0", 10, 100.0, 110.0), ("m", 1, "0", 11, 105.0, 112.0)])
    assert gpu_intervals.main(["--work", str(bad), "--suite", "s"]) == 1
    out = capsys.readouterr().out
    assert "FAIL: GPU 0 oversubscribed: m shard 0 and m shard 1" in out and "at most 1 GPU(s)" in out
    serial = tmp_path / "serial"
    write_jobs(serial, [("m", 0, "0", 10, 100.0, 110.0), ("m", 1, "1", 11, 110.0, 120.0)])
    assert gpu_intervals.main(["--work", str(serial), "--suite", "s"]) == 1
    assert "at most 1 GPU(s) ran a job at one time" in capsys.readouterr().out
    assert gpu_intervals.main(["--work", str(tmp_path / "none"), "--suite", "s"]) == 2


def test_driver_samples_are_a_second_witness(tmp_path, capsys):
    write_jobs(tmp_path, [("m", 0, "0", 10, 100.0, 110.0), ("m", 1, "1", 11, 101.0, 109.0)])
    gpus = tmp_path / "gpus.csv"
    gpus.write_text("0, GPU-aaa, NVIDIA H200, 143771 MiB\n1, GPU-bbb, NVIDIA H200, 143771 MiB\n")
    samples = tmp_path / "apps.csv"
    samples.write_text("102.0, 10, GPU-aaa\n102.0, 11, GPU-bbb\n102.0, 999, GPU-aaa\n")
    args = ["--work", str(tmp_path), "--suite", "s", "--samples", str(samples), "--gpus", str(gpus)]
    assert gpu_intervals.main(args) == 0
    out = capsys.readouterr().out
    assert "driver samples matching a job: 2 (most GPUs in one sample: 2; samples of other pids: 1)" in out
    samples.write_text("102.0, 10, GPU-bbb\n102.0, 11, GPU-bbb\n")  # job 10 claimed GPU 0 but ran on GPU 1
    assert gpu_intervals.main(args) == 1
    out = capsys.readouterr().out
    assert "job pid 10 ran on GPU 1 but claimed GPU 0" in out and "GPU 1 ran jobs [10, 11] at once" in out


@pytest.mark.slow
def test_cpu_rehearsal_of_the_script(tmp_path, data_dir):
    """The real script on the CPU: one model, 4 shards -> 4 grouped jobs, 2 at a time on the 2 stand-in GPUs."""
    env = dict(os.environ, TWO_GPU_CHECK_CPU="1", PYTHON=sys.executable, OUT=str(tmp_path / "out"),
               TWO_GPU_CHECK_LIMIT="4", TWO_GPU_CHECK_TOKENS="8", TWO_GPU_CHECK_TARGET="speed_table",
               TWO_GPU_CHECK_MODELS="tiny", TWO_GPU_CHECK_SHARDS="4", ORL_EVAL_DATA=str(data_dir),
               OMP_NUM_THREADS="1", TMPDIR=str(tmp_path))
    env.pop("CUDA_VISIBLE_DEVICES", None)
    r = subprocess.run(["bash", str(ROOT / "scripts" / "gpu" / "two_gpu_check.sh")], env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["ok"] and len(summary["jobs"]) == 4 and summary["gpus_used"] == ["0", "1"]
    assert summary["max_gpus_at_once"] == 2
    assert "OK: two jobs ran at once on different GPUs" in r.stdout
    logs = (tmp_path / "out" / "generation_logs.txt").read_text()
    assert logs.count("gpu-job start") == 4 and logs.count("gpu-job end") == 4
