"""How long a real-process test waits, derived from this machine now: a ClientApp probe (one
update of the real app), a Flower process start-up probe, and Flower's fixed poll periods. A wait
never comes from a quiet machine's timing."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

# ====================================================================== waits of real-process tests
SUPERNODE_POLL_S: Final[float] = 3.0
"""A Flower 1.42 (as 1.41) SuperNode with nothing to do sleeps a fixed 3 s between two pulls (no
flag), so an instruction waits up to this long before its node even sees it."""


SUPERNODE_REPLY_POLL_S: Final[float] = 0.5
"""While a ClientApp runs, its SuperNode checks for the reply every 0.5 s (fixed in Flower)."""


HEALTH_INTERVAL_S: Final[float] = 30.0
"""The compose files' healthcheck interval (tests/system/test_compose.py checks it): Docker
Engine < 25 takes a container's first health probe this long after its start (newer engines
probe every 2 s during the start period), so a service shows ``healthy`` up to this long after it
is, and one that waits for another's health (``depends_on: service_healthy``) starts that much
later."""


RAY_START_FAILED: Final[str] = "The current node timed out during startup"
"""What a simulation run prints when Ray's own node did not start: Ray gives its raylet a fixed
30 s to register, which an overloaded machine can miss (a failure of the machine, not the run)."""


SUPEREXEC_POLL_S: Final[float] = float(os.environ.get("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "1.0"))
"""The SuperExec that starts each ClientApp process polls for tasks this often (Flower's
``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``, default 1 s; tests/conftest.py sets 1 s for the suite)."""


HANG_GUARD_S: Final[float] = 600.0
"""The timeout of a command that a test only needs to end (``--help``, a certificate script, a
``compose config``): a guard against a hang, never a measurement or a wait for something. On a
machine whose cores are all taken it is far above what such a command takes (CI once saw
``corbin-fl local --help`` still running 60 s after its start, its help printed), and a command
that ends does so long before it."""


LOAD_HEADROOM: Final[float] = 8.0
"""``k``: every wait is ``k`` times what the probe measured. The probe is one sample of a machine
whose load moves (other jobs start during a run that lasts minutes; with 2 cores one more busy
process can halve a ClientApp's share), and it leaves out Flower's per-message work (installing
the FAB, (de)serialising the model, encoding the update). In CI (4 test workers on 2 cores) a live
node's later-round update once took more than 7.5 times the probe's ``steady`` (the stage ended at
``k = 3``'s bound of 129 s against a probe of 16.6 s), so ``k`` is above that. A wait that is too
long costs only time on a failure: every stage ends as soon as all live nodes have answered, and a
dead node is reported by Flower's heartbeat check, not by the stage timeout."""


_CLIENTAPP_PROBE: Final[str] = """
import json, sys, time
import flwr.clientapp
import corbin_fl.app.client_app
from corbin_fl.app import train as client_train
print("imported", flush=True)
from corbin_fl.app.config import AppConfig
from corbin_fl.app.data import client_rows, dataset_rows
from corbin_fl.app.models import build_model
from corbin_fl.app.training import train_local
cfg = AppConfig.from_flower(json.loads(sys.argv[1]))
task = client_train.LocalTask.get(cfg)
# As the train handler does: the global model is loaded into the skeleton (strict).
task.model.load_state_dict(
    build_model(cfg.model, task.info.in_channels, task.info.num_classes, seed=cfg.seed)
    .state_dict(), strict=True,
)
t0 = time.monotonic()
rows = client_rows(
    cfg.dataset, 0, int(sys.argv[2]), partitioner=cfg.partitioner,
    dirichlet_alpha=cfg.dirichlet_alpha, data_seed=cfg.data_seed, data_dir=cfg.data_dir or None,
    use_official_test=cfg.use_official_test,
)
partition = time.monotonic() - t0
data = dataset_rows(cfg.dataset, rows, data_dir=cfg.data_dir or None)
train_local(
    task.model, data, epochs=cfg.local_epochs, batch_size=cfg.batch_size, seed=cfg.seed,
    device=task.device, optimizer=cfg.optimizer, lr=cfg.lr, weight_decay=cfg.weight_decay,
    max_steps=cfg.max_steps or None,
)
print(json.dumps({"partition": partition}), flush=True)
"""


@dataclass(frozen=True)
class StartupTiming:
    """How long a Flower process takes to start on this machine, measured just now.

    Attributes
    ----------
    startup : float
        Seconds from spawning a Python process to having imported what it needs (Flower, and
        for :class:`ClientAppTiming` this app and torch): the start-up of the deployment's
        Flower processes (SuperLink, SuperNode, SuperExec, ``flwr`` CLI) is at most this.
    cores : int
        ``N``, the CPU cores of this machine (``os.cpu_count()``).
    """

    startup: float
    cores: int

    def slowdown(self, concurrent: int) -> float:
        """How much slower each of ``c`` processes started together runs than the probe did.

        On ``N`` cores with ``L`` other busy processes, each of ``c`` gets ``N / max(N, L + c)``
        of a core where the probe got ``N / max(N, L + 1)``. The ratio ``max(N, L + c) /
        max(N, L + 1)`` is largest at ``L = N - 1``: ``1 + (c - 1) / N``, whatever the load.
        """
        if isinstance(concurrent, bool) or not isinstance(concurrent, int) or concurrent < 1:
            raise ValueError(f"concurrent must be an int >= 1, got {concurrent!r}")
        return 1.0 + (concurrent - 1) / self.cores

    def startup_timeout(self, processes: int) -> float:
        """Wait for ``n = processes`` Flower processes to be up and registered.

        ``T_poll + k * n * T_startup``: one after another, each start-up takes what the probe
        took; all at once, they take ``s(n) * T_startup <= n * T_startup`` together
        (:meth:`slowdown`). A SuperNode shows as online after its first pull, up to ``T_poll``
        after its start.
        """
        if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
            raise ValueError(f"processes must be an int >= 1, got {processes!r}")
        return SUPERNODE_POLL_S + LOAD_HEADROOM * processes * self.startup


@dataclass(frozen=True)
class ClientAppTiming(StartupTiming):
    """What one CorBin-FL update costs in a fresh process on this machine, measured just now.

    Attributes
    ----------
    first : float
        Seconds of a whole first ``train.update`` message, as a ClientApp process does it:
        start-up, model, data partition (the ``flwr_datasets`` partitioners), local training
        with the run's settings.
    partition : float
        The partitioning part of ``first``; later rounds reuse the rows (``context.state``).
    """

    first: float
    partition: float

    @property
    def steady(self) -> float:
        """Seconds of a later ``train.update``: ``first - partition``."""
        return self.first - self.partition

    def stage_timeout(self, concurrent: int, *, first: bool, poll_interval: float) -> float:
        """A stage's wait for its live nodes: ``T_poll + T_exec + T_reply + p + k * s(c) * T_app``.

        ``T_poll`` (3 s) until the SuperNode pulls the instruction, ``T_exec`` until its
        SuperExec starts the ClientApp process, ``T_reply`` until the SuperNode forwards the
        reply, ``p`` (``poll-interval``) until the ServerApp pulls it, and ``T_app`` (``first``
        or ``steady``) for the ClientApp's work, ``s(c)`` (:meth:`slowdown`) slower with ``c``
        ClientApp processes at once. ``k`` is :data:`LOAD_HEADROOM`.
        """
        if not poll_interval > 0:
            raise ValueError(f"poll_interval must be > 0, got {poll_interval}")
        work = self.first if first else self.steady
        fixed = SUPERNODE_POLL_S + SUPEREXEC_POLL_S + SUPERNODE_REPLY_POLL_S + poll_interval
        return fixed + LOAD_HEADROOM * self.slowdown(concurrent) * work

    def stage_timeouts(
        self, concurrent: int, *, poll_interval: float, queue: int = 1
    ) -> dict[str, float]:
        """The app's two stage-timeout run-config keys at :meth:`stage_timeout`'s bound, times
        ``queue`` when a stage's clients run ``queue`` after one another (the simulation
        runtime's workers): ``first-stage-timeout`` (round 1) and ``stage-timeout``."""
        return {
            "first-stage-timeout": queue
            * self.stage_timeout(concurrent, first=True, poll_interval=poll_interval),
            "stage-timeout": queue
            * self.stage_timeout(concurrent, first=False, poll_interval=poll_interval),
        }

    def server_work(self) -> float:
        """Bound on the ServerApp's own work per round and at start (imports, model, data,
        evaluation, aggregation): ``k * first``, one client's first update being at least as
        much work on the same model and data."""
        return LOAD_HEADROOM * self.first

    def run_timeout(
        self,
        *,
        rounds: int,
        first_round_stages: int,
        later_round_stages: int,
        concurrent: int,
        poll_interval: float,
        wait_for_nodes: float,
        queue: int = 1,
    ) -> float:
        """How long a whole run may take: the ServerApp's start and per-round work
        (:meth:`server_work`, ``1 + rounds`` times), its wait for nodes, and every stage at its
        timeout (:meth:`stage_timeouts`; round 1 runs each stage for the first time)."""
        timeouts = self.stage_timeouts(concurrent, poll_interval=poll_interval, queue=queue)
        first, later = timeouts["first-stage-timeout"], timeouts["stage-timeout"]
        return (
            (1 + rounds) * self.server_work()
            + wait_for_nodes
            + first_round_stages * first
            + (rounds - 1) * later_round_stages * later
        )


def wait_until(
    predicate: Callable[[], bool],
    timeout: float,
    what: str | Callable[[], str],
    poll: float = 0.3,
) -> None:
    """Poll ``predicate`` until it holds; fail the test naming ``what`` after ``timeout`` s.

    ``what`` may be a callable, read only on failure (e.g. with a process's log tail then).
    """
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            said = what() if callable(what) else what
            pytest.fail(f"timed out after {timeout:g} s waiting for {said}")
        time.sleep(poll)


def answers(url: str, cafile: Path | None = None) -> bool:
    """Whether ``url`` (a SuperLink's ``/health``) answers 2xx now; ``cafile`` verifies TLS."""
    context = ssl.create_default_context(cafile=str(cafile)) if cafile is not None else None
    try:
        with urllib.request.urlopen(url, timeout=2.0, context=context) as response:
            return 200 <= response.status < 300
    except OSError:
        return False


def wait_progressing(
    ready: Callable[[], bool],
    alive: Callable[[], bool],
    log: Path,
    idle: float,
    what: str,
    poll: float = 0.5,
) -> None:
    """Wait until ``ready()`` while the process writing ``log`` is alive and making progress.

    Fails at once when ``alive()`` turns false, and when ``log`` has not grown for ``idle``
    seconds: a stall, not a slow machine. Each line the process prints starts a new window, so a
    start-up that is slow in every step (imports, the database's migrations, binding the port)
    waits as long as it goes on, and ``idle`` need only cover the longest silent step (for a
    Flower process, its imports: :meth:`StartupTiming.startup_timeout`).
    """
    size, last = -1, time.monotonic()
    while not ready():
        assert alive(), f"{what} exited:\n{log.read_text(errors='replace')}"
        grown = log.stat().st_size if log.exists() else 0
        if grown != size:
            size, last = grown, time.monotonic()
        stalled = time.monotonic() - last
        assert stalled < idle, (
            f"{what}: not ready and its log silent for {stalled:.0f} s (> {idle:.0f} s):\n"
            + log.read_text(errors="replace")
        )
        time.sleep(poll)


def measure_clientapp(run_config: Mapping[str, Any], num_partitions: int) -> ClientAppTiming:
    """Run one fresh-process probe of a ClientApp's first update (see :class:`ClientAppTiming`).

    ``run_config`` is the run's config (missing keys take the app's defaults); the probe trains
    on partition 0 of ``num_partitions`` exactly as the update handler does.
    """
    cmd = [
        sys.executable,
        "-c",
        _CLIENTAPP_PROBE,
        json.dumps(dict(run_config)),
        str(num_partitions),
    ]
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        first_line = proc.stdout.readline()
        startup = time.monotonic() - t0
        out, err = proc.communicate(timeout=1800)  # a hang guard; the probe is the measurement
        total = time.monotonic() - t0
    finally:
        if proc.poll() is None:  # interrupted or hung: never leave the probe behind
            proc.kill()
            proc.wait()
    if proc.returncode != 0 or first_line.strip() != "imported":
        raise RuntimeError(f"ClientApp probe failed (exit {proc.returncode}):\n{err[-2000:]}")
    partition = float(json.loads(out.strip().splitlines()[-1])["partition"])
    return ClientAppTiming(
        startup=startup, cores=os.cpu_count() or 1, first=total, partition=partition
    )


def measure_startup(modules: tuple[str, ...] = ("flwr.serverapp", "flwr.clientapp")) -> float:
    """Seconds a fresh Python process takes to import ``modules`` (a Flower process's start-up)."""
    code = "\n".join(f"import {m}" for m in modules)
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )  # the wall time is the measurement
    if out.returncode != 0:
        raise RuntimeError(f"start-up probe failed (exit {out.returncode}):\n{out.stderr[-2000:]}")
    return time.monotonic() - t0
