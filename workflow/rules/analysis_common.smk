# Helpers of analysis.smk (functions only; include before it): reading results as a paper does.
#   replayed models  models with source {type: replay, samples: FILE|reference} get their generation file
#                    from the samples (repro/backends/replay.py) instead of generating; scored like any other
#   compare          <results>/<suite>/compare/<A>_vs_<B>.{md,json,csv} + _problems.csv for the suite's
#                    `compare` pairs (any two models of the config: name the file as a target)
#   sweep            <results>/<suite>/sweep/sweep.{csv,png,pdf,json}: accuracy vs TPF over the suite's
#                    `sweep` grid; each grid point is a suite of its own, "<suite>-sweep-t<..>[-e<..>]", whose
#                    decoder configs carry the override (nowhere else is paper_decoding.json overridden)
import itertools
import re
import shlex
import time

from repro.config import missing_replay_samples, replay_samples_path
from repro.provenance import sha256_path

RESULTS_ROOT = str(results_dir(config))
if not os.path.relpath(RESULTS_ROOT).startswith(".."):  # relative, so `results/smoke/compare/a_vs_b.md` is a target
    RESULTS_ROOT = os.path.relpath(RESULTS_ROOT)
REPLAY_MODELS = [m for m in config["models"] if is_replay(config, m)]
# a replayed model's samples file is checked now: without it Snakemake would fall back to generating the cell
# (no rule replays it) and stop with a traceback instead of naming the file
_replay_errors = missing_replay_samples(config, SUITE, source=_source)
if _replay_errors:
    print("\n".join(_replay_errors), file=sys.stderr)
    sys.exit(1)
_MODEL_RE = "[A-Za-z0-9][A-Za-z0-9.-]*(?:_(?!vs_)[A-Za-z0-9.-]+)*"  # a model name without "_vs_"


# ---- replayed models --------------------------------------------------------------------------------------
def replay_samples_file(wildcards):
    """The samples file a replayed cell reads ([] for `reference`), so editing the file re-replays it."""
    path = replay_samples_path(config, wildcards.model, wildcards.bench)
    return [] if path is None else path


# ---- compare ----------------------------------------------------------------------------------------------
def compare_inputs(wildcards):
    s = suite_cfg(wildcards)
    cells = [(m, b, seed) for m in (wildcards.a, wildcards.b) for b in s["benchmarks"] for seed in s["seeds"]]
    return {"scores": [W(P.SCORES, suite=wildcards.suite, model=m, bench=b, seed=seed) for m, b, seed in cells],
            "generations": [W(P.GENERATIONS, suite=wildcards.suite, model=m, bench=b, seed=seed) for m, b, seed in cells]}


def compare_targets(suite):
    """The suite's `compare` pairs, else each orl-role model against the suite's first base-role model."""
    s = suite_cfg(suite)
    pairs = s.get("compare")
    if pairs is None:
        roles = {m: config["models"][m].get("role") for m in s["models"]}
        base = next((m for m, r in roles.items() if r == "base"), None)
        pairs = [[base, m] for m, r in roles.items() if r == "orl" and base]
    return [os.path.join(RESULTS_ROOT, suite, "compare", f"{a}_vs_{b}.md") for a, b in pairs]


# ---- sweep ------------------------------------------------------------------------------------------------
def _num(v):
    return f"{v:g}".replace(".", "p").replace("-", "m")


def sweep_points(suite):
    """[(point suite name, {decoder key: value})] of a suite's sweep grid (no grid: [])."""
    sw = suite_cfg(suite).get("sweep") or {}
    keys = [k for k in ("threshold", "edit_threshold") if sw.get(k)]
    out = []
    for values in itertools.product(*(sw[k] for k in keys)):
        over = dict(zip(keys, values))
        tag = "-".join(("t" if k == "threshold" else "e") + _num(v) for k, v in over.items())
        out.append((f"{suite}-sweep-{tag}" if tag else f"{suite}-sweep", over))
    return out


# Each grid point becomes a suite: the base suite's settings, the sweep's models and benchmarks, and the
# override that render_decoder passes to render_config (--set). Added after validation, so a user cannot
# set `_decoder_overrides` on an ordinary suite.
for _suite in [s for s in list(config["suites"]) if config["suites"][s].get("sweep")]:
    for _name, _over in sweep_points(_suite):
        _sw = config["suites"][_suite]["sweep"]
        config["suites"][_name] = {**config["suites"][_suite], "models": list(_sw["models"]),
                                   "benchmarks": list(_sw["benchmarks"]), "sweep": None, "compare": None,
                                   "reported": False, "_decoder_overrides": _over, "_sweep_of": _suite}


def sweep_spec(suite):
    s = suite_cfg(suite)
    sw = s.get("sweep") or {}
    return json.dumps({
        "suite": suite, "seeds": s["seeds"], "benchmarks": sw.get("benchmarks", []), "reported": s["reported"],
        "models": [{"name": m, "label": config["models"][m]["label"],
                    "repo_id": config["models"][m]["source"].get("repo_id")} for m in sw.get("models", [])],
        "points": [{"suite": name, "overrides": over} for name, over in sweep_points(suite)]})


def sweep_inputs(wildcards):
    s = suite_cfg(wildcards)
    sw = s.get("sweep")
    if not sw:
        raise WorkflowError(f"suite {wildcards.suite!r} has no `sweep` grid in config.yaml; add "
                            "suites.<suite>.sweep: {models: [...], benchmarks: [...], threshold: [...]}")
    suites = [wildcards.suite] + [name for name, _ in sweep_points(wildcards.suite)]  # the paper setting first
    cells = [(su, m, b, seed) for su in suites for m in sw["models"] for b in sw["benchmarks"] for seed in s["seeds"]]
    return {"summaries": [W(P.SUMMARY, suite=su, model=m, bench=b, seed=seed) for su, m, b, seed in cells],
            "generations": [W(P.GENERATIONS, suite=su, model=m, bench=b, seed=seed) for su, m, b, seed in cells]}


# ---- the end of a successful run (tables.smk: onsuccess) --------------------------------------------------
def _done_lines():
    """What the run's requested targets wrote, one line each (the default target: main_table), with the main
    table's markdown before its line; the main table goes last, so it is what the console ends with."""
    targets = sorted(workflow.dag_settings.targets) or ["main_table"]
    table = os.path.join(RESULTS, "main_table.md")
    lines, show_table = [], False
    for t in targets:
        if t in ("main_table", "write_table"):
            show_table = True
        elif t == "speed_table":
            lines.append(f"Speed table: {os.path.join(RESULTS, 'speed_table.md')} (.tex, .csv beside it)")
        elif t == "sweep":
            lines.append(f"Sweep: {os.path.abspath(os.path.join(RESULTS_ROOT, SUITE, 'sweep', 'sweep.png'))} "
                         "(.pdf, .csv, sweep.json beside it)")
        elif t == "compare":
            lines += [f"Compare: {os.path.abspath(md)} (.json, .csv, _problems.csv beside it)" for md in compare_targets(SUITE)]
        elif os.path.exists(t):  # a file named as the target
            lines.append(f"Wrote: {os.path.abspath(t)}")
    if show_table and os.path.exists(table):
        ds = workflow.dag_settings
        limits = [flag for flag, value in (("--until", ds.until), ("--omit-from", ds.omit_from),
                                           ("--allowed-rules", ds.allowed_rules), ("--batch", ds.batch)) if value]
        if limits and os.path.getmtime(table) < _RUN_STARTED:  # not written by this run, which did not check it
            lines += [f"Table: {table} was not rebuilt by this run ({', '.join(limits)} limited it), so it may not "
                      "reflect every result: run `snakemake main_table` without that option to bring it up to date"]
        else:
            lines += ["", open(table).read().rstrip(), "",
                      f"Table: {table} (.tex, .csv, main_table_long.csv, provenance.json beside it); "
                      f"speed: {os.path.join(RESULTS, 'speed_table.md')}"]
    return lines


_RUN_STARTED = time.time()  # a table written after this was written by this run


# A run with nothing to do ends in Snakemake's "Nothing to be done" without running onsuccess: the same lines are
# printed then too (at interpreter exit, in the main process of a real run, when that message was logged), so a
# re-run still says where the tables are.
def _watch_nothing_to_be_done():
    import atexit
    import logging

    from snakemake.common import NOTHING_TO_BE_DONE_MSG

    seen = []

    class _Seen(logging.Filter):
        def filter(self, record):
            if record.getMessage() == NOTHING_TO_BE_DONE_MSG:
                seen.append(True)
            return True

    def _at_exit():
        quiet = workflow.dryrun or workflow.touch or getattr(workflow.execution_settings, "no_hooks", False)
        if seen and not quiet:  # as onsuccess: not in a dry run, --touch or --no-hooks
            try:
                lines = _done_lines()
            except Exception:  # never turn a finished run into a traceback
                return
            for line in lines:
                print(line)

    logging.getLogger("snakemake.logging").addFilter(_Seen())
    atexit.register(_at_exit)


# A Ctrl-C (or a kill signal) during a run: Snakemake says "Terminating processes on user request", then prints a
# RuleException block for every job it stopped and "At least one job did not complete successfully", and nothing on
# how to go on. From that message on, the console drops those error blocks (the log file keeps them) and the run
# ends with one line saying to rerun the same command, which resumes (finished problems are kept).
INTERRUPTED_LINE = ("Interrupted: the jobs were stopped; finished problems and outputs are kept. Rerun the same "
                    "command to resume.")


def _watch_interrupt():
    import atexit
    import logging

    seen = []

    class _ConsoleQuiet(logging.Filter):  # on the console handlers only, once interrupted
        def filter(self, record):
            return record.levelno < logging.WARNING

    class _Interrupted(logging.Filter):
        def filter(self, record):
            if not seen and record.getMessage().startswith("Terminating processes on user request"):
                seen.append(True)
                for h in logging.getLogger("snakemake.logging").handlers + logging.getLogger().handlers:
                    if not isinstance(h, logging.FileHandler):
                        h.addFilter(_ConsoleQuiet())
            return True

    def _at_exit():
        if seen:
            print(INTERRUPTED_LINE, file=sys.stderr)

    logging.getLogger("snakemake.logging").addFilter(_Interrupted())
    atexit.register(_at_exit)


if workflow.is_main_process:
    _watch_nothing_to_be_done()
    _watch_interrupt()


# A target that names neither a target of this workflow nor a path (a typo, `main_tabel`): one line naming the
# targets, instead of Snakemake's MissingRuleException block (called at the end of the Snakefile, once every rule
# exists). Names with a path separator or a "." are files; Snakemake judges those.
def _unknown_targets():
    import difflib

    named = [t for t in (getattr(_CLI_ARGS, "targets", None) or []) if os.sep not in t and "." not in t]
    rules = {r.name for r in workflow.rules}
    targets = sorted(r.name for r in workflow.rules if not r.has_wildcards() and not r.name.startswith("_"))
    for t in named:
        if t not in rules and not os.path.exists(t):
            near = difflib.get_close_matches(t, targets, n=1)
            hint = f"did you mean {near[0]}? " if near else ""
            return (f"Error: {t!r} is neither a target nor a file; {hint}the targets are {', '.join(targets)} "
                    "(README.md says what each writes)")
    return None

