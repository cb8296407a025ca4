"""A SuperLink state volume written by Flower 1.41, opened by the installed Flower's SuperLink.

The compose files keep the SuperLink's database in a named volume (``superlink-state``,
``/data/state.db``), which survives ``docker compose down`` and so an upgrade of the images.
Flower 1.42 adds migrations to that database and applies them forward when the SuperLink starts
(its alembic revisions). This test starts the installed SuperLink on a copy of a database that
Flower 1.41's SuperLink wrote with one finished run in it (tests/fixtures/superlink-1.41-state.db,
made by tests/fixtures/make_superlink_state.py, whose docstring gives the command) and checks
that it starts, serves the Control API (``flwr ls``) with the 1.41 run and its status, and that the
database is now at the installed Flower's newest revision: docs/DOCKER.md's "Upgrading from 1.41"
needs no step for the volume. On the way, the status commands the guides show are checked at 80
columns: ``flwr ls``'s table cuts the status (``finished…``), ``--run-id`` and ``--format json``
show it whole.
"""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import subprocess
from pathlib import Path

import flwr
import pytest
from waits import HANG_GUARD_S, StartupTiming, wait_progressing

from corbin_fl.deploy.flower import flower_executable, http_ok, write_connection
from corbin_fl.deploy.processes import flower_env, free_ports
from corbin_fl.flower_version import supported

pytestmark = pytest.mark.e2e  # skipped without Flower's console scripts (tests/conftest.py)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "superlink-1.41-state.db"


def revision(db: Path) -> str:
    """The alembic revision a SuperLink database is at."""
    with sqlite3.connect(db) as conn:
        ((rev,),) = conn.execute("SELECT version_num FROM alembic_version").fetchall()
    return str(rev)


def newest_revision() -> str:
    """The head revision of the installed Flower's SuperLink migrations."""
    from alembic.script import ScriptDirectory

    folder = Path(flwr.__file__).parent / "supercore" / "state" / "alembic"
    heads = ScriptDirectory(str(folder)).get_heads()
    assert len(heads) == 1, heads
    return str(heads[0])


def test_fixture_is_small_and_of_1_41() -> None:
    assert FIXTURE.stat().st_size < 512 * 1024, "commit only a small fixture"
    assert not supported("1.41.0")  # the fixture is of another series than the installed one
    assert revision(FIXTURE) != newest_revision(), "the fixture must need a migration"


def test_superlink_opens_a_1_41_state(tmp_path: Path, flower_startup: StartupTiming) -> None:
    db = tmp_path / "state.db"
    shutil.copyfile(FIXTURE, db)
    (port,) = free_ports(1)
    home = tmp_path / "flwr-home"
    write_connection(home, f"127.0.0.1:{port}")
    env = flower_env({"FLWR_HOME": str(home)})
    log = tmp_path / "superlink.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                flower_executable("flower-superlink"),
                *("--insecure", "--host", "127.0.0.1", "--port", str(port)),
                *("--database", str(db), "--disable-runtime-dependency-installation"),
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        # Under load its start-up has outlasted a fixed bound of startup_timeout(1) (46.7 s,
        # a clean-clone CI run beside other work): its log had reached "Application startup
        # complete", one step before binding the port. So the bound is on a silent step.
        wait_progressing(
            lambda: http_ok(f"http://127.0.0.1:{port}/health"),
            lambda: proc.poll() is None,
            log,
            flower_startup.startup_timeout(1),
            "the SuperLink",
        )
        narrow = {**env, "COLUMNS": "80"}  # a terminal of 80 columns, or a pipe

        def flwr_ls(*args: str) -> str:
            done = subprocess.run(
                [flower_executable("flwr"), "ls", *args],
                env=narrow,
                capture_output=True,
                text=True,
                # A command the test only needs to end: a clean-clone CI rehearsal (six workers on
                # two cores) saw `flwr ls` pass the start-up probe's bound (15.5 s) against a
                # SuperLink that had answered its health check.
                timeout=HANG_GUARD_S,
            )
            assert done.returncode == 0, done.stdout + done.stderr
            return done.stdout

        runs = json.loads(flwr_ls("--format", "json"))["runs"]
        assert [(r["fab-id"], r["fab-version"], r["status"]) for r in runs] == [
            ("corbin-fl-tests/stateapp", "1.0.0", "finished:completed")
        ], runs
        # The guides' status commands at 80 columns (README, RUNNING.md, the quickstart): the
        # table cuts the status, one run's view and the JSON show it whole.
        table = flwr_ls()
        assert "finished…" in table and "finished:completed" not in table, table
        assert "finished:completed" in flwr_ls("--run-id", runs[0]["run-id"])
        assert revision(db) == newest_revision()
        assert not re.search(r"(?i)migration.*(failed|error)", log.read_text())
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
