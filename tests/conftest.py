"""Shared fixtures: free loopback ports, a private ``FLWR_HOME``, and process cleanup.

Every test that starts Flower processes must do it through :class:`corbin_fl.launcher`
(``run_local``/``run_simulation``/``LocalDeployment``) or through the ``process_registry``
fixture, so that whatever it started is stopped at teardown, even when the test fails, and a
leftover process fails the test instead of slowing down the rest of the suite.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from corbin_fl.launcher import FLOWER_ENV, ProcessRegistry, free_ports

REPO_ROOT = Path(__file__).resolve().parent.parent

# Flower CLIs and processes started by any test: no telemetry, no update check, no `uv sync`.
for _key, _value in FLOWER_ENV.items():
    os.environ.setdefault(_key, _value)


def flower_installed() -> bool:
    """Whether the Flower 1.41 console scripts this project deploys with are on PATH."""
    return all(
        shutil.which(name) is not None for name in ("flower-superlink", "flower-supernode", "flwr")
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``e2e`` tests (real Flower processes) where Flower's executables are missing."""
    if flower_installed():
        return
    skip = pytest.mark.skip(reason="flower-superlink/flower-supernode/flwr not installed")
    for item in items:
        if "e2e" in item.keywords:
            item.add_marker(skip)


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
