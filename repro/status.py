"""`python -m repro.status`: how far a suite's generation is, per model × benchmark, and whether its run is alive.

    python -m repro.status                      # every suite with generation planned or files under the work directory
    python -m repro.status --suite paper        # one suite
    python -m repro.status --work /scratch/w    # another work directory (work_dir / $ORL_EVAL_WORK of the run)

It reads only files and the process table. **The plan**: a run writes ``<suite>/plan.json`` at its start
(:func:`write_plan`, from the config: every model × benchmark × seed it generates and each shard's records file), so
a cell counts from the start, before its decoder config is rendered or its first record written. Without a plan
(a work directory of an older run) the cells are those with rendered decoder configs
(``<suite>/decoders/<model>/<bench>/seed<S>.yaml``) or generation files, as the title line says. **The totals**:
the problems generation reads (``<suite>/problems/<bench>.for-generation.jsonl``; "?" until prepared). **Progress**:
each shard's records as the generation job writes them (repro/backends/generation_job.py): a finished shard
(``shard<K>of<N>.jsonl``, or a grouped job's ``shard<K>of<N>/<bench>.jsonl``), else its partial file
(``<shard>.partial.jsonl``, one whole record per finished problem; a torn last line is not counted) and its sessions
file (``<shard>.partial.sessions.json``: problems, generated tokens, seconds and the job's pid, host and Slurm job
id of each session, rewritten at most every 2 s while a job runs). **Liveness** (repro/liveness.py): a live run is
a Snakemake holding its claim on the work directory (``<work>/.repro-runs/<pid>.lock``, flocked while it lives;
the claim names the directory whose ``.snakemake/locks`` it holds); a live job is one whose pid still runs a
generation job on this host, or whose Slurm job ``squeue`` still lists. So it works the same while Snakemake runs
the jobs here or on Slurm nodes (a shared work directory), and after a crash, a Ctrl-C or a kill.

Columns: ``done`` problems with a record out of the cell's ``total`` (all seeds and shards); ``tokens/s`` the
generated tokens per second of the sessions writing now (summed over shards running side by side), else of the
cell's last sessions (tokens / seconds); ``ETA`` the time the shards writing now need for their problems left at
their own rates (the longest of them), "-" when none is writing; ``state``: ``done`` (every shard finished),
``running`` (a live job writes it; where a job's liveness cannot be told -- another host without Slurm -- a live
run and a write in the last :data:`RUNNING_S` seconds), ``waiting`` (a run is alive and the cell's jobs are not
running: queued, or between retries), ``stopped (rerun to resume)`` (no run alive and no job writing: records were
written, the rest waits for the rerun; the age of its last write is shown), ``not started`` (no run alive, nothing
written). The last line sums the suite and gives its ETA at the rate of the shards running now; a line under it
names the live run, or says that none is alive and to rerun the same command to resume.
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

from repro import liveness
from repro.paths import PLAN
from repro.io import atomic_write_text, read_jsonl_tolerant

RUNNING_S = 600.0  # with a live run: a shard whose job cannot be probed and whose files changed this recently runs
STOPPED = "stopped (rerun to resume)"

_SHARD = re.compile(r"shard(\d+)of(\d+)")


@dataclass
class Shard:
    """One shard's progress: ``done`` of ``todo`` problems; its last session's problems, tokens and seconds
    (None when no session figures were written); ``finished``; ``mtime`` of its newest file (Unix seconds);
    ``job``: the job facts of its last session (pid, host, Slurm job id; None when not written)."""

    done: int
    todo: int | None
    finished: bool
    mtime: float
    session: dict | None = None
    job: dict | None = None


@dataclass
class Cell:
    """A model × benchmark of a suite: its seeds' shards, and the problems per seed (None: not prepared yet);
    ``planned``: the number of shards the plan names (None without a plan)."""

    model: str
    bench: str
    seeds: set = field(default_factory=set)
    shards: list = field(default_factory=list)
    problems: int | None = None
    planned: int | None = None


def write_plan(work: Path, suite: str, cells: list[dict]) -> Path:
    """Write ``<work>/<suite>/plan.json``: the run's cells, each ``{"model", "benchmark", "seeds": [...],
    "records": [shard records files relative to the work directory], "regenerate": [those of them the run's
    generation jobs write again]}`` (the workflow calls this at the start of a run, workflow/rules/cluster.smk:
    write_status_plans). A records file listed in ``regenerate`` counts only once written after the plan: one left
    from earlier inputs (a changed config) is not progress of this run. Returns its path."""
    path = Path(work) / PLAN.format(suite=suite)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps({"suite": suite, "written_at": time.time(), "cells": cells}, indent=1) + "\n")
    return path


def _plan_doc(work: Path, suite: str) -> dict | None:
    try:
        doc = json.loads((Path(work) / PLAN.format(suite=suite)).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("cells"), list) else None


def read_plan(work: Path, suite: str) -> list[dict] | None:
    """The cells of ``<work>/<suite>/plan.json`` (:func:`write_plan`); None when there is none (or it is damaged)."""
    doc = _plan_doc(work, suite)
    return doc["cells"] if doc is not None else None


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


def _last_job(sessions) -> dict | None:
    jobs = [s["job"] for s in sessions or [] if isinstance(s, dict) and isinstance(s.get("job"), dict)]
    return jobs[-1] if jobs else None


def read_shard(out: Path, problems: int | None, stale_before: float | None = None) -> Shard | None:
    """The :class:`Shard` whose finished records file is ``out`` (a one-benchmark shard, or a grouped job's
    benchmark file); None when neither it nor its partial file exists. ``stale_before`` (Unix seconds): a finished
    file last written before then is from earlier inputs (its job is to run again) and does not count."""
    m = _SHARD.search(str(out.relative_to(out.parents[1])))
    k, n = (int(m.group(1)), int(m.group(2))) if m else (0, 1)
    todo = max(0, -(-(problems - k) // n)) if problems is not None else None  # len(problems[k::n])
    if out.is_file() and (stale_before is None or out.stat().st_mtime >= stale_before):
        meta = _json(Path(str(out) + ".meta.json")) or {}
        last = meta.get("generated_last_session") or _last_session(meta.get("generation_sessions"))
        return Shard(_count_lines(out), todo, True, out.stat().st_mtime, last)
    partial, sessions = Path(str(out) + ".partial.jsonl"), Path(str(out) + ".partial.sessions.json")
    if not partial.exists() and not sessions.exists():
        return None
    times = [p.stat().st_mtime for p in (partial, sessions) if p.exists()]
    figures = _json(sessions)
    return Shard(_done_records(partial) if partial.exists() else 0, todo, False, max(times),
                 _last_session(figures), _last_job(figures))


def _problems(base: Path, bench: str) -> int | None:
    problems = base / "problems" / f"{bench}.for-generation.jsonl"
    return _count_lines(problems) if problems.is_file() else None


def _scan_plan(work: Path, suite: str, plan: list[dict], written_at: float | None = None) -> list[Cell]:
    cells: dict[tuple[str, str], Cell] = {}
    for entry in plan:
        if not isinstance(entry, dict) or not entry.get("model") or not entry.get("benchmark"):
            continue
        c = cells.setdefault((entry["model"], entry["benchmark"]), Cell(entry["model"], entry["benchmark"]))
        c.seeds.update(f"seed{s}" for s in entry.get("seeds") or [])
        c.problems = _problems(Path(work) / suite, c.bench)
        records = [r for r in entry.get("records") or [] if isinstance(r, str)]
        c.planned = (c.planned or 0) + len(records)
        regenerate = set(entry.get("regenerate") or []) if isinstance(written_at, (int, float)) else set()
        for rel in records:
            s = read_shard(Path(work) / rel, c.problems, written_at if rel in regenerate else None)
            if s is not None:
                c.shards.append(s)
    return [cells[k] for k in sorted(cells)]


def scan(work: Path, suite: str) -> list[Cell]:
    """The suite's cells (model × benchmark) in name order: those of its plan (:func:`write_plan`), else those
    with decoder configs or generation files."""
    doc = _plan_doc(work, suite)
    if doc is not None:
        return _scan_plan(work, suite, doc["cells"], doc.get("written_at"))
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
        cell(model, bench).problems = _problems(base, bench)
    for out in sorted(outs):
        model, bench, seed = outs[out]
        s = read_shard(out, cells[(model, bench)].problems)
        if s is not None:
            cells[(model, bench)].seeds.add(seed)
            cells[(model, bench)].shards.append(s)
    return [cells[k] for k in sorted(cells)]


def summarize(c: Cell, now: float, run_alive: bool = False, job_alive=liveness.job_alive) -> dict:
    """``done``, ``total`` (None when unknown), ``tps`` (tokens/s or None), ``eta_s`` (None: none writing, or one
    without session figures yet), ``state``, ``age_s`` (seconds since the cell's last write; None when nothing is
    written) and ``rate`` (problems/s of its running shards) of one cell at Unix time ``now``. ``run_alive``: a
    Snakemake of the run is alive; ``job_alive(facts)``: whether a shard's job runs (True/False, None: cannot
    tell; repro.liveness.job_alive)."""
    total = c.problems * max(1, len(c.seeds)) if c.problems is not None else None
    done = sum(s.done for s in c.shards)
    running = []
    for s in c.shards:
        if not s.finished:
            alive = job_alive(s.job)
            if alive or (alive is None and run_alive and now - s.mtime < RUNNING_S):
                running.append(s)
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
    all_there = c.planned is None or len(c.shards) >= c.planned
    if total is not None and done >= total and c.shards and all_there and all(s.finished for s in c.shards):
        state = "done"
    elif running:
        state = "running"
    elif run_alive:  # queued, between retries, or its other shards not started yet
        state = "waiting"
    elif c.shards:
        state = STOPPED
    else:
        state = "not started"
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


def _run_line(runs: list, states: list[str]) -> str:
    if runs:
        return "run: alive (" + "; ".join(f"Snakemake pid {r.pid} in {r.directory}"
                                          + (f" on {r.host}" if r.host and r.host != liveness.hostname() else "")
                                          for r in runs) + ")"
    if all(s == "done" for s in states):
        return "run: every cell done"
    if "running" in states:
        return ("run: no Snakemake holds this work directory, but jobs still write (Slurm jobs of a stopped run?); "
                "once they end, rerun the same command to resume")
    return "run: stopped (no Snakemake holds this work directory); rerun the same command to resume: finished " \
           "problems are kept"


def table(work: Path, suite: str, now: float | None = None, runs: list | None = None,
          job_alive=liveness.job_alive) -> str:
    """The suite's progress as an aligned text table (module docstring), a title line first and the run's
    state last. ``runs``: the live runs on ``work`` (default: :func:`repro.liveness.live_runs`)."""
    now = time.time() if now is None else now
    runs = liveness.live_runs(work) if runs is None else runs
    planned = read_plan(work, suite) is not None
    cells = scan(work, suite)
    cache: dict[str, bool | None] = {}

    def alive(facts):  # one probe per job (a grouped job writes several cells)
        key = json.dumps(facts, sort_keys=True, default=str)
        if key not in cache:
            cache[key] = job_alive(facts)
        return cache[key]

    rows, states, done, total, unknown, rate, tps = [], [], 0, 0, 0, 0.0, 0.0
    for c in cells:
        v = summarize(c, now, bool(runs), alive)
        pct = f"{100 * v['done'] / v['total']:.0f}%" if v["total"] else "-"
        state = v["state"]
        if state == STOPPED and v["age_s"] is not None:
            state = f"stopped (rerun to resume; last write {duration(v['age_s'])} ago)"
        rows.append([c.model, c.bench, f"{v['done']}/{v['total'] if v['total'] is not None else '?'}", pct,
                     f"{v['tps']:.1f}" if v["tps"] is not None else "-", duration(v["eta_s"]), state])
        states.append(v["state"])
        done, total, unknown = done + v["done"], total + (v["total"] or 0), unknown + (v["total"] is None)
        if v["state"] == "running":
            rate, tps = rate + v["rate"], tps + (v["tps"] or 0)
    head = ["model", "benchmark", "done/total", "%", "tokens/s", "ETA", "state"]
    if not rows:
        return f"suite {suite}: no generation planned or started under {Path(work) / suite}"
    eta = duration((total - done) / rate) if rate and total > done and not unknown else "-"
    all_total = f"{total}" + (f"+? ({unknown} not prepared)" if unknown else "")
    rows.append(["all", "", f"{done}/{all_total}", f"{100 * done / total:.0f}%" if total and not unknown else "-",
                 f"{tps:.1f}" if tps else "-", eta, "running now: ETA at their rate" if rate else ""])
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    right = {2, 3, 4, 5}

    def line(r):
        cols = enumerate(zip(r, widths))
        return "  ".join(str(x).rjust(w) if i in right else str(x).ljust(w) for i, (x, w) in cols).rstrip()

    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
    title = f"suite {suite}: generation progress in {Path(work) / suite} at {stamp}"
    if not planned:
        title += " (no plan.json: a run older than the plans; a cell shows once its decoder config or records exist)"
    return "\n".join([title, line(head), "  ".join("-" * w for w in widths), *map(line, rows[:-1]),
                      "  ".join("-" * w for w in widths), line(rows[-1]), _run_line(runs, states)])


def suites_in(work: Path) -> list[str]:
    """Suites under ``work`` (a folder with a plan, a generations folder or rendered decoder configs
    ``decoders/<model>/<bench>/seed*.yaml``; the run's ``logs/decoders`` holds logs only), in name order."""
    return sorted(p.name for p in Path(work).iterdir()
                  if p.is_dir() and ((p / "plan.json").is_file() or (p / "generations").is_dir()
                                     or next(p.glob("decoders/*/*/seed*.yaml"), None) is not None)) \
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
