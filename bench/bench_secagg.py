"""The cost of secure aggregation: the same CorBin-FL run with and without it, in one invocation.

For each client count the script runs the app twice with the same settings, once with
``secure-aggregation = false`` and once with ``true`` (SecAgg+, ``corbin_fl.secagg``), and prints
for the steady rounds (2..R; round 1 carries start-up, key generation and advertising):

- the round time (median ``round_seconds``) and its ratio secure / plain;
- round trips per round (the stages that sent a message);
- the ServerApp's CPU per round for the protocol and aggregation (``server_cpu_seconds``, the
  process; on the simulation runtime the engine's threads share it, so the ServerApp's own
  thread, ``server_thread_cpu_seconds``, is printed beside it);
- the CPU of every process of the deployment per round (SuperLink, SuperNodes, every ClientApp
  process and the ServerApp, from this process's reaped children: ``getrusage``), of which the
  ServerApp's part above; on the simulation runtime the Ray workers are included;
- bytes up per client per round (all stages), and per parameter against FedAvg's 4 bytes.

``n`` clients up to ``--local-max`` run as real processes on loopback (``corbin-fl local``), the
larger ones on Flower's simulation runtime (``corbin-fl simulate``), as the issue asks.

Usage::

    python bench/bench_secagg.py                          # n = 10 on loopback, 4 rounds
    python bench/bench_secagg.py --clients 10 50 100      # 50 and 100 on the simulation runtime
    python bench/bench_secagg.py --json bench-secagg.json
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import statistics
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from corbin_fl.deploy.run import LocalRunOptions, run_local, run_simulation

logger = logging.getLogger("bench_secagg")

FEDAVG_BYTES_PER_PARAM = 4.0
"""FedAvg's float32 upload, the issue's reference for the uplink floor ((b + 1) / 32 of it)."""


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _median(values: Sequence[float | None]) -> float | None:
    kept = [float(v) for v in values if v is not None]
    return statistics.median(kept) if kept else None


def run_once(
    n: int, secure: bool, args: argparse.Namespace, out_root: Path
) -> dict[str, Any] | None:
    """One run; the steady rounds' figures, or None when it failed (the reason is logged)."""
    simulate = n > args.local_max
    options = LocalRunOptions(
        app_dir=Path(__file__).resolve().parents[1],
        out_dir=out_root / f"n{n}-{'secure' if secure else 'plain'}",
        num_clients=n,
        run_config={
            "mechanism": args.mechanism,
            "secure-aggregation": secure,
            "num-rounds": args.rounds,
            "max-steps": args.max_steps,
            "seed": 0,
            "stage-timeout": 900.0,
            "first-stage-timeout": 1800.0,
        },
        timeout=args.timeout,
        keep_logs=True,
    )
    cpu0 = _children_cpu()
    result = (run_simulation if simulate else run_local)(options)
    cpu = _children_cpu() - cpu0
    if not result.ok:
        logger.error("n=%d secure=%s failed: %s (logs: %s)", n, secure, result.reason,
                     result.logs_dir)  # fmt: skip
        return None
    rows = sorted(result.metrics, key=lambda r: int(r.get("round", 0)))
    steady = [r for r in rows if int(r.get("round", 0)) >= 2] or rows
    summary = json.loads((options.out_dir / "summary.json").read_text())
    m = int(summary["num_params"])

    def up_per_client(row: Mapping[str, Any]) -> float | None:
        participants = row.get("participants") or 0
        return row["bytes_up"]["total"] / participants if participants else None

    up = _median([up_per_client(r) for r in steady])
    return {
        "n": n,
        "runtime": "simulation" if simulate else "loopback",
        "secure": secure,
        "round_seconds": _median([r.get("round_seconds") for r in steady]),
        "round_trips": _median([r.get("round_trips") for r in steady]),
        "server_cpu_per_round": _median([r.get("server_cpu_seconds") for r in steady]),
        "server_thread_cpu_per_round": _median(
            [r.get("server_thread_cpu_seconds") for r in steady]
        ),
        "all_cpu_per_round": cpu / max(1, len(rows)),
        "bytes_up_per_client": up,
        "bytes_per_param": None if up is None else up / m,
        "b": _median([(r.get("secure_aggregation") or {}).get("b") for r in steady]),
        "accuracy": rows[-1].get("test_accuracy") if rows else None,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Print the table (and write ``--json``); asserts nothing."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[10])
    parser.add_argument(
        "--local-max",
        type=int,
        default=10,
        help="largest n run on loopback; larger n use the simulation runtime",
    )
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--mechanism", default="corbin")
    parser.add_argument("--max-steps", type=int, default=0, help="run config max-steps")
    parser.add_argument("--timeout", type=float, default=3600.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)  # fmt: skip
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-secagg-") as tmp:
        for n in args.clients:
            for secure in (False, True):
                row = run_once(n, secure, args, Path(tmp))
                if row is not None:
                    rows.append(row)
    plain = {r["n"]: r for r in rows if not r["secure"]}
    head = ("n", "runtime", "secure", "round s", "ratio", "trips", "server CPU s",
            "server thread CPU s", "all CPU s",
            "up B/client", "B/param", "vs FedAvg", "b", "test acc")  # fmt: skip
    print(" | ".join(head))
    for r in rows:
        base = plain.get(r["n"])
        ratio = (r["round_seconds"] / base["round_seconds"]
                 if base and r["round_seconds"] and base["round_seconds"] else None)  # fmt: skip
        per_param = r["bytes_per_param"]
        cells = (r["n"], r["runtime"], "on" if r["secure"] else "off", r["round_seconds"], ratio,
                 r["round_trips"], r["server_cpu_per_round"], r["server_thread_cpu_per_round"],
                 r["all_cpu_per_round"],
                 r["bytes_up_per_client"], per_param,
                 None if per_param is None else per_param / FEDAVG_BYTES_PER_PARAM,
                 r["b"], r["accuracy"])  # fmt: skip
        print(" | ".join("-" if c is None else f"{c:.4g}" if isinstance(c, float) else str(c)
                         for c in cells))  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
