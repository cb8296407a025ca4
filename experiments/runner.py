"""Execute one federated run on Flower's simulation runtime and collect its outputs atomically.

A run writes into ``runs/<run-id>/``: ``app/`` (the ServerApp's ``out-dir``), then a copy of
``metrics.jsonl`` and, last and atomically, ``summary.json`` with the runner's ``"run"`` record
(the resume rule is in :mod:`experiments.sweep`).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import shutil
import time
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from corbin_fl.deploy import flower, processes
from corbin_fl.deploy.run import LocalRunOptions, run_simulation
from corbin_fl.experiments.sweep import (
    METRICS_FILE,
    RUN_RECORD_KEY,
    SUMMARY_FILE,
    Run,
    read_metrics,
)
from corbin_fl.fsio import atomic_write_json

APP_OUT_DIR = "app"
FAILED_FILE = "failed.json"
READY_TIMEOUT_S = 120.0
"""Seconds a simulation SuperLink has to start."""
PATH_KEYS: tuple[str, ...] = ("data-dir",)
"""Run-config keys holding a path; a relative one is resolved where the command runs."""


class RunFailedError(RuntimeError):
    """A run ended without complete outputs; the message says why (with a log tail)."""


def find_app_dir() -> Path:
    """This checkout's Flower app (``pyproject.toml`` with ``[tool.flwr.app]``);
    ``FileNotFoundError`` outside a source checkout (pass ``--app`` then)."""
    import corbin_fl

    root = Path(corbin_fl.__file__).resolve().parents[1]
    pyproject = root / "pyproject.toml"
    if pyproject.is_file() and "app" in tomllib.loads(pyproject.read_text()).get("tool", {}).get(
        "flwr", {}
    ):
        return root
    raise FileNotFoundError(
        f"no Flower app found at {root} (expected pyproject.toml with [tool.flwr.app]); "
        "run from a source checkout or pass --app <folder>"
    )


def check_app_accepts(app_dir: Path, keys: set[str]) -> None:
    """``ValueError`` unless the app's ``[tool.flwr.app.config]`` declares every key of
    ``keys`` (``flwr run --run-config`` overrides only declared keys)."""
    if missing := sorted(keys - set(flower.app_config(app_dir))):
        raise ValueError(
            f"{Path(app_dir) / 'pyproject.toml'}: [tool.flwr.app.config] does not declare "
            f"{', '.join(missing)}; flwr run --run-config can only override declared keys"
        )


@dataclass(frozen=True)
class Submission:
    """How one ``flwr run`` ended: ``ok`` (exit 0 and ``finished:completed``), ``reason``
    ("completed" or why not), Flower's run id and final status when known."""

    ok: bool
    reason: str
    flwr_run_id: int | None
    status: str | None


class Backend(Protocol):
    """Executes one run of the app (``run_config`` plus ``out-dir = out_dir``) and blocks until
    it ends, calling ``on_round(rounds_done)`` as it goes."""

    name: str

    def execute(
        self,
        run: Run,
        run_config: Mapping[str, Any],
        out_dir: Path,
        *,
        timeout_s: float,
        on_round: Callable[[int], None],
    ) -> Submission: ...


class SimulationBackend:
    """Flower's simulation runtime through :func:`deploy.run.run_simulation`: a private
    SuperLink per run, ``run.clients`` virtual SuperNodes, each with ``num_cpus_per_client``
    CPUs and ``num_gpus_per_client`` GPUs of Ray."""

    name = "simulation"

    def __init__(
        self, app_dir: Path, *, num_cpus_per_client: int = 1, num_gpus_per_client: float = 0.0
    ) -> None:
        self.app_dir = Path(app_dir).resolve()
        self.federation: dict[str, Any] = {"client-resources-num-cpus": num_cpus_per_client}
        if num_gpus_per_client > 0:
            self.federation["client-resources-num-gpus"] = float(num_gpus_per_client)

    def execute(
        self,
        run: Run,
        run_config: Mapping[str, Any],
        out_dir: Path,
        *,
        timeout_s: float,
        on_round: Callable[[int], None],
    ) -> Submission:
        """Run ``run`` on a fresh simulation SuperLink."""
        if run.clients is None:
            raise ValueError(f"run {run.run_id}: the simulation backend needs `clients`")
        options = LocalRunOptions(
            app_dir=self.app_dir,
            out_dir=Path(out_dir),
            num_clients=int(run.clients),
            run_config=dict(run_config),
            timeout=timeout_s,
            ready_timeout=READY_TIMEOUT_S,
            federation_config=self.federation,
        )
        result = run_simulation(options, lambda state: on_round(len(state.metrics)))
        return Submission(result.ok, result.reason, result.run_id, result.status)


def app_run_config(run_config: Mapping[str, Any], cwd: Path | None = None) -> dict[str, Any]:
    """The run config handed to the app, :data:`PATH_KEYS` resolved against ``cwd`` (the app's
    processes run elsewhere); the run's id keeps the value as the spec wrote it."""
    out = dict(run_config)
    for key in PATH_KEYS:
        if isinstance(value := out.get(key), str) and value:
            path = Path(value).expanduser()
            out[key] = str(
                path if path.is_absolute() else (Path(cwd or Path.cwd()) / value).resolve()
            )
    return out


def _log_tail(path: Path, lines: int = 15) -> str:
    """The last non-empty ``lines`` of a log, ANSI colours stripped (``""`` without a log)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(
        [ln for ln in processes.ANSI_RE.sub("", text).splitlines() if ln.strip()][-lines:]
    )


def execute_run(
    run: Run,
    backend: Backend,
    run_dir: Path,
    *,
    experiment: str,
    timeout_s: float,
    on_round: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Execute ``run`` from scratch in ``run_dir`` (the app gets the whole result config and
    ``out-dir = run_dir/app``) and return its ``summary.json``, written last with the runner's
    record; ``RunFailedError`` (and ``failed.json``) if it left no complete outputs."""
    run_dir = Path(run_dir).resolve()
    if run_dir.exists():
        shutil.rmtree(run_dir)
    out_dir = run_dir / APP_OUT_DIR
    out_dir.mkdir(parents=True)
    num_rounds = int(run.run_config["num-rounds"])
    started, t0 = _dt.datetime.now(_dt.UTC), time.monotonic()
    sub = backend.execute(
        run,
        app_run_config({**run.config, **run.run_config}),
        out_dir,
        timeout_s=timeout_s,
        on_round=on_round or (lambda _rounds: None),
    )
    seconds = time.monotonic() - t0

    def fail(reason: str) -> RunFailedError:
        log = out_dir / "logs" / "flwr-run.log"
        tail = _log_tail(log)
        atomic_write_json(
            run_dir / FAILED_FILE,
            {"run_id": run.run_id, "reason": reason, "flwr_run_id": sub.flwr_run_id}
            | {"status": sub.status, "seconds": seconds, "log_tail": tail},
        )
        more = f"\n--- last lines of {log} ---\n{tail}" if tail else ""
        return RunFailedError(f"run {run.run_id}: {reason}{more}")

    if not sub.ok:
        raise fail(sub.reason)
    try:
        rows = read_metrics(out_dir / METRICS_FILE)
        app_summary = json.loads((out_dir / SUMMARY_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise fail(f"no readable {APP_OUT_DIR}/ outputs: {exc}") from None
    if len(rows) != num_rounds:
        raise fail(f"{APP_OUT_DIR}/{METRICS_FILE} has {len(rows)} rows, expected {num_rounds}")
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
