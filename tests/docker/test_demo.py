"""docs/DOCKER.md Part A on a real engine: the images, the one-host demo, a run, a dropout.

- every image docker-compose.yml needs is built (once per session, ``images`` fixture); every
  image's and every container's user is the non-root ``app`` (49999); no private key, no file of
  the build's CA secret and no certificate of it is in any layer of any image; sizes printed;
- ``docker compose up -d`` starts the demo and every service becomes healthy;
- DOCKER.md's own ``flwr run . docker --stream ...`` command (parsed from the document) runs
  four rounds against it; in round 2 ``docker kill`` SIGKILLs one client's SuperNode and
  ClientApp executor: round 2 and round 3 complete with the other clients, the drop is recorded
  with its stage and reason; then ``docker compose up -d`` brings that client back and it takes
  part in a later round under a new node id; the model learns (accuracy floor 0.5) with the
  app's defaults: the derived update radius, almost nothing clipped.
"""

from __future__ import annotations

import json
import re
import shlex
import socket
import subprocess
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from docker_helpers import (
    REPO,
    BuiltImages,
    Docker,
    concurrent_clientapps,
    first_round_turn,
    healthy_wait,
    wait_for,
    while_running,
)
from waits import HANG_GUARD_S, ClientAppTiming

DEMO_MIN_ACCURACY = 0.5
"""Test accuracy floor of the demo run's last round (chance 0.1; the app's defaults reach about
0.8 with 3 clients in two rounds at eps_p = 1; the 1,000 test digits give a binomial std of
0.013)."""
APP_USER = "49999:49999"
N_CLIENTS = 3
ROUNDS = 4
KILLED = 2
"""The client killed in round 2 (supernode-2 and clientapp-2), back for a later round."""
COMPOSE_PROJECTS = ("corbin-fl",)
"""docker-compose.yml's project (a failure shows its containers)."""


def _documented_run_command() -> list[str]:
    """DOCKER.md's ``flwr run . docker`` command of Part A, as argv."""
    doc = (REPO / "docs" / "DOCKER.md").read_text(encoding="utf-8").replace("\\\n", " ")
    (command,) = [
        line.strip()
        for line in doc.splitlines()
        if line.strip().startswith("flwr run . docker ") and "--run-config" in line
    ]
    return shlex.split(command)


def _guide_commands() -> list[str]:
    """The command lines of DOCKER.md's ``bash`` blocks (continuations joined, comments
    dropped), as tests/unit/test_documented_commands.py reads them."""
    doc = (REPO / "docs" / "DOCKER.md").read_text(encoding="utf-8")
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", doc, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#\s.*$", "", line).strip()
            if line and not line.startswith("#"):
                lines.append(" ".join(line.split()))
    return lines


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# --------------------------------------------------------------------------- the images


PACKAGED = re.compile(r"(^|/)(site-packages|dist-packages|usr/share|usr/lib)/")
"""Files installed by pip or apt: their self-tests hold private keys of their own (pycryptodome's
test data, GnuTLS's built-in self-test keys), which are not this deployment's."""
SECRET_NAMES = re.compile(
    r"(^|/)(run/secrets/[^/]+|certs/(out|node)/.*|node\.key(\.pub)?|ca\.key|server\.(key|pem)|"
    r"runtime\.(key|pem)|superexec\.secret|\.env)$"
)
"""Paths of make-certs.sh's output, of the build secret and of compose settings."""
PEM_PRIVATE_KEY = re.compile(rb"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----\r?\n[A-Za-z0-9+/]{40}")
"""A PEM private key with its body (a library's string constant is not one)."""


def _layer_findings(tar: tarfile.TarFile, marker: str) -> Iterator[str]:
    """What in one layer must not be in an image: a credential file of the deployment, a private
    key outside what pip and apt installed, or the build's CA secret (its marker certificate,
    looked for in every file)."""
    needle = marker.encode()[:64]
    for member in tar:
        if SECRET_NAMES.search(member.name):
            yield member.name
        if not member.isfile() or member.size > 8_000_000:
            continue
        handle = tar.extractfile(member)
        data = handle.read() if handle is not None else b""
        binary = data.startswith(b"\x7fELF")
        if not binary and not PACKAGED.search(member.name) and PEM_PRIVATE_KEY.search(data):
            yield f"{member.name}: a private key"
        if needle in data.replace(b"\n", b""):
            yield f"{member.name}: the build secret's certificate"


def test_images_non_root_without_secrets(docker_cli: Docker, images: BuiltImages) -> None:
    """Every image ends as the non-root user; no layer holds a key, the CA secret or a cert of
    ours; every image's size is printed."""
    for name in images.names:
        config = json.loads(docker_cli.run("docker", "image", "inspect", name).stdout)[0]
        assert config["Config"]["User"] == APP_USER, f"{name} runs as {config['Config']['User']}"
        print(f"{name}: {config['Size'] / 1e6:.0f} MB")
    save = subprocess.Popen(
        ["docker", "save", *images.names], stdout=subprocess.PIPE, env=dict(docker_cli.env)
    )
    assert save.stdout is not None
    findings: list[str] = []
    layers = 0
    with tarfile.open(fileobj=save.stdout, mode="r|") as outer:
        for member in outer:
            if not member.name.endswith("layer.tar") or not member.isfile():
                continue
            layers += 1
            handle = outer.extractfile(member)
            assert handle is not None
            with tarfile.open(fileobj=handle, mode="r|") as layer:
                findings += [f"{member.name}: {f}" for f in _layer_findings(layer, images.marker)]
    assert save.wait(timeout=HANG_GUARD_S) == 0
    assert layers > 0
    assert not findings, findings
    print(f"{layers} layers searched; images built in {images.seconds:.0f} s")


# --------------------------------------------------------------------------- the demo


@dataclass(frozen=True)
class Demo:
    """The running demo: the environment its compose commands need, and the ClientApp probe
    its waits are derived from."""

    env: dict[str, str]
    probe: ClientAppTiming


@pytest.fixture(scope="module")
def demo(
    docker_cli: Docker,
    images: BuiltImages,
    project_cleanup: list[list[str]],
    clientapp_probe: ClientAppTiming,
) -> Iterator[Demo]:
    """DOCKER.md Part A step 1 (the images are built): ``docker compose up -d``, until every
    service is healthy."""
    port = _free_port()
    env = {**docker_cli.env, "SUPERLINK_PORT": str(port)}
    compose = Docker(env=env)
    project_cleanup.append(["-f", "docker-compose.yml"])
    compose.compose([], "up", "-d", timeout=900)
    services = compose.compose([], "config", "--services").split()
    assert len(services) == 2 + 2 * N_CLIENTS, services
    probe = clientapp_probe
    # superlink, then the SuperNodes, then their executors
    wait = healthy_wait(probe, len(services), levels=3)
    wait_for(lambda: compose.healthy([], len(services)), wait, "every demo service healthy", 2.0)
    yield Demo(env={"SUPERLINK_PORT": str(port)}, probe=probe)
    compose.compose([], "down", "-v", "--timeout", "5", check=False)


def _metrics(compose: Docker, out_dir: str) -> list[dict[str, Any]]:
    """The run's metrics.jsonl rows so far, read in the ServerApp executor's container."""
    script = f"cat {out_dir}/metrics.jsonl 2>/dev/null || true"
    res = compose.compose([], "exec", "-T", "serverapp", "sh", "-c", script)
    return [json.loads(line) for line in res.splitlines() if line.strip()]


def test_containers_run_as_the_app_user(docker_cli: Docker, demo: Demo) -> None:
    """Every running container of the demo runs its processes as uid 49999, and the app
    containers' home belongs to it whole (the caches the processes write live there)."""
    compose = Docker(env={**docker_cli.env, **demo.env})
    for service in compose.compose([], "config", "--services").split():
        uid = compose.compose([], "exec", "-T", service, "id", "-u").strip()
        assert uid == "49999", f"{service} runs as uid {uid}"
        if service.startswith(("clientapp", "serverapp")):
            foreign = compose.compose(
                [], "exec", "-T", service, "find", "/app", "-not", "-user", "49999", "-print"
            ).split()
            assert not foreign, f"{service}: not the app user's in its home: {foreign}"


def test_documented_run_learns_through_a_kill_and_a_rejoin(
    docker_cli: Docker, demo: Demo, flwr_home_docker: Path, round_one_lock: Path
) -> None:
    """DOCKER.md's run command, 4 rounds: client 2 killed in round 2, back in a later round."""
    compose = Docker(env={**docker_cli.env, **demo.env})
    probe = demo.probe
    argv = _documented_run_command()
    assert argv[:4] == ["flwr", "run", ".", "docker"] and "--stream" in argv, argv
    index = argv.index("--run-config") + 1
    documented = dict(kv.split("=", 1) for kv in shlex.split(argv[index]))
    assert set(documented) == {"out-dir", "num-rounds", "stage-timeout"}, argv
    out_dir = documented["out-dir"].strip('"') + f"-{int(time.time())}"
    # A busy machine may need longer stages than the documented 30 s (an execution key).
    stage = probe.stage_timeout(concurrent_clientapps(), first=False, poll_interval=1.0)
    first = probe.stage_timeout(concurrent_clientapps(), first=True, poll_interval=1.0)
    documented.update(
        {
            "out-dir": json.dumps(out_dir),
            "num-rounds": str(ROUNDS),
            "stage-timeout": str(max(float(documented["stage-timeout"]), round(stage))),
            "first-stage-timeout": str(round(first)),
        }
    )
    argv[index] = " ".join(f"{k}={v}" for k, v in documented.items())
    (flwr_home_docker / "config.toml").write_text(
        '[superlink]\ndefault = "docker"\n\n[superlink.docker]\n'
        f'address = "127.0.0.1:{demo.env["SUPERLINK_PORT"]}"\ninsecure = true\n'
    )
    run_timeout = probe.run_timeout(
        rounds=ROUNDS,
        first_round_stages=3,
        later_round_stages=2,
        concurrent=concurrent_clientapps(),
        poll_interval=1.0,
        wait_for_nodes=probe.startup_timeout(2 * N_CLIENTS + 2),
    )
    log = flwr_home_docker / "run.log"
    turn = first_round_turn(round_one_lock, 2 * run_timeout)
    with log.open("w") as sink, turn as round_one_done:
        run = subprocess.Popen(
            argv,
            cwd=REPO,
            env={**compose.env, "FLWR_HOME": str(flwr_home_docker)},
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
        try:
            # Round 1 done: round 2 is running. Kill client 2 (both its containers).
            round_one = while_running(lambda: len(_metrics(compose, out_dir)) >= 1, run, log)
            wait_for(round_one, run_timeout, "round 1")
            round_one_done()
            killed = [f"corbin-fl-supernode-{KILLED}-1", f"corbin-fl-clientapp-{KILLED}-1"]
            compose.run("docker", "kill", *killed)
            state = compose.run("docker", "inspect", "--format", "{{.State.Status}}", *killed)
            assert state.stdout.split() == ["exited", "exited"], state.stdout
            round_two = while_running(lambda: len(_metrics(compose, out_dir)) >= 2, run, log)
            wait_for(round_two, run_timeout, "round 2")
            # Docker does not restart a killed container (unless-stopped); bring it back.
            compose.compose(
                [], "up", "-d", f"supernode-{KILLED}", f"clientapp-{KILLED}", timeout=HANG_GUARD_S
            )
            assert run.wait(timeout=run_timeout) == 0, log.read_text()[-4000:]
        finally:
            if run.poll() is None:
                run.kill()
                run.wait()
    output = log.read_text()
    rows = _metrics(compose, out_dir)
    assert [r["round"] for r in rows] == list(range(1, ROUNDS + 1)), output[-4000:]
    first_nodes = set(rows[0]["devices"])
    assert rows[0]["participants"] == N_CLIENTS and len(first_nodes) == N_CLIENTS, rows[0]
    # Round 2: the killed node is dropped with its stage and reason; the others go on.
    dropped = rows[1]["dropped"]
    assert len(dropped) == 1, rows[1]
    ((node, reason),) = dropped.items()
    assert node in first_nodes and re.fullmatch(r"(keygen|pair|update): .+", reason), dropped
    assert rows[1]["participants"] == N_CLIENTS - 1, rows[1]
    # Round 3 completes with the others (the dead node may be sampled and dropped once more).
    assert rows[2]["participants"] >= N_CLIENTS - 1, rows[2]
    # The client is back under a new node id in a later round.
    rejoined = [r["round"] for r in rows[2:] if set(r["devices"]) - first_nodes]
    assert rejoined, [r["devices"] for r in rows]
    assert rows[-1]["participants"] == N_CLIENTS, rows[-1]
    assert rows[-1]["test_accuracy"] >= DEMO_MIN_ACCURACY, rows[-1]
    summary = json.loads(
        compose.compose([], "exec", "-T", "serverapp", "cat", f"{out_dir}/summary.json")
    )
    assert len(summary["clip_fraction"]["per_round"]) == ROUNDS, summary
    # The deployment runs the app's defaults (tests/system/test_defaults_learn.py relies on this
    # run for them): the update range with R derived from public training settings,
    # ceil(3,200 training digits / (3 clients x batch 64)) = 17 Adam steps x lr 1e-3, which
    # bounds Adam's update: almost nothing is clipped (a fixed R = 0.01 clipped 12% in round 1).
    assert summary["config"]["range-mode"] == "update" and summary["config"]["epsilon"] == 1.0
    assert summary["update_radius"]["value"] == pytest.approx(17 * 1e-3), summary["update_radius"]
    assert summary["clip_fraction"]["max"] < 0.01, summary["clip_fraction"]
    # The run's log ends on its outcome (the ServerApp's last line), and step 3's listing of the
    # rounds that dropped a client, as the guide writes it, lists those and only those.
    assert f"CorBin-FL run completed: {ROUNDS}/{ROUNDS} rounds, test accuracy" in output, output[
        -4000:
    ]
    (grep,) = [c for c in _guide_commands() if c.startswith("docker compose exec serverapp grep ")]
    argv = [a.replace("/app/runs/demo", out_dir) for a in shlex.split(grep)]
    listed = compose.compose([], "exec", "-T", *argv[3:])
    dropped_rounds = [json.loads(line)["round"] for line in listed.splitlines() if line.strip()]
    assert dropped_rounds == [r["round"] for r in rows if r["dropped"]], listed
    assert 2 in dropped_rounds, listed
    print(f"rounds: {[(r['round'], r['participants'], r['dropped']) for r in rows]}")
    print(f"rejoined in round(s) {rejoined}; last test accuracy {rows[-1]['test_accuracy']}")
