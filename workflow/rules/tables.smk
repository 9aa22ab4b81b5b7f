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
        listed=os.path.join(RESULTS, "listed_verdicts.md"),  # the independent graders' listed verdicts, per cell
    params:
        # a function: Snakemake would read braces in a label or samples path as wildcards; quoted (:q) in the
        # command, so a label's apostrophe cannot end the shell word
        spec=lambda wc: table_spec(),
        work=WORK,
        suite=SUITE,
        out_dir=lambda wc, output: os.path.dirname(output.md),
        code=code_version("table"),
    log:
        W(f"logs/tables/{SUITE}.log"),
    container: image_for("cpu")
    shell:
        logged("{PY_IMAGE} -m repro.tables --work {params.work} --suite {params.suite} --spec {params.spec:q} "
               "--out-dir {params.out_dir} --image-sidecars {input.images}")  # the table: printed on success


rule speed_table:
    """Single-request tokens/s, TPF, round time and the batched throughput per model x benchmark, from the
    generation records and shard metas, and (a suite generated batched) the speed probes' records for the
    single-request columns (repro/tables/speed.py)."""
    input:
        generations=lambda wc: table_inputs(wc)["generations"],
        probes=lambda wc: probe_files(SUITE),  # generate.smk: speed_probe; none at batch 1
    output:
        md=os.path.join(RESULTS, "speed_table.md"),
        tex=os.path.join(RESULTS, "speed_table.tex"),
        csv=os.path.join(RESULTS, "speed_table.csv"),
    params:
        spec=lambda wc: table_spec(),  # (as write_table's)
        work=WORK,
        suite=SUITE,
        out_dir=lambda wc, output: os.path.dirname(output.md),
        probes=lambda wc: " ".join(probe_benchmarks(SUITE)),
        code=code_version("table"),
    log:
        W(f"logs/tables/{SUITE}.speed.log"),
    container: image_for("cpu")
    shell:
        logged("{PY_IMAGE} -m repro.tables.speed --work {params.work} --suite {params.suite} --spec {params.spec:q} "
               "--out-dir {params.out_dir} --probe-benchmarks {params.probes}", streams="> {log} 2>&1")


rule main_table:
    """The target: the table plus every generation and score file it is built from, so deleting any one
    of them re-runs exactly that job and its downstream (a rule with outputs would not notice)."""
    default_target: True
    input:
        rules.write_table.output,
        rules.speed_table.output,
        unpack(table_inputs),


# what the requested targets wrote, the main table last (analysis_common.smk: _done_lines)
onsuccess:
    for _line in _done_lines():
        print(_line)



# a failed run on a full disk: one line naming the folder whose disk is full, the work directory first (Snakemake's
# own message may name .snakemake instead) (repro/io.py: full_disks)
onerror:
    from repro.io import full_disks

    for _line in full_disks({"work directory": WORK, "results folder": RESULTS,
                             "Snakemake state (.snakemake)": os.path.join(workflow.basedir, ".snakemake")}):
        print(_line, file=sys.stderr)
