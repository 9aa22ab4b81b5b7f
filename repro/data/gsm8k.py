"""GSM8K test split (1319 problems; openai/grade-school-math `test.jsonl`). Gold = text after `#### `."""

FILE = "gsm8k.jsonl"
FIELDS = ("question", "answer")
PUBLISHED_SHA256 = "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14"
HUB_PATH, HUB_CONFIG, HUB_SPLIT = "openai/gsm8k", "main", "test"


def problem_id(i: int, r: dict) -> str:
    return f"gsm8k/{i}"


def gold(r: dict) -> str:
    """The final answer as written after ``#### `` (e.g. ``2,125``); the scorer normalizes it."""
    ans = r["answer"]
    if "####" not in ans:
        raise ValueError(f"GSM8K answer without '####': {ans[-80:]!r}")
    return ans.split("####")[-1].strip()
