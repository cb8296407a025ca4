"""A ``flwr run --stream`` that stays open after its run finished (Flower 1.42's log stream has no
read timeout): the launcher asks the SuperLink for the run's status once the stream has been
quiet for a slowest round (at least ``STATUS_CHECK_MIN_S``), stops the stream when the run is
``finished:*``, and judges the run by that status, not by the stopped stream's exit code."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from waits import HANG_GUARD_S

from corbin_fl.deploy.follow import RunProgress
from corbin_fl.deploy.pace import STATUS_CHECK_MIN_S, QuietStream
from corbin_fl.deploy.processes import ManagedProcess, ProcessRegistry
from corbin_fl.deploy.run import _follow, _KillSchedule, _RunFiles, _verdict

QUIET_S = 0.3
"""The test's quiet period, in place of ``STATUS_CHECK_MIN_S`` (only the ordering matters)."""


class _Cli:
    """``flwr ls --run-id``'s answers, one per query (the last one repeats)."""

    def __init__(self, *statuses: str, mark: Path | None = None) -> None:
        self.statuses, self.queries, self.mark = list(statuses), 0, mark

    def run_status(self, run_id: int) -> tuple[str | None, str | None]:
        assert run_id == 7
        self.queries += 1
        if self.mark is not None:
            self.mark.touch()
        status = self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
        return status, "details"


class _Deployment:
    """What ``_follow`` uses of a deployment: the registry, the CLI, the health check."""

    def __init__(self, registry: ProcessRegistry, cli: _Cli) -> None:
        self.registry, self.cli, self.supernodes = registry, cli, {}

    def infrastructure_failure(self) -> str | None:
        return None


@pytest.fixture
def registry() -> Iterator[ProcessRegistry]:
    reg = ProcessRegistry()
    try:
        yield reg
    finally:
        reg.stop_all(grace=1.0)


def _stream(
    registry: ProcessRegistry, tmp_path: Path, *, ends_on: Path | None = None
) -> ManagedProcess:
    """A stand-in for ``flwr run --stream``: prints its run id, then stays open (with
    ``ends_on``: until that file exists, then exits 0)."""
    wait = f"pathlib.Path({str(ends_on)!r}).exists()" if ends_on is not None else "False"
    code = (
        "import pathlib, time\n"
        "print('Successfully started run 7', flush=True)\n"
        f"end = time.monotonic() + {HANG_GUARD_S}\n"
        f"while not {wait} and time.monotonic() < end:\n"
        "    time.sleep(0.05)\n"
    )
    return registry.start("flwr-run", [sys.executable, "-c", code], tmp_path / "flwr-run.log")


def _files(tmp_path: Path) -> _RunFiles:
    return _RunFiles(tmp_path, RunProgress(), _KillSchedule((), 1.0))


def test_a_stream_left_open_after_its_run_finished_is_stopped(
    registry: ProcessRegistry, tmp_path: Path
) -> None:
    cli = _Cli("running", "finished:completed")
    proc = _stream(registry, tmp_path)
    files = _files(tmp_path)
    reason, left_open = _follow(
        _Deployment(registry, cli), proc, files, lambda: None, HANG_GUARD_S, QuietStream(QUIET_S)
    )
    assert (reason, left_open) == (None, True)
    assert files.state.run_id == 7
    assert cli.queries == 2  # the first quiet spell found it running, the second finished
    assert proc.running()  # stopping it is the caller's job
    registry.stop(proc, grace=1.0)
    assert _verdict(None, proc, 7, "finished:completed", stream_stopped=True) == ("completed", True)
    # without the flag, the stopped stream's exit code would have failed the run
    assert _verdict(None, proc, 7, "finished:completed")[1] is False


def test_a_running_run_keeps_being_followed_until_the_stream_ends(
    registry: ProcessRegistry, tmp_path: Path
) -> None:
    queried = tmp_path / "queried"
    cli = _Cli("running", mark=queried)
    proc = _stream(registry, tmp_path, ends_on=queried)  # the stream ends after a query
    reason, left_open = _follow(
        _Deployment(registry, cli),
        proc,
        _files(tmp_path),
        lambda: None,
        HANG_GUARD_S,
        QuietStream(QUIET_S),
    )
    assert (reason, left_open) == (None, False)
    assert proc.popen.returncode == 0
    assert cli.queries >= 1  # it was asked, and "running" did not end the follow


def test_the_quiet_period_is_the_slowest_round_and_any_sign_of_life_restarts_it() -> None:
    now = [1000.0]
    quiet = QuietStream(STATUS_CHECK_MIN_S, clock=lambda: now[0])
    slowest = STATUS_CHECK_MIN_S + 15.0
    rows = [{"round_seconds": 12.0}, {"round_seconds": slowest}]
    assert not quiet.due((10, 2, 2), rows)  # new activity: the quiet spell starts now
    now[0] += slowest - 1.0
    assert not quiet.due((10, 2, 2), rows)  # quiet for less than the slowest round
    now[0] += 2.0
    assert quiet.due((10, 2, 2), rows)  # quiet for longer: one query
    now[0] += 10.0
    assert not quiet.due((10, 2, 2), rows)  # the next query waits a whole period again
    now[0] += slowest
    assert quiet.due((10, 2, 2), rows)
    now[0] += 100.0
    assert not quiet.due((11, 2, 2), rows)  # the stream printed something: quiet from 0 again
    now[0] += slowest - 1.0
    assert not quiet.due((11, 2, 2), rows)
    # no round ended yet (start-up): the floor alone sets the period
    fresh = QuietStream(STATUS_CHECK_MIN_S, clock=lambda: now[0])
    now[0] += STATUS_CHECK_MIN_S - 1.0
    assert not fresh.due((), [])
    now[0] += 2.0
    assert fresh.due((), [])
