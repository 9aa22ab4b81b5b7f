"""One declaration per benchmark (repro.benchmarks): each is complete and consistent, every list and
dispatch derives from it, and a fifth benchmark is one module (+ template + tests) away."""

import dataclasses
import importlib
import re
import sys
import textwrap
from pathlib import Path

import pytest

from repro import benchmarks
from repro.data import BUILTIN_DIR, load_problems
from repro.io import read_jsonl

REPO = Path(__file__).resolve().parents[1]
TEMPLATES = REPO / "repro" / "prompts" / "templates"


def test_registry_order_and_lookup():
    assert benchmarks.names() == ("gsm8k", "math500", "humaneval", "mbpp")  # math first, then code
    assert [b.title for b in benchmarks.declarations()] == ["GSM8K", "MATH-500", "HumanEval", "MBPP"]
    with pytest.raises(ValueError, match="unknown benchmark 'gsm9k'; expected one of gsm8k, math500"):
        benchmarks.get("gsm9k")
    with pytest.raises(ValueError, match="kind must be one of"):
        dataclasses.replace(benchmarks.get("gsm8k"), kind="vision")


@pytest.mark.parametrize("name", benchmarks.names())
def test_declaration_is_complete(name):
    from repro.scoring import score_records, scorer_module

    b = benchmarks.get(name)
    assert (TEMPLATES / b.template).is_file()
    rows = read_jsonl(BUILTIN_DIR / b.file)
    assert rows and all(set(b.fields) <= set(r) and set(b.prompt_fields) <= set(r) for r in rows)
    ids = [b.problem_id(i, r) for i, r in enumerate(rows)]
    assert len(set(ids)) == len(ids) and all(isinstance(b.gold(r), str) for r in rows)
    scorer = scorer_module(name)
    assert callable(getattr(scorer, "score_many" if b.kind == "math" else "build_program"))
    problems = load_problems(name, None, allow_hub=False).problems  # the shipped problems
    scores = score_records(name, problems, {p["id"]: b.reference_completion(p["source"]) for p in problems}, 1)
    assert all(s["correct"] for s in scores), [s["reason"] for s in scores if not s["correct"]]
    assert re.fullmatch(r"[0-9a-f]{64}", b.published_sha256) and b.hub_path and b.hub_split
    assert b.hub_revision is None or re.fullmatch(r"[0-9a-f]{40}", b.hub_revision)


def test_no_benchmark_name_lists_outside_the_declarations():
    """The four names never appear together in code outside repro/benchmarks (docs and config may list
    them: a suite chooses its benchmarks)."""
    together = re.compile(r"gsm8k.{0,40}math500.{0,40}humaneval.{0,40}mbpp", re.S)
    offenders = []
    for p in [*REPO.joinpath("repro").rglob("*.py"), *REPO.joinpath("workflow").rglob("*.smk"),
              *REPO.joinpath("workflow").rglob("*.json"), REPO / "Snakefile"]:
        if "benchmarks" in p.relative_to(REPO).parts[:2]:
            continue
        code = "\n".join(ln for ln in p.read_text().splitlines() if not ln.lstrip().startswith("#"))
        code = re.sub(r'"""(?:.|\n)*?"""', "", code)  # docstrings describe, they do not dispatch
        if together.search(code):
            offenders.append(str(p.relative_to(REPO)))
    assert offenders == []


@pytest.fixture
def fifth(tmp_path, monkeypatch):
    """A fifth benchmark declared in one module (+ its template and a data file), as docs/benchmarks.md says."""
    pkg = tmp_path / "extra"
    pkg.mkdir()
    (pkg / "arith.py").write_text(textwrap.dedent('''
        from repro.benchmarks import Benchmark

        BENCHMARK = Benchmark(
            name="arith", title="Arith", kind="math", file="arith.jsonl", fields=("q", "a"),
            published_sha256="0" * 64, problem_id=lambda i, r: f"arith/{i}", gold=lambda r: r["a"],
            template="arith.v1.j2", template_number=1, prompt_fields=("q",), stop=("\\nQ:",),
            reference_completion=lambda r: "#### " + r["a"],
            scorer="gsm8k", hub_path="example/arith", hub_config=None, hub_split="test", hub_revision=None)
    '''))
    templates = tmp_path / "templates"
    templates.mkdir()
    for f in TEMPLATES.iterdir():
        (templates / f.name).write_text(f.read_text())
    (templates / "arith.v1.j2").write_text("{{ q }}\nAnswer with a number.")
    (tmp_path / "arith.jsonl").write_text('{"q": "2 + 3?", "a": "5"}\n{"q": "4 * 4?", "a": "16"}\n')
    import repro.prompts as prompts

    monkeypatch.setattr(benchmarks, "__path__", [*benchmarks.__path__, str(pkg)])
    monkeypatch.setattr(prompts, "_TEMPLATE_DIR", templates)
    benchmarks._registry.cache_clear()
    prompts._load.cache_clear()
    yield tmp_path
    benchmarks._registry.cache_clear()
    prompts._load.cache_clear()
    sys.modules.pop(benchmarks.__name__ + ".arith", None)


def test_a_fifth_benchmark_is_one_module_away(fifth):
    from repro.config import validate_config
    from repro.prompts import build_prompt
    from repro.scoring import score_records
    from repro.tables.render import declared_benchmark

    assert benchmarks.names() == ("arith", "gsm8k", "math500", "humaneval", "mbpp")
    lp = load_problems("arith", fifth)
    assert [p["id"] for p in lp.problems] == ["arith/0", "arith/1"] and lp.problems[1]["gold"] == "16"
    prompt = build_prompt("arith", lp.problems[0]["source"])
    assert prompt.messages[0]["content"] == "2 + 3?\nAnswer with a number." and "\nQ:" in prompt.stop
    scores = score_records("arith", lp.problems, {"arith/0": "It is 5.\nQ: next", "arith/1": "It is 15."})
    assert [s["correct"] for s in scores] == [True, False] and scores[0]["benchmark"] == "arith"
    assert declared_benchmark("arith").title == "Arith"
    cfg = importlib.import_module("yaml").safe_load((REPO / "config.yaml").read_text())
    cfg["suites"]["smoke"]["benchmarks"] = ["arith", "gsm8k"]
    assert validate_config(cfg)["suites"]["smoke"]["benchmarks"] == ["arith", "gsm8k"]
