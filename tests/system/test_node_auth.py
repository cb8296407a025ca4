"""Node authentication on real processes: with TLS and SuperNode authentication, a SuperLink
refuses every node whose key was not registered."""

from __future__ import annotations

import json
import re
import shutil
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from waits import StartupTiming

from corbin_fl.deploy.flower import flower_executable, superlink_argv
from corbin_fl.deploy.processes import ProcessRegistry

REPO = Path(__file__).resolve().parents[2]


MAKE_CERTS = REPO / "docker" / "certs" / "make-certs.sh"


# ============================================================================ 1. node auth
def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.3)


def _https_ok(url: str, cafile: Path) -> bool:
    try:
        ctx = ssl.create_default_context(cafile=str(cafile))
        with urllib.request.urlopen(url, timeout=2.0, context=ctx) as response:
            return 200 <= response.status < 300
    except OSError:
        return False


def _online_nodes(connection: str, timeout: float) -> list[dict[str, Any]] | None:
    """The SuperLink's nodes (``flwr supernode list``), or None when the call failed or took
    longer than ``timeout`` (the caller polls again)."""
    try:
        out = subprocess.run(
            [flower_executable("flwr"), "supernode", "list", connection, "--format", "json"],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return None
    start = out.stdout.find("{")
    if out.returncode != 0 or start < 0:
        return None
    payload, _ = json.JSONDecoder().raw_decode(out.stdout[start:])
    return list(payload.get("nodes", []))


def _pem_of_ssh_key(path: Path) -> str:
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_ssh_public_key(path.read_bytes())
    pem = key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return pem.decode()


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_unregistered_nodes_are_refused_with_tls_and_node_auth(
    tmp_path: Path,
    flwr_home: Path,
    free_ports_factory: Callable[[int], list[int]],
    process_registry: ProcessRegistry,
    flower_startup: StartupTiming,
    rearm_timeout: Callable[[float], None],
) -> None:
    # Every wait grows with this machine's Flower start-up, measured now (the SuperLink, the four
    # SuperNodes and a `flwr` call may all start at once), from the 90 s it had before.
    wait_s = max(90.0, flower_startup.startup_timeout(6))
    rearm_timeout(120 + 8 * wait_s)  # certificates, registration, the waits below, clean-up
    for tool in ("openssl", "ssh-keygen"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} missing: apt-get install openssl openssh-client")
    certs = tmp_path / "certs"
    made = subprocess.run(
        ["bash", str(MAKE_CERTS), "-o", str(certs), "-n", "2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    link_port, *node_ports = free_ports_factory(5)
    address = f"127.0.0.1:{link_port}"
    (flwr_home / "config.toml").write_text(
        f'[superlink]\ndefault = "auth"\n\n[superlink.auth]\naddress = "{address}"\n'
        f'root-certificates = "{certs / "ca" / "ca.crt"}"\n'
    )
    logs = tmp_path / "logs"
    link = certs / "superlink"
    superlink = process_registry.start(
        "superlink",
        superlink_argv("127.0.0.1", link_port, certs=link, database=tmp_path / "state.db"),
        logs / "superlink.log",
    )
    _wait(
        lambda: _https_ok(f"https://{address}/health", certs / "ca" / "ca.crt"),
        wait_s,
        f"the SuperLink on https://{address}:\n{superlink.log_tail()}",
    )
    process_registry.snapshot()
    registered = subprocess.run(
        [
            flower_executable("flwr"),
            "supernode",
            "register",
            str(certs / "node-1" / "node.key.pub"),
            "auth",
            "--name",
            "node-1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert registered.returncode == 0, registered.stdout + registered.stderr

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

    node1 = certs / "node-1"
    node2 = certs / "node-2"
    member = supernode(
        "registered",
        node_ports[0],
        "--root-certificates",
        str(node1 / "ca.crt"),
        "--auth-supernode-private-key",
        str(node1 / "node.key"),
    )
    stranger = supernode(
        "unregistered",
        node_ports[1],
        "--root-certificates",
        str(node2 / "ca.crt"),
        "--auth-supernode-private-key",
        str(node2 / "node.key"),
    )
    keyless = supernode("keyless", node_ports[2], "--root-certificates", str(node2 / "ca.crt"))
    plain = supernode("plaintext", node_ports[3], "--insecure")

    id_re = re.compile(r"SuperNode ID: (\d+)")
    _wait(lambda: bool(id_re.search(member.log_text())), wait_s, "the registered SuperNode's id")
    member_id = int(id_re.search(member.log_text()).group(1))  # type: ignore[union-attr]
    _wait(lambda: not stranger.running(), wait_s, "the unregistered SuperNode to be refused")
    assert stranger.popen.returncode != 0
    assert "Failed to activate SuperNode" in stranger.log_text(), stranger.log_tail()
    assert not id_re.search(stranger.log_text())
    # The SuperLink refused exactly node-2's key (it logs the PEM of the key it did not know).
    refused = superlink.log_text()
    assert "No SuperNode found with the given public key" in refused
    pem_body = "".join(_pem_of_ssh_key(node2 / "node.key.pub").splitlines()[1:-1])
    assert pem_body in refused.replace("\\n", ""), "the refusal does not name node-2's key"
    member_pem = "".join(_pem_of_ssh_key(node1 / "node.key.pub").splitlines()[1:-1])
    assert member_pem not in refused.replace("\\n", "")

    # A node without an authentication key gets an ephemeral one, which is refused too.
    _wait(lambda: not keyless.running(), wait_s, "the key-less SuperNode to be refused")
    assert keyless.popen.returncode != 0
    assert "All SuperNodes must be registered" in keyless.log_text(), keyless.log_tail()
    # A plain-text node cannot even speak to the TLS endpoint: it keeps retrying.
    assert plain.running() and "Connection attempt failed" in plain.log_text()
    process_registry.snapshot()

    nodes: list[dict[str, Any]] = []

    def member_online() -> bool:
        nonlocal nodes
        nodes = _online_nodes("auth", wait_s) or []
        return any(str(n.get("status")).lower() == "online" for n in nodes)

    _wait(member_online, 2 * wait_s, "the registered SuperNode to be online")
    # Only the registered node is known to the SuperLink, and it is online.
    assert [int(n["node-id"]) for n in nodes] == [member_id], nodes
    for proc in (stranger, keyless, plain):
        assert not id_re.search(proc.log_text()), proc.log_tail()
    assert member.running() and superlink.running()
