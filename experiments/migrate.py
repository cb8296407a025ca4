"""Move an experiment's finished runs to the run ids of its edited spec, without running anything.

A run id hashes the run-config keys the spec writes (:func:`~.sweep.make_run_id`), not the app's
defaults. When an app default changes, the runs made under the old default become *stale*; a spec
that then states the old value (``range-mode = "layer"`` after the app's default became
``"update"``) describes those runs again, but under other ids. This module renames each run folder
of ``<results>/<name>/runs/`` to the id of the spec's run with the same **effective**
configuration and rewrites the runner's record in its ``summary.json``.

Matching. A folder is the run ``r`` of the spec when its recorded effective config
(``summary.json`` ``"config"``, completed by :func:`~.sweep.with_added_defaults`) equals
``app_defaults | r.run_config`` on every key that affects a run (:func:`~.sweep.same_run`), with
the same number of clients and the same spec ``data-dir`` (the rule by which
:class:`~.experiment.RecordedRuns` reuses a run of another id). Exactly one run of the spec must
match, and no two folders may be the same run.

What changes. The folder's name becomes ``r.run_id``; in ``summary.json`` the ``"run"`` record gets
``r``'s ``run_id``, ``config_hash``, ``run_config`` and ``clients``, the previous id appended to
``"renamed_from"``, and a ``"reused_from"`` that names a folder since renamed by a migration of its
own experiment is pointed at the new name. Every other key of ``summary.json`` and every other file
is left as it is (``summary.json`` is rewritten in the runner's format, indented and key-sorted, so
the bytes outside the record do not change for a file the runner wrote); the recorded
``"config"`` keeps the ``out-dir`` the run was made in.

Refused, with nothing changed and every problem named (:class:`MigrationError`): a folder without
a complete run record (an unfinished or failed run), a folder that is no run of the spec (the
nearest run and the keys that differ are named), one that is several runs of the spec (the spec
names one effective configuration twice), and two folders that are the same run.

Running it again changes nothing (idempotent). Several experiments that copied runs from each other
(``"reused_from"``) are migrated one folder at a time; :func:`migrate_experiments` then makes a
second pass that points each copy at its source's new name.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corbin_fl.fsio import atomic_write_json
from experiments.spec import ExperimentSpec
from experiments.sweep import (
    METRICS_FILE,
    RUN_RECORD_KEY,
    SUMMARY_FILE,
    Run,
    RunState,
    expand_runs,
    recorded_run,
    run_state,
    same_run,
    stale_keys,
    with_added_defaults,
)

logger = logging.getLogger(__name__)

RENAMED_FROM_KEY = "renamed_from"
"""Key of the run record listing the ids a run folder had before migrations, oldest first."""
REUSED_FROM_KEY = "reused_from"
"""Key of the run record naming the folder a copied run came from (``<experiment>/runs/<id>``)."""


_FIRST_CHECKED = ("mechanism", "seed", "global-lr", "epsilon")
"""Keys that always affect a run, compared before the whole effective config (a cheap filter;
the same one :class:`~.experiment.RecordedRuns` uses)."""


class MigrationError(ValueError):
    """The results folder does not fit the spec; nothing was changed.

    Attributes
    ----------
    experiment
        The spec's name.
    problems
        One line per problem, each naming the run folder and the cause.
    """

    def __init__(self, experiment: str, problems: Sequence[str]) -> None:
        self.experiment = experiment
        self.problems = tuple(problems)
        lines = "\n".join(f"  {p}" for p in self.problems)
        super().__init__(f"{experiment}: not migrated, nothing changed:\n{lines}")


@dataclass(frozen=True)
class RunMigration:
    """One run folder and the run of the spec it is.

    Attributes
    ----------
    folder
        The folder as it is now (``<results>/<name>/runs/<old-id>``).
    run
        The run of the spec with the folder's effective configuration.
    summary
        The folder's ``summary.json`` with the new run record.
    changed
        Whether the record differs from the one on disk.
    """

    folder: Path
    run: Run
    summary: Mapping[str, Any]
    changed: bool

    @property
    def target(self) -> Path:
        """The folder's name after the migration: ``runs/<run.run_id>``."""
        return self.folder.parent / self.run.run_id

    @property
    def renames(self) -> bool:
        """Whether the folder moves."""
        return self.folder.name != self.run.run_id


@dataclass(frozen=True)
class MigrationPlan:
    """What migrating one experiment folder does (:func:`plan_migration`).

    Attributes
    ----------
    experiment
        The spec's name.
    moves
        One entry per run folder, in folder-name order.
    to_do
        Runs of the spec that no folder holds (``experiment run`` makes them).
    warnings
        ``reused_from`` references whose source could not be found.
    """

    experiment: str
    moves: tuple[RunMigration, ...]
    to_do: tuple[Run, ...]
    warnings: tuple[str, ...] = field(default=())

    @property
    def renamed(self) -> int:
        """Folders that get a new name."""
        return sum(m.renames for m in self.moves)

    @property
    def rewritten(self) -> int:
        """Folders that keep their name but get a new run record."""
        return sum(m.changed and not m.renames for m in self.moves)

    @property
    def unchanged(self) -> int:
        """Folders already migrated."""
        return sum(not m.changed and not m.renames for m in self.moves)


def _describe_difference(
    recorded: Mapping[str, Any], run: Run, app_defaults: Mapping[str, Any]
) -> str:
    """The keys on which a recorded effective config differs from ``run``'s, with both values
    and where the run's value comes from (the spec or the app's default)."""
    expected = {**app_defaults, **run.run_config}
    full = with_added_defaults(recorded)
    return ", ".join(
        f"{k} (recorded {full.get(k)!r}, "
        f"{'spec' if k in run.run_config else 'app default'} {expected.get(k)!r})"
        for k in stale_keys(recorded, expected)
    )


def _nearest(
    config: Mapping[str, Any],
    recorded: Run,
    runs: Sequence[Run],
    app_defaults: Mapping[str, Any],
) -> str:
    """Why a recorded config is no run of ``runs``: the nearest run and the keys that differ
    (nearest: fewest differing keys, then the run of the recorded id)."""
    same_clients = [r for r in runs if r.clients == recorded.clients]
    if not same_clients:
        have = sorted({str(r.clients) for r in runs})
        return f"no run of the spec has {recorded.clients} clients (it has {', '.join(have)})"
    best = min(
        same_clients,
        key=lambda r: (
            len(stale_keys(config, {**app_defaults, **r.run_config})),
            r.run_id != recorded.run_id,
        ),
    )
    diff = _describe_difference(config, best, app_defaults)
    if not diff:
        return f"nearest run {best.run_id} has another data-dir"
    by_default = [
        k
        for k in stale_keys(config, {**app_defaults, **best.run_config})
        if k not in best.run_config
    ]
    hint = (
        f"; the spec leaves {', '.join(by_default)} to the app's default: state the recorded "
        "value in the spec"
        if by_default
        else ""
    )
    return f"nearest run {best.run_id} differs in {diff}{hint}"


class _RenameIndex:
    """Where the run folders of other experiments went: ``(experiment, old id) -> new id``,
    read from their ``"renamed_from"`` records on first use."""

    def __init__(self, results_root: Path) -> None:
        self.root = Path(results_root)
        self._by_experiment: dict[str, dict[str, str]] = {}

    def _index(self, experiment: str) -> dict[str, str]:
        if experiment not in self._by_experiment:
            index: dict[str, str] = {}
            for folder in sorted((self.root / experiment / "runs").glob("*")):
                try:
                    record = json.loads((folder / SUMMARY_FILE).read_text(encoding="utf-8"))[
                        RUN_RECORD_KEY
                    ]
                    old_ids = list(record.get(RENAMED_FROM_KEY, ()))
                except (OSError, ValueError, KeyError, TypeError, AttributeError):
                    continue
                for old in old_ids:
                    index[str(old)] = folder.name
            self._by_experiment[experiment] = index
        return self._by_experiment[experiment]

    def resolve(self, reference: str) -> str | None:
        """The current ``<experiment>/runs/<id>`` of a ``reused_from`` reference, or ``None``."""
        if (self.root / reference).is_dir():
            return reference
        parts = reference.split("/")
        if len(parts) != 3 or parts[1] != "runs":
            return None
        new = self._index(parts[0]).get(parts[2])
        return f"{parts[0]}/runs/{new}" if new is not None else None


def plan_migration(
    spec: ExperimentSpec,
    results_root: Path,
    app_defaults: Mapping[str, Any],
) -> MigrationPlan:
    """Match every run folder of ``spec``'s experiment to a run of ``spec`` (see the module
    docstring); change nothing.

    Parameters
    ----------
    spec
        The federated spec, as edited.
    results_root
        Parent of the experiment folder.
    app_defaults
        The app's ``[tool.flwr.app.config]`` (the effective config of a run is these overridden
        by its run config).

    Returns
    -------
    MigrationPlan

    Raises
    ------
    ValueError
        If ``spec`` is not a federated spec.
    SpecError
        If a run of ``spec`` has an invalid configuration (:func:`~.sweep.expand_runs`).
    MigrationError
        If a folder is not exactly one run of ``spec`` or two folders are the same run.
    """
    if spec.kind != "federated":
        raise ValueError(f"{spec.name}: only federated experiments have runs to migrate")
    results_root = Path(results_root)
    runs_dir = results_root / spec.name / "runs"
    runs = expand_runs(spec)
    index = _RenameIndex(results_root)
    problems: list[str] = []
    warnings: list[str] = []
    moves: list[RunMigration] = []
    claimed: dict[str, Path] = {}
    folders = sorted(runs_dir.iterdir()) if runs_dir.is_dir() else []
    for folder in folders:
        if not folder.is_dir() or folder.name.startswith("."):
            logger.debug("%s: not a run folder; left alone", folder)
            continue
        where = folder.relative_to(results_root).as_posix()
        found = recorded_run(folder)
        if found is None:
            problems.append(
                f"{where}: no run record ({SUMMARY_FILE} with its config): an unfinished or "
                "failed run; delete the folder (`corbin-fl experiment run` redoes it)"
            )
            continue
        recorded, config = found
        if run_state(folder, recorded) is not RunState.DONE:
            problems.append(
                f"{where}: not a complete run (its record is not complete, or {METRICS_FILE} "
                "has not one row per round); delete the folder (`corbin-fl experiment run` "
                "redoes it)"
            )
            continue
        full = with_added_defaults(config)
        first = {k: full.get(k) for k in _FIRST_CHECKED}
        matches = [
            r
            for r in runs
            if all(first[k] == r.run_config.get(k, app_defaults.get(k)) for k in _FIRST_CHECKED)
            and r.clients == recorded.clients
            and r.run_config.get("data-dir") == recorded.run_config.get("data-dir")
            and same_run(config, r, app_defaults)
        ]
        if not matches:
            why = _nearest(config, recorded, runs, app_defaults)
            problems.append(f"{where}: no run of the spec has its configuration; {why}")
            continue
        if len(matches) > 1:
            problems.append(
                f"{where}: ambiguous, the runs {', '.join(r.run_id for r in matches)} of the spec "
                "all have its configuration (they differ only in keys without effect on it); "
                "name that configuration once in the spec"
            )
            continue
        run = matches[0]
        if run.run_id in claimed:
            problems.append(
                f"{where} and {claimed[run.run_id].relative_to(results_root).as_posix()} are "
                f"both the run {run.run_id}: keep one, delete the other"
            )
            continue
        claimed[run.run_id] = folder
        summary = json.loads((folder / SUMMARY_FILE).read_text(encoding="utf-8"))
        old = dict(summary[RUN_RECORD_KEY])
        new = {
            **old,
            "run_id": run.run_id,
            "config_hash": run.config_hash,
            "run_config": dict(run.run_config),
            "clients": run.clients,
        }
        if old.get("run_id") != run.run_id:
            new[RENAMED_FROM_KEY] = [*old.get(RENAMED_FROM_KEY, ()), old.get("run_id")]
        source = old.get(REUSED_FROM_KEY)
        if isinstance(source, str):
            current = index.resolve(source)
            if current is None:
                warnings.append(
                    f"{where}: its source {source} is not in {results_root} (migrate that "
                    "experiment, then this one again, to point the copy at its new name)"
                )
            else:
                new[REUSED_FROM_KEY] = current
        moves.append(
            RunMigration(
                folder=folder,
                run=run,
                summary={**summary, RUN_RECORD_KEY: new},
                changed=new != old,
            )
        )
    if problems:
        raise MigrationError(spec.name, problems)
    to_do = tuple(r for r in runs if r.run_id not in claimed)
    return MigrationPlan(spec.name, tuple(moves), to_do, tuple(warnings))


def apply_migration(plan: MigrationPlan) -> None:
    """Carry out ``plan``: write each changed record (atomically), then rename the folder.

    A folder whose new name is still held by another folder of the plan waits until that one
    has moved; a cycle of names is broken through a temporary name. Interrupted, the next
    :func:`plan_migration` picks up where this stopped (a folder already renamed or already
    rewritten matches the same run).
    """
    for move in plan.moves:
        if move.changed:
            atomic_write_json(move.folder / SUMMARY_FILE, dict(move.summary))
    pending = {m.folder: m.target for m in plan.moves if m.renames}
    while pending:
        progress = False
        for folder, target in list(pending.items()):
            if not target.exists():
                folder.rename(target)
                del pending[folder]
                progress = True
        if not progress:  # every target is held by a folder still to move: a cycle
            folder, target = next(iter(pending.items()))
            parked = folder.with_name(f"{target.name}.migrating")
            folder.rename(parked)
            del pending[folder]
            pending[parked] = target
    logger.debug(
        "%s: %d folders renamed, %d records rewritten",
        plan.experiment,
        plan.renamed,
        plan.rewritten,
    )


@dataclass(frozen=True)
class MigrationResult:
    """What :func:`migrate_experiments` did (or, with ``dry_run``, would do) to one experiment.

    Attributes
    ----------
    plan
        The first pass's plan.
    references_updated
        Copies whose ``reused_from`` the second pass pointed at a source renamed after them.
    warnings
        ``reused_from`` sources still not found after both passes.
    """

    plan: MigrationPlan
    references_updated: int = 0
    warnings: tuple[str, ...] = ()


def migrate_experiments(
    specs: Sequence[ExperimentSpec],
    results_root: Path,
    app_defaults: Mapping[str, Any],
    *,
    dry_run: bool = False,
) -> tuple[list[MigrationResult], list[MigrationError]]:
    """Migrate the experiment folder of each federated spec on its own, then point the copies
    at their sources' new names.

    The first pass plans and applies each experiment in turn (a refused experiment does not
    stop the others). Unless ``dry_run``, a second pass plans them again: a copy whose source
    was renamed by a later experiment of the first pass gets its ``reused_from`` updated;
    nothing else changes (the first pass left every folder migrated).

    Returns
    -------
    (results, errors)
        One result per migrated experiment, and one error per refused experiment.
    """
    results: dict[str, MigrationResult] = {}
    errors: list[MigrationError] = []
    federated = [s for s in specs if s.kind == "federated"]
    for spec in federated:
        try:
            plan = plan_migration(spec, results_root, app_defaults)
        except MigrationError as exc:
            errors.append(exc)
            continue
        if not dry_run:
            apply_migration(plan)
        results[spec.name] = MigrationResult(plan, 0, plan.warnings)
    if dry_run:
        return list(results.values()), errors
    for spec in federated:
        if spec.name not in results:
            continue
        again = plan_migration(spec, results_root, app_defaults)
        apply_migration(again)
        results[spec.name] = MigrationResult(
            results[spec.name].plan, again.rewritten, again.warnings
        )
    return list(results.values()), errors
