"""Expansion of a spec into runs, stable run ids, and the resume state of a run folder.

A federated spec expands to ``settings x lambda-grid x seeds`` runs, where the settings are the
cartesian product of ``[grid]`` (in file order) followed by the products of each
``[[extra-grid]]``, every one merged over ``[base]``. Identical configurations are expanded once.

Run ids are ``<mechanism>-eps<e>-d<d>-p<p>-n<clients>-lr<lambda>-s<seed>-<hash>`` (parts whose key
the configuration does not set are left out), where ``<hash>`` is the first 10 hex digits of
SHA-256 over the canonical JSON of the full run configuration and the number of clients. The id
depends only on the run's configuration, never on the layout of the spec, so adding values to a
grid keeps the ids (and the finished results) of the runs that were already there.

A run is **done** when ``runs/<run-id>/summary.json`` exists, parses, carries the runner's
``"run"`` record with this run id, configuration hash and ``"complete": true``, and
``metrics.jsonl`` next to it has one row per round. The runner writes ``summary.json`` last and
atomically (write to a temporary file, ``fsync``, ``os.replace``), so an interrupted run is
never mistaken for a finished one; anything else in the folder is **partial** and is redone.
"""

from __future__ import annotations

import enum
import hashlib
import itertools
import json
import logging
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from corbin_fl.config import RunConfig
from experiments.spec import (
    CLIENTS_KEY,
    ExperimentSpec,
    RunValue,
    SpecError,
    validate_run_config,
)

logger = logging.getLogger(__name__)

SUMMARY_FILE = "summary.json"
METRICS_FILE = "metrics.jsonl"
RUN_RECORD_KEY = "run"
"""Key of the runner's record inside the copied ``summary.json``."""

_ID_PARTS: tuple[tuple[str, str], ...] = (
    ("mechanism", ""),
    ("epsilon", "eps"),
    ("d", "d"),
    ("dropout-prob", "p"),
    (CLIENTS_KEY, "n"),
    ("global-lr", "lr"),
    ("seed", "s"),
)


@dataclass(frozen=True)
class Run:
    """One federated run of an experiment.

    Attributes
    ----------
    run_id
        Stable id (see the module docstring); also the folder name under ``runs/``.
    run_config
        The complete run config passed to the app (kebab-case; includes ``seed`` and
        ``global-lr``, not ``out-dir``).
    clients
        Number of (virtual) SuperNodes, or ``None`` to use what the backend provides.
    config_hash
        Hex SHA-256 over the canonical JSON of ``run_config`` and ``clients``.
    """

    run_id: str
    run_config: Mapping[str, RunValue]
    clients: int | None
    config_hash: str

    @property
    def seed(self) -> int:
        """The run's seed (``run_config["seed"]``)."""
        return int(self.run_config["seed"])

    @property
    def global_lr(self) -> float:
        """The run's global learning rate lambda (``run_config["global-lr"]``)."""
        return float(self.run_config["global-lr"])

    @property
    def setting(self) -> dict[str, RunValue]:
        """Configuration without ``seed`` and ``global-lr``, plus ``clients``: the group key.

        Runs that share a setting differ only by repetition (seed) and lambda; lambda is chosen
        per setting on validation accuracy, then the seeds are averaged.
        """
        out = {k: v for k, v in self.run_config.items() if k not in ("seed", "global-lr")}
        if self.clients is not None:
            out[CLIENTS_KEY] = self.clients
        return out


def canonical_json(obj: Any) -> str:
    """Canonical JSON (sorted keys, no spaces, floats by ``repr``) used for hashing."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


def config_hash(run_config: Mapping[str, RunValue], clients: int | None) -> str:
    """SHA-256 hex digest identifying a run configuration (see :class:`Run`)."""
    payload = canonical_json({"run_config": dict(run_config), "clients": clients})
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def _fmt(value: RunValue) -> str:
    if isinstance(value, float):
        text = repr(value)
        if text.endswith(".0"):
            text = text[:-2]
    else:
        text = str(value)
    return re.sub(r"[^A-Za-z0-9.]+", "_", text)


def make_run_id(run_config: Mapping[str, RunValue], clients: int | None) -> str:
    """Return the stable run id of a configuration (see the module docstring)."""
    parts: list[str] = []
    merged: dict[str, RunValue] = dict(run_config)
    if clients is not None:
        merged[CLIENTS_KEY] = clients
    for key, prefix in _ID_PARTS:
        if key in merged:
            parts.append(f"{prefix}{_fmt(merged[key])}")
    parts.append(config_hash(run_config, clients)[:10])
    return "-".join(parts)


def _product(
    grid: Sequence[tuple[str, Sequence[RunValue]]],
) -> Iterable[dict[str, RunValue]]:
    keys = [k for k, _ in grid]
    for combo in itertools.product(*(values for _, values in grid)):
        yield dict(zip(keys, combo, strict=True))


def expand_settings(spec: ExperimentSpec) -> list[tuple[dict[str, RunValue], int | None]]:
    """Expand ``[base]``, ``[grid]`` and ``[[extra-grid]]`` into distinct settings.

    Returns
    -------
    list of (run_config_without_seed_and_lr, clients)
        In sweep order, duplicates removed (first occurrence kept).
    """
    if spec.kind != "federated":
        raise ValueError(f"only federated specs expand into runs, got kind={spec.kind!r}")
    seen: set[str] = set()
    out: list[tuple[dict[str, RunValue], int | None]] = []
    grids = (spec.grid, *spec.extra_grids)
    for grid in grids:
        for point in _product(grid):
            cfg = dict(spec.base)
            clients = point.pop(CLIENTS_KEY, spec.clients)
            cfg.update(point)
            key = canonical_json({"c": cfg, "n": clients})
            if key in seen:
                continue
            seen.add(key)
            out.append((cfg, int(clients) if clients is not None else None))
    return out


def expand_runs(spec: ExperimentSpec) -> list[Run]:
    """Expand a federated spec into its runs: ``settings x lambda-grid x seeds``.

    Every run's complete configuration is validated with
    :meth:`corbin_fl.config.RunConfig.from_flower` (all keys together), so an impossible
    combination fails here, before anything runs.

    Raises
    ------
    ValueError
        If ``spec`` is not a federated spec.
    SpecError
        If a run's configuration is invalid as a whole, or a simulation run has no number of
        clients.
    """
    runs: list[Run] = []
    for cfg, clients in expand_settings(spec):
        if clients is None and spec.backend == "simulation":
            raise SpecError(
                f"{spec.source or spec.name}: base.clients: required with backend = "
                '"simulation" (the number of virtual SuperNodes), or sweep it in [grid]'
            )
        if clients is not None and "min-clients" not in cfg:
            # All virtual SuperNodes exist from the start of a simulation: wait for all of them,
            # so every round of every run starts with the configured number of clients.
            cfg = {**cfg, "min-clients": clients}
        for lam in spec.lambda_grid:
            for seed in spec.seeds:
                run_config = {**cfg, "global-lr": float(lam), "seed": int(seed)}
                run_id = make_run_id(run_config, clients)
                validate_run_config(run_config, f"{spec.name}: run {run_id}")
                runs.append(
                    Run(
                        run_id=run_id,
                        run_config=MappingProxyType(run_config),
                        clients=clients,
                        config_hash=config_hash(run_config, clients),
                    )
                )
    ids = [r.run_id for r in runs]
    if len(set(ids)) != len(ids):  # pragma: no cover - a SHA-256 prefix collision
        raise RuntimeError("run id collision; lengthen the hash prefix")
    return runs


# --------------------------------------------------------------------------- resume state


class RunState(enum.Enum):
    """Resume state of a run folder."""

    MISSING = "missing"
    PARTIAL = "partial"
    STALE = "stale"
    DONE = "done"


#: Run-config keys that say how or where a run executes, not what it computes (declared once, on
#: the ``RunConfig`` fields): a finished run is not stale when only these differ from what the app
#: would run now (``data-dir`` is recorded resolved to an absolute path, see
#: :func:`experiments.runner.app_run_config`).
EXECUTION_KEYS = RunConfig.execution_keys()


#: Run-config keys whose app default changed after they were added, with the value they were added
#: with: a record made before such a key existed ran with that value (the behaviour the key was
#: added to keep), not with today's default. ``range-mode`` came with ``"layer"`` (the paper's
#: range, what every run did before) and ``update-radius`` with ``0.01``.
ADDED_WITH: Mapping[str, Any] = MappingProxyType({"range-mode": "layer", "update-radius": 0.01})


def with_added_defaults(recorded: Mapping[str, Any]) -> dict[str, Any]:
    """A run's recorded effective config (``summary.json`` ``"config"``) completed with
    :meth:`RunConfig.defaults`: a key the record lacks was added to the app after the run was
    made and has, by construction, the default that keeps the old behaviour (the value it was
    added with, :data:`ADDED_WITH`, where the default has changed since)."""
    return {**RunConfig.defaults(), **ADDED_WITH, **recorded}


def inert_keys(config: Mapping[str, Any]) -> set[str]:
    """Run-config keys that have no effect on a run with ``config``: ``update-radius`` unless
    :attr:`RunConfig.quantizes_update`.

    Raises
    ------
    ConfigError
        If ``config`` is not a valid run configuration.
    """
    return set() if RunConfig.from_flower(config).quantizes_update else {"update-radius"}


def stale_keys(recorded: Mapping[str, Any], expected: Mapping[str, Any]) -> list[str]:
    """Keys whose value in a finished run's recorded config differs from ``expected``.

    ``recorded`` is the run's effective config (``summary.json`` ``"config"``, completed by
    :func:`with_added_defaults`); ``expected`` the app's current defaults overridden by the run's
    keys. Not compared: keys of :data:`EXECUTION_KEYS`, keys without effect on the run
    (:func:`inert_keys`), keys the record does not know.
    """
    full = with_added_defaults(recorded)
    try:
        ignored = EXECUTION_KEYS | inert_keys({k: v for k, v in full.items() if k in expected})
    except ValueError:  # not this app's configuration: compare every key
        ignored = EXECUTION_KEYS
    return sorted(k for k, v in expected.items() if k not in ignored and k in full and full[k] != v)


def recorded_run(run_dir: Path) -> tuple[Run, dict[str, Any]] | None:
    """The :class:`Run` a run folder's ``summary.json`` records, with its recorded effective
    config (``"config"``); ``None`` when the summary is missing, malformed or has no config.

    Only the record is read: whether the folder is a complete run is :func:`run_state`'s call.
    """
    try:
        summary = json.loads((Path(run_dir) / SUMMARY_FILE).read_text(encoding="utf-8"))
        record = summary[RUN_RECORD_KEY]
        run = Run(
            run_id=str(record["run_id"]),
            run_config=dict(record["run_config"]),
            clients=record.get("clients"),
            config_hash=str(record["config_hash"]),
        )
        config = summary["config"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return (run, dict(config)) if isinstance(config, Mapping) else None


def same_run(recorded: Mapping[str, Any], run: Run, app_defaults: Mapping[str, Any]) -> bool:
    """Whether a run that recorded the effective config ``recorded`` is a run of ``run``.

    Two specs can name one configuration differently (one sets ``delta = 1e-5``, the other
    leaves the app's default ``1e-5``), so their run ids differ; what makes the runs the same is
    the effective config: ``app_defaults`` overridden by ``run.run_config`` equals ``recorded``
    on every key that affects a run (:func:`stale_keys` finds none that differs).
    """
    return not stale_keys(recorded, {**app_defaults, **run.run_config})


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Read a ``metrics.jsonl`` file (one JSON object per round).

    A torn last line (an interrupted writer) is ignored with a warning; any other malformed
    line raises.

    Raises
    ------
    ValueError
        If a line other than the last is not a JSON object.
    """
    rows: list[dict[str, Any]] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            if i == len(lines) - 1:
                logger.warning("%s: ignoring a torn last line", path)
                break
            raise ValueError(f"{path}:{i + 1}: not JSON: {exc}") from exc
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{i + 1}: expected a JSON object, got {type(row).__name__}")
        rows.append(row)
    return rows


def run_state(run_dir: Path, run: Run, app_defaults: Mapping[str, Any] | None = None) -> RunState:
    """Return whether ``run`` is done, partial, stale or missing in ``run_dir``.

    Done means: ``summary.json`` parses, its ``"run"`` record names this run id and config
    hash with ``"complete": true``, and ``metrics.jsonl`` has ``num-rounds`` rows with finite
    ``test_accuracy`` and ``val_accuracy``. The run id hashes only the keys the spec sets, so
    with ``app_defaults`` (the app's ``[tool.flwr.app.config]``) a done run whose recorded
    effective config differs from what the app would run now (a changed app default, see
    :func:`stale_keys`) is stale: it is redone, not reported.
    """
    run_dir = Path(run_dir)
    if not run_dir.exists():
        return RunState.MISSING
    summary_path = run_dir / SUMMARY_FILE
    metrics_path = run_dir / METRICS_FILE
    try:
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
        record = summary[RUN_RECORD_KEY]
        if (
            record.get("run_id") != run.run_id
            or record.get("config_hash") != run.config_hash
            or record.get("complete") is not True
        ):
            return RunState.PARTIAL
        rows = read_metrics(metrics_path)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return RunState.PARTIAL
    expected = int(run.run_config.get("num-rounds", 0))
    if len(rows) != expected:
        return RunState.PARTIAL
    for row in rows:
        for key in ("test_accuracy", "val_accuracy"):
            value = row.get(key)
            if not isinstance(value, int | float) or not math.isfinite(float(value)):
                return RunState.PARTIAL
    recorded = summary.get("config")
    if app_defaults is not None and isinstance(recorded, Mapping):
        changed = stale_keys(recorded, {**app_defaults, **run.run_config})
        if changed:
            logger.info("run %s was made with other values of %s", run.run_id, ", ".join(changed))
            return RunState.STALE
    return RunState.DONE
