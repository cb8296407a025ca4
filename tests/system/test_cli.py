"""Tests of ``corbin-fl`` (CLI parsing, run-config merging) and of the launcher's mechanics.

The unit tests are fast. The ``e2e``-marked tests start real Flower 1.42 processes on loopback
against a tiny throwaway Flower app written into a temporary folder (one ``query.ping`` stage per
round, the same ``events.jsonl``/``metrics.jsonl``/``summary.json`` contract as the real app), so
that start-up, readiness, fault injection, failure detection, timeouts, Ctrl-C and cleanup are
checked independently of the CorBin-FL app itself (which ``test_e2e_local.py`` runs).
"""

from __future__ import annotations

import http.server
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import pytest
from rich.console import Console
from waits import (
    HANG_GUARD_S,
    LOAD_HEADROOM,
    RAY_START_FAILED,
    ClientAppTiming,
    StartupTiming,
)

from corbin_fl.deploy import cli
from corbin_fl.deploy import local as local_mod
from corbin_fl.deploy.flower import (
    format_config_args,
    http_ok,
    parse_config_string,
    write_connection,
)
from corbin_fl.deploy.follow import read_jsonl
from corbin_fl.deploy.local import LocalDeployment
from corbin_fl.deploy.processes import (
    DEFAULT_TASK_POLL_INTERVAL,
    TASK_POLL_ENV,
    THREADS_ENV,
    LauncherError,
    ProcessRegistry,
    alive_matching,
    descendants,
    flower_env,
    free_ports,
    is_alive,
    listens_on,
    process_ref,
    thread_share,
)
from corbin_fl.deploy.run import KillSpec, LocalRunOptions, run_local, run_simulation

# ====================================================================== tiny Flower app
_TINY_PYPROJECT = """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "tinyapp"
version = "0.1.0"
description = "launcher test app"
license = "Apache-2.0"
dependencies = ["flwr==1.42.*"]

[tool.flwr.app]
publisher = "corbin-fl-tests"

[tool.flwr.app.components]
serverapp = "tinyapp.server:app"
clientapp = "tinyapp.client:app"

[tool.flwr.app.config]
num-rounds = 2
mechanism = "corbin"
out-dir = ""
stage-timeout = 8.0
first-stage-timeout = 90.0
fail-round = 0
hang = false
min-nodes = 1
"""

_TINY_SERVER = '''\
"""Tiny ServerApp: one query.ping stage per round, writes the launcher's file contract."""

import json
import os
import time

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    out = str(cfg["out-dir"])
    rounds = int(cfg["num-rounds"])

    def emit(record: dict, name: str = "events.jsonl") -> None:
        with open(os.path.join(out, name), "a") as fh:
            fh.write(json.dumps(record) + "\\n")

    emit({"event": "run_start"})
    deadline = time.time() + 60
    while len(list(grid.get_node_ids())) < int(cfg["min-nodes"]) and time.time() < deadline:
        time.sleep(0.5)
    for t in range(1, rounds + 1):
        emit({"event": "round_start", "round": t, "time": time.time()})
        if bool(cfg["hang"]):
            time.sleep(3600)
        if int(cfg["fail-round"]) == t:
            raise RuntimeError("tiny app: failing on purpose")
        t0 = time.time()
        nodes = sorted(grid.get_node_ids())
        msgs = [
            Message(
                RecordDict({"c": ConfigRecord({"round": t})}),
                dst_node_id=n,
                message_type="query.ping",
                group_id=str(t),
            )
            for n in nodes
        ]
        timeout = float(cfg["first-stage-timeout" if t == 1 else "stage-timeout"])
        replies = list(grid.send_and_receive(msgs, timeout=timeout))
        ok = [r for r in replies if not r.has_error()]
        parts = sorted(int(r.content["r"]["partition"]) for r in ok)
        emit({"event": "stage_end", "round": t, "stage": "ping", "replies": len(ok),
              "seconds": time.time() - t0})
        emit({"round": t, "test_accuracy": 0.5, "participants": len(ok), "partitions": parts,
              "round_seconds": time.time() - t0}, "metrics.jsonl")
        emit({"event": "round_end", "round": t})
    emit({"event": "run_end"})
    with open(os.path.join(out, "summary.json"), "w") as fh:
        json.dump({"rounds": rounds, "privacy": {"epsilon": 1.0}}, fh)
'''

_TINY_CLIENT = '''\
"""Tiny ClientApp: answers query.ping with its partition id."""

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

app = ClientApp()


@app.query("ping")
def ping(msg: Message, context: Context) -> Message:
    part = int(context.node_config["partition-id"])
    return Message(RecordDict({"r": ConfigRecord({"partition": part})}), reply_to=msg)
'''


@pytest.fixture(scope="module")
def tiny_app(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A minimal Flower app in a temporary folder (test-only; never the deliverable app)."""
    root = tmp_path_factory.mktemp("tinyapp")
    (root / "pyproject.toml").write_text(_TINY_PYPROJECT)
    pkg = root / "tinyapp"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('"""Tiny test app."""\n')
    (pkg / "server.py").write_text(_TINY_SERVER)
    (pkg / "client.py").write_text(_TINY_CLIENT)
    return root


SEND_AND_RECEIVE_POLL_S: Final[float] = 3.0
"""Flower 1.42's ``Grid.send_and_receive`` (the tiny ServerApp's loop) pulls replies every 3 s."""


def _tiny_waits(
    startup: StartupTiming, nodes: int, *, processes: int | None = None
) -> tuple[float, float, float]:
    """``(ready, stage, run)`` of a tiny-app run on ``nodes`` nodes, from a start-up probe taken
    now: the start-up of ``processes`` Flower processes (default: the SuperLink and the nodes;
    :meth:`StartupTiming.startup_timeout`); a stage's wait for its live nodes
    (:meth:`ClientAppTiming.stage_timeout` with the ServerApp pulling every
    :data:`SEND_AND_RECEIVE_POLL_S`, the tiny ClientApp's whole work being its process's
    start-up); the run: the ServerApp's start-up, the first stage (the app's default
    ``first-stage-timeout``, 90 s) and a later stage. None is below the fixed value these tests
    used before (25 s, 200 s)."""
    app = ClientAppTiming(
        startup=startup.startup, cores=startup.cores, first=startup.startup, partition=0.0
    )
    stage = max(25.0, app.stage_timeout(nodes, first=True, poll_interval=SEND_AND_RECEIVE_POLL_S))
    run = max(200.0, LOAD_HEADROOM * startup.startup + 90.0 + stage)
    return startup.startup_timeout(processes or 1 + nodes), stage, run


def _round_start_time(events: list[dict], rnd: int) -> float:
    return next(e["time"] for e in events if e.get("event") == "round_start" and e["round"] == rnd)


def _assert_no_leftovers(result_processes: list, extra_needles: list[str] | None = None) -> None:
    deadline = time.monotonic() + 5.0
    while True:
        left = [p for p in result_processes if is_alive(p)]
        left += alive_matching(extra_needles or [])
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not left, f"processes left behind: {left}"


# ====================================================================== unit: parsing
def test_kill_spec_parse_and_validation() -> None:
    assert KillSpec.parse("1@2") == KillSpec(partition=1, round=2)
    assert KillSpec.parse(" 0 @ 7 ") == KillSpec(0, 7)
    for bad in ("1", "1@", "@2", "a@b", "1@2@3", "-1@2", "1@-2", ""):
        with pytest.raises(ValueError, match="PARTITION@ROUND"):
            KillSpec.parse(bad)
    with pytest.raises(ValueError, match="round must be >= 1"):
        KillSpec.parse("1@0")
    with pytest.raises(TypeError):
        KillSpec(partition=1.0, round=2)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        KillSpec.parse(12)  # type: ignore[arg-type]


def test_config_string_round_trip(tmp_path: Path) -> None:
    cfg = {"epsilon": 0.5, "d": 5, "cr-mode": "derived", "test-z-digest": True, "x": -3}
    text = format_config_args(cfg)
    assert text == 'epsilon=0.5 d=5 cr-mode="derived" test-z-digest=true x=-3'
    assert parse_config_string(text) == cfg
    # An unquoted word is the string the user meant (Flower itself needs the quotes).
    assert parse_config_string("mechanism=fedavg  num-rounds=2") == {
        "mechanism": "fedavg",
        "num-rounds": 2,
    }
    assert parse_config_string("  ") == {}
    for bad in ("epsilon", "=3", "a=1 junk", 'a="open'):
        with pytest.raises(ValueError):
            parse_config_string(bad)
    with pytest.raises(ValueError, match="double quote"):
        format_config_args({"a": 'x"y'})
    with pytest.raises(ValueError, match="invalid config key"):
        format_config_args({"a b": 1})
    with pytest.raises(TypeError):
        format_config_args({"a": [1, 2]})
    path = tmp_path / "over.toml"
    path.write_text('epsilon = 2.0\nmodel = "resnet18"\n')
    assert parse_config_string(str(path)) == {"epsilon": 2.0, "model": "resnet18"}
    with pytest.raises(ValueError, match="not found"):
        parse_config_string(str(tmp_path / "missing.toml"))


def test_merge_run_config_precedence() -> None:
    parser = cli.build_parser()
    args = parser.parse_args(["local"])
    # no defaults of its own: the app's [tool.flwr.app.config] holds the only ones, so
    # `corbin-fl local` runs what `flwr run .`, compose and the simulation runtime run
    assert cli.merge_run_config(args) == {}
    args = parser.parse_args(
        [
            "local",
            "--run-config",
            'epsilon=0.5 num-rounds=7 out-dir="/x"',
            "--run-config",
            "epsilon=0.25",
            "--rounds",
            "2",
            "--cr-mode",
            "derived",
            "--d",
            "3",
            "--range-mode",
            "layer",
            "--model",
            "resnet18",
        ]
    )
    merged = cli.merge_run_config(args)
    assert merged == {
        "num-rounds": 2,  # the flag wins over --run-config
        "epsilon": 0.25,  # a later --run-config wins over an earlier one
        "cr-mode": "derived",
        "range-mode": "layer",
        "d": 3,
        "model": "resnet18",
    }  # out-dir is the launcher's (from --out), never passed through


def _documented_commands() -> list[str]:
    """Every ``corbin-fl local`` / ``simulate`` command line of README.md and docs/RUNNING.md."""
    import shlex

    out = []
    for doc in (cli.repo_root() / "README.md", cli.repo_root() / "docs" / "RUNNING.md"):
        text = doc.read_text(encoding="utf-8").replace("\\\n", " ")
        for line in text.splitlines():
            line = line.split(" # ")[0].strip()
            if re.match(r"corbin-fl (local|simulate)\b", line) and ": error:" not in line:
                out.append(shlex.join(shlex.split(line)[1:]))
    return out


@pytest.mark.parametrize("command", _documented_commands())
def test_documented_commands_run_the_app_defaults(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each documented command parses and validates before anything starts, and overrides only
    what its flags say: every other key runs the app's own default (the one set of defaults)."""
    import shlex

    from corbin_fl.app.config import AppConfig

    monkeypatch.chdir(tmp_path)
    for folder in ("cifar-10-batches-py", "femnist", "shakespeare"):  # the documented data-dirs
        (tmp_path / "data" / folder).mkdir(parents=True)
    args = cli.build_parser().parse_args(shlex.split(command))
    options = cli.options_from_args(args)
    argv = shlex.split(command)
    keys = {
        "--rounds": "num-rounds",
        "--epsilon": "epsilon",
        "--d": "d",
        "--cr-mode": "cr-mode",
        "--mechanism": "mechanism",
        "--model": "model",
        "--dataset": "dataset",
        "--range-mode": "range-mode",
    }
    expected = {keys[a] for a in argv if a in keys}
    for i, a in enumerate(argv):
        if a == "--run-config":
            expected |= set(parse_config_string(argv[i + 1]))
    # the command sends what its flags name and nothing else: no default of its own
    assert set(options.run_config) == expected, command
    AppConfig.from_flower(options.run_config)  # and it is a valid configuration


def test_parser_rejects_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    parser = cli.build_parser()
    for argv in (
        ["local", "--clients", "0"],
        ["local", "--rounds", "x"],
        ["local", "--epsilon", "-1"],
        ["local", "--kill-client", "2"],
        ["local", "--run-config", "nonsense"],
        ["local", "--timeout", "nan"],
        ["simulate", "--kill-client", "1@2"],
    ):
        with pytest.raises(SystemExit) as exc:
            parser.parse_args(argv)
        assert exc.value.code == cli.EXIT_USAGE, argv
    assert "PARTITION@ROUND" in capsys.readouterr().err


def test_options_validation(tmp_path: Path, repo_root: Path) -> None:
    parser = cli.build_parser()
    ok = cli.options_from_args(
        parser.parse_args(
            ["local", "--clients", "3", "--kill-client", "2@1", "--out", str(tmp_path)]
        )
    )
    assert ok.app_dir == repo_root
    assert ok.out_dir == tmp_path.resolve()
    assert ok.kills == (KillSpec(2, 1),)
    with pytest.raises(ValueError, match="cannot kill partition 3"):
        cli.options_from_args(
            parser.parse_args(["local", "--clients", "3", "--kill-client", "3@1"])
        )
    # The app's own AppConfig rejects bad keys/values before any process starts.
    with pytest.raises(ValueError, match="num-round"):
        cli.options_from_args(parser.parse_args(["local", "--run-config", "num-round=2"]))
    with pytest.raises(ValueError, match="cr-mode"):
        cli.options_from_args(parser.parse_args(["local", "--cr-mode", "relayed"]))
    with pytest.raises(ValueError, match="partition-id"):
        cli.options_from_args(parser.parse_args(["local", "--node-config", "partition-id=1"]))
    with pytest.raises(ValueError, match="pyproject"):
        cli.options_from_args(parser.parse_args(["local", "--app", str(tmp_path)]))
    used = tmp_path / "used"
    used.mkdir()
    (used / "metrics.jsonl").write_text("")
    with pytest.raises(ValueError, match="already holds a run"):
        cli.options_from_args(parser.parse_args(["local", "--out", str(used)]))
    with pytest.raises(ValueError, match="simulate"):
        LocalRunOptions(app_dir=repo_root, out_dir=tmp_path, kills=(KillSpec(0, 1),)).validate(
            simulation=True
        )


def test_main_usage_errors_start_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main([]) == cli.EXIT_USAGE
    out = tmp_path / "never"
    code = cli.main(["local", "--run-config", "epsilonn=1.0", "--out", str(out)])
    assert code == cli.EXIT_USAGE
    assert "did you mean 'epsilon'" in capsys.readouterr().err
    assert not out.exists()


def test_console_script_help() -> None:
    res = subprocess.run(
        ["corbin-fl", "local", "--help"],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    for flag in ("--clients", "--kill-client", "--run-config", "--keep-logs", "--timeout"):
        assert flag in res.stdout


def test_default_out_dir_is_unique(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    first = cli.default_out_dir()
    assert first.parent == tmp_path / "runs"
    assert re.fullmatch(r"\d{8}-\d{6}", first.name)
    first.mkdir(parents=True)
    second = cli.default_out_dir()
    assert second != first and not second.exists()


def test_tables_render_metrics_and_privacy_report() -> None:
    console = Console(record=True, width=200)
    rows = [
        {
            "round": 1,
            "test_accuracy": 0.8125,
            "participants": 4,
            "dropped": {},
            "round_trips": 2,
            "bytes_up": 4000,
            "round_seconds": 12.5,
        },
        {
            "round": 2,
            "test_accuracy": 0.9,
            "participants": 3,
            "dropped": {"123": "timeout"},
            "round_trips": 2,
            "bytes_up": {"pair": 100, "update": 2900, "total": 3000},
            "round_seconds": 30.25,
        },
    ]
    console.print(cli.rounds_table(rows))
    console.print(cli.drops_table(rows))
    console.print(cli.summary_table({"privacy": {"epsilon_total": 3.5}, "run_config": {"a": 1}}))
    text = console.export_text()
    assert "0.8125" in text and "1,000 B" in text
    assert re.search(r"\b2\s+123\s+timeout\b", text)  # round, node, reason
    assert cli.drops_table(rows[:1]) is None  # nothing dropped, no table
    assert "privacy.epsilon_total" in text and "3.5" in text
    assert "run_config" not in text


def _drop_run_state() -> tuple[Any, list[list[tuple[str, Any]]]]:
    """A run in round 3 of 3: partition 1 (a 19-digit node id) killed and dropped in round 2
    with a long reason. Each step is what one poll of the launcher reads (a round's row, its
    ``round_end`` and the next ``round_start`` can come in one), or a kill."""
    from corbin_fl.deploy.follow import RunProgress
    from corbin_fl.deploy.local import KilledNode

    node = 1234567890123456789
    reason = "update: no reply within 30 s " + "(the SuperNode was gone) " * 8
    state = RunProgress(num_rounds=3, run_id=42, num_clients=4)
    state.node_ids = {0: 11, 1: node, 2: 33, 3: 44}
    events = [
        {"event": "round_start", "round": 1},
        {"event": "stage_end", "round": 1, "stage": "update", "dropped": []},
        {"event": "round_end", "round": 1},
        {"event": "round_start", "round": 2},
        {"event": "stage_end", "round": 2, "stage": "keygen", "dropped": []},
        {"event": "stage_end", "round": 2, "stage": "update", "dropped": [node]},
        {"event": "round_end", "round": 2},
        {"event": "round_start", "round": 3},
    ]
    rows = [
        {
            "round": 1,
            "test_accuracy": 0.5,
            "sampled": 4,
            "participants": 4,
            "dropped": {},
            "round_seconds": 12.5,
        },
        {
            "round": 2,
            "test_accuracy": 0.75,
            "sampled": 4,
            "participants": 3,
            "dropped": {str(node): reason},
            "round_trips": 3,
            "bytes_up": {"update": 123456789, "total": 123456789},
            "round_seconds": 1234.5,
            "val_accuracy": 0.7412,
            "test_loss": 0.61234,
        },
    ]
    steps: list[list[tuple[str, Any]]] = [
        [("event", events[:2])],
        [("event", events[2:5]), ("row", rows[0])],  # events are read first, then rows
        [("kill", KilledNode(1, 2, 999, node, 0.0))],
        [("event", events[5:6])],
        [("row", rows[1])],  # the row before its round_end event
        [("event", events[6:])],
    ]
    return state, steps


def _feed(state: Any, steps: list[list[tuple[str, Any]]], view: cli.ProgressView) -> None:
    """Apply each step to ``state`` as the launcher would, calling ``view`` after each."""
    for step in steps:
        for kind, item in step:
            if kind == "event":
                for ev in item:
                    state.apply_event(ev)
            elif kind == "kill":
                state.killed.append(item)
            else:
                state.add_rows([item])
        view(state)
        view(state)  # nothing new: prints nothing twice


@pytest.mark.parametrize("terminal", [True, False])
def test_progress_view_at_80_columns(terminal: bool) -> None:
    """Every event line once, in order, no line over 80 columns, the kill shown when it
    happens (before the round's result), nodes and drops as the server reports them, the
    long drop reason whole (wrapped on its own lines under its round's result)."""
    import io

    buf = io.StringIO()
    console = Console(file=buf, force_terminal=terminal, width=80, highlight=False)
    state, steps = _drop_run_state()
    state.phase = "running"
    with cli.ProgressView(console, num_clients=4, auto_refresh=False) as view:
        assert (view.live is not None) == terminal
        _feed(state, steps, view)
        status = Console(width=80, record=True, file=io.StringIO())
        status.print(*view.status_lines(state), sep="\n")
    text = buf.getvalue()
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text).replace("\r", "\n")
    lines = [ln for ln in plain.splitlines() if ln.strip()]
    assert all(len(ln) <= 80 for ln in lines), [ln for ln in lines if len(ln) > 80]
    kill = "killed SuperNode of partition 1 (pid 999, node 1234567890123456789) in round 2"
    dropped = "round 2: node 1234567890123456789 (partition 1) dropped in stage update"
    done = "round 2/3 done: test acc 0.75, clients 3/4, dropped 1"
    first = "round 1/3 done: test acc 0.5, clients 4/4, dropped 0, 12.5 s"
    for expected in ("run 42 submitted", "round 1/3 started", first, kill, dropped, done):
        assert plain.count(expected) == 1, (expected, plain)
    order = ["round 1/3 started", first, "round 2/3 started", kill, dropped, done]
    order.append("round 3/3 started")
    at = [plain.index(text) for text in order]
    assert at == sorted(at), plain
    reason = "update: no reply within 30 s " + "(the SuperNode was gone) " * 8
    first = next(i for i, ln in enumerate(lines) if ln.startswith("  dropped partition 1"))
    assert lines[first - 1].startswith(done) or terminal  # on a terminal: a status between
    shown_reason = " ".join(" ".join(lines[first : first + 4]).split())
    assert shown_reason == f"dropped partition 1 (node 1234567890123456789): {reason.strip()}"
    assert not any(ln.endswith("…") for ln in lines[first : first + 4])  # not cut: wrapped
    if not terminal:  # a log file: plain lines, one per event, no control codes
        assert "\x1b" not in text and "\r" not in text
        # run id, 3 rounds started, kill, drop, 2 rounds done, the reason on 4 lines
        assert len(lines) == 12, lines
    shown = status.export_text()
    assert all(len(ln) <= 80 for ln in shown.splitlines())
    assert "round 3/3" in shown and "nodes 3/4" in shown and "dropped 1" in shown
    assert "last drop: round 2, node 1234567890123456789 (partition 1): update" in shown


def test_node_count_follows_the_server() -> None:
    """``nodes``: deployed before any report, less each drop, not counting a dead node twice."""
    from corbin_fl.deploy.follow import RunProgress

    state = RunProgress(num_clients=4)
    assert (state.active_nodes(), state.drop_count()) == (4, 0)
    state.stage_drops.append((1, "update", 7))
    assert (state.active_nodes(), state.drop_count()) == (3, 1)
    state.metrics.append({"round": 1, "sampled": 4, "participants": 3, "dropped": {"7": "x"}})
    assert (state.active_nodes(), state.drop_count()) == (3, 1)
    state.stage_drops.append((2, "update", 7))  # sampled again while the SuperLink lists it
    assert state.active_nodes() == 3 and state.drop_count() == 2
    state.stage_drops.append((2, "update", 8))  # another node lost
    assert state.active_nodes() == 2
    # the SuperLink no longer lists node 7: round 3 samples 2 nodes, both answer
    state.metrics.append(
        {"round": 2, "sampled": 4, "participants": 2, "dropped": {"7": "x", "8": "y"}}
    )
    state.metrics.append({"round": 3, "sampled": 2, "participants": 2, "dropped": {}})
    assert (state.active_nodes(), state.drop_count()) == (2, 3)  # drops, not nodes
    assert RunProgress().active_nodes() is None


def test_rounds_and_drops_tables_fit_80_columns() -> None:
    import io

    _, steps = _drop_run_state()
    rows = [item for step in steps for kind, item in step if kind == "row"]
    console = Console(width=80, record=True, file=io.StringIO())
    console.print(cli.rounds_table(rows))
    console.print(cli.drops_table(rows))
    text = console.export_text()
    assert all(len(ln) <= 80 for ln in text.splitlines())
    for header in ("round", "test acc", "val acc", "loss", "clients", "drops", "up/client"):
        assert header in text  # no header cut
    assert re.search(r"\b2\s+0\.75\s+0\.7412\s+0\.6123\s+3/4\s+1\s+3\s+39\.2 MiB", text)
    assert re.search(r"1234567890123456789\s+update: no reply within 30 s .*…", text)
    assert text.count("no reply") == 1  # one row, not wrapped


# ====================================================================== unit: mechanics
# an HTTP/2 SETTINGS frame, the first bytes a gRPC server sends on a new connection
_HTTP2_SETTINGS = bytes.fromhex("000006040000000000000300000064")


@pytest.mark.parametrize(
    ("reply", "ok"),
    [
        (b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", True),
        (b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n", False),
        (_HTTP2_SETTINGS, False),  # a gRPC server on the port: BadStatusLine, not a crash
        (b"", False),  # closed without a reply
    ],
)
def test_http_ok_is_true_only_for_a_2xx_reply(reply: bytes, ok: bool) -> None:
    """The launcher's readiness probe: whatever answers on the port, it returns a bool (a
    SuperLink that lost its port to another process's gRPC server crashed the run before)."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)

        def answer() -> None:
            conn, _ = srv.accept()
            with conn:
                conn.recv(4096)
                conn.sendall(reply)

        thread = threading.Thread(target=answer, daemon=True)
        thread.start()
        assert http_ok(f"http://127.0.0.1:{srv.getsockname()[1]}/health", timeout=30.0) is ok
        thread.join()


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux's /proc")
def test_listens_on_names_the_process_that_holds_a_port() -> None:
    """A health check on a port counts only when the process started there is the one
    listening: another process may take a port that free_ports found free."""
    with socket.socket() as four, socket.socket(socket.AF_INET6) as six:
        four.bind(("127.0.0.1", 0))
        four.listen(1)
        six.bind(("::1", 0))
        six.listen(1)
        for port in (four.getsockname()[1], six.getsockname()[1]):
            assert listens_on(os.getpid(), port) is True
        other = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                                 stdin=subprocess.PIPE)  # fmt: skip
        try:
            assert listens_on(other.pid, four.getsockname()[1]) is False
        finally:
            other.communicate(b"")
    (port,) = free_ports(1)  # nobody listens there
    assert listens_on(os.getpid(), port) is False


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = free_ports(5)
    assert len(set(ports)) == 5
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
    with pytest.raises(ValueError):
        free_ports(0)


def test_thread_share_splits_the_cores_and_keeps_the_users_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.delenv(THREADS_ENV, raising=False)
    assert thread_share(1) == {THREADS_ENV: "8"}
    assert thread_share(3) == {THREADS_ENV: "2"}
    assert thread_share(16) == {THREADS_ENV: "1"}
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="trainers"):
            thread_share(bad)  # type: ignore[arg-type]
    # A local deployment's processes get the share of its SuperNodes; a simulation none.
    assert LocalDeployment(4, tmp_path, tmp_path).env[THREADS_ENV] == "2"
    assert THREADS_ENV not in LocalDeployment(0, tmp_path, tmp_path, simulation=True).env
    monkeypatch.setenv(THREADS_ENV, "3")
    assert thread_share(4) == {}
    assert LocalDeployment(4, tmp_path, tmp_path).env[THREADS_ENV] == "3"


def test_flower_env_polls_at_the_tuned_interval_unless_the_user_sets_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(TASK_POLL_ENV, raising=False)
    env = flower_env({"FLWR_HOME": "/x"})
    assert env[TASK_POLL_ENV] == DEFAULT_TASK_POLL_INTERVAL == "0.2"
    assert env["FLWR_HOME"] == "/x" and env["FLWR_TELEMETRY_ENABLED"] == "0"
    monkeypatch.setenv(TASK_POLL_ENV, "1.0")
    assert flower_env()[TASK_POLL_ENV] == "1.0"


def test_write_connection(tmp_path: Path) -> None:
    path = write_connection(tmp_path / "home", "127.0.0.1:4321")
    data = tomllib.loads(path.read_text())
    assert data["superlink"]["default"] == "corbin-local"
    assert data["superlink"]["corbin-local"] == {"address": "127.0.0.1:4321", "insecure": True}


def test_jsonl_tail_waits_for_complete_lines(tmp_path: Path) -> None:
    from corbin_fl.deploy.follow import JsonlTail

    path = tmp_path / "e.jsonl"
    tail = JsonlTail(path)
    assert tail.read_new() == []
    path.write_text('{"a": 1}\n{"b"')
    assert tail.read_new() == [{"a": 1}]
    with path.open("a") as fh:
        fh.write(': 2}\nnot json\n{"c": 3}\n')
    assert tail.read_new() == [{"b": 2}, {"c": 3}]
    assert read_jsonl(path) == [{"a": 1}, {"b": 2}, {"c": 3}]


_TREE_SCRIPT = """
import subprocess, sys, time
# a child in our group and a grandchild that escapes into its own session (like SuperExec)
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
signal_ignored = sys.argv[1] == "stubborn"
if signal_ignored:
    import signal
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(600)
"""


def _wait_for(predicate, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


@pytest.mark.parametrize("mode", ["polite", "stubborn"])
def test_registry_stops_whole_trees(tmp_path: Path, mode: str) -> None:
    registry = ProcessRegistry()
    proc = registry.start("tree", [sys.executable, "-c", _TREE_SCRIPT, mode], tmp_path / "tree.log")
    _wait_for(lambda: "ready" in proc.log_text() and len(descendants(proc.pid)) >= 2)
    registry.snapshot()
    seen = registry.all_seen()
    assert len(seen) >= 3
    t0 = time.monotonic()
    registry.stop_all(grace=1.0)
    assert time.monotonic() - t0 < 10
    assert registry.leftovers() == []
    assert not any(is_alive(ref) for ref in seen)
    registry.stop_all()  # idempotent
    with pytest.raises(LauncherError, match="stopped"):
        registry.start("late", ["true"], tmp_path / "late.log")


def test_kill_tree_sigkills_descendants(tmp_path: Path, process_registry: ProcessRegistry) -> None:
    proc = process_registry.start(
        "tree", [sys.executable, "-c", _TREE_SCRIPT, "stubborn"], tmp_path / "t.log"
    )
    _wait_for(lambda: len(descendants(proc.pid)) >= 2)
    tree = process_registry.kill_tree(proc, signal.SIGKILL)
    assert len(tree) >= 3 and tree[0].pid == proc.pid
    assert proc.popen.returncode == -signal.SIGKILL
    _wait_for(lambda: not any(is_alive(ref) for ref in tree), timeout=5)


def test_registry_cleans_up_at_interpreter_exit(tmp_path: Path) -> None:
    """A program that forgets to stop its deployment still leaves nothing behind (atexit)."""
    script = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from corbin_fl.deploy.processes import ProcessRegistry, descendants
        reg = ProcessRegistry()
        p = reg.start("tree", [sys.executable, "-c", {_TREE_SCRIPT!r}, "polite"],
                      Path({str(tmp_path / "x.log")!r}))
        while len(descendants(p.pid)) < 2:
            time.sleep(0.05)
        reg.snapshot()
        print(" ".join(str(r.pid) + ":" + str(r.start_time) for r in reg.all_seen()), flush=True)
        """
    )
    res = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        check=True,
    )
    refs = []
    for item in res.stdout.split():
        pid, start = item.split(":")
        ref = process_ref(int(pid))
        if ref is not None and str(ref.start_time) == start:
            refs.append(ref)
    assert len(res.stdout.split()) >= 3
    assert not refs, f"left behind: {refs}"


def test_deployment_start_failure_cleans_up(tmp_path: Path) -> None:
    """A SuperLink that is not ready in time: LauncherError, nothing left, log kept."""
    deployment = LocalDeployment(1, tmp_path / "logs", tmp_path / "home", ready_timeout=0.05)
    with pytest.raises(LauncherError), deployment:
        pass
    assert deployment.registry.leftovers() == []
    assert (tmp_path / "logs" / "superlink.log").exists()


class _Healthy(http.server.BaseHTTPRequestHandler):
    """Answers every GET with 200, as a SuperLink's ``/health`` does."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.timeout(240)
def test_a_superlink_port_another_process_took_is_not_taken_for_ours(
    tmp_path: Path,
    flower_startup: StartupTiming,
    rearm_timeout: Callable[[float], None],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """free_ports' port may go to another process before the SuperLink binds it. Here that
    process answers ``/health`` with 200, as another SuperLink would: the launcher must not
    take it for its own SuperLink, and starts that on another port."""
    squatter = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Healthy)
    taken = squatter.server_address[1]
    threading.Thread(target=squatter.serve_forever, daemon=True).start()
    first = [[taken]]
    real_free_ports = local_mod.free_ports
    monkeypatch.setattr(
        local_mod, "free_ports", lambda n, host: first.pop() if first else real_free_ports(n, host)
    )
    ready = flower_startup.startup_timeout(1)
    rearm_timeout(2 * ready + 60)  # two SuperLink starts, then the close
    deployment = LocalDeployment(
        0, tmp_path / "logs", tmp_path / "home", simulation=True, ready_timeout=ready
    )
    try:
        with caplog.at_level(logging.WARNING, logger=local_mod.__name__), deployment:
            assert deployment.superlink is not None and deployment.superlink_port is not None
            assert deployment.superlink_port != taken
            assert listens_on(deployment.superlink.pid, deployment.superlink_port) is True
        assert f"SuperLink port {taken} was taken" in caplog.text
        assert deployment.registry.leftovers() == []
    finally:
        squatter.shutdown()
        squatter.server_close()


# ====================================================================== e2e: tiny app
@pytest.mark.e2e
# Covers the probe; the limit is then moved to the bound derived from it (`rearm_timeout`).
@pytest.mark.timeout(240)
def test_local_run_with_killed_client(
    tiny_app: Path,
    tmp_path: Path,
    flower_startup: StartupTiming,
    rearm_timeout: Callable[[float], None],
) -> None:
    """2 SuperNodes, 2 rounds; partition 1 SIGKILLed in round 2; everything stopped after."""
    seen: list[str] = []
    out = tmp_path / "out"
    ready, stage, run = _tiny_waits(flower_startup, 2)
    rearm_timeout(ready + run + 60)
    options = LocalRunOptions(
        app_dir=tiny_app,
        out_dir=out,
        num_clients=2,
        run_config={"num-rounds": 2, "stage-timeout": stage, "min-nodes": 2},
        kills=(KillSpec(1, 2),),
        kill_delay=0.5,
        timeout=run,
        ready_timeout=ready,
    )
    result = run_local(options, progress=lambda s: seen.append(s.phase))
    assert result.ok, result.reason
    assert result.exit_code == 0 and result.status == "finished:completed"
    assert result.run_id is not None
    assert [m["round"] for m in result.metrics] == [1, 2]
    assert result.metrics[0]["partitions"] == [0, 1]
    assert result.metrics[1]["partitions"] == [0]  # the killed node never answered
    assert len(result.killed) == 1
    kill = result.killed[0]
    assert (kill.partition, kill.round) == (1, 2)
    assert kill.node_id == result.node_ids[1] and len(result.node_ids) == 2
    assert kill.time >= _round_start_time(result.events, 2) + 0.5 - 0.05
    assert result.events[-1] == {"event": "run_end"}
    assert result.summary == {"rounds": 2, "privacy": {"epsilon": 1.0}}
    assert json.loads((out / "summary.json").read_text()) == result.summary
    cfg = tomllib.loads((out / "run-config.toml").read_text())
    assert cfg["out-dir"] == str(out.resolve()) and cfg["num-rounds"] == 2
    # superlink, 2 supernodes, flwr run, plus their SuperExecs and app processes
    assert len(result.processes) >= 7
    assert {"starting", "ready", "running", "finished"} <= set(seen)
    assert result.logs_dir is None and not (out / "logs").exists()  # success, no --keep-logs
    _assert_no_leftovers(result.processes)


@pytest.mark.e2e
# Covers the probe; the limit is then moved to the bound derived from it (`rearm_timeout`).
@pytest.mark.timeout(240)
def test_run_timeout_fails_keeps_logs_and_stops_everything(
    tiny_app: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    flower_startup: StartupTiming,
    rearm_timeout: Callable[[float], None],
) -> None:
    """A ServerApp that hangs: `--timeout` stops the run, exit code 1, logs kept, nothing left."""
    out = tmp_path / "out"
    ready, _, _ = _tiny_waits(flower_startup, 1)
    # Start-up, the 20 s, then the stop: `flwr stop`, `flwr ls`, a process start-up each, and
    # every process's grace period.
    cli_call = LOAD_HEADROOM * flower_startup.startup
    rearm_timeout(ready + 20 + 2 * cli_call + 60)
    t0 = time.monotonic()
    code = cli.main(
        [
            "local",
            "--app",
            str(tiny_app),
            "--clients",
            "1",
            "--rounds",
            "1",
            "--run-config",
            "hang=true",
            "--timeout",
            "20",
            "--ready-timeout",
            str(round(ready)),
            "--out",
            str(out),
        ]
    )
    elapsed = time.monotonic() - t0
    assert code == cli.EXIT_FAILED
    printed = " ".join(capsys.readouterr().out.split())
    assert "FAILED: timed out after 20 s" in printed
    # It hung in round 1 (on a very busy machine the ServerApp may not even have started).
    events = [e["event"] for e in read_jsonl(out / "events.jsonl")]
    assert events == ["run_start", "round_start"][: len(events)]
    assert elapsed >= 20  # the timeout counts from the submission, start-up excluded
    logs = sorted(p.name for p in (out / "logs").iterdir())
    assert logs == ["flwr-run.log", "superlink.log", "supernode-0.log"]  # kept after a failure
    assert "Successfully started run" in (out / "logs" / "flwr-run.log").read_text()
    ports = _ports_in_logs(out / "logs")
    assert len(ports) == 2
    _assert_no_leftovers([], [f"127.0.0.1:{p}" for p in ports] + [f"--port {p}" for p in ports])


def _ports_in_logs(logs: Path) -> list[str]:
    ports: set[str] = set()
    for log in logs.glob("*.log"):
        first = log.read_text().splitlines()[0]
        ports.update(re.findall(r"--port (\d+)", first))
    return sorted(ports)


@pytest.mark.e2e
# Covers the probe; the limit is then moved to the bound derived from it (`rearm_timeout`).
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("inherited", "when"),
    [
        (signal.SIG_DFL, "running"),  # Ctrl-C in a terminal
        # `corbin-fl local &` in a script: SIGINT inherited ignored (Python then never raises
        # KeyboardInterrupt by itself); it must stop anyway, in the run and during start-up
        (signal.SIG_IGN, "running"),
        (signal.SIG_IGN, "start-up"),
    ],
    ids=["default-running", "ignored-running", "ignored-start-up"],
)
def test_ctrl_c_stops_every_process(
    tiny_app: Path,
    tmp_path: Path,
    inherited: signal.Handlers,
    when: str,
    flower_startup: StartupTiming,
    rearm_timeout: Callable[[float], None],
) -> None:
    # Up: the SuperLink, the SuperNode, `flwr run` and the ServerApp. Stopped: `flwr stop` (a
    # process start-up), then every process's grace period. Neither below the fixed waits these
    # cases had before (150 s, 60 s).
    up = max(150.0, flower_startup.startup_timeout(4))
    stop = max(60.0, LOAD_HEADROOM * flower_startup.startup + 30.0)
    rearm_timeout(up + stop + 60)
    out = tmp_path / "out"
    cmd = ["corbin-fl", "local", "--app", str(tiny_app), "--clients", "1", "-q"]
    cmd += ["--run-config", "hang=true", "--rounds", "1", "--out", str(out)]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, inherited),
    )
    try:
        if when == "running":  # the ServerApp has started: every process is up
            ready = lambda: (out / "events.jsonl").exists()  # noqa: E731
        else:  # the SuperLink runs (it has logged), the run is not submitted yet
            ready = lambda: _log_lines(out / "logs" / "superlink.log") >= 2  # noqa: E731
        _wait_for(lambda: ready() or proc.poll() is not None, up)
        assert proc.poll() is None, proc.communicate()[0]
        ports = _ports_in_logs(out / "logs")
        assert len(ports) == 2 if when == "running" else len(ports) >= 1
        assert alive_matching([f"--port {p}" for p in ports])  # running right now
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=stop)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == cli.EXIT_INTERRUPTED, output
    assert b"interrupted" in output
    assert not (out / "events.jsonl").exists() or when == "running"
    # whatever started before the signal (also a SuperNode started just as it came) is gone
    ports = _ports_in_logs(out / "logs")
    needles = [f"127.0.0.1:{p}" for p in ports] + [f"--port {p}" for p in ports]
    _assert_no_leftovers([], needles)


def _log_lines(path: Path) -> int:
    """Lines in a process log so far (the launcher writes the command line first)."""
    try:
        return len(path.read_text(errors="replace").splitlines())
    except OSError:
        return 0


def test_interrupts_wait_for_process_bookkeeping() -> None:
    """A signal inside ``_deferred_interrupts`` acts only when the block is done."""
    from corbin_fl.deploy.processes import _deferred_interrupts

    steps: list[str] = []
    # A test run started in the background inherits SIGINT ignored: start from Python's default.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt), _deferred_interrupts():
            signal.raise_signal(signal.SIGINT)
            steps.append("registered")  # still runs: the interrupt waits
        assert steps == ["registered"]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        with _deferred_interrupts():
            signal.raise_signal(signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN  # ignored stays ignored
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.e2e
# Covers the probe; the limit is then moved to the bound derived from it (`rearm_timeout`).
@pytest.mark.timeout(300)
def test_simulation_runtime(
    tiny_app: Path,
    tmp_path: Path,
    flwr_home: Path,
    flower_startup: StartupTiming,
    rearm_timeout: Callable[[float], None],
) -> None:
    # Start-up: the SuperLink, then Ray's own processes and one worker per virtual node.
    ready, _, run = _tiny_waits(flower_startup, 2, processes=1 + 2 + 2)
    rearm_timeout(ready + run + 60)
    options = LocalRunOptions(
        app_dir=tiny_app,
        out_dir=tmp_path / "out",
        num_clients=2,
        run_config={"num-rounds": 1, "min-nodes": 2},
        federation_config={"client-resources-num-cpus": 1},
        timeout=ready + run,
        ready_timeout=ready,
        keep_logs=True,
        flwr_home=flwr_home,
    )
    result = run_simulation(options)
    _assert_no_leftovers(result.processes, [str(flwr_home)])
    log = (result.logs_dir / "flwr-run.log").read_text() if result.logs_dir else ""
    if not result.ok and RAY_START_FAILED in log:
        pytest.skip("Ray could not start its node within its fixed 30 s (machine overloaded)")
    assert result.ok, result.reason
    assert [m["partitions"] for m in result.metrics] == [[0, 1]]
    assert result.logs_dir is not None and (result.logs_dir / "flwr-run.log").exists()
    assert "2 simulated SuperNodes" in (result.logs_dir / "flwr-run.log").read_text()
