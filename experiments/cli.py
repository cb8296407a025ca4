"""``corbin-fl experiment run|plan|report SPEC...``: run TOML-described experiments (a run
already done is skipped, so the same command resumes), list their runs, or rebuild their
outputs. Exit codes: 0 (target checks are reported, never enforced), 1 some runs failed, 2
invalid spec or arguments, 130 interrupted.

``<results>/runs/<run-id>/`` is the run pool shared by every experiment (:mod:`experiments.sweep`);
``<results>/<name>/`` holds ``runs.csv``, ``groups.csv``, ``figures/*.png`` and ``report.md``
(and the ``mse_*`` measurements of an mse experiment).
"""

from __future__ import annotations

import argparse
import logging
import math
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich import progress as rp
from rich.console import Console
from rich.logging import RichHandler

from corbin_fl.app.sources import check_dataset_files
from corbin_fl.experiments import report, sweep
from corbin_fl.experiments import results as rs
from corbin_fl.experiments.host import host_record
from corbin_fl.experiments.report import Target
from corbin_fl.experiments.spec import ExperimentSpec, SpecError, load_spec
from corbin_fl.experiments.sweep import Backend, Run, RunState

logger = logging.getLogger(__name__)


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


def plan(spec: ExperimentSpec, results_root: Path) -> list[tuple[Run, RunState]]:
    """Every run of ``spec`` its table needs, with its state in the pool: with ``lambda-seeds``,
    a run on another seed is needed only at its setting's chosen lambda, and is
    :attr:`RunState.WAITING` (at every lambda) until the setting's lambda-choosing runs are all
    done (:func:`chosen_lambdas`), finished or not; with ``[lambda-from]``, a run of a borrowing
    grid likewise waits for its counterpart's choice in the other spec
    (:func:`borrowed_lambdas`)."""
    pool = Path(results_root) / sweep.POOL_DIR
    runs = sweep.expand_runs(spec)
    states = {r.run_id: sweep.run_state(pool / r.run_id, r) for r in runs}
    chosen = chosen_lambdas(spec, runs, states, pool) if spec.confirmation_seeds else {}
    chosen |= borrowed_lambdas(spec, runs, pool)
    # a run that waits is not counted done even when its folder is: until its setting's lambda
    # is chosen, a finished run of it may be at a lambda the choice will not take (a grid
    # extended after it ran, or a counterpart's choice that changed)
    return [
        (r, RunState.WAITING)
        if not r.selects and r.setting_key not in chosen
        else (r, states[r.run_id])
        for r in sweep.needed_runs(runs, chosen)
    ]


def chosen_lambdas(
    spec: ExperimentSpec, runs: Sequence[Run], states: dict[str, RunState], pool: Path
) -> dict[str, float]:
    """Setting key -> its chosen lambda (:func:`results.choose_lambda` over its lambda-choosing
    runs, the report's rule) for every setting whose lambda-choosing runs are all done."""
    return {
        key: rs.choose_lambda([rs.load_run(pool / r.run_id) for r in members])[0]
        for key, members in sweep.choosing_runs(runs).items()
        if all(states[r.run_id] is RunState.DONE for r in members)
    }


def grid_ends(
    spec: ExperimentSpec, planned: Sequence[tuple[Run, RunState]], pool: Path
) -> list[str]:
    """The settings of ``planned`` whose lambda is chosen (:func:`chosen_lambdas`: every
    lambda-choosing run done) at the smallest or largest value of their grid, in words
    (:func:`results.grid_end_text`); the best lambda may lie beyond such a grid, and extending
    it that way is how to know."""
    runs = [r for r, _ in planned]
    states = {r.run_id: state for r, state in planned}
    choosing = sweep.choosing_runs(runs)
    configs = {
        key: {k: v for k, v in members[0].config.items() if k not in ("seed", "global-lr")}
        for key, members in choosing.items()
    }
    keys = rs.varying_setting_keys(list(configs.values()))
    out = []
    for key, lam in chosen_lambdas(spec, runs, states, pool).items():
        grid = [float(r.run_config["global-lr"]) for r in choosing[key]]
        if (text := rs.grid_end_text(rs.group_label(configs[key], keys), lam, grid)) is not None:
            out.append(text)
    return out


def borrowed_lambdas(spec: ExperimentSpec, runs: Sequence[Run], pool: Path) -> dict[str, float]:
    """Setting key -> the lambda chosen for its counterpart in the spec of ``[lambda-from]``
    (:func:`chosen_lambdas` of that spec, over the same pool), for the borrowing settings whose
    counterpart's choice is made."""
    if spec.lambda_from is None:
        return {}
    other = spec.lambda_from.spec
    theirs = sweep.expand_runs(other)
    states = {r.run_id: sweep.run_state(pool / r.run_id, r) for r in theirs}
    choices = chosen_lambdas(other, theirs, states, pool)
    return {
        r.setting_key: choices[r.counterpart]
        for r in runs
        if r.counterpart is not None and r.counterpart in choices
    }


def to_do(planned: Sequence[tuple[Run, RunState]]) -> list[Run]:
    """The runs still to execute: those missing or partial, and per setting and seed one of
    the waiting runs (the one at the first lambda; which one runs is chosen later)."""
    seen: set[tuple[str, Any]] = set()
    out: list[Run] = []
    for r, state in planned:
        if state is RunState.WAITING:
            if (key := (r.setting_key, r.run_config["seed"])) in seen:
                continue
            seen.add(key)
        if state is not RunState.DONE:
            out.append(r)
    return out


def plan_counts(spec: ExperimentSpec, planned: Sequence[tuple[Run, RunState]]) -> str:
    """``<name>: N runs (d done, p partial, m to do[, w at a lambda not chosen yet])``."""
    n = {s: sum(1 for _, st in planned if st is s) for s in RunState}
    left = len(to_do(planned))
    waiting = left - n[RunState.PARTIAL] - n[RunState.MISSING]
    total = n[RunState.DONE] + left
    later, choose = rs.seeds_text(spec.confirmation_seeds), rs.seeds_text(spec.selection_seeds)
    if not waiting:
        after = ""
    elif spec.lambda_from is None:
        after = f", {waiting} then at their setting's chosen lambda ({later}; lambda chosen on "
        after += f"{choose})"
    else:
        after = f", {waiting} then at the lambda chosen for their counterpart in "
        after += spec.lambda_from.path
    return (
        f"{spec.name}: {total} runs ({n[RunState.DONE]} done, {n[RunState.PARTIAL]} partial, "
        f"{n[RunState.MISSING]} to do{after})"
    )


def round_seconds_done(
    planned: Sequence[tuple[Run, RunState]], pool: Path
) -> list[tuple[bool, float, Any]]:
    """``(secure aggregation, seconds a round, machine)`` for each run done in ``pool``: its
    wall seconds (:attr:`results.RunResult.seconds`, start included) over its rounds, whether
    it has secure aggregation (a SecAgg+ round costs about twice another, docs/BENCHMARKS.md),
    and the machine its record names (``run.host``,
    :func:`~corbin_fl.experiments.host.host_record`; ``None`` in records older than that
    field). A run that cannot be read is left out."""
    out: list[tuple[bool, float, Any]] = []
    for r, state in planned:
        if state is not RunState.DONE:
            continue
        try:
            done = rs.load_run(pool / r.run_id)
        except ValueError:
            continue
        if math.isfinite(done.seconds) and done.seconds > 0:
            machine = done.summary[sweep.RUN_RECORD_KEY].get("host")
            per_round = done.seconds / int(r.run_config["num-rounds"])
            out.append((done.setting["secure-aggregation"] is True, per_round, machine))
    return out


def plan_estimate(
    spec: ExperimentSpec,
    planned: Sequence[tuple[Run, RunState]],
    pool: Path | None = None,
    host: Mapping[str, Any] | None = None,
) -> str | None:
    """The time the runs not done will take, ``sum over them of num-rounds x a round's
    seconds``, in words; ``None`` when nothing gives a round's seconds.

    A round's seconds is the median over the runs done in ``pool`` with secure aggregation as
    the run has it or not (a median, so that runs which shared the machine with other work do
    not pull it), else the spec's ``round-seconds``. Where runs of a kind were done on this
    machine (``host``, by default :func:`~corbin_fl.experiments.host.host_record`), only
    those count: a pool resumed over sessions may have run on machines of different speeds.
    Where a kind's fastest run done was quicker than its median, the text also gives the time
    at each kind's least seconds a round: about what the runs take on a machine left to them
    (the median is pulled up when most of the runs done shared the cores)."""
    here = host_record() if host is None else host
    done = round_seconds_done(planned, pool) if pool is not None else []
    todo = to_do(planned)
    kinds = [bool(r.config.get("secure-aggregation", False)) for r in todo]
    per_round: dict[bool, float] = {}
    fastest: dict[bool, float] = {}
    words: list[str] = []
    for secure in sorted(set(kinds) or {False}):
        local = [s for k, s, machine in done if k is secure and machine == here]
        if values := local or [s for k, s, _ in done if k is secure]:
            per_round[secure] = statistics.median(values)
            fastest[secure] = min(values)
            how = f"the median of {len(values)} run{'s' if len(values) > 1 else ''} done"
            how += " on this machine" if local else ", none on this machine"
        elif spec.round_seconds is not None:
            per_round[secure] = spec.round_seconds
            how = "measured, see the spec"
        else:
            return None
        with_secure = " with secure aggregation" if secure else ""
        words.append(f"{per_round[secure]:.3g} s a round{with_secure} ({how})")
    rounds = [int(r.run_config["num-rounds"]) for r in todo]

    def hours(seconds_a_round: Mapping[bool, float]) -> float:
        return sum(n * seconds_a_round[k] for n, k in zip(rounds, kinds, strict=True)) / 3600

    text = (
        f"estimate: {len(todo)} runs to do x their rounds ({sum(rounds):,} in all) x "
        f"{' and '.join(words)} = {hours(per_round):.1f} h "
        f"({hours(per_round) * 60 / max(len(todo), 1):.1f} min a run)"
    )
    if any(fastest[k] < per_round[k] for k in fastest):
        at = " and ".join(
            f"{fastest[k]:.3g} s a round{' with secure aggregation' if k else ''}"
            for k in sorted(fastest)
        )
        text += f"; {hours({**per_round, **fastest}):.1f} h at the fastest run done ({at})"
    return text


def load_finished(
    spec: ExperimentSpec,
    results_root: Path,
    planned: Sequence[tuple[Run, RunState]] | None = None,
) -> list[rs.RunResult]:
    """The finished runs of ``spec``, in sweep order (``planned``: its :func:`plan`, when the
    caller has it already)."""
    pool = Path(results_root) / sweep.POOL_DIR
    planned = plan(spec, results_root) if planned is None else planned
    return [rs.load_run(pool / r.run_id) for r, s in planned if s is RunState.DONE]


def finalize(
    spec: ExperimentSpec, results_root: Path, *, failures: dict[str, str] | None = None
) -> tuple[list[Target], Path | None]:
    """Write every output of ``spec`` from its finished runs (``runs.csv``, ``groups.csv``, the
    figures, ``report.md``) or from its saved MSE measurements; return the target checks and
    the report (``None`` before any run has finished)."""
    root = Path(results_root) / spec.name
    extra = f" --results {results_root}" if Path(results_root) != Path("results") else ""
    command = f"corbin-fl experiment run {spec.source or '<spec.toml>'}{extra}"
    if spec.kind == "mse":
        from corbin_fl.experiments import mse  # torch: 1.4 of the CLI's 3.8 CPU-s start-up

        return mse.finalize(spec, root, command)
    if not (results := load_finished(spec, results_root)):
        logger.warning("%s: no finished run yet; nothing to report", spec.name)
        return [], None
    expected = sweep.table_size(spec, sweep.expand_runs(spec))
    return report.finalize_federated(spec, root, results, command, expected, failures)


def run(
    spec: ExperimentSpec,
    results_root: Path,
    *,
    app_dir: Path | None = None,
    backend: Backend | None = None,
    max_runs: int | None = None,
    device: str = "cpu",
    progress: bool = True,
    console: Any = None,
) -> Outcome:
    """Execute the runs of a federated ``spec`` that are not done (at most ``max_runs`` now, each
    up to ``1 + retries`` times), or measure an mse spec's quantizer MSE on ``device``
    (:func:`experiments.mse.measure`), then write every output. ``app_dir`` defaults to this
    checkout; ``backend`` replaces the simulation (tests). ``ValueError`` if the app does not
    declare every run-config key the runs use."""
    if max_runs is not None and max_runs < 0:
        raise ValueError(f"max_runs must be >= 0, got {max_runs}")
    # runs done, the current round and the ETA of the runs executed now (an honest ETA)
    count = (rp.TextColumn("[bold]{task.description}"), rp.BarColumn(), rp.MofNCompleteColumn())
    times = (rp.TimeElapsedColumn(), rp.TextColumn("ETA"), rp.TimeRemainingColumn())
    view = rp.Progress(*count, *times, console=console, disable=not progress)
    if spec.kind == "mse":
        from corbin_fl.experiments import mse  # torch: see finalize

        (root := Path(results_root) / spec.name).mkdir(parents=True, exist_ok=True)
        bar = view.add_task("runs to do", total=1)
        with view:
            step = lambda what, d, t: view.update(bar, description=what, completed=d, total=t)  # noqa: E731
            mse.measure(spec, root, device=device, on_step=step)
        outcome = Outcome(total=1, executed=1)
        outcome.targets, outcome.report = finalize(spec, results_root)
        return outcome
    app = Path(app_dir) if app_dir is not None else sweep.find_app_dir()
    planned = plan(spec, results_root)
    check_data(r for r, state in planned if state is not RunState.DONE)
    sweep.check_app_accepts(app, {k for r, _ in planned for k in r.run_config} | {"out-dir"})
    (pool := Path(results_root) / sweep.POOL_DIR).mkdir(parents=True, exist_ok=True)
    be = backend or sweep.simulation_backend(app, spec)
    left = to_do(planned)
    todo = left[:max_runs]
    done = sum(s is RunState.DONE for _, s in planned)
    outcome = Outcome(total=done + len(left), skipped=done)
    runs_bar = view.add_task("runs to do", total=len(todo))
    round_bar = view.add_task("round", total=1, visible=False)
    started = time.monotonic()
    tried: set[str] = set()

    try:
        with view:
            for index in range(len(todo)):
                if (upcoming := next_run(spec, results_root, tried)) is None:
                    logger.warning("%s", waiting_text(spec, results_root))
                    break
                run, state = upcoming
                tried.add(run.run_id)
                logger.info("%s", progress_line(spec.name, outcome, index, len(todo), started))
                if state is not RunState.MISSING:
                    logger.info("run %s is %s: redoing it", run.run_id, state.value)
                rounds = int(run.run_config["num-rounds"])
                view.update(
                    round_bar, description=run.run_id, total=rounds, completed=0, visible=True
                )
                t0 = time.monotonic()
                on_round = lambda n: view.update(round_bar, completed=n)  # noqa: E731
                if (error := execute(spec, run, be, pool, on_round)) is None:
                    outcome.executed += 1
                    logger.info("run %s done in %.1f s", run.run_id, time.monotonic() - t0)
                else:
                    outcome.failed[run.run_id] = error
                    logger.error("%s", error)
                view.advance(runs_bar)
    except KeyboardInterrupt:
        outcome.interrupted = True
        logger.warning("interrupted; run the same command again to resume")
    outcome.targets, outcome.report = finalize(spec, results_root, failures=outcome.failed)
    return outcome


def next_run(
    spec: ExperimentSpec, results_root: Path, tried: set[str]
) -> tuple[Run, RunState] | None:
    """The first run of the plan to execute that is not in ``tried``, the plan read again (a
    setting's lambda is chosen once its lambda-choosing runs are done)."""
    for run, state in plan(spec, results_root):
        if state in (RunState.MISSING, RunState.PARTIAL) and run.run_id not in tried:
            return run, state
    return None


def waiting_text(spec: ExperimentSpec, results_root: Path) -> str:
    """Why the runs left cannot run now: they wait for a lambda choice whose runs failed, or
    (``[lambda-from]``) for one the other spec has not made yet, with the command that makes it."""
    if spec.lambda_from is None:
        return "the runs left wait for a lambda choice whose runs failed"
    other = spec.lambda_from.spec
    command = f"corbin-fl experiment run {other.source or other.name} --results {results_root}"
    return (
        f"the runs left wait for a lambda choice: their counterpart's in {other.name} (run it "
        f"first: `{command}`), or one whose runs failed"
    )


def execute(
    spec: ExperimentSpec, run: Run, backend: Backend, pool: Path, on_round: Callable[[int], None]
) -> str | None:
    """``None`` once ``run`` succeeds, or why its last of ``1 + retries`` attempts failed."""
    how: dict[str, Any] = {"experiment": spec.name, "timeout_s": spec.run_timeout_s}
    for attempt in range(1 + spec.retries):
        try:
            sweep.execute_run(run, backend, pool / run.run_id, on_round=on_round, **how)
            return None
        except sweep.RunFailedError as exc:
            error = str(exc)
        if attempt < spec.retries:
            logger.warning(
                "run %s failed (%s); attempt %d of %d in %.0f s",
                *(run.run_id, error.splitlines()[0], attempt + 2, 1 + spec.retries),
                spec.retry_delay_s,
            )
            time.sleep(spec.retry_delay_s)
    return error


def progress_line(name: str, outcome: Outcome, index: int, todo: int, started: float) -> str:
    """One line of progress before run ``index`` (0-based) of the ``todo`` runs this invocation
    executes: runs done in all (the pool's, from earlier invocations, and this one's), failed,
    and the time left at this invocation's mean time per run (none before the first ends).
    The live display shows the same; this line reaches a log and a terminal without one."""
    finished = index
    done = outcome.skipped + outcome.executed
    elapsed = time.monotonic() - started
    left = (
        f"; about {elapsed / finished * (todo - index) / 60:.0f} min left at "
        f"{elapsed / finished / 60:.1f} min a run"
        if finished
        else ""
    )
    failed = f", {len(outcome.failed)} failed" if outcome.failed else ""
    return (
        f"{name}: run {index + 1} of {todo} to do now; {done} of {outcome.total} done"
        f"{failed} (resumes where it stopped){left}"
    )


def check_data(runs: Iterable[Run]) -> None:
    """Fail before any run starts when the files of a run's data set are missing (the IDX data
    sets: every missing file and how to get it, :func:`app.sources.check_dataset_files`)."""
    seen: set[tuple[str, str]] = set()
    for r in runs:
        config = sweep.app_run_config(r.run_config)
        key = (str(config.get("dataset", "")), str(config.get("data-dir", "")))
        if key[0] and key not in seen:
            seen.add(key)
            check_dataset_files(key[0], key[1] or None)


def remove_experiment(spec: ExperimentSpec, results_root: Path) -> None:
    """Delete ``<results>/<name>/`` and the pool folders of its runs (``--fresh``)."""
    doomed = [Path(results_root) / spec.name]
    if spec.kind == "federated":
        doomed += [Path(results_root) / sweep.POOL_DIR / r.run_id for r in sweep.expand_runs(spec)]
    for folder in doomed:
        if folder.exists():
            logger.warning("removing %s (--fresh)", folder)
            shutil.rmtree(folder)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``corbin-fl experiment``."""
    parser = argparse.ArgumentParser(
        prog="corbin-fl experiment",
        description="Run CorBin-FL experiments described by TOML specs "
        "(experiments/quick/*.toml, experiments/paper/*.toml).",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, what in (
        ("run", "run what is not done yet, then write the outputs"),
        ("plan", "validate spec(s) and list the runs with their state"),
        ("report", "rebuild CSV, figures and report from saved results"),
    ):
        p = sub.add_parser(name, help=what)
        p.add_argument("spec", type=Path, nargs="+", help="experiment spec(s) (TOML)")
        p.add_argument("--results", type=Path, default=Path("results"), help="(./results)")
        p.add_argument("--app", type=Path, default=None, help="Flower app folder (default: repo)")
        if name == "run":
            p.add_argument("--fresh", action="store_true", help="delete previous results first")
            p.add_argument("--max-runs", type=int, default=None, help="execute at most N runs now")
            p.add_argument("--device", default="cpu", help="mse experiment: cpu, cuda or auto")
            p.add_argument("--no-progress", action="store_true", help="no live progress display")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``corbin-fl experiment`` (``argv`` without the ``experiment`` word); returns 0, 1 (failed
    runs), 2 (invalid spec or arguments) or 130 (interrupted)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse exits on --help (0) and on errors (2)
        return int(exc.code) if isinstance(exc.code, int) else 2
    if not logging.getLogger().handlers:
        handler = RichHandler(show_path=False, rich_tracebacks=False)
        level = logging.DEBUG if args.verbose else logging.INFO
        logging.basicConfig(level=level, format="%(message)s", handlers=[handler])
    console, out = Console(stderr=True), Console()
    try:
        if getattr(args, "max_runs", None) is not None and args.max_runs < 0:
            raise SpecError("--max-runs must be >= 0")
        code = 0
        for spec in [load_spec(p) for p in args.spec]:
            if args.command == "plan" and spec.kind == "mse":
                out.print(f"{spec.name}: mse experiment (no federated runs)")
                continue
            if args.command == "plan":
                planned = plan(spec, args.results)
                out.print(plan_counts(spec, planned), markup=False, soft_wrap=True)
                pool = Path(args.results) / sweep.POOL_DIR
                if (estimate := plan_estimate(spec, planned, pool)) is not None:
                    out.print(f"  {estimate}", markup=False, soft_wrap=True)
                for text in grid_ends(spec, planned, pool):
                    out.print(f"  at its grid's end: {text}", markup=False, soft_wrap=True)
                for r, state in planned:
                    out.print(f"  {state.value:8s} {r.run_id}", soft_wrap=True)
                continue
            if args.command == "report":
                outcome = Outcome()
                outcome.targets, outcome.report = finalize(spec, args.results)
            else:
                if args.fresh:
                    remove_experiment(spec, args.results)
                how: dict[str, Any] = {"app_dir": args.app, "max_runs": args.max_runs}
                how |= {"device": args.device, "progress": not args.no_progress, "console": console}
                outcome = run(spec, args.results, **how)
            _print(out, spec, outcome, runs=args.command == "run")
            if outcome.interrupted:
                return 130
            code = 1 if outcome.failed else code
        return code
    except (SpecError, ValueError, OSError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
    except KeyboardInterrupt:
        console.print("interrupted; run the same command again to resume")
        return 130


def _print(out: Console, spec: ExperimentSpec, outcome: Outcome, *, runs: bool) -> None:
    """What an invocation did to ``spec``: its runs (``runs``), its report and target checks."""
    out.print(f"[bold]{spec.name}[/bold]")
    if runs:
        interrupted = " (interrupted)" if outcome.interrupted else ""
        out.print(
            f"  runs: {outcome.total} planned, {outcome.skipped} already done, "
            f"{outcome.executed} executed, {len(outcome.failed)} failed{interrupted}",
            markup=False,
        )
    if outcome.report is not None:
        out.print(f"  report: {outcome.report}", markup=False)
    for t in outcome.targets:
        out.print(f"  [{t.status}] {t.name}: {t.detail}", markup=False)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
