"""``corbin-fl``: run the CorBin-FL Flower app on this machine.

``corbin-fl local`` deploys the app like production does, with real processes on loopback: one
``flower-superlink``, N ``flower-supernode`` s (``partition-id=i num-partitions=N``), then
``flwr run <repo> <connection> --stream``; it shows live progress (round, accuracy, clients,
drops) from the ServerApp's ``events.jsonl``/``metrics.jsonl``, prints a summary table and stops
every process it started. ``corbin-fl simulate`` runs the same app on Flower's simulation runtime.

Exit codes: 0 the run completed, 1 the run failed (see ``<out>/logs/``), 2 bad arguments
(an impossible setting, a missing extra, or a Flower of another release than the one CorBin-FL
runs on, in this environment or in the app's requirement: found before anything starts,
:mod:`corbin_fl.flower_version`), 130 interrupted
(SIGINT, SIGTERM or SIGHUP; also when SIGINT was inherited ignored, as by ``corbin-fl local &``
in a script).

Every usage error is one line, ``corbin-fl <command>: error: <cause>``, and one hint,
``see corbin-fl <command> --help``, on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import re
import signal
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Final, NoReturn, TypeGuard

from rich import box
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.live import Live
from rich.logging import RichHandler
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from corbin_fl import registry
from corbin_fl.app.config import AppConfig
from corbin_fl.app.sources import check_dataset_files, dataset_title
from corbin_fl.app.task import DATASETS_NEEDING_DIR, DATASETS_WITH_DEFAULT_DIR, LEAF_DATASETS
from corbin_fl.deploy.flower import app_config, check_flower_versions, parse_config_string
from corbin_fl.deploy.follow import RunProgress, RunResult
from corbin_fl.deploy.pace import PACE_FACTOR, PACE_SLACK_S
from corbin_fl.deploy.processes import LauncherError
from corbin_fl.deploy.run import KillSpec, LocalRunOptions, run_local, run_simulation
from corbin_fl.flower_version import FlowerVersionError
from corbin_fl.mechanisms.protection import per_parameter_text, protection

logger = logging.getLogger(__name__)

DEFAULT_CLIENTS: Final[int] = 4
"""SuperNodes (or virtual SuperNodes) that ``local`` / ``simulate`` start unless told otherwise.
Every run-config default is the app's own (``[tool.flwr.app.config]``), never this command's."""
EXIT_OK: Final[int] = 0
EXIT_FAILED: Final[int] = 1
EXIT_USAGE: Final[int] = 2
EXIT_INTERRUPTED: Final[int] = 130


def repo_root() -> Path:
    """The folder of this project's Flower app (the repository root, next to ``corbin_fl/``)."""
    return Path(__file__).resolve().parent.parent


# ====================================================================== arguments
def usage_hint(prog: str) -> str:
    """The one line every usage error ends with."""
    return f"see {prog} --help"


def usage_error(prog: str, cause: object) -> str:
    """``<prog>: error: <cause>`` and :func:`usage_hint`, the one style of every usage error."""
    return f"{prog}: error: {cause}\n{usage_hint(prog)}\n"


class CliParser(argparse.ArgumentParser):
    """An :class:`argparse.ArgumentParser` whose errors are :func:`usage_error` (cause and
    hint), not the whole usage block, so they read like the run-config errors."""

    def error(self, message: str) -> NoReturn:
        """Print :func:`usage_error` to stderr and exit with :data:`EXIT_USAGE`."""
        self.exit(EXIT_USAGE, usage_error(self.prog, message))

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        """As argparse's, but an unknown argument is reported by the sub-command's parser
        (``corbin-fl local: error: unrecognized arguments: ...``), whose ``--help`` lists
        the arguments it takes."""
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            owner = getattr(parsed, "_cli_parser", self)
            owner.error(f"unrecognized arguments: {' '.join(extra)}")
        return parsed


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _shared_bits(text: str) -> int:
    """``--d``: shared random bits per parameter, ``d >= 1`` (``d = 0`` is LDP-FL)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value == 0:
        alone = registry.without_common_randomness()
        raise argparse.ArgumentTypeError(
            f"d = 0 means no common randomness, which is {alone.title}: use --mechanism "
            f"{alone.name} (d >= 1 shared random bits per parameter for "
            f"{'/'.join(registry.pairing())})"
        )
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
    """The options of ``local`` and ``simulate``: the run's protocol settings, its task, and
    the launch itself (in this order in ``--help``)."""
    app = AppConfig.defaults()  # the app's defaults: the help shows them, the flags add none
    _add_protocol_options(parser, app)
    _add_task_options(parser, app)
    _add_launch_options(parser)


def _add_protocol_options(parser: argparse.ArgumentParser, app: Mapping[str, Any]) -> None:
    """Clients, rounds and the mechanism's settings (each a run-config key; the help shows the
    app's default ``app``)."""
    alone = registry.without_common_randomness()
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
        help=f"communication rounds, run config num-rounds (default: {app['num-rounds']})",
    )
    parser.add_argument(
        "--mechanism",
        default=None,
        help=f"mechanism, run config mechanism (default: {app['mechanism']})",
    )
    parser.add_argument(
        "--epsilon", type=_positive_float, default=None, help="per-parameter budget eps_p"
    )
    parser.add_argument(
        "--d",
        type=_shared_bits,
        default=None,
        help=f"shared random bits per parameter, 1..16 (d = 0 is {alone.title}: --mechanism "
        f"{alone.name})",
    )
    parser.add_argument(
        "--cr-mode",
        default=None,
        help="common-randomness mode, run config cr-mode: relay (pipelined: 1 round trip per "
        "steady round), derived (1) or exact (2: a pair stage every round); round 1 adds a "
        f"keygen stage, and a pair stage in relay and exact (default: {app['cr-mode']})",
    )
    parser.add_argument(
        "--range-mode",
        choices=("layer", "update"),
        default=None,
        help="quantize the update w_i - w_g in [-R, R] (update) or the weights in the layer "
        f"range of the global model (layer, the paper) (default: {app['range-mode']})",
    )


def _add_task_options(parser: argparse.ArgumentParser, app: Mapping[str, Any]) -> None:
    """This app's task: its model and data set (run-config keys ``model``, ``dataset``)."""
    parser.add_argument(
        "--model",
        default=None,
        help="model: cnn (MNIST, FEMNIST), resnet18 (CIFAR-10) or char-lstm (Shakespeare)",
    )
    parser.add_argument(
        "--dataset",
        default=None,
        help="dataset: mnist (5,000 digits embedded), fashion-mnist (IDX files; data-dir "
        "default /usr/share/datasets/fashion-mnist: apt-get install dataset-fashion-mnist), "
        "mnist-idx (your own IDX files in MNIST's format, in data-dir), cifar10 (python "
        "batches, in data-dir), femnist or shakespeare (data-dir or the hub), hf:<hub-id> "
        f"(default: {app['dataset']})",
    )


def _add_launch_options(parser: argparse.ArgumentParser) -> None:
    """The launch: output folder, extra run config, time limits, app folder, display, logs."""
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
        default=None,
        help="seconds the whole run (all rounds) may take once submitted; start-up has "
        "--ready-timeout (default: none fixed: once a round has ended, the rounds left may "
        f"take {PACE_FACTOR:g} x the slowest round each, plus {PACE_SLACK_S:g} s; before that, "
        "the run's stage timeouts)",
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
    parser = CliParser(
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
    local.set_defaults(_cli_parser=local)
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
    sim.set_defaults(_cli_parser=sim)
    sim.add_argument(
        "--federation-config",
        type=_config_string,
        action="append",
        default=[],
        metavar='"k=v"',
        help='extra federation config, e.g. "client-resources-num-cpus=1"',
    )
    return parser


def merge_run_config(args: argparse.Namespace) -> dict[str, Any]:
    """``--run-config`` (in order) < explicit flags, on top of the app's own defaults.

    The app's defaults (``[tool.flwr.app.config]`` in its ``pyproject.toml``) are the only
    defaults: this command adds none of its own, so ``corbin-fl local``, ``flwr run .``, the
    compose files and the simulation runtime all run the same configuration.

    Returns
    -------
    dict[str, Any]
        Kebab-case run-config overrides (without ``out-dir``; the launcher sets it).
    """
    merged: dict[str, Any] = {}
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
    """Check the overrides with the app's own config, :class:`corbin_fl.app.config.AppConfig`.

    Fails before any process starts instead of in the ServerApp. Beyond
    :meth:`~corbin_fl.app.config.AppConfig.from_flower` (which also refuses ``cifar10`` /
    ``mnist-idx`` without ``data-dir``), this machine runs every node, so ``data-dir`` must be a
    folder here, and a ``data-dir`` that the dataset would not read is refused rather than
    silently ignored.

    Raises
    ------
    ValueError
        If a key is unknown or a value is invalid, naming the key and the fix.
    """
    if app_dir.resolve() != repo_root():
        return  # another app: Flower itself validates its keys
    cfg = AppConfig.from_flower({**run_config, "out-dir": "/validate"})
    readers = (
        f"{', '.join(DATASETS_WITH_DEFAULT_DIR)}, {', '.join(DATASETS_NEEDING_DIR)}, "
        f"{', '.join(LEAF_DATASETS)} (a local copy of the hub files) and hf:<hub-id> (as its "
        "download cache)"
    )
    if cfg.dataset in DATASETS_WITH_DEFAULT_DIR and run_config.get("use-official-test") is False:
        raise ValueError(
            f'dataset "{cfg.dataset}" is tested on its official test split, as its literature '
            "is: remove use-official-test = false"
        )
    if cfg.dataset in DATASETS_WITH_DEFAULT_DIR:  # every missing file, before anything starts
        check_dataset_files(cfg.dataset, cfg.data_dir or None)
    reads_dir = (
        cfg.dataset in DATASETS_NEEDING_DIR
        or cfg.dataset in LEAF_DATASETS
        or cfg.dataset in DATASETS_WITH_DEFAULT_DIR
    )
    if cfg.data_dir and not reads_dir and ":" not in cfg.dataset:
        raise ValueError(
            f'data-dir = "{cfg.data_dir}" would be ignored: dataset "{cfg.dataset}" is embedded '
            f"in the package and reads no folder; remove data-dir, or choose a dataset that "
            f"reads it: {readers}"
        )
    leaf_dir = cfg.dataset in LEAF_DATASETS and cfg.data_dir
    if leaf_dir and not Path(cfg.data_dir).expanduser().is_dir():
        raise ValueError(
            f'data-dir "{cfg.data_dir}" of dataset "{cfg.dataset}" is not a folder on this '
            "machine: give a local copy of the hub files, or leave data-dir empty to load them "
            "from the hub"
        )
    if cfg.dataset in DATASETS_NEEDING_DIR and not Path(cfg.data_dir).expanduser().is_dir():
        raise ValueError(
            f'data-dir "{cfg.data_dir}" of dataset "{cfg.dataset}" is not a folder on this '
            f"machine: give the folder that holds {DATASETS_NEEDING_DIR[cfg.dataset]}"
        )
    if cfg.dataset == "mnist-idx":  # every missing file, before anything starts
        check_dataset_files(cfg.dataset, cfg.data_dir)


def data_label(app_dir: Path, run_config: Mapping[str, Any]) -> str:
    """The run's data set for the console header: this app's name for it and which split its
    test accuracy is measured on (``Fashion-MNIST (fashion-mnist; test: official split)``);
    another app's ``dataset`` value as given."""
    dataset = run_config.get("dataset", "?")
    if Path(app_dir).resolve() != repo_root():
        return f"dataset {dataset}"
    cfg = AppConfig.from_flower({k: v for k, v in run_config.items() if k != "out-dir"})
    split = "official split" if cfg.use_official_test else "pooled 80/20 split"
    return f"{dataset_title(cfg.dataset)} ({cfg.dataset}; test: {split})"


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
    run_config = merge_run_config(args)
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
        return f"{value:.{digits}g}" if abs(value) < 10**digits else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, dict):
        return ", ".join(f"{k}:{_item(v, digits)}" for k, v in value.items()) or "-"
    if isinstance(value, list):
        return ", ".join(_item(v, digits) for v in value) or "-"
    return str(value)


def _item(value: Any, digits: int = 4) -> str:
    """One element of a list or dict shown by :func:`_fmt`: a float to ``digits`` significant
    digits (``clip_fraction.per_round``), anything else as it is (node ids without commas)."""
    if isinstance(value, float):
        return _fmt(value, digits)
    return "-" if value is None else str(value)


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


def _node_count(value: Any) -> int | None:
    if isinstance(value, list):
        return len(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


def _drops(row: Mapping[str, Any]) -> dict[str, str]:
    """``{node id: reason}`` of a ``metrics.jsonl`` row (a list of ids has no reasons)."""
    dropped = row.get("dropped") or {}
    if isinstance(dropped, Mapping):
        return {str(k): str(v) for k, v in dropped.items()}
    if isinstance(dropped, list):
        return {str(k): "" for k in dropped}
    return {}


def _narrow_table(title: str, **kw: Any) -> Table:
    """A left-titled table with a rule under the header and no outer padding (80 columns)."""
    return Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
        **kw,
    )


def rounds_table(metrics: Sequence[Mapping[str, Any]], title: str = "Rounds") -> Table:
    """One row per ``metrics.jsonl`` record, narrow enough for an 80-column terminal.

    ``clients`` is ``participants/sampled`` (updates the server accepted / nodes it asked),
    ``drops`` the number of nodes dropped in the round (the reasons are in ``metrics.jsonl``
    and in :func:`drops_table`), ``up/client`` the uplink bytes per participant.
    """
    table = _narrow_table(title)
    for col in ("round", "test acc", "val acc", "loss", "clients", "drops", "trips"):
        table.add_column(col, justify="right", no_wrap=True)
    table.add_column("up/client", justify="right", no_wrap=True)
    table.add_column("s", justify="right", no_wrap=True)
    for row in metrics:
        n = _node_count(row.get("participants"))
        sampled = _node_count(row.get("sampled"))
        up = total_bytes(row.get("bytes_up"))
        per_client = up / n if up is not None and n else None
        table.add_row(
            _fmt(row.get("round")),
            _fmt(row.get("test_accuracy")),
            _fmt(row.get("val_accuracy")),
            _fmt(row.get("test_loss")),
            f"{_fmt(n)}/{sampled}" if sampled is not None else _fmt(n),
            str(len(_drops(row))),
            _fmt(row.get("round_trips")),
            _human_bytes(per_client),
            _fmt(row.get("round_seconds"), 3),
        )
    return table


def drops_table(metrics: Sequence[Mapping[str, Any]], title: str = "Drops") -> Table | None:
    """Every drop of the run, one line each (long reasons end in an ellipsis; the full text is
    in ``metrics.jsonl``); None if no node was dropped."""
    rows = [(row.get("round"), nid, why) for row in metrics for nid, why in _drops(row).items()]
    if not rows:
        return None
    table = _narrow_table(title, expand=True)
    table.add_column("round", justify="right", no_wrap=True, min_width=5)
    widest = max(len(str(nid)) for _, nid, _ in rows)
    table.add_column("node", justify="right", no_wrap=True, min_width=widest)
    table.add_column("reason", no_wrap=True, overflow="ellipsis", ratio=1)
    for rnd, nid, why in rows:
        table.add_row(_fmt(rnd), nid, why or "-")
    return table


def _flatten_summary(obj: Mapping[str, Any], prefix: str = "", depth: int = 0) -> list[tuple]:
    rows: list[tuple[str, str]] = []
    for key, value in obj.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            per_client = _per_client_text(value)
            if per_client is not None:
                rows.append((name, per_client))
            elif depth < 2:
                rows.extend(_flatten_summary(value, name, depth + 1))
        elif isinstance(value, list):
            if value and all(not isinstance(v, Mapping | list) for v in value) and len(value) <= 8:
                rows.append((name, _fmt(value)))
        else:
            rows.append((name, _fmt(value)))
    return rows


_NODE_ID = re.compile(r"-?\d+")


def _per_client_text(value: Mapping[Any, Any]) -> str | None:
    """One cell for a per-client mapping of ``summary.json`` (node id -> a scalar, e.g.
    ``client_devices`` or ``privacy_ledger.per_node``), or ``None`` if ``value`` is not one.

    Numbers are summarised as ``N clients: min a, median m, max b``; anything else as the count
    of each value, most frequent first (``N clients: cpu x47, cuda x3``). A row per client would
    make 100 rows at 50 clients, with node ids cut; ``summary.json`` keeps every client's value.
    """
    if not value or not all(_NODE_ID.fullmatch(str(k)) for k in value):
        return None
    items = list(value.values())
    if any(isinstance(v, Mapping | list) for v in items):
        return None
    n = len(items)
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in items):
        nums = sorted(float(v) for v in items)
        mid = nums[n // 2] if n % 2 else (nums[n // 2 - 1] + nums[n // 2]) / 2
        return f"{n} clients: min {_fmt(nums[0])}, median {_fmt(mid)}, max {_fmt(nums[-1])}"
    counts: dict[str, int] = {}
    for v in items:
        counts[_fmt(v)] = counts.get(_fmt(v), 0) + 1
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return f"{n} clients: " + ", ".join(f"{v} x{c}" for v, c in ranked)


def _is_privacy_report(value: Any) -> TypeGuard[Mapping[str, Any]]:
    """Whether ``value`` is a ``mechanisms.accounting.privacy_report`` (either layout)."""
    return isinstance(value, Mapping) and isinstance(value.get("mechanism"), str)


def summary_table(summary: Mapping[str, Any]) -> Table:
    """Key figures of ``summary.json`` (scalars, nested tables flattened, run config omitted).

    The privacy report is left to :func:`privacy_table` (one row per threat model); a
    ``privacy`` entry of another form is flattened like the rest.
    """
    table = Table(title="Summary", title_justify="left", show_header=False)
    table.add_column("key", style="bold")
    table.add_column("value")
    skip = {"run_config", "run-config", "config", "rounds", "metrics"}
    if _is_privacy_report(summary.get("privacy")):
        skip.add("privacy")
    for name, value in _flatten_summary({k: v for k, v in summary.items() if k not in skip}):
        table.add_row(name, value)
    return table


def _eps_delta_text(block: Any) -> str | None:
    """``(eps, delta)`` of a report block ``{"eps", "delta"}``, or ``None`` without one."""
    if not isinstance(block, Mapping) or block.get("eps") is None:
        return None
    return f"({_fmt(float(block['eps']))}, {float(block.get('delta') or 0.0):g})"


def privacy_table(report: Mapping[str, Any]) -> Table:
    """The run's privacy, one row per threat model, within 80 columns.

    Each row is an adversary of SECURITY.md (A: an eavesdropper on one uplink, B: the server,
    which sees every bit, C: a malicious client, D: a malicious server) and what the run's
    privacy report (``summary.json -> privacy -> threat_models``) guarantees against it:
    "no DP ..." when it gives none, else its headline and, for A, the exact ``(eps, delta)`` of
    one update and of all rounds.

    Parameters
    ----------
    report : Mapping
        ``summary.json -> privacy``.

    Returns
    -------
    rich.table.Table
        Columns ``""`` (the key), ``threat model``, ``guarantee``.
    """
    if not isinstance(report, Mapping):
        raise TypeError(f"a privacy report must be a mapping, got {type(report).__name__}")
    mech = str(report.get("mechanism", "?"))
    title = f"Privacy ({mech}"
    if report.get("eps_p") is not None:
        title += f", eps_p = {_fmt(report['eps_p'])}"
    title += ")"
    table = Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        show_edge=False,
        caption="details: summary.json -> privacy -> threat_models; SECURITY.md",
        caption_justify="left",
    )
    table.add_column("", style="bold", no_wrap=True)
    table.add_column("threat model", max_width=26)
    table.add_column("guarantee", max_width=46)
    if report.get("error"):
        table.add_row("!", "privacy report", Text(f"failed: {report['error']}", style="red"))
        return table
    models = report.get("threat_models")
    if not isinstance(models, Mapping):
        raise ValueError("privacy report has no threat_models")
    rounds = report.get("rounds")
    for key, entry in models.items():
        if not isinstance(entry, Mapping):
            continue
        cell = Text(str(entry.get("headline", "")), style="" if entry.get("dp") else "bold red")
        if entry.get("dp") and key == "A":
            for label, part in (("one update", "per_update"), (f"{rounds} rounds", "all_rounds")):
                block = entry.get(part)
                numbers = _eps_delta_text(block)
                if (
                    isinstance(block, Mapping)  # as numbers is not None
                    and numbers is not None
                    and not (part == "per_update" and block.get("k") == 1)
                ):
                    words = protection(float(block["eps"]))
                    cell.append(f"\n{label}: {numbers}" + (f", {words}" if words else ""))
        secure = bool(report.get("secure_aggregation"))  # B is then the sum, not A's figures
        pp = entry.get("per_parameter") if entry.get("dp") and key == "B" and secure else None
        if isinstance(pp, Mapping) and pp.get("eps") is not None:  # beside B's composed figure
            eps_p = report.get("eps_p")
            text = per_parameter_text(float(pp["eps"]), None if eps_p is None else float(eps_p))
            cell.append(f"\nper parameter: {text}, delta {float(pp.get('delta') or 0.0):g}")
        table.add_row(str(key), str(entry.get("name", "")), cell)
    return table


REASON_CHARS: Final[int] = 400
"""A drop reason in an event line is shown whole up to this many characters, on its own
lines under its round's result (wrapped to the console width); a longer one ends in an
ellipsis. ``metrics.jsonl`` keeps the whole reason."""

STATUS_DROP_LINES: Final[int] = 3
"""Console lines the live status gives the latest drop (wrapped; a longer one is cut)."""


def _clip(text: str, limit: int) -> str:
    """``text``, or its first ``limit - 1`` characters and an ellipsis."""
    return text if len(text) <= limit else text[: max(0, limit - 1)] + "…"


def _one_line(text: str, style: str | None = None) -> Text:
    """A line that never wraps: cut to the console width with an ellipsis."""
    return Text(text, style=style or "", no_wrap=True, overflow="ellipsis", end="\n")


def print_line(console: Console, line: RenderableType) -> None:
    """Print an event line: one made by :func:`_one_line` cut to the console width with its
    ellipsis (``console.print`` joins a :class:`~rich.text.Text` into its own and would wrap it,
    ``... in round`` / ``2``), anything else as it is."""
    if isinstance(line, Text) and line.no_wrap:
        console.print(line, highlight=False, no_wrap=True, overflow=line.overflow or "ellipsis")
    else:
        console.print(line, highlight=False)


def _wrapped(text: str, style: str | None = None, indent: int = 0) -> RenderableType:
    """``text`` wrapped at the console width (its continuation lines indented by ``indent``
    columns as well), never cut."""
    body = Text(text, style=style or "", no_wrap=False, overflow="fold", end="\n")
    return Padding(body, (0, 0, 0, indent)) if indent else body


class _LiveStatus:
    """The live status as a renderable that reads the run's state each time it is drawn.

    :class:`rich.live.Live` draws it about four times a second (so the elapsed time runs on
    while the launcher blocks in start-up, where nobody calls the view) and again under every
    line printed above it (so that status is never the one from before the line).
    """

    def __init__(self, view: ProgressView) -> None:
        self.view = view
        self._last: list[Text] = []

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        state = self.view.state
        if state is not None:
            try:
                self._last = self.view.status_lines(state)
            except Exception:  # drawn from rich's refresh thread: keep the last status
                logger.debug("live status not drawn", exc_info=True)
        yield from self._last


class ProgressView:
    """Live progress: one line per event when it happens, plus a status on a terminal.

    The events, from what the launcher follows (``events.jsonl``, ``metrics.jsonl``, its own
    kills): nodes online, run submitted, round started, node dropped (round, stage, node,
    partition), SuperNode killed, round done (test accuracy, clients, drops; under it each
    drop with its reason on its own line, wrapped, never cut below :data:`REASON_CHARS`),
    ServerApp error, stopping. On a terminal they are printed above a live status
    (:meth:`status_lines`) that is drawn from the current state every time it is shown: the
    elapsed time since the launcher started, the phase, and until the first round what the
    launcher waits for (``starting SuperNode 2/4``, ``waiting for 4 SuperNodes to register``,
    ``submitting the run``, ...); then the round of the last ``round_start`` event, the last
    stage of that round that ended, nodes, drop count, the accuracy of the last finished round,
    and the latest drop. Without a terminal (a log file, CI) the events are plain lines without
    control codes. No line is wider than the console: event lines end in an ellipsis, drop
    reasons wrap (the full reasons stay in ``metrics.jsonl``).

    ``nodes k/N``: ``N`` SuperNodes deployed, ``k`` the nodes the ServerApp still counts
    (:meth:`deploy.follow.RunProgress.active_nodes`: sampled in the last finished round,
    less the nodes dropped since).

    Parameters
    ----------
    console : Console
        Where the lines and the status go (the status only on a terminal).
    num_clients : int
        SuperNodes deployed (when the state does not say).
    auto_refresh : bool
        Redraw the status about four times a second on rich's thread (off: only when the
        launcher calls the view; for tests).
    """

    def __init__(self, console: Console, num_clients: int, *, auto_refresh: bool = True) -> None:
        self.console = console
        self.num_clients = num_clients
        self.auto_refresh = auto_refresh
        self.live: Live | None = None
        self.state: RunProgress | None = None
        """The state of the last call (what the live status shows)."""
        self._phase: str | None = None
        self._run_id_shown = False
        self._events = 0
        self._kills = 0
        self._rows = 0

    def __enter__(self) -> ProgressView:
        if self.console.is_terminal:
            self.live = Live(
                _LiveStatus(self),
                console=self.console,
                refresh_per_second=4,
                auto_refresh=self.auto_refresh,
                transient=True,
            )
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(None, None, None)
            self.live = None

    # ------------------------------------------------------------------ what is shown
    def _nodes(self, state: RunProgress) -> str:
        total = state.num_clients or self.num_clients
        active = state.active_nodes()
        return f"{'?' if active is None else active}/{total}"

    @staticmethod
    def _partition(state: RunProgress, node: object) -> int | None:
        """The partition of the SuperNode with node id ``node`` (None where not known)."""
        return {str(nid): part for part, nid in state.node_ids.items()}.get(str(node))

    def _partition_of(self, state: RunProgress, node: object) -> str:
        """`` (partition p)`` where known, else nothing."""
        part = self._partition(state, node)
        return "" if part is None else f" (partition {part})"

    def _short(self, state: RunProgress, node: object) -> str:
        """``partition p`` where the launcher knows the node's partition, else ``node <id>``."""
        part = self._partition(state, node)
        return f"node {node}" if part is None else f"partition {part}"

    def status_lines(self, state: RunProgress) -> list[Text]:
        """The live status, from ``state`` as it is now.

        First line: elapsed seconds and phase, then what the launcher waits for until the
        first round starts (:meth:`deploy.follow.RunProgress.waiting_for`), else ``round r/T``
        (the last ``round_start``), ``<stage> done`` (the last stage of that round that
        ended), nodes, drops and ``acc`` (the test accuracy of the last finished round). Then
        the latest drop with its reason, wrapped to at most :data:`STATUS_DROP_LINES` lines.
        """
        head = f"{state.elapsed:4.0f}s {state.phase}"
        waiting = state.waiting_for()
        if waiting is not None:
            return [_one_line(f"{head} · {waiting}", "bold")]
        total = state.num_rounds if state.num_rounds is not None else "?"
        parts = [head, f"round {state.current_round}/{total}"]
        if state.last_stage:
            parts.append(f"{state.last_stage} done")
        parts.append(f"nodes {self._nodes(state)}")
        parts.append(f"dropped {state.drop_count()}")
        if state.metrics:
            parts.append(f"acc {_fmt(state.accuracy)}")
        lines = [_one_line(" · ".join(parts), "bold")]  # kills: an event line each
        last = self._last_drop(state)
        if last:
            room = max(40, self.console.width * STATUS_DROP_LINES - 1)
            lines.append(Text(_clip(f"last drop: {last}", room), style="yellow", overflow="fold"))
        return lines

    def _last_drop(self, state: RunProgress) -> str | None:
        done = state.finished_round
        pending = [(r, st, n) for r, st, n in state.stage_drops if r > done]
        if pending:
            rnd, stage, node = pending[-1]
            return f"round {rnd}, node {node}{self._partition_of(state, node)}, stage {stage}"
        for row in reversed(state.metrics):
            drops = _drops(row)
            if drops:
                dropped, why = list(drops.items())[-1]
                where = (
                    f"round {row.get('round')}, node {dropped}{self._partition_of(state, dropped)}"
                )
                return f"{where}: {why}" if why else where
        return None

    def new_lines(self, state: RunProgress) -> list[RenderableType]:
        """The event lines not shown yet, in the order they happened (one call shows each
        event once)."""
        lines: list[RenderableType] = []
        total = state.num_rounds if state.num_rounds is not None else "?"
        if state.phase != self._phase:
            self._phase = state.phase
            if state.phase == "ready":
                n = len(state.node_ids)
                what = f"{n} SuperNodes online" if n else "simulation SuperLink up"
                lines.append(_one_line(f"ready: {what} ({state.elapsed:.0f} s)"))
            elif state.phase == "stopping":
                lines.append(_one_line("stopping every process", "dim"))
        if state.run_id is not None and not self._run_id_shown:
            self._run_id_shown = True
            lines.append(_one_line(f"run {state.run_id} submitted"))
        for ev in state.events[self._events :]:
            kind, rnd = ev.get("event"), ev.get("round")
            if kind == "round_start":
                lines.append(_one_line(f"round {rnd}/{total} started", "cyan"))
            elif kind == "stage_end":
                for node in ev.get("dropped") or []:
                    where = f"node {node}{self._partition_of(state, node)}"
                    text = f"round {rnd}: {where} dropped in stage {ev.get('stage')}"
                    lines.append(_one_line(text, "yellow"))
            elif kind == "round_end":  # its metrics.jsonl row is written just before it
                lines += self._row_lines(state, up_to=rnd)
            elif kind == "resume":
                lines.append(_one_line(f"resumed after round {ev.get('from_round')}"))
            elif kind == "run_end" and ev.get("error"):
                lines.append(_wrapped(f"ServerApp failed: {ev.get('error')}", "red", indent=0))
        self._events = len(state.events)
        lines += self._row_lines(state)  # rows read before their round_end event
        for kill in state.killed[self._kills :]:  # the launcher kills after reading the files
            node = "" if kill.node_id is None else f", node {kill.node_id}"
            text = (
                f"killed SuperNode of partition {kill.partition} (pid {kill.pid}{node}) "
                f"in round {kill.round}"
            )
            lines.append(_one_line(text, "red"))
        self._kills = len(state.killed)
        return lines

    def _row_lines(self, state: RunProgress, up_to: object = None) -> list[RenderableType]:
        """``round r/T done: ...`` for each ``metrics.jsonl`` row not shown yet (those of
        rounds ``<= up_to`` when given), each followed by its drops, one per line with the
        whole reason (wrapped, indented)."""
        lines: list[RenderableType] = []
        total = state.num_rounds if state.num_rounds is not None else "?"
        limit = up_to if isinstance(up_to, int) and not isinstance(up_to, bool) else None
        while self._rows < len(state.metrics):
            row = state.metrics[self._rows]
            rnd = row.get("round")
            if limit is not None and isinstance(rnd, int) and rnd > limit:
                break
            self._rows += 1
            n, sampled = _node_count(row.get("participants")), _node_count(row.get("sampled"))
            clients = f"{_fmt(n)}/{sampled}" if sampled is not None else _fmt(n)
            drops = _drops(row)
            text = (
                f"round {rnd}/{total} done: test acc {_fmt(row.get('test_accuracy'))}, "
                f"clients {clients}, dropped {len(drops)}, {_fmt(row.get('round_seconds'), 3)} s"
            )
            lines.append(_one_line(text, "green"))
            for node, why in drops.items():
                reason = f": {_clip(why, REASON_CHARS)}" if why else ""
                where = f"{self._short(state, node)}" + (
                    "" if self._partition(state, node) is None else f" (node {node})"
                )
                lines.append(_wrapped(f"dropped {where}{reason}", "yellow", indent=2))
        return lines

    def __call__(self, state: RunProgress) -> None:
        """Print the new event lines above the status (which is drawn from ``state`` under
        each of them); without ``auto_refresh``, redraw the status. The launcher calls it
        about four times a second, and at each step of start-up."""
        self.state = state
        for line in self.new_lines(state):
            print_line(self.console, line)
        if self.live is not None and not self.auto_refresh:
            self.live.refresh()


def print_report(console: Console, result: RunResult) -> None:
    """Final tables: rounds, summary, privacy per threat model, faults, outcome."""
    if result.metrics:
        console.print(rounds_table(result.metrics))
    if result.summary:
        console.print(summary_table(result.summary))
        privacy = result.summary.get("privacy")
        if _is_privacy_report(privacy):
            try:
                console.print(privacy_table(privacy))
            except (TypeError, ValueError) as exc:
                logger.warning("cannot show the privacy report: %s", exc)
    for kill in result.killed:
        text = (
            f"killed SuperNode partition {kill.partition} (node {kill.node_id}) "
            f"in round {kill.round}"
        )
        print_line(console, _one_line(text, "red"))
    style = "bold green" if result.ok else "bold red"
    # The outcome and the paths are never broken by rich (a terminal wraps them, a pipe or a
    # log file keeps them on one line).
    console.print(
        Text(
            f"{'OK' if result.ok else 'FAILED'}: {result.reason} "
            f"({result.wall_seconds:.1f} s, out {result.out_dir})",
            style=style,
        ),
        soft_wrap=True,
    )
    if result.logs_dir is not None:
        console.print(f"process logs: {result.logs_dir}", soft_wrap=True, markup=False)


# ====================================================================== entry point
def _configure_logging(verbose: bool, console: Console) -> None:
    level = logging.INFO if verbose else logging.WARNING
    handler = RichHandler(console=console, show_path=False, rich_tracebacks=False)
    logging.basicConfig(level=level, handlers=[handler], format="%(message)s", force=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Console script ``corbin-fl``; returns the exit code (see module docstring).

    ``corbin-fl experiment ...`` is handed whole to the command registered under that name in
    the ``corbin_fl.commands`` entry-point group (pyproject: ``corbin_fl.experiments.cli:main``,
    TOML-driven sweeps with their own sub-commands and ``--help``). The experiments use this
    package to run; finding their command by entry point keeps this package from importing them.
    """
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["experiment"]:
        found = entry_points(group="corbin_fl.commands", name="experiment")
        if not found:
            sys.stderr.write(
                "corbin-fl experiment: no 'experiment' command is installed (entry point group "
                "corbin_fl.commands); install this project with pip install -e '.[tools]'\n"
            )
            return EXIT_USAGE
        return int(next(iter(found)).load()(words[1:]))
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    with _interruptible():
        try:
            return _run_command(args)
        except KeyboardInterrupt:  # before the run started, or while reporting
            sys.stderr.write(f"corbin-fl {args.command}: interrupted\n")
            return EXIT_INTERRUPTED


@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    """Make SIGINT raise :class:`KeyboardInterrupt` here even if it was inherited ignored.

    A non-interactive shell starts ``corbin-fl local &`` with SIGINT ignored, and Python then
    leaves it ignored: Ctrl-C and ``kill -INT`` would do nothing. Python's own handler is put in
    place for the command (the launcher keeps it while the run goes on, see
    :func:`deploy.run.run_local`), and the previous disposition is restored after.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    replace = previous in (signal.SIG_IGN, signal.SIG_DFL)
    if replace:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if replace:
            signal.signal(signal.SIGINT, previous)


def _run_command(args: argparse.Namespace) -> int:
    """``local`` / ``simulate`` after parsing: check everything, run, report; the exit code."""
    prog = f"corbin-fl {args.command}"
    console = Console(stderr=False, highlight=False)
    err_console = Console(stderr=True, highlight=False)
    _configure_logging(args.verbose, err_console)
    try:
        options = options_from_args(args)
        check_flower_versions(options.app_dir)
    except (ValueError, TypeError, LauncherError, FlowerVersionError) as exc:
        sys.stderr.write(usage_error(prog, exc))
        return EXIT_USAGE
    runner = run_simulation if args.command == "simulate" else run_local
    if not args.quiet:
        effective = {**app_config(options.app_dir), **options.run_config}
        console.print(
            f"{prog}: {options.nodes(simulation=args.command == 'simulate')} clients, "
            f"{effective.get('num-rounds', '?')} rounds, {effective.get('mechanism', '?')}, "
            f"{data_label(options.app_dir, effective)}, out {options.out_dir}",
            markup=False,
            soft_wrap=True,  # one line, the out dir whole: a terminal wraps it, a pipe keeps it
        )
    t0 = time.monotonic()
    try:
        if args.quiet:
            result = runner(options)
        else:
            with ProgressView(
                console, options.nodes(simulation=args.command == "simulate")
            ) as view:
                result = runner(options, progress=view)
    except KeyboardInterrupt:
        sys.stderr.write(
            f"{prog}: interrupted after {time.monotonic() - t0:.1f} s; every process was "
            f"stopped; logs in {options.out_dir / 'logs'}\n"
        )
        return EXIT_INTERRUPTED
    if args.quiet:
        if not result.ok:
            err_console.print(f"FAILED: {result.reason} (logs: {result.logs_dir})", markup=False)
    else:
        print_report(console, result)
    return result.exit_code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
