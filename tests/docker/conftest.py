"""The Docker layer: real images built and real containers started on a real Docker engine.

Every test under ``tests/docker/`` is marked ``docker`` and runs only when asked for with
``-m docker`` (``.ci/run`` runs ``python -m pytest -m docker`` after the main suite). Without a
reachable engine the tests skip and say why.

The images are built once per session with ``docker/build-images.sh``, the command docs/DOCKER.md
gives, on the official base images or, with ``CORBIN_DOCKER_BASES=local`` (a machine that cannot
pull from Docker Hub), on the bases of ``docker/bases/make-local-bases.sh``, run first.
``CORBIN_DOCKER_CA`` names a CA bundle that pip must trust during the builds (a build secret).
The tests add one certificate of their own to that bundle, so that they can look for it in every
layer of every image afterwards.

The docker CLI used is the first one on ``PATH`` that builds with BuildKit (with the buildx
plugin, or a CLI older than 23.0 with BuildKit built in, e.g. Debian's docker.io 20.10 next to a
newer CLI without buildx); it is put first on ``PATH`` for every command the tests run, with the
compose plugin next to it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from docker_helpers import IMAGES, N_CLIENTS, BuiltImages, Docker
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


def _cli_builds_with_buildkit(cli: str) -> bool:
    """Whether ``cli`` builds with BuildKit: it has buildx, or is a CLI before 23.0."""
    buildx = subprocess.run([cli, "buildx", "version"], capture_output=True, timeout=60)
    if buildx.returncode == 0:
        return True
    out = subprocess.run(
        [cli, "version", "--format", "{{.Client.Version}}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    match = re.match(r"(\d+)\.", out.stdout.strip())
    return match is not None and int(match.group(1)) < 23


def _find_docker_cli() -> str | None:
    """The first ``docker`` on PATH that builds with BuildKit and reaches an engine."""
    seen: set[str] = set()
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        cli = os.path.realpath(os.path.join(folder, "docker"))
        if cli in seen or not os.access(cli, os.X_OK):
            continue
        seen.add(cli)
        try:
            info = subprocess.run([cli, "info"], capture_output=True, timeout=60)
            if info.returncode == 0 and _cli_builds_with_buildkit(cli):
                return cli
        except (OSError, subprocess.TimeoutExpired):
            continue
    return None


@pytest.fixture(scope="session")
def docker_cli(tmp_path_factory: pytest.TempPathFactory) -> Docker:
    """A :class:`Docker` whose ``docker`` builds with BuildKit and has ``docker compose``."""
    cli = _find_docker_cli()
    if cli is None:
        pytest.skip("no Docker engine reachable with a BuildKit-capable docker CLI")
    shim = tmp_path_factory.mktemp("docker-cli")
    (shim / "docker").symlink_to(cli)
    env = dict(os.environ)
    env["PATH"] = f"{shim}{os.pathsep}{env.get('PATH', '')}"
    docker = Docker(env=env)
    version = docker.run("docker", "compose", "version", check=False)
    if version.returncode != 0:
        pytest.fail(
            "`docker compose` is missing: install the compose plugin (the standalone "
            "docker-compose v2+ binary linked as <cli-plugins>/docker-compose)"
        )
    return docker


def _marker_bundle(folder: Path, ca: str | None) -> tuple[Path, str]:
    """The builds' CA bundle: ``ca`` (if any) plus a fresh self-signed marker certificate.

    Returns the bundle and the marker's base64 body, which must be in no image layer.
    """
    key, crt = folder / "marker.key", folder / "marker.crt"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=corbin-fl build-secret marker", "-keyout", str(key), "-out", str(crt)),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    pem = crt.read_text()
    body = "".join(pem.strip().splitlines()[1:-1])
    bundle = folder / "bundle.pem"
    bundle.write_text((Path(ca).read_text() if ca else "") + pem)
    key.unlink()
    return bundle, body


@pytest.fixture(scope="session")
def images(docker_cli: Docker, tmp_path_factory: pytest.TempPathFactory) -> BuiltImages:
    """Build every image docker-compose.yml needs, once, with docs/DOCKER.md's commands."""
    if shutil.which("openssl") is None:
        pytest.fail("openssl is missing (apt-get install openssl)")
    bundle, marker = _marker_bundle(
        tmp_path_factory.mktemp("ca"), os.environ.get("CORBIN_DOCKER_CA") or None
    )
    t0 = time.monotonic()
    build = ["docker/build-images.sh", "--ca", str(bundle)]
    if os.environ.get("CORBIN_DOCKER_BASES", "official") == "local":
        docker_cli.run("docker/bases/make-local-bases.sh", "-c", str(bundle), timeout=1200)
        build.append("--local-bases")
    out = docker_cli.run(*build, timeout=2400)
    seconds = time.monotonic() - t0
    for line in out.stdout.splitlines():
        if line.startswith("== ") and "built in" in line:
            print(line)
    print(f"images built in {seconds:.0f} s")
    return BuiltImages(names=IMAGES, marker=marker, seconds=seconds)


@pytest.fixture(scope="session")
def clientapp_probe() -> ClientAppTiming:
    """One ClientApp probe (a first update of partition 0 of 3 with the app's defaults) per
    session: the waits of every deployment of this layer are derived from it."""
    return measure_clientapp({}, N_CLIENTS)


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
