"""HumanEval (164 problems; openai/human-eval ``HumanEval.jsonl.gz``). Gold = ``canonical_solution``.

Prompt: "Complete the following python code:" + ``{prompt}`` (OpenCompass ``humaneval_gen_8e312c``);
no stop string besides the EOS markers (the scorer accepts a fence, a restated function or a bare
continuation). Scorer: ``repro.scoring.humaneval`` -- prompt + code + ``test`` + ``check(entry_point)``
in the sandbox.
"""

from repro.benchmarks import Benchmark

BENCHMARK = Benchmark(
    name="humaneval",
    title="HumanEval",
    kind="code",
    file="humaneval.jsonl",
    fields=("task_id", "prompt", "entry_point", "canonical_solution", "test"),
    published_sha256="1d49078ba3e2b196b9344535bef34a43021f038fad9561d6ee7c53450609a6a2",
    problem_id=lambda i, r: r["task_id"],
    gold=lambda r: r["canonical_solution"],
    template="humaneval.v1.j2",
    template_number=1,
    prompt_fields=("prompt",),
    stop=(),
    reference_completion=lambda r: f"```python\n{r['prompt']}{r['canonical_solution']}```",
    scorer="humaneval",
    graders=("commonmark_code", "human_eval_checker"),  # independent graders (repro/scoring/graders/; docs/scoring.md)
    hub_path="openai/openai_humaneval",
    hub_config=None,
    hub_split="test",
    hub_revision=None,  # not pinned: no dataset commit could be verified offline (logged at load)
)
