"""GSM8K test split (1319 problems; openai/grade-school-math ``test.jsonl``). Gold = text after ``#### ``.

Prompt: ``{question}`` + "Please reason step by step, and put your final answer within \\boxed{}." (the
OpenCompass ``math_0shot_gen_11c4b5`` instruction, reused so one extractor serves GSM8K and MATH);
stop at a new ``\\nQuestion:`` (diffusion decoders that fill the window invent follow-up questions).
Scorer: ``repro.scoring.gsm8k`` (docs/scoring.md).
"""

from repro.benchmarks import Benchmark


def _gold(r: dict) -> str:
    """The final answer as written after ``#### `` (e.g. ``2,125``); the scorer normalizes it."""
    ans = r["answer"]
    if "####" not in ans:
        raise ValueError(f"GSM8K answer without '####': {ans[-80:]!r}")
    return ans.split("####")[-1].strip()


BENCHMARK = Benchmark(
    name="gsm8k",
    title="GSM8K",
    kind="math",
    file="gsm8k.jsonl",
    fields=("question", "answer"),
    published_sha256="3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14",
    problem_id=lambda i, r: f"gsm8k/{i}",
    gold=_gold,
    template="gsm8k.v1.j2",
    template_number=1,
    prompt_fields=("question",),
    stop=("\nQuestion:",),
    reference_completion=lambda r: r["answer"],  # the worked answer, ending "#### N"
    scorer="gsm8k",
    graders=("lm_eval_gsm8k", "math_verify", "qwen_math"),  # independent graders (repro/scoring/graders/; docs/scoring.md)
    hub_path="openai/gsm8k",
    hub_config="main",
    hub_split="test",
    # Not pinned: no dataset commit could be verified offline; the hub's current revision is used and
    # the loader logs it (the sha256 of the rows it got is recorded in provenance).
    hub_revision=None,
)
