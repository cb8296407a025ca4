"""End-to-end runs of the real CorBin-FL app on real Flower processes (``corbin-fl local``).

The test starts one SuperLink and four SuperNodes on loopback through the launcher's Python API
(the same code path as the ``corbin-fl local`` console script), runs two rounds of the app in this
repository, and checks the ServerApp's ``metrics.jsonl``/``events.jsonl``/``summary.json`` plus
that no process is left behind. Full runs are expensive (start-up, ~5-7 s per round trip because
SuperNodes poll every 3 s, a fresh ClientApp process per message), so one relay run combines the
checks: accuracy clearly above chance, every pair's common randomness ``z`` matched on both sides
(``test-z-digest``), one bit per parameter on the uplink, 3 round trips in round 1 (keygen,
pair, update) and 1 in round 2 (the relay is pipelined: round 2's blobs came with round 1's
update replies), the privacy report in ``summary.json``, and a SuperNode SIGKILLed in round 2
recorded as dropped while the round completes. ``cr-mode = "derived"`` (1 round trip per steady
round) runs on real processes in ``tests/system/test_resume_processes.py`` (crash of the whole
server side, then resume).

Tampered and replayed pair blobs are rejected by the client/server logic, covered by
``tests/unit/test_pair_crypto.py`` and ``tests/protocol/test_protocol_logic.py`` (the app
offers no run-config hook to inject a tampered blob into a real deployment).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

import pytest
from waits import ClientAppTiming

from corbin_fl.deploy.cli import repo_root, total_bytes
from corbin_fl.deploy.follow import RunResult
from corbin_fl.deploy.processes import alive_matching
from corbin_fl.deploy.run import KillSpec, LocalRunOptions, run_local

pytestmark = [pytest.mark.e2e]

NUM_CLIENTS = 4
ROUNDS = 2
EPSILON = 2.0
"""Per-parameter budget eps_p of the runs (alpha(2) = 1.31: moderate quantization noise)."""
MAX_STEPS = 50
"""Local optimizer steps per round: enough to learn MNIST well above chance in two rounds, few
enough that a round measures the protocol rather than training."""
POLL_INTERVAL: Final[float] = 0.5
FIRST_ROUND_STAGES: Final[int] = 3
"""Relay mode: round 1 runs keygen, pair and update."""
LATER_ROUND_STAGES: Final[int] = 2
"""Later relay rounds run the update stage only (pipelined); the run's time budget counts two
stages for each, a margin (a pair stage for nodes that need a fresh partner)."""
MIN_ROUND2_ACCURACY = 0.3
"""Round-2 test accuracy bound (chance is 0.1): three times chance. The quantization noise comes
from the CSPRNG (not seeded), so the accuracy varies from run to run; 0.3 leaves a wide margin
below what two rounds reach with these settings."""


def _run_config(run_config: dict[str, Any]) -> dict[str, Any]:
    return {
        "num-rounds": ROUNDS,
        "mechanism": "corbin",
        "max-steps": MAX_STEPS,
        "epsilon": EPSILON,
        "seed": 0,
        "poll-interval": POLL_INTERVAL,
        **run_config,
    }


def _options(
    tmp_path: Path, run_config: dict[str, Any], timing: ClientAppTiming, **kw: Any
) -> LocalRunOptions:
    """Launcher options whose waits derive from ``timing`` (a ClientApp probe taken just now).

    All ``NUM_CLIENTS`` ClientApp processes may run at once in a stage, so a stage waits
    :meth:`ClientAppTiming.stage_timeout` for ``NUM_CLIENTS``; it still ends as soon as every
    live node has answered. A SIGKILLed node does not lengthen a stage beyond Flower's heartbeat
    window (2 x 30 s): then the SuperLink answers for it with a NODE_UNAVAILABLE error reply.
    Start-up waits for the SuperLink and ``NUM_CLIENTS`` SuperNodes
    (:meth:`ClientAppTiming.startup_timeout`), and the whole run may take
    :meth:`ClientAppTiming.run_timeout`.
    """
    ready = timing.startup_timeout(1 + NUM_CLIENTS)
    config = {
        **_run_config(run_config),
        **timing.stage_timeouts(NUM_CLIENTS, poll_interval=POLL_INTERVAL),
        "wait-for-nodes": ready,
    }
    run_timeout = timing.run_timeout(
        rounds=ROUNDS,
        first_round_stages=FIRST_ROUND_STAGES,
        later_round_stages=LATER_ROUND_STAGES,
        concurrent=NUM_CLIENTS,
        poll_interval=POLL_INTERVAL,
        wait_for_nodes=ready,
    )
    return LocalRunOptions(
        app_dir=repo_root(),
        out_dir=tmp_path / "out",
        num_clients=NUM_CLIENTS,
        run_config=config,
        timeout=run_timeout,
        ready_timeout=ready,
        keep_logs=True,  # so that a failure here can be diagnosed from tmp_path/out/logs
        **kw,
    )


def _explain(result: RunResult) -> str:
    rows = [
        {k: r.get(k) for k in ("round", "test_accuracy", "participants", "dropped", "round_trips")}
        for r in result.metrics
    ]
    return f"{result.reason}; metrics: {rows}; logs: {result.logs_dir}"


def _assert_nothing_left(result: RunResult) -> None:
    assert result.processes, "the launcher recorded no process"
    assert result.leftover_processes() == []
    ports: set[str] = set()
    assert result.logs_dir is not None
    for log in result.logs_dir.glob("*.log"):
        ports.update(re.findall(r"--port (\d+)", log.read_text().splitlines()[0]))
    assert len(ports) == NUM_CLIENTS + 1  # one SuperLink, one Runtime API port per SuperNode
    assert alive_matching([f"127.0.0.1:{p}" for p in ports]) == []


# Covers the probe; the limit is then moved to the bound derived from it (`rearm_timeout`).
@pytest.mark.timeout(1800)
def test_relay_run_learns_pairs_share_z_and_survives_a_killed_supernode(
    tmp_path: Path,
    clientapp_timing: Callable[[Mapping[str, Any], int], ClientAppTiming],
    rearm_timeout: Callable[[float], None],
) -> None:
    """One run, two rounds: round 1 with all four clients, round 2 with partition 1 SIGKILLed.

    No short stage timeout is needed: at most 60 s (Flower's 2 x 30 s heartbeat window) after
    the SIGKILL the SuperLink answers for the dead node with a NODE_UNAVAILABLE error reply,
    which ends the stage as soon as the live clients have answered.
    """
    run_config = {"cr-mode": "relay", "test-z-digest": True}
    timing = clientapp_timing(_run_config(run_config), NUM_CLIENTS)
    options = _options(
        tmp_path, run_config, timing, kills=(KillSpec(partition=1, round=2),), kill_delay=1.0
    )
    # start-up (SuperLink, then SuperNodes), the run, the final status and the clean-up
    rearm_timeout(3 * options.ready_timeout + options.timeout + 20)
    result = run_local(options)
    assert result.ok, _explain(result)
    rows = result.metrics
    assert [r["round"] for r in rows] == [1, 2], _explain(result)

    # Round 1: everybody, two pairs, and both partners of every pair expanded the same z
    # (sha256 digests compared server-side).
    first = rows[0]
    assert first["participants"] == NUM_CLIENTS and not first["dropped"], _explain(result)
    assert first["pairs"] == NUM_CLIENTS // 2
    assert first["z_matched_pairs"] == NUM_CLIENTS // 2, first
    assert first["z_mismatched_pairs"] == 0, first
    assert first["round_trips"] == 3  # round 1: keygen -> pair -> update
    # One bit per parameter on the uplink: m/8 bytes per client plus small framing.
    summary = result.summary
    assert summary is not None
    m = summary["num_params"]
    per_client = total_bytes(first["bytes_up"]) / NUM_CLIENTS
    assert m / 8 <= per_client <= m / 8 * 1.02 + 4096, (per_client, m)

    # Round 2: the killed node is dropped, the round completes with the other three.
    assert len(result.killed) == 1
    killed = result.killed[0]
    assert (killed.partition, killed.round) == (1, 2)
    assert killed.node_id is not None and killed.node_id == result.node_ids[1]
    second = rows[1]
    dropped = {str(k): v for k, v in second["dropped"].items()}
    assert list(dropped) == [str(killed.node_id)], _explain(result)
    assert second["participants"] == NUM_CLIENTS - 1, _explain(result)
    stage_drops = [
        str(n)
        for e in result.events
        if e.get("event") == "stage_end" and e.get("round") == 2
        for n in e.get("dropped", [])
    ]
    assert str(killed.node_id) in stage_drops
    # steady relay round: update only; its blobs came with round 1's update replies, and the
    # killed node's partner used the killed node's blob (its update counts)
    assert second["round_trips"] == 1
    assert second["carried_pairs"] == NUM_CLIENTS // 2, second
    assert second["z_mismatched_pairs"] == 0, second
    # It learned, and kept learning without node 1.
    assert second["test_accuracy"] > MIN_ROUND2_ACCURACY, _explain(result)

    privacy = summary["privacy"]
    assert privacy["mechanism"] == "corbin" and privacy["eps_p"] == EPSILON
    assert privacy["rounds"] == ROUNDS and privacy["m"] == m
    run_eps = privacy["threat_models"]["A"]["all_rounds"]["eps"]
    assert math.isfinite(run_eps) and run_eps > 0
    assert privacy["threat_models"]["B"]["dp"] is False  # paired bits: no DP against the server
    assert result.events[0]["event"] == "run_start"
    assert result.events[-1]["event"] == "run_end"
    _assert_nothing_left(result)


SECURE_FIRST_ROUND_STAGES: Final[int] = 6
"""Relay mode with secure aggregation: round 1 runs keygen, pair, SecAgg+ advertise and share,
update (the mask stage) and unmask."""
SECURE_LATER_ROUND_STAGES: Final[int] = 4
"""Later rounds: update and unmask when the last unmask carried the round's shares; advertise,
share, update and unmask when the sample does not fit them and every node re-keys."""


@pytest.mark.timeout(1800)
def test_secure_aggregation_run_learns_and_survives_a_killed_supernode(
    tmp_path: Path,
    clientapp_timing: Callable[[Mapping[str, Any], int], ClientAppTiming],
    rearm_timeout: Callable[[float], None],
) -> None:
    """``corbin-fl local --kill-client 1@2`` with ``secure-aggregation = true``: the server gets
    only the masked vectors and their sum; round 2 sums the three survivors exactly (the killed
    node's pairwise masks are removed with its mask-key shares) and the model keeps learning."""
    run_config = {"cr-mode": "relay", "secure-aggregation": True}
    timing = clientapp_timing(_run_config(run_config), NUM_CLIENTS)
    ready = timing.startup_timeout(1 + NUM_CLIENTS)
    options = _options(
        tmp_path, run_config, timing, kills=(KillSpec(partition=1, round=2),), kill_delay=1.0
    )
    options = dataclasses.replace(
        options,
        timeout=timing.run_timeout(
            rounds=ROUNDS,
            first_round_stages=SECURE_FIRST_ROUND_STAGES,
            later_round_stages=SECURE_LATER_ROUND_STAGES,
            concurrent=NUM_CLIENTS,
            poll_interval=POLL_INTERVAL,
            wait_for_nodes=ready,
        ),
    )
    rearm_timeout(3 * options.ready_timeout + options.timeout + 20)
    result = run_local(options)
    assert result.ok, _explain(result)
    rows = result.metrics
    assert [r["round"] for r in rows] == [1, 2], _explain(result)
    summary = result.summary
    assert summary is not None
    m = summary["num_params"]

    first, second = rows
    sa1, sa2 = first["secure_aggregation"], second["secure_aggregation"]
    assert first["participants"] == NUM_CLIENTS and sa1["survivors"] == NUM_CLIENTS, sa1
    assert sa1["b"] == 3 and sa1["abandoned"] is None  # ceil(log2(4 + 1)): one bit, 4 clients
    # The update reply is the b-bit masked vector: 3 bits per parameter plus small framing.
    per_client = sa1["bytes_up"]["update"] / NUM_CLIENTS
    assert m * 3 / 8 <= per_client <= m * 3 / 8 * 1.02 + 4096, (per_client, m)

    (killed,) = result.killed
    dropped = {str(k): v for k, v in second["dropped"].items()}
    assert list(dropped) == [str(killed.node_id)], _explain(result)
    assert second["participants"] == NUM_CLIENTS - 1, _explain(result)
    assert sa2["abandoned"] is None and sa2["survivors"] == NUM_CLIENTS - 1, sa2
    assert sa2["pipelined"] and sa2["round_trips"] == 2, sa2  # shares came with round 1's unmask
    assert second["test_accuracy"] > MIN_ROUND2_ACCURACY, _explain(result)
    assert result.events[-1]["event"] == "run_end"
    _assert_nothing_left(result)
