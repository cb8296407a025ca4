"""Processes of a Flower deployment: the environment each gets, and their process trees: start,
track (``/proc``), signal and reap every process that a Flower process starts below it, whatever
happens (normal end, failure, timeout, Ctrl-C, SIGTERM, an exception in the caller, interpreter
exit).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any, Final

logger = logging.getLogger(__name__)

LOOPBACK: Final[str] = "127.0.0.1"


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


THREADS_ENV: Final[str] = "OMP_NUM_THREADS"


def thread_share(trainers: int) -> dict[str, str]:
    """``{OMP_NUM_THREADS: max(1, N // n)}`` for ``n = trainers`` processes that train at once on
    this machine's ``N`` cores (``os.cpu_count()``), or ``{}`` when the user's environment sets
    :data:`THREADS_ENV` (theirs is kept).

    torch gives every process one intra-op thread per core. ``n`` ClientApp processes of one host
    that train together then run ``n * N`` threads on ``N`` cores, and the oversubscribed
    OpenMP threads spin and switch instead of computing. On 2 cores, ``corbin-fl local`` (4
    clients, 3 rounds) took 60.7 s with this share and 82.8 s with torch's default (medians of
    3); one update of the app in a fresh process, on 2 cores busy with four real-process tests,
    took 6.7-7.0 CPU-s with torch's default and 4.0-4.6 CPU-s with one thread.
    """
    if isinstance(trainers, bool) or not isinstance(trainers, int) or trainers < 1:
        raise ValueError(f"trainers must be an int >= 1, got {trainers!r}")
    if THREADS_ENV in os.environ:
        return {}
    return {THREADS_ENV: str(max(1, (os.cpu_count() or 1) // trainers))}


_DROP_ENV: Final[tuple[str, ...]] = (
    "FLWR_INTERNAL_GRPC_CONTROL_API",
    "FLWR_INTERNAL_GRPC_FLEET_API",
)
"""Variables that would make a SuperLink open extra (fixed) gRPC ports."""


ANSI_RE: Final[re.Pattern[str]] = re.compile(r"\x1b\[[0-9;]*m")


class LauncherError(RuntimeError):
    """A local deployment could not be started, or a run could not be submitted."""


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


_TCP_LISTEN: Final[str] = "0A"
"""The state column of a listening socket in ``/proc/net/tcp`` and ``tcp6``."""


def listens_on(pid: int, port: int) -> bool | None:
    """Whether process ``pid`` holds a socket listening on TCP ``port``; None where this
    cannot be told (no ``/proc``, or its file descriptors are not readable).

    A port that :func:`free_ports` found free may be taken by another process before the
    process started on it binds it; a health check on the port may then be answered by that
    other process. Linux's ``/proc/net/tcp`` and ``tcp6`` give each listening socket's inode
    (``local_address`` ``HEXIP:HEXPORT``, state ``0A``, inode in the tenth column), and
    ``/proc/<pid>/fd`` links to ``socket:[inode]`` for each socket the process holds.
    """
    inodes: set[str] = set()
    try:
        for table in ("tcp", "tcp6"):
            with contextlib.suppress(FileNotFoundError):
                for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
                    cols = line.split()
                    listening = len(cols) > 9 and cols[3] == _TCP_LISTEN
                    if listening and int(cols[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(cols[9])
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except (OSError, ValueError, IndexError):
        return None
    held = set()
    for fd in fds:
        with contextlib.suppress(OSError):
            held.add(os.readlink(fd))
    return any(f"socket:[{inode}]" in held for inode in inodes)


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


def cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def has_proc() -> bool:
    return Path("/proc/self/stat").exists()


def process_ref(pid: int) -> ProcessRef | None:
    """Identify a live process, or None if it does not exist (or is a zombie)."""
    if has_proc():
        stat = _read_stat(pid)
        if stat is None or stat[0] in ("Z", "X"):
            return None
        return ProcessRef(pid=pid, start_time=stat[2], cmdline=cmdline(pid))
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
    if has_proc():
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


def signal_ref(ref: ProcessRef, sig: int) -> None:
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
        for signum, old in previous.items():
            with contextlib.suppress(ValueError, OSError):
                signal.signal(signum, old)
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
            return ANSI_RE.sub("", self.log_path.read_text(errors="replace"))
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
                signal_ref(ref, sig)
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
                signal_ref(ref, signal.SIGKILL)
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
                    signal_ref(ref, signal.SIGKILL)
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


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
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
        for signum, old in previous.items():
            with contextlib.suppress(ValueError, OSError):
                signal.signal(signum, old)


def alive_matching(needles: Iterable[str]) -> list[ProcessRef]:
    """Live processes whose command line contains any of ``needles`` (e.g. a unique port)."""
    needles = [n for n in needles if n]
    out: list[ProcessRef] = []
    if not has_proc() or not needles:
        return out
    me = os.getpid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        cmd = cmdline(int(entry.name))
        if cmd and any(n in cmd for n in needles):
            ref = process_ref(int(entry.name))
            if ref is not None:
                out.append(ref)
    return out
