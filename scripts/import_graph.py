"""Print the import graph of a Python package (default: this checkout's ``repro/``) and its import cycles.

Read from the source with the standard library's ``ast`` (nothing is imported or run). Every ``import`` /
``from ... import`` statement of a module counts, wherever it stands: at module level, inside a function
(a lazy import), or under ``if TYPE_CHECKING:``. A lazy import only moves the moment the dependency is
loaded; the two modules still need each other, and the layering (each layer imports only downward) is about
what a module needs. So a cycle closed through a function-level import is a cycle here too.

An edge ``a -> b`` means that module ``a`` names module ``b`` of the same package in an import statement:
``import p.x.y`` and ``from p.x import y`` give ``p.x.y`` when that is a module of the package (else the
nearest enclosing one, ``p.x``); relative imports are resolved against the importing module's package. The
parent packages Python initialises on the way (``p/__init__.py`` for ``p.x``) are not edges: every module
of a package would otherwise sit in a cycle with its ``__init__``. Not followed: dynamic imports
(``importlib.import_module(f"...")`` of the registries), ``python -m`` subprocesses, and modules outside the
package.

Usage::

    python scripts/import_graph.py [PACKAGE_DIR] [--cycles] [--dot]

prints one line per module, ``module -> dep, dep, ...`` (``--cycles``: only the cycles; ``--dot``: Graphviz
instead), then the cycles: each strongly connected set of modules, with one shortest cycle through it as
``a -> b -> a``. Exit status 0 when there is no cycle, 1 when there is one, 2 when ``PACKAGE_DIR`` is not a
package (a directory with ``__init__.py``). ``tests/plumbing/test_import_graph.py`` runs it on ``repro/``.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def module_names(package_dir: Path) -> dict[str, Path]:
    """Dotted name -> file of every module under ``package_dir`` (packages by their ``__init__.py``), named from
    the package's own name (the directory's). Raises ValueError when ``package_dir`` has no ``__init__.py``."""
    package_dir = Path(package_dir)
    if not (package_dir / "__init__.py").is_file():
        raise ValueError(f"{package_dir}: not a Python package (no __init__.py); give the package's directory, "
                         f"e.g. {ROOT / 'repro'}")
    out = {}
    for f in sorted(package_dir.rglob("*.py")):
        rel = f.relative_to(package_dir.parent).with_suffix("")
        if "__pycache__" in rel.parts or any(not p.isidentifier() for p in rel.parts):
            continue  # not importable by name
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        if all((package_dir.parent.joinpath(*parts[:i]) / "__init__.py").is_file() for i in range(1, len(parts))):
            out[".".join(parts)] = f
    return out


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """``name`` if it is a module of the package, else its nearest enclosing module; None when outside."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``module`` (source file ``path``) names in any import statement (module
    docstring: which count and how they resolve). Raises SyntaxError naming the file when it does not parse."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    deps: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                if node.level - 1 >= len(base_parts):
                    continue  # beyond the top package: Python would refuse it too
                base = ".".join(base_parts[:len(base_parts) - (node.level - 1)])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for t in targets:
            r = _resolve(t, modules)
            if r is not None and r != module:
                deps.add(r)
    return deps


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, for every module under ``package_dir``."""
    modules = module_names(package_dir)
    return {m: imports_of(m, f, modules) for m, f in modules.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected sets of two or more modules (Tarjan's algorithm, iterative), each sorted, the list
    sorted by first module: the modules of one set all reach each other, so each set holds a cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in graph:
                    continue
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    v = stack.pop()
                    on_stack.discard(v)
                    comp.append(v)
                    if v == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return sorted(out)


def shortest_cycle(graph: dict[str, set[str]], members: list[str]) -> list[str]:
    """One shortest cycle through the first of ``members`` (a strongly connected set), staying inside the set:
    ``[a, b, ..., a]``."""
    inside = set(members)
    start = members[0]
    prev: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in sorted(graph[node] & inside):
            if nxt == start:
                path = [node]
                while path[-1] != start:
                    path.append(prev[path[-1]])
                return [*reversed(path), start]
            if nxt not in prev:
                prev[nxt] = node
                queue.append(nxt)
    raise ValueError(f"{members}: not strongly connected")


def cycles(package_dir: Path) -> list[list[str]]:
    """One shortest cycle (``[a, b, ..., a]``) per strongly connected set of modules under ``package_dir``;
    empty when the imports only go one way."""
    graph = import_graph(package_dir)
    return [shortest_cycle(graph, comp) for comp in strongly_connected(graph)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python scripts/import_graph.py",
                                 description="The import graph of a package and its cycles (module docstring).")
    ap.add_argument("package_dir", nargs="?", default=str(ROOT / "repro"),
                    help="the package's directory (default: %(default)s)")
    ap.add_argument("--cycles", action="store_true", help="print only the cycles")
    ap.add_argument("--dot", action="store_true", help="print the graph in Graphviz dot instead of one line per module")
    args = ap.parse_args(argv)
    try:
        graph = import_graph(Path(args.package_dir))
    except (ValueError, SyntaxError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    comps = strongly_connected(graph)
    if args.dot:
        print("digraph imports {")
        for m in sorted(graph):
            for d in sorted(graph[m]):
                print(f'  "{m}" -> "{d}";')
        print("}")
    elif not args.cycles:
        for m in sorted(graph):
            print(f"{m} -> {', '.join(sorted(graph[m])) or '(nothing of the package)'}")
        print()
    n_edges = sum(map(len, graph.values()))
    out = sys.stderr if args.dot else sys.stdout
    if not comps:
        print(f"{len(graph)} modules, {n_edges} imports, no cycle", file=out)
        return 0
    print(f"{len(graph)} modules, {n_edges} imports, {len(comps)} cycle(s) (each: the modules that reach each other, "
          f"then one shortest cycle):", file=out)
    for comp in comps:
        print(f"  {', '.join(comp)}\n    {' -> '.join(shortest_cycle(graph, comp))}", file=out)
    return 1


if __name__ == "__main__":
    sys.exit(main())
