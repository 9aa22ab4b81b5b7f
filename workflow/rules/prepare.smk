# Problems: one normalized JSONL per benchmark from the data directory, the hub, or the shipped handful.


def data_arg(wildcards):
    return f"--data-dir {DATA}" if DATA else ""


rule prepare_problems:
    output:
        W(P.PROBLEMS, suite="{suite}", bench="{bench}"),
    params:
        data=data_arg,
        builtin=lambda wc: "" if config["suites"][wc.suite]["builtin_data"] else "--no-builtin",
        limit=lambda wc: f"--limit {config['suites'][wc.suite]['limit']}" if config["suites"][wc.suite]["limit"] else "",
    log:
        W("logs/prepare/{suite}/{bench}.log"),
    localrule: True
    shell:
        logged("{PY} -m repro.data.prepare --benchmark {wildcards.bench} --out {output} {params.data} "
               "{params.limit} {params.builtin}", streams="2> {log}")
