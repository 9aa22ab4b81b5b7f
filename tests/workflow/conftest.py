"""Fixtures of the workflow tests: one real smoke run shared by the end-to-end tests that start from it.

``smoke_run`` runs this checkout's workflow once per test run (``main_table`` of the tiny model on one real GSM8K
and one HumanEval problem, 8 new tokens: :data:`_e2e.SMOKE_SUITE`) and hands each test a ``cp -a`` copy of it to change
as it likes (:meth:`_e2e.Workflow.copy_to`; the job records travel with the copy, workflow/workdir_records.py).
Under pytest-xdist the workers share it: the run lives in a folder beside the workers' temporary folders, keyed
by the sha256 of everything it was made from (Snakefile, config.yaml, workflow/, repro/, the data files, the suite,
the Snakemake version), and a file lock lets one worker make it while the others wait. A test that needs another
suite runs its own :class:`_e2e.Workflow`.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
from pathlib import Path

import pytest

from _e2e import SMOKE_SUITE, Workflow
from repro.config import REPO_ROOT


def _inputs_sha256(data_dir: Path, suite: dict) -> str:
    """sha256 of what the shared run is made from (module docstring): a change to any of them makes it again."""
    import snakemake

    h = hashlib.sha256(json.dumps([suite, snakemake.__version__], sort_keys=True).encode())
    files = [REPO_ROOT / "Snakefile", REPO_ROOT / "config.yaml"]
    files += [Path(data_dir) / f"{b}.jsonl" for b in suite["benchmarks"]]
    for folder in ("workflow", "repro", "profiles"):
        files += sorted(p for p in (REPO_ROOT / folder).rglob("*")
                        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")
    for f in files:
        h.update(str(f.relative_to(REPO_ROOT) if f.is_relative_to(REPO_ROOT) else f.name).encode())
        h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()[:16]


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory, data_dir) -> Workflow:
    """The shared smoke run (module docstring), made once per test run; copy it (``copy_to``) before changing it."""
    base = tmp_path_factory.getbasetemp()
    if base.name.startswith("popen-gw"):  # pytest-xdist: the folder all workers of this test run share
        base = base.parent
    root = base / "shared-smoke" / _inputs_sha256(data_dir, SMOKE_SUITE)
    root.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f"{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one worker makes it, the others wait and reuse it
        done = root / "made"
        if not done.is_file():
            for entry in list(root.iterdir()):  # a run interrupted earlier: start over
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
            wf = Workflow(root, data_dir, SMOKE_SUITE, target="main_table")
            wf.run()
            done.write_text("")
        else:
            wf = Workflow.existing(root, SMOKE_SUITE, target="main_table")
    return wf
