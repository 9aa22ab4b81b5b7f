"""A recording stand-in for the Slurm commands the Snakemake Slurm executor calls (for the plumbing tests).

``install(bin_dir, state_dir)`` writes one Python stub and links it as sbatch, sacct, squeue, srun, scontrol,
sinfo, sacctmgr, sshare, scancel. Every call is appended to ``<state>/calls.jsonl`` ({"tool", "argv"}).

* ``sbatch`` gives the next job id and records ``{"id", "argv", "comment"}`` in ``<state>/jobs.jsonl``. A job
  whose ``--comment`` contains ``$FAKE_SLURM_CANCEL`` (once per pattern) ends as ``CANCELLED by 0`` without
  running, as sacct prints a job that `scancel` stopped. With ``FAKE_SLURM_RUN=1`` the ``--wrap`` command runs
  (synchronously, in ``-D`` dir) with ``SLURM_JOB_ID`` set and, when the job asked for a GPU (``--gpus`` /
  ``--gres=gpu``), ``CUDA_VISIBLE_DEVICES=$FAKE_SLURM_GPU`` as Slurm sets it; the job ends ``COMPLETED`` or
  ``FAILED`` by its exit status. Without it every job ends ``FAILED`` (argv-only tests). A job of rule
  ``$FAKE_SLURM_TOUCH_RULE`` does not run: it writes ``$FAKE_SLURM_TOUCH`` (its output) and ends ``COMPLETED``
  (for GPU jobs on this CPU machine).
* ``sacct`` / ``squeue`` print ``<id>|<state>`` for every job (``FAKE_SLURM_NO_ACCOUNTING=1``: sacct fails as
  on a cluster without slurmdbd); ``srun`` drops its options and runs the rest; ``scontrol show config`` says
  ``MinJobAge = 300 sec`` (or ``$FAKE_SLURM_MIN_JOB_AGE``); ``sacctmgr``/``sshare`` list the account ``testacct``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

TOOLS = ("sbatch", "sacct", "squeue", "srun", "scontrol", "sinfo", "sacctmgr", "sshare", "scancel")

STUB = r'''#!{python}
import json, os, re, shlex, subprocess, sys
STATE = {state!r}
tool, argv = os.path.basename(sys.argv[0]), sys.argv[1:]
with open(os.path.join(STATE, "calls.jsonl"), "a") as f:
    f.write(json.dumps({{"tool": tool, "argv": argv}}) + "\n")

def jobs():
    p = os.path.join(STATE, "jobs.jsonl")
    return [json.loads(l) for l in open(p)] if os.path.exists(p) else []

def opt(name):
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None

if tool == "sbatch":
    jid = str(1000 + len(jobs()))
    comment = opt("--comment") or ""
    rec = {{"id": jid, "argv": argv, "comment": comment}}
    pattern = os.environ.get("FAKE_SLURM_CANCEL", "")
    cancelled = {{j.get("cancel_pattern") for j in jobs()}}
    if pattern and pattern in comment and pattern not in cancelled:
        rec.update(state="CANCELLED by 0", cancel_pattern=pattern)
    elif os.environ.get("FAKE_SLURM_TOUCH_RULE") and comment.startswith("rule_" + os.environ["FAKE_SLURM_TOUCH_RULE"]):
        os.makedirs(os.path.dirname(os.environ["FAKE_SLURM_TOUCH"]), exist_ok=True)
        open(os.environ["FAKE_SLURM_TOUCH"], "w").write("{{}}\n")
        rec["state"] = "COMPLETED"
    elif os.environ.get("FAKE_SLURM_RUN") == "1":
        env = dict(os.environ, SLURM_JOB_ID=jid)
        gpu = any(a.startswith("--gpus") or (a.startswith("--gres=") and "gpu" in a) for a in argv)
        if gpu:
            env["CUDA_VISIBLE_DEVICES"] = os.environ.get("FAKE_SLURM_GPU", "0")
        rc = subprocess.call(["bash", "-c", opt("--wrap")], cwd=opt("-D") or None, env=env,
                             stdout=open(os.path.join(STATE, f"job{{jid}}.log"), "w"), stderr=subprocess.STDOUT)
        rec["state"] = "COMPLETED" if rc == 0 else "FAILED"
    else:
        rec["state"] = "FAILED"
    with open(os.path.join(STATE, "jobs.jsonl"), "a") as f:
        f.write(json.dumps(rec) + "\n")
    print(jid)
elif tool == "sacct" and os.environ.get("FAKE_SLURM_NO_ACCOUNTING") == "1":
    print("sacct: error: Slurm accounting storage is disabled", file=sys.stderr)
    sys.exit(1)
elif tool in ("sacct", "squeue"):
    if "-j" in argv:  # reason queries for failed jobs
        sys.exit(0)
    for j in jobs():
        print(f"{{j['id']}}|{{j['state']}}")
elif tool == "srun":
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        i += 1
    os.execvp(argv[i], argv[i:])
elif tool == "scontrol":
    if argv[:2] == ["show", "config"]:
        print(f"MinJobAge               = {{os.environ.get('FAKE_SLURM_MIN_JOB_AGE', '300')}} sec")
elif tool in ("sacctmgr", "sshare"):
    print("testacct")
elif tool == "sinfo":
    print("PARTITION\ncpu\ngpu\ndebug")
'''


def install(bin_dir: Path, state_dir: Path) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    state_dir.mkdir(parents=True, exist_ok=True)
    stub = bin_dir / "fake_slurm_stub"
    stub.write_text(STUB.format(python=sys.executable, state=str(state_dir)))
    stub.chmod(0o755)
    for t in TOOLS:
        (bin_dir / t).symlink_to(stub)


def submitted(state_dir: Path) -> list[dict]:
    """The sbatch records, in submission order, each with ``rule`` (from the plugin's ``--comment``)."""
    p = state_dir / "jobs.jsonl"
    out = []
    for line in p.read_text().splitlines() if p.exists() else []:
        rec = json.loads(line)
        m = rec["comment"].split("_wildcards_")[0]
        rec["rule"] = m[len("rule_"):] if m.startswith("rule_") else m
        out.append(rec)
    return out


def flags(argv: list[str]) -> dict[str, str]:
    """sbatch argv as {option: value} (``-p X`` and ``--opt=X`` forms; flags without value map to '')."""
    out: dict[str, str] = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--") and "=" in a:
            k, v = a.split("=", 1)
            out[k] = v
        elif a.startswith("-") and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            out[a] = argv[i + 1]
            i += 1
        elif a.startswith("-"):
            out[a] = ""
        i += 1
    return out


def env_path(bin_dir: Path) -> str:
    return f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
