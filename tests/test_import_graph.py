"""No import circle in the package: every import a module states (at its top, inside a function or
for type checking alone) points down, so that each layer can be read, tested and changed without
the ones above it: pipeline.base at the floor, then the methods, the config (pipeline.dag), the
stages (pipeline/base/__init__.py says why)."""

import ast
from pathlib import Path

from pipeline import REPO


def module_name(root: Path, path: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules of the package under ``root`` it imports by name (``from a import b``
    counts a.b where b is a module, else a; relative imports resolved; a parent package that Python
    runs first is not an import the module states)."""
    modules = {module_name(root, p): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_package_has_no_import_circle():
    found = circles(import_graph(REPO / "pipeline"))
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_a_circle_through_a_type_checking_or_relative_import_is_found(tmp_path):
    """The check itself: a circle closed by an import made for type checking only, and one closed
    by a relative import inside a function, are both circles; a parent package run first is not."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    type_checking_only = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n"
    (pkg / "sub" / "__init__.py").write_text(type_checking_only)
    (pkg / "a.py").write_text("from pkg.sub import b\n")  # runs pkg/sub/__init__ first: not an edge to it
    (pkg / "sub" / "b.py").write_text("def f():\n    from .. import c\n")
    (pkg / "c.py").write_text("import pkg.sub.b\n")
    graph = import_graph(pkg)
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.c"} and graph["pkg.sub"] == {"pkg.a"}
    assert circles(graph) == [["pkg.c", "pkg.sub.b"]]
    (pkg / "a.py").write_text("from pkg import sub\n")  # names the package itself: an edge
    assert circles(import_graph(pkg)) == [["pkg.a", "pkg.sub"], ["pkg.c", "pkg.sub.b"]]
