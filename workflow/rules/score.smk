# Scoring: extraction + comparison (GSM8K, MATH-500) or sandboxed execution (HumanEval, MBPP). CPU only.


rule score:
    input:
        problems=W(P.PROBLEMS, suite="{suite}", bench="{bench}"),
        generations=W(P.GENERATIONS, suite="{suite}", model="{model}", bench="{bench}", seed="{seed}"),
        image=image_input("cpu"),
    output:
        scores=W(P.SCORES, suite="{suite}", model="{model}", bench="{bench}", seed="{seed}"),
        summary=W(P.SUMMARY, suite="{suite}", model="{model}", bench="{bench}", seed="{seed}"),
        disagreements=W(P.DISAGREEMENTS, suite="{suite}", model="{model}", bench="{bench}", seed="{seed}"),
    params:
        code=code_version("score"),  # a scorer fix re-scores, without regenerating
        # the scoring settings that change verdicts, as params: changing one re-scores (params rerun
        # trigger) without regenerating. Only the code benchmarks run programs under timeout_s, so only
        # their scores are redone when it changes. (workers changes speed, not verdicts: not a param.)
        timeout=score_timeout_arg,
    log:
        W("logs/score/{suite}/{model}/{bench}/seed{seed}.log"),
    container: image_for("cpu")
    threads: config["scoring"]["workers"]
    resources:
        **CPU_ONLY,
        runtime=lambda wc, attempt: 60 * attempt,
        mem_mb=lambda wc, attempt: 8000 * attempt,
        mem_mb_per_cpu=0,  # --mem, never a site's --mem-per-cpu (cluster.smk)
    shell:
        logged("{PY_IMAGE} -m repro.scoring score --benchmark {wildcards.bench} --problems {input.problems} "
               "--generations {input.generations} --out {output.scores} --summary {output.summary} "
               "--disagreements {output.disagreements} --workers {threads} {params.timeout}")
