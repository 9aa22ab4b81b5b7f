# The paper's Table 1 for the selected suite: <results_dir>/<suite>/main_table.{md,tex,csv} + provenance.json.

localrules:
    main_table,


def table_inputs(wildcards):
    cells = suite_cells(config)
    return {
        "summaries": [W(P.SUMMARY, suite=SUITE, model=c.model, bench=c.benchmark, seed=c.seed) for c in cells],
        "generations": [W(P.GENERATIONS, suite=SUITE, model=c.model, bench=c.benchmark, seed=c.seed) for c in cells],
    }


def table_spec():
    return json.dumps({"models": [{"name": m, "label": config["models"][m]["label"]} for m in S["models"]],
                       "benchmarks": S["benchmarks"], "seeds": S["seeds"], "backend": config["backend"]})


rule main_table:
    default_target: True
    input:
        unpack(table_inputs),
    output:
        md=os.path.join(RESULTS, "main_table.md"),
        tex=os.path.join(RESULTS, "main_table.tex"),
        csv=os.path.join(RESULTS, "main_table.csv"),
        prov=os.path.join(RESULTS, "provenance.json"),
    params:
        spec=table_spec(),
    log:
        W(f"logs/tables/{SUITE}.log"),
    shell:
        "{PY} -m repro.tables --work {WORK} --suite {SUITE} --spec '{params.spec}' --out-dir {RESULTS} "
        "2> {log}"
