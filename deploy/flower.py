"""Flower 1.42 as a set of programs: executables, environment, connections, node-config strings,
the ``/health`` probe and the JSON of the ``flwr`` CLI.

Flower 1.42 facts this package relies on (checked against the installed ``--help`` and source;
the ``--help`` of the three server-side programs is the same as 1.41's):

* ``flower-superlink`` serves its Fleet, Control and Runtime (ServerAppIo) APIs over HTTP on ONE
  port (``--host``/``--port``, default 127.0.0.1:8000) and exposes ``GET /health``. The legacy gRPC
  Fleet/Control servers (9092/9093) only start when ``FLWR_INTERNAL_GRPC_*`` is set; we unset
  those variables, so one free port per SuperLink is enough.
* ``flower-superlink`` starts a ``flower-superexec`` in a NEW session (``start_new_session``), which
  in turn starts one ``flwr-serverapp`` per run; ``flower-supernode`` starts a ``flower-superexec``
  (same process group) that starts one ``flwr-clientapp`` process per message. Every helper polls
  its parent's PID and exits when it disappears, but only once the parent is reaped; we therefore
  track whole process trees (``/proc``) and kill them explicitly.
* Each ``flower-supernode`` needs its own Runtime API port (``--port``; 1.41 replaced
  ``--clientappio-api-address`` by ``--host``/``--port``) and logs ``SuperNode ID: <id>`` once it
  has registered with the SuperLink; ``flwr supernode list <conn> --format json`` then reports
  it ``online``.
* ``flwr run <app> <conn> --stream`` prints ``Successfully started run <id>`` and returns when the
  run has finished; ``flwr ls <conn> --run-id <id> --format json`` reports the final status
  (``finished:completed`` on success).
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import tomli_w

from corbin_fl.deploy.processes import LauncherError, ManagedProcess
from corbin_fl.flower_version import FLOWER_REQUIREMENT, check_app_requirement, check_flower

logger = logging.getLogger(__name__)

CONNECTION_NAME: Final[str] = "corbin-local"
"""Name of the SuperLink connection written into the temporary ``FLWR_HOME/config.toml``."""


RUN_ID_RE: Final[re.Pattern[str]] = re.compile(r"Successfully started run (\d+)")


NODE_ID_RE: Final[re.Pattern[str]] = re.compile(r"SuperNode ID: (\d+)")


ADDR_IN_USE: Final[tuple[str, ...]] = ("address already in use", "errno 98")


COMPLETED_STATUS: Final[str] = "finished:completed"


class MissingDependencyError(LauncherError):
    """A runtime this run needs is not installed (e.g. Ray for the simulation runtime)."""


# ====================================================================== Flower executables
def flower_executable(name: str) -> str:
    """Absolute path of a Flower console script, preferring the running interpreter's ``bin``.

    Raises
    ------
    LauncherError
        If the script is not installed.
    """
    local = Path(sys.executable).parent / name
    if local.exists() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which(name)
    if found is None:
        raise LauncherError(
            f"`{name}` not found: install flwr (pip install '{FLOWER_REQUIREMENT}')"
        )
    return found


def write_connection(
    flwr_home: Path, address: str, name: str = CONNECTION_NAME, *, insecure: bool = True
) -> Path:
    """Write ``FLWR_HOME/config.toml`` with one SuperLink connection, made the default.

    The file format is Flower 1.42's (as 1.41's): ``[superlink] default = name`` and
    ``[superlink.<name>] address = "host:port"`` (``":local:"`` for the managed simulation
    SuperLink) plus ``insecure = true``.
    """
    flwr_home.mkdir(parents=True, exist_ok=True)
    conn: dict[str, Any] = {"address": address}
    if insecure:
        conn["insecure"] = True
    path = flwr_home / "config.toml"
    path.write_text(tomli_w.dumps({"superlink": {"default": name, name: conn}}))
    return path


def http_ok(url: str, timeout: float = 1.0) -> bool:
    """Whether ``url`` answers a GET with a 2xx status within ``timeout`` seconds.

    Anything else is ``False``, never an exception: no answer, an error status, and a reply that
    is not HTTP/1 at all (``http.client.HTTPException``). The last happens when another process
    took the port a SuperLink was started on a moment before it, and is a gRPC server (HTTP/2):
    the launcher then sees its SuperLink exit with "address in use" and retries elsewhere.
    """
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return 200 <= resp.status < 300
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException):
        return False


# ====================================================================== config helpers
def _toml_scalar(value: Any) -> str:
    text = tomli_w.dumps({"v": value}).strip()
    return text.split("=", 1)[1].strip()


def format_config_args(config: Mapping[str, Any]) -> str:
    """Format ``{k: v}`` as Flower's ``"k1=v1 k2=v2"`` with TOML values (strings quoted).

    Raises
    ------
    ValueError
        If a key is empty or has whitespace/``=``, or a string value has a double quote
        or whitespace would break Flower's parser (use a TOML file for such values).
    """
    parts = []
    for key, value in config.items():
        if not isinstance(key, str) or not key or re.search(r"[\s=]", key):
            raise ValueError(f"invalid config key {key!r}")
        if isinstance(value, str) and '"' in value:
            raise ValueError(f"config value of {key!r} must not contain a double quote")
        if not isinstance(value, bool | int | float | str):
            raise TypeError(f"config value of {key!r} must be bool/int/float/str, got {value!r}")
        parts.append(f"{key}={_toml_scalar(value)}")
    return " ".join(parts)


def parse_config_string(text: str) -> dict[str, Any]:
    """Parse ``"k1=v1 k2=v2"`` (TOML values, like ``flwr run --run-config``) or a ``.toml`` path.

    Raises
    ------
    ValueError
        If the string is not in that format.
    """
    text = text.strip()
    if not text:
        return {}
    if text.endswith(".toml"):
        path = Path(text).expanduser()
        if not path.is_file():
            raise ValueError(f"run-config file not found: {path}")
        with path.open("rb") as fh:
            loaded = tomllib.load(fh)
        return _flatten(loaded)
    pattern = re.compile(r"(\S+?)=('[^']*'|\"[^\"]*\"|\S+)")
    matches = pattern.findall(text)
    leftover = pattern.sub("", text).strip()
    if leftover or not matches:
        raise ValueError(
            f"run config must be space-separated key=value pairs (TOML values, strings "
            f"quoted), e.g. 'epsilon=0.5 cr-mode=\"derived\"'; could not parse {text!r}"
        )
    out: dict[str, Any] = {}
    for key, raw in matches:
        try:
            out[key] = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            # Flower accepts only TOML values; an unquoted word is a string the user meant.
            if re.fullmatch(r"[A-Za-z_][\w.\-/]*", raw):
                out[key] = raw
            else:
                raise ValueError(f"invalid TOML value for {key!r}: {raw!r}") from None
    return out


def _flatten(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in table.items():
        name = f"{prefix}.{key}" if prefix else key
        if isinstance(value, Mapping):
            out.update(_flatten(value, name))
        else:
            out[name] = value
    return out


def json_from_output(text: str) -> dict[str, Any] | None:
    """The JSON object in a ``flwr ... --format json`` output (may follow other lines)."""
    start = text.find("{")
    if start < 0:
        return None
    try:
        obj, _ = json.JSONDecoder().raw_decode(text[start:])
    except json.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


SIMULATION_INSTALL_HINT: Final[str] = 'pip install -e ".[tools,simulation]"'
"""How to install the simulation extra in a checkout of this repository."""


def _module_available(name: str) -> bool:
    """Whether ``import name`` would find the module (without importing it)."""
    return importlib.util.find_spec(name) is not None


def simulation_extra_missing() -> str | None:
    """Why Flower's simulation runtime cannot start here, or None if it can.

    Flower 1.42's ``run_simulation`` checks ``importlib.util.find_spec("ray")`` in the process
    it spawns (same interpreter as ours: :func:`flower_executable` prefers its ``bin``) and
    exits with code 701 (``SIMULATION_MISSING_EXTRA``) if Ray is missing; ``flwr run`` then
    only reports an unknown error. The same check, made here, fails before anything starts.
    """
    if _module_available("ray"):
        return None
    return (
        "the simulation runtime needs Ray (the [simulation] extra), which is not installed for "
        f"{sys.executable}: run {SIMULATION_INSTALL_HINT} in the repository "
        '(or pip install "flwr[simulation]==1.42.*"), or use `corbin-fl local`'
    )


def check_flower_versions(app_dir: str | Path) -> str:
    """Check, before anything starts, that this interpreter's flwr is of the series CorBin-FL runs
    on and that the app's own ``flwr`` requirement (``[project].dependencies`` of its
    ``pyproject.toml``, which its FAB carries) admits it; return the installed version.

    A mismatch would otherwise surface as a gRPC error or Flower's exit code 606 from a process
    started later (:mod:`corbin_fl.flower_version`).

    Raises
    ------
    FlowerVersionError
        Naming both versions (and the file, for the app's requirement).
    """
    version = check_flower("corbin-fl")
    path = Path(app_dir) / "pyproject.toml"
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return version  # not an app: `flwr run` says so
    dependencies = doc.get("project", {}).get("dependencies", [])
    if isinstance(dependencies, list):
        check_app_requirement([str(d) for d in dependencies], str(path), version)
    return version


def app_config(app_dir: str | Path, *, strict: bool = False) -> dict[str, Any]:
    """The app's run-config defaults, ``[tool.flwr.app.config]`` of its ``pyproject.toml``,
    nested tables flattened with dots as Flower does: what Flower runs with for every key not
    overridden. ``{}`` when the file or the table is missing, unless ``strict``.

    Raises
    ------
    OSError, tomllib.TOMLDecodeError
        With ``strict``, if the file cannot be read or parsed.
    LookupError
        With ``strict``, if it has no ``[tool.flwr.app.config]`` table.
    """
    path = Path(app_dir) / "pyproject.toml"
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        if strict:
            raise
        return {}
    table = doc.get("tool", {}).get("flwr", {}).get("app", {}).get("config")
    if isinstance(table, Mapping):
        return _flatten(table)
    if strict:
        raise LookupError(f"{path}: no [tool.flwr.app.config] table (not a Flower app?)")
    return {}


@dataclass(frozen=True)
class FlowerCli:
    """The ``flwr`` CLI against one SuperLink connection: the only wrapper of it in the project.

    Used by the local deployment, the network-namespace deployment and the experiment runner's
    deployment backend.

    Parameters
    ----------
    connection : str
        A ``[superlink.<name>]`` connection of ``$FLWR_HOME/config.toml`` (``FLWR_HOME`` in
        ``env``), or an address Flower accepts there.
    env : Mapping[str, str]
        The full environment of every command (:func:`deploy.processes.flower_env`).
    timeout : float
        Default limit of one command in seconds: one Flower process start-up plus a request, so
        derive it from the machine (a loaded machine starts processes slowly).
    wrap : Callable[[list[str]], list[str]] | None
        Rewrites each argv before it runs, e.g. ``ip netns exec <ns> ...`` to run it on another
        emulated host.
    """

    connection: str
    env: Mapping[str, str]
    timeout: float = 120.0
    wrap: Callable[[list[str]], list[str]] | None = None

    def __call__(
        self, *args: str, timeout: float | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run ``flwr *args`` (captured text); exit code 124 if it did not end in time."""
        cmd = [flower_executable("flwr"), *args]
        argv = self.wrap(cmd) if self.wrap is not None else cmd
        try:
            return subprocess.run(
                argv,
                capture_output=True,
                text=True,
                env=dict(self.env),
                timeout=self.timeout if timeout is None else timeout,
                stdin=subprocess.DEVNULL,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            return subprocess.CompletedProcess(argv, 124, str(exc.stdout or ""), "timed out")
        except OSError as exc:
            return subprocess.CompletedProcess(argv, 127, "", f"cannot run flwr: {exc}")

    def json(self, *args: str, timeout: float | None = None) -> dict[str, Any] | None:
        """The JSON object of ``flwr *args --format json``, None if the command failed."""
        res = self(*args, "--format", "json", timeout=timeout)
        payload = json_from_output(res.stdout)
        if res.returncode != 0 or payload is None:
            logger.debug("flwr %s failed: %s", " ".join(args), (res.stdout + res.stderr)[-500:])
            return None
        return payload

    def online_node_ids(self) -> set[int] | None:
        """Node ids the SuperLink lists as ``online`` (``flwr supernode list``), None on error."""
        payload = self.json("supernode", "list", self.connection)
        if payload is None:
            return None
        return {
            int(node["node-id"])
            for node in payload.get("nodes", [])
            if str(node.get("status", "")).lower() == "online"
        }

    def run_status(self, run_id: int) -> tuple[str | None, str | None]:
        """``(status, details)`` of a run (``flwr ls --run-id``), ``(None, None)`` on error."""
        payload = self.json("ls", self.connection, "--run-id", str(run_id))
        try:
            run = payload["runs"][0]  # type: ignore[index]
        except (TypeError, KeyError, IndexError):
            return None, None
        return str(run.get("status")), str(run.get("status-details"))

    def stop(self, run_id: int) -> bool:
        """Ask the SuperLink to stop a run (best effort); whether ``flwr stop`` succeeded."""
        res = self("stop", str(run_id), self.connection)
        if res.returncode != 0:
            logger.warning("flwr stop %d failed: %s", run_id, (res.stdout + res.stderr)[-500:])
        return res.returncode == 0

    def final_status(self, run_id: int, wait: float = 20.0) -> tuple[str | None, str | None]:
        """:meth:`run_status`, polled for up to ``wait`` seconds until it is ``finished:*`` (the
        final status can lag the end of ``flwr run``'s log stream a little)."""
        deadline = time.monotonic() + wait
        while True:
            status, details = self.run_status(run_id)
            if (status is not None and status.startswith("finished")) or (
                time.monotonic() > deadline
            ):
                return status, details
            time.sleep(0.5)

    def run_argv(
        self,
        app_dir: Path,
        run_config: Path,
        federation_config: Mapping[str, Any] | None = None,
    ) -> list[str]:
        """``flwr run <app_dir> <connection> --stream --run-config <file>`` (wrapped), with
        ``--federation-config`` for the simulation runtime."""
        cmd = [
            flower_executable("flwr"),
            "run",
            str(Path(app_dir).resolve()),
            self.connection,
            "--stream",
            "--run-config",
            str(run_config),
        ]
        if federation_config:
            cmd += ["--federation-config", format_config_args(federation_config)]
        return self.wrap(cmd) if self.wrap is not None else cmd


def wait_online(
    supernodes: Mapping[Any, ManagedProcess],
    node_ids: dict[Any, int],
    cli: FlowerCli,
    timeout: float,
    where: str,
) -> dict[Any, int]:
    """Wait until every SuperNode has logged its node id and the SuperLink lists it ``online``.

    ``node_ids`` (key of ``supernodes`` -> node id) is filled in place as the ids appear.

    Raises
    ------
    LauncherError
        If a SuperNode exits, or they are not all online within ``timeout`` seconds (``where``
        says where the logs are).
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for key, proc in supernodes.items():
            if not proc.running():
                raise LauncherError(
                    f"SuperNode {key} exited during start-up (code {proc.popen.returncode}); "
                    f"last log lines:\n{proc.log_tail()}"
                )
            if key not in node_ids and (m := NODE_ID_RE.search(proc.log_text())):
                node_ids[key] = int(m.group(1))
        if len(node_ids) == len(supernodes):
            online = cli.online_node_ids()
            if online is not None and set(node_ids.values()) <= online:
                logger.info("%d SuperNodes online", len(node_ids))
                return dict(node_ids)
        time.sleep(0.5)
    missing = sorted(str(k) for k in set(supernodes) - set(node_ids))
    raise LauncherError(
        f"SuperNodes not online within {timeout:g} s (no node id yet for {missing or 'none'}; "
        f"ids so far {node_ids}); see the logs in {where}"
    )


def superlink_argv(
    host: str,
    port: int,
    *,
    certs: Path | None = None,
    simulation: bool = False,
    database: Path | None = None,
) -> list[str]:
    """``flower-superlink`` serving all its APIs on ``host:port``.

    ``certs`` is the SuperLink's folder of ``docker/certs/make-certs.sh`` (``ca.crt``,
    ``server.pem``, ``server.key``): TLS on every link plus SuperNode authentication; without it
    the SuperLink runs ``--insecure``. Runtime dependency installation is always off.
    """
    cmd = [
        flower_executable("flower-superlink"),
        "--disable-runtime-dependency-installation",
        "--host",
        host,
        "--port",
        str(port),
    ]
    if certs is not None:
        cmd += [
            "--ssl-ca-certfile",
            str(certs / "ca.crt"),
            "--ssl-certfile",
            str(certs / "server.pem"),
            "--ssl-keyfile",
            str(certs / "server.key"),
            "--enable-supernode-auth",
        ]
    else:
        cmd.append("--insecure")
    if simulation:
        cmd.append("--simulation")
    if database is not None:
        cmd += ["--database", str(database)]
    return cmd


def supernode_argv(
    superlink: str,
    node_config: Mapping[str, Any],
    *,
    certs: Path | None = None,
    runtime_api: tuple[str, int] | None = None,
) -> list[str]:
    """``flower-supernode`` of ``superlink`` (``host:port``) with ``node_config``.

    ``certs`` is the node's folder of ``make-certs.sh`` (``ca.crt``, ``node.key``): TLS and the
    node's authentication key; without it ``--insecure``. ``runtime_api`` is the ``(host,
    port)`` of its Runtime API (Flower's default 127.0.0.1:9094 when None: one SuperNode per
    host).
    """
    cmd = [
        flower_executable("flower-supernode"),
        "--superlink",
        superlink,
        "--node-config",
        format_config_args(node_config),
    ]
    if certs is not None:
        cmd += [
            "--root-certificates",
            str(certs / "ca.crt"),
            "--auth-supernode-private-key",
            str(certs / "node.key"),
        ]
    else:
        cmd.append("--insecure")
    if runtime_api is not None:
        cmd += ["--host", runtime_api[0], "--port", str(runtime_api[1])]
    return cmd
