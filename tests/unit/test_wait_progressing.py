"""tests/waits.py's ``wait_progressing``: a start-up is waited for while its log grows, and fails
on a dead process or a silent stall. The clock is the real one; every bound is a multiple of the
poll period, so a busy machine only makes the waits longer, never a pass a failure."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from waits import wait_progressing

POLL = 0.02


def test_returns_as_soon_as_ready(tmp_path: Path) -> None:
    wait_progressing(lambda: True, lambda: False, tmp_path / "none.log", 0.0, "x", POLL)


def test_a_dead_process_fails_with_its_log(tmp_path: Path) -> None:
    log = tmp_path / "p.log"
    log.write_text("Traceback: boom\n")
    with pytest.raises(AssertionError, match="the SuperLink exited:\nTraceback: boom"):
        wait_progressing(lambda: False, lambda: False, log, 60.0, "the SuperLink", POLL)


def test_a_silent_process_fails_after_idle_seconds(tmp_path: Path) -> None:
    log = tmp_path / "p.log"
    log.write_text("started\n")
    start = time.monotonic()
    with pytest.raises(AssertionError, match=r"not ready and its log silent for \d+ s"):
        wait_progressing(lambda: False, lambda: True, log, 10 * POLL, "the SuperLink", POLL)
    assert time.monotonic() - start >= 10 * POLL


def test_a_growing_log_waits_beyond_idle(tmp_path: Path) -> None:
    """A line every 10 ms for 2.5 s: the wait outlasts its 1 s idle window more than twice and
    returns when the process is ready (after the last line). Only a writer thread delayed by a
    whole second would fail it."""
    log = tmp_path / "p.log"
    log.write_text("")
    idle, every, lines = 1.0, 0.01, 250
    done = threading.Event()

    def write() -> None:
        for i in range(lines):
            with log.open("a") as f:
                f.write(f"step {i}\n")
            time.sleep(every)
        done.set()

    writer = threading.Thread(target=write)
    start = time.monotonic()
    writer.start()
    try:
        wait_progressing(done.is_set, lambda: True, log, idle, "the SuperLink", every)
    finally:
        writer.join()
    assert log.read_text().count("step") == lines
    assert time.monotonic() - start >= lines * every > 2 * idle
