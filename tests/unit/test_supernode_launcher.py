"""docker/supernode.py, the SuperNode image's launcher, in child processes (it ends its process).

Flower 1.42's ``flower_supernode()`` returns once its connection gives up, while a non-daemon
thread (its Runtime API server) keeps the process alive. Each case here runs the launcher's
``run`` on a stand-in for Flower's entry point that leaves such a thread behind, and checks how
the process ends: status 1 and a line saying why when the entry point returns or fails, Flower's
own status when it exits (``SystemExit``). The real SuperNode is
tests/system/test_supernode_gives_up.py's.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LAUNCHER = REPO / "docker" / "supernode.py"

# Only a failure waits this long: each child ends as soon as its entry point does (a second or
# two to start Python); a child that the stuck thread holds never ends.
CHILD_TIMEOUT_S = 120.0

_CHILD = """
import importlib.util, sys, threading

spec = importlib.util.spec_from_file_location("corbin_supernode", sys.argv[1])
launcher = importlib.util.module_from_spec(spec)
spec.loader.exec_module(launcher)


def stand_in():
    # What Flower's SuperNode leaves behind: a thread that never ends (not a daemon, unless
    # Flower stopped it first).
    threading.Thread(target=threading.Event().wait, daemon={daemon}).start()
    print("entry point ends", flush=True)
    {end}


launcher.run(stand_in)
"""


def _child(end: str, *, daemon: bool = False) -> subprocess.CompletedProcess[str]:
    code = _CHILD.format(end=end, daemon=daemon)
    return subprocess.run(
        [sys.executable, "-c", code, str(LAUNCHER)],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
    )


def test_an_entry_point_that_returns_ends_the_process_with_status_1() -> None:
    out = _child("return")
    assert out.returncode == 1, out.stderr
    assert out.stdout == "entry point ends\n"
    assert "gave up its connection to the SuperLink" in out.stderr, out.stderr
    assert "restart policy" in out.stderr


def test_an_entry_point_that_fails_ends_the_process_with_status_1_and_its_traceback() -> None:
    out = _child("raise RuntimeError('pull failed')")
    assert out.returncode == 1, out.stderr
    assert "The SuperNode failed" in out.stderr, out.stderr
    assert "RuntimeError: pull failed" in out.stderr  # the traceback is logged


@pytest.mark.parametrize("status", [0, 3])
def test_flowers_own_exit_keeps_its_status(status: int) -> None:
    # flwr_exit and Flower's signal handlers stop the Runtime API before they raise SystemExit;
    # here the stand-in's thread is a daemon, as Flower's is once stopped.
    out = _child(f"raise SystemExit({status})", daemon=True)
    assert out.returncode == status, out.stderr
    assert "gave up" not in out.stderr and "failed" not in out.stderr, out.stderr


def test_the_launcher_passes_its_arguments_to_flower_supernode() -> None:
    """``python3 supernode.py --help`` is ``flower-supernode --help``: the same parser, the same
    program name (the image's ENTRYPOINT + CMD are checked against it, test_dockerfiles.py)."""
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1"}
    out = subprocess.run(
        [sys.executable, str(LAUNCHER), "--help"],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: flower-supernode "), out.stdout[:300]
    assert "--max-retries" in out.stdout and "--health-server-address" in out.stdout
