"""Multi-host harness: one Linux network namespace per machine, on a private bridge.

Two layers, both used by ``tests/system/test_multihost.py`` and ``bench/bench_uplink.py``; the
Flower plumbing (``flwr`` CLI, node-id waits, config strings, process trees) is shared with the
local deployment (:mod:`deploy.flower`, :mod:`deploy.processes`):

* :class:`Topology` builds the "machines": one network namespace per host, each with a veth
  ``eth0`` that carries the host's IPv4 address, and a Linux bridge ``br0`` in a dedicated
  namespace joining the other ends. Nothing is created in the root namespace (no interface, no
  address, no route), so parallel runs with the same addresses never collide; names carry the
  creator's PID and a random suffix (``cfl-<pid>-<hex>-<host>``). It runs commands inside a host
  (``ip netns exec``), takes a host's link down/up, shapes a host's uplink with ``tc`` (egress of
  its ``eth0``: ``tbf`` for a rate, ``netem`` for a rate plus delay), reads the interface byte
  counters, and tears everything down (SIGKILL of whatever still runs in its namespaces by PID,
  then ``ip netns del``), idempotently, also at interpreter exit.
* :class:`FlowerHosts` deploys Flower 1.42 on a :class:`Topology`: the SuperLink (and, through it,
  the ServerApp) on the server host, one SuperNode per client host, optionally with TLS
  (``docker/certs/make-certs.sh`` for the server address) and SuperNode authentication (keys
  registered with ``docker/certs/register-nodes.sh``), then ``flwr run`` from the server host.
  Processes are started and stopped by :class:`deploy.processes.ProcessRegistry`, whose
  process-tree tracking kills the ServerApp/ClientApp helpers too.

Requirements: Linux, root (``CAP_NET_ADMIN`` and ``CAP_SYS_ADMIN`` for ``ip netns``), iproute2
(``apt-get install iproute2``). :func:`netns_unavailable_reason` says why namespaces cannot be
used here (tests skip with it). Traffic stays between the namespaces; nothing is routed out.
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import json
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Final

import tomli_w

from corbin_fl.deploy.flower import (
    RUN_ID_RE,
    FlowerCli,
    superlink_argv,
    supernode_argv,
    wait_online,
)
from corbin_fl.deploy.follow import JsonlTail
from corbin_fl.deploy.processes import (
    LauncherError,
    ManagedProcess,
    ProcessRef,
    ProcessRegistry,
    flower_env,
    process_ref,
)

logger = logging.getLogger(__name__)

REPO_ROOT: Final[Path] = Path(__file__).resolve().parents[1]
MAKE_CERTS: Final[Path] = REPO_ROOT / "docker" / "certs" / "make-certs.sh"
REGISTER_NODES: Final[Path] = REPO_ROOT / "docker" / "certs" / "register-nodes.sh"

TAG: Final[str] = "cfl"
"""Prefix of every namespace this module creates."""
_NS_RE: Final[re.Pattern[str]] = re.compile(rf"^{TAG}-(\d+)-([0-9a-f]{{6}})-([a-z][a-z0-9]*)$")
_HOST_RE: Final[re.Pattern[str]] = re.compile(r"^[a-z][a-z0-9]{0,11}$")
BRIDGE_HOST: Final[str] = "br"
"""Host-name slot of the bridge namespace (so no host may be called ``br``)."""
HOST_IFNAME: Final[str] = "eth0"
"""Interface of every host (inside its own namespace)."""
BRIDGE_IFNAME: Final[str] = "br0"


class NetnsError(LauncherError):
    """A namespace operation (``ip``/``tc``) or a deployment step inside namespaces failed."""


# ====================================================================== low level
def _run(
    argv: Sequence[str],
    *,
    timeout: float = 30.0,
    check: bool = True,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` (captured text output); raise :class:`NetnsError` on failure if ``check``."""
    try:
        out = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
            env=dict(env) if env is not None else None,
        )
    except subprocess.TimeoutExpired as exc:
        raise NetnsError(f"`{' '.join(argv)}` timed out after {timeout:g} s") from exc
    except OSError as exc:
        raise NetnsError(f"cannot run `{' '.join(argv)}`: {exc}") from exc
    if check and out.returncode != 0:
        why = (out.stderr or out.stdout).strip()
        raise NetnsError(f"`{' '.join(argv)}` failed (exit {out.returncode}): {why}")
    return out


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return _run(["ip", *args], check=check)


def namespaces() -> set[str]:
    """Names of every network namespace (``ip netns list``)."""
    out = _ip("netns", "list")
    return {line.split()[0] for line in out.stdout.splitlines() if line.strip()}


def namespace_pids(ns: str) -> list[int]:
    """PIDs of the processes whose network namespace is ``ns`` (empty if ``ns`` is gone)."""
    out = _ip("netns", "pids", ns, check=False)
    if out.returncode != 0:
        return []
    return [int(p) for p in out.stdout.split() if p.isdigit()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def in_namespace(pid: int, ns: str) -> bool:
    """Whether process ``pid`` has already entered network namespace ``ns``.

    ``ip netns exec`` starts in the caller's namespace and calls ``setns`` before it execs the
    command, so right after :func:`subprocess.Popen` returns the new PID may still see the
    parent's network. Compares the nsfs inodes of ``/proc/<pid>/ns/net`` and ``/run/netns/<ns>``.
    """
    try:
        mine, theirs = os.stat(f"/proc/{pid}/ns/net"), os.stat(f"/run/netns/{ns}")
    except OSError:
        return False
    return (mine.st_dev, mine.st_ino) == (theirs.st_dev, theirs.st_ino)


def wait_in_namespace(pid: int, ns: str, timeout: float = 10.0) -> None:
    """Block until :func:`in_namespace` holds for ``pid``; raise :class:`NetnsError` on timeout."""
    deadline = time.monotonic() + timeout
    while not in_namespace(pid, ns):
        if time.monotonic() > deadline or not _pid_alive(pid):
            raise NetnsError(f"pid {pid} did not enter network namespace {ns} in {timeout:g} s")
        time.sleep(0.02)


def netdev_counters(pid: int, ifname: str = HOST_IFNAME) -> dict[str, int]:
    """Byte and packet counters of ``ifname`` in the network namespace of process ``pid``.

    Reads ``/proc/<pid>/net/dev`` (the view of that process's namespace) without starting a
    process, so it is cheap enough to sample several times a second.

    Returns
    -------
    dict[str, int]
        ``rx_bytes``, ``rx_packets``, ``tx_bytes``, ``tx_packets``.

    Raises
    ------
    NetnsError
        If the process is gone or its namespace has no ``ifname``.
    """
    try:
        text = Path(f"/proc/{pid}/net/dev").read_text()
    except OSError as exc:
        raise NetnsError(f"cannot read /proc/{pid}/net/dev: {exc}") from exc
    for line in text.splitlines()[2:]:
        name, _, data = line.partition(":")
        if name.strip() == ifname:
            fields = data.split()
            return {
                "rx_bytes": int(fields[0]),
                "rx_packets": int(fields[1]),
                "tx_bytes": int(fields[8]),
                "tx_packets": int(fields[9]),
            }
    raise NetnsError(f"no interface {ifname} in the network namespace of pid {pid}")


_UNAVAILABLE: list[str | None] = []


def netns_unavailable_reason() -> str | None:
    """Why network namespaces cannot be used here, or None if they can (cached).

    Checks, in order: Linux, root, ``ip`` and ``tc`` on ``PATH``, and that a namespace pair with
    a veth between them can actually be created and removed (container runtimes without
    ``CAP_SYS_ADMIN`` fail there).
    """
    if _UNAVAILABLE:
        return _UNAVAILABLE[0]
    reason: str | None = None
    if not sys.platform.startswith("linux"):
        reason = f"network namespaces need Linux (this is {sys.platform})"
    elif os.geteuid() != 0:
        reason = "network namespaces need root (ip netns add); run the multihost tests as root"
    elif shutil.which("ip") is None or shutil.which("tc") is None:
        reason = "iproute2 is missing (`ip`/`tc` not on PATH): apt-get install iproute2"
    else:
        probe = f"{TAG}-{os.getpid()}-{secrets.token_hex(3)}-probe"
        try:
            _ip("netns", "add", probe)
            _ip(
                "link",
                "add",
                "p0",
                "netns",
                probe,
                "type",
                "veth",
                "peer",
                "name",
                "p1",
                "netns",
                probe,
            )
        except NetnsError as exc:
            reason = f"cannot create a network namespace with a veth pair: {exc}"
        finally:
            _ip("netns", "del", probe, check=False)
    _UNAVAILABLE.append(reason)
    return reason


def sweep_stale() -> list[str]:
    """Delete namespaces of this module whose creating process is gone and that hold no process.

    A run that was SIGKILLed cannot tear down; its namespaces keep their names (``cfl-<pid>-...``).
    Only namespaces with that pattern, a dead creator PID and no process inside are removed;
    others are logged and left alone.

    Returns
    -------
    list[str]
        The namespaces removed.
    """
    removed: list[str] = []
    for ns in sorted(namespaces()):
        match = _NS_RE.match(ns)
        if match is None or _pid_alive(int(match.group(1))):
            continue
        if namespace_pids(ns):
            logger.warning("stale namespace %s still holds processes; left alone", ns)
            continue
        if _ip("netns", "del", ns, check=False).returncode == 0:
            removed.append(ns)
    if removed:
        logger.info("removed stale namespaces: %s", ", ".join(removed))
    return removed


# ====================================================================== topology
@dataclass(frozen=True)
class Host:
    """One emulated machine.

    Attributes
    ----------
    name : str
        Short name (``[a-z][a-z0-9]{0,11}``), e.g. ``srv`` or ``c1``.
    ns : str
        Its network namespace.
    address : str
        IPv4 address of its ``eth0``.
    peer : str
        Name of the other end of its veth, in the bridge namespace.
    """

    name: str
    ns: str
    address: str
    peer: str


class Topology:
    """Hosts on one private IPv4 subnet, one network namespace each, joined by a bridge.

    Parameters
    ----------
    hosts : Mapping[str, str]
        Host name -> IPv4 address, e.g. ``{"srv": "10.77.0.1", "c1": "10.77.0.11"}``. Every
        address must lie in ``subnet`` and differ from the others.
    subnet : str
        The private subnet of all hosts (CIDR), default ``10.77.0.0/24``.

    Notes
    -----
    Use as a context manager (or call :meth:`create` / :meth:`destroy`); :meth:`destroy` also
    runs at interpreter exit. Each host gets ``lo`` up (Flower's SuperNode serves its Runtime
    API on 127.0.0.1) and ``eth0`` with ``address/prefix``; the bridge namespace has ``br0``
    and one ``p-<host>`` port per host. Only link-layer forwarding happens: the hosts see each
    other and nothing else.
    """

    def __init__(self, hosts: Mapping[str, str], *, subnet: str = "10.77.0.0/24") -> None:
        if not isinstance(hosts, Mapping) or not hosts:
            raise TypeError("hosts must be a non-empty mapping of host name -> IPv4 address")
        try:
            net = ipaddress.IPv4Network(subnet, strict=True)
        except (ipaddress.AddressValueError, ipaddress.NetmaskValueError, ValueError) as exc:
            raise ValueError(
                f"subnet must be an IPv4 network in CIDR form, got {subnet!r}"
            ) from exc
        if not net.is_private:
            raise ValueError(f"subnet must be a private range, got {subnet}")
        self.subnet = net
        self.run_tag = f"{TAG}-{os.getpid()}-{secrets.token_hex(3)}"
        self.bridge_ns = f"{self.run_tag}-{BRIDGE_HOST}"
        self.hosts: dict[str, Host] = {}
        seen: set[ipaddress.IPv4Address] = set()
        for name, address in hosts.items():
            if not isinstance(name, str) or not _HOST_RE.match(name) or name == BRIDGE_HOST:
                raise ValueError(
                    f"host name must match [a-z][a-z0-9]{{0,11}} and not be {BRIDGE_HOST!r}, "
                    f"got {name!r}"
                )
            try:
                addr = ipaddress.IPv4Address(address)
            except (ipaddress.AddressValueError, ValueError) as exc:
                raise ValueError(f"host {name}: not an IPv4 address: {address!r}") from exc
            if addr not in net or addr in (net.network_address, net.broadcast_address):
                raise ValueError(f"host {name}: {addr} is not a host address of {net}")
            if addr in seen:
                raise ValueError(f"host {name}: address {addr} is used twice")
            seen.add(addr)
            self.hosts[name] = Host(name, f"{self.run_tag}-{name}", str(addr), f"p-{name}")
        self._created: list[str] = []
        self._lock = threading.RLock()
        self._closed = False

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> Topology:
        self.create()
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    @property
    def namespaces(self) -> list[str]:
        """Every namespace of this topology (hosts, then the bridge)."""
        return [h.ns for h in self.hosts.values()] + [self.bridge_ns]

    def create(self) -> None:
        """Create the namespaces, the bridge and one veth per host, and bring everything up.

        Raises
        ------
        NetnsError
            If any ``ip`` command fails; what was already created is removed first.
        """
        with self._lock:
            if self._created or self._closed:
                raise NetnsError("a Topology can be created once")
            atexit.register(self.destroy)
            try:
                self._add_ns(self.bridge_ns)
                _ip("-n", self.bridge_ns, "link", "add", BRIDGE_IFNAME, "type", "bridge")
                _ip("-n", self.bridge_ns, "link", "set", BRIDGE_IFNAME, "up")
                prefix = str(self.subnet.prefixlen)
                for host in self.hosts.values():
                    self._add_ns(host.ns)
                    _ip("-n", host.ns, "link", "set", "lo", "up")
                    _ip(
                        "link",
                        "add",
                        HOST_IFNAME,
                        "netns",
                        host.ns,
                        "type",
                        "veth",
                        "peer",
                        "name",
                        host.peer,
                        "netns",
                        self.bridge_ns,
                    )
                    _ip("-n", self.bridge_ns, "link", "set", host.peer, "master", BRIDGE_IFNAME)
                    _ip("-n", self.bridge_ns, "link", "set", host.peer, "up")
                    _ip(
                        "-n", host.ns, "addr", "add", f"{host.address}/{prefix}", "dev", HOST_IFNAME
                    )
                    _ip("-n", host.ns, "link", "set", HOST_IFNAME, "up")
            except BaseException:
                self.destroy()
                raise
            logger.info(
                "topology %s: %s",
                self.run_tag,
                ", ".join(f"{h.name}={h.address}" for h in self.hosts.values()),
            )

    def _add_ns(self, ns: str) -> None:
        _ip("netns", "add", ns)
        self._created.append(ns)

    def destroy(self, grace: float = 5.0) -> list[int]:
        """SIGKILL every process left in the namespaces, then delete them (idempotent).

        Returns
        -------
        list[int]
            PIDs that were still running inside a namespace and had to be killed.
        """
        with self._lock:
            if self._closed:
                return []
            self._closed = True
            killed: list[int] = []
            for ns in self._created:
                for pid in namespace_pids(ns):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
                        killed.append(pid)
            deadline = time.monotonic() + grace
            while any(_pid_alive(p) for p in killed) and time.monotonic() < deadline:
                time.sleep(0.05)
            for ns in reversed(self._created):
                out = _ip("netns", "del", ns, check=False)
                if out.returncode != 0:
                    logger.error("cannot delete namespace %s: %s", ns, out.stderr.strip())
            if killed:
                logger.warning("killed %d process(es) left in %s", len(killed), self.run_tag)
            self._created = []
        with contextlib.suppress(Exception):
            atexit.unregister(self.destroy)
        return killed

    def leftovers(self) -> list[str]:
        """Namespaces of this topology that still exist (empty after :meth:`destroy`)."""
        return sorted(set(self.namespaces) & namespaces())

    # ------------------------------------------------------------------ running things
    def host(self, name: str) -> Host:
        """The host called ``name``.

        Raises
        ------
        KeyError
            If there is no such host.
        """
        try:
            return self.hosts[name]
        except KeyError:
            raise KeyError(f"no host {name!r}; hosts are {sorted(self.hosts)}") from None

    def argv(self, name: str, cmd: Sequence[str]) -> list[str]:
        """``cmd`` prefixed so that it runs inside host ``name``'s namespace.

        ``ip netns exec`` execs the command (no fork), so the PID of the started process is the
        command's own PID, and signals/process-group handling work as without the prefix.
        """
        if not cmd:
            raise ValueError("cmd must not be empty")
        return ["ip", "netns", "exec", self.host(name).ns, *map(str, cmd)]

    def run(
        self,
        name: str,
        cmd: Sequence[str],
        *,
        timeout: float = 60.0,
        check: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` inside host ``name`` and wait for it (captured text output)."""
        return _run(self.argv(name, cmd), timeout=timeout, check=check, env=env)

    def pids(self, name: str) -> list[int]:
        """PIDs of the processes running inside host ``name``."""
        return namespace_pids(self.host(name).ns)

    # ------------------------------------------------------------------ links
    def link_down(self, name: str) -> None:
        """Unplug host ``name``: ``ip link set eth0 down`` inside its namespace."""
        _ip("-n", self.host(name).ns, "link", "set", HOST_IFNAME, "down")

    def link_up(self, name: str) -> None:
        """Plug host ``name`` back in."""
        _ip("-n", self.host(name).ns, "link", "set", HOST_IFNAME, "up")

    def link_stats(self, name: str) -> dict[str, int]:
        """Byte and packet counters of host ``name``'s ``eth0``.

        Returns
        -------
        dict[str, int]
            ``tx_bytes`` (the uplink: everything the host sent), ``rx_bytes``, ``tx_packets``,
            ``rx_packets``, ``tx_dropped``.
        """
        out = _ip("-j", "-s", "-n", self.host(name).ns, "link", "show", "dev", HOST_IFNAME)
        stats = json.loads(out.stdout)[0]["stats64"]
        return {
            "tx_bytes": int(stats["tx"]["bytes"]),
            "rx_bytes": int(stats["rx"]["bytes"]),
            "tx_packets": int(stats["tx"]["packets"]),
            "rx_packets": int(stats["rx"]["packets"]),
            "tx_dropped": int(stats["tx"]["dropped"]),
        }

    # ------------------------------------------------------------------ shaping
    def shape_uplink(
        self,
        name: str,
        rate_mbit: float,
        *,
        delay_ms: float = 0.0,
        queue_ms: float = 200.0,
    ) -> str:
        """Limit what host ``name`` sends (the egress of its ``eth0``) to ``rate_mbit`` Mbit/s.

        Without delay this is a token bucket, ``tc qdisc replace dev eth0 root tbf rate R burst B
        latency L``: the bucket ``B = max(R x 10 ms, 64 KiB)`` lets a veth's segmentation-offload
        packets (up to 64 KiB) through, and the queue holds at most ``L = queue_ms`` of traffic.
        With ``delay_ms > 0`` it is ``netem rate R delay D`` (one-way delay on the uplink), which
        needs the kernel's ``sch_netem``.

        Returns
        -------
        str
            The qdisc now installed (``tc qdisc show`` line).

        Raises
        ------
        ValueError
            If a parameter is not a positive finite number (``delay_ms >= 0``).
        NetnsError
            If ``tc`` fails, e.g. ``netem`` is not built into this kernel (the message says so).
        """
        for key, value, low_ok in (
            ("rate_mbit", rate_mbit, False),
            ("delay_ms", delay_ms, True),
            ("queue_ms", queue_ms, False),
        ):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"{key} must be a number, got {type(value).__name__}")
            if not (value >= 0 if low_ok else value > 0) or value == float("inf"):
                raise ValueError(f"{key} must be {'>= 0' if low_ok else '> 0'}, got {value}")
        ns = self.host(name).ns
        rate_bit = round(rate_mbit * 1e6)
        if delay_ms > 0:
            # queue in packets: queue_ms of traffic at full-size frames, at least 100
            limit = max(100, int(rate_bit / 8 * queue_ms / 1000 / 1500))
            cmd = [
                "tc",
                "-n",
                ns,
                "qdisc",
                "replace",
                "dev",
                HOST_IFNAME,
                "root",
                "netem",
                "rate",
                f"{rate_bit}bit",
                "delay",
                f"{delay_ms:g}ms",
                "limit",
                str(limit),
            ]
        else:
            burst = max(rate_bit // 8 // 100, 64 * 1024)
            cmd = [
                "tc",
                "-n",
                ns,
                "qdisc",
                "replace",
                "dev",
                HOST_IFNAME,
                "root",
                "tbf",
                "rate",
                f"{rate_bit}bit",
                "burst",
                str(burst),
                "latency",
                f"{queue_ms:g}ms",
            ]
        out = _run(cmd, check=False)
        if out.returncode != 0:
            why = out.stderr.strip()
            if delay_ms > 0 and "unknown" in why.lower():
                why += " (this kernel has no sch_netem: shape with delay_ms=0, i.e. tbf, instead)"
            raise NetnsError(f"`{' '.join(cmd)}` failed: {why}")
        return self.qdisc(name)

    def clear_shaping(self, name: str) -> None:
        """Remove the uplink shaping of host ``name`` (back to the default qdisc)."""
        ns = self.host(name).ns
        _run(["tc", "-n", ns, "qdisc", "del", "dev", HOST_IFNAME, "root"], check=False)

    def qdisc(self, name: str) -> str:
        """The root qdisc of host ``name``'s ``eth0`` (``tc qdisc show`` text)."""
        ns = self.host(name).ns
        out = _run(["tc", "-n", ns, "qdisc", "show", "dev", HOST_IFNAME, "root"])
        return out.stdout.strip()

    def netem_available(self) -> bool:
        """Whether this kernel can do ``netem`` (tried on a throwaway qdisc of the bridge)."""
        cmd = [
            "tc",
            "-n",
            self.bridge_ns,
            "qdisc",
            "replace",
            "dev",
            BRIDGE_IFNAME,
            "root",
            "netem",
            "delay",
            "1ms",
        ]
        ok = _run(cmd, check=False).returncode == 0
        if ok:
            _run(
                ["tc", "-n", self.bridge_ns, "qdisc", "del", "dev", BRIDGE_IFNAME, "root"],
                check=False,
            )
        return ok


# ====================================================================== Flower on a topology
@dataclass
class FlowerHosts:
    """Flower 1.42 deployed on a :class:`Topology`: SuperLink on one host, a SuperNode per client.

    Parameters
    ----------
    topology : Topology
        The created topology.
    server : str
        Host of the SuperLink (its ServerApp runs there too: subprocess isolation).
    clients : Sequence[str]
        Client hosts; the SuperNode on ``clients[i]`` gets ``partition-id=i
        num-partitions=len(clients)``.
    work_dir : Path
        Certificates, ``FLWR_HOME``, process logs, the run-config file.
    tls : bool
        TLS on every link to the SuperLink plus SuperNode authentication
        (``--enable-supernode-auth``, keys registered before the SuperNodes start).
    port : int
        SuperLink port (on the server's address; one port for Fleet, Control and Runtime APIs).
    ready_timeout : float
        Seconds for the SuperLink to answer ``/health`` and for all SuperNodes to be online;
        also the limit of one ``flwr`` CLI call (a process start-up and a request). Derive it
        from the machine's measured start-up time (``tests/waits.py``), not a fixed number.
    node_config : Mapping[str, Any]
        Extra node config for every SuperNode.
    """

    topology: Topology
    server: str
    clients: Sequence[str]
    work_dir: Path
    tls: bool = True
    port: int = 8000
    ready_timeout: float = 120.0
    node_config: Mapping[str, Any] = field(default_factory=dict)

    CONNECTION: ClassVar[str] = "multihost"

    def __post_init__(self) -> None:
        self.topology.host(self.server)
        if not self.clients:
            raise ValueError("at least one client host is needed")
        for name in self.clients:
            self.topology.host(name)
            if name == self.server:
                raise ValueError(f"host {name!r} cannot be both server and client")
        if len(set(self.clients)) != len(self.clients):
            raise ValueError(f"client hosts must be distinct, got {list(self.clients)}")
        if (
            isinstance(self.port, bool)
            or not isinstance(self.port, int)
            or not 0 < self.port < 65536
        ):
            raise ValueError(f"port must be in 1..65535, got {self.port!r}")
        if not self.ready_timeout > 0:
            raise ValueError(f"ready_timeout must be > 0, got {self.ready_timeout}")
        self.work_dir = Path(self.work_dir).resolve()
        self.flwr_home = self.work_dir / "flwr-home"
        self.logs_dir = self.work_dir / "logs"
        self.certs_dir = self.work_dir / "certs"
        self.registry = ProcessRegistry(env={"FLWR_HOME": str(self.flwr_home)})
        self.superlink: ManagedProcess | None = None
        self.supernodes: dict[str, ManagedProcess] = {}
        self.node_ids: dict[str, int] = {}

    # ------------------------------------------------------------------ properties
    @property
    def address(self) -> str:
        """``host:port`` of the SuperLink."""
        return f"{self.topology.host(self.server).address}:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """Environment of every ``flwr`` command against this deployment."""
        return flower_env(self.registry.env)

    @property
    def ca_cert(self) -> Path:
        """The deployment CA's certificate (written by ``make-certs.sh`` when ``tls``)."""
        return self.certs_dir / "ca" / "ca.crt"

    # ------------------------------------------------------------------ start
    def start(self) -> dict[str, int]:
        """Certificates (TLS), SuperLink, node registration (TLS), SuperNodes; wait until online.

        Returns
        -------
        dict[str, int]
            Client host -> SuperNode id.

        Raises
        ------
        NetnsError
            If a step fails or a process is not ready within ``ready_timeout``.
        """
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        if self.tls:
            self._make_certs()
        self._write_connection()
        t1 = time.monotonic()
        self._start_superlink()
        t2 = time.monotonic()
        if self.tls:
            self._register_nodes()
        t3 = time.monotonic()
        for index, name in enumerate(self.clients):
            self._start_supernode(index, name)
        wait_online(
            self.supernodes, self.node_ids, self.cli, self.ready_timeout, str(self.logs_dir)
        )
        self.registry.snapshot()
        logger.info(
            "deployment up in %.1f s (certs %.1f, SuperLink %.1f, registration %.1f, "
            "SuperNodes %.1f)",
            time.monotonic() - t0,
            t1 - t0,
            t2 - t1,
            t3 - t2,
            time.monotonic() - t3,
        )
        return dict(self.node_ids)

    def _make_certs(self) -> None:
        server_ip = self.topology.host(self.server).address
        _run(
            [
                "bash",
                str(MAKE_CERTS),
                "-o",
                str(self.certs_dir),
                "-n",
                str(len(self.clients)),
                "-f",
                server_ip,
            ],
            timeout=120,
        )

    def _write_connection(self) -> None:
        conn: dict[str, Any] = {"address": self.address}
        if self.tls:
            conn["root-certificates"] = str(self.ca_cert)
        else:
            conn["insecure"] = True
        self.flwr_home.mkdir(parents=True, exist_ok=True)
        (self.flwr_home / "config.toml").write_text(
            tomli_w.dumps({"superlink": {"default": self.CONNECTION, self.CONNECTION: conn}})
        )

    def _start_superlink(self) -> None:
        host = self.topology.host(self.server)
        certs = self.certs_dir / "superlink" if self.tls else None
        cmd = superlink_argv(host.address, self.port, certs=certs)
        proc = self.registry.start(
            "superlink", self.topology.argv(self.server, cmd), self.logs_dir / "superlink.log"
        )
        scheme = "https" if self.tls else "http"
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if not proc.running():
                break
            if self.http_ok(f"{scheme}://{self.address}/health"):
                self.superlink = proc
                logger.info("SuperLink ready on %s (%s)", self.address, scheme)
                return
            time.sleep(0.3)
        raise NetnsError(f"SuperLink not ready on {self.address}:\n{proc.log_tail()}")

    def http_ok(self, url: str, timeout: float = 2.0) -> bool:
        """Whether ``GET url`` answers 2xx from the server host (TLS verified with the CA).

        ``timeout`` bounds the request; the probe process may take up to ``ready_timeout`` to
        start (a loaded machine), and one that did not finish in time counts as no answer.
        """
        code = (
            "import ssl, sys, urllib.request\n"
            "ctx = ssl.create_default_context(cafile=sys.argv[2]) if sys.argv[2] else None\n"
            "r = urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[3]), context=ctx)\n"
            "sys.exit(0 if 200 <= r.status < 300 else 1)\n"
        )
        cafile = str(self.ca_cert) if self.tls else ""
        try:
            out = self.topology.run(
                self.server,
                [sys.executable, "-c", code, url, cafile, str(timeout)],
                timeout=timeout + self.ready_timeout,
                check=False,
            )
        except NetnsError:  # did not finish in time
            return False
        return out.returncode == 0

    @property
    def cli(self) -> FlowerCli:
        """The ``flwr`` CLI on the server host against this deployment; each call is bounded by
        ``ready_timeout`` (a CLI call is one Flower process start-up plus a request)."""
        return FlowerCli(
            self.CONNECTION,
            self.env,
            timeout=self.ready_timeout,
            wrap=lambda cmd: self.topology.argv(self.server, cmd),
        )

    def _register_nodes(self) -> None:
        out = self.topology.run(
            self.server,
            ["bash", str(REGISTER_NODES), self.CONNECTION, str(self.certs_dir)],
            # one `flwr supernode register` call (a CLI start-up) per client
            timeout=len(self.clients) * self.ready_timeout,
            check=False,
            env=self.env,
        )
        if out.returncode != 0:
            raise NetnsError(f"register-nodes.sh failed:\n{out.stdout}\n{out.stderr}")

    def _start_supernode(self, index: int, name: str) -> None:
        cfg = {"partition-id": index, "num-partitions": len(self.clients), **self.node_config}
        certs = self.certs_dir / f"node-{index + 1}" if self.tls else None
        cmd = supernode_argv(self.address, cfg, certs=certs)
        # The Runtime API stays on the host's own loopback (127.0.0.1:9094, Flower's default):
        # every host is a separate namespace, so the default port never collides.
        self.supernodes[name] = self.registry.start(
            f"supernode-{name}",
            self.topology.argv(name, cmd),
            self.logs_dir / f"supernode-{name}.log",
            meta={"partition": index},
        )

    # ------------------------------------------------------------------ run
    def submit(self, run_config: Mapping[str, Any], app_dir: Path = REPO_ROOT) -> ManagedProcess:
        """Start ``flwr run <app_dir> <conn> --stream --run-config FILE`` on the server host."""
        path = self.work_dir / "run-config.toml"
        path.write_text(tomli_w.dumps(dict(run_config)))
        return self.registry.start(
            "flwr-run", self.cli.run_argv(app_dir, path), self.logs_dir / "flwr-run.log"
        )

    def follow(
        self,
        flwr_run: ManagedProcess,
        out_dir: Path,
        *,
        timeout: float,
        on_tick: Callable[[RunOutcome], None] | None = None,
    ) -> RunOutcome:
        """Follow a submitted run until ``flwr run`` exits (or ``timeout`` seconds pass).

        Four times a second the new ``events.jsonl``/``metrics.jsonl`` records are appended to
        the outcome and ``on_tick(outcome)`` is called (fault injection hooks in there); the
        registry snapshots process trees every second so ClientApp processes are known for
        cleanup.
        """
        events_tail = JsonlTail(Path(out_dir) / "events.jsonl")
        metrics_tail = JsonlTail(Path(out_dir) / "metrics.jsonl")
        outcome = RunOutcome()
        deadline = time.monotonic() + timeout
        last_snapshot = 0.0
        while True:
            rc = flwr_run.popen.poll()
            outcome.events.extend(events_tail.read_new())
            outcome.metrics.extend(metrics_tail.read_new())
            if on_tick is not None:
                on_tick(outcome)
            if time.monotonic() - last_snapshot > 1.0:
                self.registry.snapshot()
                last_snapshot = time.monotonic()
            if rc is not None:
                break
            if self.superlink is not None and not self.superlink.running():
                outcome.reason = f"SuperLink exited:\n{self.superlink.log_tail()}"
                break
            if time.monotonic() > deadline:
                outcome.reason = f"timed out after {timeout:g} s"
                break
            time.sleep(0.25)
        if outcome.reason is not None:
            self.registry.stop(flwr_run, grace=3.0)
        time.sleep(0.3)
        outcome.events.extend(events_tail.read_new())
        outcome.metrics.extend(metrics_tail.read_new())
        log = flwr_run.log_text()
        if m := RUN_ID_RE.search(log):
            outcome.run_id = int(m.group(1))
        outcome.exit_code = flwr_run.popen.returncode
        outcome.log_tail = "\n".join(log.splitlines()[-30:])
        return outcome

    def run_status(self, run_id: int, wait: float = 20.0) -> str | None:
        """Final status of a run, e.g. ``finished:completed`` (:meth:`FlowerCli.final_status`)."""
        return self.cli.final_status(run_id, wait)[0]

    # ------------------------------------------------------------------ faults
    def kill_client(self, name: str) -> list[ProcessRef]:
        """SIGKILL the SuperNode on host ``name`` and every process below it (ClientApps).

        Returns
        -------
        list[ProcessRef]
            The processes signalled (the SuperNode first).
        """
        proc = self.supernodes[name]
        tree = self.registry.kill_tree(proc, signal.SIGKILL)
        # Like `docker kill` of a container: nothing on that host survives. A ClientApp forked
        # while the tree was being walked, or one still exiting, is SIGKILLed here and waited for.
        ns, deadline = self.topology.host(name).ns, time.monotonic() + 15.0
        while (left := namespace_pids(ns)) and time.monotonic() < deadline:
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        logger.info("killed SuperNode on %s (%d processes)", name, len(tree))
        return tree

    # ------------------------------------------------------------------ stop
    def close(self, grace: float = 3.0) -> list[ProcessRef]:
        """Stop every process this deployment started (idempotent); return the survivors."""
        self.registry.stop_all(grace=grace)
        return self.registry.leftovers()

    def processes(self) -> list[ProcessRef]:
        """Every process started or seen below one (for leak checks)."""
        return self.registry.all_seen()


@dataclass
class RunOutcome:
    """What :meth:`FlowerHosts.follow` saw."""

    events: list[dict[str, Any]] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    run_id: int | None = None
    exit_code: int | None = None
    reason: str | None = None
    """Why following stopped early (timeout, dead SuperLink), None if ``flwr run`` exited."""
    log_tail: str = ""


def alive(refs: Sequence[ProcessRef]) -> list[ProcessRef]:
    """The processes of ``refs`` still running (same PID and start time)."""
    out = []
    for ref in refs:
        now = process_ref(ref.pid)
        if now is not None and (ref.start_time is None or now.start_time == ref.start_time):
            out.append(ref)
    return out
