"""Jobs run inside the images: the exact `apptainer exec` line Snakemake builds, with a stub `apptainer`.

The stub logs its argv and, for `exec`, runs the command after the image natively (so outputs appear).
A tiny Snakefile includes workflow/rules/images.smk and uses its image_for/image_input helpers, as the
generation and scoring rules do.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from plumbing_util import ROOT, env_with_repo

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
STUB = f"""#!{sys.executable}
import os, subprocess, sys
with open(os.environ["STUB_LOG"], "a") as f:
    f.write("\\x1f".join(["apptainer", *sys.argv[1:]]) + "\\n")
a = sys.argv[1:]
if a[:1] == ["--version"]:
    print("apptainer version 1.3.4"); sys.exit(0)
if a[:1] == ["exec"]:
    i = next(k for k, x in enumerate(a) if x.endswith(".sif"))
    sys.exit(subprocess.call(a[i + 1:]))
sys.exit(0)
"""
SNAKEFILE = """
import os, sys
config.update({{"containers": {{"enabled": True}}, "backend": "{backend}"}})
WORK = os.path.abspath("work")
def W(t):
    return os.path.join(WORK, t)
def logged(cmd, streams="> {{log}} 2>&1"):  # as in common.smk, without the log tail
    return cmd + " " + streams
include: "{images_smk}"
rule all:
    input: "gen.txt", "score.txt"
rule gen:
    input: image_input("generate")
    output: "gen.txt"
    container: image_for("generate")
    shell: "echo inside > {{output}}"
rule score:
    input: image_input("cpu")
    output: "score.txt"
    container: image_for("cpu")
    shell: "echo inside > {{output}}"
"""


def setup(tmp_path, backend):
    shutil.copytree(ROOT / "containers", tmp_path / "containers")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "apptainer").write_text(STUB)
    (tmp_path / "bin" / "apptainer").chmod(0o755)
    (tmp_path / "Snakefile").write_text(SNAKEFILE.format(backend=backend,
                                                        images_smk=ROOT / "workflow/rules/images.smk"))
    imgs = tmp_path / "work" / "images"
    imgs.mkdir(parents=True)
    for name in ("engine", "sglang", "scoring"):  # pretend the images were built (newer than their .def)
        (imgs / f"{name}.def").write_text("Bootstrap: docker\n")
    time.sleep(0.05)
    for name in ("engine", "sglang", "scoring"):
        (imgs / f"{name}.sif").write_text("img")
        (imgs / f"{name}.sif.json").write_text("{}")
    env = env_with_repo(PATH=f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}", STUB_LOG=str(tmp_path / "log"))
    return env


def test_exec_line_engine_and_scoring(tmp_path):
    env = setup(tmp_path, "engine")
    work = tmp_path / "work"
    args = (f"--apptainer-args=--nv --cleanenv --bind {work} --env HF_HOME={work}/hf-home,"
            f"TRITON_CACHE_DIR={work}/triton-cache")  # what scripts/main_table.sh passes with CONTAINERS=1
    r = subprocess.run([SNAKEMAKE, "all", "--cores", "1", "--sdm", "apptainer", args], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "gen.txt").read_text() == "inside\n"
    calls = [c.split("\x1f") for c in (tmp_path / "log").read_text().splitlines()]
    execs = {c[c.index("bash") + 2].split(";")[-1].strip(): c for c in calls if c[1] == "exec"}
    gen = execs["echo inside > gen.txt"]
    assert gen[:10] == ["apptainer", "exec", "--home", str(tmp_path), "--nv", "--cleanenv", "--bind", str(work),
                        "--env", f"HF_HOME={work}/hf-home,TRITON_CACHE_DIR={work}/triton-cache"]
    assert str(work / "images" / "engine.sif") in gen
    assert str(work / "images" / "scoring.sif") in execs["echo inside > score.txt"]
    assert not any(c[1] == "build" for c in calls)  # existing, up-to-date images are not rebuilt


def test_sglang_backend_uses_sglang_image(tmp_path):
    env = setup(tmp_path, "sglang")
    r = subprocess.run([SNAKEMAKE, "all", "--cores", "1", "--sdm", "apptainer", "--apptainer-args=--nv"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    log = (tmp_path / "log").read_text()
    assert str(tmp_path / "work/images/sglang.sif") in log and "engine.sif" not in log


def test_enabled_without_apptainer_or_sdm_stops(tmp_path):
    env = setup(tmp_path, "engine")
    r = subprocess.run([SNAKEMAKE, "all", "--cores", "1", "-n"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0 and "without `--sdm apptainer`" in r.stdout + r.stderr
    env["PATH"] = "/usr/bin:/bin"
    r = subprocess.run([SNAKEMAKE, "all", "--cores", "1", "-n"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0 and "neither `apptainer` nor `singularity`" in r.stdout + r.stderr
