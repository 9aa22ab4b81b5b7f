"""Jobs run inside the images: the exact `apptainer exec` line Snakemake builds, with a stub `apptainer`.

The stub logs its argv and, for `exec`, runs the command after the image natively (so outputs appear), in
the environment the container would see: under `--cleanenv` only HOME/LANG/TERM, a reset PATH (whose
`python` is the image's: this interpreter with this checkout's `repro`), `APPTAINERENV_*` and `--env`
values. With STUB_STRICT_BINDS=1 it refuses a command that names an absolute path the container cannot
see: not under a `--bind`, `--home`, the cwd, or the image's own system folders. (Apptainer also binds
/tmp by default; the stub does not count it, because the tests' folders live there.)
A tiny Snakefile includes workflow/rules/images.smk and uses its image_for/image_input helpers, as the
generation and scoring rules do; the last tests run the real workflow.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from plumbing_util import ROOT, env_with_repo

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
STUB = f"""#!{sys.executable}
import json, os, re, subprocess, sys
with open(os.environ["STUB_LOG"], "a") as f:
    f.write("\\x1f".join(["apptainer", *sys.argv[1:]]) + "\\n")
a = sys.argv[1:]
if a[:1] == ["--version"]:
    print("apptainer version 1.3.4"); sys.exit(0)
if a[:1] != ["exec"]:
    sys.exit(0)
i = next(k for k, x in enumerate(a) if x.endswith(".sif"))
opts, cmd = a[1:i], a[i + 1:]
visible = [os.getcwd(), "/usr", "/bin", "/lib", "/etc", "/dev", "/proc", "/sys", "/opt", "/.singularity.d"]
extra_env, clean = {{}}, "--cleanenv" in opts or "-e" in opts
for k, o in enumerate(opts[:-1]):
    if o in ("--bind", "-B"):
        for spec in opts[k + 1].split(","):
            if not os.path.exists(spec.split(":")[0]):  # as apptainer: a bind source must exist
                print(f"stub apptainer: bind source {{spec.split(':')[0]!r}} does not exist", file=sys.stderr)
                sys.exit(255)
            visible.append((spec.split(":") + [""])[1] or spec.split(":")[0])
    if o == "--mount":  # CSV fields: type=bind,src=...,dst=...
        import csv
        fields = dict(f.split("=", 1) for f in next(csv.reader([opts[k + 1]])) if "=" in f)
        if not os.path.exists(fields["src"]):
            print(f"stub apptainer: mount source {{fields['src']!r}} does not exist", file=sys.stderr)
            sys.exit(255)
        visible.append(fields["dst"])
    if o == "--home":
        visible.append(opts[k + 1])
    if o == "--env":
        extra_env.update(kv.split("=", 1) for kv in opts[k + 1].split(","))
if clean:
    env = {{k: os.environ[k] for k in ("LANG", "TERM") if k in os.environ}}
    env["HOME"] = opts[opts.index("--home") + 1] if "--home" in opts else os.environ.get("HOME", "/")
    env["PATH"] = {str(Path(sys.executable).parent)!r} + ":/usr/local/bin:/usr/bin:/bin"
else:
    env = dict(os.environ)
env.update({{k[len("APPTAINERENV_"):]: v for k, v in os.environ.items() if k.startswith("APPTAINERENV_")}})
env.update(extra_env)
env["PYTHONPATH"] = {str(ROOT)!r}  # the image's own `repro`
with open(os.environ["STUB_LOG"] + ".env", "a") as f:
    f.write(json.dumps({{"cmd": cmd[-1], "env": env}}) + "\\n")
if os.environ.get("STUB_STRICT_BINDS") == "1":
    for p in re.findall(r"(?<![\\w.-])(/[\\w.@+-]+(?:/[\\w.@+-]+)*)", cmd[-1]):
        if not any(p == v or p.startswith(v.rstrip("/") + "/") for v in visible):
            print(f"stub apptainer: {{p}} is not bound into the container", file=sys.stderr)
            sys.exit(255)
sys.exit(subprocess.call(cmd, env=env))
"""
SNAKEFILE = """
import os, sys
config.update({{"containers": {{"enabled": True}}, "backend": "{backend}"}})
WORK = os.path.abspath("work")
RESULTS = os.path.abspath("results")
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
    resources: gpu=1
    shell: "echo inside > {{output}}"
rule score:
    input: image_input("cpu")
    output: "score.txt"
    container: image_for("cpu")
    shell: "echo inside > {{output}}"
"""


def fake_images(work):
    """Pretend the three images were built (each .sif newer than its .def)."""
    imgs = work / "images"
    imgs.mkdir(parents=True)
    for name in ("engine", "sglang", "scoring"):
        (imgs / f"{name}.def").write_text("Bootstrap: docker\n")
    time.sleep(0.05)
    for name in ("engine", "sglang", "scoring"):
        (imgs / f"{name}.sif").write_text("img")
        (imgs / f"{name}.sif.json").write_text("{}")


def setup(tmp_path, backend):
    shutil.copytree(ROOT / "containers", tmp_path / "containers")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "apptainer").write_text(STUB)
    (tmp_path / "bin" / "apptainer").chmod(0o755)
    (tmp_path / "Snakefile").write_text(SNAKEFILE.format(backend=backend,
                                                        images_smk=ROOT / "workflow/rules/images.smk"))
    fake_images(tmp_path / "work")
    env = env_with_repo(PATH=f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}", STUB_LOG=str(tmp_path / "log"))
    return env


def test_exec_line_engine_and_scoring(tmp_path):
    """What scripts/main_table.sh passes with CONTAINERS=1 (--nv --cleanenv, the caches as APPTAINERENV_*), in a
    work directory whose path holds a comma and an HF_HOME with a space: the workflow's binds are quoted
    (--mount with CSV fields for the comma). A space in the work directory itself stops at start-up: Snakemake
    refuses an image path with whitespace."""
    hf_home = tmp_path / "hf home"
    tmp_path = tmp_path / "runs,v2"
    tmp_path.mkdir()
    env = setup(tmp_path, "engine")
    work = tmp_path / "work"
    env.update(APPTAINERENV_TRITON_CACHE_DIR=f"{work}/triton-cache", HF_HOME=str(hf_home))
    r = subprocess.run([SNAKEMAKE, "all", "--cores", "1", "--sdm", "apptainer", "--apptainer-args=--nv --cleanenv"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "gen.txt").read_text() == "inside\n"
    calls = [c.split("\x1f") for c in (tmp_path / "log").read_text().splitlines()]
    execs = {c[c.index("bash") + 2].split(";")[-1].strip(): c for c in calls if c[1] == "exec"}
    gen = execs["echo inside > gen.txt"]
    results = tmp_path / "results"
    assert gen[:12] == ["apptainer", "exec", "--home", str(tmp_path), "--nv", "--cleanenv", "--bind", str(hf_home),
                        "--mount", f'type=bind,"src={results}","dst={results}"',
                        "--mount", f'type=bind,"src={work}","dst={work}"']
    seen = {x["cmd"].split(";")[-1].strip(): x["env"] for x in
            map(json.loads, (tmp_path / "log.env").read_text().splitlines())}
    assert seen["echo inside > gen.txt"]["HF_HOME"] == str(hf_home)
    assert seen["echo inside > gen.txt"]["TRITON_CACHE_DIR"] == f"{work}/triton-cache"
    spaced = hf_home.parent / "my work"
    spaced.mkdir()
    (spaced / "Snakefile").write_text((tmp_path / "Snakefile").read_text())
    r = subprocess.run([SNAKEMAKE, "all", "--cores", "1", "-n", "--sdm", "apptainer"], cwd=spaced, env=env,
                       capture_output=True, text=True, timeout=120)
    err = [l for l in r.stderr.splitlines() if l.startswith("Config error")]
    assert r.returncode != 0 and len(err) == 1 and "holds a space" in err[0] and "ORL_EVAL_WORK" in err[0]
    assert str(work / "images" / "engine.sif") in gen
    assert str(work / "images" / "scoring.sif") in execs["echo inside > score.txt"]
    assert not any(c[1] == "build" for c in calls)  # existing, up-to-date images are not rebuilt


def test_slurm_gpu_selection_reaches_the_container(tmp_path):
    """On Slurm (recording stand-ins: sbatch runs the plugin's job step, and sets CUDA_VISIBLE_DEVICES for a
    job that asked for a GPU, as Slurm does), `apptainer exec --cleanenv` still hands the job its GPU."""
    from fake_slurm import install

    env = setup(tmp_path, "engine")
    install(tmp_path / "slurm-bin", tmp_path / "slurm-state")
    env.update(PATH=f"{tmp_path / 'slurm-bin'}{os.pathsep}{env['PATH']}", FAKE_SLURM_RUN="1", FAKE_SLURM_GPU="5")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    r = subprocess.run([SNAKEMAKE, "all", "--executor", "slurm", "--jobs", "2", "--sdm", "apptainer",
                        "--apptainer-args=--nv --cleanenv", "--default-resources", "slurm_account=testacct",
                        "--slurm-init-seconds-before-status-checks", "1"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    seen = {x["cmd"].split(";")[-1].strip(): x["env"] for x in
            map(json.loads, (tmp_path / "log.env").read_text().splitlines())}
    assert seen["echo inside > gen.txt"].get("CUDA_VISIBLE_DEVICES") == "5"  # the GPU Slurm gave the job
    assert "CUDA_VISIBLE_DEVICES" not in seen["echo inside > score.txt"]  # a CPU job got none


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
    # one line, as the other start-up errors: no WorkflowError with the Snakefile's frames
    assert 'images.smk", line' not in r.stdout + r.stderr and "WorkflowError" not in r.stdout + r.stderr


def workflow_env(tmp_path, **extra):
    """Stub apptainer first on PATH, no venv on PATH (a bare `python` on the host would not find `repro`),
    work dir outside the checkout, the four images pretended built."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "apptainer").write_text(STUB)
    (tmp_path / "bin" / "apptainer").chmod(0o755)
    work = tmp_path / "work"
    fake_images(work)
    (tmp_path / "on.yaml").write_text(f"containers:\n  enabled: true\nresults_dir: {tmp_path / 'results'}\n"
                                      "suites:\n  smoke:\n    limit: 1\n")
    env = env_with_repo(PATH=f"{tmp_path / 'bin'}{os.pathsep}/usr/bin:/bin", STUB_LOG=str(tmp_path / "log"),
                        ORL_EVAL_WORK=str(work), STUB_STRICT_BINDS="1", **extra)
    env.pop("ORL_EVAL_DATA", None)
    return env, work


def test_readme_container_command_binds_paths_and_keeps_gpu_selection(tmp_path):
    """The README's container command as written (no binds, --cleanenv) runs the real workflow: every path
    the container jobs name is bound, the host's GPU selection reaches them, host-side rules run the
    workflow's interpreter (no venv on PATH here)."""
    env, work = workflow_env(tmp_path, CUDA_VISIBLE_DEVICES="2")
    target = work / "smoke/scores/tiny/gsm8k/seed12345.summary.json"
    r = subprocess.run([SNAKEMAKE, "--cores", "2", str(target), "--configfile", str(ROOT / "config.yaml"),
                        str(tmp_path / "on.yaml"), "--sdm", "apptainer", "--apptainer-args=--nv --cleanenv"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert target.is_file()
    seen = [json.loads(line) for line in (tmp_path / "log.env").read_text().splitlines()]
    ran = {("repro.backends.generation_job" in x["cmd"]) + 2 * ("repro.scoring" in x["cmd"]) for x in seen}
    assert ran == {1, 2}  # generation and scoring ran in the container, nothing else did
    assert all(x["env"].get("CUDA_VISIBLE_DEVICES") == "2" for x in seen)
    assert all("ORL_EVAL_WORK" not in x["env"] for x in seen)  # really a clean environment
    execs = [c.split("\x1f") for c in (tmp_path / "log").read_text().splitlines() if "\x1fexec\x1f" in c]
    assert execs and all(str(work) in c and str(tmp_path / "results" / "smoke") in c for c in execs)  # binds


def test_containers_with_other_working_directory(tmp_path):
    """`-d OTHER_DIR` with containers on: the image definitions are found beside the Snakefile; with the
    Slurm executor (recording stand-ins) the image build runs on the submit host, never through sbatch
    (it fails there: the stub builds nothing)."""
    from fake_slurm import install

    env, work = workflow_env(tmp_path)
    install(tmp_path / "slurm-bin", tmp_path / "slurm-state")
    env["PATH"] = f"{tmp_path / 'slurm-bin'}{os.pathsep}{env['PATH']}"
    (work / "images" / "scoring.sif").unlink()
    other = tmp_path / "elsewhere"
    other.mkdir()
    r = subprocess.run([SNAKEMAKE, "-s", str(ROOT / "Snakefile"), "-d", str(other), "images",
                        "--configfile", str(ROOT / "config.yaml"), str(tmp_path / "on.yaml"), "--sdm", "apptainer",
                        "--executor", "slurm", "--jobs", "2", "--slurm-init-seconds-before-status-checks", "1"],
                       cwd=other, env=env, capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    assert "MissingInputException" not in out
    assert "localrule build_image:" in out and "Error in rule build_image" in out
    assert not (tmp_path / "slurm-state" / "jobs.jsonl").exists()  # nothing was submitted
