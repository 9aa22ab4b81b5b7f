"""MBPP full, test split: task ids 11-510 (500 problems). Gold = the reference ``code``.

Prompt: the MBPP paper/README wording with the task text and all three asserts of ``test_list``,
asking for one fenced python block (zero-shot); stop at ``[DONE]``. Scorer: ``repro.scoring.mbpp`` --
code, ``test_setup_code``, then every assert, in the sandbox. Regression cases may name tasks outside
the test split (e.g. 927), found in ``mbpp_full.jsonl`` when the data directory has it.
"""

from repro.benchmarks import Benchmark

_FIELD_ORDER = ("text", "code", "task_id", "test_setup_code", "test_list", "challenge_test_list")


def _from_hub(rows: list[dict]) -> list[dict]:
    """The hub's ``full/test`` split is ids 11-510 already; keep the original field order."""
    return [{k: r.get(k, "") for k in _FIELD_ORDER} for r in rows]


BENCHMARK = Benchmark(
    name="mbpp",
    title="MBPP",
    kind="code",
    file="mbpp.jsonl",
    fields=("text", "code", "task_id", "test_list", "test_setup_code"),
    published_sha256="9bcaa67d5c2943e95eb9d9127e844f0551a77ac910c664aa45a4ebd75d239bd9",
    problem_id=lambda i, r: f"mbpp/{r['task_id']}",
    gold=lambda r: r["code"],
    template="mbpp.v1.j2",
    template_number=1,
    prompt_fields=("text", "test_list"),
    stop=("[DONE]",),
    reference_completion=lambda r: f"```python\n{r['code']}\n```",
    scorer="mbpp",
    graders=("commonmark_code",),  # independent graders (repro/scoring/graders/; docs/scoring.md)
    hub_path="google-research-datasets/mbpp",
    hub_config="full",
    hub_split="test",
    hub_revision=None,  # not pinned: no dataset commit could be verified offline (logged at load)
    from_hub=_from_hub,
    case_files=("mbpp_full.jsonl",),
)
