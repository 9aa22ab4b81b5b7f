"""The ``--configfile`` files of a Snakemake command line, checked before Snakemake reads them.

Snakemake reads every ``--configfile`` while it parses its command line, before any workflow code runs, and says
only ``Config file is not valid JSON or YAML`` for a syntax error (no file, no line) and prints a 27-line traceback
for a missing file. The workflow profiles (``profiles/default/config.yaml``, which Snakemake reads for the README's
plain ``.venv/bin/snakemake ...`` command, and ``workflow/profiles/{local,slurm}/config.yaml``) call
:func:`check_command_line` from their YTE ``__definitions__``: Snakemake reads a profile before the config files,
so a bad overlay stops the run with one line per file:

    Config error: my.yaml, line 3, column 5: not valid YAML: ...; line 3 reads: '    limit 2'
    Config error: --configfile my.yml: no such file (looked in /home/me/repro); give the path of an existing overlay

Contract: :func:`configfile_errors` returns those lines for a list of paths (relative ones are taken from the
current directory, as Snakemake does); :func:`command_line_configfiles` reads the files of a command line with
Snakemake's own argument parser (abbreviations and ``--configfiles`` included; a command line it cannot parse gives
[] and is left to Snakemake); :func:`check_command_line` prints the lines and exits 1 when there are any. Semantic
checks of the merged config (unknown keys, missing checkpoint folders, ...) stay in the workflow's start-up
(workflow/rules/common.smk), which sees the merged config.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from pathlib import Path

from repro.config import yaml_syntax_error


def configfile_errors(files: list[str]) -> list[str]:
    """One ``Config error: ...`` line per file of ``files`` that is missing, a folder, unreadable or not valid
    YAML/JSON (file, line, column); [] when every one parses."""
    out = []
    for f in files:
        p = Path(f)
        where = "" if p.is_absolute() else f" (looked in {os.getcwd()})"
        if p.is_dir():
            out.append(f"Config error: --configfile {f}: is a folder, not a file; give the path of a YAML overlay")
        elif not p.exists():
            dangling = " (a symlink to a missing file)" if p.is_symlink() else ""
            out.append(f"Config error: --configfile {f}: no such file{dangling}{where}; give the path of an existing "
                       "config overlay")
        elif not os.access(p, os.R_OK):
            out.append(f"Config error: --configfile {f}: not readable by this user; fix its permissions")
        else:
            err = yaml_syntax_error(p)
            if err:
                out.append(f"Config error: {err}")
    return out


def command_line_configfiles(argv: list[str]) -> list[str]:
    """The files after ``--configfile`` / ``--configfiles`` in ``argv`` (without the program name), read with
    Snakemake's argument parser; [] when it cannot read the command line (its own error then stands)."""
    try:
        from snakemake.cli import get_argument_parser
    except ImportError:
        return []
    sink = io.StringIO()
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            args, _ = get_argument_parser().parse_known_args(argv)
    except (Exception, SystemExit):  # noqa: BLE001 - --help, --version, a bad option: Snakemake reports it
        return []
    return [str(f) for f in (getattr(args, "configfile", None) or [])]


def check_command_line(argv: list[str] | None = None) -> None:
    """Check the ``--configfile`` files of this Snakemake command line (``sys.argv[1:]`` by default); print one
    line per bad file and exit 1 when any is bad (module docstring).

    Then it forgets every ``repro`` module it loaded (``sys.modules``): the profile imports the installed
    ``repro``, while the workflow must import the one of its own checkout (the Snakefile puts that first on
    ``sys.path``), which may be another folder (a copy of the checkout, a second clone); a cached ``repro``
    would make the workflow hash and run that other checkout's code."""
    try:
        errors = configfile_errors(command_line_configfiles(sys.argv[1:] if argv is None else argv))
    finally:
        for name in [m for m in sys.modules if m == "repro" or m.startswith("repro.")]:
            del sys.modules[name]
    if errors:
        print("\n".join(errors), file=sys.stderr)
        sys.exit(1)
