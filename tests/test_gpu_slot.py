"""Local GPU pinning: concurrent jobs claim distinct devices through lock files; a set
CUDA_VISIBLE_DEVICES (Slurm) is respected; more jobs than GPUs fail with the cap to use."""

import os
import stat
import subprocess
import sys
import textwrap

import pytest

from repro.backends import gpu_slot


@pytest.fixture
def fake_gpus(tmp_path, monkeypatch):
    """An nvidia-smi stub on PATH that lists 2 GPUs."""
    exe = tmp_path / "bin" / "nvidia-smi"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-a)'\necho 'GPU 1: NVIDIA H200 (UUID: GPU-b)'\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{exe.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return tmp_path / "locks"


CLAIM = textwrap.dedent("""
    import os, sys, time
    from repro.backends.gpu_slot import claim_gpu, GpuSlotError
    try:
        i, h = claim_gpu(sys.argv[1])
    except GpuSlotError as e:
        print("ERR", e, flush=True); sys.exit(3)
    print(i, os.environ["CUDA_VISIBLE_DEVICES"], flush=True)
    time.sleep(float(sys.argv[2]))
""")


def test_concurrent_jobs_get_distinct_gpus_and_a_third_is_refused(fake_gpus):
    procs = [subprocess.Popen([sys.executable, "-c", CLAIM, str(fake_gpus), "5"], stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    got = sorted(p.stdout.readline().split()[0] for p in procs)
    assert got == ["0", "1"]
    third = subprocess.run([sys.executable, "-c", CLAIM, str(fake_gpus), "0"], capture_output=True, text=True)
    assert third.returncode == 3 and "--resources gpu=2" in third.stdout
    for p in procs:
        p.kill()
        p.wait()
    # locks die with their processes (also on kill -9): the GPUs are free again
    again = subprocess.run([sys.executable, "-c", CLAIM, str(fake_gpus), "0"], capture_output=True, text=True)
    assert again.stdout.split()[0] == "0"


def test_existing_cuda_visible_devices_is_respected(fake_gpus, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert gpu_slot.claim_gpu(fake_gpus) == (None, None)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "3"


def test_several_visible_devices_are_claimed_one_each(fake_gpus, monkeypatch):
    """CUDA_VISIBLE_DEVICES=2,3 gives the pipeline two GPUs: each job claims one of them, never both the first."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    procs = [subprocess.Popen([sys.executable, "-c", CLAIM, str(fake_gpus), "5"], stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    try:
        got = sorted(tuple(p.stdout.readline().split()) for p in procs)
        assert got == [("2", "2"), ("3", "3")]
        third = subprocess.run([sys.executable, "-c", CLAIM, str(fake_gpus), "0"], capture_output=True, text=True)
        assert third.returncode == 3 and "(2,3)" in third.stdout and "--resources gpu=2" in third.stdout
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_no_gpu_listed(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert gpu_slot.count_gpus() == 0 and gpu_slot.claim_gpu(tmp_path / "l") == (None, None)
