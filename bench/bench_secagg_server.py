"""The SecAgg+ server's CPU per stage, on the pure in-memory protocol (no Flower; issue 29).

Drives :class:`corbin_fl.secagg.server.SecAggServer` and one
:class:`corbin_fl.secagg.client.SecAggClient` per node through one round, as
:func:`corbin_fl.secagg.simulate.simulate_round` does, and times only the server's calls
(process CPU seconds, ``time.process_time``; the clients' work is not counted). Inputs are
integers in ``[0, levels]`` drawn from ``--seed``, so two runs see the same inputs (the clients'
keys are fresh each run, as in a real round, and the neighbour graph is derived from them).
``--drop-mask D`` makes ``D`` nodes skip the mask stage (they shared their keys but send no
masked input), so the server must reconstruct their mask keys and remove every pair
mask a survivor added with them; ``--drop-unmask`` does the same for survivors that do not
answer the unmask stage. Each scenario prints one line per stage, the total, whether the sum is
exact, and a digest of the sum (equal digests before and after a change: bit-identical output).
``--profile N`` prints cProfile's top ``N`` entries (cumulative and own time) of the server's
calls in the last scenario.

Usage::

    python bench/bench_secagg_server.py                       # n = 100, m = 421,642 (the CNN)
    python bench/bench_secagg_server.py --clients 50 100 --drop-mask 0 5
    python bench/bench_secagg_server.py --clients 100 --drop-mask 5 --profile 25
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import io
import pstats
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from corbin_fl.secagg.client import SecAggClient
from corbin_fl.secagg.messages import ADVERTISE, MASK, SHARE, UNMASK
from corbin_fl.secagg.server import SecAggServer
from corbin_fl.secagg.simulate import answers

CNN_PARAMETERS = 421_642
"""``app.models.SmallCNN()``'s floating-point entries (parameters and buffers)."""


class _Timer:
    """Sums the process CPU of the server calls it wraps, per stage; optionally profiles them."""

    def __init__(self, profiler: cProfile.Profile | None) -> None:
        self.seconds: dict[str, float] = {}
        self.profiler = profiler

    def __call__(self, stage: str, call: Callable[..., Any], *args: Any) -> Any:
        if self.profiler is not None:
            self.profiler.enable()
        start = time.process_time()
        try:
            return call(*args)
        finally:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + time.process_time() - start
            if self.profiler is not None:
                self.profiler.disable()


def run_round(
    n: int,
    m: int,
    levels: int,
    seed: int,
    drop: Mapping[str, set[int]],
    profiler: cProfile.Profile | None,
) -> tuple[dict[str, float], bool, str, dict[str, int]]:
    """One round; per-stage server CPU, exactness, the sum's digest and the round's sizes."""
    rng = np.random.default_rng(seed)
    ids = [1000 + 7 * i for i in range(n)]
    inputs = {u: rng.integers(0, levels + 1, size=m, dtype=np.int64) for u in ids}
    clients = {u: SecAggClient(u, 1) for u in ids}
    timer = _Timer(profiler)
    server = timer(
        "init",
        lambda: SecAggServer(
            run_id=1,
            server_round=1,
            node_ids=ids,
            levels=levels,
        ),
    )
    gone: set[int] = set()

    def answer(stage: str, requests: Mapping[int, Any], call: Callable) -> tuple[dict, dict]:
        gone.update(drop.get(stage, set()))
        return answers(requests, call, gone)

    if server.stage == ADVERTISE:
        targets = {u: None for u in server.advertise_targets()}
        replies = answer(ADVERTISE, targets, lambda u, _: clients[u].advertise(1))
        timer("advertise", server.receive_adverts, *replies)
    requests = timer("share", server.share_requests)
    timer(
        "share",
        server.receive_shares,
        *answer(SHARE, requests, lambda u, r: clients[u].share_keys(r)),
    )
    requests = timer("mask", server.mask_requests)
    replies = answer(MASK, requests, lambda u, r: clients[u].mask(r, inputs[u]))
    timer("mask", server.receive_masked, *replies)
    if server.abandoned:
        raise SystemExit(f"round abandoned: {server.abandoned}")
    requests = timer("unmask", server.unmask_requests)
    replies = answer(UNMASK, requests, lambda u, r: clients[u].unmask(r))
    outcome = timer("unmask", server.receive_unmask, *replies)
    if outcome.abandoned:
        raise SystemExit(f"round abandoned: {outcome.abandoned}")
    expected = sum(inputs[u] for u in outcome.survivors)
    total = outcome.total
    exact = bool(np.array_equal(total, expected))
    digest = hashlib.sha256(np.ascontiguousarray(total, dtype="<i8").tobytes()).hexdigest()[:16]
    sizes = {
        "k": server.k,
        "t": server.threshold,
        "b": server.config.bits,
        "survivors": len(outcome.survivors),
        "dropped": len(outcome.dropped),
    }
    return timer.seconds, exact, digest, sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[100])
    parser.add_argument("--length", type=int, default=CNN_PARAMETERS, help="m, the vector length")
    parser.add_argument("--levels", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--drop-mask", type=int, nargs="+", default=[0, 5], help="nodes that skip the mask stage"
    )
    parser.add_argument(
        "--drop-unmask", type=int, default=0, help="survivors that skip the unmask stage"
    )
    parser.add_argument("--profile", type=int, default=0, help="print cProfile's top N entries")
    args = parser.parse_args()
    stages = ("init", "advertise", "share", "mask", "unmask")
    print(f"m = {args.length}, levels = {args.levels}, seed = {args.seed}; server CPU seconds")
    print(
        "| n | k | t | b | drop mask | drop unmask | "
        + " | ".join(stages)
        + " | total | exact | digest |"
    )
    print("|" + "---|" * (len(stages) + 9))
    profiler = None
    scenarios = [(n, d) for n in args.clients for d in args.drop_mask]
    for i, (n, dropped) in enumerate(scenarios):
        last = i == len(scenarios) - 1
        profiler = cProfile.Profile() if args.profile and last else None
        # Every 10th node (from the 4th) skips the mask stage, every 10th (from the 8th) unmask.
        ids = [1000 + 7 * j for j in range(n)]
        drop = {
            MASK: set(ids[3::10][:dropped]),
            UNMASK: set(ids[7::10][: args.drop_unmask]),
        }
        seconds, exact, digest, sizes = run_round(
            n, args.length, args.levels, args.seed, drop, profiler
        )
        cells = " | ".join(f"{seconds.get(s, 0.0):.3f}" for s in stages)
        print(
            f"| {n} | {sizes['k']} | {sizes['t']} | {sizes['b']} | {dropped} | {args.drop_unmask} "
            f"| {cells} | {sum(seconds.values()):.3f} | {exact} | {digest} |",
            flush=True,
        )
    if profiler is not None:
        for key in ("cumulative", "tottime"):
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats(key).print_stats(args.profile)
            print(f"\ncProfile of the server's calls, last scenario, sorted by {key}:")
            print(out.getvalue().split("\n", 4)[-1].rstrip())


if __name__ == "__main__":
    main()
