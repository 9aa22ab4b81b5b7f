"""When each test runs: the order of the files, and the tests left from the README's command for CI's later stage.

Contract (called by ``tests/conftest.py``'s hooks; a uniquely named module, as ``eval_data.py``):

* :func:`order` sorts the collected tests so that the files of :data:`LONGEST_FIRST` run first, in its order, the
  rest after them in collection order (a stable sort: each file's tests stay together, in their own order). Under the
  README's ``-n 2 --dist loadfile`` pytest-xdist hands each worker whole files in that order (conftest turns off
  xdist's own order, most tests first, which left the long single-test end-to-end files for the end, where one
  worker ran them while the other had nothing left), so the files left for the end are short.
* :func:`leave_for_later` marks the tests of :data:`LATER` ``later`` and leaves them out of a run that gives no
  marker expression (``-m``), no ``--run-later`` and does not name their file: the README's command. Each needs
  20 s or more of a quiet 2-core machine (a whole multi-step pipeline scenario, or several engine processes); CI's
  later stage runs them (``.ci/run``: ``pytest -m later -n 2 --dist loadfile``), and so does any run that names
  their file, ``-m later`` or ``--run-later``. :func:`summary_line` says how many were left out and how to run them.

Both lists name tests by their node id (or a prefix of it: a file). Only timing depends on them: a renamed test
falls out of :data:`LATER` and runs in the README's command again; a file missing from :data:`LONGEST_FIRST` runs
after those listed.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

#: Test files by their duration in one run of the README's command, the tests of :data:`LATER` left out (seconds per
#: file, from --junitxml, on the shared 2-core development machine, mostly quiet, 2026-12-07): the longest first.
LONGEST_FIRST = (
    "tests/workflow/test_startup.py",               # 63
    "tests/engine/test_parallel.py",                # 62
    "tests/kernels/test_batched_forward.py",        # 45
    "tests/plumbing/test_cluster.py",               # 43
    "tests/engine/test_batch.py",                   # 42
    "tests/engine/test_batch_graph.py",             # 36
    "tests/engine/test_parity.py",                  # 34
    "tests/plumbing/test_container_exec.py",        # 29
    "tests/scoring/test_sandbox.py",                # 28
    "tests/plumbing/test_nvfp4_pipeline.py",        # 27
    "tests/workflow/test_analysis_targets.py",      # 26
    "tests/kernels/test_graph_backend.py",          # 24
    "tests/engine/test_mask_candidate.py",          # 23
    "tests/workflow/test_dag.py",                   # 23
    "tests/serve/test_lm_eval.py",                  # 23
    "tests/workflow/test_tensor_parallel_config.py",  # 20
    "tests/serve/test_serve_load.py",               # 20
    "tests/workflow/test_config.py",                # 20
)

#: Tests that need 20 s or more each of a quiet 2-core machine (seconds measured there, 2026-12-07), left out of the
#: README's command and run by CI's later stage (module docstring). The rest of each file still runs.
LATER = (
    "tests/workflow/test_tracked_inputs.py",          # 143: three models' run, then some forty Snakemake runs
    "tests/workflow/test_copied_work_dir.py::test_config_and_data_changes_after_a_copy_or_move",  # 32
    "tests/workflow/test_precision_label_e2e.py",     # 30: two NVFP4 models on three benchmarks
    "tests/workflow/test_disk_full_e2e.py::test_a_run_on_a_full_work_directory_names_it",  # 28
    "tests/workflow/test_failed_prepare_e2e.py",      # 25
    "tests/workflow/test_grouped_e2e.py",             # 25
    "tests/engine/test_parallel.py::test_n_ranks_give_one_ranks_tokens_and_forwards[4]",  # 23: five processes
    "tests/workflow/test_resume_e2e.py::test_ctrl_c_then_kill9_of_snakemake_then_the_same_command_recovers",  # 22
    "tests/engine/test_parallel.py::test_n_ranks_with_packed_4bit_experts_give_one_ranks_tokens_and_forwards[4]",  # 15
)
HOW = ".venv/bin/python -m pytest -q -n 2 --dist loadfile -m later"

_left_out: list[int] = []  # how many tests this process left out (or, under xdist, its workers reported)


def _relative(item) -> str:
    try:
        return Path(str(item.path)).resolve().relative_to(REPO).as_posix()
    except ValueError:  # outside the checkout
        return ""


def order(items: list) -> None:
    """Sort ``items`` in place: the files of :data:`LONGEST_FIRST` first (module docstring)."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(_relative(item), len(rank)))


def _named_files(config) -> set[Path]:
    """The test files the command line names (``path`` or ``path::test``), not folders."""
    out = set()
    for arg in config.args:
        p = Path(str(arg).split("::", 1)[0])
        if p.is_file():
            out.add(p.resolve())
    return out


def is_later(item) -> bool:
    """Whether ``item`` is one of :data:`LATER` (its node id, or a test of a file named there)."""
    return any(item.nodeid == n or item.nodeid.startswith(n + "::") or item.nodeid.startswith(n + "[")
               or (n.endswith(".py") and _relative(item) == n) for n in LATER)


def mark_later(item, later_marker) -> None:
    """Mark ``item`` with ``later_marker`` when it is one of :data:`LATER` (at collection, before ``-m`` selects)."""
    if is_later(item):
        item.add_marker(later_marker)


def leave_for_later(config, items: list) -> None:
    """Remove the tests marked ``later`` from ``items`` (reporting them deselected) unless the run asks for them
    (module docstring)."""
    chosen = [item for item in items if item.get_closest_marker("later") is not None]
    if config.option.markexpr or config.getoption("run_later"):
        return
    named = _named_files(config)
    out = [item for item in chosen if Path(str(item.path)).resolve() not in named]
    if out:
        config.hook.pytest_deselected(items=out)
        gone = set(map(id, out))
        items[:] = [item for item in items if id(item) not in gone]
    _left_out[:] = [len(out)]
    if hasattr(config, "workeroutput"):  # a pytest-xdist worker: the controller prints the line
        config.workeroutput["later_left_out"] = len(out)


def worker_done(node) -> None:
    """Under pytest-xdist: note what a finished worker left out (each collects the same tests)."""
    n = getattr(node, "workeroutput", {}).get("later_left_out")
    if n is not None:
        _left_out[:] = [n]


def summary_line() -> str | None:
    """One line saying how many tests were left for CI's later stage and how to run them; None when none was."""
    n = _left_out[0] if _left_out else 0
    if not n:
        return None
    return (f"{n} tests left for CI's later stage (marked later: 20 s or more each on 2 cores, tests/schedule.py); "
            f"run them with {HOW}")
