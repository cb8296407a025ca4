"""docs/DOCKER.md Part B on a real engine: the TLS and SuperNode-authentication override.

Certificates from ``docker/certs/make-certs.sh``, given to the containers' group as the guide
says; the SuperLink and its executor started with ``docker-compose.tls.yml``; the three node keys
registered with ``docker/certs/register-nodes.sh``; then the three clients. Checks:

- a run of the guide's ``flwr run . docker-tls --stream`` command completes one round with all
  three authenticated clients;
- a SuperNode that does not trust the deployment's CA cannot connect (it gives up, TLS error);
- a SuperNode whose public key is not registered is refused and not listed.
"""

from __future__ import annotations

import json
import shlex
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from docker_helpers import (
    REPO,
    BuiltImages,
    Docker,
    concurrent_clientapps,
    first_round_turn,
    healthy_wait,
    wait_for,
)
from waits import HANG_GUARD_S, ClientAppTiming

from corbin_fl.deploy.flower import RUN_ID_RE

N_CLIENTS = 3
FILES = ["docker-compose.yml", "docker-compose.tls.yml"]
PROJECT = {
    "COMPOSE_PROJECT_NAME": "corbin-fl-tls",
    "CORBIN_FL_SUBNET": "10.213.10.0/24",
    "CORBIN_EDGE_SUBNET": "10.213.11.0/24",
}
"""The deployment's compose project and subnets (the compose files' settable subnets, as
test_machines.py sets them): the one-host demo (test_demo.py, project `corbin-fl` on
10.213.0-1) may run at the same time (.ci/run runs this layer on a worker per file)."""
COMPOSE_PROJECTS = (PROJECT["COMPOSE_PROJECT_NAME"],)
"""Its project (a failure shows its containers)."""
MAKE_CERTS = REPO / "docker" / "certs" / "make-certs.sh"
REGISTER = REPO / "docker" / "certs" / "register-nodes.sh"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _give_to_containers(*folders: Path) -> None:
    """Part B step 1: the containers' group (gid 49999) may read the credentials."""
    for folder in folders:
        subprocess.run(["chgrp", "-R", "49999", str(folder)], check=True, timeout=60)
        subprocess.run(["chmod", "-R", "g+rX", str(folder)], check=True, timeout=60)


def _make_certs(out: Path, nodes: int) -> None:
    subprocess.run(
        ["bash", str(MAKE_CERTS), "-o", str(out), "-n", str(nodes)],
        check=True,
        capture_output=True,
        timeout=300,
    )


@dataclass(frozen=True)
class Tls:
    """The running TLS deployment: its compose runner, credentials (``other``: a second CA and
    a SuperNode key), flwr home and the ClientApp probe its waits come from."""

    compose: Docker
    certs: Path
    other: Path
    home: Path
    probe: ClientAppTiming
    services: int
    healthy_wait: float
    """How long the deployment may take to be healthy again (:func:`healthy_wait`)."""

    def healthy(self) -> bool:
        """Every service of the deployment is up and healthy."""
        return self.compose.healthy(FILES, self.services)


@pytest.fixture(scope="module")
def tls(
    docker_cli: Docker,
    images: BuiltImages,
    project_cleanup: list[list[str]],
    tmp_path_factory: pytest.TempPathFactory,
    clientapp_probe: ClientAppTiming,
) -> Iterator[Tls]:
    """Part B steps 1-3 with the SuperLink on a free port; every service healthy."""
    if shutil.which("ssh-keygen") is None:
        pytest.fail("ssh-keygen is missing (apt-get install openssh-client)")
    base = tmp_path_factory.mktemp("tls")
    certs, other = base / "out", base / "other"
    _make_certs(certs, N_CLIENTS)
    _make_certs(other, 1)  # another CA and an unregistered node key
    _give_to_containers(certs / "superlink", *certs.glob("node-*"), other / "node-1")
    port = _free_port()
    env = {**docker_cli.env, **PROJECT, "SUPERLINK_PORT": str(port), "CERTS_DIR": str(certs)}
    compose = Docker(env=env)
    home = base / "flwr-home"
    home.mkdir()
    (home / "config.toml").write_text(
        '[superlink]\ndefault = "docker-tls"\n\n[superlink.docker-tls]\n'
        f'address = "127.0.0.1:{port}"\nroot-certificates = "{certs / "ca" / "ca.crt"}"\n'
    )
    files = [arg for f in FILES for arg in ("-f", f)]
    project_cleanup.append(["-p", PROJECT["COMPOSE_PROJECT_NAME"], *files])
    probe = clientapp_probe
    services = compose.compose(FILES, "config", "--services").split()
    # superlink, then the SuperNodes, then their executors
    wait = healthy_wait(probe, len(services), levels=3)
    compose.compose(FILES, "up", "-d", "superlink", "serverapp", timeout=900)
    reg_env = {**env, "FLWR_HOME": str(home)}
    # The Control API answers once the SuperLink is healthy.
    wait_for(
        lambda: Docker(env=reg_env).run("flwr", "supernode", "list", check=False).returncode == 0,
        wait,
        "the SuperLink's Control API over TLS",
        interval=2.0,
    )
    Docker(env=reg_env).run(str(REGISTER), "docker-tls", str(certs))
    compose.compose(FILES, "up", "-d", timeout=900)
    deployment = Tls(compose, certs, other, home, probe, len(services), wait)
    wait_for(deployment.healthy, wait, "every TLS service healthy", interval=2.0)
    yield deployment
    compose.compose(FILES, "down", "-v", "--timeout", "5", check=False)


def test_documented_tls_run_completes(tls: Tls, round_one_lock: Path) -> None:
    """The guide's Part B run command, one round, all three authenticated clients take part."""
    doc = (REPO / "docs" / "DOCKER.md").read_text(encoding="utf-8").replace("\\\n", " ")
    (command,) = [
        line.strip()
        for line in doc.splitlines()
        if line.strip().startswith("flwr run . docker-tls ")
    ]
    argv = shlex.split(command)
    assert "--stream" in argv, argv
    index = argv.index("--run-config") + 1
    documented = dict(kv.split("=", 1) for kv in shlex.split(argv[index]))
    out_dir = documented["out-dir"].strip('"') + f"-{int(time.time())}"
    probe = tls.probe
    first = probe.stage_timeout(concurrent_clientapps(), first=True, poll_interval=1.0)
    documented.update(
        {
            "out-dir": json.dumps(out_dir),
            "num-rounds": "1",
            "first-stage-timeout": str(round(first)),
        }
    )
    argv[index] = " ".join(f"{k}={v}" for k, v in documented.items())
    timeout = probe.run_timeout(
        rounds=1,
        first_round_stages=3,
        later_round_stages=2,
        concurrent=concurrent_clientapps(),
        poll_interval=1.0,
        wait_for_nodes=probe.startup_timeout(N_CLIENTS),
    )
    env = {**tls.compose.env, "FLWR_HOME": str(tls.home)}
    with first_round_turn(round_one_lock, 2 * timeout):  # its one round is its first
        # As an operator would: start on a healthy deployment (under load a TLS SuperLink has
        # gone a minute without answering while the other files' first rounds ran).
        wait_for(tls.healthy, tls.healthy_wait, "every TLS service healthy", interval=2.0)
        run = subprocess.run(
            argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
        )
    output = run.stdout + run.stderr
    started = RUN_ID_RE.search(output)
    if run.returncode != 0 and started and "SuperLink is unavailable" in output:
        # The operator's stream broke, not the run (it lives in the SuperLink): follow it to its
        # end once the deployment answers again, as DOCKER.md's `flwr log <RUN_ID> ... --stream`.
        print(f"the stream of run {started.group(1)} broke: followed with flwr log")
        wait_for(tls.healthy, tls.healthy_wait, "every TLS service healthy again", interval=2.0)
        follow = ["flwr", "log", started.group(1), "docker-tls", "--stream"]
        run = subprocess.run(
            follow, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
        )
        output += run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    metrics = tls.compose.compose(
        FILES, "exec", "-T", "serverapp", "cat", f"{out_dir}/metrics.jsonl"
    )
    rows = [json.loads(line) for line in metrics.splitlines() if line.strip()]
    assert [r["round"] for r in rows] == [1], output[-4000:]
    assert rows[0]["participants"] == N_CLIENTS and not rows[0]["dropped"], rows[0]


def _lone_supernode(tls: Tls, name: str, certs: Path, *extra: str) -> subprocess.Popen[str]:
    """A SuperNode container of the TLS deployment's network with ``certs`` at /certs."""
    network = f"{PROJECT['COMPOSE_PROJECT_NAME']}_fl"
    argv = [
        *("docker", "run", "--rm", "--name", name, "--network", network),
        *("-v", f"{certs}:/certs:ro", "corbin-fl/supernode:0.1.0"),
        *("--superlink", "superlink:8000", "--root-certificates", "/certs/ca.crt"),
        *("--auth-supernode-private-key", "/certs/node.key", "--isolation", "process"),
        *("--ssl-certfile", "/certs/runtime.pem", "--ssl-keyfile", "/certs/runtime.key"),
        *("--ssl-ca-certfile", "/certs/ca.crt"),
        *("--superexec-auth-secret-file", "/certs/superexec.secret"),
        *("--max-retries", "2", "--max-wait-time", "30"),
        *extra,
    ]
    return subprocess.Popen(
        argv, env=dict(tls.compose.env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def test_supernode_that_does_not_trust_the_ca_cannot_connect(tls: Tls) -> None:
    """A SuperNode with a registered key but another CA fails TLS and gives up."""
    mixed = tls.other / "mixed"
    mixed.mkdir()
    shutil.copy(tls.other / "ca" / "ca.crt", mixed / "ca.crt")
    for name in ("node.key", "runtime.pem", "runtime.key", "superexec.secret"):
        shutil.copy(tls.certs / "node-1" / name, mixed / name)
    _give_to_containers(mixed)
    node = _lone_supernode(tls, "corbin-fl-untrusting", mixed)
    try:
        out, _ = node.communicate(timeout=HANG_GUARD_S)
    finally:
        if node.poll() is None:
            node.kill()
    assert node.returncode != 0, out[-3000:]
    assert "Failed to activate SuperNode" not in out, out[-3000:]  # it never got that far
    assert "UNAVAILABLE" in out or "CERTIFICATE_VERIFY_FAILED" in out, out[-3000:]
    print(f"untrusting SuperNode: exit {node.returncode}")


def test_supernode_with_an_unregistered_key_is_refused(tls: Tls) -> None:
    """A SuperNode that trusts the CA and holds the deployment's runtime certificate and secret,
    but signs in with a key that was never registered, is refused by the SuperLink (Flower:
    "Exit Code: 305 ... Failed to activate SuperNode") and never listed."""
    unregistered = tls.other / "unregistered"
    unregistered.mkdir()
    for name in ("ca.crt", "runtime.pem", "runtime.key", "superexec.secret"):
        shutil.copy(tls.certs / "node-1" / name, unregistered / name)
    shutil.copy(tls.other / "node-1" / "node.key", unregistered / "node.key")
    _give_to_containers(unregistered)
    node = _lone_supernode(tls, "corbin-fl-unregistered", unregistered)
    try:
        out, _ = node.communicate(timeout=HANG_GUARD_S)
    finally:
        if node.poll() is None:
            node.kill()
    # Flower reports its exit code 305; the container's own exit status is not 305 (1 here).
    assert node.returncode != 0, out[-3000:]
    assert "Exit Code: 305" in out and "Failed to activate SuperNode" in out, out[-3000:]
    env = {**tls.compose.env, "FLWR_HOME": str(tls.home)}
    listed = Docker(env=env).run("flwr", "supernode", "list", "--format", "json").stdout
    assert len(json.loads(listed)["nodes"]) == N_CLIENTS, listed
    print(f"unregistered SuperNode: exit {node.returncode}")
