"""``corbin-fl``: run the CorBin-FL Flower app on this machine.

``corbin-fl local`` deploys the app like production does, with real processes on loopback: one
``flower-superlink``, N ``flower-supernode`` s (``partition-id=i num-partitions=N``), then
``flwr run <repo> <connection> --stream``; it shows live progress (round, accuracy, clients,
drops) from the ServerApp's ``events.jsonl``/``metrics.jsonl``, prints a summary table and stops
every process it started. ``corbin-fl simulate`` runs the same app on Flower's simulation runtime.

Exit codes: 0 the run completed, 1 the run failed (see ``<out>/logs/``), 2 bad arguments,
130 interrupted.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Final

from rich.console import Console, Group
from rich.live import Live
from rich.logging import RichHandler
from rich.table import Table
from rich.text import Text

from corbin_fl.launcher import (
    KillSpec,
    LocalRunOptions,
    RunProgress,
    RunResult,
    parse_config_string,
    run_local,
    run_simulation,
)

logger = logging.getLogger(__name__)

DEFAULT_CLIENTS: Final[int] = 4
DEFAULT_ROUNDS: Final[int] = 3
DEFAULT_MECHANISM: Final[str] = "corbin"
DEFAULT_RANGE_MODE: Final[str] = "update"
"""What ``local`` / ``simulate`` quantize unless told otherwise: the update around the global
model (the app's own default, for ``flwr run``, is the paper's layer range; see
docs/results/quick/range/report.md for the comparison on validation data)."""
EXIT_OK: Final[int] = 0
EXIT_FAILED: Final[int] = 1
EXIT_USAGE: Final[int] = 2
EXIT_INTERRUPTED: Final[int] = 130


def repo_root() -> Path:
    """The folder of this project's Flower app (the repository root, next to ``corbin_fl/``)."""
    return Path(__file__).resolve().parent.parent


# ====================================================================== arguments
def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text}")
    return value


def _kill_spec(text: str) -> KillSpec:
    try:
        return KillSpec.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _config_string(text: str) -> dict[str, Any]:
    try:
        return parse_config_string(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--clients",
        type=_positive_int,
        default=DEFAULT_CLIENTS,
        help=f"number of clients (SuperNodes) (default: {DEFAULT_CLIENTS})",
    )
    parser.add_argument(
        "--rounds",
        type=_positive_int,
        default=None,
        help=f"communication rounds, run config num-rounds (default: {DEFAULT_ROUNDS})",
    )
    parser.add_argument(
        "--mechanism",
        default=None,
        help=f"mechanism, run config mechanism (default: {DEFAULT_MECHANISM})",
    )
    parser.add_argument(
        "--epsilon", type=_positive_float, default=None, help="per-parameter budget eps_p"
    )
    parser.add_argument(
        "--d", type=_positive_int, default=None, help="shared random bits per parameter"
    )
    parser.add_argument(
        "--cr-mode",
        default=None,
        help="common-randomness mode: relay (2 round trips) or derived (1 round trip)",
    )
    parser.add_argument(
        "--range-mode",
        choices=("layer", "update"),
        default=None,
        help="quantize the update w_i - w_g in [-R, R] (update) or the weights in the layer "
        f"range of the global model (layer, the paper) (default: {DEFAULT_RANGE_MODE})",
    )
    parser.add_argument("--model", default=None, help="model: cnn (MNIST) or resnet18 (CIFAR-10)")
    parser.add_argument("--dataset", default=None, help="dataset: mnist (embedded) or cifar10")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output folder (default: runs/<timestamp> in the current folder)",
    )
    parser.add_argument(
        "--run-config",
        type=_config_string,
        action="append",
        default=[],
        metavar='"k=v k2=v2"',
        help="extra run-config overrides (TOML values, strings quoted) or a .toml file; "
        "repeatable; the flags above win over these",
    )
    parser.add_argument(
        "--timeout",
        type=_positive_float,
        default=1800.0,
        help="seconds the whole run (all rounds) may take once submitted; start-up has "
        "--ready-timeout (default: 1800)",
    )
    parser.add_argument(
        "--ready-timeout",
        type=_positive_float,
        default=120.0,
        help="seconds to wait for the SuperLink and SuperNodes to be up (default: 120)",
    )
    parser.add_argument(
        "--app",
        type=Path,
        default=None,
        help="Flower app folder (default: this repository)",
    )
    parser.add_argument("--quiet", "-q", action="store_true", help="no live progress, no tables")
    parser.add_argument(
        "--keep-logs",
        action="store_true",
        help="keep the process logs in <out>/logs/ after a successful run "
        "(they are always kept after a failure)",
    )
    parser.add_argument("--verbose", "-v", action="store_true", help="log what the launcher does")


def build_parser() -> argparse.ArgumentParser:
    """The ``corbin-fl`` argument parser (subcommands ``local`` and ``simulate``)."""
    parser = argparse.ArgumentParser(
        prog="corbin-fl",
        description="Run the CorBin-FL Flower app on this machine.",
    )
    sub = parser.add_subparsers(dest="command", metavar="{local,simulate,experiment}")
    local = sub.add_parser(
        "local",
        help="real SuperLink + SuperNode processes on loopback, then `flwr run`",
        description="Deploy the app on loopback: one SuperLink, N SuperNodes, `flwr run`.",
    )
    _add_common(local)
    local.add_argument(
        "--kill-client",
        type=_kill_spec,
        action="append",
        default=[],
        metavar="PARTITION@ROUND",
        help="SIGKILL the SuperNode of PARTITION (and its children) during ROUND; repeatable",
    )
    local.add_argument(
        "--kill-delay",
        type=_non_negative_float,
        default=1.0,
        help="seconds after the round_start event before a --kill-client fires (default: 1)",
    )
    local.add_argument(
        "--node-config",
        type=_config_string,
        action="append",
        default=[],
        metavar='"k=v"',
        help="extra node config for every SuperNode (partition-id/num-partitions are set)",
    )
    sim = sub.add_parser(
        "simulate",
        help="Flower's simulation runtime (Ray): virtual SuperNodes in one process tree",
        description="Run the app on Flower's simulation runtime with N virtual SuperNodes.",
    )
    _add_common(sim)
    sim.add_argument(
        "--federation-config",
        type=_config_string,
        action="append",
        default=[],
        metavar='"k=v"',
        help='extra federation config, e.g. "client-resources-num-cpus=1"',
    )
    return parser


def merge_run_config(args: argparse.Namespace, *, this_app: bool = True) -> dict[str, Any]:
    """Defaults < ``--run-config`` (in order) < explicit flags.

    ``this_app``: whether the app is this repository's (only then is ``range-mode`` defaulted to
    :data:`DEFAULT_RANGE_MODE`; another app need not declare the key).

    Returns
    -------
    dict[str, Any]
        Kebab-case run-config overrides (without ``out-dir``; the launcher sets it).
    """
    merged: dict[str, Any] = {"num-rounds": DEFAULT_ROUNDS, "mechanism": DEFAULT_MECHANISM}
    if this_app:
        merged["range-mode"] = DEFAULT_RANGE_MODE
    for extra in args.run_config:
        merged.update(extra)
    flags = {
        "num-rounds": args.rounds,
        "mechanism": args.mechanism,
        "epsilon": args.epsilon,
        "d": args.d,
        "cr-mode": args.cr_mode,
        "range-mode": args.range_mode,
        "model": args.model,
        "dataset": args.dataset,
    }
    merged.update({k: v for k, v in flags.items() if v is not None})
    merged.pop("out-dir", None)
    return merged


def validate_run_config(app_dir: Path, run_config: Mapping[str, Any]) -> None:
    """Check the overrides with the app's own :class:`corbin_fl.config.RunConfig` (this app only).

    Fails before any process starts instead of in the ServerApp.

    Raises
    ------
    ValueError
        If a key is unknown or a value is invalid.
    """
    if app_dir.resolve() != repo_root():
        return  # another app: Flower itself validates its keys
    try:
        from corbin_fl.config import RunConfig
    except ImportError:  # pragma: no cover - the package ships config.py
        return
    RunConfig.from_flower({**run_config, "out-dir": "/validate"})


def default_out_dir() -> Path:
    """``runs/<YYYYmmdd-HHMMSS>`` in the current folder (a suffix keeps it unique)."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path.cwd() / "runs" / stamp
    out, n = base, 1
    while out.exists():
        n += 1
        out = base.with_name(f"{stamp}-{n}")
    return out


def options_from_args(args: argparse.Namespace) -> LocalRunOptions:
    """Turn parsed arguments into :class:`LocalRunOptions` (validated).

    Raises
    ------
    ValueError
        On an invalid combination (unknown run-config key, kill of a missing partition, ...).
    """
    app_dir = (args.app or repo_root()).expanduser().resolve()
    run_config = merge_run_config(args, this_app=app_dir == repo_root())
    validate_run_config(app_dir, run_config)
    node_config: dict[str, Any] = {}
    for extra in getattr(args, "node_config", []):
        node_config.update(extra)
    for reserved in ("partition-id", "num-partitions"):
        if reserved in node_config:
            raise ValueError(f"--node-config must not set {reserved} (the launcher sets it)")
    federation_config: dict[str, Any] = {}
    for extra in getattr(args, "federation_config", []):
        federation_config.update(extra)
    options = LocalRunOptions(
        app_dir=app_dir,
        out_dir=(args.out or default_out_dir()).expanduser().resolve(),
        num_clients=args.clients,
        run_config=run_config,
        kills=tuple(getattr(args, "kill_client", ())),
        kill_delay=getattr(args, "kill_delay", 1.0),
        timeout=args.timeout,
        ready_timeout=args.ready_timeout,
        keep_logs=args.keep_logs,
        node_config=node_config,
        federation_config=federation_config,
    )
    options.validate(simulation=args.command == "simulate")
    return options


# ====================================================================== display
def _fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 1e4 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, dict):
        return ", ".join(f"{k}:{v}" for k, v in value.items()) or "-"
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "-"
    return str(value)


def _human_bytes(value: Any) -> str:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return "-"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:,.0f} {unit}" if unit == "B" else f"{size:,.1f} {unit}"
        size /= 1024
    return "-"  # pragma: no cover


def total_bytes(value: Any) -> float | None:
    """Bytes of a ``metrics.jsonl`` field: a number, or a per-stage dict with a ``total``."""
    if isinstance(value, Mapping):
        value = value.get("total", sum(v for v in value.values() if isinstance(v, int | float)))
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def rounds_table(metrics: Sequence[Mapping[str, Any]], title: str = "Rounds") -> Table:
    """One row per ``metrics.jsonl`` record."""
    table = Table(title=title, title_justify="left")
    for col in (
        "round",
        "test acc",
        "val acc",
        "test loss",
        "clients",
        "dropped",
        "round trips",
        "up/client",
        "seconds",
    ):
        table.add_column(col, justify="left" if col == "dropped" else "right")
    for row in metrics:
        participants = row.get("participants")
        n = participants if isinstance(participants, int) else None
        if isinstance(participants, list):
            n = len(participants)
        up = total_bytes(row.get("bytes_up"))
        per_client = up / n if up is not None and n else None
        dropped = row.get("dropped") or {}
        table.add_row(
            _fmt(row.get("round")),
            _fmt(row.get("test_accuracy")),
            _fmt(row.get("val_accuracy")),
            _fmt(row.get("test_loss")),
            _fmt(n),
            _fmt(dropped) if dropped else "-",
            _fmt(row.get("round_trips")),
            _human_bytes(per_client),
            _fmt(row.get("round_seconds"), 3),
        )
    return table


def _flatten_summary(obj: Mapping[str, Any], prefix: str = "", depth: int = 0) -> list[tuple]:
    rows: list[tuple[str, str]] = []
    for key, value in obj.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            if depth < 2:
                rows.extend(_flatten_summary(value, name, depth + 1))
        elif isinstance(value, list):
            if value and all(not isinstance(v, Mapping | list) for v in value) and len(value) <= 8:
                rows.append((name, _fmt(value)))
        else:
            rows.append((name, _fmt(value)))
    return rows


def summary_table(summary: Mapping[str, Any]) -> Table:
    """Key figures of ``summary.json`` (scalars, nested tables flattened, run config omitted)."""
    table = Table(title="Summary", title_justify="left", show_header=False)
    table.add_column("key", style="bold")
    table.add_column("value")
    skip = {"run_config", "run-config", "config", "rounds", "metrics"}
    for name, value in _flatten_summary({k: v for k, v in summary.items() if k not in skip}):
        table.add_row(name, value)
    return table


class ProgressView:
    """Live progress with rich: status line, finished rounds, injected faults."""

    def __init__(self, console: Console, num_clients: int) -> None:
        self.console = console
        self.num_clients = num_clients
        self.live: Live | None = None
        self._printed_rounds = 0
        self._printed_kills = 0

    def __enter__(self) -> ProgressView:
        if self.console.is_terminal:
            self.live = Live(console=self.console, refresh_per_second=4, transient=True)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(None, None, None)
            self.live = None

    def status_line(self, state: RunProgress) -> Text:
        """One line: elapsed, phase, run id, round, last stage, nodes, accuracy, kills."""
        total = state.num_rounds if state.num_rounds is not None else "?"
        text = Text()
        text.append(f"[{state.elapsed:6.1f}s] ", style="dim")
        text.append(f"{state.phase}", style="bold cyan")
        if state.run_id is not None:
            text.append(f"  run {state.run_id}")
        text.append(f"  round {state.current_round}/{total}")
        if state.last_stage:
            text.append(f"  last stage {state.last_stage}")
        text.append(f"  nodes {len(state.node_ids) or self.num_clients}")
        if state.metrics:
            last = state.metrics[-1]
            text.append(f"  acc {_fmt(last.get('test_accuracy'))}", style="green")
        if state.killed:
            killed = ", ".join(f"{k.partition}@{k.round}" for k in state.killed)
            text.append(f"  killed {killed}", style="red")
        return text

    def __call__(self, state: RunProgress) -> None:
        """Redraw (terminal) or print what is new (pipe); the launcher calls it ~4x a second."""
        if self.live is not None:
            parts: list[Any] = [self.status_line(state)]
            if state.metrics:
                parts.append(rounds_table(state.metrics[-10:]))
            self.live.update(Group(*parts), refresh=True)
            return
        # Not a terminal (CI, pipes): one line per finished round and per fault.
        while self._printed_kills < len(state.killed):
            kill = state.killed[self._printed_kills]
            self._printed_kills += 1
            self.console.print(
                f"killed SuperNode of partition {kill.partition} (pid {kill.pid}) "
                f"in round {kill.round}"
            )
        while self._printed_rounds < len(state.metrics):
            row = state.metrics[self._printed_rounds]
            self._printed_rounds += 1
            dropped = row.get("dropped") or {}
            self.console.print(
                f"round {row.get('round')}: test acc {_fmt(row.get('test_accuracy'))}, "
                f"clients {_fmt(row.get('participants'))}, dropped {_fmt(dropped)}, "
                f"{_fmt(row.get('round_seconds'), 3)} s"
            )


def print_report(console: Console, result: RunResult) -> None:
    """Final tables: rounds, summary (privacy report), faults, outcome."""
    if result.metrics:
        console.print(rounds_table(result.metrics))
    if result.summary:
        console.print(summary_table(result.summary))
    for kill in result.killed:
        console.print(
            f"[red]killed[/red] SuperNode partition {kill.partition} (node {kill.node_id}) "
            f"in round {kill.round}"
        )
    style = "bold green" if result.ok else "bold red"
    console.print(
        Text(
            f"{'OK' if result.ok else 'FAILED'}: {result.reason} "
            f"({result.wall_seconds:.1f} s, out {result.out_dir})",
            style=style,
        )
    )
    if result.logs_dir is not None:
        console.print(f"process logs: {result.logs_dir}")


# ====================================================================== entry point
def _configure_logging(verbose: bool, console: Console) -> None:
    level = logging.INFO if verbose else logging.WARNING
    handler = RichHandler(console=console, show_path=False, rich_tracebacks=False)
    logging.basicConfig(level=level, handlers=[handler], format="%(message)s", force=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Console script ``corbin-fl``; returns the exit code (see module docstring).

    ``corbin-fl experiment ...`` is handed whole to :func:`corbin_fl.experiments.cli.main`
    (TOML-driven sweeps; it has its own sub-commands and ``--help``).
    """
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["experiment"]:
        from corbin_fl.experiments.cli import main as experiment_main

        return experiment_main(words[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    console = Console(stderr=False, highlight=False)
    err_console = Console(stderr=True, highlight=False)
    _configure_logging(args.verbose, err_console)
    try:
        options = options_from_args(args)
    except (ValueError, TypeError) as exc:
        err_console.print(f"corbin-fl {args.command}: error: {exc}")
        return EXIT_USAGE
    runner = run_simulation if args.command == "simulate" else run_local
    if not args.quiet:
        console.print(
            f"corbin-fl {args.command}: {options.num_clients} clients, "
            f"{options.run_config.get('num-rounds')} rounds, "
            f"{options.run_config.get('mechanism')}, out {options.out_dir}"
        )
    t0 = time.monotonic()
    try:
        if args.quiet:
            result = runner(options)
        else:
            with ProgressView(console, options.num_clients) as view:
                result = runner(options, progress=view)
    except KeyboardInterrupt:
        err_console.print(
            f"interrupted after {time.monotonic() - t0:.1f} s; every process was stopped; "
            f"logs in {options.out_dir / 'logs'}"
        )
        return EXIT_INTERRUPTED
    if args.quiet:
        if not result.ok:
            err_console.print(f"FAILED: {result.reason} (logs: {result.logs_dir})")
    else:
        print_report(console, result)
    return result.exit_code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
