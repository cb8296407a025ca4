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

    pytest -m load -s tests/test_load.py                # 30 SuperNodes
    CORBIN_LOAD_NODES=40 pytest -m load -s tests/test_load.py
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import tomli_w

pytestmark = [pytest.mark.load, pytest.mark.e2e]

logger = logging.getLogger(__name__)

NUM_NODES = int(os.environ.get("CORBIN_LOAD_NODES", "30"))
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
class MemoryWatch:
    """What the poller saw (bytes)."""

    clientapp_max: int = 0
    clientapps_alive_max: int = 0
    clientapps_sum_max: int = 0
    clientapps_seen: set[tuple[int, int]] = field(default_factory=set)
    nodes_sum_max: int = 0
    server_sum_max: int = 0
    total_max: int = 0
    available_min: int = 1 << 62

    def poll(self, dep: Any) -> None:
        procs = _processes()
        clientapps: list[int] = []
        nodes_sum = 0
        for proc in dep.supernodes.values():
            for pid in _tree(proc.pid, procs):
                _, cmd, rss = procs[pid]
                if "flwr-clientapp" in cmd:
                    clientapps.append(rss)
                    self.clientapps_seen.add((pid, hash(cmd)))
                else:
                    nodes_sum += rss
        server_sum = 0
        if dep.superlink is not None:
            server_sum = sum(procs[pid][2] for pid in _tree(dep.superlink.pid, procs))
        apps = sum(clientapps)
        self.clientapp_max = max(self.clientapp_max, max(clientapps, default=0))
        self.clientapps_alive_max = max(self.clientapps_alive_max, len(clientapps))
        self.clientapps_sum_max = max(self.clientapps_sum_max, apps)
        self.nodes_sum_max = max(self.nodes_sum_max, nodes_sum)
        self.server_sum_max = max(self.server_sum_max, server_sum)
        self.total_max = max(self.total_max, apps + nodes_sum + server_sum)
        self.available_min = min(self.available_min, _meminfo("MemAvailable"))

    def report(self, nodes: int) -> str:
        g = GIB
        return (
            f"memory ({nodes} SuperNodes): SuperNodes+SuperExecs peak {self.nodes_sum_max / g:.2f}"
            f" GiB ({self.nodes_sum_max / nodes / MIB:.0f} MiB per node); ServerApp side peak "
            f"{self.server_sum_max / g:.2f} GiB; ClientApps: {len(self.clientapps_seen)} "
            f"processes, largest {self.clientapp_max / MIB:.0f} MiB, at most "
            f"{self.clientapps_alive_max} alive at once, peak sum "
            f"{self.clientapps_sum_max / g:.2f} GiB; deployment peak {self.total_max / g:.2f} GiB;"
            f" MemAvailable min {self.available_min / g:.2f} GiB of "
            f"{_meminfo('MemTotal') / g:.1f} GiB"
        )


def _jsonl(path: Path) -> list[dict[str, Any]]:
    try:
        return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    except FileNotFoundError:
        return []


@pytest.mark.timeout(5400)
def test_many_supernodes_complete_three_rounds(tmp_path: Path) -> None:
    from corbin_fl.cli import repo_root
    from corbin_fl.launcher import CONNECTION_NAME, LocalDeployment, flower_executable

    out = tmp_path / "out"
    logs = tmp_path / "logs"
    run_config: dict[str, Any] = {
        "num-rounds": ROUNDS,
        "mechanism": "corbin",
        "cr-mode": "relay",
        "max-steps": 1,
        "batch-size": 32,
        "seed": 0,
        "min-clients": NUM_NODES,
        "wait-for-nodes": 600.0,
        "stage-timeout": 1800.0,
        "first-stage-timeout": 1800.0,
        "poll-interval": 1.0,
        "out-dir": str(out),
    }
    watch = MemoryWatch()
    t0 = time.monotonic()
    dep = LocalDeployment(NUM_NODES, logs, tmp_path / "flwr-home", ready_timeout=900)
    with dep:
        startup = time.monotonic() - t0
        path = tmp_path / "run-config.toml"
        path.write_text(tomli_w.dumps(run_config))
        cmd = [flower_executable("flwr"), "run", str(repo_root()), CONNECTION_NAME, "--stream"]
        run = dep.registry.start("flwr-run", [*cmd, "--run-config", str(path)], logs / "run.log")
        stopped: str | None = None
        last_snapshot = 0.0
        while run.running():
            watch.poll(dep)
            if time.monotonic() - last_snapshot > 5.0:  # for the clean-up at the end
                dep.registry.snapshot()
                last_snapshot = time.monotonic()
            if watch.available_min < MEMORY_FLOOR:
                stopped = (
                    f"stopped: MemAvailable fell to {watch.available_min / GIB:.2f} GiB with "
                    f"{watch.clientapps_alive_max} ClientApps alive at most"
                )
                break
            time.sleep(0.5)
        run_seconds = time.monotonic() - t0 - startup
        rc = run.popen.poll()
        tail = run.log_tail(30)
        run_id = re.search(r"Successfully started run (\d+)", run.log_text())
        status = dep.run_status(int(run_id.group(1)))[0] if run_id and not stopped else None

    rows = _jsonl(out / "metrics.jsonl")
    events = _jsonl(out / "events.jsonl")
    lines = [
        f"{NUM_NODES} SuperNodes: start-up {startup:.0f} s, run {run_seconds:.0f} s",
        *(
            f"round {r['round']}: {r['round_seconds']:.1f} s, {r['participants']}/{r['sampled']}"
            f" clients, stages "
            + ", ".join(f"{k} {v:.1f} s" for k, v in r["stage_seconds"].items())
            for r in rows
        ),
        watch.report(NUM_NODES),
    ]
    report = "\n".join(lines)
    logger.info("%s", report)
    print("\n" + report)  # the figures are the point of this test (run with -s)
    assert stopped is None, f"{stopped}\n{report}"
    assert rc == 0 and status == "finished:completed", f"rc {rc}, status {status}\n{tail}"
    assert [r["round"] for r in rows] == [1, 2, 3], report
    for r in rows:
        assert r["participants"] == NUM_NODES and not r["dropped"], (r["dropped"], report)
        assert r["pairs"] == NUM_NODES // 2
    assert events[-1]["event"] == "run_end" and "error" not in events[-1]
