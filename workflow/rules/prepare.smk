# Problems: one normalized JSONL per benchmark from the data directory, the hub, or the shipped handful.
# Two copies, each re-prepared on its own trigger, so a change re-runs what it affects and nothing else:
#   problems/<bench>.jsonl                 keyed by the data file's sha256: scoring and the table read it
#                                          (a gold-answer fix re-prepares it and re-scores);
#   problems/<bench>.for-generation.jsonl  keyed by the rendered prompts of the kept problems: generation
#                                          reads it (only a changed prompt regenerates). Generation reads no
#                                          gold, so this copy's gold may lag behind the other's.
# Both are update() outputs: Snakemake does not delete them before the job runs, and puts the previous version
# back if the job fails, keeping the records of the run that made it (workflow/workdir_records.py). So a failed
# re-preparation (a data file broken for a while) followed by a good one with the same content re-runs nothing:
# without it the file was gone, and re-making it re-ran every job below it (every model's shards of the
# benchmark), planned before Snakemake could see that the new file is byte-identical. (The prepare module writes
# the file atomically, so no half-written file is ever taken for the previous one.)


rule prepare_problems:
    output:
        update(W(P.PROBLEMS, suite="{suite}", bench="{bench}")),  # kept if a run fails (header)
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
        update(W(P.GENERATION_PROBLEMS, suite="{suite}", bench="{bench}")),  # kept if a run fails (header)
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
