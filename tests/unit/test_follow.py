"""The live view of ``corbin-fl local``: the run's state as the launcher reads it from the
ServerApp's files (``deploy.follow.RunProgress``), and what the view draws from it
(``deploy.cli.ProgressView``), fed event by event as the launcher reads them."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from corbin_fl.deploy import cli
from corbin_fl.deploy.follow import RunProgress
from corbin_fl.deploy.run import _KillSchedule, _RunFiles

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _render(renderable: object, width: int = 100) -> str:
    console = Console(width=width, file=io.StringIO(), record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


def _status(view: cli.ProgressView, state: RunProgress) -> str:
    width = view.console.width
    return "\n".join(_render(line, width).rstrip() for line in view.status_lines(state))


def _row(rnd: int, acc: float, dropped: dict[str, str] | None = None) -> dict[str, Any]:
    drops = dropped or {}
    return {
        "round": rnd,
        "test_accuracy": acc,
        "sampled": 4,
        "participants": 4 - len(drops),
        "dropped": drops,
        "round_seconds": 30.25,
    }


class _Files:
    """The ServerApp's ``events.jsonl`` and ``metrics.jsonl`` in ``out``, appended to as a run
    goes on, and the launcher's reader of them."""

    def __init__(self, out: Path, state: RunProgress) -> None:
        self.out = out
        self.reader = _RunFiles(out, state, _KillSchedule((), 1.0))

    def event(self, name: str, **fields: Any) -> None:
        with (self.out / "events.jsonl").open("a") as fh:
            fh.write(json.dumps({"event": name, **fields}) + "\n")

    def row(self, row: dict[str, Any]) -> None:
        with (self.out / "metrics.jsonl").open("a") as fh:
            fh.write(json.dumps(row) + "\n")

    def round(self, rnd: int, acc: float, stages: tuple[str, ...] = ("update",)) -> None:
        """One whole round, in the order the ServerApp writes it."""
        self.event("round_start", round=rnd, time=0.0)
        for stage in stages:
            self.event("stage_end", round=rnd, stage=stage, seconds=1.0, replies=4, dropped=[])
        self.event("checkpoint", round=rnd, time=0.0)
        self.row(_row(rnd, acc))
        self.event("round_end", round=rnd, time=0.0, test_accuracy=acc, dropped=[])


def test_state_follows_the_events_of_each_round(tmp_path: Path) -> None:
    """Round, stage and accuracy come from the events and rows read so far, in one poll or
    many: after round 2's row and the ``round_start`` of round 3 the state is round 3 with round
    2's accuracy, whatever was read in the same poll."""
    state = RunProgress(num_rounds=3, num_clients=4, run_id=7, phase="running")
    files = _Files(tmp_path, state)
    files.event("run_start", time=0.0)
    files.reader.poll()
    assert (state.current_round, state.last_stage, state.accuracy) == (0, None, None)
    assert state.waiting_for() == "ServerApp preparing round 1"
    files.round(1, 0.627, stages=("keygen", "pair", "update"))
    files.event("round_start", round=2, time=0.0)
    files.reader.poll()  # round 1 whole and round 2's start in one poll
    assert (state.current_round, state.last_stage, state.accuracy) == (2, None, 0.627)
    assert state.waiting_for() is None
    files.event("stage_end", round=2, stage="update", seconds=1.0, replies=4, dropped=[])
    files.reader.poll()
    assert (state.current_round, state.last_stage) == (2, "update")
    files.event("checkpoint", round=2, time=0.0)
    files.row(_row(2, 0.83))
    files.reader.poll()  # the row before its round_end event
    assert state.accuracy == 0.83 and state.finished_round == 2
    files.event("round_end", round=2, time=0.0)
    files.event("round_start", round=3, time=0.0)
    files.reader.poll()
    assert (state.current_round, state.last_stage, state.accuracy) == (3, None, 0.83)


def test_a_stage_end_of_another_round_keeps_the_current_stage() -> None:
    state = RunProgress(num_rounds=3)
    state.apply_event({"event": "round_start", "round": 2})
    state.apply_event({"event": "stage_end", "round": 1, "stage": "update", "dropped": [5]})
    assert (state.current_round, state.last_stage) == (2, None)
    assert state.stage_drops == [(1, "update", 5)]  # its drops still count


def test_waiting_for_says_what_start_up_waits_for() -> None:
    state = RunProgress(num_rounds=3, num_clients=4)
    assert state.waiting_for() == "preparing the deployment"  # before the first step
    state.waiting = "waiting for 4 SuperNodes to register"
    assert state.waiting_for() == "waiting for 4 SuperNodes to register"
    state.phase, state.waiting = "running", ""
    assert state.waiting_for() == "submitting the run"
    state.run_id = 3
    assert state.waiting_for() == "waiting for the ServerApp"
    state.apply_event({"event": "run_start"})
    state.apply_event({"event": "resume", "from_round": 2})
    assert state.waiting_for() == "ServerApp preparing round 3"
    state.apply_event({"event": "round_start", "round": 3})
    assert state.waiting_for() is None


def test_status_line_shows_the_round_and_accuracy_of_the_last_events(tmp_path: Path) -> None:
    """Right after ``round 2/3 done: test acc 0.83`` the status says round 2 and acc 0.83;
    right after ``round 3/3 started`` it says round 3, with no stage of round 2."""
    state = RunProgress(num_rounds=3, num_clients=4, run_id=7, phase="running")
    files = _Files(tmp_path, state)
    view = cli.ProgressView(Console(width=100, file=io.StringIO()), num_clients=4)
    files.event("run_start", time=0.0)
    files.round(1, 0.627, stages=("keygen", "pair", "update"))
    files.reader.poll()
    assert "round 1/3 · update done" in _status(view, state)
    assert "acc 0.627" in _status(view, state)
    files.event("round_start", round=2, time=0.0)
    files.event("stage_end", round=2, stage="update", seconds=1.0, replies=4, dropped=[])
    files.event("checkpoint", round=2, time=0.0)
    files.row(_row(2, 0.83))
    files.event("round_end", round=2, time=0.0)
    files.reader.poll()
    status = _status(view, state)
    assert "round 2/3 · update done" in status and "acc 0.83" in status, status
    files.event("round_start", round=3, time=0.0)
    files.reader.poll()
    status = _status(view, state)
    assert "round 3/3 · nodes 4/4" in status and "acc 0.83" in status, status
    assert "update" not in status


def test_the_status_under_each_printed_line_is_drawn_from_the_state_of_that_line(
    tmp_path: Path,
) -> None:
    """On a terminal rich redraws the status under every line printed above it: that status
    is the state's of now, never the one from before the line (``round 1/3 · update`` under
    ``round 2/3 started``, ``acc 0.627`` under ``round 2/3 done: test acc 0.83``)."""
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=100, color_system=None)
    state = RunProgress(num_rounds=3, num_clients=4, run_id=7, phase="running")
    files = _Files(tmp_path, state)
    with cli.ProgressView(console, num_clients=4, auto_refresh=False) as view:
        files.event("run_start", time=0.0)
        files.round(1, 0.627, stages=("keygen", "pair", "update"))
        files.reader.poll()
        view(state)
        files.event("round_start", round=2, time=0.0)
        files.event("stage_end", round=2, stage="update", seconds=1.0, replies=4, dropped=[])
        files.reader.poll()
        view(state)
        files.event("checkpoint", round=2, time=0.0)
        files.row(_row(2, 0.83))
        files.event("round_end", round=2, time=0.0)
        files.event("round_start", round=3, time=0.0)
        files.reader.poll()
        view(state)
    frames = [ANSI.sub("", f).strip() for f in re.split(r"[\r\n]", buf.getvalue())]
    frames = [f for f in frames if f]
    now = r"\d+s running · round 3/3 · nodes 4/4 · dropped 0 · acc 0\.83"
    done = frames.index("round 2/3 done: test acc 0.83, clients 4/4, dropped 0, 30.2 s")
    assert re.fullmatch(now, frames[done + 1]), frames  # not "acc 0.627"
    started = frames.index("round 3/3 started")
    assert started == done + 2, frames  # both lines come from one call
    assert re.fullmatch(now, frames[started + 1]), frames  # not "round 2/3 · update done"
    started2 = frames.index("round 2/3 started")
    assert "round 2/3 · update done" in frames[started2 + 1], frames
    assert "acc 0.627" in frames[started2 + 1], frames
    for frame in frames[started + 1 :]:  # no status of an older state after a newer one
        if "s running" in frame:
            assert "round 3/3" in frame, frames


def test_elapsed_time_runs_during_start_up_without_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """The status is drawn from the state each time rich draws it (four times a second on
    its own thread), so the elapsed time runs on while start-up blocks, and it says what the
    launcher waits for."""
    clock = [1000.0]
    monkeypatch.setattr("corbin_fl.deploy.follow.time.monotonic", lambda: clock[0])
    state = RunProgress(num_rounds=3, num_clients=4, started=clock[0])
    view = cli.ProgressView(Console(width=100, file=io.StringIO()), num_clients=4)
    view(state)  # the launcher's first call, before start-up
    state.waiting = "waiting for 4 SuperNodes to register"  # no call after this
    live = cli._LiveStatus(view)
    assert _render(live).strip() == "0s starting · waiting for 4 SuperNodes to register"
    clock[0] += 17.4
    assert _render(live).strip() == "17s starting · waiting for 4 SuperNodes to register"
    clock[0] += 24.0
    assert _render(live).strip().startswith("41s starting")


def test_start_up_steps_reach_the_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``LocalDeployment.start`` says each step of start-up (none of it run here)."""
    from corbin_fl.deploy.local import LocalDeployment

    steps: list[str] = []
    dep = LocalDeployment(2, tmp_path / "logs", tmp_path / "home")
    monkeypatch.setattr(dep, "_start_superlink", lambda attempts: None)
    monkeypatch.setattr(dep, "_start_supernode", lambda partition, attempts: None)
    monkeypatch.setattr(dep, "wait_registered", lambda: {})
    dep.superlink_port = 9092
    dep.start(on_step=steps.append)
    assert steps == [
        "starting the SuperLink",
        "starting SuperNode 1/2",
        "starting SuperNode 2/2",
        "waiting for 2 SuperNodes to register",
    ]


def test_drop_reasons_are_shown_whole_on_their_own_lines() -> None:
    """A drop reason is not cut where the console has room: each drop gets its own lines
    under its round's result, wrapped at the console width."""
    buf = io.StringIO()
    console = Console(file=buf, width=60, color_system=None)
    node = 1234567890123456789
    reason = "update: error reply (code 0): ValueError: the model has NaN weights"
    state = RunProgress(num_rounds=3, num_clients=4, phase="running")
    state.node_ids = {0: 11, 1: node}
    view = cli.ProgressView(console, num_clients=4)
    state.apply_event({"event": "round_start", "round": 1})
    state.add_rows([_row(1, 0.5, {str(node): reason, "99": "update: no reply within 30 s"})])
    state.apply_event({"event": "round_end", "round": 1})
    view(state)
    lines = buf.getvalue().splitlines()
    assert all(len(line) <= 60 for line in lines), lines
    assert lines[0] == "round 1/3 started"
    assert lines[1].startswith("round 1/3 done: test acc 0.5, clients 2/4, dropped 2")
    text = " ".join(line.strip() for line in lines[2:])
    assert f"dropped partition 1 (node {node}): {reason}" in text, lines
    assert "dropped node 99: update: no reply within 30 s" in text
    assert "…" not in buf.getvalue()
    assert all(line.startswith("  ") for line in lines[2:])  # indented under their round
    status = _status(cli.ProgressView(Console(width=60, file=io.StringIO()), 4), state)
    assert "last drop: round 1, node 99: update: no reply within 30 s" in status


def test_summary_prints_per_round_floats_rounded() -> None:
    per_round = [0.0012345678901234567, 0.30000000000000004, 0.0]
    summary: dict[str, Any] = {
        "clip_fraction": {"mean": 0.0012345678901234567, "per_round": per_round},
        "round_trips_per_round": [3, 1, 1],
        "dropped_nodes": [1234567890123456789],
    }
    text = _render(cli.summary_table(summary), width=120)
    assert "0.001235, 0.3, 0" in text, text
    assert "0.0012345678" not in text and "0.30000000000000004" not in text
    assert "3, 1, 1" in text
    assert "1234567890123456789" in text  # ids stay as they are


# --------------------------------------------------------------------------- lines at any width
def test_event_lines_are_cut_with_an_ellipsis_not_wrapped() -> None:
    """An event line wider than the console ends in ``…`` on its one line (rich's ``print``
    wrapped it: ``... in round`` then ``2`` alone); the run's report cuts its kill lines the
    same way and keeps the outcome line, with its out dir, whole on one line."""
    from corbin_fl.deploy.follow import RunResult
    from corbin_fl.deploy.local import KilledNode

    buf = io.StringIO()
    console = Console(file=buf, width=60, color_system=None)
    state = RunProgress(num_rounds=3, num_clients=4, phase="running")
    state.apply_event({"event": "round_start", "round": 2})
    state.killed.append(KilledNode(1, 2, 4_000_000, 12345678901234567890, 0.0))
    cli.ProgressView(console, num_clients=4)(state)
    lines = buf.getvalue().splitlines()
    assert len(lines) == 2 and lines[0] == "round 2/3 started", lines
    assert lines[1].startswith("killed SuperNode of partition 1 (pid 4000000, node 1234567")
    assert lines[1].endswith("…") and len(lines[1]) == 60, lines
    out = Path("/a/long/out/dir/of/a/run/that/does/not/fit/in/sixty/columns")
    result = RunResult(
        ok=True,
        reason="run finished:completed",
        out_dir=out,
        run_id=1,
        status="finished:completed",
        events=[],
        metrics=[],
        summary=None,
        killed=list(state.killed),
        node_ids={},
        processes=[],
        logs_dir=None,
        wall_seconds=12.0,
        exit_code=0,
    )
    buf.seek(0)
    buf.truncate()
    cli.print_report(console, result)
    lines = buf.getvalue().splitlines()
    assert lines[0].startswith("killed SuperNode partition 1 (node 12345678901234567890)")
    assert lines[0].endswith("…") and len(lines[0]) == 60, lines
    assert lines[1] == f"OK: run finished:completed (12.0 s, out {out})", lines


def test_header_line_keeps_the_out_dir_whole_when_piped(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``corbin-fl local``'s first line is one line in a pipe or a log file (80 columns), its
    out dir whole, not broken after ``out``."""

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "run_local", interrupted)
    monkeypatch.setenv("COLUMNS", "80")
    out = tmp_path / ("a-long-folder-name-" * 4)
    assert cli.main(["local", "--out", str(out)]) == cli.EXIT_INTERRUPTED
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("corbin-fl local: 4 clients, 3 rounds, corbin, ")
    assert first.endswith(f", out {out}"), first


def test_summary_rows_per_client_are_summarised() -> None:
    """Per-client mappings (node id -> value) of summary.json are one row each, not one row per
    client (100 rows at 50 clients, node ids cut)."""
    nodes = [str(10**19 + 7919 * i) for i in range(50)]
    summary: dict[str, Any] = {
        "client_devices": {n: "cuda" if i < 3 else "cpu" for i, n in enumerate(nodes)},
        "privacy_ledger": {"per_node": {n: 8 + i % 3 for i, n in enumerate(nodes)}, "releases": 92},
        "final_test_accuracy": 0.91,
    }
    text = _render(cli.summary_table(summary), width=80)
    assert "client_devices" in text and "50 clients: cpu x47, cuda x3" in text, text
    assert "privacy_ledger.per_node" in text
    assert "50 clients: min 8, median 9, max 10" in " ".join(text.split()), text
    assert "privacy_ledger.releases" in text and "final_test_accuracy" in text
    assert not any(n[:12] in text for n in nodes), text
    assert len([ln for ln in text.splitlines() if "│" in ln]) <= 6, text
    # two clients, an even count: the median is the mean of the middle two
    two = cli.summary_table({"privacy_ledger": {"per_node": {"1": 4, "2": 7}}})
    assert "2 clients: min 4, median 5.5, max 7" in _render(two, width=80)
    # a mapping keyed by names, not node ids, is flattened as before
    named = _render(cli.summary_table({"bytes_up": {"update": 5, "keygen": 2}}), width=80)
    assert "bytes_up.update" in named and "bytes_up.keygen" in named
