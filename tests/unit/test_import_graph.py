"""No import cycle between the product's modules (issue 41, item 4).

The graph is built from the source with :mod:`ast`, not by importing anything: one node per module
of the installed name ``corbin_fl`` (the folders of ``[tool.setuptools.package-dir]`` in
``pyproject.toml``), one edge per import that runs when the module is imported: every import
statement outside a function body, except those under ``if TYPE_CHECKING:`` (they never run, so
an annotation may name a module above). ``import a.b.c`` and ``from a.b import c`` are edges to the
deepest product module they name (``a.b.c`` when it is a module, else ``a.b``). An import inside a
function is not an edge: the project's rule is that such an import states its reason (an optional
dependency, a measured start-up cost), never a cycle it dodges.

Every strongly connected component of more than one module is a cycle. :data:`ALLOWED_CYCLES`
lists the ones not broken yet, each with its reason; a cycle outside it fails, and so does an
entry that no longer matches a cycle (delete it: the list only shrinks).
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

ALLOWED_CYCLES: tuple[frozenset[str], ...] = ()
"""Cycles of module-level imports not broken yet (each with a comment saying why); only shrinks."""

ALLOWED_FUNCTION_CYCLES: tuple[frozenset[str], ...] = ()
"""Cycles that exist only through imports inside functions, not broken yet; only shrinks."""


def product_modules(root: Path = ROOT) -> dict[str, Path]:
    """Module name -> source file of every module of the installed name (package-dir)."""
    pyproject = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    package_dir: Mapping[str, str] = pyproject["tool"]["setuptools"]["package-dir"]
    folders = {folder for folder in package_dir.values()}
    modules: dict[str, Path] = {}
    for package, folder in package_dir.items():
        base = root / folder
        for path in sorted(base.rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts and parts[0] in folders and folder != parts[0]:
                continue  # another package's folder inside this one
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join([package, *parts])] = path
    return modules


def _runtime_imports(
    tree: ast.Module, *, in_functions: bool = False
) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements that run at import time: outside functions (inside them too with
    ``in_functions``), not under ``if TYPE_CHECKING:``."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if not in_functions and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
            continue
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _deepest(name: str, modules: Mapping[str, Path]) -> str | None:
    """The deepest product module that ``name`` (dotted) is or lies in; None outside."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def import_graph(modules: Mapping[str, Path], *, in_functions: bool = False) -> dict[str, set[str]]:
    """Module -> the product modules it imports at import time (see the module docstring); with
    ``in_functions`` also those its functions import when they run."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        package = name if is_package else name.rpartition(".")[0]
        edges: set[str] = set()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in _runtime_imports(tree, in_functions=in_functions):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets = [f"{base}.{alias.name}" for alias in node.names] or [base]
            for target in targets:
                found = _deepest(target, modules)
                if found is not None and found != name:
                    edges.add(found)
        graph[name] = edges
    return graph


def cycles(graph: Mapping[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[frozenset[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def _write(root: Path, files: Mapping[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_the_checker_finds_a_cycle_and_ignores_function_and_type_checking_imports(
    tmp_path: Path,
) -> None:
    _write(
        tmp_path,
        {
            "pyproject.toml": '[tool.setuptools.package-dir]\n"pkg" = "pkg"\n"pkg.sub" = "sub"\n',
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg import b\n",
            "pkg/b.py": "import pkg.sub.c\n",
            "sub/__init__.py": "",
            "sub/c.py": "from ..a import x\n",  # pkg.sub.c -> pkg.a: closes a -> b -> c -> a
            "pkg/d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.e\n",
            "pkg/e.py": "def f():\n    from pkg import d\n",
        },
    )
    modules = product_modules(tmp_path)
    assert set(modules) == {"pkg", "pkg.a", "pkg.b", "pkg.d", "pkg.e", "pkg.sub", "pkg.sub.c"}
    graph = import_graph(modules)
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.sub.c"] == {"pkg.a"}
    assert graph["pkg.d"] == set() and graph["pkg.e"] == set()
    assert cycles(graph) == [frozenset({"pkg.a", "pkg.b", "pkg.sub.c"})]


def _unexpected(found: list[frozenset[str]], allowed: tuple[frozenset[str], ...]) -> str:
    """What is wrong with ``found`` against ``allowed`` ("" when nothing)."""
    new = [sorted(c) for c in found if not any(c <= a for a in allowed)]
    stale = [sorted(a) for a in allowed if not any(c <= a for c in found)]
    problems = [f"import cycles between product modules: {new}"] if new else []
    if stale:
        problems.append(f"no longer cycles, delete them from the allow list: {stale}")
    return "; ".join(problems)


def test_the_product_has_no_import_cycle_outside_the_allow_list() -> None:
    modules = product_modules()
    assert "corbin_fl.config" in modules and "corbin_fl.server.strategy" in modules
    problems = _unexpected(cycles(import_graph(modules)), ALLOWED_CYCLES)
    assert not problems, problems


def test_no_import_inside_a_function_closes_a_cycle_outside_the_allow_list() -> None:
    """The same with the imports inside functions as edges: an import moved into a function
    does not hide a cycle (``corbin_fl.config``, ``registry``, ``wire`` and ``secure`` used to
    import each other in a circle that way)."""
    graph = import_graph(product_modules(), in_functions=True)
    problems = _unexpected(cycles(graph), ALLOWED_FUNCTION_CYCLES)
    assert not problems, problems
