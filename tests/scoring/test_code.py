"""Code extraction and HumanEval/MBPP program assembly, plus the real gold solutions in the sandbox.

Acceptance (docs/scoring_rules.md §10): HumanEval canonical solutions 164/164 pass; MBPP reference code 500/500 pass,
task 367 only with its ``test_setup_code``; known-wrong completions fail.
"""

import pytest

from repro.scoring import humaneval, mbpp, score_records, summarize
from repro.scoring.code.extract import defines, extract_code, fenced_blocks

from scoring_util import WORKERS

FENCE = "```"


@pytest.mark.parametrize("text,entry,code,how", [
    (f"Here:\n{FENCE}python\ndef f():\n    return 1\n{FENCE}\nDone.", "f", "def f():\n    return 1", "fenced"),
    (f"{FENCE}\ndef f():\n    return 1\n{FENCE}", "f", "def f():\n    return 1", "fenced"),          # bare fence (humaneval-05)
    (f"{FENCE}py\ndef f():\n    return 1", "f", "def f():\n    return 1", "fenced"),                 # unclosed
    (f"{FENCE} python\nx = 1\n{FENCE}\n{FENCE}python\ndef f():\n    return x\n{FENCE}", "f",
     "def f():\n    return x", "fenced"),                                                            # block defining f wins
    (f"Sure!\n{FENCE}python\ndef g():\n    pass\n{FENCE}", None, "def g():\n    pass", "fenced"),  # lm-eval gives '!'
    (f"def sq(a):\n    return 4 * a\n{FENCE}", None, "def sq(a):\n    return 4 * a", "before_fence"),  # mbpp-01
    ("def f():\n    return 'DONE'\n", None, "def f():\n    return 'DONE'", "raw"),                 # no cut at DONE
    ("[BEGIN]\ndef f():\n    return 1\n[DONE] trailing", None, "def f():\n    return 1", "raw"),
    ("'def f():\n    return 1'", None, "def f():\n    return 1", "raw"),                            # quoted exemplar format
    ("def f():\n    return 'a'", None, "def f():\n    return 'a'", "raw"),                          # code ending in a string
    ("    return x\n", None, "    return x", "raw"),                                                # bare body keeps indent
    # unfenced code with prose around it: the longest parseable span
    ("Here is the function:\n\ndef f():\n    return 1\n\nIt returns one.", "f", "def f():\n    return 1", "raw+trimmed"),
    ("Sure!\nimport math\ndef f():\n    return math.pi\nHope it helps!", None,
     "import math\ndef f():\n    return math.pi", "raw+trimmed"),
    ("def f(:\n    pass", None, "def f(:\n    pass", "raw"),                                          # nothing parses: as is
])
def test_extract_code(text, entry, code, how):
    assert extract_code(text, entry) == (code, how)


def test_fenced_blocks_and_defines():
    before, blocks = fenced_blocks(f"a\n{FENCE}\nb\n{FENCE}\nc\n{FENCE}x\nd")
    assert before == "a" and blocks == ["b", "d"]
    assert defines("import os\ndef f(x):\n  pass", "f") and not defines("    def f(x):", "f")
    assert not defines("def ff(x):", "f")


HE = {"task_id": "T/0", "entry_point": "add",
      "prompt": "import math\n\ndef helper(x):\n    return x\n\n\ndef add(a, b):\n    \"\"\"Add.\"\"\"\n",
      "canonical_solution": "    return a + b\n",
      "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n"}


def test_humaneval_assembly_variants():
    # continuation: prompt + body
    prog, code, how = humaneval.build_program(HE, "    return helper(a) + b\n<|endoftext|>garbage")
    assert prog.startswith(HE["prompt"] + "    return helper(a) + b") and "garbage" not in prog and how == "raw"
    assert prog.rstrip().endswith("check(add)")
    # restated function in a fence: prompt not duplicated, helpers/imports kept
    prog, _, how = humaneval.build_program(HE, f"{FENCE}python\ndef add(a, b):\n    return helper(a) + b\n{FENCE}")
    assert how == "fenced+restated" and prog.count("def add(") == 1 and "def helper" in prog and "import math" in prog
    # a fenced body written flush-left is indented (never concatenated raw, humaneval-07)
    prog, _, how = humaneval.build_program(HE, f"{FENCE}\nreturn a + b\n{FENCE}")
    assert how == "fenced+indented" and "    return a + b" in prog
    # unfenced body followed by prose: trimmed against the prompt
    prog, _, how = humaneval.build_program(HE, "    return a + b\n\nThis returns the sum of a and b.")
    assert how == "raw+trimmed" and "This returns" not in prog
    with pytest.raises(ValueError, match="lacks field"):
        humaneval.build_program({"task_id": "x"}, "")


def test_mbpp_assembly_order():
    src = {"task_id": 1, "code": "", "test_setup_code": "z = make()", "test_list": ["assert f(z) == 1", "assert f(0) == 0"]}
    prog, code, _ = mbpp.build_program(src, f"{FENCE}python\ndef make(): return 1\ndef f(x): return x\n{FENCE}")
    assert prog.index("def f") < prog.index("z = make()") < prog.index("assert __orl_truth__(__orl_cmp__('==', f(z), 1))") < prog.index("f(0)")
    with pytest.raises(ValueError, match="test_list must be a non-empty list"):
        mbpp.build_program({"task_id": 2, "test_setup_code": "", "test_list": []}, "")


def test_humaneval_canonical_all_pass(problems):
    probs = problems("humaneval")
    assert len(probs) == 164
    scores = score_records("humaneval", probs, {p["id"]: p["source"]["canonical_solution"] for p in probs}, WORKERS)
    failed = [(s["id"], s["reason"]) for s in scores if s["status"] != "passed"]
    assert not failed, failed[:3]
    s = summarize("humaneval", scores)
    assert s["correct"] == 164 and s["status_counts"] == {"passed": 164} and s["strict_accuracy"] is None


def test_humaneval_chat_style_canonical_pass(problems):
    """The canonical bodies restated as whole functions in a fence (chat style) pass too."""
    probs = problems("humaneval")[:40]
    comps = {}
    for p in probs:
        src = p["source"]
        start = src["prompt"].index(f"def {src['entry_point']}(")
        comps[p["id"]] = f"Here is the code:\n{FENCE}python\n{src['prompt'][start:]}{src['canonical_solution']}{FENCE}\nHope it helps."
    scores = score_records("humaneval", probs, comps, WORKERS)
    assert all(s["status"] == "passed" for s in scores), [s["reason"] for s in scores if not s["correct"]][:2]


def test_humaneval_wrong_completions_fail(problems):
    probs = problems("humaneval")[:30]
    scores = score_records("humaneval", probs, {p["id"]: "    return None\n" for p in probs}, WORKERS)
    assert all(s["status"] == "failed" and not s["correct"] for s in scores)
    assert "AssertionError" in scores[0]["reason"] or "Error" in scores[0]["reason"]


def test_mbpp_reference_all_pass(problems):
    probs = problems("mbpp")
    assert len(probs) == 500
    scores = score_records("mbpp", probs, {p["id"]: f"{FENCE}python\n{p['gold']}\n{FENCE}" for p in probs}, WORKERS)
    failed = [(s["id"], s["reason"]) for s in scores if s["status"] != "passed"]
    assert not failed, failed[:3]
    assert summarize("mbpp", scores)["correct"] == 500


def test_mbpp_chat_style_reference_pass(problems):
    """Chat-style answers: prose, a fenced block with the model's own asserts and a main guard that
    would block on input() (not run: programs execute with ``__name__ != "__main__"``), more prose,
    the ``[DONE]`` marker and window filler after EOS."""
    probs = problems("mbpp")[:60]
    comps = {p["id"]: (f"Sure! Here is the solution:\n{FENCE}python\n{p['gold']}\n\n# quick check\n"
                       f"{p['source']['test_list'][0]}\nif __name__ == '__main__':\n    print(input())\n{FENCE}\n"
                       "The function handles the edge cases. DONE.\n[DONE]<|endoftext|><|mask|>garbage")
             for p in probs}
    scores = score_records("mbpp", probs, comps, WORKERS)
    assert all(s["status"] == "passed" for s in scores), [s["reason"] for s in scores if not s["correct"]][:2]


def test_mbpp_367_needs_setup_code(problems):
    p = next(p for p in problems("mbpp") if p["source"]["task_id"] == 367)
    assert p["source"]["test_setup_code"].strip()
    ok = score_records("mbpp", [p], {p["id"]: p["gold"]}, 1)[0]
    assert ok["status"] == "passed"
    no_setup = {**p, "source": {**p["source"], "test_setup_code": ""}}
    bad = score_records("mbpp", [no_setup], {p["id"]: p["gold"]}, 1)[0]
    assert bad["status"] == "failed" and "NameError" in bad["reason"]


def test_mbpp_all_asserts_run(problems):
    """mbpp-02 family: code passing only the first (shown) assert fails."""
    p = next(p for p in problems("mbpp") if p["source"]["task_id"] == 17)
    first = p["source"]["test_list"][0]  # assert square_perimeter(10)==40
    s = score_records("mbpp", [p], {p["id"]: "def square_perimeter(a):\n    return 40\n"}, 1)[0]
    assert "square_perimeter(10)==40" in first and s["status"] == "failed"
