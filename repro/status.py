"""`python -m repro.status`: how far a suite's generation is, per model × benchmark, read from the work directory.

    python -m repro.status                      # every suite with generation files under the work directory
    python -m repro.status --suite paper        # one suite
    python -m repro.status --work /scratch/w    # another work directory (work_dir / $ORL_EVAL_WORK of the run)

It reads only files (repro/paths.py): the rendered decoder configs (``<suite>/decoders/<model>/<bench>/seed<S>.yaml``:
the cells the run plans), the problems generation reads (``<suite>/problems/<bench>.for-generation.jsonl``: the
total), and each shard's records as the generation job writes them (repro/backends/generation_job.py): a finished
shard (``shard<K>of<N>.jsonl``, or a grouped job's ``shard<K>of<N>/<bench>.jsonl``), else its partial file
(``<shard>.partial.jsonl``, one whole record per finished problem; a torn last line is not counted) and its
sessions file (``<shard>.partial.sessions.json``: problems, generated tokens and seconds of each session that
generated records, rewritten at most every 2 s while a job runs). So it works the same while Snakemake runs the
jobs here or on Slurm nodes (a shared work directory), and after a crash or a kill.

Columns: ``done`` problems with a record out of the cell's ``total`` (all seeds and shards); ``tokens/s`` the
generated tokens per second of the sessions writing now (summed over shards running side by side), else of the
cell's last sessions (tokens / seconds); ``ETA`` the time the shards writing now need for their problems left at
their own rates (the longest of them), "-" when none is writing; ``state``: ``done`` (every shard finished),
``running`` (a record or session snapshot written in the last :data:`RUNNING_S` seconds), ``stopped`` (partial
records, none written lately: a crashed, killed or waiting job; the age of its last write is shown), ``waiting``
(nothing generated yet, or shards finished while the others have not started). The last line sums the suite and gives its ETA at the rate of the shards running now.
Not shown: the speed probe (``<suite>/speed/``), which runs after its model's generation.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from repro.io import read_jsonl_tolerant

RUNNING_S = 600.0  # a shard whose files changed within this many seconds counts as running

_SHARD = re.compile(r"shard(\d+)of(\d+)")


@dataclass
class Shard:
    """One shard's progress: ``done`` of ``todo`` problems; its last session's problems, tokens and seconds
    (None when no session figures were written); ``finished``; ``mtime`` of its newest file (Unix seconds)."""

    done: int
    todo: int | None
    finished: bool
    mtime: float
    session: dict | None = None


@dataclass
class Cell:
    """A model × benchmark of a suite: its seeds' shards, and the problems per seed (None: not prepared yet)."""

    model: str
    bench: str
    seeds: set = field(default_factory=set)
    shards: list = field(default_factory=list)
    problems: int | None = None


def _count_lines(path: Path) -> int:
    try:
        with path.open("rb") as f:
            return sum(1 for line in f if line.strip())
    except OSError:
        return 0


def _done_records(partial: Path) -> int:
    """Problems with a whole record in a partial file (distinct ids; a torn last line is not one)."""
    try:
        return len({r.get("id") for r in read_jsonl_tolerant(partial)})
    except (OSError, ValueError):  # being rewritten this instant, or damaged: count its whole lines
        try:
            return partial.read_bytes().count(b"\n")
        except OSError:
            return 0


def _json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _last_session(sessions) -> dict | None:
    good = [s for s in sessions or [] if isinstance(s, dict) and s.get("wall_s")]
    return good[-1] if good else None


def read_shard(out: Path, problems: int | None) -> Shard | None:
    """The :class:`Shard` whose finished records file is ``out`` (a one-benchmark shard, or a grouped job's
    benchmark file); None when neither it nor its partial file exists."""
    m = _SHARD.search(str(out.relative_to(out.parents[1])))
    k, n = (int(m.group(1)), int(m.group(2))) if m else (0, 1)
    todo = max(0, -(-(problems - k) // n)) if problems is not None else None  # len(problems[k::n])
    if out.is_file():
        meta = _json(Path(str(out) + ".meta.json")) or {}
        last = meta.get("generated_last_session") or _last_session(meta.get("generation_sessions"))
        return Shard(_count_lines(out), todo, True, out.stat().st_mtime, last)
    partial, sessions = Path(str(out) + ".partial.jsonl"), Path(str(out) + ".partial.sessions.json")
    if not partial.exists() and not sessions.exists():
        return None
    times = [p.stat().st_mtime for p in (partial, sessions) if p.exists()]
    return Shard(_done_records(partial) if partial.exists() else 0, todo, False, max(times),
                 _last_session(_json(sessions)))


def scan(work: Path, suite: str) -> list[Cell]:
    """The suite's cells (model × benchmark), planned (decoder configs) or generating (shard files), in name order."""
    base = Path(work) / suite
    cells: dict[tuple[str, str], Cell] = {}

    def cell(model: str, bench: str) -> Cell:
        return cells.setdefault((model, bench), Cell(model, bench))

    for dec in base.glob("decoders/*/*/seed*.yaml"):
        cell(dec.parts[-3], dec.parts[-2]).seeds.add(dec.stem)
    gen = base / "generations"
    outs: dict[Path, tuple[str, str, str]] = {}  # a shard's records file (finished or not) -> model, bench, seed
    for p in list(gen.glob("*/*/seed*/shard*of*.jsonl*")) + list(gen.glob("*/seed*/shard*of*/*.jsonl*")):
        out = Path(str(p)[: -len(".partial.jsonl")]) if p.name.endswith(".partial.jsonl") else p
        if out.name.endswith(".jsonl"):
            grouped = _SHARD.fullmatch(out.parent.name) is not None  # <model>/seed<S>/shard<K>of<N>/<bench>.jsonl
            outs[out] = (out.parts[-4], out.stem if grouped else out.parts[-3], out.parts[-3 if grouped else -2])
    for model, bench in {(m, b) for m, b, _ in outs.values()} | set(cells):
        problems = base / "problems" / f"{bench}.for-generation.jsonl"
        cell(model, bench).problems = _count_lines(problems) if problems.is_file() else None
    for out in sorted(outs):
        model, bench, seed = outs[out]
        s = read_shard(out, cells[(model, bench)].problems)
        if s is not None:
            cells[(model, bench)].seeds.add(seed)
            cells[(model, bench)].shards.append(s)
    return [cells[k] for k in sorted(cells)]


def summarize(c: Cell, now: float) -> dict:
    """``done``, ``total`` (None when unknown), ``tps`` (tokens/s or None), ``eta_s`` (None: none writing, or one
    without session figures yet), ``state``, ``age_s`` (seconds since the cell's last write; None when nothing is
    written) and ``rate`` (problems/s of its running shards) of one cell at Unix time ``now``."""
    total = c.problems * max(1, len(c.seeds)) if c.problems is not None else None
    done = sum(s.done for s in c.shards)
    running = [s for s in c.shards if not s.finished and now - s.mtime < RUNNING_S]
    rated = [s for s in (running or c.shards) if s.session and s.session.get("wall_s")]
    if not rated:
        tps = None
    elif running:  # shards side by side: their rates add up
        tps = sum(s.session["generated_tokens"] / s.session["wall_s"] for s in rated)
    else:
        tps = sum(s.session["generated_tokens"] for s in rated) / sum(s.session["wall_s"] for s in rated)
    etas, rate = [], 0.0  # seconds each running shard needs for what it has left; problems/s of them all
    for s in running:
        if s.session and s.session.get("problems") and s.todo is not None:
            etas.append(max(0, s.todo - s.done) * s.session["wall_s"] / s.session["problems"])
            rate += s.session["problems"] / s.session["wall_s"]
    if total is not None and done >= total and c.shards and all(s.finished for s in c.shards):
        state = "done"
    elif running:
        state = "running"
    elif any(not s.finished for s in c.shards):
        state = "stopped"
    else:  # nothing yet, or finished shards while others have not started
        state = "waiting"
    age = now - max(s.mtime for s in c.shards) if c.shards else None
    return {"done": done, "total": total, "tps": tps, "state": state, "age_s": age, "rate": rate,
            "eta_s": max(etas) if etas and len(etas) == len(running) else None}


def duration(s: float | None) -> str:
    """``"45 s"``, ``"12 min 05 s"``, ``"3 h 07 min"``; ``"-"`` for None."""
    if s is None:
        return "-"
    s = int(round(s))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def table(work: Path, suite: str, now: float | None = None) -> str:
    """The suite's progress as an aligned text table (module docstring), a title line first."""
    now = time.time() if now is None else now
    cells = scan(work, suite)
    rows, done, total, rate, tps = [], 0, 0, 0.0, 0.0
    for c in cells:
        v = summarize(c, now)
        pct = f"{100 * v['done'] / v['total']:.0f}%" if v["total"] else "-"
        state = v["state"] + (f" (last write {duration(v['age_s'])} ago)" if v["state"] == "stopped" else "")
        rows.append([c.model, c.bench, f"{v['done']}/{v['total'] if v['total'] is not None else '?'}", pct,
                     f"{v['tps']:.1f}" if v["tps"] is not None else "-", duration(v["eta_s"]), state])
        done, total = done + v["done"], total + (v["total"] or 0)
        if v["state"] == "running":
            rate, tps = rate + v["rate"], tps + (v["tps"] or 0)
    head = ["model", "benchmark", "done/total", "%", "tokens/s", "ETA", "state"]
    if not rows:
        return f"suite {suite}: no generation planned or started under {Path(work) / suite}"
    eta = duration((total - done) / rate) if rate and total > done else "-"
    rows.append(["all", "", f"{done}/{total}", f"{100 * done / total:.0f}%" if total else "-",
                 f"{tps:.1f}" if tps else "-", eta, "running now: ETA at their rate" if rate else ""])
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    right = {2, 3, 4, 5}

    def line(r):
        cols = enumerate(zip(r, widths))
        return "  ".join(str(x).rjust(w) if i in right else str(x).ljust(w) for i, (x, w) in cols).rstrip()

    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
    return "\n".join([f"suite {suite}: generation progress in {Path(work) / suite} at {stamp}", line(head),
                      "  ".join("-" * w for w in widths), *map(line, rows[:-1]), "  ".join("-" * w for w in widths),
                      line(rows[-1])])


def suites_in(work: Path) -> list[str]:
    """Suites under ``work`` (a folder with a generations folder or rendered decoder configs
    ``decoders/<model>/<bench>/seed*.yaml``; the run's ``logs/decoders`` holds logs only), in name order."""
    return sorted(p.name for p in Path(work).iterdir()
                  if p.is_dir() and ((p / "generations").is_dir() or next(p.glob("decoders/*/*/seed*.yaml"), None)
                                     is not None)) \
        if Path(work).is_dir() else []


def default_work() -> Path:
    """The work directory the workflow uses without an overlay: config.yaml's ``work_dir``, else
    ``$ORL_EVAL_WORK``, else ``<checkout>/work`` (repro.config.work_dir)."""
    from repro.config import ConfigError, load_config, work_dir

    try:
        return work_dir(load_config())
    except (ConfigError, OSError):
        return work_dir({})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m repro.status", description=__doc__.splitlines()[0])
    ap.add_argument("--suite", help="the suite (default: every suite with generation files)")
    ap.add_argument("--work", help="the work directory (default: the workflow's: work_dir, $ORL_EVAL_WORK, work/)")
    a = ap.parse_args(argv)
    work = Path(a.work).expanduser().resolve() if a.work else default_work()
    suites = [a.suite] if a.suite else suites_in(work)
    if not suites:
        print(f"error: no suite has generation files under {work}: give the run's work directory with --work "
              "(its work_dir, or $ORL_EVAL_WORK), or start the run first", file=sys.stderr)
        return 2
    if a.suite and not (work / a.suite).is_dir():
        found = suites_in(work)
        print(f"error: no folder {work / a.suite}: suite {a.suite!r} has not started there"
              + (f" (suites there: {', '.join(found)})" if found else "") + "; or give the run's --work",
              file=sys.stderr)
        return 2
    print("\n\n".join(table(work, s) for s in suites))
    return 0


if __name__ == "__main__":
    sys.exit(main())
