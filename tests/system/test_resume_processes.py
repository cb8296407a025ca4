"""Server-side crash and resume on real processes: SIGKILL the ServerApp mid-run, start again
with resume = true, and the run finishes as if nothing happened."""

from __future__ import annotations

import json
import logging
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from waits import ClientAppTiming

from corbin_fl.deploy.flower import RUN_ID_RE, http_ok
from corbin_fl.deploy.follow import read_jsonl
from corbin_fl.mechanisms.accounting import PrivacyLedger
from corbin_fl.server.checkpoint import (
    CHECKPOINT_DIR,
    STATE_FILE,
)

# ============================================================================ end to end
E2E_CLIENTS = 2
"""One pair: every check below (each release once, round 1 by the old nodes and round 2 by the new
ones, every node in both rounds) holds for any number of clients, and each client costs a
SuperNode twice and a ClientApp process per stage (the test's CPU is mostly these)."""


E2E_ROUNDS = 2


E2E_POLL = 0.5


E2E_FIRST_ROUND_STAGES = 2


E2E_LATER_ROUND_STAGES = 1


def _wait(cond: Any, timeout: float, what: str, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def _checkpoint_round(out: Path) -> int:
    try:
        return int(json.loads((out / CHECKPOINT_DIR / STATE_FILE).read_text())["round"])
    except (OSError, ValueError, KeyError):
        return 0


@pytest.mark.e2e
# Covers the probe; the limit is then moved to the bound derived from it (`rearm_timeout`).
@pytest.mark.timeout(1800)
def test_server_side_sigkill_and_resume_on_real_processes(
    tmp_path: Path,
    clientapp_timing: Callable[[Mapping[str, Any], int], ClientAppTiming],
    rearm_timeout: Callable[[float], None],
) -> None:
    from corbin_fl.deploy.cli import repo_root
    from corbin_fl.deploy.flower import CONNECTION_NAME, flower_executable
    from corbin_fl.deploy.local import LocalDeployment
    from corbin_fl.deploy.processes import descendants, is_alive

    t_start = time.monotonic()
    out = tmp_path / "out"
    out.mkdir()
    logs = tmp_path / "logs"
    run_config: dict[str, Any] = {
        "num-rounds": E2E_ROUNDS,
        "mechanism": "corbin",
        # derived: one round trip per steady round; this is also the real-process run of that mode
        "cr-mode": "derived",
        "max-steps": 2,
        "seed": 0,
        "min-clients": E2E_CLIENTS,
        "poll-interval": E2E_POLL,
    }
    # Waits from a probe of one ClientApp update on this machine, now (tests/waits.py): all
    # E2E_CLIENTS ClientApps of a stage may run at once; start-up is a SuperLink and the
    # SuperNodes; a run (the first up to its round-1 checkpoint, or the resumed one) takes at
    # most its stages at their timeouts plus the ServerApp's own work.
    timing = clientapp_timing(run_config, E2E_CLIENTS)
    ready = timing.startup_timeout(1 + E2E_CLIENTS)
    run_config.update(
        {
            **timing.stage_timeouts(E2E_CLIENTS, poll_interval=E2E_POLL),
            "wait-for-nodes": ready,
            "out-dir": str(out),
        }
    )
    run_limit = timing.run_timeout(
        rounds=E2E_ROUNDS,
        first_round_stages=E2E_FIRST_ROUND_STAGES,
        later_round_stages=E2E_LATER_ROUND_STAGES,
        concurrent=E2E_CLIENTS,
        poll_interval=E2E_POLL,
        wait_for_nodes=ready,
    )
    # the first start-up, the new SuperLink and SuperNodes, both runs, the kill, the run status
    # (one CLI start-up) and the clean-up, each at its own limit
    rearm_timeout(4 * run_limit + 4 * ready + timing.startup_timeout(1) + 20)

    def flwr_run(dep: LocalDeployment, name: str, config: dict[str, Any]) -> Any:
        path = tmp_path / f"{name}.toml"
        path.write_text(tomli_w.dumps(config))
        cmd = [flower_executable("flwr"), "run", str(repo_root()), CONNECTION_NAME, "--stream"]
        return dep.registry.start(name, [*cmd, "--run-config", str(path)], logs / f"{name}.log")

    dep = LocalDeployment(E2E_CLIENTS, logs, tmp_path / "flwr-home", ready_timeout=ready)
    with dep:
        assert dep.superlink is not None
        first = flwr_run(dep, "flwr-run-1", run_config)
        _wait(
            lambda: _checkpoint_round(out) >= 1 or not first.running(),
            run_limit,
            "the checkpoint of round 1",
        )
        assert _checkpoint_round(out) == 1, first.log_tail()
        # --- SIGKILL the whole server side: SuperLink, its SuperExec, the ServerApp process
        server_side = [dep.superlink.ref, *descendants(dep.superlink.pid)]
        assert any("flwr-serverapp" in ref.cmdline for ref in server_side), server_side
        dep.registry.kill_tree(dep.superlink, signal.SIGKILL)
        dep.registry.kill_tree(first, signal.SIGKILL)
        # SIGKILL cannot be caught or delayed by the process: this only guards against a hang.
        _wait(lambda: not any(is_alive(r) for r in server_side), 20, "the server side to die")
        old_ids = dict(dep.node_ids)
        # The SuperNodes would retry (exponential back-off) and then EXIT on the new SuperLink's
        # "401 Unauthorized" (it has in-memory state and does not know them); stop them now
        # rather than wait for that, and start them again once the new SuperLink is up.
        for node in dep.supernodes.values():
            dep.registry.kill_tree(node, signal.SIGKILL)

        # --- a new SuperLink on the same port (same command line)
        superlink = dep.registry.start(
            "superlink-2", list(dep.superlink.popen.args), logs / "superlink-2.log"
        )
        dep.superlink = superlink
        health = f"http://{dep.address}/health"
        # A SuperLink that is still running is still starting, and one that died is seen at
        # once; the bound only guards a hang, so it is the run's own (`ready`, from a probe
        # taken minutes earlier on a quieter machine, ran out in CI at load ~14).
        _wait(lambda: http_ok(health) or not superlink.running(), run_limit, "the new SuperLink")
        assert superlink.running(), superlink.log_tail()
        # --- the SuperNodes again, with the same command lines (same Runtime API ports)
        for partition, old in list(dep.supernodes.items()):
            dep.supernodes[partition] = dep.registry.start(
                f"supernode-{partition}-2",
                list(old.popen.args),
                logs / f"supernode-{partition}-2.log",
                meta=old.meta,
            )
        dep.node_ids.clear()
        # As for the SuperLink: a SuperNode that exits is reported at once, so the bound only
        # guards a hang (the first phase's `ready` ran out here under a parallel test's load).
        dep.ready_timeout = run_limit
        new_ids = dep.wait_registered()

        # --- resume
        second = flwr_run(dep, "flwr-run-2", {**run_config, "resume": True})
        _wait(lambda: not second.running(), run_limit, "the resumed run", interval=0.5)
        assert second.popen.returncode == 0, second.log_tail(40)
        run_id = RUN_ID_RE.search(second.log_text())
        assert run_id is not None, second.log_tail()
        # Each try is one `flwr ls` process (a start-up); the status is final once `flwr run`
        # has returned.
        status = _wait(
            lambda: _finished_status(dep, int(run_id.group(1))),
            timing.startup_timeout(1),
            "run status",
        )
        assert status == "finished:completed", status

    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["round"] for r in rows] == list(range(1, E2E_ROUNDS + 1)), rows
    assert all(r["participants"] == E2E_CLIENTS and not r["dropped"] for r in rows), rows
    doc = json.loads((out / CHECKPOINT_DIR / STATE_FILE).read_text())
    assert doc["round"] == E2E_ROUNDS and doc["aborted_releases"] == []
    ledger = PrivacyLedger.from_json(json.dumps(doc["ledger"]))
    pairs = [(e.round, e.node) for e in ledger]
    assert len(pairs) == len(set(pairs)) == E2E_CLIENTS * E2E_ROUNDS  # every release once
    assert {n for t, n in pairs if t == 1} == {str(n) for n in old_ids.values()}
    assert {n for t, n in pairs if t == 2} == {str(n) for n in new_ids.values()}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == E2E_ROUNDS and len(set(summary["run_ids"])) == 2
    events = [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()]
    assert [e["from_round"] for e in events if e["event"] == "resume"] == [1]
    logging.getLogger(__name__).info("crash + resume e2e: %.0f s", time.monotonic() - t_start)


def _finished_status(dep: Any, run_id: int) -> str | None:
    status, _ = dep.cli.run_status(run_id)
    return status if status is not None and status.startswith("finished") else None
