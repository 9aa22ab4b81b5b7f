"""`snakemake --lint` for CI: every finding is fixed, or justified below; anything else fails.

    .venv/bin/python scripts/lint_workflow.py        # exit 0: no finding beyond the justified ones

Runs ``snakemake --lint`` on the checkout's Snakefile (text output: Snakemake 9's ``--lint json`` prints
text too), parses its findings as (subject, title) -- subject is ``rule NAME`` or the ``.smk`` file name --
and prints each one, marked ``justified`` (with the reason) or ``NEW``. Exit 1 on any new finding, or when
the linter fails without findings (e.g. a broken Snakefile); exit 0 otherwise.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: (subject pattern, title prefix) -> why the finding stays. Subject patterns are regular expressions.
JUSTIFIED = {
    (r".*", "Specify a conda environment or container for each rule"):
        "jobs run in the checkout's venv (scripts/setup.sh pins it), or with `containers: {enabled: true}` in "
        "the Apptainer image image_for() names; with containers off a rule's container is None, which the "
        "linter counts as missing",
    (r"rule \w+", "Shell command directly uses variable PY from outside of the rule"):
        "PY is the interpreter that runs the stage (the venv's python, or `python` inside an image), not an "
        "input of any result: as a param, moving the checkout or the venv would re-run every job",
    (r"rule \w+", "Shell command directly uses variable PY_IMAGE from outside of the rule"):
        "PY_IMAGE is PY for the rules that run in a container when containers are on (the image's python): "
        "as for PY",
    (r"rule (render_image_def|build_image)", "Shell command directly uses variable sys from outside"):
        "image rules run Snakemake's own interpreter on the host (container: None): as for PY",
    (r"images\.smk", "Mixed rules and functions in same snakefile"):
        "images.smk is the container set-up in one place (with repro/containers.py); its helpers image_for / "
        "image_input / image_sidecars must exist before the other rule files are included",
    (r"cluster\.smk", "Mixed rules and functions in same snakefile"):
        "cluster.smk is the cluster set-up in one place (with repro/cluster.py): the resource helpers the generation "
        "rules read (GPUs per job for tensor parallelism, GPU model, memory) and the start-up checks in onstart; "
        "the helpers must exist before generate.smk is included",
    (r"checkpoints\.smk", "Mixed rules and functions in same snakefile"):
        "the NVFP4 -> BF16 copy for SGLang is one feature: its helpers (dequantized_key, generation_checkpoint) "
        "and start-up checks sit beside its three rules, and must exist before generate.smk is included",
}


def findings(text: str) -> list[tuple[str, str]]:
    out, subject = [], None
    for line in text.splitlines():
        m = re.match(r"Lints for (rule (\w+)|snakefile (\S+)):?", line)
        if m:
            subject = f"rule {m.group(2)}" if m.group(2) else Path(m.group(3).rstrip(":")).name
            continue
        m = re.match(r"    \* (.+?):?$", line)
        if m and subject:
            out.append((subject, m.group(1).rstrip(":").rstrip(".")))
    return out


def justification(subject: str, title: str) -> str | None:
    for (pattern, prefix), why in JUSTIFIED.items():
        if re.fullmatch(pattern, subject) and title.startswith(prefix):
            return why
    return None


def main() -> int:
    snakemake = Path(sys.executable).with_name("snakemake")
    cmd = [str(snakemake) if snakemake.exists() else "snakemake", "--lint", "--snakefile", str(ROOT / "Snakefile")]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    text = r.stdout + r.stderr
    found = findings(text)
    if r.returncode != 0 and not found:
        print(text[-3000:], file=sys.stderr)
        print("lint: snakemake --lint failed without findings (see above)", file=sys.stderr)
        return 1
    new = 0
    for subject, title in found:
        why = justification(subject, title)
        new += why is None
        print(f"{'justified' if why else 'NEW':9}  {subject}: {title}" + (f"\n           ({why})" if why else ""))
    print(f"lint: {len(found)} finding(s), {new} new" + ("" if new else " (all justified)"))
    return 1 if new else 0


if __name__ == "__main__":
    sys.exit(main())
