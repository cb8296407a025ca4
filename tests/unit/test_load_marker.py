"""The ``load`` tests run only when asked for by name (tests/conftest.py).

Each case runs pytest (pytester, in-process) on a throw-away project whose conftest is this
repository's ``tests/conftest.py`` and whose tests are one ``load`` + ``e2e``-marked (as
tests/system/test_load.py), one ``e2e``-marked and one plain test that each only pass, so the
outcome shows what the selection did. Stand-in Flower executables on ``PATH`` keep the
conftest's "Flower not installed" skip of ``e2e`` tests out of the counts.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import RUN_LOAD_ENV, markexpr_names_load

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"

_INI = """
[pytest]
addopts = -ra --strict-markers
markers =
    e2e: e2e
    load: load
"""

_TESTS = {
    "test_load_sample": (
        "import pytest\n\npytestmark = [pytest.mark.load, pytest.mark.e2e]\n\n"
        "def test_many_nodes():\n    pass\n"
    ),
    "test_e2e_sample": "import pytest\n\n@pytest.mark.e2e\ndef test_real_run():\n    pass\n",
    "test_plain_sample": "def test_unit():\n    pass\n",
}


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.delenv(RUN_LOAD_ENV, raising=False)
    bin_dir = pytester.mkdir("bin")
    for name in ("flower-superlink", "flower-supernode", "flwr"):
        exe = bin_dir / name
        exe.write_text("#!/bin/sh\nexit 0\n")
        exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    pytester.makeini(_INI)
    pytester.makeconftest(CONFTEST.read_text(encoding="utf-8"))
    pytester.makepyfile(**_TESTS)
    return pytester


@pytest.mark.parametrize(
    ("args", "passed", "skipped", "deselected"),
    [
        ((), 2, 1, 0),  # the default run: the load test is skipped, with the way to run it
        (("-m", "e2e"), 1, 1, 1),  # -m e2e: the e2e test; load is skipped, not silently run
        (("-m", "not load"), 2, 0, 1),
        (("-m", "load"), 1, 0, 2),
        (("-m", "e2e and load"), 1, 0, 2),
        (("-m", "e2e or load"), 2, 0, 1),
        (("--run-load",), 3, 0, 0),
        (("test_load_sample.py",), 1, 0, 0),  # naming the file asks for it
        (("test_load_sample.py::test_many_nodes",), 1, 0, 0),
        ((".",), 2, 1, 0),  # a folder that merely contains it does not
    ],
)
def test_load_tests_run_only_when_asked_for(
    project: pytest.Pytester, args: tuple[str, ...], passed: int, skipped: int, deselected: int
) -> None:
    result = project.runpytest(*args)
    result.assert_outcomes(passed=passed, skipped=skipped, deselected=deselected)
    if skipped:
        result.stdout.fnmatch_lines(["*load test: run with -m load, --run-load or by naming*"])


def test_the_environment_variable_asks_for_load_tests(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(RUN_LOAD_ENV, "1")
    project.runpytest("-m", "e2e").assert_outcomes(passed=2, deselected=1)
    project.runpytest().assert_outcomes(passed=3)


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("load", True),
        ("e2e or load", True),
        ("load and not e2e", True),
        ("(load)", True),
        ("", False),
        ("e2e", False),
        ("not load", False),
        ("e2e and not load", False),
        ("not (load or fuzz)", False),
        ("loader", False),
        ("overload", False),
    ],
)
def test_markexpr_names_load(expr: str, names: bool) -> None:
    assert markexpr_names_load(expr) is names
