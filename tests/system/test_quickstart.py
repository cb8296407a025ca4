"""``examples/quickstart``: a plain Flower app made private with ``CorBin`` and ``corbin_mod``,
run with the commands of its README, parsed from the README.

The example is Flower's PyTorch quickstart shape with its own model, data and training loop; it
imports nothing from this project but ``from corbin_fl import CorBin, corbin_mod``. Every test
runs on a copy of the app in the test's folder and checks that ``flwr`` left the copy's
``pyproject.toml`` as it was, with ``FLWR_HOME`` in the test's folder.

- :func:`test_quickstart_simulation_as_documented_learns_and_a_refused_run_fails`: the README's
  simulation commands as written, in ``bash`` (its ``export`` line, then ``flwr run . local
  --stream ...`` and ``flwr ls local``) against the simulation SuperLink that ``flwr`` would
  start, started first by the test with ``flwr``'s flags in the environment the README's
  ``export`` leaves (Flower gives its own start 15 s, which a busy machine misses: see
  :class:`Simulation`); the run learns, its log has CorBin-FL's lines, and ``flwr ls`` says
  ``finished:completed``. Then the same command with ``epsilon=4.0`` against the same SuperLink:
  every node's default policy refuses it, the run stops in round 1 and ``flwr ls`` says
  ``finished:failed``, the log naming both settings. Only the ports of the SuperLink (Flower's
  ``FLWR_LOCAL_*_PORT`` variables) are the test's own; the README's ``kill $(pgrep ...)`` is not
  run (it would stop other tests' SuperLinks): the test stops the SuperLink by its PID and checks
  that the documented pattern matches its command line.
- :func:`test_quickstart_deployment_as_documented_learns_and_survives_a_kill`:
  the README's ``flower-superlink`` and ``flower-supernode`` lines with their ports remapped to
  free ones, its ``[superlink.quickstart]`` connection with that address, and its ``flwr run .
  quickstart --stream`` with the test's ``--run-config`` (rounds, ``out-dir``, stage timeouts
  derived from a probe of this machine). Round 1 has every node, one pair and the odd one out
  (LDPQ, one bit as well): its update replies are ``ceil(m/8)`` bytes plus a bounded framing. In
  round 2 one SuperNode is SIGKILLed: the round completes with the other two and records the node
  in ``dropped``. Three nodes, as in the README: they cover the pair, the odd one out and the kill.
- :func:`test_quickstart_numpy_handler_learns_in_simulation`: the numpy-only ClientApp (softmax
  regression on float64 arrays) with its ServerApp, by the README's simulation command.

"Learns" is a bound on the server-side test accuracy (1,000 held-out digits, chance 0.1),
derived from measured runs: see :data:`MIN_ACCURACY` and :data:`MIN_ACCURACY_NUMPY`.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

import pytest
from waits import RAY_START_FAILED, REPO_ROOT, ClientAppTiming, wait_progressing

from corbin_fl.deploy.flower import (
    FlowerCli,
    app_config,
    flower_executable,
    format_config_args,
    http_ok,
    wait_online,
)
from corbin_fl.deploy.follow import JsonlTail
from corbin_fl.deploy.processes import (
    ProcessRegistry,
    alive_matching,
    descendants,
    flower_env,
    free_ports,
    signal_ref,
    thread_share,
)

pytestmark = [pytest.mark.e2e]

EXAMPLE: Final[Path] = REPO_ROOT / "examples" / "quickstart"
README: Final[Path] = EXAMPLE / "README.md"
KILLED_PARTITION: Final[int] = 1
KILL_ROUND: Final[int] = 2
DEPLOYMENT_ROUNDS: Final[int] = 2
"""Rounds of the deployment test: round 1 with every node, round 2 with the kill."""
KILL_DELAY_S: Final[float] = 1.0
"""Seconds after round ``KILL_ROUND - 1``'s metrics row (the start of ``KILL_ROUND``)."""
POLL_INTERVAL: Final[float] = 0.5
"""How often ``CorBin`` pulls replies by default (a term of the stage bound only)."""
FIRST_ROUND_STAGES, LATER_ROUND_STAGES = 3, 2
"""Relay mode (the default): keygen, pair and update in round 1; a steady round is one update
stage (the pipelined relay), and a round after a drop adds a pair stage for the nodes that lost
their partner: 2 bounds every later round."""
HEARTBEAT_WINDOW_S: Final[float] = 60.0
"""A SIGKILLed SuperNode is answered for by the SuperLink (NODE_UNAVAILABLE) at most 2 x 30 s
after it died (Flower's heartbeat patience, 1.41's and 1.42's); until then its stage waits for
it."""
NUMPY_COMPONENTS: Final[Mapping[str, str]] = {
    "serverapp": "quickstart.server_app_numpy:app",
    "clientapp": "quickstart.client_app_numpy:app",
}
MIN_ACCURACY: Final[float] = 0.3
"""Test accuracy of the CNN at the app's defaults (epsilon 1.0) after the runs' rounds; chance is
0.1. Measured runs: 0.638 then 0.781 (deployment, 2 rounds), 0.115 then 0.885 (3 rounds); the
bound is well below the lowest measured value after round 2 and far above chance."""
MIN_ACCURACY_NUMPY: Final[float] = 0.5
"""Test accuracy of softmax regression after the README's rounds at the app's defaults."""
FRAMING_PER_ARRAY: Final[int] = 256
"""Bytes an update reply may carry per array beyond its packed bits: the ``np.save`` header
(128 bytes for these shapes) and the padding of the last byte."""
FRAMING_PER_REPLY: Final[int] = 1024
"""Bytes an update reply may carry beyond its arrays: the app's metrics (``num-examples``,
``train_loss``) and CorBin-FL's per-reply fields (round, next round's public key)."""
WIDE: Final[int] = 250
"""Terminal width the ``flwr`` commands see: ``flwr ls`` draws a table as wide as the terminal and
cuts its cells (``finished…``) on a narrow one."""
ACCURACY_LINE: Final[re.Pattern[str]] = re.compile(r"round (\d+): test accuracy ([0-9.]+)")
"""What the example's ServerApp logs after each round (``global_evaluate``)."""


# ====================================================================== the README, parsed
def readme_blocks(lang: str) -> list[list[str]]:
    """The README's fenced ``lang`` blocks, each as its command lines (continuations joined,
    comments and blank lines dropped)."""
    text = README.read_text(encoding="utf-8")
    blocks = re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)
    out = []
    for block in blocks:
        lines = [ln.strip() for ln in block.replace("\\\n", " ").splitlines()]
        out.append([ln for ln in lines if ln and not ln.startswith("#")])
    return out


def readme_lines(prefix: str) -> list[str]:
    """Every command line of the README's bash blocks that starts with ``prefix``."""
    return [ln for block in readme_blocks("bash") for ln in block if ln.startswith(prefix)]


def simulation_commands() -> tuple[str, str, str]:
    """``(export line, flwr run line, flwr ls line)`` of the README's simulation runtime."""
    (export,) = readme_lines("export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1")
    (run,) = readme_lines("flwr run . local ")
    (ls,) = readme_lines("flwr ls local")
    return export, run, ls


def documented_num_supernodes() -> int:
    """``num-supernodes`` of the README's simulation command."""
    (n,) = re.findall(r"num-supernodes=(\d+)", simulation_commands()[1])
    return int(n)


def documented_rounds() -> int:
    """``num-server-rounds`` of the README's simulation command."""
    (n,) = re.findall(r"num-server-rounds=(\d+)", simulation_commands()[1])
    return int(n)


def test_readme_installs_both_apps_and_turns_off_runtime_installation() -> None:
    """The install block (checked statically: the suite has the packages already)."""
    (install,) = [b for b in readme_blocks("bash") if any(ln.startswith("pip") for ln in b)]
    assert install == ["pip install -e .", "export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1"]
    text = README.read_text(encoding="utf-8")
    assert "pip install -e\n../.." in text or "pip install -e ../.." in text
    # every documented `flwr run` shows the run's outcome, and its status is read after it
    runs = readme_lines("flwr run ")
    assert runs and all("--stream" in r.split() for r in runs), runs
    for r in runs:
        connection = shlex.split(r)[3]
        assert readme_lines(f"flwr ls {connection}"), f"no status check after {r}"
    # no federation table for Flower to move out of the app's pyproject.toml
    with (EXAMPLE / "pyproject.toml").open("rb") as fh:
        assert "federations" not in tomllib.load(fh)["tool"]["flwr"]


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


def _run_bound(
    timing: ClientAppTiming, *, rounds: int, concurrent: int, queue: int, ready: float
) -> float:
    """Seconds ``rounds`` rounds of the app may take (:meth:`ClientAppTiming.run_timeout`,
    ``queue`` clients after one another per worker)."""
    return timing.run_timeout(
        rounds=rounds,
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


def _assert_untouched(app: Path, before: bytes) -> None:
    """``flwr`` did not rewrite the app's ``pyproject.toml`` (it has no federation table)."""
    ours = (app / "pyproject.toml").read_bytes()
    assert ours == before, ours.decode()[-800:]


# ====================================================================== deployment
# Covers the probe; the limit is then moved to the bound derived from it (`rearm_timeout`).
@pytest.mark.timeout(900)
def test_quickstart_deployment_as_documented_learns_and_survives_a_kill(
    tmp_path: Path, rearm_timeout: Callable[[float], None]
) -> None:
    (superlink_line,) = readme_lines("flower-superlink ")
    supernode_lines = readme_lines("flower-supernode ")
    nodes = len(supernode_lines)
    (toml_block,) = [b for b in readme_blocks("toml") if b[0].startswith("[superlink.")]
    connection = toml_block[0].removeprefix("[superlink.").removesuffix("]")
    (run_line,) = readme_lines(f"flwr run . {connection} ")
    (ls_line,) = readme_lines(f"flwr ls {connection}")
    assert nodes == 3 and shlex.split(run_line) == ["flwr", "run", ".", connection, "--stream"]

    app = _copy_app(tmp_path)
    before = (app / "pyproject.toml").read_bytes()
    timing, sizes = _probe(app, "torch", nodes)
    ready = timing.startup_timeout(1 + nodes)
    run = _run_bound(timing, rounds=DEPLOYMENT_ROUNDS, concurrent=nodes, queue=1, ready=ready)
    run += HEARTBEAT_WINDOW_S
    rearm_timeout(2 * ready + run + 60)  # start-up, the run, the clean-up

    # The README's processes, with its ports remapped to free ones (another test may hold 8000).
    link_port, *node_ports = free_ports(1 + nodes)
    (documented_link,) = re.findall(r"--port (\d+)", superlink_line)
    remap = {f"127.0.0.1:{documented_link}": f"127.0.0.1:{link_port}"}
    home, logs, out = tmp_path / "home", tmp_path / "logs", tmp_path / "out"
    home.mkdir()
    registry = ProcessRegistry(
        env={"FLWR_HOME": str(home), "COLUMNS": str(WIDE), **thread_share(nodes)}
    )
    env = flower_env(registry.env)

    def argv(line: str, port: int) -> list[str]:
        args = shlex.split(line)
        args[args.index("--port") + 1] = str(port)
        args = [remap.get(a, a) for a in args]
        return [flower_executable(args[0]), *args[1:]]

    try:
        link = registry.start("superlink", argv(superlink_line, link_port), logs / "superlink.log")
        toml = "\n".join(toml_block).replace(
            f"127.0.0.1:{documented_link}", f"127.0.0.1:{link_port}"
        )
        (home / "config.toml").write_text(toml + "\n", encoding="utf-8")
        cli = FlowerCli(connection, env, timeout=ready)
        # the SuperLink is up: waited on while its log grows (a slow start under load goes on;
        # a start silent for longer than `ready` is a stall), as test_state_migration's
        wait_progressing(
            lambda: http_ok(f"http://127.0.0.1:{link_port}/health"),
            link.running,
            logs / "superlink.log",
            ready,
            "the SuperLink",
        )
        supernodes = {}
        for line, port in zip(supernode_lines, node_ports, strict=True):
            (partition,) = re.findall(r"partition-id=(\d+)", line)
            supernodes[int(partition)] = registry.start(
                f"supernode-{partition}", argv(line, port), logs / f"supernode-{partition}.log"
            )
        node_ids: dict[int, int] = {}
        wait_online(supernodes, node_ids, cli, ready, str(logs))

        stage = timing.stage_timeouts(nodes, poll_interval=POLL_INTERVAL)
        test_keys = {"num-server-rounds": DEPLOYMENT_ROUNDS, "out-dir": str(out), **stage}
        cmd = [flower_executable("flwr"), *shlex.split(run_line)[1:]]
        cmd += ["--run-config", format_config_args(test_keys)]
        flwr_run = registry.start("flwr-run", cmd, logs / "flwr-run.log", cwd=app)
        metrics = JsonlTail(out / "metrics.jsonl")
        rows: list[dict[str, Any]] = []
        kill_at: float | None = None
        killed_id: int | None = None
        deadline = time.monotonic() + run
        while flwr_run.running() and time.monotonic() < deadline:
            rows += metrics.read_new()
            if kill_at is None and any(r.get("round") == KILL_ROUND - 1 for r in rows):
                kill_at = time.monotonic() + KILL_DELAY_S
            if killed_id is None and kill_at is not None and time.monotonic() >= kill_at:
                registry.kill_tree(supernodes[KILLED_PARTITION], signal.SIGKILL)
                killed_id = node_ids[KILLED_PARTITION]
            registry.snapshot()
            time.sleep(0.25)
        log = flwr_run.log_text()
        assert not flwr_run.running(), f"run not done within {run:.0f} s\n{_explain(rows, log)}"
        rows += metrics.read_new()
        status = cli(*shlex.split(ls_line)[1:])
    finally:
        registry.stop_all(grace=3.0)
    assert flwr_run.popen.returncode == 0, _explain(rows, log)
    assert "finished:completed" in status.stdout, status.stdout[-2000:]
    _assert_untouched(app, before)
    accuracy = [r["accuracy"] for r in rows]
    print(f"test accuracy per round: {accuracy}")
    assert [r["round"] for r in rows] == list(range(1, DEPLOYMENT_ROUNDS + 1)), _explain(rows, log)
    assert float(rows[-1]["accuracy"]) >= MIN_ACCURACY, _explain(rows, log)
    assert (out / "summary.json").is_file() and (out / "final_model.pt").is_file()

    # Round 1, everybody: one bit per parameter on the uplink (plus bounded framing).
    first = rows[0]
    assert _count(first["participants"]) == nodes and not _dropped_ids(first), first
    assert (first["pairs"], first["unpaired"]) == (1, 1), first  # a pair and the odd one out
    per_client = first["bytes_up"][_update_stage(first["bytes_up"])] / nodes
    bits = math.ceil(sum(sizes) / 8)
    overhead = FRAMING_PER_ARRAY * len(sizes) + FRAMING_PER_REPLY
    print(f"update reply: {per_client:.0f} B per client for m = {sum(sizes)} (m/8 = {bits} B)")
    assert bits <= per_client <= bits + overhead, (per_client, bits, overhead, first["bytes_up"])

    # Round 2: the killed node is dropped, the round completes with the other two and does not
    # wait longer than Flower takes to declare the node gone plus one stage.
    assert killed_id is not None, _explain(rows, log)
    second = rows[KILL_ROUND - 1]
    assert _dropped_ids(second) == {str(killed_id)}, _explain(rows, log)
    assert _count(second["participants"]) == nodes - 1, _explain(rows, log)
    stage_bound = timing.stage_timeout(nodes, first=False, poll_interval=POLL_INTERVAL)
    limit = HEARTBEAT_WINDOW_S + LATER_ROUND_STAGES * stage_bound
    assert second["round_seconds"] <= limit, (second["round_seconds"], limit)
    # CorBin-FL says in the log what became of each sampled node (not just Flower's "1 result")
    assert re.search(r"round 2: 2 of 3 sampled node\(s\) sent an update \(1 dropped\)", log), log[
        -3000:
    ]


# ====================================================================== simulation
class Simulation:
    """The README's simulation commands, as written, in ``bash`` from a copy of the app.

    ``flwr run . local`` uses the simulation SuperLink on ``FLWR_LOCAL_*_PORT`` (the test's own
    ports) and starts one when none answers, with a fixed 15 s for it to come up (Flower 1.41 and
    1.42), which a busy machine misses. So :meth:`start_superlink` starts it first, exactly as
    ``flwr`` would (the same flags, in the environment the README's ``export`` leaves), and waits
    for it as long as this machine needs; ``flwr run`` then finds it running. :meth:`close` stops
    it by its PID, with everything below it.
    """

    def __init__(self, tmp_path: Path, app: Path) -> None:
        self.app = app
        self.http, control = free_ports(2)
        self.control = f"127.0.0.1:{control}"
        self.home = tmp_path / "home"
        self.home.mkdir()
        self.env = flower_env(
            {
                "FLWR_HOME": str(self.home),
                "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(self.http),
                "FLWR_LOCAL_CONTROL_API_PORT": str(control),
                "COLUMNS": str(WIDE),
            }
        )
        self.env.pop("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", None)  # the README sets it
        self.superlink: subprocess.Popen[bytes] | None = None

    def start_superlink(self, export: str, timeout: float) -> None:
        """Start the simulation SuperLink as ``flwr`` does (``flwr.cli.local_superlink``), after
        the README's ``export`` line, and wait until its ``/health`` answers."""
        state = self.home / "local-superlink"
        state.mkdir(parents=True, exist_ok=True)
        argv = [
            "flower-superlink",
            "--insecure",
            "--simulation",
            "--isolation",
            "subprocess",
            "--control-api-address",
            self.control,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.http),
            "--database",
            str(state / "state.db"),
        ]
        with (state / "superlink.log").open("ab") as log:
            self.superlink = subprocess.Popen(
                ["bash", "-c", f"{export}\nexec {shlex.join(argv)}"],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        superlink = self.superlink
        wait_progressing(  # while its log grows: see the deployment test's SuperLink
            lambda: http_ok(f"http://127.0.0.1:{self.http}/health"),
            lambda: superlink.poll() is None,
            state / "superlink.log",
            timeout,
            "the simulation SuperLink",
        )

    def bash(self, lines: list[str], timeout: float) -> str:
        """Run ``lines`` in one ``bash -e``; its output (the run's streamed log)."""
        script = "set -e\n" + "\n".join(lines) + "\n"
        res = subprocess.run(
            ["bash", "-c", script],
            cwd=self.app,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )
        out = res.stdout + res.stderr
        assert res.returncode == 0, out[-4000:]
        return out

    def superlinks(self) -> list[Any]:
        return alive_matching([f"--control-api-address {self.control}"])

    def close(self) -> None:
        """Stop the simulation SuperLink, with everything below it."""
        for ref in self.superlinks():
            for child in [*descendants(ref.pid), ref]:
                signal_ref(child, signal.SIGKILL)
        if self.superlink is not None:
            self.superlink.wait(timeout=60)


def _simulate(
    tmp_path: Path,
    app: Path,
    timing: ClientAppTiming,
    rearm_timeout: Callable[[float], None],
    *,
    refused_too: bool = False,
) -> tuple[str, str]:
    """The README's simulation commands on ``app``: ``(log, status)`` of the run; with
    ``refused_too``, then the same run at ``epsilon=4.0`` (checked here: it fails)."""
    export, run_line, ls_line = simulation_commands()
    clients = documented_num_supernodes()
    # Ray runs the virtual clients one worker per core: at most `cores` at once, the rest queue.
    workers = min(clients, timing.cores)
    queue = -(-clients // workers)
    ready = timing.startup_timeout(1 + clients)  # SuperLink, then Ray and its workers
    run = _run_bound(
        timing, rounds=documented_rounds(), concurrent=workers, queue=queue, ready=ready
    )
    refused = ready + timing.stage_timeout(workers, first=True, poll_interval=POLL_INTERVAL) * queue
    rearm_timeout(ready + run + (refused if refused_too else 0) + 60)
    before = (app / "pyproject.toml").read_bytes()
    sim = Simulation(tmp_path, app)
    ray_failed = 0  # runs that Ray's own node start-up failed (each listed as finished:failed)

    def attempt(line: str, timeout: float) -> str:
        """Run ``line``; once more if Ray could not start its node (:data:`RAY_START_FAILED`),
        with the test's limit moved on by the attempt's bound."""
        nonlocal ray_failed
        for _ in range(2):
            out = sim.bash([export, line], timeout=timeout)
            if RAY_START_FAILED not in out:
                return out
            ray_failed += 1
            # the attempt again, then at most the rest of this function's waits
            rearm_timeout(timeout + 2 * ready + (refused if refused_too else 0) + 60)
        pytest.skip("Ray did not start its node within its fixed 30 s twice (machine overloaded)")

    try:
        sim.start_superlink(export, timeout=ready)
        log = attempt(run_line, ready + run)
        status = sim.bash([ls_line], timeout=ready)
        (superlink,) = sim.superlinks()
        # the README's `kill $(pgrep -f "...")` names this SuperLink (not run: see the docstring)
        (pattern,) = re.findall(r'pgrep -f "([^"]+)"', README.read_text(encoding="utf-8"))
        assert pattern in superlink.cmdline, superlink.cmdline
        if refused_too:
            refused_line = run_line.replace("num-server-rounds=", "epsilon=4.0 num-server-rounds=")
            assert refused_line != run_line
            refusal = attempt(refused_line, refused)
            after = sim.bash([ls_line], timeout=ready)
            assert after.count("finished:failed") == 1 + ray_failed, after[-2000:]
            assert "PolicyRefusedError: round 1: every sampled node" in refusal, refusal[-3000:]
            assert "epsilon 4 is above this node's corbin-max-epsilon 1" in refusal
            assert "corbin-max-epsilon >= 4" in refusal and "round 1: test accuracy" not in refusal
    finally:
        sim.close()
    _assert_untouched(app, before)
    return log, status.strip()


def _assert_learned(log: str, bound: float) -> None:
    accuracy = {int(r): float(a) for r, a in ACCURACY_LINE.findall(log)}
    print(f"test accuracy per round: {accuracy}")
    rounds = documented_rounds()
    assert sorted(accuracy) == list(range(rounds + 1)), log[-4000:]  # round 0: the initial model
    assert accuracy[rounds] >= bound, (accuracy, log[-4000:])


# Covers the probe; the limit is then moved to the bound derived from it (`rearm_timeout`).
@pytest.mark.timeout(900)
def test_quickstart_simulation_as_documented_learns_and_a_refused_run_fails(
    tmp_path: Path, rearm_timeout: Callable[[float], None]
) -> None:
    app = _copy_app(tmp_path)
    clients = documented_num_supernodes()
    timing, _ = _probe(app, "torch", clients)
    log, status = _simulate(tmp_path, app, timing, rearm_timeout, refused_too=True)
    assert f"{clients} simulated SuperNodes" in log, log[-4000:]
    _assert_learned(log, MIN_ACCURACY)
    assert "finished:completed" in status, status
    # CorBin-FL's own lines: the run, and what became of the sampled nodes in every round
    assert "CorBin-FL run" in log, log[-4000:]
    for rnd in range(1, documented_rounds() + 1):
        assert f"round {rnd}: {clients} of {clients} sampled node(s) sent an update" in log


# Covers the probe; the limit is then moved to the bound derived from it (`rearm_timeout`).
@pytest.mark.timeout(900)
def test_quickstart_numpy_handler_learns_in_simulation(
    tmp_path: Path, rearm_timeout: Callable[[float], None]
) -> None:
    app = _copy_app(tmp_path, NUMPY_COMPONENTS)
    timing, _ = _probe(app, "numpy", documented_num_supernodes())
    log, status = _simulate(tmp_path, app, timing, rearm_timeout)
    _assert_learned(log, MIN_ACCURACY_NUMPY)
    assert "finished:completed" in status, status
