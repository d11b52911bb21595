"""No import cycles inside either service or scripts/: each module's imports (at the top,
inside functions and under `if TYPE_CHECKING:` alike) read with ast, and the graph
searched for strongly connected components. A cycle means two modules each decide part of the
other's concept; a deferred or type-only import that hides one is still one."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = {
    "sidecar": REPO / "phi3-sidecar" / "sidecar",
    "chatapp": REPO / "main-app" / "chatapp",
    "scripts": REPO / "scripts",
}


def modules(name: str, root: Path) -> dict[str, Path]:
    """Every module of the package: dotted name -> file (a package is its __init__.py)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = [name, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in ast.iter_child_nodes(tree):
        yield from _imports_in(node)


def _imports_in(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    if isinstance(node, ast.Import | ast.ImportFrom):
        yield node
    else:
        yield from _imports(node)


def imported(module: str, path: Path, known: set[str]) -> set[str]:
    """The modules of `known` that `module` imports."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    targets: set[str] = set()
    for node in _imports(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # `from a import b`: the module a.b if there is one, else a (b is a name in it)
            names = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            ]
        for name in names:
            # the longest known module the name starts with (`import a.b.c` loads a.b.c)
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
    return targets


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def import_graph(name: str, root: Path) -> dict[str, set[str]]:
    files = modules(name, root)
    return {module: imported(module, path, set(files)) for module, path in files.items()}


@pytest.mark.parametrize("name", sorted(PACKAGES))
def test_no_import_cycles(name: str) -> None:
    graph = import_graph(name, PACKAGES[name])
    assert len(graph) > 3
    found = cycles(graph)
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_search_finds_cycles_through_deferred_and_type_only_imports(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "sub" / "__init__.py").write_text("")
    (root / "a.py").write_text("from pkg.sub import b\n")
    (root / "sub" / "b.py").write_text("def f():\n    from ..c import g\n")
    (root / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.free\n"
        "import pkg.a as a\n"
    )
    (root / "free.py").write_text("import pkg.c\n")
    graph = import_graph("pkg", root)
    assert graph["pkg.sub.b"] == {"pkg.c"}
    # pkg.free too: a type-only import still makes each module know the other
    assert graph["pkg.c"] == {"pkg.a", "pkg.free"}
    # one strongly connected component holds both loops
    assert cycles(graph) == [["pkg.a", "pkg.c", "pkg.free", "pkg.sub.b"]]
