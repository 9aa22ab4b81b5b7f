# Problems: one normalized JSONL per benchmark from the data directory, the hub, or the shipped handful.


rule prepare_problems:
    output:
        W(P.PROBLEMS, suite="{suite}", bench="{bench}"),
    params:
        data=data_arg,
        source=data_key,  # the data file's sha256: an edit in place re-prepares (and re-runs what follows)
        code=code_version("prepare"),
        builtin=lambda wc: "" if suite_cfg(wc)["builtin_data"] else "--no-builtin",
        limit=limit_arg,
    log:
        W("logs/prepare/{suite}/{bench}.log"),
    localrule: True
    shell:
        logged("{PY} -m repro.data.prepare --benchmark {wildcards.bench} --out {output} {params.data} "
               "{params.limit} {params.builtin}", streams="2> {log}")
