"""The Docker layer's image build: docs/DOCKER.md's commands with a marker in the build secret.

The tests build every image docker-compose.yml needs with ``docker/build-images.sh``: on the
official base images with ``CORBIN_DOCKER_BASES=official``, on the bases of
``docker/bases/make-local-bases.sh`` (run first) with ``CORBIN_DOCKER_BASES=local`` (a machine
that cannot pull from Docker Hub), and unset, on whichever the script chooses (as DOCKER.md's
Part A does). ``CORBIN_DOCKER_CA``
names a CA bundle that pip must trust during the builds; the build is given that bundle plus one
fresh self-signed certificate of its own (the marker) as a build secret, so that a test can look
for the marker in every layer of every image afterwards.

Standard library only, so that ``.ci/run`` can start the build before it installs the rest::

    python3 tests/docker/image_build.py RECORD

builds and writes what it built (names, marker, seconds) to RECORD (JSON); the tests read it
when ``CORBIN_DOCKER_IMAGES`` names it (tests/docker/conftest.py, ``images``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from docker_helpers import IMAGES, BuiltImages, Docker


def cli_builds_with_buildkit(cli: str) -> bool:
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


def find_docker_cli() -> str | None:
    """The first ``docker`` on PATH that builds with BuildKit and reaches an engine (the
    docker CLI chosen for every command; e.g. Debian's docker.io 20.10, BuildKit built in, next
    to a newer CLI without buildx)."""
    seen: set[str] = set()
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        cli = os.path.realpath(os.path.join(folder, "docker"))
        if cli in seen or not os.access(cli, os.X_OK):
            continue
        seen.add(cli)
        try:
            info = subprocess.run([cli, "info"], capture_output=True, timeout=60)
            if info.returncode == 0 and cli_builds_with_buildkit(cli):
                return cli
        except (OSError, subprocess.TimeoutExpired):
            continue
    return None


def docker_on_path(cli: str, folder: Path) -> Docker:
    """A :class:`Docker` whose PATH starts with ``folder``, where ``docker`` links to ``cli``."""
    (folder / "docker").symlink_to(cli)
    env = dict(os.environ)
    env["PATH"] = f"{folder}{os.pathsep}{env.get('PATH', '')}"
    return Docker(env=env)


def marker_bundle(folder: Path, ca: str | None) -> tuple[Path, str]:
    """The builds' CA bundle: ``ca`` (if any) plus a fresh self-signed marker certificate.

    Returns the bundle and the marker's base64 body, which must be in no image layer.
    ``RuntimeError`` if openssl is missing.
    """
    if shutil.which("openssl") is None:
        raise RuntimeError("openssl is missing (apt-get install openssl)")
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


def build_images(docker: Docker, folder: Path) -> BuiltImages:
    """Build every image docker-compose.yml needs with docs/DOCKER.md's commands; print each
    image's build time and size."""
    bundle, marker = marker_bundle(folder, os.environ.get("CORBIN_DOCKER_CA") or None)
    t0 = time.monotonic()
    build = ["docker/build-images.sh", "--ca", str(bundle)]
    bases = os.environ.get("CORBIN_DOCKER_BASES", "")
    if bases == "local":
        docker.run("docker/bases/make-local-bases.sh", "-c", str(bundle), timeout=1200)
        build.append("--local-bases")
    elif bases == "official":
        build.append("--official-bases")
    elif bases:
        raise RuntimeError(f"CORBIN_DOCKER_BASES={bases!r}: must be local, official or unset")
    out = docker.run(*build, timeout=2400)
    seconds = time.monotonic() - t0
    for line in out.stdout.splitlines():
        if line.startswith("== ") and ("built in" in line or line.startswith("== bases")):
            print(line)
    print(f"images built in {seconds:.0f} s")
    return BuiltImages(names=IMAGES, marker=marker, seconds=seconds)


def write_record(built: BuiltImages, path: Path) -> None:
    """Write what was built to ``path`` (JSON), whole or not at all."""
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps(dataclasses.asdict(built)))
    part.replace(path)


def read_record(path: Path) -> BuiltImages:
    """What :func:`write_record` wrote; ``ValueError`` naming the file if it is not that."""
    try:
        built = json.loads(path.read_text())
        return BuiltImages(tuple(built["names"]), str(built["marker"]), float(built["seconds"]))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a record of image_build.py ({exc})") from exc


def main(argv: list[str]) -> int:
    """``image_build.py RECORD``: build the images, write RECORD; 2 on bad usage."""
    if len(argv) != 1:
        print("usage: python3 tests/docker/image_build.py RECORD", file=sys.stderr)
        return 2
    cli = find_docker_cli()
    if cli is None:
        sys.exit("error: no Docker engine reachable with a BuildKit-capable docker CLI")
    with tempfile.TemporaryDirectory(prefix="corbin-fl-images-") as tmp:
        docker = docker_on_path(cli, Path(tmp))
        try:
            built = build_images(docker, Path(tmp))
        except RuntimeError as exc:
            sys.exit(f"error: {exc}")
        write_record(built, Path(argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
