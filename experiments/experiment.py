"""Run a whole experiment: plan, execute with resume and progress, then write every output.

``<results>/runs/<run-id>/`` is the run pool shared by every experiment (:mod:`experiments.sweep`);
``<results>/<name>/`` holds ``runs.csv``, ``groups.csv``, ``figures/*.png`` and ``report.md``
(and the ``mse_*`` measurements of an mse experiment). A run already done in the pool is
skipped, whichever experiment made it; anything else is redone from scratch.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from corbin_fl.experiments import plots, runner
from corbin_fl.experiments.report import Target, write_federated_report, write_mse_report
from corbin_fl.experiments.results import (
    RunResult,
    group_results,
    groups_table,
    load_run,
    runs_table,
    varying_keys,
    write_table,
)
from corbin_fl.experiments.spec import ExperimentSpec
from corbin_fl.experiments.sweep import POOL_DIR, Run, RunState, expand_runs, run_state

if TYPE_CHECKING:
    from rich.progress import Progress

logger = logging.getLogger(__name__)


def _pool(results_root: Path) -> Path:
    return Path(results_root) / POOL_DIR


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
    """A :mod:`rich` display of runs done, the current round and the ETA."""
    from rich import progress as rp

    return rp.Progress(
        rp.TextColumn("[bold]{task.description}"),
        rp.BarColumn(),
        rp.MofNCompleteColumn(),
        rp.TimeElapsedColumn(),
        rp.TextColumn("ETA"),
        rp.TimeRemainingColumn(),
        console=console,  # type: ignore[arg-type]
        disable=not enabled,
    )


def _command(spec: ExperimentSpec, results_root: Path) -> str:
    src = spec.source if spec.source is not None else "<spec.toml>"
    extra = f" --results {results_root}" if Path(results_root) != Path("results") else ""
    return f"corbin-fl experiment run {src}{extra}"


def plan(spec: ExperimentSpec, results_root: Path) -> list[tuple[Run, RunState]]:
    """Every run of ``spec`` with its state in the pool."""
    return [(r, run_state(_pool(results_root) / r.run_id, r)) for r in expand_runs(spec)]


def load_finished(spec: ExperimentSpec, results_root: Path) -> list[RunResult]:
    """The finished runs of ``spec``, in sweep order."""
    pool = _pool(results_root)
    return [load_run(pool / r.run_id) for r, st in plan(spec, results_root) if st is RunState.DONE]


_GROUP_FIGURES = {
    "accuracy-vs-round": plots.accuracy_vs_round_figure,
    "accuracy-bar": plots.accuracy_bar_figure,
    "accuracy-vs-bits": plots.accuracy_vs_bits_figure,
}


def finalize_federated(
    spec: ExperimentSpec, results_root: Path, *, failures: dict[str, str] | None = None
) -> tuple[list[Target], Path | None]:
    """Write ``runs.csv``, ``groups.csv``, the figures and ``report.md`` from the finished runs;
    return the target checks and the report (``None`` before any run has finished)."""
    root = Path(results_root) / spec.name
    results = load_finished(spec, results_root)
    if not results:
        logger.warning("%s: no finished run yet; nothing to report", spec.name)
        return [], None
    groups, keys = group_results(results), varying_keys(results)
    write_table(root / "runs.csv", runs_table(results, groups))
    write_table(root / "groups.csv", groups_table(groups, keys))
    figures: dict[str, Path] = {}
    title = spec.description or spec.name
    for name in spec.figures:
        if name in _GROUP_FIGURES:
            fig = _GROUP_FIGURES[name](groups, keys, title=title)
        elif (x_key := plots.X_KEY_OF_FIGURE[name]) in keys:
            fig = plots.accuracy_vs_figure(groups, x_key, keys, title=title)
        else:
            logger.warning("figure %s skipped: %s does not vary in this experiment", name, x_key)
            continue
        figures[name] = plots.save(fig, root / "figures" / f"{name}.png")
    targets = write_federated_report(
        root / "report.md",
        spec,
        results,
        groups,
        keys,
        figures,
        command=_command(spec, results_root),
        expected_runs=len(expand_runs(spec)),
        failures=failures,
    )
    return targets, root / "report.md"


def _attempts(spec: ExperimentSpec, run: Run, once: Callable[[], object]) -> str | None:
    """Call ``once`` up to ``1 + retries`` times until it raises no ``RunFailedError``; the
    last error, or ``None``."""
    error: runner.RunFailedError | None = None
    for attempt in range(1 + spec.retries):
        if error is not None:
            first = str(error).splitlines()[0]
            logger.warning(
                "run %s failed (%s); attempt %d of %d in %.0f s",
                *(run.run_id, first, attempt + 1, 1 + spec.retries, spec.retry_delay_s),
            )
            time.sleep(spec.retry_delay_s)
        try:
            once()
            return None
        except runner.RunFailedError as exc:
            error = exc
    return str(error)


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
    """Execute the runs of ``spec`` that are not done (at most ``max_runs`` now), then write
    every output. ``app_dir`` defaults to this checkout; ``backend`` replaces the simulation
    (tests). ``ValueError`` if the app does not declare every run-config key the runs use."""
    if spec.kind != "federated":
        raise ValueError(f"run_federated needs kind = 'federated', got {spec.kind!r}")
    if max_runs is not None and max_runs < 0:
        raise ValueError(f"max_runs must be >= 0, got {max_runs}")
    app = Path(app_dir) if app_dir is not None else runner.find_app_dir()
    planned = plan(spec, results_root)
    runner.check_app_accepts(app, {k for r, _ in planned for k in r.run_config} | {"out-dir"})
    _pool(results_root).mkdir(parents=True, exist_ok=True)
    outcome = Outcome(total=len(planned))
    be = backend or runner.SimulationBackend(
        app,
        num_cpus_per_client=spec.num_cpus_per_client,
        num_gpus_per_client=spec.num_gpus_per_client,
    )
    todo = sum(1 for _, state in planned if state is not RunState.DONE)
    view = _progress(progress, console)  # counts only the runs executed now (an honest ETA)
    runs_bar = view.add_task(
        "runs to do", total=min(todo, max_runs if max_runs is not None else todo)
    )
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
                error = _attempts(
                    spec,
                    run,
                    lambda run=run: runner.execute_run(  # type: ignore[misc]
                        run,
                        be,
                        _pool(results_root) / run.run_id,
                        experiment=spec.name,
                        timeout_s=spec.run_timeout_s,
                        on_round=lambda done: view.update(round_bar, completed=done),
                    ),
                )
                if error is not None:
                    outcome.failed[run.run_id] = error
                    logger.error("%s", error)
                else:
                    outcome.executed += 1
                    logger.info("run %s done in %.1f s", run.run_id, time.monotonic() - t0)
                view.advance(runs_bar)
    except KeyboardInterrupt:
        outcome.interrupted = True
        logger.warning("interrupted; run the same command again to resume")
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
    """Measure the quantizer MSE (saved as ``mse_grid.npz``, ``mse_real.npz``, so that
    :func:`finalize_mse` redraws without sampling again), then write every output."""
    from corbin_fl.experiments import mse

    if spec.kind != "mse" or spec.mse is None:
        raise ValueError(f"run_mse needs kind = 'mse', got {spec.kind!r}")
    root = Path(results_root) / spec.name
    root.mkdir(parents=True, exist_ok=True)
    view = _progress(progress, console)
    bar = view.add_task("runs to do", total=1)

    def step(description: str) -> Callable[[int, int], None]:
        return lambda d, t: view.update(bar, description=description, completed=d, total=t)

    with view:
        grid = mse.measure_grid(
            spec.mse, spec.seeds, device=device, on_step=step("grid (eps x seed)")
        )
        mse.save_measurement(root / "mse_grid.npz", grid)
        if spec.mse.real_weights is not None:
            real = mse.measure_real_weights(
                spec.mse, spec.seeds[0], device=device, on_step=step("real weights (train, eps)")
            )
            mse.save_measurement(root / "mse_real.npz", real)
    outcome = Outcome(total=1, executed=1)
    outcome.targets, outcome.report = finalize_mse(spec, results_root)
    return outcome


def finalize_mse(spec: ExperimentSpec, results_root: Path) -> tuple[list[Target], Path | None]:
    """Write the MSE CSVs, figures and report from the saved measurements."""
    from corbin_fl.experiments import mse

    root = Path(results_root) / spec.name
    if not (root / "mse_grid.npz").is_file():
        logger.warning("%s: no measurement yet; nothing to report", spec.name)
        return [], None
    assert spec.mse is not None
    grid = mse.load_measurement(root / "mse_grid.npz")
    real = (
        mse.load_measurement(root / "mse_real.npz") if (root / "mse_real.npz").is_file() else None
    )
    assert isinstance(grid, mse.GridMSE) and not isinstance(real, mse.GridMSE)
    mse.write_grid_csv(root / "mse_grid.csv", grid)
    if real is not None:
        mse.write_real_csv(root / "mse_real_weights.csv", real)
    heat = spec.mse.heatmap_epsilons
    draw = {
        "mse-heatmap": lambda: plots.mse_heatmaps_figure(grid, heat),
        "mse-vs-epsilon": lambda: plots.mse_vs_epsilon_figure(grid),
        "mse-real-weights": lambda: plots.mse_real_weights_figure(real),  # type: ignore[arg-type]
    }
    figures = {
        name: plots.save(draw[name](), root / "figures" / f"{name}.png")
        for name in spec.figures
        if name != "mse-real-weights" or real is not None
    }
    targets = write_mse_report(
        root / "report.md", spec, grid, real, figures, command=_command(spec, results_root)
    )
    return targets, root / "report.md"


def remove_experiment(spec: ExperimentSpec, results_root: Path) -> None:
    """Delete ``<results>/<name>/`` and the pool folders of its runs (``--fresh``)."""
    doomed = [Path(results_root) / spec.name]
    if spec.kind == "federated":
        doomed += [_pool(results_root) / run.run_id for run in expand_runs(spec)]
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
