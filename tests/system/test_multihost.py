"""CorBin-FL across emulated machines: one Linux network namespace per host (``tests/netns.py``).

Topology: ``srv`` (10.77.0.1: SuperLink + ServerApp, and the ``flwr`` CLI) and three clients
``c1``-``c3`` (10.77.0.11-13: one SuperNode each, whose ClientApp processes run in the same
namespace), each with its own ``eth0`` on a private bridge. Every link to the SuperLink uses TLS
(certificates from ``docker/certs/make-certs.sh`` for 10.77.0.1) and the SuperLink admits only
SuperNodes whose keys were registered with ``docker/certs/register-nodes.sh``.

* The harness itself: hosts reach each other over the bridge, an unplugged host cannot, a
  ``tbf`` uplink limit holds, and teardown leaves no namespace behind.
* The deployment: a 3-round CorBin-FL run (relay mode); during round 2 the SuperNode of ``c1``
  and its ClientApp processes are SIGKILLed and ``c2``'s link is taken down. The run must finish
  all 3 rounds, record both nodes as dropped, go on with the survivor, still have learned, and
  leave no process and no namespace behind.

Everything skips with the reason where namespaces cannot be made (not root, no iproute2, no
``CAP_SYS_ADMIN``). CI runs as root, so it runs there.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
from flwr.common.constant import HEARTBEAT_DEFAULT_INTERVAL, HEARTBEAT_PATIENCE
from waits import HANG_GUARD_S, ClientAppTiming

from corbin_fl.deploy.processes import ManagedProcess, ProcessRef, ProcessRegistry
from corbin_fl.deploy.run import node_policy
from testbed.netns import (
    FlowerHosts,
    NetnsError,
    RunOutcome,
    Topology,
    alive,
    namespaces,
    netdev_counters,
    netns_unavailable_reason,
    sweep_stale,
    wait_in_namespace,
)

pytestmark = [pytest.mark.multihost]

SERVER: Final[str] = "srv"
CLIENTS: Final[tuple[str, ...]] = ("c1", "c2", "c3")
ADDRESSES: Final[dict[str, str]] = {
    SERVER: "10.77.0.1",
    "c1": "10.77.0.11",
    "c2": "10.77.0.12",
    "c3": "10.77.0.13",
}
KILLED: Final[str] = "c1"
"""Client whose SuperNode and ClientApp processes are SIGKILLed during round 2."""
UNPLUGGED: Final[str] = "c2"
"""Client whose link goes down during round 2 (its processes keep running)."""
SURVIVOR: Final[str] = "c3"
FAULT_ROUND: Final[int] = 2
FAULT_DELAY: Final[float] = 0.5
"""Seconds after round 2's ``round_start`` event: usually before either node can answer that
round's first stage (a SuperNode polls every 3 s, and a ClientApp process takes seconds to
start). On a busy machine the fault may come later; the checks hold either way."""

HEARTBEAT_OFFLINE_S: Final[float] = HEARTBEAT_PATIENCE * HEARTBEAT_DEFAULT_INTERVAL
"""A SuperNode that stops sending heartbeats (killed, or unplugged) is offline for the SuperLink
at most ``patience x interval`` (2 x 30 s in Flower 1.41) after its last one; from then on the
SuperLink answers every instruction to it with a NODE_UNAVAILABLE error reply. So a stage that
waits for a dead node ends at the latest that long after the fault, whatever its timeout: the
stage timeout below only has to be long enough for the live nodes."""

RUN_CONFIG: Final[dict[str, Any]] = {
    "mechanism": "corbin",
    "cr-mode": "relay",
    "num-rounds": 3,
    "model": "cnn",
    "dataset": "mnist",
    # One local epoch: ~1070 images per client, 17 Adam steps of 64.
    "local-epochs": 1,
    # A budget where three one-bit clients visibly learn in three rounds (alpha(8) = 1.0007,
    # the decoded values stay at the edges of each layer's range); with eps_p = 1 (alpha = 2.16)
    # three clients stay near chance whatever the deployment does. This test checks the
    # deployment, not the privacy-utility trade-off.
    "epsilon": 8.0,
    "seed": 0,
    # The survivor alone must still make a round (round 3 may sample only it).
    "min-clients": 1,
    "poll-interval": 0.5,
    # stage-timeout, first-stage-timeout and wait-for-nodes come from `_waits` (measured).
}
FIRST_ROUND_STAGES: Final[int] = 3
"""Relay mode: round 1 runs keygen, pair and update."""
LATER_ROUND_STAGES: Final[int] = 2
"""Later relay rounds run the update stage only (pipelined), or a pair stage and the update for
nodes that need a fresh partner (after the kill): the run's time budget counts two stages."""

MIN_FINAL_ACCURACY: Final[float] = 0.4
"""Round-3 test accuracy floor: four times chance (0.1, ten balanced MNIST classes). The run
config above, replayed offline with the same data, model and mechanism (round 1: three clients,
rounds 2-3: the survivor alone, independent LDPQ), reached 0.67-0.83 after round 3 over six
quantization seeds (mean 0.77, sd 0.06); round 1 alone reached 0.38-0.65. The floor sits more
than 4 sd below the mean, and far above what a model that stopped learning at round 0 (0.12)
shows."""


def _flower_missing() -> str | None:
    missing = [n for n in ("flower-superlink", "flower-supernode", "flwr") if not shutil.which(n)]
    return f"Flower executables missing: {', '.join(missing)}" if missing else None


@pytest.fixture
def topology() -> Iterator[Topology]:
    """Four hosts on a private bridge; always torn down, and checked to be gone."""
    reason = netns_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    sweep_stale()
    topo = Topology(ADDRESSES)
    topo.create()
    try:
        yield topo
    finally:
        topo.destroy()
        assert topo.leftovers() == [], f"namespaces left behind: {topo.leftovers()}"


# ============================================================================ harness
_SINK = """
import socket, sys, time
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((sys.argv[1], int(sys.argv[2])))
srv.listen(1)
print("listening", flush=True)
conn, _ = srv.accept()
total = 0
while chunk := conn.recv(1 << 16):
    total += len(chunk)
conn.sendall(str(total).encode())
conn.close()
"""

_SEND = """
import socket, sys, time
size = int(sys.argv[3])
deadline = time.monotonic() + 20
while True:
    try:
        sock = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2)
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.1)
sock.settimeout(60)
t0 = time.monotonic()
sock.sendall(b"x" * size)
sock.shutdown(socket.SHUT_WR)
got = int(sock.recv(64))
print(got, time.monotonic() - t0)
"""


def _transfer(
    topo: Topology, registry: ProcessRegistry, tmp_path: Path, sender: str, size: int, port: int
) -> tuple[int, float]:
    """Send ``size`` bytes from ``sender`` to a sink on the server; ``(received, seconds)``."""
    sink: ManagedProcess = registry.start(
        f"sink-{port}",
        topo.argv(SERVER, [sys.executable, "-c", _SINK, ADDRESSES[SERVER], str(port)]),
        tmp_path / f"sink-{port}.log",
    )
    deadline = time.monotonic() + HANG_GUARD_S
    while "listening" not in sink.log_text() and time.monotonic() < deadline:
        assert sink.running(), sink.log_text()
        time.sleep(0.05)
    out = topo.run(
        sender,
        [sys.executable, "-c", _SEND, ADDRESSES[SERVER], str(port), str(size)],
        timeout=HANG_GUARD_S,
    )
    received, seconds = out.stdout.split()
    sink.popen.wait(timeout=HANG_GUARD_S)
    return int(received), float(seconds)


def test_hosts_reach_each_other_and_an_unplugged_host_cannot(
    topology: Topology, process_registry: ProcessRegistry, tmp_path: Path
) -> None:
    for name, address in ADDRESSES.items():
        shown = json.loads(topology.run(name, ["ip", "-j", "-4", "addr", "show"]).stdout)
        ifaces = {i["ifname"]: [a["local"] for a in i["addr_info"]] for i in shown}
        # Each machine sees its loopback and its one interface, with its own IPv4 address only.
        assert set(ifaces) == {"lo", "eth0"}, ifaces
        assert ifaces["eth0"] == [address], ifaces
    assert _transfer(topology, process_registry, tmp_path, "c3", 100_000, 7001)[0] == 100_000
    # The counters of c3's eth0, read through any process inside c3 (no process started),
    # agree with `ip -s link` there and show at least the payload that left.
    idle = process_registry.start("idle-c3", topology.argv("c3", ["sleep", "60"]), tmp_path / "i")
    wait_in_namespace(idle.pid, topology.host("c3").ns)
    via_proc, via_ip = netdev_counters(idle.pid), topology.link_stats("c3")
    assert via_proc["tx_bytes"] >= 100_000
    for key in ("tx_bytes", "rx_bytes"):
        assert abs(via_proc[key] - via_ip[key]) <= 2048, (key, via_proc, via_ip)
    process_registry.stop(idle, grace=1.0)

    topology.link_down("c2")
    connect = f"import socket; socket.create_connection(('{ADDRESSES[SERVER]}', 7002), timeout=3)"
    probe = topology.run("c2", [sys.executable, "-c", connect], check=False)
    assert probe.returncode != 0
    assert "unreachable" in probe.stderr.lower(), probe.stderr
    topology.link_up("c2")
    deadline = time.monotonic() + 10
    while "LOWER_UP" not in topology.run("c2", ["ip", "link", "show", "eth0"]).stdout:
        assert time.monotonic() < deadline, "eth0 of c2 did not come back up"
        time.sleep(0.1)
    assert _transfer(topology, process_registry, tmp_path, "c2", 100_000, 7003)[0] == 100_000


def test_tbf_limits_the_uplink_rate(
    topology: Topology, process_registry: ProcessRegistry, tmp_path: Path
) -> None:
    """A 10 Mbit/s token bucket on c1's egress: 2.5 MB take about 2 s (8 bits x 2.5e6 / 1e7)."""
    rate_mbit, size = 10.0, 2_500_000
    qdisc = topology.shape_uplink("c1", rate_mbit)
    assert qdisc.startswith("qdisc tbf") and "rate 10Mbit" in qdisc, qdisc
    before = topology.link_stats("c1")["tx_bytes"]
    received, seconds = _transfer(topology, process_registry, tmp_path, "c1", size, 7101)
    sent = topology.link_stats("c1")["tx_bytes"] - before
    assert received == size
    assert sent >= size  # the payload plus TCP/IP/Ethernet headers left through eth0
    # The bucket (64 KiB) may go out at once; everything else waits for tokens. A lower bound
    # (with 5% for timer granularity) proves the limit; the upper one only that it still flows.
    floor = (size - 64 * 1024) * 8 / (rate_mbit * 1e6)
    assert 0.95 * floor <= seconds <= 6 * floor, (seconds, floor)

    topology.clear_shaping("c1")
    assert "tbf" not in topology.qdisc("c1")
    _, fast = _transfer(topology, process_registry, tmp_path, "c1", size, 7102)
    assert fast < seconds / 2, (fast, seconds)


def test_shaping_rejects_bad_parameters(topology: Topology) -> None:
    with pytest.raises(ValueError, match="rate_mbit"):
        topology.shape_uplink("c1", 0.0)
    with pytest.raises(ValueError, match="delay_ms"):
        topology.shape_uplink("c1", 10.0, delay_ms=-1.0)
    with pytest.raises(TypeError, match="rate_mbit"):
        topology.shape_uplink("c1", "10mbit")  # type: ignore[arg-type]
    with pytest.raises(KeyError, match="no host 'c9'"):
        topology.shape_uplink("c9", 10.0)
    if not topology.netem_available():
        with pytest.raises(NetnsError, match="sch_netem"):
            topology.shape_uplink("c1", 10.0, delay_ms=50.0)


def test_topology_validates_hosts() -> None:
    with pytest.raises(ValueError, match=r"not a host address of 10\.77\.0\.0/24"):
        Topology({"srv": "10.78.0.1"})
    with pytest.raises(ValueError, match="used twice"):
        Topology({"a": "10.77.0.1", "b": "10.77.0.1"})
    with pytest.raises(ValueError, match="host name"):
        Topology({"Srv": "10.77.0.1"})
    with pytest.raises(ValueError, match="host name"):
        Topology({"br": "10.77.0.1"})
    with pytest.raises(ValueError, match="private range"):
        Topology({"a": "8.8.8.1"}, subnet="8.8.8.0/24")
    with pytest.raises(TypeError):
        Topology({})


# ============================================================================ the deployment
def _stage_seconds(outcome: RunOutcome) -> list[tuple[Any, Any, float]]:
    """``(round, stage, seconds)`` of every ``stage_end`` event (for failure messages)."""
    return [
        (e.get("round"), e.get("stage"), round(float(e.get("seconds", 0.0)), 1))
        for e in outcome.events
        if e.get("event") == "stage_end"
    ]


def _explain(outcome: RunOutcome, deploy: FlowerHosts) -> str:
    rows = [
        {k: r.get(k) for k in ("round", "test_accuracy", "sampled", "participants", "dropped")}
        for r in outcome.metrics
    ]
    return (
        f"reason={outcome.reason} exit={outcome.exit_code} metrics={rows}\n"
        f"stage durations={_stage_seconds(outcome)}\n"
        f"flwr run:\n{outcome.log_tail}\nlogs in {deploy.logs_dir}"
    )


@dataclass(frozen=True)
class Waits:
    """Every wait of the deployment test, derived from a measurement (see :func:`_waits`)."""

    ready: float
    first_stage: float
    stage: float
    run: float


def _waits(timing: ClientAppTiming) -> Waits:
    """The deployment test's waits from a ClientApp probe on this machine, taken just now.

    * ``ready`` (SuperLink up, every SuperNode online; also ``wait-for-nodes``, which only has
      to cover the nodes that were online at submission): the start-up of the SuperLink and
      the three SuperNodes, :meth:`ClientAppTiming.startup_timeout`.
    * ``stage-timeout`` / ``first-stage-timeout``: all three clients' ClientApp processes may
      run at once (round 1; round 2 if the faults come late), each doing a later-round or a
      first update: :meth:`ClientAppTiming.stage_timeout`. The dead nodes do not lengthen the
      run beyond :data:`HEARTBEAT_OFFLINE_S` per stage.
    * ``run`` (how long ``flwr run`` may take): :meth:`ClientAppTiming.run_timeout`.
    """
    n, poll = len(CLIENTS), float(RUN_CONFIG["poll-interval"])
    ready = timing.startup_timeout(1 + n)
    first = timing.stage_timeout(n, first=True, poll_interval=poll)
    stage = timing.stage_timeout(n, first=False, poll_interval=poll)
    run = timing.run_timeout(
        rounds=int(RUN_CONFIG["num-rounds"]),
        first_round_stages=FIRST_ROUND_STAGES,
        later_round_stages=LATER_ROUND_STAGES,
        concurrent=n,
        poll_interval=poll,
        wait_for_nodes=ready,
    )
    return Waits(ready=ready, first_stage=first, stage=stage, run=run)


# Covers the probe; the limit is then moved to the bound derived from it (`rearm_timeout`).
@pytest.mark.timeout(1800)
def test_tls_run_survives_a_killed_and_an_unplugged_client(
    topology: Topology,
    tmp_path: Path,
    clientapp_timing: Callable[[Mapping[str, Any], int], ClientAppTiming],
    rearm_timeout: Callable[[float], None],
) -> None:
    if (missing := _flower_missing()) is not None:
        pytest.skip(missing)
    waits = _waits(clientapp_timing(RUN_CONFIG, len(CLIENTS)))
    # certificates (make-certs.sh's own 120 s limit), SuperLink ready, one registration per
    # client, SuperNodes online, the run, and the clean-up: each at its own derived limit
    rearm_timeout(120 + (3 + len(CLIENTS)) * waits.ready + waits.run)
    run_config = {
        **RUN_CONFIG,
        "stage-timeout": waits.stage,
        "first-stage-timeout": waits.first_stage,
        "wait-for-nodes": waits.ready,
    }
    deploy = FlowerHosts(
        topology,
        SERVER,
        CLIENTS,
        tmp_path / "deploy",
        tls=True,
        ready_timeout=waits.ready,
        # each client's operator admits this run's eps_p = 8 in its own node config (the
        # default policy refuses anything above 1: client/policy.py)
        node_config=node_policy(RUN_CONFIG),
    )
    out_dir = tmp_path / "out"
    faults: dict[str, Any] = {}

    def inject(outcome: RunOutcome) -> None:
        """SIGKILL c1's SuperNode tree and unplug c2, FAULT_DELAY s into round 2."""
        if faults:
            return
        starts = [
            float(e["time"])
            for e in outcome.events
            if e.get("event") == "round_start" and e.get("round") == FAULT_ROUND
        ]
        if starts and time.time() >= starts[0] + FAULT_DELAY:
            faults["killed"] = deploy.kill_client(KILLED)
            topology.link_down(UNPLUGGED)
            faults["time"] = time.time()
            faults["left_in_killed_host"] = topology.pids(KILLED)
            faults["running_in_unplugged_host"] = topology.pids(UNPLUGGED)

    try:
        node_ids = deploy.start()
        assert set(node_ids) == set(CLIENTS) and len(set(node_ids.values())) == len(CLIENTS)
        # TLS only: the SuperLink answers over https (verified with the CA), never in clear.
        tls_ok = deploy.http_ok(f"https://{deploy.address}/health")
        clear_ok = deploy.http_ok(f"http://{deploy.address}/health")
        run = deploy.submit({**run_config, "out-dir": str(out_dir)})
        outcome = deploy.follow(run, out_dir, timeout=waits.run, on_tick=inject)
        status = deploy.run_status(outcome.run_id) if outcome.run_id is not None else None
        link_log = deploy.superlink.log_text() if deploy.superlink is not None else ""
    finally:
        survivors: list[ProcessRef] = deploy.close()
    seen = deploy.processes()
    assert survivors == [] and alive(seen) == [], f"processes left: {alive(seen)}"
    killed_in_teardown = topology.destroy()
    assert killed_in_teardown == [], "processes were still running in the namespaces"
    assert topology.leftovers() == []
    assert not {ns for ns in namespaces() if ns.startswith(topology.run_tag)}

    why = _explain(outcome, deploy)
    assert outcome.reason is None and outcome.exit_code == 0, why
    assert status == "finished:completed", f"status {status}; {why}"
    assert tls_ok and not clear_ok, (tls_ok, clear_ok)
    assert f"Uvicorn running on https://{deploy.address}" in link_log, link_log[-2000:]
    # Node authentication: the id each SuperNode signed in with is the one its key got when
    # register-nodes.sh registered it (the SuperLink maps the signing key to that id).
    for name in CLIENTS:
        assert f"RegisterNode] Created node_id={node_ids[name]}" in link_log, name
        assert f"Activated node_id={node_ids[name]}" in link_log, name

    # The faults happened in round 2, and the killed host had no process left.
    assert faults, f"round {FAULT_ROUND} never started; {why}"
    assert faults["killed"], "nothing was killed"
    assert faults["left_in_killed_host"] == [], faults["left_in_killed_host"]
    # c2 is a network failure, not a crash: its SuperNode still ran, cut off.
    assert faults["running_in_unplugged_host"], "nothing ran in the unplugged host"
    killed_id, unplugged_id = str(node_ids[KILLED]), str(node_ids[UNPLUGGED])

    rows = {int(r["round"]): r for r in outcome.metrics}
    assert sorted(rows) == [1, 2, 3], why
    first, second, third = rows[1], rows[2], rows[3]
    assert first["participants"] == 3 and first["dropped"] == {}, why
    # Round 2: both nodes were sampled and dropped (no reply, or an error reply once the
    # SuperLink knows a node is gone); the survivor's update alone made the round.
    assert set(second["dropped"]) == {killed_id, unplugged_id}, why
    assert all(isinstance(v, str) and v for v in second["dropped"].values()), why
    assert second["sampled"] == 3 and second["participants"] == 1, why
    stage_drops = {
        str(n)
        for e in outcome.events
        if e.get("event") == "stage_end" and e.get("round") == FAULT_ROUND
        for n in e.get("dropped", [])
    }
    assert stage_drops == {killed_id, unplugged_id}, why
    # Round 3: the dead nodes are either still listed by the SuperLink (sampled, dropped again)
    # or already marked offline (not sampled); the survivor takes part either way.
    assert set(third["dropped"]) <= {killed_id, unplugged_id}, why
    assert third["participants"] == 1, why
    assert third["sampled"] == 1 + len(third["dropped"]), why

    # Learning survived: see MIN_FINAL_ACCURACY.
    assert third["test_accuracy"] >= MIN_FINAL_ACCURACY, why
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["participants_per_round"] == [3, 1, 1], summary
