"""Move the runs of the per-experiment layout into the run pool (nothing is run).

Before the pool (:mod:`experiments.sweep`), each experiment kept its runs in
``<results>/<experiment>/runs/<old-id>/``, the old id hashing only the keys the spec set, and a
run that two experiments shared was copied into both. :func:`plan_migration` reads what every
complete folder records (``summary.json``: the app's effective ``"config"`` and the runner's
``"run"`` record) and gives it its pool id; :func:`apply_migration` moves it to
``<results>/runs/<run-id>/`` and rewrites the ``"run"`` record (``run_id``, ``config_hash``,
``config``; the old places in ``"migrated_from"``).

A record made before a key existed ran with the value the key was added with: today's default,
except where the default changed since (:data:`ADDED_WITH`). Copies of one run (the same pool id)
become one folder when their ``metrics.jsonl`` are byte-identical; two different executions with
one id are a conflict: the one with the most folders (then an original before a copy) goes to the
pool and the other is left where it is. Partial folders are left where they are. A migration cut
off anywhere completes when run again; a complete one, run again, changes nothing.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from corbin_fl.config import ConfigError, RunConfig
from corbin_fl.fsio import atomic_write_json
from experiments.sweep import (
    METRICS_FILE,
    POOL_DIR,
    RUN_RECORD_KEY,
    SUMMARY_FILE,
    config_hash,
    make_run_id,
)

logger = logging.getLogger(__name__)

MIGRATED_FROM_KEY = "migrated_from"
"""Key of the run record listing the folders (relative to the results root) a run came from."""

ADDED_WITH: Mapping[str, Any] = MappingProxyType({"range-mode": "layer", "update-radius": 0.01})
"""Keys whose app default changed after they were added, with the value they were added with:
``range-mode`` came with ``"layer"`` (the paper's range, what every run did before) and
``update-radius`` with ``0.01``."""


@dataclass(frozen=True)
class Move:
    """One old run folder and where it goes.

    ``action`` is ``"move"`` (to ``target``), ``"duplicate"`` (a byte-identical copy of the run
    moved to ``target``: removed) or ``"conflict"`` (another run with the same id: left alone).
    """

    source: Path
    target: Path
    action: str
    record: Mapping[str, Any]


@dataclass
class MigrationPlan:
    """What :func:`apply_migration` does under ``root``."""

    root: Path
    moves: list[Move] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def count(self, action: str) -> int:
        """Number of moves with ``action``."""
        return sum(1 for m in self.moves if m.action == action)


def pool_record(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The ``"run"`` record of an old-layout ``summary.json`` rewritten for the pool.

    Raises
    ------
    ValueError
        If the summary has no complete run record or its config is not a valid run config.
    """
    record = summary.get(RUN_RECORD_KEY)
    recorded = summary.get("config")
    if not isinstance(record, Mapping) or record.get("complete") is not True:
        raise ValueError("no complete run record")
    if not isinstance(recorded, Mapping):
        raise ValueError("no recorded config")
    try:
        config = RunConfig.from_flower(
            {**RunConfig.defaults(), **ADDED_WITH, **recorded}
        ).result_config()
    except ConfigError as exc:
        raise ValueError(f"the recorded config is not valid today: {exc}") from exc
    clients = record.get("clients")
    out = {k: v for k, v in record.items() if k not in ("reused_from", "renamed_from")}
    out.update(
        run_id=make_run_id(config, clients),
        config_hash=config_hash(config, clients),
        config=config,
    )
    return out


def plan_migration(root: Path) -> MigrationPlan:
    """Plan the move of every complete ``<root>/<experiment>/runs/*/`` folder into the pool.

    Folders with one pool id are grouped by their ``metrics.jsonl`` bytes (copies of one
    execution). The execution with the most folders goes to the pool (ties: the one holding an
    original, not a copy, then path order), its other folders are duplicates, and every other
    execution of that id is a conflict: an earlier execution of the same configuration that
    another experiment made for itself (runs are not bit-reproducible: the common randomness
    comes from a CSPRNG).
    """
    root = Path(root)
    plan = MigrationPlan(root)
    by_id: dict[str, dict[bytes, list[tuple[bool, Path, dict[str, Any]]]]] = {}
    for source in sorted(root.glob("*/runs/*/")):
        try:
            summary = json.loads((source / SUMMARY_FILE).read_text(encoding="utf-8"))
            record = pool_record(summary)
            metrics = (source / METRICS_FILE).read_bytes()
        except (OSError, ValueError) as exc:
            plan.skipped.append(f"{source.relative_to(root)}: {exc}")
            continue
        copy = "reused_from" in summary[RUN_RECORD_KEY]
        execution = by_id.setdefault(record["run_id"], {}).setdefault(metrics, [])
        execution.append((copy, source, record))
    for run_id, executions in by_id.items():
        target = root / POOL_DIR / run_id
        ranked = sorted(
            (sorted(folders, key=lambda f: (f[0], str(f[1]))) for folders in executions.values()),
            key=lambda folders: (-len(folders), folders[0][0], str(folders[0][1])),
        )
        if target.exists():  # an earlier migration, perhaps cut off, put one there
            pooled = (target / METRICS_FILE).read_bytes()
            ranked = [executions.get(pooled, [])]
            ranked += [folders for metrics, folders in executions.items() if metrics != pooled]
        for rank, folders in enumerate(ranked):
            for i, (_copy, source, record) in enumerate(folders):
                if rank:
                    action = "conflict"
                elif i == 0 and not target.exists():
                    action = "move"
                else:
                    action = "duplicate"
                plan.moves.append(Move(source, target, action, record))
    return plan


def apply_migration(plan: MigrationPlan) -> None:
    """Carry out ``plan``: move, remove duplicates, rewrite the records, drop empty ``runs/``."""
    root = plan.root
    sources: dict[Path, list[str]] = {}
    for move in plan.moves:
        if move.action != "conflict":
            sources.setdefault(move.target, []).append(move.source.relative_to(root).as_posix())
    for move in plan.moves:
        if move.action == "conflict":
            logger.warning(
                "%s: another run has its id %s; left where it is", move.source, move.target.name
            )
            continue
        if move.action == "duplicate":
            shutil.rmtree(move.source)
            continue
        # the record first, then one rename: a migration cut off anywhere can be run again
        summary = json.loads((move.source / SUMMARY_FILE).read_text(encoding="utf-8"))
        summary[RUN_RECORD_KEY] = {**move.record, MIGRATED_FROM_KEY: sources[move.target]}
        atomic_write_json(move.source / SUMMARY_FILE, summary)
        move.target.parent.mkdir(parents=True, exist_ok=True)
        move.source.rename(move.target)
    for runs in root.glob("*/runs/"):
        if runs.parent.name != POOL_DIR and not any(runs.iterdir()):
            runs.rmdir()
