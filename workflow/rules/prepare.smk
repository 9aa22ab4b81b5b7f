# Problems: one normalized JSONL per benchmark from the data directory, the hub, or the shipped handful.
# Two copies, each re-prepared on its own trigger, so a change re-runs what it affects and nothing else:
#   problems/<bench>.jsonl                 keyed by the data file's sha256: scoring and the table read it
#                                          (a gold-answer fix re-prepares it and re-scores);
#   problems/<bench>.for-generation.jsonl  keyed by the rendered prompts of the kept problems: generation
#                                          reads it (only a changed prompt regenerates). Generation reads no
#                                          gold, so this copy's gold may lag behind the other's.


rule prepare_problems:
    output:
        W(P.PROBLEMS, suite="{suite}", bench="{bench}"),
    params:
        # where the data directory is decides nothing (the data file's content does, below): a function of
        # `output`, which Snakemake does not record, so moving the folder re-prepares and re-scores nothing
        data=lambda wc, output: data_arg(wc),
        source=data_key,  # the data file's name and sha256: an edit in place re-prepares and re-scores
        code=code_version("prepare"),
        builtin=lambda wc: "" if suite_cfg(wc)["builtin_data"] else "--no-builtin",
        limit=limit_arg,
    log:
        W("logs/prepare/{suite}/{bench}.log"),
    localrule: True
    shell:
        logged("{PY} -m repro.data.prepare --benchmark {wildcards.bench} --out {output} {params.data} "
               "{params.limit} {params.builtin}", streams="2> {log}")


rule prepare_generation_problems:
    output:
        W(P.GENERATION_PROBLEMS, suite="{suite}", bench="{bench}"),
    params:
        # where the data directory is decides nothing generation sees (the prompts key below does): a
        # function of `output`, which Snakemake does not record, so moving the folder regenerates nothing
        data=lambda wc, output: data_arg(wc),
        prompts=prompt_key,  # the rendered prompts' sha256: a changed question regenerates, a gold fix does not
        code=code_version("prepare"),
        builtin=lambda wc: "" if suite_cfg(wc)["builtin_data"] else "--no-builtin",
        limit=limit_arg,
    log:
        W("logs/prepare/{suite}/{bench}.for-generation.log"),
    localrule: True
    shell:
        logged("{PY} -m repro.data.prepare --benchmark {wildcards.bench} --out {output} {params.data} "
               "{params.limit} {params.builtin}", streams="2> {log}")
