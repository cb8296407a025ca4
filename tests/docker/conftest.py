"""The Docker layer: real images built and real containers started on a real Docker engine.

Every test under ``tests/docker/`` is marked ``docker`` and runs only when asked for with
``-m docker`` (``.ci/run`` runs ``python -m pytest -m docker`` once the other layers are done,
so that its containers have the machine). Without a reachable engine the tests skip and say why.

The images are built once per session (or before it, by ``.ci/run``) with the commands
docs/DOCKER.md gives, with a marker certificate in the build secret: ``image_build.py``.

The docker CLI used is the first one on ``PATH`` that builds with BuildKit; it is put first on
``PATH`` for every command the tests run, with the compose plugin next to it.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from docker_helpers import N_CLIENTS, BuiltImages, Docker
from filelock import FileLock
from image_build import build_images, docker_on_path, find_docker_cli, read_record, write_record
from waits import ClientAppTiming, measure_clientapp

DOCKER_DIR = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test of this folder ``docker``; deselect them unless ``-m`` names ``docker``."""
    wanted = re.search(r"(?<!not )\bdocker\b", config.getoption("markexpr") or "") is not None
    for item in items:
        if DOCKER_DIR in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.docker)
            if not wanted:
                item.add_marker(pytest.mark.skip(reason="Docker layer: run with -m docker"))


CONTAINER_LOG_LINES = 25
"""Lines of each container's log a failed test shows (its compose projects' containers)."""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test of this folder shows its compose projects' containers (a module's
    ``COMPOSE_PROJECTS``) while they still run: each one's state and the end of its log, which
    say why a node did not answer."""
    report = yield
    projects = getattr(getattr(item, "module", None), "COMPOSE_PROJECTS", ())
    if report.when == "call" and report.failed and projects:
        report.sections.append(("containers at the failure", container_report(projects)))
    return report


def container_report(projects: tuple[str, ...]) -> str:
    """Every container of ``projects``: name, state, and the last lines of its log."""
    lines: list[str] = []
    for project in projects:
        label = f"label=com.docker.compose.project={project}"
        listed = subprocess.run(
            ["docker", "ps", "-a", "--filter", label, "--format", "{{.Names}}\t{{.Status}}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        for row in sorted(listed.stdout.splitlines()):
            name = row.split("\t", 1)[0]
            logs = subprocess.run(
                ["docker", "logs", "--timestamps", "--tail", str(CONTAINER_LOG_LINES), name],
                capture_output=True,
                text=True,
                timeout=60,
            )
            lines += [f"== {row}", *(logs.stdout + logs.stderr).splitlines()]
    return "\n".join(lines)


@pytest.fixture(scope="session")
def docker_cli(tmp_path_factory: pytest.TempPathFactory) -> Docker:
    """A :class:`Docker` whose ``docker`` builds with BuildKit and has ``docker compose``."""
    cli = find_docker_cli()
    if cli is None:
        pytest.skip("no Docker engine reachable with a BuildKit-capable docker CLI")
    docker = docker_on_path(cli, tmp_path_factory.mktemp("docker-cli"))
    version = docker.run("docker", "compose", "version", check=False)
    if version.returncode != 0:
        pytest.fail(
            "`docker compose` is missing: install the compose plugin (the standalone "
            "docker-compose v2+ binary linked as <cli-plugins>/docker-compose)"
        )
    return docker


@pytest.fixture(scope="session")
def images(
    docker_cli: Docker, tmp_path_factory: pytest.TempPathFactory, worker_id: str
) -> BuiltImages:
    """Every image docker-compose.yml needs, built once per session (image_build.py).

    ``CORBIN_DOCKER_IMAGES`` names the record of a build made before the session (``.ci/run``
    starts it while it installs the rest); its images must still be there. Else the session
    builds them; on pytest-xdist (``.ci/run`` runs this layer on three workers) the first worker to
    take the lock builds and writes the record beside the workers' temp folders, and the others
    read it, so the marker every worker looks for in the layers is the one the build was given.
    """
    if given := os.environ.get("CORBIN_DOCKER_IMAGES"):
        built = read_record(Path(given))
        for name in built.names:
            docker_cli.run("docker", "image", "inspect", "--format", "{{.Id}}", name)
        return built
    if worker_id == "master":
        return build_images(docker_cli, tmp_path_factory.mktemp("ca"))
    record = tmp_path_factory.getbasetemp().parent / "corbin-fl-images.json"
    with FileLock(f"{record}.lock"):
        if record.is_file():
            return read_record(record)
        built = build_images(docker_cli, tmp_path_factory.mktemp("ca"))
        write_record(built, record)
        return built


@pytest.fixture(scope="session")
def clientapp_probe() -> ClientAppTiming:
    """One ClientApp probe (a first update of partition 0 of 3 with the app's defaults) per
    session: the waits of every deployment of this layer are derived from it."""
    return measure_clientapp({}, N_CLIENTS)


@pytest.fixture(scope="session")
def round_one_lock(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The lock file the layer's workers take turns on for their runs' first rounds
    (``docker_helpers.first_round_turn``), beside the workers' temp folders."""
    return tmp_path_factory.getbasetemp().parent / "corbin-fl-round-one.lock"


@pytest.fixture(scope="session")
def flwr_home_docker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A FLWR_HOME of the session's own (the tests write its config.toml)."""
    return tmp_path_factory.mktemp("flwr-home")


@pytest.fixture(scope="session")
def project_cleanup(docker_cli: Docker) -> Iterator[list[list[str]]]:
    """Compose invocations (``-f`` lists + ``-p``) to take down with ``down -v`` at the end."""
    projects: list[list[str]] = []
    yield projects
    for argv in projects:
        docker_cli.run("docker", "compose", *argv, "down", "-v", "--timeout", "5", check=False)
