"""Check that every citation in the repository resolves inside the repository.

A newcomer has only the checkout. So code, tests, workflow files, scripts and docs may cite only what is
in it (or an outside source by URL / ``owner/repo:path`` / paper). Reported, one line each
(``path:line: kind: message``):

* ``missing-doc`` — a ``*.md`` path that is neither relative to the repository root nor to the citing
  file's directory (e.g. a bare ``notes.md``, or a ``../`` path out of the tree); a reference doc
  name used as a citation without ``.md`` (``some_notes §2``) is reported the same way;
* ``missing-path`` — a path under one of the repository's top-level folders (``repro/``, ``tests/``,
  ``scripts/``, ``workflow/``, ``docs/``, ``containers/``, ``.ci/``) that does not exist;
* ``missing-module`` — a dotted ``repro.…`` name whose module (or first attribute of that module) does
  not exist;
* ``missing-section`` — a ``§N`` (or ``<doc> section N``) citation of an in-repo doc that has no heading
  numbered ``N`` (``## 6.`` / ``### 6.10 …``). A ``§`` right after a doc path cites that doc; after one of
  ``OUTSIDE_WORDS`` (``LLaDA2.1 report §4.2``) a section of an outside source, not checked; any other
  ``§`` (``of §2``, ``§1–§3``, ``, §5``) refers to the last doc named earlier on the same line, else, in a
  Markdown file, to that file, elsewhere to the last doc named before it in the file;
  A section cited by name right after the doc (``docs/interfaces.md, "Scoring"``) must occur in that
  doc's text (case-insensitive);
* ``dangling-section`` — such a ``§`` in a non-Markdown file with no doc named before it;
* ``issue-number`` — the word issue followed by a number: cite the rule it stands for (in ``docs/``)
  instead. Outside bug reports are cited by URL, which this check does not flag.

Lines of a fenced block in Markdown that follows a line ``<!-- verbatim output -->`` are skipped (a
pasted benchmark record stays as it was printed). Generated outputs (``GENERATED``, ``GENERATED_DIRS``),
Snakemake's ``output.md``-style attributes, bare file names in string literals of code (``"x.md"``),
quoted logger names and absolute paths are not checked.

Usage: ``python scripts/check_citations.py [ROOT]`` (default: this checkout). Prints every finding and a
count; exit status 1 when there is any, 0 otherwise. Python: :func:`find_problems`.
"""

from __future__ import annotations

import argparse
import functools
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Files scanned: by suffix, plus these exact names.
SUFFIXES = {".py", ".md", ".smk", ".sh", ".yaml", ".yml", ".json", ".toml", ".def", ".j2", ".jinja", ".txt",
            ".cfg", ".ini"}
NAMES = {"Snakefile", "run"}
MAX_BYTES = 2_000_000
TOP_DIRS = ("repro", "tests", "scripts", "workflow", "docs", "containers", ".ci")
VERBATIM_MARK = "<!-- verbatim output -->"
#: A ``§`` right after one of these words cites a section of an outside source (not checked).
OUTSIDE_WORDS = ("report", "paper", "cookbook", "card", "blog", "manual", "article", "thesis", "rfc")
#: Markdown files the pipeline writes (not documents): a mention of one is not a citation. ``PREFIX`` is the
#: ``--out PREFIX`` argument of ``repro.tables compare``; ``compare/`` its folder under ``results/<suite>/``.
GENERATED = {"main_table.md", "speed_table.md", "listed_verdicts.md", "PREFIX.md"}
GENERATED_DIRS = ("results/", "work/", "compare/")
#: ``output.md`` in a Snakemake rule is the rule's named output, not a file called ``output.md``.
SNAKEMAKE_OBJECTS = {"output", "input", "params", "log", "wildcards"}

_SEC = r"\d+(?:\.\d+)*"
DOC_RE = re.compile(r"(?<![\w/.:@-])((?:\.\.?/)*[\w.-]+(?:/[\w.-]+)*\.md)(?!\w)")
PSEUDO_DOC_RE = re.compile(r"(?<![\w/.:@-])([A-Za-z]\w*_\w+)(?:\.md)?`?\s*(?=§)")
SECTION_RE = re.compile(rf"§\s*({_SEC})(?:\s*[–-]\s*§?\s*({_SEC}))?")
WORD_SECTION_RE = re.compile(rf"((?:\.\.?/)*[\w.-]+(?:/[\w.-]+)*\.md)`?,?\s+sections?\s+({_SEC})"
                             rf"((?:\s*(?:-|–|,|and)\s*{_SEC})*)")
NAMED_SECTION_RE = re.compile(r"(?<![\w/.:@-])((?:\.\.?/)*[\w.-]+(?:/[\w.-]+)*\.md)`?,?\s+\"([^\"\n]{2,60})\"")
ISSUE_RE = re.compile(r"(?<![\w/#-])[Ii]ssues?\s+#?\d+")
PATH_RE = re.compile(r"(?<![\w/.:@$-])((?:" + "|".join(re.escape(d) for d in TOP_DIRS) + r")/[\w./-]*\w)"
                     r"(?![\w{<*$])")
MODULE_RE = re.compile(r"(?<![\w.])(repro(?:\.[A-Za-z_]\w*)+)")
HEADING_RE = re.compile(rf"^#{{1,6}}\s+§?\s*({_SEC})[.):]?(?:\s|$)")
FENCE_RE = re.compile(r"^\s*(```|~~~)")


@dataclass(frozen=True)
class Problem:
    """One unresolved citation: ``path`` relative to the root, 1-based ``line``, ``kind``, ``message``."""

    path: str
    line: int
    kind: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.kind}: {self.message}"


def repo_files(root: Path) -> list[Path]:
    """Tracked and untracked-but-not-ignored files of the checkout at ``root`` (git), or every file
    outside ``.git``/``.venv`` when ``root`` is not a git checkout; only the kinds this check reads."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                             capture_output=True, check=True).stdout.decode()
        rels = [r for r in out.split("\0") if r]
    except (OSError, subprocess.CalledProcessError):
        rels = [str(p.relative_to(root)) for p in root.rglob("*")
                if p.is_file() and not {".git", ".venv", "__pycache__"} & set(p.relative_to(root).parts)]
    files = []
    for rel in sorted(set(rels)):
        p = root / rel
        if (p.suffix in SUFFIXES or p.name in NAMES) and p.is_file() and p.stat().st_size <= MAX_BYTES:
            files.append(p)
    return files


@functools.lru_cache(maxsize=None)
def doc_sections(path: Path) -> frozenset[str]:
    """Section numbers of the Markdown file ``path``: headings ``## 6. …``, ``### 6.10 …`` → {"6", "6.10"}."""
    found, fenced = set(), False
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if FENCE_RE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else HEADING_RE.match(line)
        if m:
            found.add(m.group(1).rstrip("."))
    return frozenset(found)


@functools.lru_cache(maxsize=None)
def doc_text(path: Path) -> str:
    """The text of the document ``path`` (for named-section look-ups)."""
    return path.read_text(encoding="utf-8", errors="replace")


def resolve_doc(token: str, source: Path, root: Path) -> Path | None:
    """``token`` (a path ending in .md) relative to ``root`` or to ``source``'s folder, if inside ``root``."""
    for base in (root, source.parent):
        p = (base / token).resolve()
        if p.is_file() and p.is_relative_to(root.resolve()):
            return p
    return None


@functools.lru_cache(maxsize=None)
def _defines(path: Path, name: str) -> bool:
    """Whether the Python file ``path`` defines or imports ``name`` at any level."""
    text = path.read_text(encoding="utf-8", errors="replace")
    n = re.escape(name)
    return bool(re.search(rf"^\s*(?:async\s+def|def|class)\s+{n}\b|^\s*{n}\s*[:=]|\bimport\b[^\n]*\b{n}\b"
                          rf"|^\s+{n}\b[^\n]*,?$", text, re.M))


def module_problem(dotted: str, root: Path) -> str | None:
    """Why ``dotted`` (``repro.x.y[.attr]``) does not resolve under ``root``, or None when it does."""
    parts = dotted.split(".")
    path = root / parts[0]
    if not path.is_dir():
        return None  # not this project's package (a test tree without it)
    for i, comp in enumerate(parts[1:], start=1):
        if (path / comp).is_dir():
            path = path / comp
            continue
        if (path / f"{comp}.py").is_file():
            path = path / f"{comp}.py"
            if i + 1 < len(parts) and not _defines(path, parts[i + 1]):
                return f"{'.'.join(parts[:i + 2])}: {path.relative_to(root)} defines no {parts[i + 1]!r}"
            return None
        init = path / "__init__.py"
        if init.is_file() and _defines(init, comp):
            return None
        if path.is_dir():
            return f"{'.'.join(parts[:i + 1])}: no module or package {comp!r} in {path.relative_to(root)}/"
        return None
    return None


def _section_ok(doc: Path, sec: str) -> bool:
    secs = doc_sections(doc)
    return sec in secs


def check_file(path: Path, root: Path) -> list[Problem]:
    """Every unresolved citation in one file."""
    rel = str(path.relative_to(root))
    is_md = path.suffix == ".md"
    problems: list[Problem] = []
    last_doc: Path | None = None
    last_doc_missing = False
    fenced = skip_fence = False
    prev = prev_text = ""
    prev_docs: list[tuple[int, int, Path | None, str]] = []

    def add(lineno: int, kind: str, msg: str) -> None:
        problems.append(Problem(rel, lineno, kind, msg))

    for lineno, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
        if is_md and FENCE_RE.match(line):
            if not fenced:
                skip_fence = prev.strip() == VERBATIM_MARK
            fenced = not fenced
            prev = line
            continue
        prev = line
        if fenced and skip_fence:
            continue

        # documents named on this line, by position
        docs_at: list[tuple[int, int, Path | None, str]] = []
        for m in DOC_RE.finditer(line):
            token = m.group(1)
            if token.startswith(GENERATED_DIRS) or token in GENERATED or token[:-3] in SNAKEMAKE_OBJECTS:
                continue
            quote = line[m.start(1) - 1:m.start(1)]
            if not is_md and "/" not in token and quote in ("'", '"') and line[m.end(1):m.end(1) + 1] == quote:
                continue  # a file name in a string literal of code ('a_vs_b.md'), not a citation
            target = resolve_doc(token, path, root)
            docs_at.append((m.start(1), m.end(1), target, token))
            if target is None:
                add(lineno, "missing-doc", f"{token} is not in the repository (cite a file under docs/ by its "
                                           f"path from the repository root)")
        pseudo_ends = set()
        for m in PSEUDO_DOC_RE.finditer(line):
            if not any(s <= m.start(1) < e for s, e, _, _ in docs_at):
                pseudo_ends.add(m.end())
                add(lineno, "missing-doc", f"{m.group(1)} (cited with §) is not a document in the repository")

        for m in SECTION_RE.finditer(line):
            if m.start() in pseudo_ends:
                continue  # the pseudo document is already reported
            before = line[:m.start()].rstrip(" `'\"*")
            named = [d for d in docs_at if d[1] == len(before)]
            if not before:  # wrapped: "… report\n§6.3" or "… docs/x.md\n§2"
                before = prev_text.rstrip(" `'\"*")
                named = [d for d in prev_docs if d[1] == len(before)]
            earlier = [d for d in docs_at if d[1] <= m.start()]
            if named:
                target, missing = named[0][2], named[0][2] is None
            elif before.lower().endswith(OUTSIDE_WORDS):
                continue  # "LLaDA2.1 report §4.2": a section of an outside source
            elif earlier:
                target, missing = earlier[-1][2], earlier[-1][2] is None
            elif is_md:
                target, missing = path, False
            else:
                target, missing = last_doc, last_doc_missing
                if target is None and not missing:
                    add(lineno, "dangling-section", f"§{m.group(1)} names no document (write docs/<file>.md §N)")
                    continue
            if missing or target is None:
                continue  # the document itself is already reported
            for sec in filter(None, m.groups()):
                if not _section_ok(target, sec):
                    add(lineno, "missing-section", f"{target.relative_to(root.resolve())} has no section §{sec}")

        for m in WORD_SECTION_RE.finditer(line):
            target = resolve_doc(m.group(1), path, root)
            if target is None:
                continue
            for sec in [m.group(2)] + re.findall(_SEC, m.group(3) or ""):
                if not _section_ok(target, sec):
                    add(lineno, "missing-section", f"{target.relative_to(root.resolve())} has no section {sec}")

        for m in NAMED_SECTION_RE.finditer(line):
            target = resolve_doc(m.group(1), path, root)
            if target is not None and m.group(2).lower() not in doc_text(target).lower():
                add(lineno, "missing-section", f'{target.relative_to(root.resolve())} has no section "{m.group(2)}"')

        for m in ISSUE_RE.finditer(line):
            add(lineno, "issue-number", f"{m.group(0)!r}: name the rule it stands for (and cite docs/…), not "
                                        f"an issue number")

        for m in PATH_RE.finditer(line):
            token = m.group(1).rstrip(".")
            if token.endswith(".md"):
                continue  # handled as a document above
            stem = re.match(r"(.+?\.[A-Za-z0-9]+)-", token)  # "tests/x.py-style"
            if not (root / token).exists() and not (stem and (root / stem.group(1)).exists()):
                add(lineno, "missing-path", f"{token} does not exist in the repository")

        for m in MODULE_RE.finditer(line):
            if line[m.start() - 1:m.start()] in ("'", '"') and line[m.end():m.end() + 1] == line[m.start() - 1]:
                continue  # a quoted name such as a logger's ("repro.serve"), not a module reference
            if line[:m.start()].rstrip(" `'\"").endswith("logger"):
                continue  # "logger ``repro.serve``"
            why = module_problem(m.group(1).rstrip("."), root)
            if why:
                add(lineno, "missing-module", why)

        if docs_at:
            last_doc, last_doc_missing = docs_at[-1][2], docs_at[-1][2] is None
        prev_text, prev_docs = line, docs_at
    return problems


def find_problems(root: Path = ROOT) -> list[Problem]:
    """Every unresolved citation in the checkout at ``root``, in file and line order."""
    root = Path(root)
    self_path = Path(__file__).resolve()
    out: list[Problem] = []
    for path in repo_files(root):
        if path.resolve() == self_path:
            continue
        out.extend(check_file(path, root))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", nargs="?", type=Path, default=ROOT, help="checkout to check (default: this one)")
    args = ap.parse_args(argv)
    problems = find_problems(args.root)
    for p in problems:
        print(p)
    files = len({p.path for p in problems})
    if problems:
        print(f"{len(problems)} unresolved citation(s) in {files} file(s); cite docs/ (by path and §) or the "
              f"outside source itself", file=sys.stderr)
        return 1
    print("every citation resolves inside the repository")
    return 0


if __name__ == "__main__":
    sys.exit(main())
