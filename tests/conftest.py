"""Shared fixtures: where the real benchmark data lives (never copied into the repo; ``eval_data.py``), and one
summary line at the end counting the tests skipped for lack of it and saying how to run them. When each test runs
(the longest files first; the tests left for CI's later stage, marker ``later``): ``schedule.py``."""

from pathlib import Path

import pytest

import eval_data
import schedule

REPO = eval_data.REPO


def pytest_addoption(parser):
    parser.addoption("--run-later", action="store_true", dest="run_later",
                     help="also run the tests left for CI's later stage (marker later; tests/schedule.py)")


def pytest_configure(config):
    eval_data.configure()
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist: keep schedule.order's order of the files
        config.option.loadscopereorder = False


def pytest_itemcollected(item):  # marked as collected, so that -m later selects them
    schedule.mark_later(item, pytest.mark.later)


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected theirs: the count of those left for later is exact
def pytest_collection_modifyitems(config, items):
    schedule.order(items)
    schedule.leave_for_later(config, items)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):  # pytest-xdist, in the controller
    schedule.worker_done(node)


#: how the tests of the scorer's bug-report cases end their skip reason (tests/scoring/test_cases.py and others)
CASES_SKIP = "(set ORL_EVAL_CASES)"


def pytest_terminal_summary(terminalreporter):
    """One line for all the tests skipped without the real benchmark files, one for those skipped without the
    scorer's bug-report cases (each skip stays quiet)."""
    def skipped(reason_end: str) -> int:
        return sum(1 for r in terminalreporter.stats.get("skipped", [])
                   if isinstance(r.longrepr, tuple) and r.longrepr[2].endswith(reason_end))

    n = skipped(eval_data.SKIP_REASON)
    if n:
        terminalreporter.write_line(f"{n} tests skipped: no real benchmark files in {eval_data.looked_at()}; "
                                    f"{eval_data.HOW}")
    n = skipped(CASES_SKIP)
    if n:
        terminalreporter.write_line(f"{n} tests skipped: the scorer's bug-report cases were not found; set "
                                    "ORL_EVAL_CASES=/path/to/scoring_cases.jsonl (default: "
                                    "cases/scoring_cases.jsonl beside the data folder) to run them")
    later = schedule.summary_line()
    if later:
        terminalreporter.write_line(later)


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
