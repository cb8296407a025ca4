"""Run a whole experiment: plan, execute with resume and progress, then write every output.

Layout of ``<results>/<experiment>/``::

    runs/<run-id>/        one folder per federated run (see experiments.runner)
    runs.csv              one row per run (all lambdas)
    groups.csv            one row per setting at its validation-chosen lambda
    figures/*.png         the figures listed in [plots]
    report.md             tables, figures, privacy, target checks
    mse_grid.npz, mse_grid.csv, mse_real.npz, mse_real_weights.csv   (kind = "mse")

Resume: a run whose folder holds a complete ``summary.json`` (see
:func:`experiments.sweep.run_state`) is skipped; anything else is redone from scratch.
A run that is done in another experiment of the same results folder (the same run id, or another
id with the same effective configuration) is copied from there instead of being run again
(:func:`reuse_finished_run`; its summary's ``"run"`` record gets ``"reused_from"``).
Interrupting (Ctrl-C, SIGTERM) stops the current run's processes; the next invocation of the
same command continues where it stopped.
"""

from __future__ import annotations

import functools
import json
import logging
import shutil
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corbin_fl.fsio import atomic_write_json
from experiments import plots
from experiments.report import Target, write_federated_report, write_mse_report
from experiments.results import (
    RunResult,
    group_results,
    load_run,
    varying_keys,
    write_groups_csv,
    write_runs_csv,
)
from experiments.runner import (
    Backend,
    DeploymentBackend,
    RunFailedError,
    SimulationBackend,
    check_app_accepts,
    execute_run,
    find_app_dir,
)
from experiments.spec import ExperimentSpec, load_app_defaults
from experiments.sweep import (
    RUN_RECORD_KEY,
    SUMMARY_FILE,
    Run,
    RunState,
    expand_runs,
    recorded_run,
    run_state,
    same_run,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExperimentPaths:
    """Where an experiment's outputs go (``<results>/<name>/``)."""

    root: Path

    @property
    def runs_dir(self) -> Path:
        """``runs/``: one folder per run."""
        return self.root / "runs"

    @property
    def figures_dir(self) -> Path:
        """``figures/``: the PNGs."""
        return self.root / "figures"

    @property
    def runs_csv(self) -> Path:
        """``runs.csv``."""
        return self.root / "runs.csv"

    @property
    def groups_csv(self) -> Path:
        """``groups.csv``."""
        return self.root / "groups.csv"

    @property
    def report_md(self) -> Path:
        """``report.md``."""
        return self.root / "report.md"

    def run_dir(self, run: Run) -> Path:
        """Folder of one run."""
        return self.runs_dir / run.run_id

    @classmethod
    def of(cls, spec: ExperimentSpec, results_root: Path) -> ExperimentPaths:
        """Paths of ``spec`` under ``results_root``."""
        return cls(Path(results_root) / spec.name)


@dataclass
class Outcome:
    """What one invocation did."""

    total: int = 0
    skipped: int = 0
    executed: int = 0
    reused: int = 0
    failed: dict[str, str] = field(default_factory=dict)
    targets: list[Target] = field(default_factory=list)
    report: Path | None = None
    interrupted: bool = False


class ExperimentProgress:
    """Runs done / current round / ETA, drawn with :mod:`rich` (or nothing when disabled)."""

    def __init__(self, enabled: bool, total_runs: int, console: object | None = None) -> None:
        self.enabled = enabled
        self._progress = None
        self._runs = None
        self._round = None
        if enabled:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as RichProgress

            self._progress = RichProgress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=console,  # type: ignore[arg-type]
                transient=False,
            )
            self._runs = self._progress.add_task("runs to do", total=total_runs)
            self._round = self._progress.add_task("round", total=1, visible=False)

    @contextmanager
    def live(self) -> Iterator[ExperimentProgress]:
        """Show the display while the block runs."""
        if self._progress is None:
            yield self
            return
        with self._progress:
            yield self

    def start_run(self, label: str, rounds: int) -> None:
        """A run begins: show its round counter."""
        if self._progress is not None:
            self._progress.update(
                self._round, description=label, total=rounds, completed=0, visible=True
            )

    def rounds(self, done: int) -> None:
        """Rounds finished in the current run."""
        if self._progress is not None:
            self._progress.update(self._round, completed=done)

    def run_finished(self) -> None:
        """One more run executed (finished or failed)."""
        if self._progress is not None:
            self._progress.advance(self._runs)

    def step(self, description: str, done: int, total: int) -> None:
        """Generic step counter (MSE experiment)."""
        if self._progress is not None:
            self._progress.update(self._runs, description=description, completed=done, total=total)


def _command(spec: ExperimentSpec, results_root: Path) -> str:
    src = spec.source if spec.source is not None else "<spec.toml>"
    extra = f" --results {results_root}" if Path(results_root) != Path("results") else ""
    return f"corbin-fl experiment run {src}{extra}"


# --------------------------------------------------------------------------- federated


def plan(
    spec: ExperimentSpec,
    results_root: Path,
    app_defaults: Mapping[str, Any] | None = None,
) -> list[tuple[Run, RunState]]:
    """Every run of ``spec`` with its resume state (done runs are skipped by :func:`run`).

    With ``app_defaults`` (the app's ``[tool.flwr.app.config]``), a done run made under other
    app defaults is :attr:`RunState.STALE` (see :func:`experiments.sweep.run_state`).
    """
    paths = ExperimentPaths.of(spec, results_root)
    return [(r, run_state(paths.run_dir(r), r, app_defaults)) for r in expand_runs(spec)]


@dataclass(frozen=True)
class RecordedRuns:
    """The run folders under ``<results_root>/*/runs/`` with what each ``summary.json`` records
    (:func:`experiments.sweep.recorded_run`), read on first use and then kept."""

    root: Path

    _FIRST_CHECKED = ("mechanism", "seed", "global-lr", "epsilon")
    """Keys that always affect a run, compared before the whole config (a cheap filter)."""

    @functools.cached_property
    def entries(self) -> tuple[tuple[Path, Run, Mapping[str, Any]], ...]:
        """``(folder, recorded run, recorded effective config)`` of every readable record."""
        found = ((source, recorded_run(source)) for source in sorted(self.root.glob("*/runs/*")))
        return tuple((source, *rec) for source, rec in found if rec is not None)

    def done_sources(
        self, run: Run, app_defaults: Mapping[str, Any] | None = None
    ) -> Iterator[Path]:
        """Done run folders that are runs of ``run``, best first.

        First the folders named ``run.run_id`` (the id hashes the keys the spec sets, and
        :func:`experiments.sweep.run_state` checks it). Then, with ``app_defaults``,
        any other done folder with the same number of clients and the same spec ``data-dir``
        whose recorded effective config is ``run``'s (:func:`experiments.sweep.same_run`):
        a spec that spells out a default (``delta = 1e-5``) names the same run under another id.
        """
        for source in sorted(self.root.glob(f"*/runs/{run.run_id}")):
            if run_state(source, run, app_defaults) is RunState.DONE:
                yield source
        if app_defaults is None:
            return
        expected = {**app_defaults, **run.run_config}
        for source, other, config in self.entries:
            if (
                source.name != run.run_id
                and other.clients == run.clients
                # where the data is read from is not compared by same_run (a recorded data-dir
                # is resolved): two folders can hold different data, so the spec's must match
                and other.run_config.get("data-dir") == run.run_config.get("data-dir")
                and all(
                    config.get(k, expected.get(k)) == expected.get(k) for k in self._FIRST_CHECKED
                )
                and same_run(config, run, app_defaults)
                and run_state(source, other, app_defaults) is RunState.DONE
            ):
                yield source


def done_sources(
    run: Run, results_root: Path, app_defaults: Mapping[str, Any] | None = None
) -> Iterator[Path]:
    """:meth:`RecordedRuns.done_sources` of ``run`` on the folders as they are now."""
    return RecordedRuns(Path(results_root)).done_sources(run, app_defaults)


def reuse_finished_run(
    run: Run,
    paths: ExperimentPaths,
    results_root: Path,
    app_defaults: Mapping[str, Any] | None = None,
) -> Path | None:
    """Copy ``run`` from a folder where it is done (:func:`done_sources`); return the source.

    The copy leaves out the app's ``checkpoint/`` (model files; a done run never resumes) and
    writes ``summary.json`` last and atomically, its ``"run"`` record naming this run (id,
    hash, run config) with ``"reused_from": "<other>/runs/<run-id>"``, so an interrupted copy is
    a partial run. Returns ``None`` when no folder has it done.
    """
    target = paths.run_dir(run)
    for source in done_sources(run, results_root, app_defaults):
        if source.resolve() == target.resolve():
            continue
        if target.exists():
            shutil.rmtree(target)
        top = str(source)

        def skip(folder: str, names: list[str], top: str = top) -> list[str]:
            return [n for n in names if n == "checkpoint" or (folder == top and n == SUMMARY_FILE)]

        shutil.copytree(source, target, ignore=skip)
        summary = json.loads((source / SUMMARY_FILE).read_text(encoding="utf-8"))
        rel = source.relative_to(Path(results_root)).as_posix()
        summary[RUN_RECORD_KEY] = {
            **summary[RUN_RECORD_KEY],
            "run_id": run.run_id,
            "config_hash": run.config_hash,
            "run_config": dict(run.run_config),
            "clients": run.clients,
            "reused_from": rel,
        }
        atomic_write_json(target / SUMMARY_FILE, summary)
        return source
    return None


def make_backend(spec: ExperimentSpec, app_dir: Path) -> Backend:
    """The backend named by ``[experiment] backend`` of ``spec``."""
    if spec.backend == "deployment":
        assert spec.connection is not None
        return DeploymentBackend(app_dir, spec.connection)
    return SimulationBackend(
        app_dir,
        num_cpus_per_client=spec.num_cpus_per_client,
        num_gpus_per_client=spec.num_gpus_per_client,
    )


def current_app_defaults(app_dir: Path | None = None) -> dict[str, Any] | None:
    """The ``[tool.flwr.app.config]`` of ``app_dir`` (default: this project's app), against which
    finished runs are checked for staleness; ``None`` (no check, a warning) when there is none."""
    try:
        return load_app_defaults(Path(app_dir) if app_dir is not None else find_app_dir())
    except (FileNotFoundError, ValueError) as exc:
        logger.warning("finished runs not checked against the app's defaults: %s", exc)
        return None


def load_finished(
    spec: ExperimentSpec,
    results_root: Path,
    app_defaults: Mapping[str, Any] | None = None,
) -> list[RunResult]:
    """The finished runs of ``spec``, in sweep order (not the stale ones: see :func:`plan`)."""
    paths = ExperimentPaths.of(spec, results_root)
    out = []
    for run, state in plan(spec, results_root, app_defaults):
        if state is RunState.DONE:
            out.append(load_run(paths.run_dir(run)))
    return out


def finalize_federated(
    spec: ExperimentSpec,
    results_root: Path,
    *,
    failures: dict[str, str] | None = None,
    app_defaults: Mapping[str, Any] | None = None,
) -> tuple[list[Target], Path | None]:
    """Write ``runs.csv``, ``groups.csv``, the figures and ``report.md`` from finished runs.

    Returns the target checks and the report path (``None`` if no run has finished). With
    ``app_defaults``, runs made under other app defaults (stale) are left out.
    """
    paths = ExperimentPaths.of(spec, results_root)
    expected = len(expand_runs(spec))
    results = load_finished(spec, results_root, app_defaults)
    if not results:
        logger.warning("%s: no finished run yet; nothing to report", spec.name)
        return [], None
    groups = group_results(results)
    keys = varying_keys(results)
    write_runs_csv(paths.runs_csv, results, groups)
    write_groups_csv(paths.groups_csv, groups, keys)
    figures: dict[str, Path] = {}
    title = spec.description or spec.name
    for name in spec.figures:
        out = paths.figures_dir / f"{name}.png"
        if name == "accuracy-vs-round":
            figures[name] = plots.plot_accuracy_vs_round(groups, keys, out, title=title)
        elif name == "accuracy-bar":
            figures[name] = plots.plot_accuracy_bar(groups, keys, out, title=title)
        elif name == "accuracy-vs-bits":
            figures[name] = plots.plot_accuracy_vs_bits(groups, keys, out, title=title)
        elif name in plots.X_KEY_OF_FIGURE:
            x_key = plots.X_KEY_OF_FIGURE[name]
            if x_key not in keys:
                logger.warning(
                    "figure %s skipped: %s does not vary in this experiment", name, x_key
                )
                continue
            figures[name] = plots.plot_accuracy_vs(groups, x_key, keys, out, title=title)
    targets = write_federated_report(
        paths.report_md,
        spec,
        results,
        groups,
        keys,
        figures,
        command=_command(spec, results_root),
        expected_runs=expected,
        failures=failures,
    )
    return targets, paths.report_md


def run_federated(
    spec: ExperimentSpec,
    results_root: Path,
    *,
    app_dir: Path | None = None,
    backend: Backend | None = None,
    max_runs: int | None = None,
    progress: bool = True,
    console: object | None = None,
    on_run_done: Callable[[Run, str], None] | None = None,
) -> Outcome:
    """Execute the runs of ``spec`` that are not done yet, then write every output.

    Parameters
    ----------
    spec
        A federated spec.
    results_root
        Parent of the experiment folder.
    app_dir
        Flower app folder (default: this checkout, :func:`find_app_dir`).
    backend
        Override the backend the spec names (tests).
    max_runs
        Execute at most this many runs in this invocation (the rest stay for the next one).
    progress
        Show the rich progress display.
    console
        A :class:`rich.console.Console` for the display.
    on_run_done
        Called with ``(run, "done" | "failed: ...")`` after each executed run.

    Raises
    ------
    ValueError
        If the app does not declare every run-config key the runs use.
    """
    if spec.kind != "federated":
        raise ValueError(f"run_federated needs kind = 'federated', got {spec.kind!r}")
    if max_runs is not None and max_runs < 0:
        raise ValueError(f"max_runs must be >= 0, got {max_runs}")
    app = Path(app_dir) if app_dir is not None else find_app_dir()
    app_defaults = load_app_defaults(app)
    planned = plan(spec, results_root, app_defaults)
    check_app_accepts(app, {k for r, _ in planned for k in r.run_config} | {"out-dir"})
    paths = ExperimentPaths.of(spec, results_root)
    paths.runs_dir.mkdir(parents=True, exist_ok=True)
    outcome = Outcome(total=len(planned))
    own_backend = backend is None
    be = backend if backend is not None else make_backend(spec, app)
    todo = sum(1 for _, state in planned if state is not RunState.DONE)
    if max_runs is not None:
        todo = min(todo, max_runs)
    # the bar counts only runs executed now, so its ETA is not fooled by skipped ones
    view = ExperimentProgress(progress, todo, console)
    try:
        with view.live():
            for run, state in planned:
                if state is RunState.DONE:
                    outcome.skipped += 1
                    continue
                if max_runs is not None and outcome.executed + len(outcome.failed) >= max_runs:
                    break
                source = reuse_finished_run(run, paths, results_root, app_defaults)
                if source is not None:
                    outcome.reused += 1
                    logger.info("run %s reused from %s", run.run_id, source)
                    continue
                if state is not RunState.MISSING:
                    logger.info("run %s is %s: redoing it", run.run_id, state.value)
                view.start_run(run.run_id, int(run.run_config["num-rounds"]))
                t0 = time.monotonic()
                error: RunFailedError | None = None
                for attempt in range(1 + spec.retries):
                    if attempt:
                        logger.warning(
                            "run %s failed (%s); attempt %d of %d in %.0f s",
                            run.run_id,
                            str(error).splitlines()[0],
                            attempt + 1,
                            1 + spec.retries,
                            spec.retry_delay_s,
                        )
                        time.sleep(spec.retry_delay_s)
                    try:
                        execute_run(
                            run,
                            be,
                            paths.run_dir(run),
                            experiment=spec.name,
                            timeout_s=spec.run_timeout_s,
                            on_round=view.rounds,
                        )
                    except RunFailedError as exc:
                        error = exc
                    else:
                        error = None
                        break
                if error is not None:
                    outcome.failed[run.run_id] = str(error)
                    logger.error("%s", error)
                    if on_run_done is not None:
                        on_run_done(run, f"failed: {error}")
                else:
                    outcome.executed += 1
                    logger.info("run %s done in %.1f s", run.run_id, time.monotonic() - t0)
                    if on_run_done is not None:
                        on_run_done(run, "done")
                view.run_finished()
    except KeyboardInterrupt:
        outcome.interrupted = True
        logger.warning("interrupted; run the same command again to resume")
    finally:
        if own_backend:
            be.close()
    outcome.targets, outcome.report = finalize_federated(
        spec, results_root, failures=outcome.failed, app_defaults=app_defaults
    )
    return outcome


# --------------------------------------------------------------------------- mse


def run_mse(
    spec: ExperimentSpec,
    results_root: Path,
    *,
    device: str = "cpu",
    progress: bool = True,
    console: object | None = None,
) -> Outcome:
    """Run the quantizer-MSE experiment and write its CSVs, figures and report.

    The measurements are saved (``mse_grid.npz``, ``mse_real.npz``) so
    :func:`finalize_mse` can redraw without sampling again.
    """
    from experiments import mse

    if spec.kind != "mse" or spec.mse is None:
        raise ValueError(f"run_mse needs kind = 'mse', got {spec.kind!r}")
    paths = ExperimentPaths.of(spec, results_root)
    paths.root.mkdir(parents=True, exist_ok=True)
    view = ExperimentProgress(progress, 1, console)
    outcome = Outcome(total=1)
    with view.live():
        grid = mse.measure_grid(
            spec.mse,
            spec.seeds,
            device=device,
            on_step=lambda d, t: view.step("grid (eps x seed)", d, t),
        )
        mse.save_measurement(paths.root / "mse_grid.npz", grid)
        if spec.mse.real_weights is not None:
            real = mse.measure_real_weights(
                spec.mse,
                spec.seeds[0],
                device=device,
                on_step=lambda d, t: view.step("real weights (train, eps)", d, t),
            )
            mse.save_measurement(paths.root / "mse_real.npz", real)
    outcome.executed = 1
    outcome.targets, outcome.report = finalize_mse(spec, results_root)
    return outcome


def finalize_mse(spec: ExperimentSpec, results_root: Path) -> tuple[list[Target], Path | None]:
    """Write the MSE CSVs, figures and report from the saved measurements."""
    from experiments import mse

    paths = ExperimentPaths.of(spec, results_root)
    grid_path = paths.root / "mse_grid.npz"
    if not grid_path.is_file():
        logger.warning("%s: no measurement yet; nothing to report", spec.name)
        return [], None
    grid = mse.load_measurement(grid_path)
    assert isinstance(grid, mse.GridMSE)
    real_path = paths.root / "mse_real.npz"
    real = mse.load_measurement(real_path) if real_path.is_file() else None
    assert real is None or isinstance(real, mse.RealWeightsMSE)
    mse.write_grid_csv(paths.root / "mse_grid.csv", grid)
    if real is not None:
        mse.write_real_csv(paths.root / "mse_real_weights.csv", real)
    figures: dict[str, Path] = {}
    assert spec.mse is not None
    for name in spec.figures:
        out = paths.figures_dir / f"{name}.png"
        if name == "mse-heatmap":
            figures[name] = plots.plot_mse_heatmaps(grid, spec.mse.heatmap_epsilons, out)
        elif name == "mse-vs-epsilon":
            figures[name] = plots.plot_mse_vs_epsilon(grid, out)
        elif name == "mse-real-weights" and real is not None:
            figures[name] = plots.plot_mse_real_weights(real, out)
    targets = write_mse_report(
        paths.report_md, spec, grid, real, figures, command=_command(spec, results_root)
    )
    return targets, paths.report_md


def remove_experiment(spec: ExperimentSpec, results_root: Path) -> None:
    """Delete ``<results>/<name>/`` (``--fresh``)."""
    root = ExperimentPaths.of(spec, results_root).root
    if root.exists():
        logger.warning("removing %s (--fresh)", root)
        shutil.rmtree(root)


def summary_lines(outcome: Outcome) -> Sequence[str]:
    """Short text summary of an outcome (for the CLI)."""
    lines = [
        f"runs: {outcome.total} planned, {outcome.skipped} already done, "
        f"{outcome.reused} reused from other experiments, "
        f"{outcome.executed} executed, {len(outcome.failed)} failed"
        + (" (interrupted)" if outcome.interrupted else "")
    ]
    if outcome.report is not None:
        lines.append(f"report: {outcome.report}")
    for t in outcome.targets:
        lines.append(f"[{t.status}] {t.name}: {t.detail}")
    return lines
