"""``examples/quickstart``: a plain Flower app made private with ``CorBin`` and ``corbin_mod``.

The example is Flower's PyTorch quickstart shape with its own model, data and training loop; it
imports nothing from this project but ``from corbin_fl import CorBin, corbin_mod``. These tests
run it the Flower way, on a copy of the app in the test's folder (``flwr run`` rewrites the
``[tool.flwr.federations]`` table of the app it runs, so the checkout is never touched):

- :func:`test_quickstart_deployment_learns_one_bit_uplink_survives_a_killed_supernode`: Flower's
  ``flower-superlink`` and three insecure ``flower-supernode`` processes (node config with
  ``partition-id``/``num-partitions`` and the privacy policy of the README), then ``flwr run``.
  Round 1 has every node, one pair and the odd one out (LDPQ, one bit as well): its update
  replies are ``ceil(m/8)`` bytes plus a bounded framing. In round 2 one SuperNode is
  SIGKILLed: the round completes with the other two and records the node in ``dropped``. The
  global model learns: test accuracy after round 2 is far above chance. Three nodes, not four:
  every node costs a SuperNode, an executor and a ClientApp process (which imports torch) per
  stage, most of the test's CPU, and three cover the pair, the odd one out and the kill.
- :func:`test_quickstart_simulation_learns`: the same app on Flower's simulation runtime (Ray),
  ``flwr run`` with the app's own ``local-simulation`` federation (4 virtual SuperNodes).
- :func:`test_quickstart_numpy_handler_learns_in_simulation`: the numpy-only ClientApp
  (softmax regression on float64 arrays) with its ServerApp, on the simulation runtime.

"Learns" is a bound on the server-side test accuracy (1,000 held-out digits, chance 0.1),
derived from measured runs: see :data:`MIN_ACCURACY` and :data:`MIN_ACCURACY_NUMPY`.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

import pytest
from waits import REPO_ROOT, ClientAppTiming

from deploy.flower import CONNECTION_NAME, app_config, flower_executable, format_config_args
from deploy.follow import JsonlTail
from deploy.local import KilledNode, LocalDeployment

pytestmark = [pytest.mark.e2e]

EXAMPLE: Final[Path] = REPO_ROOT / "examples" / "quickstart"
NUM_CLIENTS: Final[int] = 4
"""Virtual SuperNodes of the app's ``local-simulation`` federation."""
DEPLOYMENT_NODES: Final[int] = 3
"""SuperNodes of the deployment test: a pair and the odd one out in round 1, a pair after the
kill."""
ROUNDS: Final[int] = 2
KILLED_PARTITION: Final[int] = 1
KILL_ROUND: Final[int] = 2
KILL_DELAY_S: Final[float] = 1.0
"""Seconds after round ``KILL_ROUND - 1``'s metrics row (the start of ``KILL_ROUND``)."""
POLL_INTERVAL: Final[float] = 0.5
"""How often ``CorBin`` pulls replies by default (a term of the stage bound only)."""
FIRST_ROUND_STAGES, LATER_ROUND_STAGES = 3, 2
"""Relay mode (the default): keys, pair, update in round 1; pair, update afterwards."""
HEARTBEAT_WINDOW_S: Final[float] = 60.0
"""A SIGKILLed SuperNode is answered for by the SuperLink (NODE_UNAVAILABLE) at most 2 x 30 s
after it died (Flower 1.41's heartbeat patience); until then its stage waits for it."""
NUMPY_COMPONENTS: Final[Mapping[str, str]] = {
    "serverapp": "quickstart.server_app_numpy:app",
    "clientapp": "quickstart.client_app_numpy:app",
}
MIN_ACCURACY: Final[float] = 0.3
"""Test accuracy of the CNN after ``ROUNDS`` rounds at the app's defaults (epsilon 1.0); chance
is 0.1. Measured: see the report in the module docstring of the commit; the bound is set well
below the lowest measured value and far above chance."""
MIN_ACCURACY_NUMPY: Final[float] = 0.5
"""Test accuracy of softmax regression after ``ROUNDS`` rounds at the app's defaults."""
FRAMING_PER_ARRAY: Final[int] = 256
"""Bytes an update reply may carry per array beyond its packed bits: the ``np.save`` header
(128 bytes for these shapes) and the padding of the last byte."""
FRAMING_PER_REPLY: Final[int] = 1024
"""Bytes an update reply may carry beyond its arrays: the app's metrics (``num-examples``,
``train_loss``) and CorBin-FL's per-reply fields (round, next round's public key)."""

_PROBE: Final[str] = """
import importlib, json, sys, time
flavour, partitions, config = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
importlib.import_module(config["clientapp"])  # what a ClientApp process imports
print("imported", flush=True)
from quickstart.data import load_partition
if flavour == "numpy":
    from quickstart import task_numpy
    model = task_numpy.init_model()
    x, y = load_partition(0, partitions)
    task_numpy.train(model, x, y, epochs=config["local-epochs"], lr=config["lr"],
                     batch_size=config["batch-size"])
    sizes = [a.size for a in model]
else:
    from quickstart import task
    net = task.Net()
    loader = task.load_data(0, partitions, config["batch-size"])
    task.train(net, loader, config["local-epochs"], config["lr"], "cpu")
    sizes = [p.numel() for p in net.state_dict().values()]
print(json.dumps({"sizes": sizes}), flush=True)
"""


def _copy_app(tmp_path: Path, components: Mapping[str, str] | None = None) -> Path:
    """A copy of the example app under ``tmp_path`` (optionally with other components)."""
    app = tmp_path / "app"
    shutil.copytree(EXAMPLE, app, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    if components:
        toml = app / "pyproject.toml"
        text = toml.read_text(encoding="utf-8")
        for key, value in components.items():
            text, count = re.subn(rf'(?m)^{key} = ".*"$', f'{key} = "{value}"', text)
            assert count == 1, f"no {key} line in {toml}"
        toml.write_text(text, encoding="utf-8")
    return app


def _probe(app: Path, flavour: str, partitions: int) -> tuple[ClientAppTiming, list[int]]:
    """Time one update of the example's ClientApp in a fresh process; also its array sizes.

    Like :func:`conftest.measure_clientapp`, for this app: start-up is the import of the
    ClientApp module (Flower, this project's mod, torch for the CNN), ``first`` adds loading this
    node's share and one local training round with the app's defaults. ``partition`` is 0: in
    a deployment every message is a fresh process that loads its share again.
    """
    defaults = app_config(app)
    components = _components(app)
    config = {k: defaults[k] for k in ("local-epochs", "lr", "batch-size")}
    config["clientapp"] = components["clientapp"].split(":")[0]
    env = {
        **os.environ,
        "PYTHONPATH": str(app),
    }  # as a ClientApp process: the FAB, installed packages
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-c", _PROBE, flavour, str(partitions), json.dumps(config)],
        cwd=app,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first_line = proc.stdout.readline()
        startup = time.monotonic() - t0
        out, err = proc.communicate(timeout=1800)  # a hang guard; the probe is the measurement
        total = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0 and first_line.strip() == "imported", err[-2000:]
    sizes = [int(n) for n in json.loads(out.strip().splitlines()[-1])["sizes"]]
    timing = ClientAppTiming(startup=startup, cores=os.cpu_count() or 1, first=total, partition=0.0)
    print(f"quickstart ClientApp probe ({flavour}): {timing}, arrays {sizes}")
    return timing, sizes


def _components(app: Path) -> dict[str, str]:
    """``[tool.flwr.app.components]`` of the app (which ServerApp and ClientApp it runs)."""
    with (app / "pyproject.toml").open("rb") as fh:
        return dict(tomllib.load(fh)["tool"]["flwr"]["app"]["components"])


def _run_bound(timing: ClientAppTiming, *, concurrent: int, queue: int, ready: float) -> float:
    """Seconds ``ROUNDS`` rounds of the app may take (:meth:`ClientAppTiming.run_timeout`,
    ``queue`` clients after one another per worker)."""
    return timing.run_timeout(
        rounds=ROUNDS,
        first_round_stages=FIRST_ROUND_STAGES,
        later_round_stages=LATER_ROUND_STAGES,
        concurrent=concurrent,
        poll_interval=POLL_INTERVAL,
        wait_for_nodes=ready,
        queue=queue,
    )


def _dropped_ids(row: Mapping[str, Any]) -> set[str]:
    """Node ids a ``metrics.jsonl`` row records as dropped (a ``{node: reason}`` map or a list)."""
    dropped = row.get("dropped") or {}
    return {str(n) for n in (dropped.keys() if isinstance(dropped, Mapping) else dropped)}


def _count(value: Any) -> int:
    """A count that a row may hold as a number or as a list of node ids."""
    return len(value) if isinstance(value, list) else int(value)


def _update_stage(bytes_up: Mapping[str, int]) -> str:
    """The update stage's key of a row's ``bytes_up`` (the one stage that carries the bits)."""
    (stage,) = [k for k in bytes_up if k != "total" and "update" in k]
    return stage


def _explain(rows: list[dict[str, Any]], log: str) -> str:
    keep = ("round", "accuracy", "participants", "dropped", "round_trips", "round_seconds")
    return f"metrics: {[{k: r.get(k) for k in keep} for r in rows]}\nlog tail:\n{log[-4000:]}"


def _assert_learns(rows: list[dict[str, Any]], bound: float, log: str) -> None:
    assert [r["round"] for r in rows] == list(range(1, ROUNDS + 1)), _explain(rows, log)
    accuracy = float(rows[-1]["accuracy"])
    print(f"test accuracy per round: {[r['accuracy'] for r in rows]}")
    assert accuracy >= bound, _explain(rows, log)


# Covers the probe; the limit is then moved to the bound derived from it (`rearm_timeout`).
@pytest.mark.timeout(900)
def test_quickstart_deployment_learns_one_bit_uplink_survives_a_killed_supernode(
    tmp_path: Path, rearm_timeout: Callable[[float], None]
) -> None:
    app = _copy_app(tmp_path)
    timing, sizes = _probe(app, "torch", DEPLOYMENT_NODES)
    ready = timing.startup_timeout(1 + DEPLOYMENT_NODES)
    run = _run_bound(timing, concurrent=DEPLOYMENT_NODES, queue=1, ready=ready) + HEARTBEAT_WINDOW_S
    rearm_timeout(2 * ready + run + 60)  # start-up, the run, the clean-up
    out = tmp_path / "out"
    logs = tmp_path / "logs"
    # The privacy policy of the README, as node config: what every node accepts at most.
    policy = {"corbin-max-epsilon": 1.0, "corbin-mechanisms": "corbin"}
    killed: KilledNode | None = None
    with LocalDeployment(
        DEPLOYMENT_NODES, logs, tmp_path / "home", ready_timeout=ready, node_config=policy
    ) as dep:
        cmd = [flower_executable("flwr"), "run", str(app), CONNECTION_NAME, "--stream"]
        cmd += [
            "--run-config",
            format_config_args(
                {
                    "num-server-rounds": ROUNDS,
                    "out-dir": str(out),
                    **timing.stage_timeouts(DEPLOYMENT_NODES, poll_interval=POLL_INTERVAL),
                }
            ),
        ]
        flwr_run = dep.registry.start("flwr-run", cmd, logs / "flwr-run.log")
        metrics = JsonlTail(out / "metrics.jsonl")
        rows: list[dict[str, Any]] = []
        kill_at: float | None = None
        deadline = time.monotonic() + run
        while flwr_run.running() and time.monotonic() < deadline:
            rows += metrics.read_new()
            if kill_at is None and any(r.get("round") == KILL_ROUND - 1 for r in rows):
                kill_at = time.monotonic() + KILL_DELAY_S
            if killed is None and kill_at is not None and time.monotonic() >= kill_at:
                killed = dep.kill_supernode(KILLED_PARTITION, KILL_ROUND)
            dep.registry.snapshot()
            time.sleep(0.25)
        log = flwr_run.log_text()
        assert not flwr_run.running(), f"run not done within {run:.0f} s\n{_explain(rows, log)}"
        rows += metrics.read_new()
    assert flwr_run.popen.returncode == 0, _explain(rows, log)
    _assert_learns(rows, MIN_ACCURACY, log)
    assert (out / "summary.json").is_file()
    assert (out / "final_model.pt").is_file()

    # Round 1, everybody: one bit per parameter on the uplink (plus bounded framing).
    first = rows[0]
    assert _count(first["participants"]) == DEPLOYMENT_NODES and not _dropped_ids(first), first
    assert (first["pairs"], first["unpaired"]) == (1, 1), first  # a pair and the odd one out
    stage = _update_stage(first["bytes_up"])
    per_client = first["bytes_up"][stage] / DEPLOYMENT_NODES
    bits = math.ceil(sum(sizes) / 8)
    overhead = FRAMING_PER_ARRAY * len(sizes) + FRAMING_PER_REPLY
    print(f"update reply: {per_client:.0f} B per client for m = {sum(sizes)} (m/8 = {bits} B)")
    assert bits <= per_client <= bits + overhead, (per_client, bits, overhead, first["bytes_up"])

    # Round 2: the killed node is dropped, the round completes with the other two and does not
    # wait longer than Flower takes to declare the node gone plus one stage.
    assert killed is not None and killed.node_id is not None, _explain(rows, log)
    second = rows[KILL_ROUND - 1]
    assert _dropped_ids(second) == {str(killed.node_id)}, _explain(rows, log)
    assert _count(second["participants"]) == DEPLOYMENT_NODES - 1, _explain(rows, log)
    stage_bound = timing.stage_timeout(DEPLOYMENT_NODES, first=False, poll_interval=POLL_INTERVAL)
    limit = HEARTBEAT_WINDOW_S + LATER_ROUND_STAGES * stage_bound
    assert second["round_seconds"] <= limit, (second["round_seconds"], limit)


def _simulate(
    tmp_path: Path, app: Path, timing: ClientAppTiming, rearm_timeout: Callable[[float], None]
) -> tuple[list[dict[str, Any]], str]:
    """``flwr run <app> local-simulation`` (the app's own federation) on a simulation SuperLink
    of this test, with waits derived from ``timing``; ``(metrics.jsonl rows, streamed log)``."""
    # Ray runs the virtual clients one worker per core: at most `cores` at once, the rest queue.
    workers = min(NUM_CLIENTS, timing.cores)
    queue = -(-NUM_CLIENTS // workers)
    ready = timing.startup_timeout(1 + NUM_CLIENTS)  # SuperLink, then Ray and its workers
    run = _run_bound(timing, concurrent=workers, queue=queue, ready=ready)
    rearm_timeout(ready + run + 60)  # start-up, the run, the clean-up
    out = tmp_path / "out"
    with LocalDeployment(
        0, tmp_path / "logs", tmp_path / "home", ready_timeout=ready, simulation=True
    ) as dep:
        res = dep.flwr(
            "run",
            str(app),
            "local-simulation",
            "--stream",
            "--run-config",
            format_config_args(
                {
                    "num-server-rounds": ROUNDS,
                    "out-dir": str(out),
                    **timing.stage_timeouts(workers, poll_interval=POLL_INTERVAL, queue=queue),
                }
            ),
            timeout=run,
        )
    log = res.stdout + res.stderr
    if "The current node timed out during startup" in log:
        # Ray gives its raylet a hard-coded 30 s to register; an overloaded machine misses it.
        pytest.skip("Ray could not start its node within its fixed 30 s (machine overloaded)")
    assert res.returncode == 0, log[-4000:]
    assert "4 simulated SuperNodes" in log, log[-4000:]  # the app's federation was used
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line]
    return rows, log


# Covers the probe; the limit is then moved to the bound derived from it (`rearm_timeout`).
@pytest.mark.timeout(900)
def test_quickstart_simulation_learns(
    tmp_path: Path, rearm_timeout: Callable[[float], None]
) -> None:
    app = _copy_app(tmp_path)
    timing, _ = _probe(app, "torch", NUM_CLIENTS)
    rows, log = _simulate(tmp_path, app, timing, rearm_timeout)
    _assert_learns(rows, MIN_ACCURACY, log)
    assert all(_count(r["participants"]) == NUM_CLIENTS for r in rows), _explain(rows, log)


# Covers the probe; the limit is then moved to the bound derived from it (`rearm_timeout`).
@pytest.mark.timeout(900)
def test_quickstart_numpy_handler_learns_in_simulation(
    tmp_path: Path, rearm_timeout: Callable[[float], None]
) -> None:
    app = _copy_app(tmp_path, NUMPY_COMPONENTS)
    timing, sizes = _probe(app, "numpy", NUM_CLIENTS)
    rows, log = _simulate(tmp_path, app, timing, rearm_timeout)
    _assert_learns(rows, MIN_ACCURACY_NUMPY, log)
    first = rows[0]
    per_client = first["bytes_up"][_update_stage(first["bytes_up"])] / NUM_CLIENTS
    bits = math.ceil(sum(sizes) / 8)
    # float64 arrays: a plain reply would be 8m bytes; this one is m/8 plus framing.
    assert bits <= per_client <= bits + FRAMING_PER_ARRAY * len(sizes) + FRAMING_PER_REPLY
