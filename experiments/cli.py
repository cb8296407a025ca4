"""``corbin-fl experiment run|plan|report SPEC...``: run TOML-described experiments (a run
already done is skipped, so the same command resumes), list their runs, or rebuild their
outputs. Exit codes: 0 (target checks are reported, never enforced), 1 some runs failed, 2
invalid spec or arguments, 130 interrupted.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from corbin_fl.experiments.spec import SpecError, load_spec

logger = logging.getLogger(__name__)


def build_parser(prog: str = "corbin-fl experiment") -> argparse.ArgumentParser:
    """The argument parser of ``corbin-fl experiment``."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run CorBin-FL experiments described by TOML specs "
        "(experiments/quick/*.toml, experiments/paper/*.toml).",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("spec", type=Path, nargs="+", help="experiment spec(s) (TOML)")
        p.add_argument("--results", type=Path, default=Path("results"), help="(./results)")
        p.add_argument("--app", type=Path, default=None, help="Flower app folder (default: repo)")

    run = sub.add_parser("run", help="run what is not done yet, then write the outputs")
    common(run)
    run.add_argument("--fresh", action="store_true", help="delete previous results first")
    run.add_argument("--max-runs", type=int, default=None, help="execute at most N runs now")
    run.add_argument("--device", default="cpu", help="mse experiment: cpu, cuda or auto")
    run.add_argument("--no-progress", action="store_true", help="no live progress display")

    common(sub.add_parser("plan", help="validate spec(s) and list the runs with their state"))
    common(sub.add_parser("report", help="rebuild CSV, figures and report from saved results"))
    return parser


def _configure_logging(verbose: bool) -> None:
    root = logging.getLogger()
    if root.handlers:
        return
    from rich.logging import RichHandler

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(message)s",
        handlers=[RichHandler(show_path=False, rich_tracebacks=False)],
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``corbin-fl experiment`` (``argv`` without the ``experiment`` word); returns 0, 1 (failed
    runs), 2 (invalid spec or arguments) or 130 (interrupted)."""
    parser = build_parser()
    try:
        args = parser.parse_args(list(argv) if argv is not None else None)
    except SystemExit as exc:  # argparse exits on --help (0) and on errors (2)
        return int(exc.code) if isinstance(exc.code, int) else 2
    _configure_logging(args.verbose)
    from rich.console import Console

    console = Console(stderr=True)
    out = Console()
    try:
        specs = [load_spec(p) for p in args.spec]
    except (SpecError, OSError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2

    from corbin_fl.experiments import experiment as ex
    from corbin_fl.experiments.sweep import RunState

    if args.command == "plan":
        for spec in specs:
            if spec.kind == "mse":
                out.print(f"{spec.name}: mse experiment (no federated runs)")
                continue
            try:
                planned = ex.plan(spec, args.results)
            except SpecError as exc:
                console.print(f"[red]error:[/red] {exc}")
                return 2
            counts = {s: sum(1 for _, st in planned if st is s) for s in RunState}
            out.print(
                f"[bold]{spec.name}[/bold]: {len(planned)} runs "
                f"({counts[RunState.DONE]} done, {counts[RunState.PARTIAL]} partial, "
                f"{counts[RunState.MISSING]} to do)"
            )
            for run, state in planned:
                out.print(f"  {state.value:8s} {run.run_id}", soft_wrap=True)
        return 0

    if args.command == "report":
        for spec in specs:
            finalize = ex.finalize_mse if spec.kind == "mse" else ex.finalize_federated
            targets, report = finalize(spec, args.results)
            out.print(f"{spec.name}: report {report}")
            for t in targets:
                out.print(f"  [{t.status}] {t.name}: {t.detail}")
        return 0

    if args.max_runs is not None and args.max_runs < 0:
        console.print("[red]error:[/red] --max-runs must be >= 0")
        return 2
    code = 0
    for spec in specs:
        if args.fresh:
            ex.remove_experiment(spec, args.results)
        try:
            view = {"progress": not args.no_progress, "console": console}
            outcome = (
                ex.run_mse(spec, args.results, device=args.device, **view)  # type: ignore[arg-type]
                if spec.kind == "mse"
                else ex.run_federated(
                    spec,
                    args.results,
                    app_dir=args.app,
                    max_runs=args.max_runs,
                    **view,  # type: ignore[arg-type]
                )
            )
        except (SpecError, ValueError, FileNotFoundError) as exc:
            console.print(f"[red]error:[/red] {exc}")
            return 2
        except KeyboardInterrupt:
            console.print("interrupted; run the same command again to resume")
            return 130
        out.print(f"[bold]{spec.name}[/bold]")
        for line in ex.summary_lines(outcome):
            out.print(f"  {line}", markup=False)
        if outcome.interrupted:
            return 130
        if outcome.failed:
            code = 1
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
