"""scripts/check_citations.py: every kind of unresolved citation is found, and resolvable ones pass.

The bad citations are assembled from pieces here (``MD``, ``SEC``, ``ISSUE``) so that this file itself
contains none: the checker also scans the tests.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "check_citations.py"
MD, SEC, ISSUE = ".md", "\u00a7", "issue"


def rel(*parts: str) -> str:
    """A repository-relative path written without a literal path in this file."""
    return "/".join(parts)

_spec = importlib.util.spec_from_file_location("check_citations", SCRIPT)
cc = importlib.util.module_from_spec(_spec)
sys.modules["check_citations"] = cc
_spec.loader.exec_module(cc)

ENGINE_DOC = f"""# Engine rules

## 2. Forward pass
text, see {SEC}6.10 and {SEC}2.

### 6.10 Tokens per forward
same file: {SEC}2; another file: `docs/work{MD}` {SEC}1.3 and {SEC}1.5.
"""
WORK_DOC = "# Workflow\n\n## 1. Tools\n\n### 1.3 Behaviour\n\n### 1.5 spython\n"


def make_tree(tmp_path: Path, files: dict[str, str]) -> Path:
    """A small checkout (not a git repository) with a docs/ folder, a repro package and ``files``."""
    base = {f"docs/engine{MD}": ENGINE_DOC, f"docs/work{MD}": WORK_DOC,
            "repro/__init__.py": "", "repro/engine/__init__.py": "from .llm import LLM\n",
            "repro/engine/llm.py": "class LLM:\n    pass\n\n\ndef generate_ids():\n    pass\n"}
    for rel, text in {**base, **files}.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
    return tmp_path


def kinds(problems) -> list[tuple[str, int, str]]:
    return sorted((p.path, p.line, p.kind) for p in problems)


def test_resolving_citations_pass(tmp_path):
    good = (f'"""Forward (docs/engine{MD} {SEC}2; the same rule in {SEC}6.10, {SEC}2–{SEC}6.10).\n'
            f"Wrapped: see docs/engine{MD}\n{SEC}2 item 4; docs/engine{MD} sections 2 and 6.10.\n"
            f"Outside sources are not checked: LLaDA2.1 report {SEC}4.2, the cookbook {SEC}9;\n"
            f"https://github.com/snakemake/snakemake/{ISSUE}s/3478; snakemake#2872.\n"
            f"Modules: repro.engine.llm.LLM, repro.engine.LLM; path repro/engine/llm.py.\n"
            f'Generated outputs: results/smoke/main_table{MD}, main_table{MD}; abs /etc/slurm/x{MD}.\n"""\n'
            f"REPORT = out / 'a_vs_b{MD}'  # a file name in code, not a citation\n")
    root = make_tree(tmp_path, {"repro/engine/model.py": good})
    assert cc.find_problems(root) == []
    assert cc.main([str(root)]) == 0


def test_each_kind_is_reported_once_at_its_line(tmp_path):
    bad = (f'"""Model (engine_spec{MD} {SEC}2).\n'           # 1 missing-doc (a doc not in the tree)
           f"Anchors (perf_anchors {SEC}2.1).\n"             # 2 missing-doc (reference name without .md)
           f"Rule (docs/engine{MD} {SEC}7).\n"                # 3 missing-section
           f"Layout (../shared/reference/x{MD}).\n"           # 4 missing-doc (outside the checkout)
           f"Choices ({ISSUE} 5).\n"                          # 5 issue-number
           f"Moved: {rel('repro', 'engine', 'gone.py')}, {rel('tests', 'none')}/.\n"  # 6 missing-path ×2
           f"Renamed: repro.engine.{'nothing'}, repro.engine.llm.{'finalize'}.\n"  # 7 missing-module ×2
           f'"""\n')
    dangling = f"# A comment ({SEC}3) before any document is named.\n"
    root = make_tree(tmp_path, {"repro/engine/model.py": bad, rel("scripts", "x.sh"): dangling})
    got = kinds(cc.find_problems(root))
    m = "repro/engine/model.py"
    assert got == sorted([(m, 1, "missing-doc"), (m, 2, "missing-doc"), (m, 3, "missing-section"),
                          (m, 4, "missing-doc"), (m, 5, "issue-number"), (m, 6, "missing-path"),
                          (m, 6, "missing-path"), (m, 7, "missing-module"), (m, 7, "missing-module"),
                          (rel("scripts", "x.sh"), 1, "dangling-section")])
    assert cc.main([str(root)]) == 1


def test_bare_section_refers_to_the_last_document_named(tmp_path):
    # In code, a bare section sign belongs to the last doc named before it (here the workflow doc: no 2).
    text = (f'"""Layout (docs/engine{MD} {SEC}2), tools (docs/work{MD} {SEC}1.3).\n'
            f'Then a bare {SEC}1.5 is fine and a bare {SEC}2 is not.\n"""\n')
    root = make_tree(tmp_path, {rel("repro", "a.py"): text})
    probs = cc.find_problems(root)
    assert [(p.line, p.kind) for p in probs] == [(2, "missing-section")]
    assert "no section " + SEC + "2" in probs[0].message and f"docs/work{MD}" in probs[0].message


def test_sections_cited_by_name_must_occur_in_the_doc(tmp_path):
    text = f'"""Contract: docs/engine{MD}, "Forward pass"; docs/work{MD} "Renamed away".\n"""\n'
    root = make_tree(tmp_path, {rel("repro", "b.py"): text})
    probs = cc.find_problems(root)
    assert [(p.line, p.kind) for p in probs] == [(1, "missing-section")]
    assert '"Renamed away"' in probs[0].message


def test_markdown_bare_sections_are_checked_against_the_file_itself(tmp_path):
    doc = f"# Notes\n\n## 1. One\n\nSee {SEC}1 and {SEC}4.\n"
    root = make_tree(tmp_path, {f"docs/notes{MD}": doc})
    assert kinds(cc.find_problems(root)) == [(f"docs/notes{MD}", 5, "missing-section")]


def test_markdown_links_resolve_relative_to_the_file(tmp_path):
    doc = f"# A\n\nSee [engine](engine{MD}) and [missing](../nowhere{MD}).\n"
    root = make_tree(tmp_path, {f"docs/a{MD}": doc})
    assert kinds(cc.find_problems(root)) == [(f"docs/a{MD}", 3, "missing-doc")]


def test_verbatim_output_block_is_skipped_but_nothing_else(tmp_path):
    doc = (f"# Log\n\n{cc.VERBATIM_MARK}\n```json\n"
           f'{{"block": "32 tokens ({ISSUE} 6 setup)"}}\n```\n\n```\n{ISSUE} 7\n```\n')
    root = make_tree(tmp_path, {f"docs/log{MD}": doc})
    assert kinds(cc.find_problems(root)) == [(f"docs/log{MD}", 9, "issue-number")]


def test_cli_prints_each_problem_and_fails(tmp_path):
    t = rel("tests", "t.py")
    root = make_tree(tmp_path, {t: f"# see {ISSUE} 3\n"})
    r = subprocess.run([sys.executable, str(SCRIPT), str(root)], capture_output=True, text=True)
    assert r.returncode == 1
    assert r.stdout.strip() == f"{t}:1: issue-number: '{ISSUE} 3': name the rule it stands for (and cite " \
                               "docs/…), not an issue number"
    assert "1 unresolved citation(s) in 1 file(s)" in r.stderr


@pytest.mark.parametrize("heading,sec", [("## 6. Decoding", "6"), ("### 6.10 TPF", "6.10"),
                                         (f"## {SEC}13 Choices", "13"), ("#### 2.1. Bytes", "2.1")])
def test_heading_numbers(tmp_path, heading, sec):
    p = tmp_path / f"d{MD}"
    p.write_text(f"{heading}\n\n```\n## 99. not a heading inside a fence\n```\n", encoding="utf-8")
    assert cc.doc_sections(p) == frozenset({sec})


def test_every_citation_in_this_repository_resolves():
    problems = cc.find_problems(ROOT)
    assert not problems, "unresolved citations (python scripts/check_citations.py):\n" + "\n".join(map(str, problems))
