"""Which problems changed between two runs: per benchmark, the problems solved by one run and not the
other, McNemar's exact test on them, and the TPF change on the problems both runs solved.

    python -m repro.tables compare RUN_A RUN_B [--benchmarks gsm8k ...] [--out PREFIX]

A run is ``[WORK_DIR/]SUITE/MODEL[@SEED]``: the scores and generations the pipeline wrote for one model
of one suite (``WORK_DIR`` defaults to ``$ORL_EVAL_WORK``, else ``<checkout>/work``), e.g.
``smoke/tiny``, ``../old-work/paper/llada-orl@12345``. Anything with per-problem files there compares:
two models (ORL vs base), two work directories (this commit vs the last, engine vs SGLang, batch 1 vs
batch N), a sweep point vs the paper setting, a replayed samples file vs our engine.

Contract
--------
* Benchmarks: by default those both runs scored; the ones only one run scored are skipped and named
  (``skipped`` in the result, a line in the report); ``CompareError`` when none is common, or when
  ``--benchmarks`` names one a run lacks.
* Units are problems (per seed when both runs have the same several seeds; by id when each run is
  one seed). Per compared benchmark both runs must have scored the same problems: the same ids and the
  same problem records (a shipped ``gsm8k/0`` is not the benchmark's ``gsm8k/0``); otherwise
  ``CompareError`` names the difference and the fix.
* Per benchmark: ``n``, accuracies (%), ``delta`` = B − A (points), ``only_a`` / ``only_b`` (ids solved
  by one run only), McNemar's exact two-sided p-value on the discordant pairs (``mcnemar_p``: 1.0 with no
  discordant pair) — the binomial test of ``only_b`` among ``only_a + only_b`` at 1/2 (Fagerland, Lydersen
  & Laake 2013, "The McNemar test for binary matched-pairs data", BMC Med. Res. Methodol. 13:91), and
  TPF of each run over the problems both solved (README's convention: tokens ÷ (denoise + commit
  forwards)); null when a run has no forward counts (a replay without them) or no problem was solved by
  both. ``completions_differ`` counts problems whose raw completions differ.
* Output: a Markdown report on stdout (``no differences`` when no verdict and no completion differs);
  with ``--out PREFIX``: ``PREFIX.md``, ``PREFIX.json`` (everything), ``PREFIX.csv`` (one row per
  benchmark) and ``PREFIX_problems.csv`` (one row per problem), written atomically.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from repro import benchmarks as declared
from repro import paths
from repro.backends.merge import MergedFileChanged, check_merged
from repro.io import atomic_write_text
from repro.tables.render import fmt


def _title(bench: str) -> str:
    return declared.get(bench).title
MAX_ROWS = 25  # changed problems listed per benchmark in the Markdown (all of them in the CSV / JSON)


class CompareError(ValueError):
    """The runs cannot be compared (missing files, different problem sets); the message says which."""


@dataclass(frozen=True)
class Run:
    """One model's per-problem results in one suite of a work directory."""

    spec: str
    work: Path
    suite: str
    model: str
    seed: int | None  # None: every seed found

    def seeds(self, bench: str) -> list[int]:
        d = self.work / Path(paths.SCORES.format(suite=self.suite, model=self.model, bench=bench, seed=0)).parent
        found = sorted(int(p.name[4:-6]) for p in d.glob("seed*.jsonl") if p.name[4:-6].isdigit())
        return [s for s in found if self.seed is None or s == self.seed]

    def benchmarks(self) -> list[str]:
        return [b for b in declared.names() if self.seeds(b)]


def parse_run(spec: str, default_work: Path) -> Run:
    """``[WORK_DIR/]SUITE/MODEL[@SEED]`` -> Run; CompareError when the form is wrong or nothing was scored."""
    body, _, seed = spec.partition("@")
    parts = [p for p in body.rstrip("/").split("/")]
    if len(parts) < 2 or not parts[-1] or not parts[-2] or (seed and not seed.isdigit()):
        raise CompareError(f"run {spec!r}: write it as [WORK_DIR/]SUITE/MODEL[@SEED], e.g. smoke/tiny or "
                           "work/paper/llada-orl@12345")
    work = Path("/".join(parts[:-2])) if len(parts) > 2 else default_work
    run = Run(spec, work.expanduser().resolve(), parts[-2], parts[-1], int(seed) if seed else None)
    if not run.benchmarks():
        scored = run.work / run.suite / "scores"
        have = sorted(p.name for p in scored.iterdir()) if scored.is_dir() else []
        raise CompareError(f"run {spec!r}: no scores for model {run.model!r}{f' seed {seed}' if seed else ''} in "
                           f"{scored}" + (f"; models scored there: {', '.join(have)}" if have else
                                          "; run the pipeline first (snakemake --cores 2 main_table)"))
    return run


def _jsonl(path: Path) -> list[dict]:
    if not path.exists():
        raise CompareError(f"{path} is missing; re-run the pipeline for this cell")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _problem_digests(run: Run, bench: str) -> dict[str, str]:
    recs = _jsonl(run.work / paths.PROBLEMS.format(suite=run.suite, bench=bench))
    return {p["id"]: hashlib.sha256(json.dumps(p.get("source"), sort_keys=True).encode()).hexdigest() for p in recs}


def _cell(run: Run, bench: str, seed: int) -> dict[str, dict]:
    fmt_ = dict(suite=run.suite, model=run.model, bench=bench, seed=seed)
    gpath = run.work / paths.GENERATIONS.format(**fmt_)
    try:
        check_merged(gpath)
    except MergedFileChanged as e:
        raise CompareError(str(e)) from None
    gens = {g["id"]: g for g in _jsonl(gpath)}
    out = {}
    for s in _jsonl(run.work / paths.SCORES.format(**fmt_)):
        g = gens.get(s["id"], {})
        fwd = g.get("forwards")
        out[s["id"]] = {"correct": bool(s["correct"]), "completion": g.get("completion"),
                        "tokens": g.get("generated_tokens") if fwd else None,
                        "forwards": (fwd["denoise"] + fwd["commit"]) if fwd else None}
    return out


def mcnemar_exact(only_a: int, only_b: int) -> float:
    """Two-sided exact McNemar p-value: 2 × P(X <= min) for X ~ Binomial(only_a + only_b, 1/2), capped at 1."""
    n = only_a + only_b
    if n == 0:
        return 1.0
    k = min(only_a, only_b)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n)


def _tpf(items: list[dict]) -> float | None:
    if not items or any(i["forwards"] is None for i in items):
        return None
    fwd = sum(i["forwards"] for i in items)
    return sum(i["tokens"] for i in items) / fwd if fwd else None


def _pairing(a: Run, b: Run, bench: str) -> list[tuple[int, int]]:
    sa, sb = a.seeds(bench), b.seeds(bench)
    if len(sa) == 1 and len(sb) == 1:
        return [(sa[0], sb[0])]
    if sa == sb:
        return list(zip(sa, sb))
    raise CompareError(f"{bench}: run A has seeds {sa}, run B {sb}; pick one seed of each (RUN@SEED) or runs "
                       "with the same seeds")


def _check_problems(a: Run, b: Run, bench: str, ids_a: set, ids_b: set) -> None:
    only_a, only_b = sorted(ids_a - ids_b), sorted(ids_b - ids_a)
    da, db = _problem_digests(a, bench), _problem_digests(b, bench)
    changed = sorted(i for i in ids_a & ids_b if da.get(i) != db.get(i))
    if only_a or only_b or changed:
        parts = []
        if only_a:
            parts.append(f"{len(only_a)} only in A ({', '.join(only_a[:5])})")
        if only_b:
            parts.append(f"{len(only_b)} only in B ({', '.join(only_b[:5])})")
        if changed:
            parts.append(f"{len(changed)} with the same id but a different problem record ({', '.join(changed[:5])}; "
                         "another data source?)")
        raise CompareError(f"{_title(bench)}: the runs scored different problem sets: {'; '.join(parts)}. "
                           "Compare runs over the same problems (same data source and limit), or leave this "
                           "benchmark out with --benchmarks")


def compare(a: Run, b: Run, benchmarks: list[str] | None = None) -> dict:
    """The comparison of two runs (see module docstring); CompareError when they cannot be compared."""
    ba, bb = a.benchmarks(), b.benchmarks()
    skipped = {"only_a": [], "only_b": []}
    if benchmarks is None:
        benchmarks = [x for x in ba if x in bb]
        if not benchmarks:
            raise CompareError(f"the runs scored no benchmark in common: A {', '.join(ba)}; B {', '.join(bb)}. "
                               "Compare runs that scored at least one same benchmark")
        skipped = {"only_a": [x for x in ba if x not in bb], "only_b": [x for x in bb if x not in ba]}
    for bench in benchmarks:
        for r, have, name in ((a, ba, "A"), (b, bb, "B")):
            if bench not in have:
                raise CompareError(f"run {name} ({r.spec}) has no {bench} scores; it scored {', '.join(have)}")
    out = {"a": _describe(a), "b": _describe(b), "test": "McNemar exact, two-sided", "benchmarks": [],
           "skipped": skipped}
    for bench in benchmarks:
        rows = []
        for sa, sb in _pairing(a, b, bench):
            ca, cb = _cell(a, bench, sa), _cell(b, bench, sb)
            _check_problems(a, b, bench, set(ca), set(cb))
            for pid in ca:
                rows.append({"benchmark": bench, "seed_a": sa, "seed_b": sb, "id": pid, "a": ca[pid], "b": cb[pid]})
        n = len(rows)
        only_a = [r for r in rows if r["a"]["correct"] and not r["b"]["correct"]]
        only_b = [r for r in rows if r["b"]["correct"] and not r["a"]["correct"]]
        both = [r for r in rows if r["a"]["correct"] and r["b"]["correct"]]
        tpf_a, tpf_b = _tpf([r["a"] for r in both]), _tpf([r["b"] for r in both])
        acc_a = 100.0 * sum(r["a"]["correct"] for r in rows) / n
        acc_b = 100.0 * sum(r["b"]["correct"] for r in rows) / n
        label = (lambda r: r["id"] if len({x["seed_a"] for x in rows}) == 1 else f"{r['id']}@{r['seed_a']}")
        out["benchmarks"].append({
            "benchmark": bench, "n": n, "acc_a": acc_a, "acc_b": acc_b, "delta": acc_b - acc_a,
            "only_a": [label(r) for r in only_a], "only_b": [label(r) for r in only_b],
            "mcnemar_p": mcnemar_exact(len(only_a), len(only_b)), "both_solved": len(both),
            "tpf_a_both": tpf_a, "tpf_b_both": tpf_b,
            "tpf_delta_both": (tpf_b - tpf_a) if tpf_a is not None and tpf_b is not None else None,
            "completions_differ": sum(r["a"]["completion"] != r["b"]["completion"] for r in rows),
            "problems": [{"benchmark": bench, "id": r["id"], "seed_a": r["seed_a"], "seed_b": r["seed_b"],
                          "a_correct": r["a"]["correct"], "b_correct": r["b"]["correct"],
                          "verdict_differs": r["a"]["correct"] != r["b"]["correct"],
                          "completion_differs": r["a"]["completion"] != r["b"]["completion"],
                          "a_tokens": r["a"]["tokens"], "a_forwards": r["a"]["forwards"],
                          "b_tokens": r["b"]["tokens"], "b_forwards": r["b"]["forwards"]} for r in rows]})
    out["no_differences"] = all(not x["only_a"] and not x["only_b"] and not x["completions_differ"]
                                for x in out["benchmarks"])
    return out


def _describe(r: Run) -> dict:
    return {"spec": r.spec, "work": str(r.work), "suite": r.suite, "model": r.model, "seed": r.seed}


def _ids(ids: list[str], limit: int = 20) -> str:
    return (", ".join(ids[:limit]) + (f", … ({len(ids) - limit} more)" if len(ids) > limit else "")) if ids else "none"


def to_markdown(res: dict) -> str:
    """The report a person reads: one summary table, then per benchmark the problems that changed."""
    a, b = res["a"], res["b"]
    lines = [f"# Compare: A = {a['suite']}/{a['model']}, B = {b['suite']}/{b['model']}", "",
             f"A: `{a['work']}/{a['suite']}` model `{a['model']}`" + (f" seed {a['seed']}" if a["seed"] else ""),
             f"B: `{b['work']}/{b['suite']}` model `{b['model']}`" + (f" seed {b['seed']}" if b["seed"] else ""), ""]
    skipped = res.get("skipped", {})
    for side, key in (("A", "only_a"), ("B", "only_b")):
        if skipped.get(key):
            lines += [f"Skipped (scored by run {side} only): {', '.join(_title(x) for x in skipped[key])}.", ""]
    if res["no_differences"]:
        lines += ["**No differences**: every problem got the same verdict and the same completion in both runs.", ""]
    lines += ["Paired per problem. Δ = B − A (points); only A / only B: problems solved by one run and not the other; "
              "p: McNemar's exact two-sided test on those; TPF over the problems both runs solved.", "",
              "| Benchmark | n | A acc | B acc | Δ | only A | only B | McNemar p | both solved | TPF A | TPF B | Δ TPF |",
              "|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for x in res["benchmarks"]:
        lines.append("| " + " | ".join([
            _title(x["benchmark"]), str(x["n"]), fmt(x["acc_a"]), fmt(x["acc_b"]), f"{x['delta']:+.1f}",
            str(len(x["only_a"])), str(len(x["only_b"])), f"{x['mcnemar_p']:.3g}", str(x["both_solved"]),
            fmt(x["tpf_a_both"], 2), fmt(x["tpf_b_both"], 2),
            "-" if x["tpf_delta_both"] is None else f"{x['tpf_delta_both']:+.2f}"]) + " |")
    for x in res["benchmarks"]:
        lines += ["", f"## {_title(x['benchmark'])}", ""]
        if not x["only_a"] and not x["only_b"]:
            lines.append("No differences in verdicts" + (" (identical completions)." if not x["completions_differ"] else
                                                         f"; {x['completions_differ']} of {x['n']} completions differ in text."))
        else:
            lines += [f"- solved by A only ({len(x['only_a'])}): {_ids(x['only_a'])}",
                      f"- solved by B only ({len(x['only_b'])}): {_ids(x['only_b'])}",
                      f"- completions that differ in text: {x['completions_differ']} of {x['n']}"]
        changed = [p for p in x["problems"] if p["verdict_differs"] or p["completion_differs"]]
        if changed:
            lines += ["", "| Problem | A | B | completion | A TPF | B TPF |", "|:---|:---|:---|:---|---:|---:|"]
            verdict = {True: "solved", False: "wrong"}
            # verdict changes first, then the rest, in problem order
            for p in sorted(changed, key=lambda p: not p["verdict_differs"])[:MAX_ROWS]:
                pid = p["id"] if p["seed_a"] == p["seed_b"] or len({q["seed_a"] for q in x["problems"]}) == 1 \
                    else f"{p['id']}@{p['seed_a']}"
                lines.append(f"| {pid} | {verdict[p['a_correct']]} | {verdict[p['b_correct']]} | "
                             f"{'differs' if p['completion_differs'] else 'same'} | "
                             f"{fmt(p['a_tokens'] / p['a_forwards'] if p['a_forwards'] else None, 2)} | "
                             f"{fmt(p['b_tokens'] / p['b_forwards'] if p['b_forwards'] else None, 2)} |")
            if len(changed) > MAX_ROWS:
                lines.append(f"\n… {len(changed) - MAX_ROWS} more changed problems: see the _problems.csv / .json output")
    return "\n".join(lines) + "\n"


def write(res: dict, prefix: Path) -> None:
    """``PREFIX.md``, ``PREFIX.json``, ``PREFIX.csv`` (per benchmark), ``PREFIX_problems.csv`` (per problem)."""
    summary = [{k: (len(v) if k in ("only_a", "only_b") else v) for k, v in x.items() if k != "problems"}
               for x in res["benchmarks"]]
    problems = [p for x in res["benchmarks"] for p in x["problems"]]
    cols = ["benchmark", "id", "seed_a", "seed_b", "a_correct", "b_correct", "verdict_differs", "completion_differs",
            "a_tokens", "a_forwards", "b_tokens", "b_forwards"]
    atomic_write_text(Path(f"{prefix}.md"), to_markdown(res))
    atomic_write_text(Path(f"{prefix}.json"), json.dumps(res, indent=1, sort_keys=True) + "\n")
    atomic_write_text(Path(f"{prefix}.csv"), pd.DataFrame(summary).to_csv(index=False, lineterminator="\n"))
    atomic_write_text(Path(f"{prefix}_problems.csv"),
                      pd.DataFrame(problems, columns=cols).to_csv(index=False, lineterminator="\n"))


def main(argv: list[str] | None = None) -> int:
    from repro.config import work_dir

    ap = argparse.ArgumentParser(prog="python -m repro.tables compare", description=__doc__.splitlines()[0])
    ap.add_argument("run_a", metavar="RUN_A", help="[WORK_DIR/]SUITE/MODEL[@SEED], e.g. smoke/tiny")
    ap.add_argument("run_b", metavar="RUN_B", help="[WORK_DIR/]SUITE/MODEL[@SEED], e.g. smoke/tiny-orl")
    ap.add_argument("--benchmarks", nargs="+", choices=declared.names(), help="default: every benchmark both runs scored")
    ap.add_argument("--out", type=Path, help="also write PREFIX.md, .json, .csv and _problems.csv")
    a = ap.parse_args(argv)
    try:
        default_work = work_dir({})
        res = compare(parse_run(a.run_a, default_work), parse_run(a.run_b, default_work), a.benchmarks)
    except CompareError as e:
        print(f"compare: error: {e}", file=sys.stderr)
        return 2
    print(to_markdown(res), end="")
    if a.out:
        write(res, a.out)
        print(f"\nwritten: {a.out}.md, .json, .csv, _problems.csv", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
