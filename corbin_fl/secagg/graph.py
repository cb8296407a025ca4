"""The neighbour graph of SecAgg+ and the round's public parameters (k, t, b).

Bell et al. 2020 ("Secure Single-Server Aggregation with (Poly)Logarithmic Overhead") replace
the complete graph of Bonawitz et al. 2017 by a random ``k``-regular graph with
``k = O(log n)``: client ``u`` agrees pairwise masks with, and secret-shares its seeds among,
its ``k`` neighbours only, so a client's work is ``O(log n + d)`` instead of ``O(n + d)``. Like
their implementation and Flower's legacy ``SecAggPlusWorkflow``, the graph here is a Harary
graph on a uniformly random permutation ``pi`` of the sampled clients: for even ``k``, ``pi[i]``
is adjacent to ``pi[i +- j mod n]`` for ``j = 1..k/2``. ``k = n - 1`` is the complete graph
(the original SecAgg). Randomness comes from an injected ``numpy.random.Generator``.

Parameter rule used here (stated in :func:`choose_parameters`):

* ``k``: even and ``2 <= k < n - 1``, or ``k = n - 1``. Default: ``n - 1`` (complete) for
  ``n <= 16``, else the even number ``2 * ceil(log2(n) * 1.5)`` (at most ``n - 1``), i.e.
  ``O(log n)`` as Bell et al. prescribe; take larger ``k`` for more collusion or dropout
  tolerance (their analysis sizes ``k`` from ``n``, the corrupt fraction, the dropout fraction
  and the statistical security parameter).
* ``t``: ``k/2 < t <= k`` (``t > k/2`` is required: an honest client reveals, per peer, either
  the self-mask share or the mask-key share, never both, so a server that wants both for the
  same peer needs ``2t`` distinct holders among ``k``, impossible when ``2t > k`` unless some
  holders collude). Default: ``t = floor(k/2) + 1``, the most dropout-tolerant secure choice.
  Up to ``t - 1`` colluding neighbours of a client learn nothing about its seeds (Shamir).
* ``b``: :func:`bit_width`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .prg import MAX_BITS


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


def default_degree(num_clients: int) -> int:
    """The default ``k``: ``n - 1`` for ``n <= 16``, else ``min(n - 1, 2 ceil(1.5 log2 n))``."""
    if num_clients <= 16:
        return num_clients - 1
    return min(num_clients - 1, 2 * math.ceil(1.5 * math.log2(num_clients)))


def choose_parameters(
    num_clients: int, num_neighbours: int | None = None, threshold: int | None = None
) -> tuple[int, int]:
    """``(k, t)`` for ``n`` clients: the defaults above, or the given values validated.

    Raises ``ValueError`` when ``n < 2``, ``k`` is not ``n - 1`` and is odd or out of
    ``[2, n - 1)``, or ``t`` is not in ``(k/2, k]``.
    """
    n = num_clients
    if not isinstance(n, int) or n < 2:
        raise ValueError(f"secure aggregation needs at least 2 clients, got {n!r}")
    k = default_degree(n) if num_neighbours is None else num_neighbours
    if not isinstance(k, int) or isinstance(k, bool):
        raise ValueError(f"num_neighbours must be an integer, got {k!r}")
    k = min(k, n - 1)
    if k != n - 1 and (k < 2 or k % 2):
        raise ValueError(f"num_neighbours must be even in [2, n - 1) or n - 1 = {n - 1}, got {k}")
    t = k // 2 + 1 if threshold is None else threshold
    if not isinstance(t, int) or isinstance(t, bool) or not k / 2 < t <= k:
        raise ValueError(f"threshold must satisfy k/2 < t <= k (k = {k}), got {t!r}")
    return k, t


def harary_graph(
    node_ids: Sequence[int], num_neighbours: int, rng: np.random.Generator
) -> dict[int, frozenset[int]]:
    """The Harary graph ``H(k, n)`` on a random permutation of ``node_ids`` (``rng`` draws it).

    Returns each node's neighbour set (never itself); every set has exactly ``k`` members.
    """
    nodes = list(node_ids)
    n = len(nodes)
    if len(set(nodes)) != n:
        raise ValueError("node ids must be distinct")
    k, _ = choose_parameters(n, num_neighbours, None)
    if k == n - 1:
        return {u: frozenset(v for v in nodes if v != u) for u in nodes}
    order = [nodes[i] for i in rng.permutation(n)]
    half = k // 2
    return {
        order[i]: frozenset(order[(i + j) % n] for j in range(-half, half + 1) if j != 0)
        for i in range(n)
    }
