"""Load: a federation of many SuperNodes on ONE machine (``pytest -m load``; not run by default).

``CORBIN_LOAD_NODES`` SuperNodes (default 30) on loopback run 3 rounds of the embedded task
(MNIST, small CNN, CorBin-FL with relay common randomness) with 1 local step per round. The test
polls ``/proc`` twice a second and reports, per round, the round and stage times, and the memory
of the deployment: the SuperLink side, the SuperNodes with their SuperExecs, and the ClientApp
processes (one per message: the largest one, the most alive at once, their peak sum), against
``MemAvailable``. A guard stops the run, and fails the test with the figures, before the machine
runs out of memory (the limit of this federation size on a small machine is memory, not CPU: see
the report printed by the test).

Run::

    pytest -m load -s tests/system/test_load.py                # 30 SuperNodes
    CORBIN_LOAD_NODES=40 pytest -m load -s tests/system/test_load.py
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from corbin_fl.deploy.flower import RUN_ID_RE

pytestmark = [pytest.mark.load, pytest.mark.e2e]

logger = logging.getLogger(__name__)

NUM_NODES = int(os.environ.get("CORBIN_LOAD_NODES", "30"))
PER_ROUND = int(os.environ.get("CORBIN_LOAD_PER_ROUND", "0"))
MAX_INFLIGHT = int(os.environ.get("CORBIN_LOAD_MAX_INFLIGHT", "6"))
"""Instructions outstanding at once per stage (``max-inflight``). With all 30 at once, 2 cores
start ClientApp processes so slowly that the SuperExecs start more for the same messages: one
unwindowed run had 284 ClientApp processes alive at once (22 GiB) and hit the memory guard."""
"""Clients sampled per round (``clients-per-round``; 0 = every SuperNode)."""
ROUNDS = 3
GIB = 1024**3
MIB = 1024**2
MEMORY_FLOOR = 1.5 * GIB
"""The run is stopped when ``MemAvailable`` falls below this (the machine is shared)."""


def _meminfo(key: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def _processes() -> dict[int, tuple[int, str, int]]:
    """One pass over ``/proc``: pid -> (parent pid, command line, RSS bytes)."""
    out: dict[int, tuple[int, str, int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            status = Path(entry.path, "status").read_text()
            cmd = (
                Path(entry.path, "cmdline")
                .read_bytes()
                .replace(b"\0", b" ")
                .decode(errors="replace")
            )
        except OSError:
            continue
        ppid = rss = 0
        for line in status.splitlines():
            if line.startswith("PPid:"):
                ppid = int(line.split()[1])
            elif line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
        out[int(entry.name)] = (ppid, cmd, rss)
    return out


def _tree(root: int, procs: dict[int, tuple[int, str, int]]) -> list[int]:
    """``root`` and its descendants in ``procs``."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    out, queue = [], [root]
    while queue:
        pid = queue.pop()
        if pid in procs:
            out.append(pid)
            queue.extend(children.get(pid, []))
    return out


@dataclass
class Peaks:
    """Largest values seen by the poller over one phase (bytes, counts)."""

    clientapp_max: int = 0
    clientapps_alive: int = 0
    clientapps_sum: int = 0
    nodes_sum: int = 0
    server_sum: int = 0
    total: int = 0

    def update(self, apps: list[int], nodes_sum: int, server_sum: int) -> None:
        self.clientapp_max = max(self.clientapp_max, max(apps, default=0))
        self.clientapps_alive = max(self.clientapps_alive, len(apps))
        self.clientapps_sum = max(self.clientapps_sum, sum(apps))
        self.nodes_sum = max(self.nodes_sum, nodes_sum)
        self.server_sum = max(self.server_sum, server_sum)
        self.total = max(self.total, sum(apps) + nodes_sum + server_sum)


@dataclass
class MemoryWatch:
    """Resident memory of the deployment, per phase (``start-up``, ``round t``)."""

    phases: dict[str, Peaks] = field(default_factory=dict)
    clientapps_seen: set[tuple[int, int]] = field(default_factory=set)

    def poll(self, dep: Any, phase: str) -> None:
        procs = _processes()
        apps: list[int] = []
        nodes_sum = 0
        for proc in list(dep.supernodes.values()):
            for pid in _tree(proc.pid, procs):
                _, cmd, rss = procs[pid]
                if "flwr-clientapp" in cmd:
                    apps.append(rss)
                    self.clientapps_seen.add((pid, hash(cmd)))
                else:
                    nodes_sum += rss
        server_sum = 0
        if dep.superlink is not None:
            server_sum = sum(procs[pid][2] for pid in _tree(dep.superlink.pid, procs))
        self.phases.setdefault(phase, Peaks()).update(apps, nodes_sum, server_sum)

    def report(self, nodes: int) -> list[str]:
        out = [
            f"memory of the deployment ({nodes} SuperNodes, "
            f"{len(self.clientapps_seen)} ClientApp processes seen), per phase:"
        ]
        for phase, pk in self.phases.items():
            out.append(
                f"  {phase:<9} SuperNodes+SuperExecs {pk.nodes_sum / GIB:5.2f} GiB "
                f"({pk.nodes_sum / nodes / MIB:4.0f} MiB/node), ServerApp side "
                f"{pk.server_sum / MIB:4.0f} MiB, ClientApps: largest "
                f"{pk.clientapp_max / MIB:4.0f} MiB, {pk.clientapps_alive:2d} alive at once, sum "
                f"{pk.clientapps_sum / GIB:5.2f} GiB; total {pk.total / GIB:5.2f} GiB"
            )
        return out


class MemoryGuard(threading.Thread):
    """Kills the deployment (SIGKILL, every process tree) when ``MemAvailable`` gets low.

    Runs in its own thread and reads only ``/proc/meminfo`` (cheap), five times a second, so it
    reacts even when the machine is so loaded that the main loop is late; once tripped it keeps
    killing whatever the deployment (re)starts until it is stopped.
    """

    def __init__(self, dep: Any, floor: int) -> None:
        super().__init__(daemon=True)
        self.dep, self.floor = dep, floor
        self.available_min = _meminfo("MemAvailable")
        self.tripped: str | None = None
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(0.2):
            avail = _meminfo("MemAvailable")
            self.available_min = min(self.available_min, avail)
            if avail < self.floor and self.tripped is None:
                self.tripped = (
                    f"MemAvailable fell to {avail / GIB:.2f} GiB (floor {self.floor / GIB:.2f} "
                    "GiB): the deployment was killed"
                )
            if self.tripped is not None:  # and whatever a start-up retry starts afterwards
                for proc in list(self.dep.registry.processes):
                    if proc.running():
                        self.dep.registry.kill_tree(proc, signal.SIGKILL)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=5)


def _jsonl(path: Path) -> list[dict[str, Any]]:
    try:
        return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    except FileNotFoundError:
        return []


@pytest.mark.timeout(5400)
def test_many_supernodes_complete_three_rounds(tmp_path: Path) -> None:
    from corbin_fl.deploy.cli import repo_root
    from corbin_fl.deploy.flower import CONNECTION_NAME, flower_executable
    from corbin_fl.deploy.follow import JsonlTail
    from corbin_fl.deploy.local import LocalDeployment
    from corbin_fl.deploy.processes import LauncherError

    out = tmp_path / "out"
    logs = tmp_path / "logs"
    run_config: dict[str, Any] = {
        "num-rounds": ROUNDS,
        "mechanism": "corbin",
        "cr-mode": "relay",
        "max-steps": 1,
        "batch-size": 32,
        "seed": 0,
        "min-clients": min(NUM_NODES, PER_ROUND or NUM_NODES),
        "clients-per-round": PER_ROUND,
        "wait-for-nodes": 600.0,
        "stage-timeout": 1800.0,
        "first-stage-timeout": 1800.0,
        "poll-interval": 1.0,
        "max-inflight": MAX_INFLIGHT,
        "out-dir": str(out),
    }
    floor = max(MEMORY_FLOOR, int(0.08 * _meminfo("MemTotal")))
    watch = MemoryWatch()
    t0 = time.monotonic()
    dep = LocalDeployment(NUM_NODES, logs, tmp_path / "flwr-home", ready_timeout=1200)
    guard = MemoryGuard(dep, floor)
    guard.start()
    startup = run_seconds = 0.0
    rc: int | None = None
    status: str | None = None
    tail = ""
    try:
        with dep:
            startup = time.monotonic() - t0
            path = tmp_path / "run-config.toml"
            path.write_text(tomli_w.dumps(run_config))
            cmd = [flower_executable("flwr"), "run", str(repo_root()), CONNECTION_NAME, "--stream"]
            run = dep.registry.start(
                "flwr-run", [*cmd, "--run-config", str(path)], logs / "run.log"
            )
            events = JsonlTail(out / "events.jsonl")
            phase, last_snapshot = "start-up", 0.0
            while run.running() and guard.tripped is None:
                for ev in events.read_new():
                    if ev.get("event") == "round_start":
                        phase = f"round {ev['round']}"
                watch.poll(dep, phase)
                if time.monotonic() - last_snapshot > 5.0:  # for the clean-up at the end
                    dep.registry.snapshot()
                    last_snapshot = time.monotonic()
                time.sleep(1.0)
            run_seconds = time.monotonic() - t0 - startup
            rc = run.popen.poll()
            tail = run.log_tail(30)
            run_id = RUN_ID_RE.search(run.log_text())
            if run_id and guard.tripped is None:
                status = dep.cli.run_status(int(run_id.group(1)))[0]
    except LauncherError as exc:
        if guard.tripped is None:
            raise
        tail = str(exc)[-2000:]
    finally:
        guard.stop()

    rows = _jsonl(out / "metrics.jsonl")
    events_all = _jsonl(out / "events.jsonl")
    lines = [
        f"{NUM_NODES} SuperNodes ({PER_ROUND or NUM_NODES} per round, max-inflight "
        f"{MAX_INFLIGHT}): start-up {startup:.0f} s, "
        f"run {run_seconds:.0f} s",
        *(
            f"round {r['round']}: {r['round_seconds']:.1f} s, {r['participants']}/{r['sampled']}"
            f" clients, stages "
            + ", ".join(f"{k} {v:.1f} s" for k, v in r["stage_seconds"].items())
            for r in rows
        ),
        *watch.report(NUM_NODES),
        f"MemAvailable: min {guard.available_min / GIB:.2f} GiB of "
        f"{_meminfo('MemTotal') / GIB:.1f} GiB (guard floor {floor / GIB:.2f} GiB)",
    ]
    report = "\n".join(lines)
    logger.info("%s", report)
    print("\n" + report)  # the figures are the point of this test (run with -s)
    assert guard.tripped is None, f"{guard.tripped}\n{report}\n{tail}"
    assert rc == 0 and status == "finished:completed", f"rc {rc}, status {status}\n{tail}"
    assert [r["round"] for r in rows] == [1, 2, 3], report
    for r in rows:
        assert r["participants"] == r["sampled"] == (PER_ROUND or NUM_NODES), report
        assert not r["dropped"] and r["pairs"] == r["sampled"] // 2, report
    assert events_all[-1]["event"] == "run_end" and "error" not in events_all[-1]
