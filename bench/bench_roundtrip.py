"""Where a Flower round trip's time goes on a loopback deployment, and what the tuned polls save.

One steady FedAvg round is one round trip: the ServerApp pushes an instruction per node, and each
node's reply passes through

1. the SuperNode's idle poll of the SuperLink (a fixed 3 s sleep in Flower 1.41 and 1.42, not ours),
2. the executor's task poll (``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``, Flower's default 1 s),
3. a fresh ``flwr-clientapp`` process: interpreter, Flower's runtime, pulling the message and the
   app bundle, imports (``startup-seconds``, reported by this project's train handler from the
   process's age),
4. the train handler: model, data, training (``handler-seconds``) and, for CorBin-FL, the mod's
   encoding (``encode-seconds``),
5. the SuperNode's reply poll (0.5 s) and push, and the ServerApp's pull poll (``poll-interval``).

The script prints (a) the import cost of a fresh process, median of 5 runs, and (b) FedAvg's
steady round (median of rounds 2..R of ``metrics.jsonl``) with Flower's default polls (executor
1 s, ServerApp 0.5 s: this project before the tuning) and with the tuned ones (0.2 s and 0.2 s),
in the same invocation, with the update stage split into the parts above. "Flower's waiting" is
the stage time minus the mean startup, handler and encode time of the nodes (1, 2 and 5, plus the
spread between the slowest node and the mean).

Usage::

    python bench/bench_roundtrip.py                       # 4 clients, CNN, 4 rounds
    python bench/bench_roundtrip.py --model resnet18 --mechanism corbin
    python bench/bench_roundtrip.py --json bench-roundtrip.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from rich.console import Console
from rich.table import Table

from corbin_fl.deploy.cli import repo_root
from corbin_fl.deploy.processes import TASK_POLL_ENV
from corbin_fl.deploy.run import LocalRunOptions, run_local

logger = logging.getLogger("bench_roundtrip")

SETTINGS: Final[dict[str, tuple[str, float]]] = {
    "Flower defaults (before)": ("1.0", 0.5),
    "tuned (after)": ("0.2", 0.2),
}
"""Label -> (executor task poll, ServerApp ``poll-interval``)."""
IMPORTS: Final[tuple[str, ...]] = ("flwr", "flwr.clientapp", "corbin_fl.app.client_app", "torch")


def import_seconds(module: str, repeats: int = 5) -> float:
    """Median wall time of a fresh ``python -c "import module"`` (interpreter start included)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-c", f"import {module}"], check=True, cwd=repo_root(), timeout=120
        )
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _median(values: Sequence[float | None]) -> float | None:
    known = [float(v) for v in values if v is not None]
    return statistics.median(known) if known else None


def breakdown(rows: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """Medians over rounds ``2..R`` of the round, its update stage and the ClientApp's parts."""
    steady = [r for r in rows if int(r.get("round", 0)) >= 2] or list(rows)

    def part(row: Mapping[str, Any], key: str) -> float | None:
        value = (row.get("clientapp_seconds") or {}).get(key)
        return float(value) if isinstance(value, int | float) else None

    def wait(row: Mapping[str, Any]) -> float | None:
        stage = (row.get("stage_seconds") or {}).get("update")
        parts = [part(row, k) for k in ("startup", "handler")]
        if stage is None or None in parts:
            return None
        return float(stage) - sum(p for p in parts if p is not None) - (part(row, "encode") or 0.0)

    return {
        "round": _median([r.get("round_seconds") for r in steady]),
        "update stage": _median([(r.get("stage_seconds") or {}).get("update") for r in steady]),
        "startup": _median([part(r, "startup") for r in steady]),
        "handler": _median([part(r, "handler") for r in steady]),
        "encode": _median([part(r, "encode") for r in steady]),
        "flower wait": _median([wait(r) for r in steady]),
        "round trips": _median([r.get("round_trips") for r in steady]),
    }


def run_setting(
    label: str, args: argparse.Namespace, out_root: Path
) -> dict[str, float | None] | None:
    """One ``corbin-fl local`` run with the setting's polls; its breakdown (None if it failed)."""
    task_poll, server_poll = SETTINGS[label]
    previous = os.environ.get(TASK_POLL_ENV)
    os.environ[TASK_POLL_ENV] = task_poll
    try:
        result = run_local(
            LocalRunOptions(
                app_dir=repo_root(),
                out_dir=out_root / label.split()[0].lower(),
                num_clients=args.clients,
                run_config={
                    "mechanism": args.mechanism,
                    "model": args.model,
                    "dataset": "mnist",
                    "num-rounds": args.rounds,
                    "max-steps": 2,
                    "seed": 0,
                    "poll-interval": server_poll,
                    "stage-timeout": 600.0,
                    "first-stage-timeout": 900.0,
                },
                timeout=args.timeout,
                keep_logs=True,
            )
        )
    finally:
        if previous is None:
            os.environ.pop(TASK_POLL_ENV, None)
        else:
            os.environ[TASK_POLL_ENV] = previous
    if not result.ok:
        logger.error("%s failed: %s (logs: %s)", label, result.reason, result.logs_dir)
        return None
    return breakdown(sorted(result.metrics, key=lambda r: int(r.get("round", 0))))


def main(argv: Sequence[str] | None = None) -> int:
    """Print the import costs and the round-trip breakdown; asserts nothing."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="cnn", choices=("cnn", "resnet18"))
    parser.add_argument("--mechanism", default="fedavg")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--verbose", "-v", action="store_true")
    args = parser.parse_args(argv)
    if args.rounds < 2 or args.clients < 1:
        parser.error("rounds >= 2 and clients >= 1")
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    console = Console()

    imports = {module: import_seconds(module) for module in IMPORTS}
    table = Table(title="Fresh process: python -c 'import X' (median of 5)", title_justify="left")
    table.add_column("module", justify="left")
    table.add_column("seconds", justify="right")
    for module, seconds in imports.items():
        table.add_row(module, f"{seconds:.2f}")
    console.print(table)

    out_root = Path(tempfile.mkdtemp(prefix="corbin-roundtrip-"))
    results = {label: run_setting(label, args, out_root) for label in SETTINGS}
    title = (
        f"{args.mechanism}, {args.model}, {args.clients} clients: "
        f"medians of rounds 2..{args.rounds} (seconds)"
    )
    table = Table(title=title, title_justify="left")
    table.add_column("part", justify="left")
    for label, (task_poll, server_poll) in SETTINGS.items():
        table.add_column(
            f"{label}\nexecutor {task_poll} s, server {server_poll} s", justify="right"
        )
    for key in (
        "round",
        "update stage",
        "startup",
        "handler",
        "encode",
        "flower wait",
        "round trips",
    ):
        cells = []
        for label in SETTINGS:
            value = (results[label] or {}).get(key)
            cells.append("-" if value is None else f"{value:.2f}")
        table.add_row(key, *cells)
    console.print(table)
    before, after = (results[label] for label in SETTINGS)
    ratio = None
    if before and after and before["round"] and after["round"]:
        ratio = after["round"] / before["round"]
        console.print(f"steady round after / before: [bold]{ratio:.3f}[/bold]")
    if args.json:
        args.json.write_text(
            json.dumps({"imports": imports, "runs": results, "ratio": ratio}, indent=2) + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
