"""Execute one federated run with ``flwr run`` and collect its outputs atomically.

Two backends run the app of this repository (``server.app:app`` / ``client.app:app``):

* :class:`SimulationBackend` -- Flower's simulation runtime, through
  :func:`deploy.run.run_simulation` (the engine of ``corbin-fl simulate``): a private
  simulation SuperLink per run, every process it started stopped by PID at the end of the run.
* :class:`DeploymentBackend` -- a named connection of a running SuperLink
  (``flwr run <app> <connection> --stream``), its ``flwr`` process owned by a
  :class:`deploy.processes.ProcessRegistry`. The ServerApp must write ``out-dir`` on a
  filesystem this machine can read (same machine or a shared mount).

Each run writes into ``runs/<run-id>/``: ``app/`` (the app's ``out-dir``: ``metrics.jsonl``,
``summary.json``, ``events.jsonl``, the run-config file and, after a failure, the process logs),
then a copy of ``metrics.jsonl`` and, last and atomically, ``summary.json`` with the runner's
``"run"`` record (see :mod:`experiments.sweep` for the resume rule).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import shutil
import time
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import tomli_w

from corbin_fl.fsio import atomic_write_json
from deploy import flower, follow, processes
from deploy.run import LocalRunOptions, run_simulation
from experiments.sweep import METRICS_FILE, RUN_RECORD_KEY, SUMMARY_FILE, Run, read_metrics

logger = logging.getLogger(__name__)

APP_OUT_DIR = "app"
FAILED_FILE = "failed.json"
READY_TIMEOUT_S = 120.0
"""Seconds a simulation SuperLink has to start."""


class RunFailedError(RuntimeError):
    """A run ended without complete outputs; the message says why (with a log tail)."""


def find_app_dir() -> Path:
    """The folder of this project's Flower app (``pyproject.toml`` with ``[tool.flwr.app]``).

    Raises ``FileNotFoundError`` outside a source checkout (pass ``--app`` then).
    """
    import corbin_fl

    root = Path(corbin_fl.__file__).resolve().parents[1]
    pyproject = root / "pyproject.toml"
    if pyproject.is_file():
        with pyproject.open("rb") as fh:
            doc = tomllib.load(fh)
        if "app" in doc.get("tool", {}).get("flwr", {}):
            return root
    raise FileNotFoundError(
        f"no Flower app found at {root} (expected pyproject.toml with [tool.flwr.app]); "
        "run from a source checkout or pass --app <folder>"
    )


def check_app_accepts(app_dir: Path, keys: set[str]) -> None:
    """Raise if ``flwr run --run-config`` would reject some of ``keys``.

    Flower only overrides keys declared in the app's ``[tool.flwr.app.config]`` and fails the
    run otherwise; checking before the first run turns that into one clear ``ValueError``.
    """
    missing = sorted(keys - set(flower.app_config(app_dir)))
    if missing:
        raise ValueError(
            f"{Path(app_dir) / 'pyproject.toml'}: [tool.flwr.app.config] does not declare "
            f"{', '.join(missing)}; flwr run --run-config can only override declared keys"
        )


@dataclass(frozen=True)
class Submission:
    """How one ``flwr run`` ended."""

    ok: bool  # flwr run exited 0 and Flower reports the run finished:completed
    reason: str  # "completed" or why not (timeout, exit code and log tail, final status)
    flwr_run_id: int | None  # if the run was submitted
    status: str | None  # Flower's final run status (flwr ls), if known


class Backend(Protocol):
    """Something that executes one run of the app and blocks until it ends."""

    name: str

    def execute(
        self,
        run: Run,
        run_config: Mapping[str, Any],
        out_dir: Path,
        *,
        timeout_s: float,
        on_round: Callable[[int], None],
    ) -> Submission:
        """Run ``run`` with ``run_config`` (plus ``out-dir = out_dir``); call
        ``on_round(rounds_done)`` as it goes."""
        ...

    def close(self) -> None:
        """Release what the backend holds."""
        ...


class SimulationBackend:
    """Flower's simulation runtime, one private SuperLink per run (via the launcher).

    ``num_cpus_per_client``/``num_gpus_per_client`` are the Ray resources of one virtual client
    (``client-resources-num-cpus/gpus``, checked by the spec): ``cpus / num_cpus_per_client``
    clients train in parallel. The SuperLink has :data:`READY_TIMEOUT_S` to start.
    """

    name = "simulation"

    def __init__(
        self, app_dir: Path, *, num_cpus_per_client: int = 1, num_gpus_per_client: float = 0.0
    ) -> None:
        self.app_dir = Path(app_dir).resolve()
        self.num_cpus_per_client = num_cpus_per_client
        self.num_gpus_per_client = float(num_gpus_per_client)

    def execute(
        self,
        run: Run,
        run_config: Mapping[str, Any],
        out_dir: Path,
        *,
        timeout_s: float,
        on_round: Callable[[int], None],
    ) -> Submission:
        """Run ``run`` on a fresh simulation SuperLink with ``run.clients`` virtual nodes."""
        if run.clients is None:
            raise ValueError(f"run {run.run_id}: the simulation backend needs `clients`")
        fed: dict[str, Any] = {"client-resources-num-cpus": self.num_cpus_per_client}
        if self.num_gpus_per_client > 0:
            fed["client-resources-num-gpus"] = self.num_gpus_per_client
        options = LocalRunOptions(
            app_dir=self.app_dir,
            out_dir=Path(out_dir),
            num_clients=int(run.clients),
            run_config=dict(run_config),
            timeout=timeout_s,
            ready_timeout=READY_TIMEOUT_S,
            federation_config=fed,  # num-supernodes is added per run
        )
        result = run_simulation(options, lambda state: on_round(len(state.metrics)))
        return Submission(
            ok=result.ok, reason=result.reason, flwr_run_id=result.run_id, status=result.status
        )

    def close(self) -> None:
        """Nothing held between runs (each run stops its own processes)."""


class DeploymentBackend:
    """A named connection of a running SuperLink (``flwr run <app> <connection> --stream``);
    ``connection`` names a ``[superlink.<name>]`` of ``$FLWR_HOME/config.toml``."""

    name = "deployment"

    def __init__(self, app_dir: Path, connection: str) -> None:
        self.app_dir = Path(app_dir).resolve()
        self.connection = connection

    @property
    def cli(self) -> flower.FlowerCli:
        """The ``flwr`` CLI against the connection."""
        return flower.FlowerCli(self.connection, processes.flower_env(), timeout=60.0)

    def execute(
        self,
        run: Run,
        run_config: Mapping[str, Any],
        out_dir: Path,
        *,
        timeout_s: float,
        on_round: Callable[[int], None],
    ) -> Submission:
        """Submit ``run`` to the connection's SuperLink and follow it until it ends."""
        out_dir = Path(out_dir).resolve()
        out_dir.mkdir(parents=True, exist_ok=True)
        config_path = out_dir / "run-config.toml"
        config_path.write_text(
            tomli_w.dumps({**run_config, "out-dir": str(out_dir)}), encoding="utf-8"
        )
        registry = processes.ProcessRegistry()
        metrics = follow.JsonlTail(out_dir / METRICS_FILE)
        rounds = 0
        cmd = self.cli.run_argv(self.app_dir, config_path)
        try:
            proc = registry.start("flwr-run", cmd, out_dir / "logs" / "flwr-run.log")
            deadline, timed_out = time.monotonic() + timeout_s, False
            while proc.running() and not (timed_out := time.monotonic() > deadline):
                rounds += len(metrics.read_new())
                on_round(rounds)
                time.sleep(0.5)
            rounds += len(metrics.read_new())
            on_round(rounds)
            match = flower.RUN_ID_RE.search(proc.log_text())
            flwr_run_id = int(match.group(1)) if match else None
            if timed_out:
                if flwr_run_id is not None:
                    self.cli.stop(flwr_run_id)
                return Submission(False, f"timed out after {timeout_s:.0f} s", flwr_run_id, None)
            if (rc := proc.popen.returncode) != 0 or flwr_run_id is None:
                reason = f"`flwr run` exited with code {rc}:\n{proc.log_tail()}"
                return Submission(False, reason, flwr_run_id, None)
            status = self.cli.run_status(flwr_run_id)[0]
            if status != flower.COMPLETED_STATUS:
                return Submission(False, f"run ended with status {status}", flwr_run_id, status)
            return Submission(True, "completed", flwr_run_id, status)
        finally:
            registry.stop_all()

    def close(self) -> None:
        """Nothing to release: the SuperLink is not ours."""


def _log_tail(path: Path, lines: int = 15) -> str:
    """Last non-empty ``lines`` of a log (ANSI colours stripped), or ``""`` if there is none."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    kept = [ln for ln in processes.ANSI_RE.sub("", text).splitlines() if ln.strip()]
    return "\n".join(kept[-lines:])


PATH_KEYS: tuple[str, ...] = ("data-dir",)
"""Run-config keys holding a filesystem path; relative values are made absolute."""


def app_run_config(run_config: Mapping[str, Any], cwd: Path | None = None) -> dict[str, Any]:
    """The run config handed to the app: :data:`PATH_KEYS` resolved against ``cwd``.

    The app's processes do not run in the caller's working directory, so a relative
    ``data-dir`` of a spec (``data/cifar-10-batches-py``) is resolved here, where the user
    typed the command. The run's identity (hash, id) keeps the value as written in the spec.
    """
    base = Path.cwd() if cwd is None else Path(cwd)
    out = dict(run_config)
    for key in PATH_KEYS:
        value = out.get(key)
        if isinstance(value, str) and value:
            path = Path(value).expanduser()
            out[key] = str(path if path.is_absolute() else (base / value).resolve())
    return out


def execute_run(
    run: Run,
    backend: Backend,
    run_dir: Path,
    *,
    experiment: str,
    timeout_s: float,
    on_round: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Execute ``run`` and leave its complete outputs in ``run_dir`` (``<results>/runs/<id>``).

    Any previous content of ``run_dir`` (a partial run) is removed first. The app gets the run's
    whole result config and the spec's keys (so what it computes does not depend on the app's
    defaults) and ``out-dir = run_dir/app``. On success the folder holds ``app/``,
    ``metrics.jsonl`` and, written last and atomically, ``summary.json`` = the app's summary
    plus the runner's ``"run"`` record (with ``experiment``); that summary is returned.
    ``on_round`` gets the number of rounds finished so far.

    Raises ``RunFailedError`` if the backend reports a failure, or the app left no complete
    ``metrics.jsonl`` (one row per round) and ``summary.json``; a ``failed.json`` with the
    reason stays in ``run_dir`` then.
    """
    run_dir = Path(run_dir).resolve()
    if run_dir.exists():
        shutil.rmtree(run_dir)
    out_dir = run_dir / APP_OUT_DIR
    out_dir.mkdir(parents=True)
    num_rounds = int(run.run_config["num-rounds"])
    started = _dt.datetime.now(_dt.UTC)
    t0 = time.monotonic()
    sub = backend.execute(
        run,
        app_run_config({**run.config, **run.run_config}),
        out_dir,
        timeout_s=timeout_s,
        on_round=on_round or (lambda _rounds: None),
    )
    seconds = time.monotonic() - t0

    def fail(reason: str) -> RunFailedError:
        tail = _log_tail(out_dir / "logs" / "flwr-run.log")
        atomic_write_json(
            run_dir / FAILED_FILE,
            {
                "run_id": run.run_id,
                "reason": reason,
                "flwr_run_id": sub.flwr_run_id,
                "status": sub.status,
                "seconds": seconds,
                "log_tail": tail,
            },
        )
        more = (
            f"\n--- last lines of {out_dir / 'logs' / 'flwr-run.log'} ---\n{tail}" if tail else ""
        )
        return RunFailedError(f"run {run.run_id}: {reason}{more}")

    def read(name: str, load: Callable[[Path], Any]) -> Any:
        try:
            return load(out_dir / name)
        except (OSError, ValueError) as exc:
            raise fail(f"no readable {APP_OUT_DIR}/{name}: {exc}") from None

    if not sub.ok:
        raise fail(sub.reason)
    rows = read(METRICS_FILE, read_metrics)
    if len(rows) != num_rounds:
        raise fail(f"{APP_OUT_DIR}/{METRICS_FILE} has {len(rows)} rows, expected {num_rounds}")
    app_summary = read(SUMMARY_FILE, lambda path: json.loads(path.read_text(encoding="utf-8")))
    if not isinstance(app_summary, dict):
        raise fail(f"{APP_OUT_DIR}/{SUMMARY_FILE} is not a JSON object")

    shutil.copyfile(out_dir / METRICS_FILE, run_dir / METRICS_FILE)
    record = {
        "run_id": run.run_id,
        "config_hash": run.config_hash,
        "experiment": experiment,
        "run_config": dict(run.run_config),
        "config": dict(run.config),
        "clients": run.clients,
        "backend": backend.name,
        "flwr_run_id": sub.flwr_run_id,
        "status": sub.status,
        "started_at": started.isoformat(),
        "seconds": seconds,
        "complete": True,
    }
    summary = {**app_summary, RUN_RECORD_KEY: record}
    atomic_write_json(run_dir / SUMMARY_FILE, summary)
    with contextlib.suppress(FileNotFoundError):
        (run_dir / FAILED_FILE).unlink()
    return summary
