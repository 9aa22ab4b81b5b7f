"""scripts/import_graph.py: repro/ imports only downward (no cycle), and the checker finds a cycle planted in a
temporary package, through module-level, function-level, relative and ``from package import module`` imports."""

from __future__ import annotations

import importlib.util
import sys
import textwrap

from plumbing_util import ROOT, run_py

SCRIPT = ROOT / "scripts" / "import_graph.py"
_spec = importlib.util.spec_from_file_location("import_graph", SCRIPT)
ig = importlib.util.module_from_spec(_spec)
sys.modules["import_graph"] = ig
_spec.loader.exec_module(ig)


def test_repro_has_no_import_cycle():
    found = ig.cycles(ROOT / "repro")
    assert found == [], ("import cycles in repro/ (python scripts/import_graph.py --cycles); move what both sides "
                         "need into a module below them:\n" + "\n".join(" -> ".join(c) for c in found))
    graph = ig.import_graph(ROOT / "repro")
    # the graph is read, not empty: known downward edges are there, and their reverse is not
    assert "repro.io" in graph["repro.data"] and "repro.data" in graph["repro.provenance"]
    assert "repro.checkpoint.nvfp4" in graph["repro.engine.kernels.moe_w4"]
    assert not any(m.startswith("repro.engine") for m in graph["repro.checkpoint.nvfp4"])


def _write(root, files: dict[str, str]):
    for rel, text in files.items():
        f = root / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(textwrap.dedent(text))


def test_planted_cycles_are_found(tmp_path):
    pkg = tmp_path / "pkg"
    _write(tmp_path, {
        "pkg/__init__.py": "from pkg.sub import d  # a package importing its own module: no cycle by itself\n",
        "pkg/a.py": "import os\nfrom pkg import b\n",
        "pkg/b.py": "def f():\n    from .a import g  # lazy: still a dependency\n    return g\n",
        "pkg/c.py": "import pkg.a\n",
        "pkg/x.py": "import pkg.y as y\n",
        "pkg/y.py": "from . import z\n",
        "pkg/z.py": "from .x import thing\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/d.py": "from .. import c\nfrom ..x import thing\n",
    })
    graph = ig.import_graph(pkg)
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.a"} and graph["pkg.c"] == {"pkg.a"}
    assert graph["pkg.sub.d"] == {"pkg.c", "pkg.x"} and graph["pkg"] == {"pkg.sub.d"}
    assert ig.cycles(pkg) == [["pkg.a", "pkg.b", "pkg.a"], ["pkg.x", "pkg.y", "pkg.z", "pkg.x"]]
    r = run_py([str(SCRIPT), str(pkg), "--cycles"])
    assert r.returncode == 1, r.stderr
    assert "2 cycle(s)" in r.stdout and "pkg.x -> pkg.y -> pkg.z -> pkg.x" in r.stdout

    # break both: the lazy import and the relative one go; no cycle is left, exit status 0
    (pkg / "b.py").write_text("def f():\n    return 1\n")
    (pkg / "z.py").write_text("thing = 1\n")
    assert ig.cycles(pkg) == []
    r = run_py([str(SCRIPT), str(pkg)])
    assert r.returncode == 0 and r.stdout.splitlines()[-1].endswith("no cycle"), r.stdout + r.stderr
    assert "pkg.sub.d -> pkg.c, pkg.x" in r.stdout


def test_not_a_package_is_one_clear_error(tmp_path):
    r = run_py([str(SCRIPT), str(tmp_path)])
    assert r.returncode == 2 and f"{tmp_path}: not a Python package (no __init__.py)" in r.stderr
