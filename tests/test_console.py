"""repro.console: a tqdm bar in a log file is a line per redraw; warnings print on one line without a path."""

import io
import subprocess
import sys
import warnings

from tqdm import tqdm

from repro.console import LineStream, bar_interval, bar_stream, plain_warnings


def test_a_bar_in_a_log_file_writes_whole_lines():
    log = io.StringIO()  # not a TTY, like a job's "2> {log}"
    stream = bar_stream(log)
    assert isinstance(stream, LineStream) and bar_interval(stream) == 30.0
    bar = tqdm(total=3, desc="tiny-orl/gsm8k", unit="problem", file=stream, mininterval=0, ascii=True)
    for _ in range(3):
        bar.update(1)
    bar.close()
    text = log.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert lines[-1].startswith("tiny-orl/gsm8k: 100%") and "3/3" in lines[-1]
    assert len(lines) == len(set(lines)) >= 2  # one line per distinct state, none repeated


def test_a_terminal_keeps_its_stream():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty = Tty()
    assert bar_stream(tty) is tty and bar_interval(tty) == 1.0


def test_warnings_print_on_one_line_without_the_source():
    code = ("import warnings; from repro.console import plain_warnings; plain_warnings(); "
            "warnings.warn('decoder orl did not finish block 3', RuntimeWarning)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stderr == "warning: decoder orl did not finish block 3 (RuntimeWarning)\n"


def test_plain_warnings_format():
    old = warnings.formatwarning
    try:
        plain_warnings()
        assert warnings.formatwarning("m", UserWarning, "/x/y.py", 3, "src") == "warning: m (UserWarning)\n"
    finally:
        warnings.formatwarning = old
