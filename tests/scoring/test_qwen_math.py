"""The Qwen2.5-Math grader (repro/scoring/graders/qwen_math.py, vendored in _qwen25_math/): the vendored files are
upstream's bytes but for the marked import lines, it reads real GSM8K problems answered in the forms our prompt asks
for without listing them, it lists the kinds it was added for (a Unicode mixed number whose whole part is the gold),
the near-misses keep their verdicts, and an install without its packages stops at start-up in one line."""

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from repro import benchmarks
from repro.backends.replay import reference_completion
from repro.data import load_problems
from repro.scoring import graders
from repro.scoring import second_grader as sg
from repro.scoring.graders import _qwen25_math, qwen_math

needs_graders = pytest.mark.skipif(bool(graders.missing(["gsm8k"])), reason=str(graders.missing(["gsm8k"])))
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # upstream's "\\d" in plain strings, on first compile
VENDOR = Path(_qwen25_math.__file__).parent
MARK = "# [repro] was: "


def _ours(problems, correct=True):
    return [{"id": p["id"], "extracted": "x", "correct": correct, "status": "correct" if correct else "wrong",
             "reason": "planted"} for p in problems]


def _upstream_bytes(path: Path) -> bytes:
    """The vendored file with our header dropped and each marked line put back as upstream wrote it."""
    text = path.read_text()
    lines = text.split("\n")
    out = []
    for ln in lines:
        if ln.startswith("# [repro] ") and not ln.startswith(MARK):
            continue  # the header
        out.append(ln[ln.index(MARK) + len(MARK):] if MARK in ln else ln)
    return "\n".join(out).encode()


def test_vendored_files_are_upstreams_but_for_the_marked_import_lines():
    assert len(_qwen25_math.COMMIT) == 40 and _qwen25_math.SOURCE.endswith("QwenLM/Qwen2.5-Math")
    on_disk = {str(p.relative_to(VENDOR)) for p in VENDOR.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert on_disk - {"__init__.py"} == set(_qwen25_math.FILES)
    for name, (upstream, sha) in _qwen25_math.FILES.items():
        got = _upstream_bytes(VENDOR / name)
        assert hashlib.sha256(got).hexdigest() == sha, f"{name} differs from {upstream} beyond its marked lines"
        if name.endswith(".py") and name != "gen/__init__.py":
            assert (VENDOR / name).read_text().startswith(f"# [repro] Vendored"), name  # source, commit, licence
    changed = [ln for name in _qwen25_math.FILES for ln in (VENDOR / name).read_text().splitlines() if MARK in ln]
    assert len(changed) == 6 and all("import" in ln for ln in changed), changed  # imports only
    assert "qwen_math" in benchmarks.get("gsm8k").graders and "qwen_math" not in benchmarks.get("math500").graders


@needs_graders
def test_real_gsm8k_answers_in_our_prompts_forms_are_not_listed(data):
    """The worked answers of 200 real problems, as written and with the final line in the forms the prompt asks for
    (a box after the working, "The answer is $\\boxed{N}$."): Qwen2.5-Math reads the box first and lists none; with
    the final number changed it says wrong on every one whose gold is not 1."""
    probs = load_problems("gsm8k", data).problems[:200]
    forms = {
        "worked": lambda body, n, raw: raw,
        "box": lambda body, n, raw: f"{body}\n\n\\boxed{{{n}}}",
        "sentence": lambda body, n, raw: f"{body}\nThe answer is $\\boxed{{{n}}}$.",
    }
    for form, make in forms.items():
        comps = {}
        for p in probs:
            raw = reference_completion("gsm8k", p)
            body, _, n = raw.rpartition("####")
            comps[p["id"]] = make(body.strip(), n.strip(), raw)
        rep = sg.compare("gsm8k", probs, comps, _ours(probs), workers=2)
        by = {g["name"]: g for g in rep["graders"]}
        assert by["qwen_math"]["graded"] == 200 and by["qwen_math"]["differ"] == 0, (form, rep["problems"][:2])
    wrong = {p["id"]: f"{reference_completion('gsm8k', p).rsplit('####', 1)[0]}\n\\boxed{{1}}" for p in probs[:40]}
    rep = sg.compare("gsm8k", probs[:40], wrong, _ours(probs[:40]), workers=2)
    differ = {g["name"]: g["differ"] for g in rep["graders"]}["qwen_math"]
    assert differ == sum(p["gold"].replace(",", "") != "1" for p in probs[:40]) > 35


@needs_graders
def test_the_kinds_it_reads_and_the_near_misses_that_stay(data):
    """Problem 212 (gold 5: hours) and problem 0 (gold 18) of the real test split, answered by hand; one request
    through the grader worker per answer, as a scoring job makes it."""
    probs = load_problems("gsm8k", data).problems
    p5, p18 = probs[212], probs[0]
    assert (p5["gold"], p18["gold"]) == ("5", "18")
    said = [  # (problem, completion, Qwen2.5-Math's verdict)
        (p5, "That takes 16.5 / 3 = 5.5 hours.\n\nThe answer is 5½ hours.", False),  # not read as its whole part 5
        (p5, "It takes $\\boxed{5\\frac{1}{2}}$ hours.", False),
        (p5, "It takes $\\boxed{5}$ hours.", True),
        (p5, "It takes 5 hours.", True),  # no box, no marker: the last number
        (p18, "She sells 9 eggs at $2 each: \\boxed{18}", True),
        (p18, "\\boxed{\\$18.00}", True),
        (p18, "The answer is eighteen.", True),  # word2number, as upstream reads number words
        (p18, "\\boxed{18.5}", False),
        (p18, "\\boxed{81}", False),
        (p18, "**Answer: 18**\n\nCheck: over 7 days that is 126 dollars.", False),  # the last number: 126
        (p18, "The answer is 9 * 2 = 18.", False),  # it keeps "9*2=18" whole: the case it lists against us
        (p18, "\\boxed{0.18}", True),  # math_equal also accepts the gold / 100 and * 100 (upstream's percentages)
    ]
    got = [qwen_math.verdict("gsm8k", p["gold"], c)["correct"] for p, c, _ in said]
    assert got == [want for _, _, want in said], [(c, g) for (_, c, _), g in zip(said, got)]
    # the same through the worker pool (the antlr4 4.11 of the workers, the 30 s limit), one case listed
    items = [{"id": f"q{i}", "benchmark": "gsm8k", "gold": p["gold"]} for i, (p, _, _) in enumerate(said)]
    comps = {f"q{i}": c for i, (_, c, _) in enumerate(said)}
    rep = sg.compare("gsm8k", items, comps, _ours(items), workers=1)
    row = {r["id"]: r["graders"]["qwen_math"] for r in rep["problems"]}
    assert {k for k, v in row.items() if v["correct"] is False} == {f"q{i}" for i, (_, _, w) in enumerate(said) if not w}
    assert row["q0"]["extracted"] == "5½" and "!=" in row["q0"]["detail"]
    assert qwen_math.version()["source"].endswith(_qwen25_math.COMMIT)
    with pytest.raises(ValueError, match="gsm8k"):
        qwen_math.verdict("math500", "\\frac{1}{3}", "\\boxed{0.\\overline{3}}")


def test_an_install_without_word2number_stops_at_start_up_in_one_line(tmp_path):
    """A plain `pip install -e .` lacks the graders extra: the scoring CLI stops before scoring, naming the grader,
    the package and the fix."""
    r = subprocess.run([sys.executable, "-c", "import sys; sys.modules['word2number'] = None; "
                        "import importlib.util as u; f = u.find_spec; "
                        "u.find_spec = lambda n, *a: None if n == 'word2number' else f(n, *a); "
                        "from repro.scoring.__main__ import main; sys.exit(main(['score', '--benchmark', 'gsm8k', "
                        "'--problems', 'p', '--generations', 'g', '--out', 'o', '--summary', 's']))"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "gsm8k: qwen_math: word2number is not installed" in r.stderr and "fix: bash scripts/setup.sh" in r.stderr
