"""Helpers of the Docker layer's tests (tests/docker/): how they call Docker, and waits."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # image_build.py, a standalone script beside this file, cannot import waits
    from waits import StartupTiming

REPO = Path(__file__).resolve().parents[2]
IMAGE_TAG = "0.1.0"
IMAGES = (
    f"corbin-fl/superlink:{IMAGE_TAG}",
    f"corbin-fl/serverapp:{IMAGE_TAG}",
    f"corbin-fl/supernode:{IMAGE_TAG}",
    f"corbin-fl/clientapp:{IMAGE_TAG}-cpu",
)
"""The images docker-compose.yml starts (CPU ClientApp variant), as build-images.sh tags them."""
N_CLIENTS = 3
"""Clients of every deployment of this layer (the demo, the TLS override, separate machines), as
docs/DOCKER.md has them: partitions 0, 1, 2 of 3."""


@contextmanager
def first_round_turn(lock: Path, timeout: float) -> Iterator[Callable[[], None]]:
    """Hold ``lock`` (shared by the layer's pytest-xdist workers) while a deployment runs its
    first round; yield the call that gives it up once that round is recorded.

    A first round is the costliest stretch of a run: every ClientApp container installs the app
    bundle and its processes import torch, the data and the partitioner cold. Three of them at
    once with the other layers on two cores starved Flower's own clocks: a ClientApp's task
    heartbeat (every ~20 s, 5 s per call, 2 misses allowed) went unanswered for over 60 s, its
    SuperNode revoked its task token and the round lost the node. Later rounds still overlap.
    ``timeout`` bounds the wait for the other files' first rounds.
    """
    from filelock import FileLock  # not at module level: image_build.py runs before installs

    held = FileLock(str(lock))
    held.acquire(timeout=timeout)
    try:
        yield held.release
    finally:
        if held.is_locked:
            held.release()


def concurrent_clientapps() -> int:
    """ClientApp processes that may run at once on this host: :data:`N_CLIENTS` for each test
    file that runs beside this one (``.ci/run`` runs the layer on a pytest-xdist worker per file,
    each file's deployment in its own compose project): the ``c`` of every stage's wait
    (``ClientAppTiming.slowdown``)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    return N_CLIENTS * max(1, workers)


@dataclass(frozen=True)
class Docker:
    """How the tests call Docker: an environment whose PATH starts with the chosen CLI."""

    env: Mapping[str, str]

    def run(
        self, *args: str, check: bool = True, timeout: float = 600, cwd: Path = REPO
    ) -> subprocess.CompletedProcess[str]:
        """Run a command (``docker ...``, a script) in the repository root; fail on error."""
        out = subprocess.run(
            list(args),
            cwd=cwd,
            env=dict(self.env),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and out.returncode != 0:
            raise AssertionError(
                f"{' '.join(args)} exited {out.returncode}:\n{out.stdout[-3000:]}\n"
                f"{out.stderr[-3000:]}"
            )
        return out

    def compose(self, files: Sequence[str], *args: str, **kwargs: object) -> str:
        """``docker compose -f F ... ARGS``; returns stdout."""
        argv = ["docker", "compose"]
        for name in files:
            argv += ["-f", name]
        return self.run(*argv, *args, **kwargs).stdout  # type: ignore[arg-type]

    def healthy(self, files: Sequence[str], services: int, *options: str) -> bool:
        """All ``services`` containers of the compose project (``-f`` each of ``files``, then
        ``options``, e.g. ``-p NAME``) are up and healthy."""
        out = self.compose(files, *options, "ps", "--format", "json")
        rows = [json.loads(line) for line in out.splitlines() if line.strip()]
        return len(rows) == services and all(r.get("Health") == "healthy" for r in rows)


@dataclass(frozen=True)
class BuiltImages:
    """The images of the session and what the build was given."""

    names: tuple[str, ...]
    marker: str
    """Base64 body of the marker certificate given only in the build secret."""
    seconds: float


def wait_for(
    predicate: Callable[[], bool], timeout: float, what: str, interval: float = 1.0
) -> None:
    """Poll ``predicate()`` until it is true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f} s: {what}")
        time.sleep(interval)


def while_running(
    done: Callable[[], bool], run: subprocess.Popen[bytes], log: Path
) -> Callable[[], bool]:
    """``done`` as a :func:`wait_for` predicate that fails at once, with the end of ``log``, when
    the operator's ``flwr run`` (``run``, writing ``log``) has ended without it: a run that ended
    early is reported when it ends, not at the end of the wait."""

    def check() -> bool:
        if done():
            return True
        if run.poll() is None or done():  # done() again: the run may end just after it
            return False
        raise AssertionError(
            f"the operator's `flwr run` ended (exit {run.returncode}) first:\n"
            f"{log.read_text(errors='replace')[-4000:]}"
        )

    return check


def healthy_wait(probe: StartupTiming, services: int, levels: int) -> float:
    """Seconds for ``services`` containers to be up and healthy when they start in ``levels``
    waves, each wave waiting for the one before to be healthy (``depends_on: service_healthy``):
    every start-up as the probe says, and up to one health interval per wave before Docker's
    first probe (:data:`waits.HEALTH_INTERVAL_S`)."""
    from waits import HEALTH_INTERVAL_S

    return probe.startup_timeout(services) * services + levels * HEALTH_INTERVAL_S
