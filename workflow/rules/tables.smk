# The paper's Table 1 for the selected suite: <results_dir>/<suite>/main_table.{md,tex,csv} + provenance.json.

localrules:
    main_table,
    write_table,
    speed_table,


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
        work=WORK,
        suite=SUITE,
        out_dir=lambda wc, output: os.path.dirname(output.md),
        code=code_version("table"),
    log:
        W(f"logs/tables/{SUITE}.log"),
    container: image_for("cpu")
    shell:
        logged("{PY_IMAGE} -m repro.tables --work {params.work} --suite {params.suite} --spec '{params.spec}' "
               "--out-dir {params.out_dir} --image-sidecars {input.images}")  # the table: printed on success


rule speed_table:
    """Single-request tokens/s, TPF, round time and the batched throughput per model x benchmark, from the
    generation records and shard metas (repro/tables/speed.py; nothing is re-run)."""
    input:
        generations=lambda wc: table_inputs(wc)["generations"],
    output:
        md=os.path.join(RESULTS, "speed_table.md"),
        tex=os.path.join(RESULTS, "speed_table.tex"),
        csv=os.path.join(RESULTS, "speed_table.csv"),
    params:
        spec=table_spec(),
        work=WORK,
        suite=SUITE,
        out_dir=lambda wc, output: os.path.dirname(output.md),
        code=code_version("table"),
    log:
        W(f"logs/tables/{SUITE}.speed.log"),
    container: image_for("cpu")
    shell:
        logged("{PY_IMAGE} -m repro.tables.speed --work {params.work} --suite {params.suite} --spec '{params.spec}' "
               "--out-dir {params.out_dir}", streams="> {log} 2>&1")


rule main_table:
    """The target: the table plus every generation and score file it is built from, so deleting any one
    of them re-runs exactly that job and its downstream (a rule with outputs would not notice)."""
    default_target: True
    input:
        rules.write_table.output,
        rules.speed_table.output,
        unpack(table_inputs),


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
        lines += ["", open(table).read().rstrip(), "",
                  f"Table: {table} (.tex, .csv, provenance.json beside it); "
                  f"speed: {os.path.join(RESULTS, 'speed_table.md')}"]
    return lines


onsuccess:
    for _line in _done_lines():
        print(_line)
