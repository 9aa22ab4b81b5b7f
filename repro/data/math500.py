"""MATH-500 (PRM800K `math_splits/test.jsonl`, 500 problems). Gold = the `answer` field (scoring.md §3)."""

FILE = "math500.jsonl"
FIELDS = ("problem", "solution", "answer", "unique_id")
PUBLISHED_SHA256 = "35dc41080a3680858b27fa7e0533d2d547825316fc5dafe5d316f4ccc5a06132"
HUB_PATH, HUB_CONFIG, HUB_SPLIT = "HuggingFaceH4/MATH-500", None, "test"


def problem_id(i: int, r: dict) -> str:
    return r["unique_id"]


def gold(r: dict) -> str:
    return r["answer"]
