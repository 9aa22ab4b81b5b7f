"""MATH-500 (PRM800K ``math_splits/test.jsonl``, 500 problems). Gold = the ``answer`` field.

Prompt: ``{problem}`` + "Please reason step by step, and put your final answer within \\boxed{}."
(OpenCompass ``math_0shot_gen_11c4b5``); stop at a new ``\\nProblem:``. The gold is the ``answer``
field, never the last box of ``solution`` (8 solutions box two forms). Scorer: ``repro.scoring.math``
(Math-Verify in a worker process; docs/scoring.md).
"""

from repro.benchmarks import Benchmark

BENCHMARK = Benchmark(
    name="math500",
    title="MATH-500",
    kind="math",
    file="math500.jsonl",
    fields=("problem", "solution", "answer", "unique_id"),
    published_sha256="35dc41080a3680858b27fa7e0533d2d547825316fc5dafe5d316f4ccc5a06132",
    problem_id=lambda i, r: r["unique_id"],
    gold=lambda r: r["answer"],
    template="math500.v1.j2",
    template_number=1,
    prompt_fields=("problem",),
    stop=("\nProblem:",),
    reference_completion=lambda r: r["solution"],  # the worked solution, its answer in \\boxed{}
    scorer="math",
    graders=("minerva", "prm800k", "math_verify"),  # independent graders (repro/scoring/graders/; docs/scoring.md)
    hub_path="HuggingFaceH4/MATH-500",
    hub_config=None,
    hub_split="test",
    hub_revision=None,  # not pinned: no dataset commit could be verified offline (logged at load)
)
