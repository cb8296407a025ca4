"""Local Flower deployment on loopback: SuperLink + SuperNodes as real processes, then ``flwr run``.

This module is the engine behind ``corbin-fl local`` and ``corbin-fl simulate``. It knows nothing
about CorBin-FL's protocol; it starts Flower 1.41 processes, waits until they are usable, submits
a run, follows the files the ServerApp writes (``events.jsonl``, ``metrics.jsonl``,
``summary.json`` in the run config's ``out-dir``), injects faults on schedule, and stops every
process it started, whatever happens (normal end, failure, timeout, Ctrl-C, SIGTERM, an exception
in the caller, interpreter exit).

Flower 1.41 facts this relies on (checked against the installed ``--help`` and source):

* ``flower-superlink`` serves its Fleet, Control and Runtime (ServerAppIo) APIs over HTTP on ONE
  port (``--host``/``--port``, default 127.0.0.1:8000) and exposes ``GET /health``. The legacy gRPC
  Fleet/Control servers (9092/9093) only start when ``FLWR_INTERNAL_GRPC_*`` is set; we unset
  those variables, so one free port per SuperLink is enough.
* ``flower-superlink`` starts a ``flower-superexec`` in a NEW session (``start_new_session``), which
  in turn starts one ``flwr-serverapp`` per run; ``flower-supernode`` starts a ``flower-superexec``
  (same process group) that starts one ``flwr-clientapp`` process per message. Every helper polls
  its parent's PID and exits when it disappears, but only once the parent is reaped; we therefore
  track whole process trees (``/proc``) and kill them explicitly.
* Each ``flower-supernode`` needs its own Runtime API port (``--port``; 1.41 replaced
  ``--clientappio-api-address`` by ``--host``/``--port``) and logs ``SuperNode ID: <id>`` once it
  has registered with the SuperLink; ``flwr supernode list <conn> --format json`` then reports
  it ``online``.
* ``flwr run <app> <conn> --stream`` prints ``Successfully started run <id>`` and returns when the
  run has finished; ``flwr ls <conn> --run-id <id> --format json`` reports the final status
  (``finished:completed`` on success).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any, Final

import tomli_w

logger = logging.getLogger(__name__)

LOOPBACK: Final[str] = "127.0.0.1"
CONNECTION_NAME: Final[str] = "corbin-local"
"""Name of the SuperLink connection written into the temporary ``FLWR_HOME/config.toml``."""

FLOWER_ENV: Final[Mapping[str, str]] = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    # Never let a SuperLink run `uv sync` (it would try to download the app's dependencies).
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "PYTHONUNBUFFERED": "1",
}
"""Environment every Flower process of a local deployment gets (on top of ``os.environ``)."""

TASK_POLL_ENV: Final[str] = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL"
DEFAULT_TASK_POLL_INTERVAL: Final[str] = "0.2"
"""Seconds between two task polls of every ``flower-superexec`` (Flower's default is 1.0), unless
the user's environment sets :data:`TASK_POLL_ENV`. Each message starts a ClientApp process only
when the executor's next poll sees it, so the poll adds up to one interval (on average half) to
every round trip, and a round waits for its slowest node. At 0.2 s an idle SuperNode and its
executor use about 2.3% of a core, against 1.2% at 1.0 s and 4.3% at 0.1 s (measured on the
2-core development machine; see docs/BENCHMARKS.md "Where a round trip's time goes")."""


def flower_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """``os.environ`` for a Flower process or command of a local deployment: without the
    variables that open fixed ports (:data:`_DROP_ENV`), with :data:`FLOWER_ENV`, the
    executor's task poll (:data:`DEFAULT_TASK_POLL_INTERVAL` unless set) and ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in _DROP_ENV}
    env.setdefault(TASK_POLL_ENV, DEFAULT_TASK_POLL_INTERVAL)
    env.update(FLOWER_ENV)
    env.update(extra or {})
    return env


_DROP_ENV: Final[tuple[str, ...]] = (
    "FLWR_INTERNAL_GRPC_CONTROL_API",
    "FLWR_INTERNAL_GRPC_FLEET_API",
)
"""Variables that would make a SuperLink open extra (fixed) gRPC ports."""

_RUN_ID_RE: Final[re.Pattern[str]] = re.compile(r"Successfully started run (\d+)")
_NODE_ID_RE: Final[re.Pattern[str]] = re.compile(r"SuperNode ID: (\d+)")
_ANSI_RE: Final[re.Pattern[str]] = re.compile(r"\x1b\[[0-9;]*m")
_ADDR_IN_USE: Final[tuple[str, ...]] = ("address already in use", "errno 98")

COMPLETED_STATUS: Final[str] = "finished:completed"
RUN_FILES: Final[tuple[str, ...]] = ("events.jsonl", "metrics.jsonl", "summary.json")
"""What the ServerApp writes into ``out-dir`` (the launcher's contract with the app)."""


class LauncherError(RuntimeError):
    """A local deployment could not be started, or a run could not be submitted."""


class MissingDependencyError(LauncherError):
    """A runtime this run needs is not installed (e.g. Ray for the simulation runtime)."""


# ====================================================================== small value types
@dataclass(frozen=True)
class KillSpec:
    """A fault to inject: SIGKILL the SuperNode of ``partition`` during ``round``.

    Attributes
    ----------
    partition : int
        ``partition-id`` of the SuperNode (its node config), ``0 <= partition < N``.
    round : int
        Round (1-based) during which it is killed: ``delay`` seconds after the ServerApp's
        ``round_start`` event of that round.
    """

    partition: int
    round: int

    def __post_init__(self) -> None:
        for name in ("partition", "round"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"KillSpec.{name} must be an int, got {type(value).__name__}")
        if self.partition < 0:
            raise ValueError(f"KillSpec.partition must be >= 0, got {self.partition}")
        if self.round < 1:
            raise ValueError(f"KillSpec.round must be >= 1, got {self.round}")

    @classmethod
    def parse(cls, text: str) -> KillSpec:
        """Parse ``"PARTITION@ROUND"`` (e.g. ``"1@2"``).

        Raises
        ------
        ValueError
            If ``text`` is not two non-negative integers separated by ``@``.
        """
        if not isinstance(text, str):
            raise TypeError(f"kill spec must be a str, got {type(text).__name__}")
        match = re.fullmatch(r"\s*(\d+)\s*@\s*(\d+)\s*", text)
        if match is None:
            raise ValueError(f"kill spec must look like PARTITION@ROUND (e.g. 1@2), got {text!r}")
        return cls(partition=int(match.group(1)), round=int(match.group(2)))


@dataclass(frozen=True)
class KilledNode:
    """Record of one injected fault."""

    partition: int
    round: int
    pid: int
    node_id: int | None
    time: float
    """Unix time of the SIGKILL."""


@dataclass(frozen=True)
class ProcessRef:
    """A process identified by PID *and* start time (immune to PID reuse)."""

    pid: int
    start_time: int | None
    cmdline: str


# ====================================================================== ports
def free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    """Return ``count`` distinct TCP ports that were free on ``host`` a moment ago.

    All sockets are bound at the same time (so the ports are distinct) and closed before
    returning; another process may still take one before we use it, which is why the
    launcher retries a start that fails with "address already in use".

    Raises
    ------
    ValueError
        If ``count`` is not a positive integer.
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be a positive int, got {count!r}")
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


# ====================================================================== process trees
def _read_stat(pid: int) -> tuple[str, int, int] | None:
    """``(state, ppid, starttime)`` of ``pid`` from ``/proc/<pid>/stat``, or None if gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError, OSError):
        return None
    # The command name is in parentheses and may contain spaces or parentheses itself.
    rest = raw[raw.rfind(")") + 2 :].split()
    try:
        return rest[0], int(rest[1]), int(rest[19])
    except (IndexError, ValueError):
        return None


def _cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def _has_proc() -> bool:
    return Path("/proc/self/stat").exists()


def process_ref(pid: int) -> ProcessRef | None:
    """Identify a live process, or None if it does not exist (or is a zombie)."""
    if _has_proc():
        stat = _read_stat(pid)
        if stat is None or stat[0] in ("Z", "X"):
            return None
        return ProcessRef(pid=pid, start_time=stat[2], cmdline=_cmdline(pid))
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return ProcessRef(pid=pid, start_time=None, cmdline="")


def is_alive(ref: ProcessRef) -> bool:
    """Whether the process ``ref`` names still runs (same PID *and* start time, not a zombie)."""
    now = process_ref(ref.pid)
    if now is None:
        return False
    return ref.start_time is None or now.start_time == ref.start_time


def _children_map() -> dict[int, list[int]]:
    """Map parent PID -> child PIDs of every visible process."""
    children: dict[int, list[int]] = {}
    if _has_proc():
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            stat = _read_stat(int(entry.name))
            if stat is not None:
                children.setdefault(stat[1], []).append(int(entry.name))
        return children
    try:  # POSIX fallback (macOS): ps is always there
        out = subprocess.run(
            ["ps", "-A", "-o", "pid=", "-o", "ppid="],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return children
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            children.setdefault(int(parts[1]), []).append(int(parts[0]))
    return children


def descendants(pid: int) -> list[ProcessRef]:
    """Every live descendant of ``pid`` (children, grandchildren, ...), parents first."""
    children = _children_map()
    out: list[ProcessRef] = []
    queue = list(children.get(pid, []))
    seen: set[int] = {pid}
    while queue:
        child = queue.pop(0)
        if child in seen:
            continue
        seen.add(child)
        ref = process_ref(child)
        if ref is not None:
            out.append(ref)
        queue.extend(children.get(child, []))
    return out


def _signal_ref(ref: ProcessRef, sig: int) -> None:
    if not is_alive(ref):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(ref.pid, sig)


_INTERRUPTS: Final[tuple[signal.Signals, ...]] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def _deferred_interrupts() -> Iterator[None]:
    """Hold SIGINT/SIGTERM/SIGHUP until the block is done, then act on them as before.

    Each is given a handler that only records it; on leaving, the previous handlers are put
    back and a recorded signal is handed to its previous handler (a Python handler is called,
    e.g. raising KeyboardInterrupt; ignored stays ignored; a default disposition is re-raised
    with :func:`signal.raise_signal`). Main thread only (elsewhere a no-op, as Python only
    handles signals there).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous: dict[int, Any] = {}

    def record(signum: int, frame: FrameType | None) -> None:
        caught.append(signum)

    for sig in _INTERRUPTS:
        if signal.getsignal(sig) is None:  # a handler not set from Python: cannot be restored
            continue
        with contextlib.suppress(ValueError, OSError):
            previous[sig] = signal.signal(sig, record)
    try:
        yield
    finally:
        for sig, old in previous.items():
            with contextlib.suppress(ValueError, OSError):
                signal.signal(sig, old)
        for signum in dict.fromkeys(caught):
            old = previous.get(signum)
            if callable(old):
                old(signum, None)
            elif old == signal.SIG_DFL:
                signal.raise_signal(signum)


@dataclass
class ManagedProcess:
    """A process this launcher started, in its own session/process group."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]
    ref: ProcessRef
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        """Process id (also the id of its process group and session)."""
        return self.popen.pid

    def running(self) -> bool:
        """Whether it has not exited yet (reaps it if it has)."""
        return self.popen.poll() is None

    def log_text(self) -> str:
        """The process log so far (ANSI colours stripped)."""
        try:
            return _ANSI_RE.sub("", self.log_path.read_text(errors="replace"))
        except OSError:
            return ""

    def log_tail(self, lines: int = 20) -> str:
        """The last ``lines`` lines of its log."""
        return "\n".join(self.log_text().splitlines()[-lines:])


class ProcessRegistry:
    """Owns every process a deployment starts, plus every descendant it has ever seen.

    :meth:`snapshot` (called often while a run is going) remembers the descendants of the
    managed processes, identified by (PID, start time), so that :meth:`stop_all` can kill even
    helpers that have left the process group (Flower's SuperLink starts its SuperExec in a new
    session) or have been re-parented after their parent died. The registry is also hooked into
    :mod:`atexit`, so an interpreter that exits without calling :meth:`stop_all` still cleans up.
    """

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self._lock = threading.RLock()
        self.processes: list[ManagedProcess] = []
        self.seen: dict[tuple[int, int | None], ProcessRef] = {}
        self.env: dict[str, str] = dict(env) if env is not None else {}
        self._closed = False
        atexit.register(self.stop_all)

    # ------------------------------------------------------------------ start
    def start(
        self,
        name: str,
        cmd: Sequence[str],
        log_path: Path,
        *,
        cwd: Path | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> ManagedProcess:
        """Start ``cmd`` in a new session with stdout+stderr appended to ``log_path``.

        Raises
        ------
        LauncherError
            If the registry was already stopped, or the executable cannot be started.
        """
        with self._lock:
            if self._closed:
                raise LauncherError("process registry is already stopped")
            log_path.parent.mkdir(parents=True, exist_ok=True)
            log_file = log_path.open("ab")
            log_file.write(f"$ {' '.join(cmd)}\n".encode())
            log_file.flush()
            env = flower_env(self.env)
            # An interrupt between fork and bookkeeping would leave an untracked process:
            # Ctrl-C/SIGTERM/SIGHUP wait until the new process is registered.
            with _deferred_interrupts():
                try:
                    popen = subprocess.Popen(
                        list(cmd),
                        stdin=subprocess.DEVNULL,
                        stdout=log_file,
                        stderr=subprocess.STDOUT,
                        env=env,
                        cwd=str(cwd) if cwd is not None else None,
                        start_new_session=True,
                    )
                except OSError as exc:
                    log_file.close()
                    raise LauncherError(f"cannot start {name} ({cmd[0]}): {exc}") from exc
                ref = process_ref(popen.pid) or ProcessRef(popen.pid, None, " ".join(cmd))
                proc = ManagedProcess(name, popen, log_path, log_file, ref, dict(meta or {}))
                self.processes.append(proc)
                self.seen[(ref.pid, ref.start_time)] = ref
            logger.debug("started %s (pid %d): %s", name, popen.pid, " ".join(cmd))
            return proc

    # ------------------------------------------------------------------ bookkeeping
    def snapshot(self) -> None:
        """Remember every current descendant of every managed process."""
        with self._lock:
            for proc in self.processes:
                if not proc.running():
                    continue
                for ref in descendants(proc.pid):
                    self.seen.setdefault((ref.pid, ref.start_time), ref)

    def all_seen(self) -> list[ProcessRef]:
        """Every process (managed or descendant) observed so far."""
        with self._lock:
            return list(self.seen.values())

    def leftovers(self) -> list[ProcessRef]:
        """Processes observed so far that are still alive."""
        return [ref for ref in self.all_seen() if is_alive(ref)]

    # ------------------------------------------------------------------ stop
    def kill_tree(self, proc: ManagedProcess, sig: int = signal.SIGKILL) -> list[ProcessRef]:
        """Send ``sig`` to ``proc``, its process group and every descendant; reap it if killed.

        Returns the processes that were signalled (``proc`` first).
        """
        with self._lock:
            tree = [proc.ref, *descendants(proc.pid)] if proc.running() else []
            for ref in tree:
                self.seen.setdefault((ref.pid, ref.start_time), ref)
            if proc.running():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, sig)
            for ref in tree:
                _signal_ref(ref, sig)
            if sig == signal.SIGKILL:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.popen.wait(timeout=10)
            return tree

    def stop(self, proc: ManagedProcess, grace: float = 5.0) -> None:
        """SIGTERM ``proc``'s group, wait up to ``grace`` seconds, then SIGKILL its whole tree."""
        with self._lock:
            tree = [proc.ref, *descendants(proc.pid)] if proc.running() else []
            for ref in tree:
                self.seen.setdefault((ref.pid, ref.start_time), ref)
            if proc.running():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=grace)
            if proc.running():
                logger.warning("%s (pid %d) ignored SIGTERM; killing it", proc.name, proc.pid)
            self.kill_tree(proc, signal.SIGKILL)
            for ref in tree:
                _signal_ref(ref, signal.SIGKILL)
            self._close_log(proc)

    def stop_all(self, grace: float = 5.0) -> None:
        """Stop every managed process and kill every remembered descendant.

        All process groups get SIGTERM at once (newest first, so ``flwr run`` and the SuperNodes
        go before the SuperLink); after at most ``grace`` seconds in total whatever is left,
        and every descendant ever seen, gets SIGKILL. Idempotent; also registered with
        :mod:`atexit`.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self.snapshot()
            running = [p for p in reversed(self.processes) if p.running()]
            for proc in running:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while any(p.running() for p in running) and time.monotonic() < deadline:
                time.sleep(0.1)
            for proc in running:
                if proc.running():
                    logger.info("%s (pid %d) outlived SIGTERM; killing it", proc.name, proc.pid)
                self.kill_tree(proc, signal.SIGKILL)
            deadline = time.monotonic() + grace
            while (left := self.leftovers()) and time.monotonic() < deadline:
                for ref in left:
                    _signal_ref(ref, signal.SIGKILL)
                time.sleep(0.1)
            for proc in self.processes:
                self._close_log(proc)
            if left:
                logger.error(
                    "processes still alive after cleanup: %s",
                    ", ".join(f"{r.pid} ({r.cmdline[:60]})" for r in left),
                )
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop_all)

    @staticmethod
    def _close_log(proc: ManagedProcess) -> None:
        with contextlib.suppress(OSError):
            proc.log_file.close()


# ====================================================================== Flower executables
def flower_executable(name: str) -> str:
    """Absolute path of a Flower console script, preferring the running interpreter's ``bin``.

    Raises
    ------
    LauncherError
        If the script is not installed.
    """
    local = Path(sys.executable).parent / name
    if local.exists() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which(name)
    if found is None:
        raise LauncherError(f"`{name}` not found: install flwr 1.41 (pip install 'flwr==1.41.*')")
    return found


def write_connection(
    flwr_home: Path, address: str, name: str = CONNECTION_NAME, *, insecure: bool = True
) -> Path:
    """Write ``FLWR_HOME/config.toml`` with one SuperLink connection, made the default.

    The file format is Flower 1.41's: ``[superlink] default = name`` and
    ``[superlink.<name>] address = "host:port"`` (``":local:"`` for the managed simulation
    SuperLink) plus ``insecure = true``.
    """
    flwr_home.mkdir(parents=True, exist_ok=True)
    conn: dict[str, Any] = {"address": address}
    if insecure:
        conn["insecure"] = True
    path = flwr_home / "config.toml"
    path.write_text(tomli_w.dumps({"superlink": {"default": name, name: conn}}))
    return path


def _http_ok(url: str, timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return 200 <= resp.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


# ====================================================================== deployment
class LocalDeployment:
    """One SuperLink and ``num_supernodes`` SuperNodes on loopback, each in its own session.

    Use as a context manager; leaving it (normally or by an exception) stops everything.

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
        if not simulation and num_supernodes < 1:
            raise ValueError(f"num_supernodes must be >= 1, got {num_supernodes}")
        if not ready_timeout > 0:
            raise ValueError(f"ready_timeout must be > 0, got {ready_timeout}")
        self.num_supernodes = num_supernodes
        self.logs_dir = Path(logs_dir)
        self.flwr_home = Path(flwr_home)
        self.ready_timeout = float(ready_timeout)
        self.node_config = dict(node_config or {})
        self.simulation = simulation
        self.host = host
        self.registry = ProcessRegistry(env={"FLWR_HOME": str(self.flwr_home)})
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
    def start(self, attempts: int = 3) -> None:
        """Start the SuperLink, then the SuperNodes, and wait until all are usable.

        Raises
        ------
        LauncherError
            If a process exits during start-up or is not ready within ``ready_timeout``.
        """
        self.flwr_home.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
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
            self._start_supernode(partition, attempts)
        if self.num_supernodes:
            self.wait_registered()
        self.registry.snapshot()

    def _start_superlink(self, attempts: int) -> None:
        """Start the SuperLink on a free port; retry on another port if that one was taken."""
        exe = flower_executable("flower-superlink")
        for attempt in range(1, attempts + 1):
            (port,) = free_ports(1, self.host)
            cmd = [
                exe,
                "--insecure",
                "--disable-runtime-dependency-installation",
                "--host",
                self.host,
                "--port",
                str(port),
            ]
            if self.simulation:
                cmd.append("--simulation")
            proc = self.registry.start(
                "superlink", cmd, self.logs_dir / "superlink.log", meta={"port": port}
            )
            deadline = time.monotonic() + self.ready_timeout
            while time.monotonic() < deadline:
                if not proc.running():
                    break
                if _http_ok(f"http://{self.host}:{port}/health"):
                    self.superlink, self.superlink_port = proc, port
                    logger.info("SuperLink ready on %s:%d (pid %d)", self.host, port, proc.pid)
                    return
                time.sleep(0.2)
            tail = proc.log_tail()
            self.registry.stop(proc, grace=2.0)
            if attempt < attempts and any(s in tail.lower() for s in _ADDR_IN_USE):
                logger.warning("SuperLink port %d was taken; retrying on another port", port)
                continue
            raise LauncherError(
                f"SuperLink did not become ready (port {port}); last log lines:\n{tail}"
            )

    def _start_supernode(self, partition: int, attempts: int) -> None:
        """Start the SuperNode of ``partition`` on a free Runtime API port (retried if taken)."""
        exe = flower_executable("flower-supernode")
        cfg = {"partition-id": partition, "num-partitions": self.num_supernodes}
        cfg.update(self.node_config)
        node_config = format_config_args(cfg)
        for attempt in range(1, attempts + 1):
            (port,) = free_ports(1, self.host)
            cmd = [
                exe,
                "--insecure",
                "--superlink",
                self.address,
                "--host",
                self.host,
                "--port",
                str(port),
                "--node-config",
                node_config,
            ]
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
                if "Uvicorn running" in proc.log_text() or _NODE_ID_RE.search(proc.log_text()):
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
        """Wait until every SuperNode has logged its node id and is ``online`` at the SuperLink.

        Returns
        -------
        dict[int, int]
            ``partition-id -> node id``.

        Raises
        ------
        LauncherError
            If a SuperNode exits, or they are not all online within ``ready_timeout``.
        """
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            for partition, proc in self.supernodes.items():
                if not proc.running():
                    raise LauncherError(
                        f"SuperNode {partition} exited during start-up (code "
                        f"{proc.popen.returncode}); last log lines:\n{proc.log_tail()}"
                    )
                if partition not in self.node_ids and (m := _NODE_ID_RE.search(proc.log_text())):
                    self.node_ids[partition] = int(m.group(1))
            if len(self.node_ids) == len(self.supernodes):
                online = self.online_node_ids()
                if online is not None and set(self.node_ids.values()) <= online:
                    logger.info("%d SuperNodes online", len(self.node_ids))
                    return dict(self.node_ids)
            time.sleep(0.5)
        missing = sorted(set(self.supernodes) - set(self.node_ids))
        raise LauncherError(
            f"SuperNodes not online within {self.ready_timeout:.0f} s "
            f"(no node id yet for partitions {missing}); see logs in {self.logs_dir}"
        )

    def online_node_ids(self) -> set[int] | None:
        """Node ids the SuperLink lists as ``online`` (``flwr supernode list``), None on error."""
        res = self.flwr("supernode", "list", CONNECTION_NAME, "--format", "json", timeout=60)
        payload = _json_from_output(res.stdout)
        if res.returncode != 0 or payload is None:
            logger.debug("flwr supernode list failed: %s", res.stdout + res.stderr)
            return None
        return {
            int(node["node-id"])
            for node in payload.get("nodes", [])
            if str(node.get("status", "")).lower() == "online"
        }

    # ------------------------------------------------------------------ operations
    def flwr(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """Run a ``flwr`` CLI command against this deployment (captured output)."""
        cmd = [flower_executable("flwr"), *args]
        try:
            return subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                env=self.env,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            return subprocess.CompletedProcess(cmd, 124, str(exc.stdout or ""), "timed out")

    def run_status(self, run_id: int) -> tuple[str | None, str | None]:
        """``(status, details)`` of a run from ``flwr ls --run-id``, ``(None, None)`` on error."""
        res = self.flwr(
            "ls", CONNECTION_NAME, "--run-id", str(run_id), "--format", "json", timeout=60
        )
        payload = _json_from_output(res.stdout)
        if res.returncode != 0 or payload is None or not payload.get("runs"):
            return None, None
        run = payload["runs"][0]
        return str(run.get("status")), str(run.get("status-details"))

    def stop_run(self, run_id: int) -> None:
        """Ask the SuperLink to stop a run (best effort)."""
        res = self.flwr("stop", str(run_id), CONNECTION_NAME, timeout=60)
        if res.returncode != 0:
            logger.warning("flwr stop %d failed: %s", run_id, (res.stdout + res.stderr)[-500:])

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


# ====================================================================== config helpers
def _toml_scalar(value: Any) -> str:
    text = tomli_w.dumps({"v": value}).strip()
    return text.split("=", 1)[1].strip()


def format_config_args(config: Mapping[str, Any]) -> str:
    """Format ``{k: v}`` as Flower's ``"k1=v1 k2=v2"`` with TOML values (strings quoted).

    Raises
    ------
    ValueError
        If a key is empty or has whitespace/``=``, or a string value has a double quote
        or whitespace would break Flower's parser (use a TOML file for such values).
    """
    parts = []
    for key, value in config.items():
        if not isinstance(key, str) or not key or re.search(r"[\s=]", key):
            raise ValueError(f"invalid config key {key!r}")
        if isinstance(value, str) and '"' in value:
            raise ValueError(f"config value of {key!r} must not contain a double quote")
        if not isinstance(value, bool | int | float | str):
            raise TypeError(f"config value of {key!r} must be bool/int/float/str, got {value!r}")
        parts.append(f"{key}={_toml_scalar(value)}")
    return " ".join(parts)


def parse_config_string(text: str) -> dict[str, Any]:
    """Parse ``"k1=v1 k2=v2"`` (TOML values, like ``flwr run --run-config``) or a ``.toml`` path.

    Raises
    ------
    ValueError
        If the string is not in that format.
    """
    import tomllib

    text = text.strip()
    if not text:
        return {}
    if text.endswith(".toml"):
        path = Path(text).expanduser()
        if not path.is_file():
            raise ValueError(f"run-config file not found: {path}")
        with path.open("rb") as fh:
            loaded = tomllib.load(fh)
        return _flatten(loaded)
    pattern = re.compile(r"(\S+?)=('[^']*'|\"[^\"]*\"|\S+)")
    matches = pattern.findall(text)
    leftover = pattern.sub("", text).strip()
    if leftover or not matches:
        raise ValueError(
            f"run config must be space-separated key=value pairs (TOML values, strings "
            f"quoted), e.g. 'epsilon=0.5 cr-mode=\"derived\"'; could not parse {text!r}"
        )
    out: dict[str, Any] = {}
    for key, raw in matches:
        try:
            out[key] = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            # Flower accepts only TOML values; an unquoted word is a string the user meant.
            if re.fullmatch(r"[A-Za-z_][\w.\-/]*", raw):
                out[key] = raw
            else:
                raise ValueError(f"invalid TOML value for {key!r}: {raw!r}") from None
    return out


def _flatten(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in table.items():
        name = f"{prefix}.{key}" if prefix else key
        if isinstance(value, Mapping):
            out.update(_flatten(value, name))
        else:
            out[name] = value
    return out


def _json_from_output(text: str) -> dict[str, Any] | None:
    """The JSON object in a ``flwr ... --format json`` output (may follow other lines)."""
    start = text.find("{")
    if start < 0:
        return None
    try:
        obj, _ = json.JSONDecoder().raw_decode(text[start:])
    except json.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


# ====================================================================== following a run
class JsonlTail:
    """Incrementally read complete lines of a growing JSON-lines file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def read_new(self) -> list[dict[str, Any]]:
        """Records appended since the last call (a torn last line waits for the next call)."""
        try:
            with self.path.open("rb") as fh:
                fh.seek(self._offset)
                chunk = fh.read()
        except FileNotFoundError:
            return []
        self._offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        out = []
        for line in lines:
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                logger.warning("skipping malformed line in %s: %r", self.path, line[:200])
                continue
            if isinstance(rec, dict):
                out.append(rec)
        return out


@dataclass
class RunProgress:
    """What a progress display needs; updated in place while a run goes on."""

    phase: str = "starting"
    """``starting`` -> ``ready`` -> ``running`` -> ``finished`` | ``failed``."""
    run_id: int | None = None
    num_rounds: int | None = None
    current_round: int = 0
    last_stage: str | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    killed: list[KilledNode] = field(default_factory=list)
    node_ids: dict[int, int] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    message: str = ""
    num_clients: int = 0
    """SuperNodes deployed (virtual ones in a simulation)."""
    stage_drops: list[tuple[int, str, int]] = field(default_factory=list)
    """``(round, stage, node id)`` of every drop a ``stage_end`` event reported, in order (the
    reason comes with the round's ``metrics.jsonl`` row)."""

    @property
    def elapsed(self) -> float:
        """Seconds since the launcher started."""
        return time.monotonic() - self.started

    @property
    def finished_round(self) -> int:
        """The last round with a ``metrics.jsonl`` row (0 before the first)."""
        return max((_as_int(m.get("round")) or 0 for m in self.metrics), default=0)

    def active_nodes(self) -> int | None:
        """Nodes taking part, as the ServerApp reports them (None before anything is known).

        With ``S`` the nodes sampled in the last finished round and ``D`` the nodes dropped in
        it (its ``metrics.jsonl`` row), and ``D'`` the nodes the ``stage_end`` events of the
        rounds after it have dropped so far: ``S - |D| - |D' \\ D|``. Before the first row,
        ``S`` is the number of SuperNodes deployed (the launcher waits for all of them). A node
        dropped again after it was dropped in the last round is not counted twice; a killed
        node the SuperLink no longer lists is not sampled, and stays uncounted.
        """
        done = self.finished_round
        rows = [m for m in self.metrics if (_as_int(m.get("round")) or 0) == done]
        if rows:
            last = rows[-1]
            before = _dropped_ids(last.get("dropped"))
            sampled = _as_int(last.get("sampled"))
            base = (
                sampled - len(before) if sampled is not None else _count(last.get("participants"))
            )
        else:
            before, base = set(), (self.num_clients or None)
        if base is None:
            return None
        since = {nid for rnd, _, nid in self.stage_drops if rnd > done} - before
        return max(0, base - len(since))

    def drop_count(self) -> int:
        """Drops in the run so far: every finished round's ``dropped`` plus the drops the
        ``stage_end`` events of the round in flight have reported."""
        done = self.finished_round
        finished = sum(len(_dropped_ids(m.get("dropped"))) for m in self.metrics)
        return finished + sum(1 for rnd, _, _ in self.stage_drops if rnd > done)


def _dropped_ids(value: Any) -> set[int]:
    """Node ids of a ``dropped`` field (a ``{node: reason}`` dict or a list of ids)."""
    items = value.keys() if isinstance(value, Mapping) else value if isinstance(value, list) else []
    return {n for n in (_as_int(item) for item in items) if n is not None}


def _count(value: Any) -> int | None:
    """A count field that may be a number or a list (``participants``)."""
    return len(value) if isinstance(value, list) else _as_int(value)


@dataclass
class RunResult:
    """Outcome of :func:`run_local` / :func:`run_simulation`."""

    ok: bool
    reason: str
    out_dir: Path
    run_id: int | None
    status: str | None
    events: list[dict[str, Any]]
    metrics: list[dict[str, Any]]
    summary: dict[str, Any] | None
    killed: list[KilledNode]
    node_ids: dict[int, int]
    processes: list[ProcessRef]
    """Every process the deployment started or saw below one (for leak checks)."""
    logs_dir: Path | None
    """Where the logs are (None if they were removed after a successful run)."""
    wall_seconds: float
    exit_code: int

    def leftover_processes(self) -> list[ProcessRef]:
        """Processes of this run still alive (should be empty)."""
        return [ref for ref in self.processes if is_alive(ref)]


@dataclass(frozen=True)
class LocalRunOptions:
    """Everything :func:`run_local` needs.

    Attributes
    ----------
    app_dir : Path
        The Flower app (folder with ``pyproject.toml``).
    out_dir : Path
        Output folder; becomes the run config's ``out_key`` (absolute) and holds ``logs/``.
    num_clients : int
        SuperNodes (deployment) or virtual SuperNodes (simulation).
    run_config : Mapping[str, Any]
        Run-config overrides (already merged); ``out_key`` is set here.
    kills : tuple[KillSpec, ...]
        Faults to inject (deployment only).
    kill_delay : float
        Seconds after a ``round_start`` event before the kill.
    timeout : float
        Seconds the run may take from ``flwr run`` to its end (all rounds); after that it is
        stopped (``flwr stop``) and counted as failed.
    ready_timeout : float
        Seconds for start-up (SuperLink health, all SuperNodes online), on top of ``timeout``.
    keep_logs : bool
        Keep ``out_dir/logs`` after a successful run (always kept after a failure).
    node_config : Mapping[str, Any]
        Extra node config for every SuperNode.
    federation_config : Mapping[str, Any]
        Extra ``--federation-config`` entries (simulation only).
    flwr_home : Path | None
        ``FLWR_HOME`` to use (a fresh temporary folder, removed at the end, when None).
    out_key : str
        Run-config key that tells the ServerApp where to write its files.
    require_summary : bool
        Count a run without ``summary.json`` as failed.
    """

    app_dir: Path
    out_dir: Path
    num_clients: int = 4
    run_config: Mapping[str, Any] = field(default_factory=dict)
    kills: tuple[KillSpec, ...] = ()
    kill_delay: float = 1.0
    timeout: float = 1800.0
    ready_timeout: float = 120.0
    keep_logs: bool = False
    node_config: Mapping[str, Any] = field(default_factory=dict)
    federation_config: Mapping[str, Any] = field(default_factory=dict)
    flwr_home: Path | None = None
    out_key: str = "out-dir"
    require_summary: bool = True

    def validate(self, *, simulation: bool = False) -> None:
        """Raise ValueError/TypeError on an inconsistent option set."""
        if not (Path(self.app_dir) / "pyproject.toml").is_file():
            raise ValueError(f"app_dir has no pyproject.toml: {self.app_dir}")
        if isinstance(self.num_clients, bool) or not isinstance(self.num_clients, int):
            raise TypeError(f"num_clients must be an int, got {type(self.num_clients).__name__}")
        if self.num_clients < 1:
            raise ValueError(f"num_clients must be >= 1, got {self.num_clients}")
        for name in ("timeout", "ready_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.kill_delay < 0:
            raise ValueError(f"kill_delay must be >= 0, got {self.kill_delay}")
        for kill in self.kills:
            if not isinstance(kill, KillSpec):
                raise TypeError(f"kills must be KillSpec, got {type(kill).__name__}")
            if kill.partition >= self.num_clients:
                raise ValueError(
                    f"cannot kill partition {kill.partition}: only {self.num_clients} clients "
                    f"(partitions 0..{self.num_clients - 1})"
                )
        out = Path(self.out_dir).expanduser()
        reused = [n for n in RUN_FILES if (out / n).exists()]
        if reused:
            raise ValueError(
                f"out_dir {out} already holds a run ({', '.join(reused)}); choose a new folder"
            )
        if simulation and self.kills:
            raise ValueError("--kill-client needs real SuperNodes (use `local`, not `simulate`)")
        if self.out_key in self.run_config and str(self.run_config[self.out_key]) != str(
            Path(self.out_dir).resolve()
        ):
            raise ValueError(f"run_config[{self.out_key!r}] conflicts with out_dir")
        self._check_feasible(simulation=simulation)
        if simulation and (missing := simulation_extra_missing()) is not None:
            raise MissingDependencyError(missing)

    def nodes(self, *, simulation: bool = False) -> int:
        """SuperNodes the run gets: ``num_clients``, or the simulation's ``num-supernodes``."""
        if simulation:
            value = _as_int(self.federation_config.get("num-supernodes"))
            if value is not None:
                return value
        return self.num_clients

    def _check_feasible(self, *, simulation: bool) -> None:
        """Refuse settings no run can satisfy, before anything starts.

        The effective run config is the app's ``[tool.flwr.app.config]`` overridden by
        ``run_config``. Where the app declares them, ``min-clients`` (nodes the ServerApp waits
        for), ``clients-per-round`` (nodes sampled per round, 0 = all) and ``num-rounds`` are
        checked against the ``N`` SuperNodes and the ``--kill-client`` rounds.

        Raises
        ------
        ValueError
            Naming the setting, the number it conflicts with and the fix.
        """
        flag = "--federation-config num-supernodes" if simulation else "--clients"
        n = self.nodes(simulation=simulation)
        if n < 1:
            raise ValueError(f"{flag} must be >= 1, got {n}")
        effective = {**app_config(self.app_dir), **self.run_config}
        min_clients = _as_int(effective.get("min-clients"))
        if min_clients is not None and n < min_clients:
            raise ValueError(
                f"{flag} {n} is fewer than min-clients = {min_clients}: the ServerApp would wait "
                f"for nodes that never come; use {flag} {min_clients} or more, or "
                f'--run-config "min-clients={n}"'
            )
        per_round = _as_int(effective.get("clients-per-round"))
        if per_round is not None and per_round > n:
            raise ValueError(
                f"clients-per-round = {per_round} but only {n} SuperNodes ({flag} {n}): use "
                f"{flag} {per_round} or more, or clients-per-round <= {n} (0 = all of them)"
            )
        rounds = _as_int(effective.get("num-rounds"))
        late = [k for k in self.kills if rounds is not None and k.round > rounds]
        if late:
            raise ValueError(
                f"--kill-client {late[0].partition}@{late[0].round}: the run has only {rounds} "
                f"round(s), so this kill would never happen; use a round in 1..{rounds}"
            )


SIMULATION_INSTALL_HINT: Final[str] = 'pip install -e ".[tools,simulation]"'
"""How to install the simulation extra in a checkout of this repository."""


def _module_available(name: str) -> bool:
    """Whether ``import name`` would find the module (without importing it)."""
    return importlib.util.find_spec(name) is not None


def simulation_extra_missing() -> str | None:
    """Why Flower's simulation runtime cannot start here, or None if it can.

    Flower 1.41's ``run_simulation`` checks ``importlib.util.find_spec("ray")`` in the process
    it spawns (same interpreter as ours: :func:`flower_executable` prefers its ``bin``) and
    exits with code 701 (``SIMULATION_MISSING_EXTRA``) if Ray is missing; ``flwr run`` then
    only reports an unknown error. The same check, made here, fails before anything starts.
    """
    if _module_available("ray"):
        return None
    return (
        "the simulation runtime needs Ray (the [simulation] extra), which is not installed for "
        f"{sys.executable}: run {SIMULATION_INSTALL_HINT} in the repository "
        '(or pip install "flwr[simulation]==1.41.*"), or use `corbin-fl local`'
    )


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM/SIGHUP/SIGINT into KeyboardInterrupt while running (main thread only).

    SIGINT is taken over too when it is ignored (or at its default), not only when Python's
    own handler is in place: a program started in the background of a non-interactive shell
    (``corbin-fl local &`` in a script) inherits SIGINT ignored, and ``kill -INT`` would then
    do nothing. An embedding program's own SIGINT handler is left alone.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError, OSError):
            previous[sig] = signal.signal(sig, handler)
    if signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, signal.SIG_DFL, None):
        with contextlib.suppress(ValueError, OSError):
            previous[signal.SIGINT] = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            with contextlib.suppress(ValueError, OSError):
                signal.signal(sig, old)


def node_policy(run_config: Mapping[str, Any]) -> dict[str, Any]:
    """The privacy policy of the SuperNodes this launcher starts (``client/policy.py``).

    The user who runs ``corbin-fl local`` / ``simulate`` operates the server and every node at
    once, so the nodes admit exactly the run's mechanism, ``epsilon`` and ``delta`` and nothing
    weaker; ``--node-config`` entries override these. Nodes started by anyone else (compose
    files, separate machines) keep their own policy.
    """
    out: dict[str, Any] = {}
    if "mechanism" in run_config:
        out["corbin-mechanisms"] = str(run_config["mechanism"])
    if "epsilon" in run_config:
        out["corbin-max-epsilon"] = float(run_config["epsilon"])
    if "delta" in run_config:
        out["corbin-max-delta"] = float(run_config["delta"])
    return out


def policy_env(node_config: Mapping[str, Any]) -> dict[str, str]:
    """The ``CORBIN_*`` environment variables of the ``corbin-*`` keys of ``node_config``."""
    return {
        key.upper().replace("-", "_"): str(value)
        for key, value in node_config.items()
        if key.startswith("corbin-")
    }


def run_local(
    options: LocalRunOptions,
    progress: Callable[[RunProgress], None] | None = None,
) -> RunResult:
    """Deploy the app on loopback with real SuperLink/SuperNode processes and run it once.

    Steps: start the SuperLink on a free port (``/health`` readiness), start one SuperNode per
    client (each on its own free Runtime API port, ``partition-id=i num-partitions=N``), wait
    until all are ``online``, write the ``FLWR_HOME`` connection, ``flwr run <app> <conn>
    --stream --run-config <out_dir>/run-config.toml``, follow ``events.jsonl``/``metrics.jsonl``
    (calling ``progress`` about four times a second), SIGKILL the scheduled SuperNodes, and stop
    every process at the end.

    Returns
    -------
    RunResult
        ``ok`` is True iff ``flwr run`` exited 0, Flower reports ``finished:completed`` and (with
        ``require_summary``) ``summary.json`` exists. Never raises for a failed run, only for
        invalid options or an interrupt (KeyboardInterrupt propagates after cleanup).
    """
    options.validate()
    return _run(options, progress, simulation=False)


def run_simulation(
    options: LocalRunOptions,
    progress: Callable[[RunProgress], None] | None = None,
) -> RunResult:
    """Run the app on Flower's simulation runtime (Ray) with ``num_clients`` virtual SuperNodes.

    The managed simulation SuperLink that ``flwr run`` would start detached for a ``:local:``
    connection is started by us instead (same flags, but on a free port announced to ``flwr``
    through ``FLWR_LOCAL_SUPERLINK_HTTP_API_PORT``), so it is stopped at the end like every
    other process. ``--federation-config "num-supernodes=N ..."`` sizes the federation.
    """
    options.validate(simulation=True)
    return _run(options, progress, simulation=True)


def _run(
    options: LocalRunOptions,
    progress: Callable[[RunProgress], None] | None,
    *,
    simulation: bool,
) -> RunResult:
    """Shared body of :func:`run_local` and :func:`run_simulation` (cleanup in ``finally``)."""
    t0 = time.monotonic()
    out_dir = Path(options.out_dir).expanduser().resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    logs_dir = out_dir / "logs"
    logs_dir.mkdir(parents=True, exist_ok=True)
    own_home = options.flwr_home is None
    flwr_home = (
        Path(options.flwr_home)
        if options.flwr_home is not None
        else Path(tempfile.mkdtemp(prefix="corbin-fl-home-"))
    )
    rounds = options.run_config.get("num-rounds", app_config(options.app_dir).get("num-rounds"))
    state = RunProgress(
        num_rounds=_as_int(rounds), num_clients=options.nodes(simulation=simulation)
    )
    run_config = {**options.run_config, options.out_key: str(out_dir)}
    run_config_path = out_dir / "run-config.toml"
    run_config_path.write_text(tomli_w.dumps(run_config))

    def notify() -> None:
        if progress is not None:
            try:
                progress(state)
            except Exception:  # a broken display must not break the run
                logger.exception("progress callback failed")

    policy = node_policy({**app_config(options.app_dir, strict=False), **options.run_config})
    deployment = LocalDeployment(
        0 if simulation else options.num_clients,
        logs_dir,
        flwr_home,
        ready_timeout=options.ready_timeout,
        node_config={**policy, **options.node_config},
        simulation=simulation,
    )
    if simulation:  # the simulation's virtual nodes have no node config: the environment
        deployment.registry.env.update(policy_env({**policy, **options.node_config}))
    reason = "completed"
    ok = False
    status: str | None = None
    interrupted = False
    summary: dict[str, Any] | None = None
    try:
        with _terminate_as_interrupt():
            notify()
            try:
                deployment.start()
            except LauncherError as exc:
                reason = f"start-up failed: {exc}"
                raise _StartupError from exc
            state.node_ids = dict(deployment.node_ids)
            state.phase = "ready"
            notify()
            reason, ok, status = _submit_and_follow(
                deployment, options, state, run_config_path, notify, simulation=simulation
            )
    except _StartupError:
        ok = False
    except KeyboardInterrupt:
        interrupted = True
        reason = "interrupted"
        ok = False
        raise
    finally:
        state.phase = "stopping"
        notify()
        deployment.registry.snapshot()
        deployment.close()
        processes = deployment.registry.all_seen()
        if simulation:
            _stop_stray_simulation_superlinks(flwr_home)
        summary = _read_json(out_dir / "summary.json")
        if ok and options.require_summary and summary is None:
            ok, reason = False, "the ServerApp wrote no summary.json"
        state.phase = "finished" if ok else "failed"
        state.message = reason
        notify()
        if own_home:
            shutil.rmtree(flwr_home, ignore_errors=True)
        keep = options.keep_logs or not ok or interrupted
        if not keep:
            shutil.rmtree(logs_dir, ignore_errors=True)
        else:
            logger.info("process logs kept in %s", logs_dir)
    return RunResult(
        ok=ok,
        reason=reason,
        out_dir=out_dir,
        run_id=state.run_id,
        status=status,
        events=list(state.events),
        metrics=list(state.metrics),
        summary=summary,
        killed=list(state.killed),
        node_ids=dict(state.node_ids),
        processes=processes,
        logs_dir=logs_dir if keep else None,
        wall_seconds=time.monotonic() - t0,
        exit_code=0 if ok else 1,
    )


class _StartupError(Exception):
    """Internal: start-up failed, the reason is already recorded."""


def _submit_and_follow(
    deployment: LocalDeployment,
    options: LocalRunOptions,
    state: RunProgress,
    run_config_path: Path,
    notify: Callable[[], None],
    *,
    simulation: bool,
) -> tuple[str, bool, str | None]:
    """Submit ``flwr run`` and follow it until it ends; return ``(reason, ok, status)``."""
    out_dir = run_config_path.parent
    cmd = [
        flower_executable("flwr"),
        "run",
        str(Path(options.app_dir).resolve()),
        CONNECTION_NAME,
        "--stream",
        "--run-config",
        str(run_config_path),
    ]
    if simulation:
        fed = {"num-supernodes": options.num_clients, **options.federation_config}
        cmd += ["--federation-config", format_config_args(fed)]
    flwr_run = deployment.registry.start("flwr-run", cmd, out_dir / "logs" / "flwr-run.log")
    deadline = time.monotonic() + options.timeout
    state.phase = "running"
    events = JsonlTail(out_dir / "events.jsonl")
    metrics = JsonlTail(out_dir / "metrics.jsonl")
    pending: dict[KillSpec, float | None] = dict.fromkeys(options.kills)
    last_snapshot = 0.0
    reason: str | None = None

    def poll_files() -> None:
        for ev in events.read_new():
            state.events.append(ev)
            kind = ev.get("event")
            rnd = _as_int(ev.get("round"))
            if kind == "round_start" and rnd is not None:
                state.current_round = rnd
                state.last_stage = None
                start = float(ev.get("time", time.time()))
                for spec in pending:
                    if spec.round == rnd and pending[spec] is None:
                        pending[spec] = start + options.kill_delay
            elif kind == "stage_end":
                state.last_stage = str(ev.get("stage"))
                for nid in ev.get("dropped") or []:
                    if rnd is not None and (node := _as_int(nid)) is not None:
                        state.stage_drops.append((rnd, state.last_stage, node))
        state.metrics.extend(metrics.read_new())

    while True:
        rc = flwr_run.popen.poll()
        if state.run_id is None and (m := _RUN_ID_RE.search(flwr_run.log_text())):
            state.run_id = int(m.group(1))
            logger.info("run %d submitted", state.run_id)
        poll_files()
        now = time.time()
        for spec, due in list(pending.items()):
            if due is not None and now >= due:
                del pending[spec]
                if spec.partition in deployment.supernodes:
                    state.killed.append(deployment.kill_supernode(spec.partition, spec.round))
        if time.monotonic() - last_snapshot > 1.0:
            deployment.registry.snapshot()
            last_snapshot = time.monotonic()
        notify()
        if rc is not None:
            break
        if (failure := deployment.infrastructure_failure()) is not None:
            reason = failure
            break
        if time.monotonic() > deadline:
            reason = f"timed out after {options.timeout:.0f} s"
            break
        time.sleep(0.25)

    if reason is not None:  # timeout or dead SuperLink: stop the run, then `flwr run`
        superlink = deployment.superlink
        if state.run_id is not None and superlink is not None and superlink.running():
            deployment.stop_run(state.run_id)
        deployment.registry.stop(flwr_run, grace=5.0)
    time.sleep(0.2)
    poll_files()
    if pending:
        logger.warning(
            "scheduled kills never happened: %s",
            ", ".join(f"{k.partition}@{k.round}" for k in pending),
        )
    status: str | None = None
    if state.run_id is not None and deployment.infrastructure_failure() is None:
        status_deadline = time.monotonic() + 20.0
        while True:  # the final status can lag the end of the log stream a little
            status, details = deployment.run_status(state.run_id)
            if (status is not None and status.startswith("finished")) or (
                time.monotonic() > status_deadline
            ):
                break
            time.sleep(0.5)
        if status is not None and status != COMPLETED_STATUS:
            logger.warning("run %s ended with status %s (%s)", state.run_id, status, details)
    if reason is not None:
        return reason, False, status
    rc = flwr_run.popen.returncode
    if rc != 0:
        return f"`flwr run` exited with code {rc}:\n{flwr_run.log_tail()}", False, status
    if state.run_id is None:
        return f"`flwr run` did not start a run:\n{flwr_run.log_tail()}", False, status
    if status != COMPLETED_STATUS:
        return f"run {state.run_id} ended with status {status}", False, status
    return "completed", True, status


def _stop_stray_simulation_superlinks(flwr_home: Path) -> None:
    """Kill a detached simulation SuperLink that ``flwr`` may have started for our ``FLWR_HOME``.

    ``flwr`` starts it (for a ``:local:`` connection, when nothing answers on the port) with
    ``--log-file <FLWR_HOME>/local-superlink/superlink.log``; only a ``flower-superlink`` process
    with that exact path on its command line is touched, never anything else.
    """
    if not _has_proc():
        return
    marker = str(Path(flwr_home) / "local-superlink")
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        cmd = _cmdline(pid)
        if "flower-superlink" not in cmd or marker not in cmd:
            continue
        ref = process_ref(pid)
        if ref is None:
            continue
        logger.warning("stopping a detached simulation SuperLink (pid %d)", pid)
        for item in [ref, *descendants(pid)]:
            _signal_ref(item, signal.SIGKILL)


def app_config(app_dir: str | Path, *, strict: bool = False) -> dict[str, Any]:
    """The app's run-config defaults, ``[tool.flwr.app.config]`` of its ``pyproject.toml``,
    nested tables flattened with dots as Flower does: what Flower runs with for every key not
    overridden. ``{}`` when the file or the table is missing, unless ``strict``.

    Raises
    ------
    OSError, tomllib.TOMLDecodeError
        With ``strict``, if the file cannot be read or parsed.
    LookupError
        With ``strict``, if it has no ``[tool.flwr.app.config]`` table.
    """
    path = Path(app_dir) / "pyproject.toml"
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        if strict:
            raise
        return {}
    table = doc.get("tool", {}).get("flwr", {}).get("app", {}).get("config")
    if isinstance(table, Mapping):
        return _flatten(table)
    if strict:
        raise LookupError(f"{path}: no [tool.flwr.app.config] table (not a Flower app?)")
    return {}


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        obj = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return obj if isinstance(obj, dict) else None


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """All records of a JSON-lines file (empty if it does not exist)."""
    return JsonlTail(Path(path)).read_new()


def alive_matching(needles: Iterable[str]) -> list[ProcessRef]:
    """Live processes whose command line contains any of ``needles`` (e.g. a unique port)."""
    needles = [n for n in needles if n]
    out: list[ProcessRef] = []
    if not _has_proc() or not needles:
        return out
    me = os.getpid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        cmd = _cmdline(int(entry.name))
        if cmd and any(n in cmd for n in needles):
            ref = process_ref(int(entry.name))
            if ref is not None:
                out.append(ref)
    return out
