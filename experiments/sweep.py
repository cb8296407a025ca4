"""A spec expanded into runs, run ids from what a run computes, and a run folder's state.

A federated spec expands to ``settings x lambda-grid x seeds`` runs; the settings are the
cartesian products of ``[grid]`` and then of each ``[[extra-grid]]`` over ``[base]``, a repeated
setting expanded once. A run is addressed by its result config
(:meth:`corbin_fl.config.RunConfig.result_config`) and its number of clients: its id is
``<mechanism>-eps<e>-d<d>-p<p>-n<clients>-lr<lambda>-s<seed>-<hash>`` (the first 10 hex digits
of SHA-256 over their canonical JSON) and it lives in the pool ``<results>/runs/<run-id>/``.
A run is done when ``summary.json`` carries the runner's complete ``"run"`` record with this id
and hash (written last, atomically) and ``metrics.jsonl`` has one finite row per round.
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

from corbin_fl.experiments.spec import (
    CLIENTS_KEY,
    ExperimentSpec,
    RunValue,
    SpecError,
    validate_run_config,
)

logger = logging.getLogger(__name__)

POOL_DIR = "runs"
SUMMARY_FILE = "summary.json"
METRICS_FILE = "metrics.jsonl"
RUN_RECORD_KEY = "run"
"""Key of the runner's record in a run's ``summary.json``."""
_ID_PARTS = (
    *(("mechanism", ""), ("epsilon", "eps"), ("d", "d"), ("dropout-prob", "p")),
    *((CLIENTS_KEY, "n"), ("global-lr", "lr"), ("seed", "s")),
)


@dataclass(frozen=True)
class Run:
    """One federated run: ``run_config`` the keys the spec sets (with ``seed`` and
    ``global-lr``), ``config`` its result config, ``clients`` the number of SuperNodes."""

    run_id: str
    run_config: Mapping[str, RunValue]
    clients: int | None
    config_hash: str
    config: Mapping[str, RunValue]

    @property
    def seed(self) -> int:
        return int(self.run_config["seed"])

    @property
    def global_lr(self) -> float:
        return float(self.run_config["global-lr"])


def canonical_json(obj: Any) -> str:
    """Canonical JSON (sorted keys, no spaces, floats by ``repr``) used for hashing."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


def config_hash(config: Mapping[str, RunValue], clients: int | None) -> str:
    """SHA-256 hex digest of a result config on ``clients`` clients."""
    payload = canonical_json({"config": dict(config), "clients": clients})
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def _fmt(value: RunValue) -> str:
    text = repr(value).removesuffix(".0") if isinstance(value, float) else str(value)
    return re.sub(r"[^A-Za-z0-9.]+", "_", text)


def make_run_id(config: Mapping[str, RunValue], clients: int | None) -> str:
    """The run id of a result config on ``clients`` clients (see the module docstring)."""
    merged: dict[str, RunValue] = dict(config)
    if clients is not None:
        merged[CLIENTS_KEY] = clients
    parts = [f"{prefix}{_fmt(merged[key])}" for key, prefix in _ID_PARTS if key in merged]
    return "-".join([*parts, config_hash(config, clients)[:10]])


def expand_runs(spec: ExperimentSpec) -> list[Run]:
    """The runs of a federated spec, every run's whole configuration validated by
    :class:`RunConfig` before anything runs (:class:`SpecError` otherwise). With ``clients``
    virtual SuperNodes, ``min-clients`` defaults to ``clients`` (every round waits for all)."""
    if spec.kind != "federated":
        raise ValueError(f"only federated specs expand into runs, got kind={spec.kind!r}")
    seen: set[str] = set()
    runs: list[Run] = []
    for grid in (spec.grid, *spec.extra_grids):
        keys = [k for k, _ in grid]
        for combo in itertools.product(*(values for _, values in grid)):
            cfg: dict[str, RunValue] = {**spec.base, **dict(zip(keys, combo, strict=True))}
            n = cfg.pop(CLIENTS_KEY, spec.clients)
            if (key := canonical_json({"c": cfg, "n": n})) in seen:
                continue
            seen.add(key)
            if n is None:
                raise SpecError(
                    f"{spec.source or spec.name}: base.clients: required (the number of virtual "
                    "SuperNodes), or sweep it in [grid]"
                )
            clients = int(n)
            cfg.setdefault("min-clients", clients)
            for lam, seed in itertools.product(spec.lambda_grid, spec.seeds):
                run_config = {**cfg, "global-lr": float(lam), "seed": int(seed)}
                where = f"{spec.name}: setting {canonical_json(run_config)}"
                config = validate_run_config(run_config, where).result_config()
                runs.append(
                    Run(
                        make_run_id(config, clients),
                        MappingProxyType(run_config),
                        clients,
                        config_hash(config, clients),
                        MappingProxyType(config),
                    )
                )
    return runs


class RunState(enum.Enum):
    """Resume state of a run folder."""

    MISSING = "missing"
    PARTIAL = "partial"
    DONE = "done"


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl``; a torn last line is ignored with a warning, any other
    malformed line is a ``ValueError``."""
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
    """Whether ``run`` is done, partial or missing in ``run_dir`` (the module docstring)."""
    if not Path(run_dir).exists():
        return RunState.MISSING
    try:
        record = json.loads((run_dir / SUMMARY_FILE).read_text(encoding="utf-8"))[RUN_RECORD_KEY]
        ok = (record["run_id"], record["config_hash"], record["complete"]) == (
            run.run_id,
            run.config_hash,
            True,
        )
        rows = read_metrics(run_dir / METRICS_FILE)
    except (OSError, ValueError, KeyError, TypeError):
        return RunState.PARTIAL
    finite = all(
        isinstance(v := row.get(key), int | float) and math.isfinite(v)
        for row in rows
        for key in ("test_accuracy", "val_accuracy")
    )
    done = ok and finite and len(rows) == int(run.config["num-rounds"])
    return RunState.DONE if done else RunState.PARTIAL
