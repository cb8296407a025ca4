"""Deployment benchmark: CorBin-FL (relay, derived) against FedAvg on real Flower processes.

Every configuration runs through ``corbin-fl local`` (one SuperLink and N SuperNodes as real
processes on loopback, the same machine, model, data and seed), and the figures come from the
ServerApp's ``metrics.jsonl``:

* per-round wall time: the median of ``round_seconds`` over rounds ``2..R`` (round 1 carries the
  start-up: first ClientApp processes, data loading, key exchange);
* round trips per round (median over ``2..R``): 1 for ``corbin`` relay (pipelined: round t+1's
  blobs ride with round t's update), ``derived`` and ``fedavg`` (see docs/DESIGN.md); round 1
  (keygen -> pair -> update for relay) is reported separately;
* uplink bytes per client per round: ``bytes_up / participants`` (median over ``2..R``).

Targets it compares against (printed, never asserted): derived <= 1.05x FedAvg round time, relay
<= 1.10x FedAvg round time, and CorBin uplink <= 1/30 of FedAvg's for ResNet18 (one bit per
parameter against 32).

Local training is capped with ``max-steps`` so the round time measures the protocol rather than
the optimizer. Both models run on the embedded MNIST (the CIFAR-style ResNet18 takes 1-channel
28x28 input through its adaptive pooling), so the benchmark needs no download.

Usage::

    python bench/bench_deployment.py
    python bench/bench_deployment.py --models cnn --rounds 4 --clients 4
    python bench/bench_deployment.py --json bench-deployment.json
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from rich.console import Console
from rich.table import Table

from corbin_fl.deploy.cli import repo_root, total_bytes
from corbin_fl.deploy.follow import RunResult
from corbin_fl.deploy.run import LocalRunOptions, run_local

logger = logging.getLogger("bench_deployment")

CONFIGS: Final[dict[str, dict[str, Any]]] = {
    "corbin-relay": {"mechanism": "corbin", "cr-mode": "relay"},
    "corbin-derived": {"mechanism": "corbin", "cr-mode": "derived"},
    "fedavg": {"mechanism": "fedavg"},
}
"""Benchmarked configurations -> their run-config keys."""

TARGET_DERIVED_TIME: Final[float] = 1.05
TARGET_RELAY_TIME: Final[float] = 1.10
TARGET_UPLINK_RESNET: Final[float] = 1.0 / 30.0


@dataclass(frozen=True)
class Figures:
    """What one run measured (medians over rounds 2..R)."""

    model: str
    config: str
    ok: bool
    reason: str
    rounds: int
    round_seconds: float | None
    round_trips: float | None
    uplink_per_client: float | None
    downlink_per_client: float | None
    first_round_seconds: float | None
    first_round_trips: int | None
    final_accuracy: float | None
    wall_seconds: float


def _median(values: Sequence[float]) -> float | None:
    return float(statistics.median(values)) if values else None


def _participants(row: Mapping[str, Any]) -> int | None:
    value = row.get("participants")
    if isinstance(value, list):
        return len(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


def _round_seconds_from_events(events: Sequence[Mapping[str, Any]]) -> dict[int, float]:
    """Fallback: ``round_end.time - round_start.time`` when a metrics row lacks round_seconds."""
    starts = {e["round"]: e["time"] for e in events if e.get("event") == "round_start"}
    out = {}
    for e in events:
        if e.get("event") == "round_end" and e.get("round") in starts and "time" in e:
            out[int(e["round"])] = float(e["time"]) - float(starts[e["round"]])
    return out


def figures_from(result: RunResult, model: str, config: str) -> Figures:
    """Reduce a run's ``metrics.jsonl`` to the benchmark figures.

    Parameters
    ----------
    result : RunResult
        A finished :func:`deploy.run.run_local` run.
    model, config : str
        Labels of the run.
    """
    rows = sorted(result.metrics, key=lambda r: int(r.get("round", 0)))
    from_events = _round_seconds_from_events(result.events)
    steady = [r for r in rows if int(r.get("round", 0)) >= 2] or rows

    def seconds(row: Mapping[str, Any]) -> float | None:
        value = row.get("round_seconds")
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        return from_events.get(int(row.get("round", 0)))

    def per_client(row: Mapping[str, Any], key: str) -> float | None:
        total, n = total_bytes(row.get(key)), _participants(row)
        return total / n if total is not None and n else None

    def collect(fn: Any) -> list[float]:
        return [v for v in (fn(r) for r in steady) if v is not None]

    trips = collect(
        lambda r: r.get("round_trips") if isinstance(r.get("round_trips"), int) else None
    )
    acc = rows[-1].get("test_accuracy") if rows else None
    return Figures(
        model=model,
        config=config,
        ok=result.ok,
        reason=result.reason,
        rounds=len(rows),
        round_seconds=_median(collect(seconds)),
        round_trips=_median(trips),
        uplink_per_client=_median(collect(lambda r: per_client(r, "bytes_up"))),
        downlink_per_client=_median(collect(lambda r: per_client(r, "bytes_down"))),
        first_round_seconds=seconds(rows[0]) if rows else None,
        first_round_trips=(
            int(rows[0]["round_trips"])
            if rows and isinstance(rows[0].get("round_trips"), int)
            else None
        ),
        final_accuracy=float(acc) if isinstance(acc, int | float) else None,
        wall_seconds=result.wall_seconds,
    )


def run_one(
    model: str,
    config: str,
    *,
    clients: int,
    rounds: int,
    max_steps: int,
    out_root: Path,
    timeout: float,
    extra: Mapping[str, Any],
) -> Figures:
    """Run one configuration with ``corbin-fl local`` and measure it."""
    run_config: dict[str, Any] = {
        **CONFIGS[config],
        "model": model,
        "dataset": "mnist",
        "num-rounds": rounds,
        "max-steps": max_steps,
        "seed": 0,
        # A stage ends when every node has answered; long timeouts only make sure that a slow
        # (busy) machine does not turn into dropped clients, which would corrupt the figures.
        "stage-timeout": 600.0,
        "first-stage-timeout": 900.0,
        **extra,
    }
    options = LocalRunOptions(
        app_dir=repo_root(),
        out_dir=out_root / f"{model}-{config}",
        num_clients=clients,
        run_config=run_config,
        timeout=timeout,
        keep_logs=True,
    )
    logger.info("running %s / %s: %s", model, config, run_config)
    result = run_local(options)
    if not result.ok:
        logger.error("%s / %s failed: %s (logs: %s)", model, config, result.reason, result.logs_dir)
    return figures_from(result, model, config)


def _num(value: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if value is None else fmt.format(value)


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def report(console: Console, figures: Sequence[Figures]) -> dict[str, Any]:
    """Print the figures and the ratio table; return the ratios (for ``--json``)."""
    table = Table(title="Deployment benchmark (medians over rounds 2..R)", title_justify="left")
    for col in (
        "model",
        "config",
        "ok",
        "rounds",
        "round s",
        "round 1 s",
        "round trips",
        "round 1 trips",
        "uplink/client",
        "downlink/client",
        "final acc",
        "wall s",
    ):
        table.add_column(col, justify="left" if col in ("model", "config") else "right")
    for f in figures:
        table.add_row(
            f.model,
            f.config,
            "yes" if f.ok else "[red]NO[/red]",
            str(f.rounds),
            _num(f.round_seconds),
            _num(f.first_round_seconds),
            _num(f.round_trips, "{:g}"),
            _num(f.first_round_trips, "{:g}"),
            _num(f.uplink_per_client, "{:,.0f} B"),
            _num(f.downlink_per_client, "{:,.0f} B"),
            _num(f.final_accuracy, "{:.3f}"),
            _num(f.wall_seconds, "{:.0f}"),
        )
    console.print(table)

    ratios = Table(title="Ratios to FedAvg (same model)", title_justify="left")
    for col in ("model", "quantity", "ratio", "target", "meets"):
        ratios.add_column(col, justify="left" if col in ("model", "quantity") else "right")
    out: dict[str, Any] = {}
    by = {(f.model, f.config): f for f in figures}
    for model in dict.fromkeys(f.model for f in figures):
        base = by.get((model, "fedavg"))
        if base is None:
            continue
        checks = [
            ("corbin-derived", "round time", "round_seconds", TARGET_DERIVED_TIME, "<= 1.05"),
            ("corbin-relay", "round time", "round_seconds", TARGET_RELAY_TIME, "<= 1.10"),
            ("corbin-relay", "uplink/client", "uplink_per_client", None, None),
            ("corbin-derived", "uplink/client", "uplink_per_client", None, None),
        ]
        for config, label, attr, target, target_text in checks:
            f = by.get((model, config))
            if f is None:
                continue
            ratio = _ratio(getattr(f, attr), getattr(base, attr))
            if attr == "uplink_per_client" and model == "resnet18":
                target, target_text = TARGET_UPLINK_RESNET, "<= 1/30"
            meets = "-" if ratio is None or target is None else ("yes" if ratio <= target else "NO")
            style = {"yes": "green", "NO": "red"}.get(meets, "")
            ratios.add_row(
                model,
                f"{config} {label}",
                _num(ratio, "{:.3f}") if attr != "uplink_per_client" else _num(ratio, "{:.4f}"),
                target_text or "-",
                f"[{style}]{meets}[/{style}]" if style else meets,
            )
            out[f"{model}/{config}/{attr}"] = {"ratio": ratio, "target": target}
    console.print(ratios)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; always exits 0 unless the arguments are bad (it asserts nothing)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="cnn,resnet18", help="comma list: cnn,resnet18")
    parser.add_argument(
        "--configs", default=",".join(CONFIGS), help=f"comma list of {', '.join(CONFIGS)}"
    )
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=4, help="rounds per run (>= 2)")
    parser.add_argument("--max-steps", type=int, default=2, help="local optimizer steps cap")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    parser.add_argument(
        "--run-config",
        default="",
        help='extra run-config for every run, e.g. "stage-timeout=300 local-epochs=1"',
    )
    parser.add_argument("--out", type=Path, default=None, help="keep the runs here")
    parser.add_argument("--json", type=Path, default=None, help="write the figures as JSON")
    parser.add_argument("--verbose", "-v", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    bad = [c for c in configs if c not in CONFIGS] + [
        m for m in models if m not in ("cnn", "resnet18")
    ]
    if bad or args.rounds < 2 or args.clients < 2 or args.max_steps < 0:
        parser.error(f"bad arguments: {bad or 'rounds >= 2, clients >= 2, max-steps >= 0'}")
    from corbin_fl.deploy.flower import parse_config_string

    extra = parse_config_string(args.run_config)
    console = Console()
    out_root = args.out or Path(tempfile.mkdtemp(prefix="corbin-bench-"))
    figures: list[Figures] = []
    for model in models:
        for config in configs:
            f = run_one(
                model,
                config,
                clients=args.clients,
                rounds=args.rounds,
                max_steps=args.max_steps,
                out_root=out_root,
                timeout=args.timeout,
                extra=extra,
            )
            figures.append(f)
            console.print(
                f"{model} {config}: {'ok' if f.ok else 'FAILED: ' + f.reason[:200]}; "
                f"round {_num(f.round_seconds)} s, trips {_num(f.round_trips, '{:g}')}, "
                f"uplink/client {_num(f.uplink_per_client, '{:,.0f}')} B"
            )
    ratios = report(console, figures)
    console.print(f"runs kept in {out_root}")
    if args.json is not None:
        payload = {
            "settings": {
                "clients": args.clients,
                "rounds": args.rounds,
                "max_steps": args.max_steps,
                "extra": extra,
            },
            "figures": [asdict(f) for f in figures],
            "ratios": ratios,
        }
        args.json.write_text(json.dumps(payload, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
