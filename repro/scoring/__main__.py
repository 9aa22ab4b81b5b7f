"""CLI of the scoring stage (docs/interfaces.md, "Scoring"; docs/scoring_rules.md §10).

``python -m repro.scoring score --benchmark B --problems P.jsonl --generations G.jsonl --out S.jsonl
--summary S.summary.json [--workers N]``: scores every generation record (``id``, ``completion``)
against its problem; an id absent from the problems file, a duplicate id, or a record without a string
``completion`` is an error naming it, and so is a merged generation file changed since its merge wrote it
(``repro.backends.merge.check_merged``: delete it to merge again from the shards); problems without a generation are skipped with a warning on
stderr (the summary's ``n`` says how many were scored). Both outputs are written atomically
(temporary file + rename), so a killed job never leaves a partial file behind. Beside the summary
(``--disagreements``, default ``S.disagreements.json``): the problems whose verdict any independent grader the
benchmark declares gives differently, with every extraction and verdict, and the accuracy band with them counted
both ways (``second_grader``; never changes a score). At start-up: a grader that cannot run here stops the
command with one line naming the fix (``graders.require``), and so does a scoring fix switched off
(``fixes.ENV``, a diagnostic of the case files only).

``python -m repro.scoring cases FILE.jsonl --data-dir DIR [--workers N]``: prints one JSON line per
case ``{id, correct, extracted, reason}`` then a summary line; exit status 1 when a case disagrees with
its ``expected_correct``.
"""

from __future__ import annotations

import argparse
import json
import sys

from repro import benchmarks
from repro.backends.merge import check_merged

from . import fixes, graders, score_records, second_grader, summarize
from .cases import run_cases
from .jsonl import read_jsonl, write_json_atomic, write_jsonl_atomic


def _score(args) -> int:
    # start-up: every declared grader must run here (never a thinner check), and no scoring fix may be off
    graders.require([args.benchmark])
    if fixes.disabled():
        raise SystemExit(f"error: {fixes.ENV}={','.join(fixes.disabled())} switches scoring fixes off (a diagnostic "
                         f"for the case files only, scripts/grader_coverage.py); unset it to score")
    check_merged(args.generations)  # a hand-edited merged file is refused, not re-scored
    problems = read_jsonl(args.problems)
    gens = read_jsonl(args.generations)
    by_id = {p.get("id"): p for p in problems}
    completions: dict[str, str] = {}
    for n, g in enumerate(gens, 1):
        gid = g.get("id")
        if gid is None:
            raise SystemExit(f"{args.generations}:{n}: generation record has no 'id'")
        if gid not in by_id:
            raise SystemExit(f"{args.generations}:{n}: id {gid!r} is not in {args.problems}")
        if gid in completions:
            raise SystemExit(f"{args.generations}:{n}: duplicate generation for id {gid!r}")
        if not isinstance(g.get("completion"), str):
            raise SystemExit(f"{args.generations}:{n}: id {gid!r} has no string 'completion'")
        if g.get("benchmark", args.benchmark) != args.benchmark:
            raise SystemExit(f"{args.generations}:{n}: id {gid!r} is a {g['benchmark']!r} generation, "
                             f"not {args.benchmark!r}")
        completions[gid] = g["completion"]
    scored = [p for p in problems if p.get("id") in completions]
    if len(scored) < len(problems):
        print(f"warning: {len(problems) - len(scored)} of {len(problems)} problems have no generation "
              f"in {args.generations}; scoring {len(scored)}", file=sys.stderr)
    if not scored:
        raise SystemExit(f"{args.generations}: no generations to score")
    if graders.in_worker(args.benchmark):
        from .code.sandbox import default_workers
        from .graders.worker import pool

        # started first: their imports (preloaded for this benchmark's graders) overlap our scoring
        pool(max(1, int(args.workers or default_workers())), preload=graders.in_worker(args.benchmark)).start()
    scores = score_records(args.benchmark, scored, completions, args.workers, args.timeout)
    summary = summarize(args.benchmark, scores)
    write_jsonl_atomic(args.out, scores)
    write_json_atomic(args.summary, summary)
    # the second grader only lists where it differs; it never changes a verdict (second_grader.py)
    report = second_grader.compare(args.benchmark, scored, completions, scores, args.workers, args.timeout)
    second_grader.write_report(args.disagreements or second_grader.disagreements_path(args.summary), report)
    print(json.dumps(summary))
    print(second_grader.console_line(report))
    return 0


def _cases(args) -> int:
    cases = read_jsonl(args.file)
    results, summary = run_cases(cases, args.data_dir, args.workers)
    for r in results:
        print(json.dumps(r, ensure_ascii=False))
    print(json.dumps(summary))
    return 1 if summary["disagree_ids"] else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m repro.scoring", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("score", help="score generations of one benchmark")
    s.add_argument("--benchmark", required=True, choices=benchmarks.names())
    s.add_argument("--problems", required=True)
    s.add_argument("--generations", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--summary", required=True)
    s.add_argument("--workers", type=int, default=None, help="parallel workers (default: available CPUs)")
    s.add_argument("--disagreements", default=None,
                   help="where the second grader lists the verdicts that differ from ours "
                        "(default: beside --summary, X.disagreements.json)")
    s.add_argument("--timeout", type=float, default=None,
                   help="wall-clock seconds per sandboxed program (HumanEval, MBPP; default 10)")
    c = sub.add_parser("cases", help="run regression cases")
    c.add_argument("file")
    c.add_argument("--data-dir", required=True)
    c.add_argument("--workers", type=int, default=None)
    args = ap.parse_args(argv)
    try:
        return _score(args) if args.cmd == "score" else _cases(args)
    except (ValueError, FileNotFoundError, TypeError, graders.GradersUnavailable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
