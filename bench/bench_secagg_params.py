"""SecAgg+'s k and t against dropouts, on the pure in-memory protocol (no Flower; issue 38).

For each ``--clients n`` the script prints the parameters :func:`corbin_fl.secagg.graph.
secagg_parameters` chooses (``k``, ``t`` and their bounds: ``p_security``, a client exposed to
its colluding neighbours, and ``p_abandon``, a round abandoned) and runs ``--rounds`` rounds of
:func:`corbin_fl.secagg.simulate.simulate_round` in which ``round(loss * n)`` clients still in
the round, drawn at random, are lost at each of the four stages (advertise, share, mask,
unmask; a lost client answers no later stage), or, with ``--independent``, every client is lost
independently with probability ``--loss`` at each stage; draws from ``--seed``. It prints the
rounds abandoned (and why), whether every completed sum was exact, and the wall time per round.
``--large N`` then times one round at ``n = N`` with the same losses. ``--grind G`` runs the
exact split search (:func:`corbin_fl.secagg.adversary.find_split`) on ``G`` derived graphs at
the issue's ``n = 40, k = 16, t = 9`` with 2 colluders placed by the search (an adversary that
can grind the graph may place them anywhere) and 14 drops, and prints how many have a split.

Usage::

    python bench/bench_secagg_params.py                                  # n = 20, 200 rounds
    python bench/bench_secagg_params.py --clients 20 --rounds 200 --independent
    python bench/bench_secagg_params.py --rounds 0 --large 1000 --grind 3
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from corbin_fl.secagg import crypto
from corbin_fl.secagg.adversary import check_split, find_split
from corbin_fl.secagg.graph import derived_graph, secagg_parameters
from corbin_fl.secagg.messages import STAGES, KeyAdvert
from corbin_fl.secagg.simulate import simulate_round

LENGTH = 16
"""Entries of each client's input (the protocol's cost per round is dominated by n, k, t)."""


def losses(
    ids: list[int], loss: float, rng: np.random.Generator, independent: bool
) -> dict[str, set[int]]:
    """The clients lost at each stage (module docstring): ``round(loss * n)`` of those left,
    or each client with probability ``loss`` (the first stage it misses)."""
    drop: dict[str, set[int]] = {stage: set() for stage in STAGES}
    left = list(ids)
    for stage in STAGES:
        if independent:
            lost = [u for u in left if rng.random() < loss]
        else:
            lost = [left[i] for i in rng.choice(len(left), round(loss * len(ids)), replace=False)]
        drop[stage] = set(lost)
        left = [u for u in left if u not in drop[stage]]
    return drop


def one_round(
    n: int, loss: float, rng: np.random.Generator, rnd: int, independent: bool
) -> tuple[str | None, bool]:
    """One round at ``n`` clients: its abandon reason (None) and whether its sum was exact."""
    ids = [1000 + 3 * i for i in range(n)]
    inputs = {u: rng.integers(0, 2, size=LENGTH) for u in ids}
    drop = losses(ids, loss, rng, independent)
    out, _ = simulate_round(inputs, 1, server_round=rnd, drop=drop)
    if out.total is None:
        return out.abandoned, False
    return None, bool(np.array_equal(out.total, sum(inputs[u] for u in out.survivors)))


def bench(n: int, rounds: int, loss: float, rng: np.random.Generator, independent: bool) -> None:
    p = secagg_parameters(n)
    print(
        f"n = {n}: k = {p.k}, t = {p.t} (dropout {p.dropout:g}/stage over {p.stages} stages, "
        f"collusion {p.collusion:.3g} = {p.corrupt} clients): p_security <= {p.p_security:.3g}, "
        f"p_abandon <= {p.p_abandon:.3g}"
    )
    reasons: collections.Counter[str] = collections.Counter()
    exact, t0 = 0, time.perf_counter()
    for rnd in range(1, rounds + 1):
        why, ok = one_round(n, loss, rng, rnd, independent)
        if why is not None:
            reasons[why.split(":")[0]] += 1
        exact += ok
    seconds = (time.perf_counter() - t0) / rounds
    abandoned = sum(reasons.values())
    print(
        f"  {rounds} round(s), {'each client lost w.p.' if independent else 'lost:'} {loss:g} "
        f"per stage: {abandoned} abandoned "
        f"{dict(reasons) or ''}, {exact}/{rounds - abandoned} completed sums exact, "
        f"{seconds:.2f} s per round"
    )


def grind(graphs: int, seed: int) -> None:
    n, k, t, drops = 40, 16, 9, 14
    rng = np.random.default_rng(seed)
    found = 0
    for g in range(graphs):
        ids = list(range(1, n + 1))
        adverts = {u: KeyAdvert(*(crypto.public_of(rng.bytes(32)) for _ in range(2))) for u in ids}
        _, graph = derived_graph(1, 1, k, adverts)
        t0 = time.perf_counter()
        split = find_split(graph, t, drops, num_colluders=2)
        ok = split is not None and check_split(graph, split, t, drops)
        found += ok
        print(f"  graph {g}: {'SPLIT' if ok else 'no split'} ({time.perf_counter() - t0:.1f} s)")
    print(f"n = {n}, k = {k}, t = {t}, 2 colluders anywhere, {drops} drops: {found}/{graphs} split")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[20])
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--loss", type=float, default=0.08)
    ap.add_argument("--independent", action="store_true", help="independent losses")
    ap.add_argument("--large", type=int, default=0, help="time one round at this n (0: none)")
    ap.add_argument("--grind", type=int, default=0, help="graphs for the split search (0: none)")
    ap.add_argument("--seed", type=int, default=38)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    for n in args.clients if args.rounds else []:
        bench(n, args.rounds, args.loss, rng, args.independent)
    if args.large:
        bench(args.large, 1, args.loss, rng, args.independent)
    if args.grind:
        grind(args.grind, args.seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
