# Reading results as a paper does: the replay, compare and sweep rules (helpers, and what each target
# writes, in analysis_common.smk; include after tables.smk).


rule replay_samples:
    input:
        problems=W(P.PROBLEMS, suite="{suite}", bench="{bench}"),
        samples=replay_samples_file,
    output:
        W(P.GENERATIONS, suite="{suite}", model="{model}", bench="{bench}", seed="{seed}"),
    wildcard_constraints:
        model="|".join(re.escape(m) for m in REPLAY_MODELS) or "(?!x)x",
    params:
        samples=lambda wc: shlex.quote(config["models"][wc.model]["source"]["samples"]),
        note=lambda wc: (f"--note {shlex.quote(config['models'][wc.model]['source']['note'])}"
                         if config["models"][wc.model]["source"].get("note") else ""),
        code=sha256_path(os.path.join(workflow.basedir, "repro", "backends", "replay.py")),
    log:
        W("logs/replay/{suite}/{model}/{bench}/seed{seed}.log"),
    localrule: True
    shell:
        logged("{PY} -m repro.backends.replay --samples {params.samples} --problems {input.problems} "
               "--benchmark {wildcards.bench} --model {wildcards.model} --seed {wildcards.seed} "
               "{params.note} --out {output}", streams="2> {log}")


ruleorder: replay_samples > merge_shards


rule compare_runs:
    input:
        unpack(compare_inputs),
    output:
        md=os.path.join(RESULTS_ROOT, "{suite}", "compare", "{a}_vs_{b}.md"),
        json=os.path.join(RESULTS_ROOT, "{suite}", "compare", "{a}_vs_{b}.json"),
        csv=os.path.join(RESULTS_ROOT, "{suite}", "compare", "{a}_vs_{b}.csv"),
        problems=os.path.join(RESULTS_ROOT, "{suite}", "compare", "{a}_vs_{b}_problems.csv"),
    wildcard_constraints:
        a=_MODEL_RE,
        b=_MODEL_RE,
    params:
        benchmarks=lambda wc: " ".join(suite_cfg(wc)["benchmarks"]),
        # one seed: name it, so files of seeds the suite no longer lists are not compared
        seed=lambda wc: f"@{suite_cfg(wc)['seeds'][0]}" if len(suite_cfg(wc)["seeds"]) == 1 else "",
        code=sha256_path(os.path.join(workflow.basedir, "repro", "tables", "compare.py")),
        prefix=lambda wc: os.path.join(RESULTS_ROOT, wc.suite, "compare", f"{wc.a}_vs_{wc.b}"),
        work=WORK,
    log:
        W("logs/compare/{suite}/{a}_vs_{b}.log"),
    localrule: True
    shell:
        logged("{PY} -m repro.tables compare {params.work}/{wildcards.suite}/{wildcards.a}{params.seed} "
               "{params.work}/{wildcards.suite}/{wildcards.b}{params.seed} "
               "--benchmarks {params.benchmarks} --out {params.prefix} > /dev/null 2> {log} && cat {output.md}",
               streams="")


rule compare:
    """Per-problem differences between the suite's `compare` pairs (e.g. ORL vs base)."""
    input:
        compare_targets(SUITE),
    localrule: True


rule sweep_plot:
    input:
        unpack(sweep_inputs),
    output:
        csv=os.path.join(RESULTS_ROOT, "{suite}", "sweep", "sweep.csv"),
        png=os.path.join(RESULTS_ROOT, "{suite}", "sweep", "sweep.png"),
        pdf=os.path.join(RESULTS_ROOT, "{suite}", "sweep", "sweep.pdf"),
        prov=os.path.join(RESULTS_ROOT, "{suite}", "sweep", "sweep.json"),
    params:
        spec=lambda wc: sweep_spec(wc.suite),
        code=[sha256_path(os.path.join(workflow.basedir, "repro", "tables", f)) for f in ("sweep.py", "plot.py")],
        out=lambda wc: os.path.join(RESULTS_ROOT, wc.suite, "sweep"),
        work=WORK,
    log:
        W("logs/sweep/{suite}.log"),
    localrule: True
    shell:
        logged("{PY} -m repro.tables.sweep --work {params.work} --spec {params.spec:q} --out-dir {params.out}",
               streams="2> {log}")


rule sweep:
    """Accuracy vs TPF over the selected suite's `sweep` grid: PNG + PDF plot, CSV, provenance JSON."""
    input:
        [os.path.join(RESULTS_ROOT, SUITE, "sweep", f"sweep.{ext}") for ext in ("csv", "png", "pdf", "json")],
    localrule: True
