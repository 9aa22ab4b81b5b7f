"""Shared fixtures: where the real benchmark data lives (never copied into the repo; ``eval_data.py``), and one
summary line at the end counting the tests skipped for lack of it and saying how to run them.

The order the test files run in: the longest first (:data:`LONGEST_FIRST`), then the rest in collection order. Under
the README's ``-n 2 --dist loadfile`` pytest-xdist hands each worker whole files in that order, so the files left
for the end are short and both workers finish together (xdist's own order, most tests first, left the long
single-test end-to-end files for the end, where one worker ran them while the other had nothing left).
"""

from pathlib import Path

import pytest

import eval_data

REPO = eval_data.REPO


#: Test files by their duration in one run of the README's command (seconds per file, from --junitxml, on the
#: shared 2-core development machine under load, 2026-12-07): the longest first. Only the order depends on it: a
#: file missing here runs after these, a stale figure costs some balance and nothing else.
LONGEST_FIRST = (
    "tests/workflow/test_tracked_inputs.py",        # 291 s: three models' run, then a dozen reruns
    "tests/engine/test_parallel.py",                # 182
    "tests/workflow/test_startup.py",               # 167
    "tests/workflow/test_copied_work_dir.py",       # 149 s: with the shared smoke run: tests/workflow/conftest.py
    "tests/engine/test_batch.py",                   # 100
    "tests/engine/test_batch_graph.py",             # 95
    "tests/kernels/test_batched_forward.py",        # 94
    "tests/plumbing/test_cluster.py",               # 92
    "tests/plumbing/test_container_exec.py",        # 85
    "tests/workflow/test_resume_e2e.py",            # 83
    "tests/workflow/test_precision_label_e2e.py",   # 76
    "tests/kernels/test_graph_backend.py",          # 73
    "tests/workflow/test_grouped_e2e.py",           # 67
    "tests/engine/test_parity.py",                  # 64
    "tests/plumbing/test_nvfp4_pipeline.py",        # 64
    "tests/engine/test_mask_candidate.py",          # 57
    "tests/kernels/test_fastpath.py",               # 52
    "tests/plumbing/test_checkpoint_verify.py",     # 50
    "tests/engine/test_llm.py",                     # 48
    "tests/engine/test_device_step.py",             # 46
    "tests/serve/test_lm_eval.py",                  # 45
    "tests/workflow/test_analysis_targets.py",      # 45
    "tests/workflow/test_rerun_triggers.py",        # 44
    "tests/kernels/test_route_select.py",           # 44
    "tests/workflow/test_speed_probe_e2e.py",       # 39
    "tests/plumbing/test_two_gpu_check.py",         # 35
)


def pytest_configure(config):
    eval_data.configure()
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist: keep the order below (module docstring)
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    """Run the files of :data:`LONGEST_FIRST` first, in its order (a stable sort: each file's tests stay together
    and in their own order)."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}

    def key(item):
        try:
            return rank.get(Path(str(item.path)).resolve().relative_to(REPO).as_posix(), len(rank))
        except ValueError:  # outside the checkout
            return len(rank)

    items.sort(key=key)


def pytest_terminal_summary(terminalreporter):
    """One line for all the tests skipped without the real benchmark files (each skip stays quiet)."""
    n = sum(1 for r in terminalreporter.stats.get("skipped", [])
            if isinstance(r.longrepr, tuple) and r.longrepr[2].endswith(eval_data.SKIP_REASON))
    if n:
        terminalreporter.write_line(f"{n} tests skipped: no real benchmark files in {eval_data.looked_at()}; "
                                    f"{eval_data.HOW}")


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The real benchmark files' folder (``eval_data``); skips the test without them."""
    return eval_data.require()


@pytest.fixture(autouse=True)
def _restore_engine_seams():
    """Put back the engine's layer-seam choices after each test. Building an ``LLM`` on a GPU selects the Triton MoE
    and attention for the whole process (``repro.engine.llm``), and a later test would otherwise run on that choice.
    This happened: the fp32 CUDA parity test ran on TF32 Triton kernels after the batched-graph tests, and failed."""
    from repro.engine.layers import attention, moe

    saved = [(m, list(m._ACTIVE), list(getattr(m, "_ACTIVE_NAME", []))) for m in (moe, attention)]
    yield
    for m, active, name in saved:
        m._ACTIVE[:] = active
        if name:
            m._ACTIVE_NAME[:] = name
