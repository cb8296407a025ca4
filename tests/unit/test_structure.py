"""Jobs, not steps: no function of the product code is over 100 lines.

The product is every package pyproject installs (``[tool.setuptools.package-dir]``: the folders
``corbin_fl/``, ``server/``, ``client/``, ``mechanisms/``, ``app/``, ``deploy/``,
``experiments/``); tests, benchmarks, the testbed and the examples are not. A function's length
runs from its ``def`` line to its last line (docstring included, decorators not); a nested
function counts on its own and inside its parent.

:data:`OVER_100` names the functions still over the limit, each in a file another change in
progress owns; the list can only shrink (an entry that is gone or back under the limit fails
too, so it is taken off).
"""

from __future__ import annotations

import ast
import functools
import tomllib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 100

OVER_100: dict[str, str] = {}
"""``path::qualified name`` -> why it is still over :data:`MAX_LINES` lines."""


def product_folders() -> list[Path]:
    """The folders of the installed packages (pyproject's package-dir), below the repository."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    dirs = pyproject["tool"]["setuptools"]["package-dir"].values()
    return sorted({ROOT / d for d in dirs})


def function_lengths(source: str) -> Iterator[tuple[str, int]]:
    """``(qualified name, lines)`` of every function and method in ``source``."""

    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = prefix + child.name
                assert child.end_lineno is not None
                yield name, child.end_lineno - child.lineno + 1
                yield from walk(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, prefix + child.name + ".")
            else:
                yield from walk(child, prefix)

    yield from walk(ast.parse(source), "")


@functools.cache
def long_functions() -> dict[str, int]:
    """``path::qualified name`` -> lines of every product function over :data:`MAX_LINES`."""
    out: dict[str, int] = {}
    for folder in product_folders():
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for name, lines in function_lengths(path.read_text(encoding="utf-8")):
                if lines > MAX_LINES:
                    out[f"{rel}::{name}"] = lines
    return out


def test_the_product_folders_are_the_installed_packages() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in product_folders()}
    assert {"corbin_fl", "server", "client", "mechanisms", "app", "deploy"} <= names
    assert not names & {"tests", "bench", "testbed", "examples", "docker"}


def test_the_check_sees_a_long_function_a_method_and_a_nested_one() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    source = (
        f"def long():\n{body}\n\n"
        f"class C:\n    def method(self):\n{body.replace('    ', '        ')}\n\n"
        f"def outer():\n    def inner():\n{body.replace('    ', '        ')}\n"
        "def short():\n    return 1\n"
    )
    lengths = dict(function_lengths(source))
    assert lengths["long"] == MAX_LINES + 1
    assert lengths["C.method"] == MAX_LINES + 1
    assert lengths["outer.inner"] == MAX_LINES + 1
    assert lengths["outer"] == MAX_LINES + 2
    assert lengths["short"] == 2


def test_no_product_function_is_over_100_lines() -> None:
    new = {name: lines for name, lines in long_functions().items() if name not in OVER_100}
    assert not new, f"functions over {MAX_LINES} lines (split them by job): " + ", ".join(
        f"{name} ({lines})" for name, lines in sorted(new.items())
    )


def test_the_allow_list_only_shrinks() -> None:
    stale = sorted(set(OVER_100) - set(long_functions()))
    assert not stale, f"gone or no longer over {MAX_LINES} lines, take them off OVER_100: {stale}"
