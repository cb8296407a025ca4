"""Throughput of the CorBin-FL mechanisms core on one CPU core (or the given thread count).

Usage::

    python bench/bench_mechanisms.py [--m 11200000 --d 5 --clients 50 --threads 1 --repeats 7]

Prints, best of ``--repeats`` runs (wall clock, and process CPU time, which is less sensitive
to other processes sharing the machine):

(a) client path: ``expand_seed`` + ``corbinq`` + ``pack_bits`` in parameters/s, per step
    (floor: 50M params/s on one core); also with per-element ``c``/``r`` tensors, for LDPQ and
    for PBM with one trial (the finite-output release, ``FiniteMechanism.sample``);
(b) server aggregation of ``--clients`` packed updates with ``BitCounter`` + ``mean_from_counts``
    in client-params/s (floor: 1,000M client-params/s on one core);
(c) bytes of one update, ``ceil(m/8)``, against float32 FedAvg (``4m``) and the ratio.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from corbin_fl.mechanisms import (
    BitCounter,
    context_label,
    corbinq,
    expand_seed,
    ldpq,
    mean_from_counts,
    pack_bits,
)
from corbin_fl.mechanisms.baselines.pbm import PBM
from corbin_fl.mechanisms.packing import pack_symbols

CLIENT_FLOOR = 50e6
SERVER_FLOOR = 1000e6


@dataclass
class Timing:
    """Best wall-clock and CPU seconds of a step over the repeats."""

    wall: float
    cpu: float


def _time(fn: Callable[[], object], repeats: int) -> Timing:
    wall, cpu = float("inf"), float("inf")
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        w1, c1 = time.perf_counter(), time.process_time()
        wall, cpu = min(wall, w1 - w0), min(cpu, c1 - c0)
    return Timing(wall, cpu)


def _rate(count: float, t: Timing) -> str:
    return f"{count / t.wall / 1e6:9.1f} M/s wall {count / t.cpu / 1e6:9.1f} M/s cpu"


def _row(name: str, count: float, t: Timing) -> None:
    print(f"  {name:<34} {t.wall * 1e3:8.1f} ms  ({t.cpu * 1e3:7.1f} ms cpu)  {_rate(count, t)}")


def _verdict(what: str, count: float, t: Timing, floor: float, unit: str) -> None:
    """Compare both rates with the floor (CPU time is the single-core figure on a busy host)."""
    parts = []
    for name, sec in (("wall", t.wall), ("cpu", t.cpu)):
        rate = count / sec
        ok = "OK" if rate >= floor else "BELOW FLOOR"
        parts.append(f"{name} {rate / 1e6:,.0f}M {unit} = {rate / floor:.1f}x floor ({ok})")
    print(f"  -> {what}: " + "; ".join(parts) + f" [floor {floor / 1e6:,.0f}M]")


def main() -> None:
    """Run the benchmark and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, default=11_200_000, help="parameters per update")
    parser.add_argument("--d", type=int, default=5, help="shared bits per parameter")
    parser.add_argument("--clients", type=int, default=50, help="updates aggregated by the server")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--eps", type=float, default=1.0, help="PLDP budget")
    parser.add_argument("--repeats", type=int, default=7, help="timing repeats (best is kept)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    m, d, n = args.m, args.d, args.clients

    print(
        f"m={m:,} d={d} clients={n} threads={args.threads} eps={args.eps} "
        f"torch={torch.__version__} numpy={np.__version__} cpus={os.cpu_count()} "
        f"loadavg={os.getloadavg()[0]:.2f}"
    )
    gen = torch.Generator().manual_seed(1234)
    w = torch.randn(m, generator=gen) * 0.05
    c, r = 0.0, 0.2
    c_t = torch.full((m,), c)
    r_t = torch.full((m,), r)
    seed = bytes(range(32))
    label = context_label(1, 1, 17, 42)
    coins = torch.Generator().manual_seed(99)

    # (a) client path -------------------------------------------------------------------------
    z = expand_seed(seed, label, m, d)
    bits = corbinq(w, c, r, args.eps, z, d, lead=True, generator=coins)
    t_expand = _time(lambda: expand_seed(seed, label, m, d), args.repeats)
    t_lead = _time(lambda: corbinq(w, c, r, args.eps, z, d, generator=coins), args.repeats)
    t_follow = _time(
        lambda: corbinq(w, c, r, args.eps, z, d, lead=False, generator=coins), args.repeats
    )
    t_pack = _time(lambda: pack_bits(bits), args.repeats)

    def client_path() -> np.ndarray:
        zz = expand_seed(seed, label, m, d)
        return pack_bits(corbinq(w, c, r, args.eps, zz, d, generator=coins))

    def client_path_tensor_cr() -> np.ndarray:
        zz = expand_seed(seed, label, m, d)
        return pack_bits(corbinq(w, c_t, r_t, args.eps, zz, d, generator=coins))

    t_client = _time(client_path, args.repeats)
    t_client_t = _time(client_path_tensor_cr, args.repeats)
    t_ldpq = _time(lambda: pack_bits(ldpq(w, c, r, args.eps, generator=coins)), args.repeats)
    pbm = PBM(args.eps, 1)
    t_pbm = _time(
        lambda: pack_symbols(pbm.sample(w, c, r, generator=coins), pbm.bits), args.repeats
    )
    print("(a) client path (per step; floor 50M params/s for the whole path)")
    _row("expand_seed (ChaCha20)", m, t_expand)
    _row("corbinq lead (scalar c, r)", m, t_lead)
    _row("corbinq follow (scalar c, r)", m, t_follow)
    _row("pack_bits", m, t_pack)
    _row("TOTAL expand+corbinq+pack", m, t_client)
    _row("TOTAL, per-element c/r tensors", m, t_client_t)
    _row("ldpq + pack_bits (unpaired)", m, t_ldpq)
    _row("pbm (m = 1) + pack_symbols", m, t_pbm)
    _verdict("client path", m, t_client, CLIENT_FLOOR, "params/s")

    # (b) server aggregation ------------------------------------------------------------------
    rng = np.random.default_rng(7)
    updates = [np.packbits(rng.random(m, dtype=np.float32) < 0.5) for _ in range(n)]

    def server() -> torch.Tensor:
        counter = BitCounter(m)
        for u in updates:
            counter.add(u)
        return mean_from_counts(counter.counts(), n, c, r, args.eps)

    counter = BitCounter(m)
    for u in updates:
        counter.add(u)

    def adds_only() -> None:
        ctr = BitCounter(m)
        for u in updates:
            ctr.add(u)

    t_adds = _time(adds_only, args.repeats)
    t_counts = _time(counter.counts, args.repeats)
    k = counter.counts()
    t_mean = _time(lambda: mean_from_counts(k, n, c, r, args.eps), args.repeats)
    t_server = _time(server, args.repeats)
    print(f"(b) server aggregation of {n} packed updates (floor 1000M client-params/s)")
    _row(f"{n} x BitCounter.add", n * m, t_adds)
    _row("BitCounter.counts", n * m, t_counts)
    _row("mean_from_counts", n * m, t_mean)
    _row("TOTAL", n * m, t_server)
    _verdict("server aggregation", n * m, t_server, SERVER_FLOOR, "client-params/s")

    # (c) bytes -------------------------------------------------------------------------------
    one_bit = (m + 7) // 8
    fedavg = 4 * m
    print("(c) uplink bytes per update")
    print(f"  one-bit update      {one_bit:>14,} B")
    print(f"  float32 FedAvg      {fedavg:>14,} B")
    print(f"  ratio               {fedavg / one_bit:>14.2f} x smaller")
    print(f"  (+ exact mode z     {(d * m + 7) // 8:>14,} B lead->follow, vs a 32-byte seed)")


if __name__ == "__main__":
    main()
