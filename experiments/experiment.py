"""Run a whole experiment: plan, execute with resume and progress, then write every output.

Layout of ``<results>/``::

    runs/<run-id>/        the run pool: one folder per federated run, shared by every
                          experiment (see experiments.sweep and experiments.runner)
    <experiment>/runs.csv       one row per run (all lambdas)
    <experiment>/groups.csv     one row per setting at its validation-chosen lambda
    <experiment>/figures/*.png  the figures listed in [plots]
    <experiment>/report.md      tables, figures, privacy, target checks
    <experiment>/mse_grid.npz, mse_grid.csv, mse_real.npz, mse_real_weights.csv   (kind = "mse")

Resume: a run whose pool folder holds a complete ``summary.json`` (see
:func:`experiments.sweep.run_state`) is skipped, whichever experiment made it; anything else is
redone from scratch. Interrupting (Ctrl-C, SIGTERM) stops the current run's processes; the next
invocation of the same command continues where it stopped.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from experiments import plots, runner
from experiments.report import Target, write_federated_report, write_mse_report
from experiments.results import (
    RunResult,
    group_results,
    groups_table,
    load_run,
    runs_table,
    varying_keys,
    write_table,
)
from experiments.spec import ExperimentSpec
from experiments.sweep import POOL_DIR, Run, RunState, expand_runs, run_state

if TYPE_CHECKING:
    from rich.progress import Progress

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExperimentPaths:
    """Where an experiment's outputs go (``<results>/<name>/``)."""

    root: Path

    @property
    def runs_dir(self) -> Path:
        """The run pool, ``<results>/runs/``: one folder per run, shared by the experiments."""
        return self.root.parent / POOL_DIR

    @property
    def figures_dir(self) -> Path:
        return self.root / "figures"

    @property
    def runs_csv(self) -> Path:
        return self.root / "runs.csv"

    @property
    def groups_csv(self) -> Path:
        return self.root / "groups.csv"

    @property
    def report_md(self) -> Path:
        return self.root / "report.md"

    def run_dir(self, run: Run) -> Path:
        return self.runs_dir / run.run_id

    @classmethod
    def of(cls, spec: ExperimentSpec, results_root: Path) -> ExperimentPaths:
        return cls(Path(results_root) / spec.name)


@dataclass
class Outcome:
    """What one invocation did."""

    total: int = 0
    skipped: int = 0
    executed: int = 0
    failed: dict[str, str] = field(default_factory=dict)
    targets: list[Target] = field(default_factory=list)
    report: Path | None = None
    interrupted: bool = False


def _progress(enabled: bool, console: object | None) -> Progress:
    """A :mod:`rich` display of runs done / current round / ETA; draws nothing if disabled."""
    from rich import progress as rp

    return rp.Progress(
        rp.TextColumn("[bold]{task.description}"),
        rp.BarColumn(),
        rp.MofNCompleteColumn(),
        rp.TimeElapsedColumn(),
        rp.TextColumn("ETA"),
        rp.TimeRemainingColumn(),
        console=console,  # type: ignore[arg-type]
        transient=False,
        disable=not enabled,
    )


def _command(spec: ExperimentSpec, results_root: Path) -> str:
    src = spec.source if spec.source is not None else "<spec.toml>"
    extra = f" --results {results_root}" if Path(results_root) != Path("results") else ""
    return f"corbin-fl experiment run {src}{extra}"


def plan(spec: ExperimentSpec, results_root: Path) -> list[tuple[Run, RunState]]:
    """Every run of ``spec`` with its state in the pool (done runs are skipped by :func:`run`)."""
    paths = ExperimentPaths.of(spec, results_root)
    return [(r, run_state(paths.run_dir(r), r)) for r in expand_runs(spec)]


def make_backend(spec: ExperimentSpec, app_dir: Path) -> runner.Backend:
    """The backend named by ``[experiment] backend`` of ``spec``."""
    if spec.backend == "deployment":
        assert spec.connection is not None
        return runner.DeploymentBackend(app_dir, spec.connection)
    cpus, gpus = spec.num_cpus_per_client, spec.num_gpus_per_client
    return runner.SimulationBackend(app_dir, num_cpus_per_client=cpus, num_gpus_per_client=gpus)


def load_finished(spec: ExperimentSpec, results_root: Path) -> list[RunResult]:
    """The finished runs of ``spec``, in sweep order."""
    paths = ExperimentPaths.of(spec, results_root)
    return [load_run(paths.run_dir(r)) for r, st in plan(spec, results_root) if st is RunState.DONE]


_GROUP_FIGURES = {
    "accuracy-vs-round": plots.accuracy_vs_round_figure,
    "accuracy-bar": plots.accuracy_bar_figure,
    "accuracy-vs-bits": plots.accuracy_vs_bits_figure,
}


def finalize_federated(
    spec: ExperimentSpec,
    results_root: Path,
    *,
    failures: dict[str, str] | None = None,
) -> tuple[list[Target], Path | None]:
    """Write ``runs.csv``, ``groups.csv``, the figures and ``report.md`` from finished runs.

    Returns the target checks and the report path (``None`` if no run has finished).
    """
    paths = ExperimentPaths.of(spec, results_root)
    results = load_finished(spec, results_root)
    if not results:
        logger.warning("%s: no finished run yet; nothing to report", spec.name)
        return [], None
    groups = group_results(results)
    keys = varying_keys(results)
    write_table(paths.runs_csv, runs_table(results, groups))
    write_table(paths.groups_csv, groups_table(groups, keys))
    figures: dict[str, Path] = {}
    title = spec.description or spec.name
    for name in spec.figures:
        if name in _GROUP_FIGURES:
            fig = _GROUP_FIGURES[name](groups, keys, title=title)
        elif (x_key := plots.X_KEY_OF_FIGURE[name]) in keys:  # the spec checked the name
            fig = plots.accuracy_vs_figure(groups, x_key, keys, title=title)
        else:
            logger.warning("figure %s skipped: %s does not vary in this experiment", name, x_key)
            continue
        figures[name] = plots.save(fig, paths.figures_dir / f"{name}.png")
    targets = write_federated_report(
        paths.report_md,
        spec,
        results,
        groups,
        keys,
        figures,
        command=_command(spec, results_root),
        expected_runs=len(expand_runs(spec)),
        failures=failures,
    )
    return targets, paths.report_md


def run_federated(
    spec: ExperimentSpec,
    results_root: Path,
    *,
    app_dir: Path | None = None,
    backend: runner.Backend | None = None,
    max_runs: int | None = None,
    progress: bool = True,
    console: object | None = None,
) -> Outcome:
    """Execute the runs of ``spec`` that are not done yet, then write every output.

    ``app_dir`` defaults to this checkout (:func:`runner.find_app_dir`); ``backend`` overrides
    the one the spec names (tests); at most ``max_runs`` runs are executed now, the rest stay
    for the next invocation; ``progress`` and ``console`` drive the rich display.

    Raises ``ValueError`` if the app does not declare every run-config key the runs use.
    """
    if spec.kind != "federated":
        raise ValueError(f"run_federated needs kind = 'federated', got {spec.kind!r}")
    if max_runs is not None and max_runs < 0:
        raise ValueError(f"max_runs must be >= 0, got {max_runs}")
    app = Path(app_dir) if app_dir is not None else runner.find_app_dir()
    planned = plan(spec, results_root)
    runner.check_app_accepts(app, {k for r, _ in planned for k in r.run_config} | {"out-dir"})
    paths = ExperimentPaths.of(spec, results_root)
    paths.runs_dir.mkdir(parents=True, exist_ok=True)
    outcome = Outcome(total=len(planned))
    own_backend = backend is None
    be = backend if backend is not None else make_backend(spec, app)
    todo = sum(1 for _, state in planned if state is not RunState.DONE)
    if max_runs is not None:
        todo = min(todo, max_runs)
    # the bar counts only runs executed now, so its ETA is not fooled by skipped ones
    view = _progress(progress, console)
    runs_bar = view.add_task("runs to do", total=todo)
    round_bar = view.add_task("round", total=1, visible=False)
    try:
        with view:
            for run, state in planned:
                if state is RunState.DONE:
                    outcome.skipped += 1
                    continue
                if max_runs is not None and outcome.executed + len(outcome.failed) >= max_runs:
                    break
                if state is not RunState.MISSING:
                    logger.info("run %s is %s: redoing it", run.run_id, state.value)
                rounds = int(run.run_config["num-rounds"])
                view.update(
                    round_bar, description=run.run_id, total=rounds, completed=0, visible=True
                )
                t0 = time.monotonic()
                error: runner.RunFailedError | None = None
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
                        runner.execute_run(
                            run,
                            be,
                            paths.run_dir(run),
                            experiment=spec.name,
                            timeout_s=spec.run_timeout_s,
                            on_round=lambda done: view.update(round_bar, completed=done),
                        )
                        error = None
                        break
                    except runner.RunFailedError as exc:
                        error = exc
                if error is not None:
                    outcome.failed[run.run_id] = str(error)
                    logger.error("%s", error)
                else:
                    outcome.executed += 1
                    logger.info("run %s done in %.1f s", run.run_id, time.monotonic() - t0)
                view.advance(runs_bar)
    except KeyboardInterrupt:
        outcome.interrupted = True
        logger.warning("interrupted; run the same command again to resume")
    finally:
        if own_backend:
            be.close()
    outcome.targets, outcome.report = finalize_federated(
        spec, results_root, failures=outcome.failed
    )
    return outcome


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
    view = _progress(progress, console)
    bar = view.add_task("runs to do", total=1)

    def step(description: str) -> Callable[[int, int], None]:
        return lambda d, t: view.update(bar, description=description, completed=d, total=t)

    with view:
        grid = mse.measure_grid(
            spec.mse, spec.seeds, device=device, on_step=step("grid (eps x seed)")
        )
        mse.save_measurement(paths.root / "mse_grid.npz", grid)
        if spec.mse.real_weights is not None:
            real = mse.measure_real_weights(
                spec.mse,
                spec.seeds[0],
                device=device,
                on_step=step("real weights (train, eps)"),
            )
            mse.save_measurement(paths.root / "mse_real.npz", real)
    outcome = Outcome(total=1, executed=1)
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
        if name == "mse-heatmap":
            fig = plots.mse_heatmaps_figure(grid, spec.mse.heatmap_epsilons)
        elif name == "mse-vs-epsilon":
            fig = plots.mse_vs_epsilon_figure(grid)
        elif name == "mse-real-weights" and real is not None:
            fig = plots.mse_real_weights_figure(real)
        else:
            continue
        figures[name] = plots.save(fig, paths.figures_dir / f"{name}.png")
    targets = write_mse_report(
        paths.report_md, spec, grid, real, figures, command=_command(spec, results_root)
    )
    return targets, paths.report_md


def remove_experiment(spec: ExperimentSpec, results_root: Path) -> None:
    """Delete ``<results>/<name>/`` and the pool folders of its runs (``--fresh``)."""
    paths = ExperimentPaths.of(spec, results_root)
    doomed = [paths.root]
    if spec.kind == "federated":
        doomed += [paths.run_dir(run) for run in expand_runs(spec)]
    for folder in doomed:
        if folder.exists():
            logger.warning("removing %s (--fresh)", folder)
            shutil.rmtree(folder)


def summary_lines(outcome: Outcome) -> Sequence[str]:
    """Short text summary of an outcome (for the CLI)."""
    lines = [
        f"runs: {outcome.total} planned, {outcome.skipped} already done, "
        f"{outcome.executed} executed, {len(outcome.failed)} failed"
        + (" (interrupted)" if outcome.interrupted else "")
    ]
    if outcome.report is not None:
        lines.append(f"report: {outcome.report}")
    return lines + [f"[{t.status}] {t.name}: {t.detail}" for t in outcome.targets]
