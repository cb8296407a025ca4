"""The rooms of the code import each other in one direction only (docs/DESIGN.md).

The building block (``corbin_fl``'s shared modules, ``corbin_fl.server``, ``corbin_fl.client``,
``corbin_fl.mechanisms``) imports nothing of this project's app (``corbin_fl.app``) or of the
tooling (``corbin_fl.deploy``, ``corbin_fl.experiments``); the math imports nothing of the rest;
and no two packages import each other, directly or through others. Every import counts, lazy
ones inside functions too. ``corbin_fl/__init__.py`` is the distribution's public face (it
re-exports ``CorBin`` and ``corbin_mod`` on first use) and is not a room.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FOLDERS: dict[str, str] = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"][
    "setuptools"
]["package-dir"]
BUILDING_BLOCK = {"corbin_fl", "corbin_fl.server", "corbin_fl.client", "corbin_fl.mechanisms"}


def _package_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "corbin_fl":
        return None
    sub = ".".join(parts[:2])
    return sub if sub in FOLDERS else "corbin_fl"


def _sources(package: str) -> list[Path]:
    folder = REPO / FOLDERS[package]
    if package != "corbin_fl":
        return sorted(folder.rglob("*.py"))
    return sorted(p for p in folder.glob("*.py") if p.name != "__init__.py")


def import_graph() -> dict[str, dict[str, set[str]]]:
    """``{package: {imported package: {files}}}`` over every import statement."""
    graph: dict[str, dict[str, set[str]]] = {p: {} for p in FOLDERS}
    for package in FOLDERS:
        for path in _sources(package):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
                else:
                    continue
                for name in names:
                    target = _package_of(name)
                    if target and target != package:
                        rel = str(path.relative_to(REPO))
                        graph[package].setdefault(target, set()).add(rel)
    return graph


def test_the_building_block_imports_neither_the_app_nor_the_tooling() -> None:
    graph = import_graph()
    for package in BUILDING_BLOCK:
        wrong = {t: f for t, f in graph[package].items() if t not in BUILDING_BLOCK}
        assert not wrong, f"{package} imports {wrong}"
    assert not graph["corbin_fl.mechanisms"], "the math imports the rest of the project"
    assert "corbin_fl.app" not in {t for p in BUILDING_BLOCK for t in graph[p]}


def test_no_import_cycle_between_packages() -> None:
    graph = import_graph()
    state: dict[str, str] = {}

    def visit(package: str, path: list[str]) -> None:
        if state.get(package) == "done":
            return
        assert state.get(package) != "open", "import cycle: " + " -> ".join([*path, package])
        state[package] = "open"
        for target in sorted(graph[package]):
            visit(target, [*path, package])
        state[package] = "done"

    for package in sorted(graph):
        visit(package, [])
