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


#: Test files by their duration in one run of the suite (the longest first; seconds of ``--durations`` summed per
#: file on a loaded 2-core machine, 2026-12-07). Only the order depends on it: a file missing here runs after these,
#: a stale figure costs some balance and nothing else.
LONGEST_FIRST = (
    "workflow/test_tracked_inputs.py",        # 658 s: three models' run, then a dozen reruns
    "kernels/test_batched_forward.py",        # 314
    "engine/test_parallel.py",                # 241
    "workflow/test_startup.py",               # 214
    "engine/test_batch_graph.py",             # 191
    "engine/test_batch.py",                   # 169
    "kernels/test_fastpath.py",               # 135
    "workflow/test_copied_work_dir.py",       # 124 (makes the shared smoke run: workflow/conftest.py)
    "plumbing/test_container_exec.py",        # 118
    "workflow/test_precision_label_e2e.py",   # 105
    "engine/test_llm.py",                     # 102
    "plumbing/test_checkpoint_verify.py",     # 102
    "workflow/test_resume_e2e.py",            # 90
    "workflow/test_rerun_triggers.py",        # 73
    "kernels/test_graph_backend.py",          # 71
    "workflow/test_speed_probe_e2e.py",       # 66
    "engine/test_parity.py",                  # 64
    "kernels/test_route_select.py",           # 62
    "plumbing/test_cluster.py",               # 61
    "engine/test_nvfp4.py",                   # 59
    "workflow/test_grouped_e2e.py",           # 56
)


def pytest_configure(config):
    eval_data.configure()
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist: keep the order below (module docstring)
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    """Run the files of :data:`LONGEST_FIRST` first, in its order (a stable sort: each file's tests stay together
    and in their own order)."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    tests = Path(__file__).resolve().parent

    def key(item):
        try:
            return rank.get(Path(str(item.path)).resolve().relative_to(tests).as_posix(), len(rank))
        except ValueError:  # outside tests/
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
