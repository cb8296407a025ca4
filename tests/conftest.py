"""Shared fixtures: free loopback ports, a private ``FLWR_HOME``, and process cleanup.

Every test that starts Flower processes must do it through :mod:`deploy`
(``run_local``/``run_simulation``/``LocalDeployment``) or through the ``process_registry``
fixture, so that whatever it started is stopped at teardown, even when the test fails, and a
leftover process fails the test instead of slowing down the rest of the suite.
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

import pytest

from corbin_fl.deploy.processes import (
    FLOWER_ENV,
    TASK_POLL_ENV,
    THREADS_ENV,
    ProcessRegistry,
    free_ports,
)

REPO_ROOT = Path(__file__).resolve().parent.parent


# Flower CLIs and processes started by any test: no telemetry, no update check, no `uv sync`.
for _key, _value in FLOWER_ENV.items():
    os.environ.setdefault(_key, _value)

# One torch thread per process started by a test: the suite runs 6 workers on 2 cores, each test
# starts several ClientApps that train at once, and oversubscribed OpenMP threads spin instead of
# computing (deploy.processes.thread_share; a user's own OMP_NUM_THREADS is kept).
os.environ.setdefault(THREADS_ENV, "1")

# Flower's own task poll (1 s) for the executors of the tests' deployments, not the 0.2 s that
# local deployments set for latency (deploy.processes.DEFAULT_TASK_POLL_INTERVAL): an idle
# 2-node deployment used 4.8 CPU-s a minute at 0.2 s and 2.1 at 1 s, and the suite keeps ~50
# executors alive for ~100 minutes in all. tests/waits.py bounds every stage with this value.
os.environ.setdefault(TASK_POLL_ENV, "1.0")


def flower_installed() -> bool:
    """Whether the Flower 1.42 console scripts this project deploys with are on PATH."""
    return all(
        shutil.which(name) is not None for name in ("flower-superlink", "flower-supernode", "flwr")
    )


LOAD_MARKER: Final[str] = "load"
"""Tests of many SuperNodes on one machine (minutes each): run only when asked for by name."""


RUN_LOAD_ENV: Final[str] = "CORBIN_RUN_LOAD"
"""``CORBIN_RUN_LOAD=1`` asks for the ``load`` tests like ``--run-load``."""


_NEGATED_OR_NAMED = re.compile(r"(\bnot[\s(]+)?(?<![\w.-])load(?![\w.-])")


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--run-load``: run the ``load``-marked tests (see :func:`load_requested`)."""
    parser.addoption(
        "--run-load",
        action="store_true",
        default=False,
        help=f"run the {LOAD_MARKER!r}-marked tests (else they are skipped unless -m names "
        f"{LOAD_MARKER!r} or a test file of them is named; also {RUN_LOAD_ENV}=1)",
    )


def markexpr_names_load(markexpr: str) -> bool:
    """Whether a ``-m`` expression asks for ``load`` tests: it names ``load`` other than as
    ``not load`` / ``not (load ...`` (``"load"``, ``"e2e or load"``, ``"load and e2e"``: yes;
    ``""``, ``"e2e"``, ``"not load"``, ``"e2e and not load"``, ``"not (load or fuzz)"``: no)."""
    return any(m.group(1) is None for m in _NEGATED_OR_NAMED.finditer(markexpr))


def load_requested(config: pytest.Config, item: pytest.Item) -> bool:
    """Whether the ``load``-marked ``item`` was asked for by name.

    By ``--run-load`` or ``CORBIN_RUN_LOAD=1``; by a ``-m`` expression that names ``load``
    (:func:`markexpr_names_load`); or by naming its file or node id on the command line
    (``pytest tests/system/test_load.py``; a folder that merely contains it does not count). So
    ``pytest``, ``pytest tests`` and ``pytest -m e2e`` leave the minutes-long load test out.
    """
    if config.getoption("--run-load") or os.environ.get(RUN_LOAD_ENV, "") not in ("", "0"):
        return True
    if markexpr_names_load(str(config.getoption("markexpr", "") or "")):
        return True
    root = config.invocation_params.dir
    for arg in config.invocation_params.args:
        if arg.startswith("-"):
            continue
        target = (root / arg.split("::", 1)[0]).resolve()
        if target.is_file() and target == item.path.resolve():
            return True
    return False


LAYERS: Final[tuple[str, ...]] = ("unit", "protocol", "system")
"""The test layers, one folder each: ``unit`` (pure functions, seconds), ``protocol`` (the real
server and client code over the in-process grid), ``system`` (real processes, namespaces,
compose). Each test gets its folder's marker (``pytest -m unit``)."""


REAL_PROCESS_MARKERS: Final[tuple[str, ...]] = ("e2e", "multihost")
"""Markers of the tests that run real Flower processes: the few long tests of the suite."""


def declared_limit(item: pytest.Item) -> float:
    """The ``@pytest.mark.timeout`` limit of ``item`` in seconds (0 without one): the scale of a
    long test, used only to start the longest ones first."""
    marker = item.get_closest_marker("timeout")
    if marker is None:
        return 0.0
    value = marker.args[0] if marker.args else marker.kwargs.get("timeout", 0)
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test with its layer (its folder under ``tests/``); skip ``load`` tests unless
    asked for by name (:func:`load_requested`), and ``e2e`` tests (real Flower processes) where
    Flower's executables are missing."""
    tests_dir = Path(__file__).resolve().parent
    rank: dict[str, int] = {}
    for item in items:
        with contextlib.suppress(ValueError):
            parts = item.path.resolve().relative_to(tests_dir).parts
            if len(parts) > 1 and parts[0] in LAYERS:
                item.add_marker(getattr(pytest.mark, parts[0]))
                rank[item.nodeid] = 0 if parts[0] == "system" else 1
    # The real-process tests first (end-to-end and multi-host runs), the longest first, then
    # the rest of their layer, then the other layers: the long tests are few and under
    # pytest-xdist's `load` scheduling (.ci/run) they start at once on every worker, longest
    # first, and the many short tests fill the gaps, instead of a long test starting last and
    # ending the run alone. "Longest" is the test's pytest-timeout limit (the scale each
    # long test declares, see :func:`declared_limit`).
    items.sort(
        key=lambda it: (
            rank.get(it.nodeid, 1),
            not any(m in it.keywords for m in REAL_PROCESS_MARKERS),
            -declared_limit(it),
        )
    )
    skip_load = pytest.mark.skip(
        reason=f"{LOAD_MARKER} test: run with -m {LOAD_MARKER}, --run-load or by naming its file"
    )
    for item in items:
        if LOAD_MARKER in item.keywords and not load_requested(config, item):
            item.add_marker(skip_load)
    if flower_installed():
        return
    skip = pytest.mark.skip(reason="flower-superlink/flower-supernode/flwr not installed")
    for item in items:
        if "e2e" in item.keywords:
            item.add_marker(skip)


# ----------------------------------------------------------------------------- CPU per test
CPU_PROPERTY: Final = "cpu_seconds"
"""``user_properties`` key of a test's teardown report: the CPU seconds its worker process and the
processes it reaped (Flower's SuperLink, SuperNodes, ClientApps, the docker CLI; not a container,
which the engine runs) used from its setup to its teardown."""

_CPU_START = pytest.StashKey[float]()
_cpu_rows: list[tuple[float, str]] = []
"""(CPU seconds, test id) of every test that ran, gathered on the controller."""


def _cpu_now() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_CPU_START] = _cpu_now()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    report = yield
    if call.when == "teardown" and _CPU_START in item.stash:
        report.user_properties.append((CPU_PROPERTY, _cpu_now() - item.stash[_CPU_START]))
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Collect each test's CPU (pytest-xdist forwards the workers' reports to the controller)."""
    cpu = dict(report.user_properties).get(CPU_PROPERTY) if report.when == "teardown" else None
    if isinstance(cpu, float):
        _cpu_rows.append((cpu, report.nodeid))


def pytest_terminal_summary(terminalreporter: object, config: pytest.Config) -> None:
    """The tests that used the most CPU, and the share of the run's CPU they used: what to cut
    when the suite is slow on a machine whose cores are all busy (.ci/run)."""
    rows = sorted(_cpu_rows, reverse=True)
    if not rows:
        return
    write = terminalreporter.write_line  # type: ignore[attr-defined]
    total = sum(cpu for cpu, _ in rows)
    write(f"CPU of the tests (their processes and what they reaped): {total:.0f} s in all; most:")
    for cpu, nodeid in rows[:12]:
        write(f"{cpu:8.1f} s CPU  {100 * cpu / total:4.1f}%  {nodeid}")


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The repository root (the Flower app: ``pyproject.toml`` with ``[tool.flwr.app]``)."""
    return REPO_ROOT


@pytest.fixture
def free_ports_factory() -> Callable[[int], list[int]]:
    """``f(n)`` -> ``n`` distinct TCP ports on 127.0.0.1 that were free a moment ago."""
    return free_ports


@pytest.fixture
def free_port() -> int:
    """One TCP port on 127.0.0.1 that was free a moment ago."""
    return free_ports(1)[0]


@pytest.fixture
def flwr_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private, empty ``FLWR_HOME`` for this test (so no state lands in ``~/.flwr``)."""
    home = tmp_path / "flwr-home"
    home.mkdir()
    monkeypatch.setenv("FLWR_HOME", str(home))
    for key, value in FLOWER_ENV.items():
        monkeypatch.setenv(key, value)
    return home


@pytest.fixture
def process_registry() -> Iterator[ProcessRegistry]:
    """A :class:`ProcessRegistry` whose processes (and their descendants) die at teardown.

    Teardown fails the test if any process it saw is still alive after cleanup.
    """
    registry = ProcessRegistry()
    try:
        yield registry
    finally:
        registry.stop_all(grace=3.0)
        left = registry.leftovers()
        assert not left, f"processes left behind: {left}"
