"""MBPP full, test split: task ids 11–510 (500 problems; scoring.md §1). Gold = reference `code`."""

FILE = "mbpp.jsonl"
FIELDS = ("text", "code", "task_id", "test_list", "test_setup_code")
PUBLISHED_SHA256 = "9bcaa67d5c2943e95eb9d9127e844f0551a77ac910c664aa45a4ebd75d239bd9"
HUB_PATH, HUB_CONFIG, HUB_SPLIT = "google-research-datasets/mbpp", "full", "test"


def problem_id(i: int, r: dict) -> str:
    return f"mbpp/{r['task_id']}"


def gold(r: dict) -> str:
    return r["code"]


def from_hub(rows: list[dict]) -> list[dict]:
    """The hub's `full/test` split is ids 11–510 already; keep the original field order."""
    return [{k: r.get(k, "") for k in ("text", "code", "task_id", "test_setup_code", "test_list",
                                        "challenge_test_list")} for r in rows]
