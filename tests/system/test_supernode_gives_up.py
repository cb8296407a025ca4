"""docker/supernode.py on real Flower processes: a SuperNode that gives up its connection ends.

Flower 1.42's SuperNode gives up its connection on an error that names TLS, or once its
``--max-retries`` are spent; it then logs the error, deactivates the node and its entry point
returns, but its Runtime API thread keeps the process up, without a connection, for ever (a
container's restart policy never acts). Here a SuperNode started through the image's launcher,
with ``--max-retries 0`` so that the first failed pull gives up, loses its SuperLink (killed):
the process must end, with status 1 and the launcher's line, and its SuperExec after it.
A restart policy then starts it again (tests/docker/test_machines.py, across a SuperLink
restart with TLS).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from waits import SUPERNODE_POLL_S, StartupTiming, answers, wait_until

from corbin_fl.deploy.flower import superlink_argv
from corbin_fl.deploy.processes import ProcessRegistry, alive_matching

REPO = Path(__file__).resolve().parents[2]
LAUNCHER = REPO / "docker" / "supernode.py"


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_a_supernode_that_gives_up_its_connection_ends_with_status_1(
    tmp_path: Path,
    free_ports_factory: Callable[[int], list[int]],
    process_registry: ProcessRegistry,
    flower_startup: StartupTiming,
    rearm_timeout: Callable[[float], None],
) -> None:
    # The SuperLink, the SuperNode and its SuperExec may start at once (as in test_node_auth.py,
    # never less than 90 s: only a failure waits that long).
    wait_s = max(90.0, flower_startup.startup_timeout(3))
    rearm_timeout(60 + 3 * wait_s)
    link_port, node_port = free_ports_factory(2)
    address = f"127.0.0.1:{link_port}"
    logs = tmp_path / "logs"
    superlink = process_registry.start(
        "superlink", superlink_argv("127.0.0.1", link_port), logs / "superlink.log"
    )
    wait_until(
        lambda: answers(f"http://{address}/health"),
        wait_s,
        lambda: f"the SuperLink on {address}:\n{superlink.log_tail()}",
    )
    node = process_registry.start(
        "supernode",
        [
            sys.executable,
            str(LAUNCHER),
            *("--insecure", "--superlink", address, "--max-retries", "0"),
            *("--host", "127.0.0.1", "--port", str(node_port)),
        ],
        logs / "supernode.log",
    )
    wait_until(
        lambda: "SuperNode ID:" in node.log_text(),
        wait_s,
        lambda: f"the SuperNode to connect:\n{node.log_tail()}",
    )
    process_registry.snapshot()
    assert node.running(), node.log_tail()

    process_registry.kill_tree(superlink)
    # Its next pull (at most one poll period away) fails and gives up at once; then the node
    # stops its heartbeat and tries to deactivate itself (refused at once) before it returns.
    wait_until(
        lambda: not node.running(),
        SUPERNODE_POLL_S + wait_s,
        lambda: f"the SuperNode to end once its connection gave up:\n{node.log_tail()}",
    )
    assert node.popen.returncode == 1, node.log_tail()
    text = node.log_text()
    said = text.find("gave up its connection to the SuperLink")
    assert said >= 0, node.log_tail()
    # Before it, Flower's own line: the error it gave up on ("[Errno 111] Connection refused",
    # or a reset if the SuperLink died mid-request), logged where Flower swallows it.
    assert re.search(r"ERROR\s*:\s+\S", text[:said]), node.log_tail()
    # Its SuperExec (started with --parent-pid) ends by itself once its parent is gone.
    parent = re.compile(rf"--parent-pid {node.pid}(\s|$)")
    wait_until(
        lambda: (
            not [
                p for p in alive_matching([f"--parent-pid {node.pid}"]) if parent.search(p.cmdline)
            ]
        ),
        wait_s,
        "the SuperNode's SuperExec to end after it",
    )
