"""A local Flower deployment: one SuperLink and its SuperNodes as real processes on one host."""

from __future__ import annotations

import logging
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corbin_fl.deploy.flower import (
    ADDR_IN_USE,
    CONNECTION_NAME,
    NODE_ID_RE,
    FlowerCli,
    http_ok,
    superlink_argv,
    supernode_argv,
    wait_online,
    write_connection,
)
from corbin_fl.deploy.processes import (
    LOOPBACK,
    LauncherError,
    ManagedProcess,
    ProcessRegistry,
    flower_env,
    free_ports,
    listens_on,
    thread_share,
)
from corbin_fl.mechanisms.validate import require, why_at_least, why_positive

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class KilledNode:
    """Record of one injected fault."""

    partition: int
    round: int
    pid: int
    node_id: int | None
    time: float
    """Unix time of the SIGKILL."""


# ====================================================================== deployment
class LocalDeployment:
    """One SuperLink and ``num_supernodes`` SuperNodes on loopback, each in its own session.

    Use as a context manager; leaving it (normally or by an exception) stops everything.
    Every process gets this host's share of threads for the clients that train at once
    (:func:`deploy.processes.thread_share`) unless the environment sets ``OMP_NUM_THREADS``.

    Parameters
    ----------
    num_supernodes : int
        SuperNodes to start; SuperNode ``i`` gets node config
        ``partition-id=i num-partitions=num_supernodes`` (plus ``node_config``).
    logs_dir : Path
        Where every process writes its log (``superlink.log``, ``supernode-<i>.log``, ...).
    flwr_home : Path
        ``FLWR_HOME`` of every process and every ``flwr`` command (gets ``config.toml``).
    ready_timeout : float
        Seconds to wait for the SuperLink's ``/health`` and for all SuperNodes to be online.
    node_config : Mapping[str, Any] | None
        Extra node-config entries for every SuperNode (TOML scalars).
    simulation : bool
        Start the SuperLink with ``--simulation`` (Flower's simulation runtime: no SuperNodes;
        pass ``num_supernodes=0``).
    host : str
        Interface of every port (loopback by default).
    """

    def __init__(
        self,
        num_supernodes: int,
        logs_dir: Path,
        flwr_home: Path,
        *,
        ready_timeout: float = 120.0,
        node_config: Mapping[str, Any] | None = None,
        simulation: bool = False,
        host: str = LOOPBACK,
    ) -> None:
        if isinstance(num_supernodes, bool) or not isinstance(num_supernodes, int):
            raise TypeError(f"num_supernodes must be an int, got {type(num_supernodes).__name__}")
        if simulation and num_supernodes != 0:
            raise ValueError("a simulation SuperLink runs no SuperNodes: pass num_supernodes=0")
        if not simulation:
            require("num_supernodes", why_at_least(num_supernodes, 1))
        require("ready_timeout", why_positive(ready_timeout))
        self.num_supernodes = num_supernodes
        self.logs_dir = Path(logs_dir)
        self.flwr_home = Path(flwr_home)
        self.ready_timeout = float(ready_timeout)
        self.node_config = dict(node_config or {})
        self.simulation = simulation
        self.host = host
        env = {"FLWR_HOME": str(self.flwr_home)}
        if num_supernodes:  # its SuperNodes' ClientApps train at once on this host's cores
            env.update(thread_share(num_supernodes))
        self.registry = ProcessRegistry(env=env)
        self.superlink: ManagedProcess | None = None
        self.superlink_port: int | None = None
        self.supernodes: dict[int, ManagedProcess] = {}
        self.node_ids: dict[int, int] = {}

    # ------------------------------------------------------------------ context manager
    def __enter__(self) -> LocalDeployment:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def address(self) -> str:
        """``host:port`` of the SuperLink (all its APIs)."""
        if self.superlink_port is None:
            raise LauncherError("the SuperLink is not started")
        return f"{self.host}:{self.superlink_port}"

    @property
    def env(self) -> dict[str, str]:
        """Environment for ``flwr`` commands against this deployment."""
        return flower_env(self.registry.env)

    # ------------------------------------------------------------------ start
    def start(self, attempts: int = 3, on_step: Callable[[str], None] | None = None) -> None:
        """Start the SuperLink, then the SuperNodes, and wait until all are usable.

        ``on_step`` is told what start-up waits for next (``starting the SuperLink``,
        ``starting SuperNode 2/4``, ``waiting for 4 SuperNodes to register``), for a progress
        display.

        Raises
        ------
        LauncherError
            If a process exits during start-up or is not ready within ``ready_timeout``.
        """

        def step(what: str) -> None:
            if on_step is not None:
                on_step(what)

        self.flwr_home.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        step(f"starting the {'simulation ' if self.simulation else ''}SuperLink")
        self._start_superlink(attempts)
        if self.simulation:
            # A `:local:` connection makes `flwr` probe $FLWR_LOCAL_SUPERLINK_HTTP_API_PORT
            # and start a detached simulation SuperLink if none answers: point it at ours.
            self.registry.env["FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"] = str(self.superlink_port)
            self.registry.env["FLWR_LOCAL_CONTROL_API_PORT"] = str(free_ports(1, self.host)[0])
            write_connection(self.flwr_home, ":local:", insecure=False)
        else:
            write_connection(self.flwr_home, self.address)
        for partition in range(self.num_supernodes):
            step(f"starting SuperNode {partition + 1}/{self.num_supernodes}")
            self._start_supernode(partition, attempts)
        if self.num_supernodes:
            step(f"waiting for {self.num_supernodes} SuperNodes to register")
            self.wait_registered()
        self.registry.snapshot()

    def _start_superlink(self, attempts: int) -> None:
        """Start the SuperLink on a free port; retry on another port if that one was taken."""
        for attempt in range(1, attempts + 1):
            (port,) = free_ports(1, self.host)
            cmd = superlink_argv(self.host, port, simulation=self.simulation)
            proc = self.registry.start(
                "superlink", cmd, self.logs_dir / "superlink.log", meta={"port": port}
            )
            deadline = time.monotonic() + self.ready_timeout
            while time.monotonic() < deadline:
                if not proc.running():
                    break
                # the port may have gone to another process first (free_ports): a health
                # check counts only when this SuperLink is the one listening there
                healthy = http_ok(f"http://{self.host}:{port}/health")
                if healthy and listens_on(proc.pid, port) is not False:
                    self.superlink, self.superlink_port = proc, port
                    logger.info("SuperLink ready on %s:%d (pid %d)", self.host, port, proc.pid)
                    return
                time.sleep(0.2)
            tail = proc.log_tail()
            self.registry.stop(proc, grace=2.0)
            if attempt < attempts and any(s in tail.lower() for s in ADDR_IN_USE):
                logger.warning("SuperLink port %d was taken; retrying on another port", port)
                continue
            raise LauncherError(
                f"SuperLink did not become ready (port {port}); last log lines:\n{tail}"
            )

    def _start_supernode(self, partition: int, attempts: int) -> None:
        """Start the SuperNode of ``partition`` on a free Runtime API port (retried if taken)."""
        cfg = {"partition-id": partition, "num-partitions": self.num_supernodes}
        cfg.update(self.node_config)
        for attempt in range(1, attempts + 1):
            (port,) = free_ports(1, self.host)
            cmd = supernode_argv(self.address, cfg, runtime_api=(self.host, port))
            proc = self.registry.start(
                f"supernode-{partition}",
                cmd,
                self.logs_dir / f"supernode-{partition}.log",
                meta={"port": port, "partition": partition},
            )
            time.sleep(0.3)
            # A taken Runtime API port makes the SuperNode exit at once; retry that one.
            deadline = time.monotonic() + 5.0
            while proc.running() and time.monotonic() < deadline:
                if "Uvicorn running" in proc.log_text() or NODE_ID_RE.search(proc.log_text()):
                    break
                time.sleep(0.2)
            if proc.running():
                self.supernodes[partition] = proc
                return
            tail = proc.log_tail()
            self.registry.stop(proc, grace=1.0)
            if attempt < attempts:
                logger.warning("SuperNode %d exited at start (port %d); retrying", partition, port)
                continue
            raise LauncherError(f"SuperNode {partition} exited at start; last log lines:\n{tail}")

    def wait_registered(self) -> dict[int, int]:
        """Wait until every SuperNode is ``online`` (:func:`deploy.flower.wait_online`).

        Returns
        -------
        dict[int, int]
            ``partition-id -> node id``.
        """
        return wait_online(
            self.supernodes, self.node_ids, self.cli, self.ready_timeout, str(self.logs_dir)
        )

    # ------------------------------------------------------------------ operations
    @property
    def cli(self) -> FlowerCli:
        """The ``flwr`` CLI against this deployment (each call bounded by ``ready_timeout``)."""
        return FlowerCli(CONNECTION_NAME, self.env, timeout=self.ready_timeout)

    def flwr(self, *args: str, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``flwr *args`` against this deployment (:class:`deploy.flower.FlowerCli`)."""
        return self.cli(*args, timeout=timeout)

    def kill_supernode(self, partition: int, round_: int) -> KilledNode:
        """SIGKILL the SuperNode of ``partition`` and every process below it.

        Raises
        ------
        KeyError
            If there is no SuperNode for ``partition``.
        """
        proc = self.supernodes[partition]
        tree = self.registry.kill_tree(proc, signal.SIGKILL)
        logger.info(
            "killed SuperNode %d (pid %d, %d processes) in round %d",
            partition,
            proc.pid,
            len(tree),
            round_,
        )
        return KilledNode(partition, round_, proc.pid, self.node_ids.get(partition), time.time())

    def infrastructure_failure(self) -> str | None:
        """A message if the SuperLink has exited, else None."""
        if self.superlink is not None and not self.superlink.running():
            return (
                f"SuperLink exited (code {self.superlink.popen.returncode}); last log lines:\n"
                f"{self.superlink.log_tail()}"
            )
        return None

    def close(self, grace: float = 3.0) -> None:
        """Stop every process (idempotent)."""
        self.registry.stop_all(grace=grace)
