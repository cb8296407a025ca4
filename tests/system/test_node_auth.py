"""Node authentication on real processes, what the Docker layer does not run: with TLS and
SuperNode authentication, a SuperNode without a key is refused and a plain-text one cannot
connect.

A registered node let in and listed, and a node with an unregistered key refused (exit code
305, never listed), run in real containers in tests/docker/test_tls.py
(test_documented_tls_run_completes, test_supernode_with_an_unregistered_key_is_refused) and
tests/docker/test_machines.py, with register-nodes.sh; this file ran them on loopback too.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from waits import HANG_GUARD_S, StartupTiming, answers, wait_until

from corbin_fl.deploy.flower import flower_executable, superlink_argv
from corbin_fl.deploy.processes import ProcessRegistry

REPO = Path(__file__).resolve().parents[2]


MAKE_CERTS = REPO / "docker" / "certs" / "make-certs.sh"


# ============================================================================ 1. node auth
@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_keyless_and_plaintext_nodes_are_refused_with_tls_and_node_auth(
    tmp_path: Path,
    free_ports_factory: Callable[[int], list[int]],
    process_registry: ProcessRegistry,
    flower_startup: StartupTiming,
    rearm_timeout: Callable[[float], None],
) -> None:
    # Every wait grows with this machine's Flower start-up, measured now (the SuperLink and the
    # two SuperNodes may all start at once), from the 90 s it had before.
    wait_s = max(90.0, flower_startup.startup_timeout(3))
    rearm_timeout(120 + 4 * wait_s)  # certificates, the waits below, clean-up
    for tool in ("openssl", "ssh-keygen"):  # make-certs.sh's
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} missing: apt-get install openssl openssh-client")
    certs = tmp_path / "certs"
    made = subprocess.run(
        ["bash", str(MAKE_CERTS), "-o", str(certs), "-n", "1"],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert made.returncode == 0, made.stderr
    link_port, *node_ports = free_ports_factory(3)
    address = f"127.0.0.1:{link_port}"
    logs = tmp_path / "logs"
    superlink = process_registry.start(
        "superlink",
        superlink_argv(
            "127.0.0.1", link_port, certs=certs / "superlink", database=tmp_path / "state.db"
        ),
        logs / "superlink.log",
    )
    wait_until(
        lambda: answers(f"https://{address}/health", certs / "ca" / "ca.crt"),
        wait_s,
        lambda: f"the SuperLink on https://{address}:\n{superlink.log_tail()}",
    )
    process_registry.snapshot()

    def supernode(name: str, port: int, *auth: str) -> Any:
        cmd = [
            flower_executable("flower-supernode"),
            "--superlink",
            address,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--node-config",
            "partition-id=0 num-partitions=1",
            *auth,
        ]
        return process_registry.start(name, cmd, logs / f"{name}.log")

    ca = certs / "node-1" / "ca.crt"
    keyless = supernode("keyless", node_ports[0], "--root-certificates", str(ca))
    plain = supernode("plaintext", node_ports[1], "--insecure")

    # A node without an authentication key gets an ephemeral one, which is refused.
    wait_until(lambda: not keyless.running(), wait_s, "the key-less SuperNode to be refused")
    assert keyless.popen.returncode != 0
    assert "All SuperNodes must be registered" in keyless.log_text(), keyless.log_tail()
    # A plain-text node cannot even speak to the TLS endpoint: it keeps retrying.
    wait_until(
        lambda: "Connection attempt failed" in plain.log_text(),
        wait_s,
        "the plain-text SuperNode's failed connection",
    )
    assert plain.running(), plain.log_tail()
    id_re = re.compile(r"SuperNode ID: (\d+)")
    for proc in (keyless, plain):
        assert not id_re.search(proc.log_text()), proc.log_tail()
    assert superlink.running()
    process_registry.snapshot()
