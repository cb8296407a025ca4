"""The chosen-dropout adversary of SecAgg+ as an exact search (issue 38): can a server that
sees the neighbour graph, with some colluding clients, choose the dropouts so that it unmasks
the sums of two disjoint parts of the honest survivors instead of their one sum?

After a round the server holds every survivor's ``y_u``, every survivor's self-mask seed and
every dropped node's mask key (from ``t`` holders each), and a colluder's keys. The pairwise
mask of an edge between survivors ``u``, ``v`` cancels only in a sum that holds both, so the
server can unmask ``sum_{u in S} x_u`` for a set ``S`` of honest survivors exactly when no
graph edge joins ``S`` to another honest survivor: ``S`` is a union of connected components of
the graph on the honest survivors (colluders' and dropped nodes' edges are removable). A round
reaches the unmask only if every survivor keeps ``t`` surviving holders (its neighbours among
the survivors, colluders included), and honest clients refuse it when the survivors' graph
(colluders included) is disconnected (``client.py``).

:func:`find_split` decides, by a 0/1 program (scipy's HiGHS ``milp``), whether some choice of at
most ``max_drops`` dropouts (and, with ``colluders = None``, of ``num_colluders`` colluders
placed anywhere, as a grinding adversary could) splits the honest survivors into two non-empty
sides ``S``, ``R`` with no edge between them and every survivor keeping ``t`` surviving
neighbours. The program omits the other conditions of a round (a dropped node's mask key also
needs ``t`` holders, at least 2 survivors), so it over-approximates the adversary: "no split"
is a proof for that graph; a split it returns is checked by :func:`check_split`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Split:
    """Two sides of honest survivors with no edge between them, the drops and the colluders."""

    side_a: frozenset[int]
    side_b: frozenset[int]
    dropped: frozenset[int]
    colluders: frozenset[int]


def check_split(
    graph: Mapping[int, Collection[int]], split: Split, threshold: int, max_drops: int
) -> bool:
    """Whether ``split`` is one: disjoint non-empty sides, no edge between them, at most
    ``max_drops`` dropped, every survivor (sides and colluders) with ``threshold`` surviving
    neighbours."""
    a, b, d, c = split.side_a, split.side_b, split.dropped, split.colluders
    parts = [a, b, d, c]
    if not a or not b or len(d) > max_drops or sum(map(len, parts)) != len(set().union(*parts)):
        return False
    if set().union(*parts) != set(graph):
        return False
    alive = a | b | c
    if any(set(graph[u]) & b for u in a):
        return False
    return all(len(set(graph[u]) & alive) >= threshold for u in a | b)


def find_split(
    graph: Mapping[int, Collection[int]],
    threshold: int,
    max_drops: int,
    *,
    colluders: Collection[int] | None = None,
    num_colluders: int = 0,
    time_limit: float = 600.0,
) -> Split | None:
    """A split of the honest survivors (module docstring), or None when there is none.

    ``colluders``: fixed colluders (chosen before the graph); ``None``: up to ``num_colluders``
    placed by the search. Variables per node ``v``: ``a_v, b_v, d_v, c_v`` in {0, 1} (side A,
    side B, dropped, colluder), one of them 1; ``sum d <= max_drops``; ``a_u + b_v <= 1`` for
    every edge; ``sum_{w in N(u)} (a_w + c_w) >= t a_u`` (and with ``b``); both sides non-empty.
    Raises ``RuntimeError`` if the solver stops without an answer (time limit).
    """
    # Lazy: scipy.optimize costs 1.2 s to import (measured on the 2-core development machine).
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    nodes = sorted(graph)
    idx = {v: i for i, v in enumerate(nodes)}
    m = len(nodes)
    a_, b_, d_, c_ = 0, m, 2 * m, 3 * m
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    lo: list[float] = []
    hi: list[float] = []

    def add(coefs: Mapping[int, float], low: float, high: float) -> None:
        r = len(lo)
        for j, value in coefs.items():
            rows.append(r)
            cols.append(j)
            vals.append(value)
        lo.append(low)
        hi.append(high)

    fixed = None if colluders is None else {idx[v] for v in colluders}
    for i in range(m):
        add({a_ + i: 1, b_ + i: 1, d_ + i: 1, c_ + i: 1}, 1, 1)
        if fixed is not None:
            add({c_ + i: 1}, float(i in fixed), float(i in fixed))
    if fixed is None:
        add({c_ + i: 1 for i in range(m)}, 0, num_colluders)
    add({d_ + i: 1 for i in range(m)}, 0, max_drops)
    add({a_ + i: 1 for i in range(m)}, 1, np.inf)
    add({b_ + i: 1 for i in range(m)}, 1, np.inf)
    for u in nodes:
        i = idx[u]
        for v in graph[u]:
            add({a_ + i: 1, b_ + idx[v]: 1}, -np.inf, 1)
        for side in (a_, b_):
            coefs: dict[int, float] = {}
            for v in graph[u]:
                coefs[side + idx[v]] = 1
                coefs[c_ + idx[v]] = 1
            coefs[side + i] = coefs.get(side + i, 0) - threshold
            add(coefs, 0, np.inf)
    matrix = coo_matrix((vals, (rows, cols)), shape=(len(lo), 4 * m)).tocsr()
    res = milp(
        np.zeros(4 * m),
        constraints=LinearConstraint(matrix, lo, hi),
        integrality=np.ones(4 * m),
        bounds=Bounds(0, 1),
        options={"time_limit": time_limit},
    )
    if res.status == 2:  # infeasible: no split exists
        return None
    if res.x is None:
        raise RuntimeError(f"the split search stopped without an answer: {res.message}")
    pick = [frozenset(v for v in nodes if res.x[off + idx[v]] > 0.5) for off in (a_, b_, d_, c_)]
    return Split(*pick)
