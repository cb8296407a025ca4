"""Expansion of a spec into runs, run ids from the effective config, and a run folder's state.

A federated spec expands to ``settings x lambda-grid x seeds`` runs, where the settings are the
cartesian product of ``[grid]`` (in file order) followed by the products of each
``[[extra-grid]]``, every one merged over ``[base]``. Identical configurations are expanded once.

A run is addressed by what it computes: its **result config**
(:meth:`corbin_fl.config.RunConfig.result_config`: the app's defaults overridden by the spec's
keys, without the keys that cannot change a result, which the ``RunConfig`` fields declare) and
its number of clients. Its id is
``<mechanism>-eps<e>-d<d>-p<p>-n<clients>-lr<lambda>-s<seed>-<hash>``, where ``<hash>`` is the
first 10 hex digits of SHA-256 over the canonical JSON of the two. Runs live in one pool,
``<results>/runs/<run-id>/``, shared by every experiment of the results folder: a run that one
spec made is found by any other spec that has it, however the specs spell it, and a
changed app default changes the ids of the runs it affects, which are then simply not done yet.

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
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from experiments.spec import (
    CLIENTS_KEY,
    ExperimentSpec,
    RunValue,
    SpecError,
    validate_run_config,
)

logger = logging.getLogger(__name__)

POOL_DIR = "runs"
"""Folder of the run pool under a results root: ``<results>/runs/<run-id>/``."""
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
        The keys the spec sets, passed to the app (kebab-case; includes ``seed`` and
        ``global-lr``, not ``out-dir``); the app's defaults fill in the rest.
    clients
        Number of (virtual) SuperNodes, or ``None`` to use what the backend provides.
    config_hash
        Hex SHA-256 over the canonical JSON of ``config`` and ``clients``.
    config
        The result config (:meth:`RunConfig.result_config`): what the run computes.
    """

    run_id: str
    run_config: Mapping[str, RunValue]
    clients: int | None
    config_hash: str
    config: Mapping[str, RunValue]

    @property
    def seed(self) -> int:
        """The run's seed (``run_config["seed"]``)."""
        return int(self.run_config["seed"])

    @property
    def global_lr(self) -> float:
        """The run's global learning rate lambda (``run_config["global-lr"]``)."""
        return float(self.run_config["global-lr"])


def canonical_json(obj: Any) -> str:
    """Canonical JSON (sorted keys, no spaces, floats by ``repr``) used for hashing."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


def config_hash(config: Mapping[str, RunValue], clients: int | None) -> str:
    """SHA-256 hex digest identifying a run by its result config and clients (:class:`Run`)."""
    payload = canonical_json({"config": dict(config), "clients": clients})
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def _fmt(value: RunValue) -> str:
    if isinstance(value, float):
        text = repr(value)
        if text.endswith(".0"):
            text = text[:-2]
    else:
        text = str(value)
    return re.sub(r"[^A-Za-z0-9.]+", "_", text)


def make_run_id(config: Mapping[str, RunValue], clients: int | None) -> str:
    """Return the run id of a result config on ``clients`` clients (see the module docstring)."""
    parts: list[str] = []
    merged: dict[str, RunValue] = dict(config)
    if clients is not None:
        merged[CLIENTS_KEY] = clients
    for key, prefix in _ID_PARTS:
        if key in merged:
            parts.append(f"{prefix}{_fmt(merged[key])}")
    parts.append(config_hash(config, clients)[:10])
    return "-".join(parts)


def _setting_runs(spec: ExperimentSpec, cfg: dict[str, RunValue], clients: int | None) -> list[Run]:
    """The runs of one setting (``cfg`` without seed and lambda, on ``clients`` clients)."""
    if clients is None and spec.backend == "simulation":
        raise SpecError(
            f"{spec.source or spec.name}: base.clients: required with backend = "
            '"simulation" (the number of virtual SuperNodes), or sweep it in [grid]'
        )
    if clients is not None and "min-clients" not in cfg:
        # All virtual SuperNodes exist from the start of a simulation: wait for all of them,
        # so every round of every run starts with the configured number of clients.
        cfg = {**cfg, "min-clients": clients}
    runs = []
    for lam in spec.lambda_grid:
        for seed in spec.seeds:
            run_config = {**cfg, "global-lr": float(lam), "seed": int(seed)}
            where = f"{spec.name}: setting {canonical_json(run_config)}"
            config = validate_run_config(run_config, where).result_config()
            runs.append(
                Run(
                    run_id=make_run_id(config, clients),
                    run_config=MappingProxyType(run_config),
                    clients=clients,
                    config_hash=config_hash(config, clients),
                    config=MappingProxyType(config),
                )
            )
    return runs


def expand_runs(spec: ExperimentSpec) -> list[Run]:
    """Expand a federated spec into its runs: ``settings x lambda-grid x seeds``.

    The settings are ``[base]`` updated by each point of ``[grid]`` and then of every
    ``[[extra-grid]]`` (cartesian products, in file order), a repeated setting expanded once.
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
    if spec.kind != "federated":
        raise ValueError(f"only federated specs expand into runs, got kind={spec.kind!r}")
    seen: set[str] = set()
    runs: list[Run] = []
    for grid in (spec.grid, *spec.extra_grids):
        keys = [k for k, _ in grid]
        for combo in itertools.product(*(values for _, values in grid)):
            cfg: dict[str, RunValue] = {**spec.base, **dict(zip(keys, combo, strict=True))}
            clients = cfg.pop(CLIENTS_KEY, spec.clients)
            if (key := canonical_json({"c": cfg, "n": clients})) in seen:
                continue
            seen.add(key)
            runs += _setting_runs(spec, cfg, None if clients is None else int(clients))
    ids = [r.run_id for r in runs]
    if len(set(ids)) != len(ids):  # pragma: no cover - a SHA-256 prefix collision
        raise RuntimeError("run id collision; lengthen the hash prefix")
    return runs


# --------------------------------------------------------------------------- resume state


class RunState(enum.Enum):
    """Resume state of a run folder."""

    MISSING = "missing"
    PARTIAL = "partial"
    DONE = "done"


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


def run_state(run_dir: Path, run: Run) -> RunState:
    """Return whether ``run`` is done, partial or missing in ``run_dir``.

    Done means: ``summary.json`` parses, its ``"run"`` record names this run id and config
    hash with ``"complete": true``, and ``metrics.jsonl`` has ``num-rounds`` rows with finite
    ``test_accuracy`` and ``val_accuracy``.
    """
    run_dir = Path(run_dir)
    if not run_dir.exists():
        return RunState.MISSING
    try:
        record = json.loads((run_dir / SUMMARY_FILE).read_text(encoding="utf-8"))[RUN_RECORD_KEY]
        if (
            record.get("run_id") != run.run_id
            or record.get("config_hash") != run.config_hash
            or record.get("complete") is not True
        ):
            return RunState.PARTIAL
        rows = read_metrics(run_dir / METRICS_FILE)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return RunState.PARTIAL
    if len(rows) != int(run.config["num-rounds"]):
        return RunState.PARTIAL
    for row in rows:
        for key in ("test_accuracy", "val_accuracy"):
            value = row.get(key)
            if not isinstance(value, int | float) or not math.isfinite(float(value)):
                return RunState.PARTIAL
    return RunState.DONE
