# Scoring: extraction + comparison (GSM8K, MATH-500) or sandboxed execution (HumanEval, MBPP). CPU only.


rule score:
    input:
        problems=W(P.PROBLEMS, suite="{suite}", bench="{bench}"),
        generations=W(P.GENERATIONS, suite="{suite}", model="{model}", bench="{bench}", seed="{seed}"),
        image=image_input("cpu"),
    output:
        scores=W(P.SCORES, suite="{suite}", model="{model}", bench="{bench}", seed="{seed}"),
        summary=W(P.SUMMARY, suite="{suite}", model="{model}", bench="{bench}", seed="{seed}"),
    params:
        code=tree_digest("repro/scoring"),  # a scorer fix re-scores, without regenerating
    log:
        W("logs/score/{suite}/{model}/{bench}/seed{seed}.log"),
    container: image_for("cpu")
    threads: config["scoring"]["workers"]
    resources:
        runtime=60,
        mem_mb=8000,
    shell:
        logged("{PY} -m repro.scoring score --benchmark {wildcards.bench} --problems {input.problems} "
               "--generations {input.generations} --out {output.scores} --summary {output.summary} "
               "--workers {threads} --timeout {config[scoring][timeout_s]}")
