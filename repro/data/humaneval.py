"""HumanEval (164 problems; openai/human-eval `HumanEval.jsonl.gz`). Gold = `canonical_solution`."""

FILE = "humaneval.jsonl"
FIELDS = ("task_id", "prompt", "entry_point", "canonical_solution", "test")
PUBLISHED_SHA256 = "1d49078ba3e2b196b9344535bef34a43021f038fad9561d6ee7c53450609a6a2"
HUB_PATH, HUB_CONFIG, HUB_SPLIT = "openai/openai_humaneval", None, "test"


def problem_id(i: int, r: dict) -> str:
    return r["task_id"]


def gold(r: dict) -> str:
    return r["canonical_solution"]
