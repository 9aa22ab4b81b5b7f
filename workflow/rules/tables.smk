# The paper's Table 1 for the selected suite: <results_dir>/<suite>/main_table.{md,tex,csv} + provenance.json.

localrules:
    main_table,
    write_table,


def table_inputs(wildcards):
    cells = suite_cells(config)
    n = S["shards"]
    return {
        "summaries": [W(P.SUMMARY, suite=SUITE, model=c.model, bench=c.benchmark, seed=c.seed) for c in cells],
        "generations": [W(P.GENERATIONS, suite=SUITE, model=c.model, bench=c.benchmark, seed=c.seed) for c in cells],
        "images": image_sidecars(),
        # the paper's numbers, when the suite shows them: editing the file re-renders the table
        "reported": [os.path.join(workflow.basedir, "repro", "tables", "reported.json")] if S["reported"] else [],
        "shards": [W(P.SHARD, suite=SUITE, model=c.model, bench=c.benchmark, seed=c.seed, shard=k, nshards=n)
                   for c in cells if not is_replay(config, c.model) for k in range(n)],  # replay: no shards
    }


def table_spec():
    return json.dumps({"models": [{"name": m, "label": config["models"][m]["label"],
                                   "repo_id": config["models"][m]["source"].get("repo_id"),
                                   "replay": is_replay(config, m)} for m in S["models"]],
                       "benchmarks": S["benchmarks"], "seeds": S["seeds"], "backend": config["backend"],
                       "reported": S["reported"]})


rule write_table:
    input:
        unpack(table_inputs),
    output:
        md=os.path.join(RESULTS, "main_table.md"),
        tex=os.path.join(RESULTS, "main_table.tex"),
        csv=os.path.join(RESULTS, "main_table.csv"),
        long=os.path.join(RESULTS, "main_table_long.csv"),  # tidy per-cell numbers, full precision
        prov=os.path.join(RESULTS, "provenance.json"),
    params:
        spec=table_spec(),
    log:
        W(f"logs/tables/{SUITE}.log"),
    container: image_for("cpu")
    shell:
        logged("{PY} -m repro.tables --work {WORK} --suite {SUITE} --spec '{params.spec}' --out-dir {RESULTS} "
               "--image-sidecars {input.images}", streams="2> {log}")


rule main_table:
    """The target: the table plus every generation and score file it is built from, so deleting any one
    of them re-runs exactly that job and its downstream (a rule with outputs would not notice)."""
    default_target: True
    input:
        rules.write_table.output,
        unpack(table_inputs),


onsuccess:
    if os.path.exists(os.path.join(RESULTS, "main_table.md")):
        print(f"Table: {os.path.join(RESULTS, 'main_table.md')} (.tex, .csv, provenance.json beside it)")
