"""Slow-uplink benchmark: CorBin-FL (relay, derived) against FedAvg with ResNet18, multi-host.

The deployment runs on emulated machines (``tests/netns.py``): one Linux network namespace for
the server (SuperLink + ServerApp, 10.77.0.1) and one per client (a SuperNode and its ClientApp
processes, 10.77.0.11...), each with its own interface on a private bridge. Each client's uplink
(the egress of its ``eth0``) is limited with ``tc``: a 10 Mbit/s token bucket (``tbf``), plus a
50 ms one-way delay (``netem rate ... delay ...``) where the kernel has ``sch_netem``. The
server's link is not limited. The same runs are repeated without any limit.

Per configuration (``corbin`` relay, ``corbin`` derived, ``fedavg``; ``model=resnet18``,
``max-steps`` small so a round measures the exchange rather than learning) it prints, as medians
over rounds 2..R (round 1 adds the key exchange, the first ClientApp start-ups and data loading):

* ``round s``: the ServerApp's ``round_seconds`` (all stages, aggregation and its evaluation);
* ``exchange s``: the sum of the round's stage times (``stage_seconds``: send, client work,
  reply), i.e. the round without the server's aggregation and evaluation;
* ``app up/client``: ``bytes_up / participants`` from ``metrics.jsonl`` (the reply payloads);
* ``wire up/client``, ``wire down/client``: bytes each client's ``eth0`` sent / received between
  the round's ``round_start`` and ``round_end`` events (HTTP(S), TCP/IP and Ethernet headers,
  ACKs of the model download, the SuperNode's polling), averaged over the clients;
* ``uplink busy s``: seconds of the round in which a client's ``eth0`` sent faster than
  1 Mbit/s (its counters sampled about four times a second from ``/proc/<pid>/net/dev``),
  averaged over the clients: how long the update upload occupied the uplink, whatever the CPU
  load does to the rest of the round.

Floor it compares against (printed, never asserted): with the limit, CorBin's round time is at
most 0.35 of FedAvg's (relay is one round trip per steady round, pipelined, like derived).
Expected: a float32 ResNet18 update is 44.7 MB, about 36 s at 10 Mbit/s per client (each client
has its own link); CorBin's 1.4 MB take about 1.1 s.

Data (``--data``): ``synthetic-cifar`` (default) writes a small CIFAR-10-format folder (five
48-image train batches and a 48-image test batch of uniformly random pixels and labels) so that
the server's per-round evaluation of ResNet18 stays small on a CPU; ``mnist`` uses the embedded
MNIST (5,000 real images, 1 x 28 x 28, ResNet18 with ``in_channels=1``), whose 1,800 validation
and test images make the evaluation dominate a CPU round. The data only feeds the timing.

Needs Linux, root and iproute2 (``apt-get install iproute2``). Without ``--tls`` the links are
plain HTTP (``--insecure``); with it, TLS plus SuperNode authentication as in the tests.

Usage::

    python bench/bench_uplink.py
    python bench/bench_uplink.py --rounds 4 --configs corbin-relay,fedavg --tls
    python bench/bench_uplink.py --json bench-uplink.json --out /tmp/uplink-runs
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import pickle
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # testbed/ lives in the checkout

from corbin_fl.deploy.cli import total_bytes
from testbed.netns import (
    FlowerHosts,
    RunOutcome,
    Topology,
    netdev_counters,
    netns_unavailable_reason,
    sweep_stale,
)

REPO: Final[Path] = Path(__file__).resolve().parents[1]

logger = logging.getLogger("bench_uplink")

CONFIGS: Final[dict[str, dict[str, Any]]] = {
    "corbin-relay": {"mechanism": "corbin", "cr-mode": "relay"},
    "corbin-derived": {"mechanism": "corbin", "cr-mode": "derived"},
    "fedavg": {"mechanism": "fedavg"},
}
"""Benchmarked configurations -> their run-config keys."""

CONDITIONS: Final[tuple[str, ...]] = ("limited", "unlimited")
SERVER: Final[str] = "srv"
FLOOR: Final[float] = 0.35
"""CorBin round time / FedAvg round time with the limit, at most."""
SYNTHETIC_PER_BATCH: Final[int] = 48
MB: Final[float] = 1e6
BUSY_BPS: Final[float] = 1e6
"""A client's uplink counts as busy while it sends faster than this (bit/s)."""


# ====================================================================== data
def write_synthetic_cifar(folder: Path, per_batch: int, seed: int = 0) -> Path:
    """Write a CIFAR-10 python-batch folder of random images (timing only, nothing to learn).

    Layout of the real dataset: ``data_batch_1`` .. ``data_batch_5`` and ``test_batch``, each a
    pickled dict with ``b"data"`` (``N x 3072`` uint8, red, green, blue planes of 32 x 32) and
    ``b"labels"`` (``N`` ints in ``[0, 10)``), read by
    :func:`corbin_fl.app.data.read_cifar10_batch`.

    Parameters
    ----------
    folder : Path
        Created if needed.
    per_batch : int
        Images per batch file, ``>= 1``.
    seed : int
        Seed of the ``numpy.random.Generator`` that draws pixels and labels.
    """
    if isinstance(per_batch, bool) or not isinstance(per_batch, int) or per_batch < 1:
        raise ValueError(f"per_batch must be a positive int, got {per_batch!r}")
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for name in [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]:
        batch = {
            b"data": rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8),
            b"labels": [int(v) for v in rng.integers(0, 10, size=per_batch)],
        }
        with (folder / name).open("wb") as fh:
            pickle.dump(batch, fh, protocol=2)
    return folder


# ====================================================================== figures
@dataclass
class Figures:
    """What one run measured (medians over rounds 2..R)."""

    condition: str
    config: str
    ok: bool
    reason: str
    rounds: int
    round_seconds: float | None
    exchange_seconds: float | None
    first_round_seconds: float | None
    round_trips: float | None
    app_up_per_client: float | None
    wire_up_per_client: float | None
    wire_down_per_client: float | None
    uplink_busy_seconds: float | None
    wall_seconds: float
    per_round: list[dict[str, Any]] = field(default_factory=list)


def busy_seconds(
    samples: Sequence[tuple[float, Mapping[str, int]]], threshold_bps: float = BUSY_BPS
) -> float | None:
    """Seconds a client's uplink carried data, averaged over the clients.

    Between consecutive samples ``(t_k, tx_k)`` and ``(t_{k+1}, tx_{k+1})`` a client counts as
    sending when ``8 (tx_{k+1} - tx_k) / (t_{k+1} - t_k) > threshold_bps``; its busy time is the
    sum of those intervals. The SuperNode's polls and the ACKs of a download stay far below the
    1 Mbit/s default, an update upload through a 10 Mbit/s limit far above it.

    Returns
    -------
    float or None
        The mean over clients, None with fewer than two samples.
    """
    if len(samples) < 2:
        return None
    hosts = sorted(set.intersection(*(set(tx) for _, tx in samples)))
    if not hosts:
        return None
    busy = dict.fromkeys(hosts, 0.0)
    for (t0, tx0), (t1, tx1) in itertools.pairwise(samples):
        dt = t1 - t0
        if dt <= 0:
            continue
        for h in hosts:
            if 8.0 * (tx1[h] - tx0[h]) / dt > threshold_bps:
                busy[h] += dt
    return statistics.fmean(busy.values())


def _median(values: Sequence[float]) -> float | None:
    return float(statistics.median(values)) if values else None


def figures_from(
    condition: str,
    config: str,
    outcome: RunOutcome,
    status: str | None,
    counters: Mapping[tuple[int, str], Mapping[str, Mapping[str, int]]],
    series: Mapping[int, Sequence[tuple[float, Mapping[str, int]]]],
    wall: float,
    num_clients: int,
) -> Figures:
    """Reduce one run to its figures (not ok unless every round aggregated every client).

    Parameters
    ----------
    counters : Mapping[tuple[int, str], Mapping[str, Mapping[str, int]]]
        ``(round, "start" | "end") -> client host -> link_stats`` sampled when the ServerApp
        wrote that round's ``round_start`` / ``round_end`` event.
    series : Mapping[int, Sequence[tuple[float, Mapping[str, int]]]]
        ``round -> [(monotonic time, client host -> tx_bytes), ...]`` sampled about four times
        a second during the round (see :func:`busy_seconds`).
    """
    rows = sorted(outcome.metrics, key=lambda r: int(r.get("round", 0)))
    ok = outcome.reason is None and outcome.exit_code == 0 and status == "finished:completed"
    reason = outcome.reason or (
        "completed" if ok else f"exit {outcome.exit_code}, status {status}: {outcome.log_tail}"
    )
    # A round that aggregated fewer updates than there are clients is not a round of this
    # config (a refused instruction, a dropped node): its time says nothing about the uplink.
    short = [
        f"round {r.get('round')}: {r.get('participants')} of {num_clients} updates"
        for r in rows
        if r.get("participants") != num_clients
    ]
    if ok and short:
        ok, reason = False, "; ".join(short)
    per_round: list[dict[str, Any]] = []
    for row in rows:
        rnd = int(row["round"])
        participants = row.get("participants")
        n = participants if isinstance(participants, int) and participants > 0 else None
        up = total_bytes(row.get("bytes_up"))
        start, end = counters.get((rnd, "start")), counters.get((rnd, "end"))
        wire_up = wire_down = None
        if start and end:
            hosts = sorted(set(start) & set(end))
            wire_up = statistics.fmean(end[h]["tx_bytes"] - start[h]["tx_bytes"] for h in hosts)
            wire_down = statistics.fmean(end[h]["rx_bytes"] - start[h]["rx_bytes"] for h in hosts)
        busy = busy_seconds(series.get(rnd, ()))
        stages = row.get("stage_seconds") or {}
        per_round.append(
            {
                "round": rnd,
                "round_seconds": row.get("round_seconds"),
                "exchange_seconds": float(sum(stages.values())) if stages else None,
                "round_trips": row.get("round_trips"),
                "participants": participants,
                "app_up_per_client": up / n if up is not None and n else None,
                "wire_up_per_client": wire_up,
                "wire_down_per_client": wire_down,
                "uplink_busy_seconds": busy,
            }
        )
    steady = [r for r in per_round if r["round"] >= 2] or per_round

    def med(key: str) -> float | None:
        return _median([float(r[key]) for r in steady if r[key] is not None])

    return Figures(
        condition=condition,
        config=config,
        ok=ok,
        reason=reason,
        rounds=len(rows),
        round_seconds=med("round_seconds"),
        exchange_seconds=med("exchange_seconds"),
        first_round_seconds=per_round[0]["round_seconds"] if per_round else None,
        round_trips=med("round_trips"),
        app_up_per_client=med("app_up_per_client"),
        wire_up_per_client=med("wire_up_per_client"),
        wire_down_per_client=med("wire_down_per_client"),
        uplink_busy_seconds=med("uplink_busy_seconds"),
        wall_seconds=wall,
        per_round=per_round,
    )


# ====================================================================== one run
def run_one(
    deploy: FlowerHosts,
    condition: str,
    config: str,
    run_config: Mapping[str, Any],
    out_root: Path,
    timeout: float,
) -> Figures:
    """Submit one run on the running deployment, follow it, sample the link counters."""
    topo, clients = deploy.topology, list(deploy.clients)
    out_dir = out_root / f"{condition}-{config}"
    counters: dict[tuple[int, str], dict[str, dict[str, int]]] = {}
    series: dict[int, list[tuple[float, dict[str, int]]]] = {}
    pids = {c: deploy.supernodes[c].pid for c in clients}
    seen = 0
    current: int | None = None

    def sample(outcome: RunOutcome) -> None:
        nonlocal seen, current
        for ev in outcome.events[seen:]:
            kind, rnd = ev.get("event"), ev.get("round")
            if kind in ("round_start", "round_end") and isinstance(rnd, int):
                key = (rnd, "start" if kind == "round_start" else "end")
                counters[key] = {c: topo.link_stats(c) for c in clients}
                current = rnd if kind == "round_start" else None
        seen = len(outcome.events)
        if current is not None:
            now = time.monotonic()
            tx = {c: netdev_counters(pid)["tx_bytes"] for c, pid in pids.items()}
            series.setdefault(current, []).append((now, tx))

    full = {**run_config, **CONFIGS[config], "out-dir": str(out_dir)}
    logger.info("%s / %s: %s", condition, config, full)
    t0 = time.monotonic()
    proc = deploy.submit(full)
    outcome = deploy.follow(proc, out_dir, timeout=timeout, on_tick=sample)
    status = deploy.run_status(outcome.run_id) if outcome.run_id is not None else None
    figures = figures_from(
        condition, config, outcome, status, counters, series, time.monotonic() - t0, len(clients)
    )
    if not figures.ok:
        logger.error("%s / %s failed: %s", condition, config, figures.reason[-1500:])
    return figures


# ====================================================================== report
def _num(value: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if value is None else fmt.format(value)


def report(console: Console, figures: Sequence[Figures]) -> dict[str, Any]:
    """Print the figures and the comparison with FedAvg; return the ratios (for ``--json``)."""
    table = Table(title="Slow-uplink benchmark (medians over rounds 2..R)", title_justify="left")
    for col in (
        "uplink",
        "config",
        "ok",
        "rounds",
        "round s",
        "exchange s",
        "round 1 s",
        "trips",
        "app up/client",
        "wire up/client",
        "wire down/client",
        "uplink busy s",
    ):
        table.add_column(col, justify="left" if col in ("uplink", "config") else "right")
    for f in figures:
        table.add_row(
            f.condition,
            f.config,
            "yes" if f.ok else "[red]NO[/red]",
            str(f.rounds),
            _num(f.round_seconds),
            _num(f.exchange_seconds),
            _num(f.first_round_seconds),
            _num(f.round_trips, "{:g}"),
            _num(None if f.app_up_per_client is None else f.app_up_per_client / MB, "{:.2f} MB"),
            _num(None if f.wire_up_per_client is None else f.wire_up_per_client / MB, "{:.2f} MB"),
            _num(
                None if f.wire_down_per_client is None else f.wire_down_per_client / MB,
                "{:.2f} MB",
            ),
            _num(f.uplink_busy_seconds),
        )
    console.print(table)

    ratios = Table(title="CorBin / FedAvg (same uplink)", title_justify="left")
    for col in (
        "uplink",
        "config",
        "round time",
        "exchange time",
        "uplink busy",
        "wire uplink",
        "floor met",
    ):
        ratios.add_column(col, justify="left" if col in ("uplink", "config") else "right")
    out: dict[str, Any] = {}
    by = {(f.condition, f.config): f for f in figures}
    for condition in dict.fromkeys(f.condition for f in figures):
        base = by.get((condition, "fedavg"))
        if base is None:
            continue
        for config in ("corbin-relay", "corbin-derived"):
            f = by.get((condition, config))
            if f is None:
                continue
            r_round = _ratio(f.round_seconds, base.round_seconds)
            r_exchange = _ratio(f.exchange_seconds, base.exchange_seconds)
            r_wire = _ratio(f.wire_up_per_client, base.wire_up_per_client)
            r_busy = _ratio(f.uplink_busy_seconds, base.uplink_busy_seconds)
            meets = "-"
            if condition == "limited" and r_round is not None:
                meets = "[green]yes[/green]" if r_round <= FLOOR else "[red]NO[/red]"
            ratios.add_row(
                condition,
                config,
                _num(r_round, "{:.3f}"),
                _num(r_exchange, "{:.3f}"),
                _num(r_busy, "{:.3f}"),
                _num(r_wire, "{:.4f}"),
                meets,
            )
            out[f"{condition}/{config}"] = {
                "round_time": r_round,
                "exchange_time": r_exchange,
                "uplink_busy": r_busy,
                "wire_uplink": r_wire,
                "floor": FLOOR if condition == "limited" else None,
            }
    console.print(ratios)
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


# ====================================================================== main
def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; exits 0 unless the arguments are bad or namespaces are unavailable."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--configs", default=",".join(CONFIGS), help=f"comma list of {', '.join(CONFIGS)}"
    )
    parser.add_argument(
        "--conditions", default=",".join(CONDITIONS), help="comma list of limited, unlimited"
    )
    parser.add_argument("--clients", type=int, default=3, help="client machines (1..200)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per run (>= 2)")
    parser.add_argument("--max-steps", type=int, default=1, help="local optimizer steps cap")
    parser.add_argument("--batch-size", type=int, default=16, help="local batch size")
    parser.add_argument("--rate-mbit", type=float, default=10.0, help="client uplink rate")
    parser.add_argument(
        "--delay-ms",
        type=float,
        default=50.0,
        help="one-way uplink delay (needs sch_netem; without it only the rate is limited)",
    )
    parser.add_argument("--data", choices=("synthetic-cifar", "mnist"), default="synthetic-cifar")
    parser.add_argument("--tls", action="store_true", help="TLS + SuperNode authentication")
    parser.add_argument("--stage-timeout", type=float, default=600.0, help="seconds per stage")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per run")
    parser.add_argument("--out", type=Path, default=None, help="keep runs and logs here")
    parser.add_argument("--json", type=Path, default=None, help="write the figures as JSON")
    parser.add_argument("--verbose", "-v", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    conditions = [c.strip() for c in args.conditions.split(",") if c.strip()]
    bad = [c for c in configs if c not in CONFIGS] + [c for c in conditions if c not in CONDITIONS]
    if bad:
        parser.error(f"unknown configs/conditions: {bad}")
    if args.rounds < 2 or not 1 <= args.clients <= 200 or args.max_steps < 0 or args.batch_size < 1:
        parser.error(
            "need --rounds >= 2, 1 <= --clients <= 200, --max-steps >= 0, --batch-size >= 1"
        )
    if not args.rate_mbit > 0 or args.delay_ms < 0 or not args.stage_timeout > 0:
        parser.error("need --rate-mbit > 0, --delay-ms >= 0, --stage-timeout > 0")
    if (reason := netns_unavailable_reason()) is not None:
        logger.error("cannot run: %s", reason)
        return 2

    console = Console()
    out_root = (args.out or Path(tempfile.mkdtemp(prefix="corbin-uplink-"))).resolve()
    out_root.mkdir(parents=True, exist_ok=True)
    run_config: dict[str, Any] = {
        "model": "resnet18",
        "num-rounds": args.rounds,
        "max-steps": args.max_steps,
        "batch-size": args.batch_size,
        "seed": 0,
        "min-clients": args.clients,
        "stage-timeout": args.stage_timeout,
        "first-stage-timeout": args.stage_timeout,
        "wait-for-nodes": 120.0,
    }
    if args.data == "synthetic-cifar":
        data_dir = write_synthetic_cifar(out_root / "synthetic-cifar", SYNTHETIC_PER_BATCH)
        run_config.update(dataset="cifar10", **{"data-dir": str(data_dir)})
        run_config["use-official-test"] = True
    else:
        run_config["dataset"] = "mnist"

    hosts = {SERVER: "10.77.0.1", **{f"c{i + 1}": f"10.77.0.{11 + i}" for i in range(args.clients)}}
    clients = [h for h in hosts if h != SERVER]
    sweep_stale()
    figures: list[Figures] = []
    shaping = ""
    with Topology(hosts) as topo:
        # The bench operates every node, so the nodes admit exactly the mechanisms it runs
        # (as `corbin-fl local` does with launcher.node_policy); the default policy refuses
        # fedavg, which would leave FedAvg's rounds without a single update.
        mechanisms = sorted({CONFIGS[c]["mechanism"] for c in configs})
        deploy = FlowerHosts(
            topo,
            SERVER,
            clients,
            out_root / "deploy",
            tls=args.tls,
            node_config={"corbin-mechanisms": ",".join(mechanisms)},
        )
        try:
            delay = args.delay_ms
            if delay > 0 and not topo.netem_available():
                logger.warning(
                    "this kernel has no sch_netem (CONFIG_NET_SCH_NETEM): the %g ms delay is "
                    "left out, the uplink rate is limited with tbf",
                    delay,
                )
                delay = 0.0
            deploy.start()
            for condition in conditions:
                for client in clients:
                    if condition == "unlimited":
                        topo.clear_shaping(client)
                    else:
                        shaping = topo.shape_uplink(client, args.rate_mbit, delay_ms=delay)
                if condition == "limited":
                    console.print(f"client uplinks: {shaping}")
                for config in configs:
                    f = run_one(deploy, condition, config, run_config, out_root, args.timeout)
                    figures.append(f)
                    console.print(
                        f"{condition} {config}: {'ok' if f.ok else 'FAILED'}; round "
                        f"{_num(f.round_seconds)} s, exchange {_num(f.exchange_seconds)} s, "
                        f"wire up/client {_num((f.wire_up_per_client or 0) / MB, '{:.2f}')} MB"
                    )
        finally:
            deploy.close()
    ratios = report(console, figures)
    console.print(
        f"{len(clients)} clients, {args.rounds} rounds, max-steps {args.max_steps}, batch "
        f"{args.batch_size}, data "
        f"{args.data}, {'TLS + node auth' if args.tls else 'no TLS'}; limit: {shaping or '-'}; "
        f"runs kept in {out_root}"
    )
    if args.json is not None:
        payload = {
            "settings": {
                "clients": len(clients),
                "rounds": args.rounds,
                "max_steps": args.max_steps,
                "batch_size": args.batch_size,
                "rate_mbit": args.rate_mbit,
                "delay_ms": args.delay_ms,
                "shaping": shaping,
                "data": args.data,
                "tls": args.tls,
            },
            "figures": [asdict(f) for f in figures],
            "ratios": ratios,
        }
        args.json.write_text(json.dumps(payload, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
