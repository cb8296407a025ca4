"""The neighbour graph of SecAgg+ and the round's public parameters (k, t, b).

Bell et al. 2020 ("Secure Single-Server Aggregation with (Poly)Logarithmic Overhead", CCS 2020,
eprint 2020/704) replace the complete graph of Bonawitz et al. 2017 by a random ``k``-regular
graph: client ``u`` agrees pairwise masks with, and secret-shares its seeds among, its ``k``
neighbours only. Here:

* **The graph** (:func:`derived_graph`) is a random ``k``-regular simple graph on the round's
  participants (the pairing model with restarts of the failed pairs, as
  ``networkx.random_regular_graph``), drawn from a generator seeded by :func:`graph_seed`: the
  SHA-256 of a domain-separation label, the run, the round, ``k`` and EVERY participant's node
  id and both advertised public keys in node-id order. The server cannot pick a graph outright,
  and every client recomputes the graph from the participant list its share request carries
  and refuses a request whose neighbour set is not the derived one (``client.py``). It is not a
  coin toss: the server chooses which adverts go in and colluding clients choose their keys after
  seeing the honest ones, so an adversary can try one graph per key it generates (each try costs
  a key pair, a hash and a graph); ``SECURITY.md`` says what this does and does not stop.
  ``k = n - 1`` is the complete graph (the original SecAgg). The graph is an expander with high
  probability: unlike the Harary ring this code used before (a ring on a public permutation, in
  which ``k`` consecutive nodes cut the ring in two), splitting a random regular graph into two
  large parts needs far more than ``k`` nodes removed (``tests/unit/test_secagg_attack.py``).
* **k and t** (:func:`secagg_parameters`): sized from the number of clients ``n``, the fraction
  ``dropout`` of clients lost at each of the ``stages = 3`` stages after the graph is drawn
  (share, mask, unmask), the fraction ``collusion`` of clients that may collude with the server,
  and two targets: security ``2^-sigma`` and correctness ``2^-eta``, as Bell et al. Sec. 4 size
  theirs, but with exact tails (scipy) for this graph instead of their asymptotic constants.
  ``t > k/2`` always (an honest client reveals, per peer, either the self-mask share or the
  mask-key share, never both, so the server needs ``2t > k`` distinct holders to get both) and
  ``t >= 2`` (a 1-out-of-``k`` share is the secret itself).
* ``b``: :func:`bit_width`.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections import deque
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

from .messages import KeyAdvert
from .prg import MAX_BITS

MIN_CLIENTS: Final[int] = 3
"""Fewest clients of a secure round: with 2, each client's input is the sum minus its own."""
GRAPH_LABEL: Final[bytes] = b"corbin-fl/secagg/graph/v2"
"""Domain separation of :func:`graph_seed` (v2: the graph derived from every advert)."""
DROPOUT: Final[float] = 0.08
"""Default fraction of the clients lost at each stage (:func:`secagg_parameters`)."""
STAGES: Final[int] = 3
"""Stages after the graph is drawn at which a share holder can be lost: share, mask, unmask."""
COLLUSION: Final[float] = 1 / 3
"""Default fraction of the clients that may collude with the server."""
SIGMA: Final[int] = 40
"""Default security target: a client's secrets exposed with probability at most ``2^-40``."""
ETA: Final[int] = 30
"""Default correctness target: a round abandoned with probability at most ``2^-30``."""


def bit_width(num_clients: int, levels: int) -> int:
    """The smallest ``b`` with ``2^b > num_clients * levels``: ``b = ceil(log2(n * levels + 1))``.

    Inputs are integers in ``[0, levels]``, so the exact sum of ``n`` of them is at most
    ``n * levels`` and fits ``b`` bits; arithmetic mod ``2^b`` then returns it exactly. For a
    one-bit mechanism (``levels = 1``) this is ``ceil(log2(n + 1))``. Raises if ``b > 62``.
    """
    for name, value in (("num_clients", num_clients), ("levels", levels)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    bits = (num_clients * levels).bit_length()
    if bits > MAX_BITS:
        raise ValueError(f"n * levels = {num_clients * levels} needs {bits} > {MAX_BITS} bits")
    return bits


@dataclass(frozen=True)
class SecAggParameters:
    """``k``, ``t`` and the probabilities they give (:func:`secagg_parameters`).

    ``p_security``: an upper bound on the probability that some client has ``t`` or more of the
    ``corrupt = floor(collusion * n)`` colluding clients among its neighbours (they then hold
    enough shares to unmask it), over the graph's randomness for a corrupt set fixed before it.
    ``p_abandon``: an upper bound on the probability that a round is abandoned because a needed
    secret has fewer than ``t`` surviving holders, each client lost independently with
    probability ``dropout`` at each of ``stages`` stages.
    """

    n: int
    k: int
    t: int
    dropout: float
    stages: int
    collusion: float
    corrupt: int
    sigma: int
    eta: int
    p_security: float
    p_abandon: float

    @property
    def meets_targets(self) -> bool:
        """Both bounds within ``2^-sigma`` and ``2^-eta``."""
        return self.p_security <= 2.0**-self.sigma and self.p_abandon <= 2.0**-self.eta

    def as_dict(self) -> dict[str, float | int]:
        """The figures a run's report prints."""
        return {
            "k": self.k,
            "t": self.t,
            "dropout_per_stage": self.dropout,
            "stages": self.stages,
            "collusion": self.collusion,
            "p_security": self.p_security,
            "p_abandon": self.p_abandon,
            "sigma": self.sigma,
            "eta": self.eta,
        }


def failure_probabilities(
    n: int,
    k: int,
    t: int,
    *,
    dropout: float,
    collusion: float,
    stages: int = STAGES,
    corrupt: int | None = None,
) -> tuple[float, float]:
    """``(p_security, p_abandon)`` of ``k``, ``t`` at ``n`` clients (:class:`SecAggParameters`).

    With ``c = floor(collusion * n)`` (or ``corrupt``) and ``q = (1 - dropout)^stages`` (a
    holder answers the share, mask and unmask stages):

    * random ``k``-regular graph (``k < n - 1``): a client's ``k`` neighbours are a uniform
      ``k``-subset of the other ``n - 1`` (labels are exchangeable), so by the union bound over
      the ``n`` clients ``p_security <= n * P[Hyp(n - 1, c, k) >= t]`` and
      ``p_abandon <= n * P[Bin(k, q) < t]`` (a round is abandoned only if some client keeps
      fewer than ``t`` of its neighbours through the unmask);
    * complete graph (``k = n - 1``): ``p_security = 1`` if ``c >= t`` else 0; the round is
      abandoned exactly when ``R``, the clients that answer the unmask, has ``|R| <= t``
      (a survivor in ``R`` has ``|R| - 1`` holders), so ``p_abandon = P[Bin(n, q) <= t]``.
    """
    # Lazy: scipy.stats costs 1.8 s to import (measured on the 2-core development machine) in
    # every ClientApp process, which imports this module through secagg's client.
    from scipy.stats import binom, hypergeom

    if not 0.0 <= dropout < 1.0 or not 0.0 <= collusion < 1.0:
        raise ValueError(f"dropout and collusion must lie in [0, 1), got {dropout}, {collusion}")
    c = math.floor(collusion * n) if corrupt is None else corrupt
    q = (1.0 - dropout) ** stages
    if k == n - 1:
        return (1.0 if c >= t else 0.0), float(binom.cdf(t, n, q))
    p_sec = min(1.0, n * float(hypergeom.sf(t - 1, n - 1, c, k)))
    return p_sec, min(1.0, n * float(binom.cdf(t - 1, k, q)))


@functools.lru_cache(maxsize=256)
def secagg_parameters(
    n: int,
    dropout: float = DROPOUT,
    collusion: float = COLLUSION,
    sigma: int = SIGMA,
    eta: int = ETA,
    stages: int = STAGES,
    corrupt: int | None = None,
) -> SecAggParameters:
    """The smallest ``k`` (even, or ``n - 1``) with a ``t`` that meets both targets; ``t`` is
    the smallest that meets the security target (the most dropout-tolerant).

    ``t`` ranges over ``max(2, floor(k/2) + 1) .. k``. When no ``k < n - 1`` meets both
    targets, the complete graph with the smallest secure ``t`` is returned, and its
    :attr:`SecAggParameters.p_abandon` may exceed ``2^-eta`` (a run prints the figure).
    ``corrupt`` (default ``floor(collusion * n)``) fixes the colluders' count: a server that
    draws the graph over the ``n`` clients left after the advertise stage sizes ``t`` against
    the colluders among the clients it sampled, who may all be among those left.
    Raises ``ValueError`` for ``n < 3`` or a fraction outside ``[0, 1)``.
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < MIN_CLIENTS:
        raise ValueError(f"secure aggregation needs at least {MIN_CLIENTS} clients, got {n!r}")
    for name, value in (("sigma", sigma), ("eta", eta), ("stages", stages)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")

    c = math.floor(collusion * n) if corrupt is None else corrupt

    def best(k: int) -> tuple[int, float, float]:
        for t in range(max(2, k // 2 + 1), k + 1):
            ps, pa = failure_probabilities(n, k, t, dropout=dropout, collusion=collusion, corrupt=c)
            if ps <= 2.0**-sigma:
                return t, ps, pa
        t = k
        return (
            t,
            *failure_probabilities(n, k, t, dropout=dropout, collusion=collusion, corrupt=c),
        )

    for k in range(2, n - 1, 2):
        t, ps, pa = best(k)
        if ps <= 2.0**-sigma and pa <= 2.0**-eta:
            break
    else:
        k = n - 1
        t, ps, pa = best(k)
    return SecAggParameters(n, k, t, dropout, stages, collusion, c, sigma, eta, ps, pa)


def choose_parameters(
    num_clients: int, num_neighbours: int | None = None, threshold: int | None = None
) -> tuple[int, int]:
    """``(k, t)`` for ``n`` clients: :func:`secagg_parameters`' defaults, or the given values
    validated (``k`` above ``n - 1`` becomes ``n - 1``; a given ``k`` takes its own default
    ``t = max(2, floor(k/2) + 1)``).

    Raises ``ValueError`` when ``n < 3``, ``k`` is not ``n - 1`` and is odd or out of
    ``[2, n - 1)``, or ``t`` is not in ``(k/2, k]`` or is below 2.
    """
    n = num_clients
    if not isinstance(n, int) or isinstance(n, bool) or n < MIN_CLIENTS:
        raise ValueError(f"secure aggregation needs at least {MIN_CLIENTS} clients, got {n!r}")
    if num_neighbours is None:
        params = secagg_parameters(n)
        k, default_t = params.k, params.t
    else:
        k = num_neighbours
        if not isinstance(k, int) or isinstance(k, bool):
            raise ValueError(f"num_neighbours must be an integer, got {k!r}")
        k = min(k, n - 1)
        if k != n - 1 and (k < 2 or k % 2):
            raise ValueError(
                f"num_neighbours must be even in [2, n - 1) or n - 1 = {n - 1}, got {k}"
            )
        default_t = max(2, k // 2 + 1)
    t = default_t if threshold is None else threshold
    if not isinstance(t, int) or isinstance(t, bool) or not k / 2 < t <= k or t < 2:
        raise ValueError(f"threshold must satisfy k/2 < t <= k and t >= 2 (k = {k}), got {t!r}")
    return k, t


def graph_seed(
    run_id: int, server_round: int, num_neighbours: int, adverts: Mapping[int, KeyAdvert]
) -> bytes:
    """``SHA-256(label || run || round || k || n || (id || c_pk || s_pk) for each id ascending)``.

    Every field has a fixed width (8-byte big-endian integers, 32-byte keys), so the encoding is
    injective: two different participant lists never hash the same input.
    """
    h = hashlib.sha256(GRAPH_LABEL)
    for value in (run_id, server_round, num_neighbours, len(adverts)):
        h.update(int(value).to_bytes(8, "big"))
    for u in sorted(adverts):
        adv = adverts[u]
        if len(adv.c_public) != 32 or len(adv.s_public) != 32:
            raise ValueError(f"node {u}: public keys must be 32 bytes")
        h.update(int(u).to_bytes(8, "big") + adv.c_public + adv.s_public)
    return h.digest()


def random_regular_graph(
    node_ids: Sequence[int], num_neighbours: int, seed: bytes
) -> dict[int, frozenset[int]]:
    """A random ``k``-regular simple graph on ``node_ids``, a function of ``seed`` only.

    ``k = n - 1`` gives the complete graph. Otherwise the pairing model: ``k`` stubs per node,
    shuffled (argsort of PCG64's raw 64-bit outputs, a stream numpy keeps stable across
    versions), paired in order; a pair that is a loop or repeats an edge returns its two stubs
    to a pool that is shuffled and paired again; an attempt whose pool cannot be completed is
    restarted (``networkx.random_regular_graph``'s algorithm; ``n k`` must be even).
    """
    nodes = sorted(node_ids)
    n, k = len(nodes), num_neighbours
    if len(set(nodes)) != n:
        raise ValueError("node ids must be distinct")
    if k == n - 1:
        return {u: frozenset(v for v in nodes if v != u) for u in nodes}
    if not 2 <= k < n - 1 or (n * k) % 2:
        raise ValueError(f"no {k}-regular graph on {n} nodes (need 2 <= k < n - 1, n k even)")
    bitgen = np.random.PCG64(int.from_bytes(hashlib.sha256(b"pcg64" + seed).digest(), "big"))

    def shuffled(items: list[int]) -> list[int]:
        order = np.argsort(bitgen.random_raw(len(items)), kind="stable")
        return [items[i] for i in order]

    for _attempt in range(1000):
        nbrs: list[set[int]] = [set() for _ in range(n)]
        stubs = [i for i in range(n) for _ in range(k)]
        while stubs:
            stubs = shuffled(stubs)
            left: list[int] = []
            for a, b in zip(stubs[::2], stubs[1::2], strict=True):
                if a == b or b in nbrs[a]:
                    left += (a, b)
                else:
                    nbrs[a].add(b)
                    nbrs[b].add(a)
            if left and not any(b != a and b not in nbrs[a] for a in set(left) for b in set(left)):
                break  # no pair of the pool can ever be joined: start again
            stubs = left
        else:
            return {nodes[i]: frozenset(nodes[j] for j in nbrs[i]) for i in range(n)}
    raise RuntimeError(f"no {k}-regular graph on {n} nodes after 1000 attempts")


@functools.lru_cache(maxsize=8)
def _cached_graph(
    seed: bytes, nodes: tuple[int, ...], num_neighbours: int
) -> dict[int, frozenset[int]]:
    return random_regular_graph(nodes, num_neighbours, seed)


def derived_graph(
    run_id: int, server_round: int, num_neighbours: int, adverts: Mapping[int, KeyAdvert]
) -> tuple[bytes, dict[int, frozenset[int]]]:
    """``(seed, graph)``: the round's neighbour graph on the advertised participants, the same
    for the server and every client that holds the same adverts (:func:`graph_seed`,
    :func:`random_regular_graph`). Do not mutate the returned graph (it is cached)."""
    seed = graph_seed(run_id, server_round, num_neighbours, adverts)
    return seed, graph_from_seed(seed, adverts, num_neighbours)


def graph_from_seed(
    seed: bytes, node_ids: Collection[int], num_neighbours: int
) -> dict[int, frozenset[int]]:
    """The graph of :func:`derived_graph` from its seed and the participants' ids."""
    return _cached_graph(seed, tuple(sorted(node_ids)), num_neighbours)


def is_connected(graph: Mapping[int, Collection[int]], nodes: Collection[int]) -> bool:
    """Whether the subgraph of ``graph`` induced on ``nodes`` is connected (BFS)."""
    keep = set(nodes)
    if not keep:
        return False
    start = min(keep)
    seen, todo = {start}, deque([start])
    while todo:
        u = todo.popleft()
        for v in graph[u]:
            if v in keep and v not in seen:
                seen.add(v)
                todo.append(v)
    return seen == keep
