"""Console output a person can read, on a terminal and in a job's log file.

Contract:

- :func:`bar_stream` is the stream to hand a tqdm bar. On a terminal it is the stream itself (tqdm redraws one
  line in place with ``\\r``). In a log file (not a TTY, e.g. a Snakemake job's ``2> {log}``) it is a
  :class:`LineStream`: each redraw becomes one line, so ``tail`` of the log shows the last state instead of
  one line of thousands of ``\\r``-joined redraws.
- :func:`plain_warnings` makes :mod:`warnings` print ``warning: <message> (<Category>)`` on one line instead
  of Python's default ``path:line: Category: message`` followed by the source line of the call.
"""

from __future__ import annotations

import sys
import warnings
from typing import TextIO


class LineStream:
    """A write-only text stream that turns tqdm's in-place redraws (``"\\r" + status``) into whole lines.

    Each ``write`` of a status (after stripping ``\\r``, trailing spaces and newlines) that differs from the
    last one written becomes ``status + "\\n"`` on ``stream``; empty writes (tqdm's clearing) are dropped."""

    def __init__(self, stream: TextIO):
        self.stream, self._last = stream, None

    def write(self, s: str) -> int:
        line = s.replace("\r", "").rstrip()
        if line and line != self._last:
            self.stream.write(line + "\n")
            self._last = line
        return len(s)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return False


def bar_stream(stream: TextIO | None = None) -> TextIO | LineStream:
    """``stream`` (default ``sys.stderr``) on a terminal, else a :class:`LineStream` over it."""
    stream = sys.stderr if stream is None else stream
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    return stream if tty else LineStream(stream)


def bar_interval(stream: TextIO | LineStream, tty_s: float = 1.0, log_s: float = 30.0) -> float:
    """tqdm ``mininterval`` in seconds: ``tty_s`` on a terminal, ``log_s`` in a log (a line per redraw)."""
    return log_s if isinstance(stream, LineStream) else tty_s


def _one_line(message, category, filename, lineno, line=None) -> str:
    return f"warning: {message} ({category.__name__})\n"


def plain_warnings() -> None:
    """Print every warning of this process as ``warning: <message> (<Category>)`` (no file path, no source
    line). Idempotent."""
    warnings.formatwarning = _one_line
