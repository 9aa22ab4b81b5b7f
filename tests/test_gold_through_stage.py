"""Gold answers and reference solutions, written as model completions, score 100% through the same
scoring stage the workflow runs (`python -m repro.scoring score`), for the first problems of each real
file — and deliberately wrong completions score 0%."""

import json
import subprocess
import sys

import pytest

from repro.data import load_problems

N = 12


def completion(bench: str, p: dict, wrong: bool) -> str:
    src = p["source"]
    if bench == "gsm8k":
        gold = p["gold"].replace(",", "")
        ans = str(int(gold) + 1) if wrong else p["gold"]
        return f"Let me work it out step by step.\nSo the final answer is \\boxed{{{ans}}}."
    if bench == "math500":
        ans = "\\text{no}" if wrong else p["gold"]
        return f"Working through the algebra carefully, we obtain\n$$\\boxed{{{ans}}}$$"
    if bench == "humaneval":
        body = "    return None\n" if wrong else src["canonical_solution"]
        return f"```python\n{src['prompt']}{body}```"
    code = "def nothing():\n    return None" if wrong else src["code"]
    return f"Here is the solution:\n```python\n{code}\n```"


@pytest.mark.parametrize("wrong", [False, True], ids=["gold", "wrong"])
@pytest.mark.parametrize("bench", ["gsm8k", "math500", "humaneval", "mbpp"])
def test_scoring_stage_on_gold_completions(tmp_path, data_dir, bench, wrong):
    probs = load_problems(bench, data_dir, limit=N).problems
    pf, gf = tmp_path / "p.jsonl", tmp_path / "g.jsonl"
    pf.write_text("".join(json.dumps(p) + "\n" for p in probs))
    gf.write_text("".join(json.dumps({"id": p["id"], "benchmark": bench, "completion": completion(bench, p, wrong)}) + "\n"
                          for p in probs))
    out, summ = tmp_path / "s.jsonl", tmp_path / "s.summary.json"
    r = subprocess.run([sys.executable, "-m", "repro.scoring", "score", "--benchmark", bench, "--problems", str(pf),
                        "--generations", str(gf), "--out", str(out), "--summary", str(summ), "--workers", "2"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads(summ.read_text())
    assert s["n"] == N
    assert s["accuracy"] == (0.0 if wrong else 100.0), [l for l in out.read_text().splitlines()
                                                         if ('"correct": true' in l) == wrong][:3]
    assert len(out.read_text().splitlines()) == N


def test_scoring_stage_honours_the_configured_timeout(tmp_path, data_dir):
    import time

    probs = load_problems("humaneval", data_dir, limit=1).problems
    pf, gf = tmp_path / "p.jsonl", tmp_path / "g.jsonl"
    pf.write_text(json.dumps(probs[0]) + "\n")
    gf.write_text(json.dumps({"id": probs[0]["id"], "completion": "    while True:\n        pass\n"}) + "\n")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "repro.scoring", "score", "--benchmark", "humaneval", "--problems",
                        str(pf), "--generations", str(gf), "--out", str(tmp_path / "s.jsonl"), "--summary",
                        str(tmp_path / "s.json"), "--workers", "1", "--timeout", "1"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    rec = json.loads((tmp_path / "s.jsonl").read_text())
    assert rec["status"] == "timeout" and not rec["correct"]
    assert time.monotonic() - t0 < 9  # the default limit is 10 s per program
