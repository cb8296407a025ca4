"""Pairing of clients: uniform random pairing, lead/follow rule, AugCorBin-FL split.

* :func:`random_pairing` is ``GENERATERANDOMPAIRING`` of CorBin-FL Algorithm 3 line 2: a pairing
  drawn uniformly among all pairings of the nodes (footnote 3), the odd node out (if any)
  unpaired (it quantizes with LDPQ).
* :func:`lead_node` / :func:`is_lead` are Algorithm 3 lines 9-13: each partner draws a fair bit
  ``Y``; equal bits make the smaller id the lead, different bits the larger id. Neither partner
  alone controls the outcome, and the server, which sees neither ``Y``, cannot tell the lead.
* :func:`independent_split` is the AugCorBin-FL split (Section IV-3; the round calls it for
  every mechanism whose privacy category has an independent share): a uniformly random set of
  ``round(gamma * n)`` nodes quantizes independently (LDPQ), the rest is paired (CorBinQ).

All randomness comes from an injected ``numpy.random.Generator``. The node ids are sorted first,
so the result depends only on the *set* of ids and the generator state, not on input order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Integral, Real

import numpy as np

from corbin_fl.mechanisms.validate import generator, integer

__all__ = ["independent_split", "is_lead", "lead_node", "random_pairing"]


def _check_ids(node_ids: object) -> list[int]:
    if isinstance(node_ids, str | bytes) or not isinstance(node_ids, Sequence | np.ndarray):
        raise TypeError(f"node_ids must be a sequence of ints, got {type(node_ids).__name__}")
    ids: list[int] = []
    for v in node_ids:
        if isinstance(v, bool | np.bool_) or not isinstance(v, Integral):
            raise TypeError(f"node ids must be ints, got {type(v).__name__}")
        ids.append(int(v))
    if len(set(ids)) != len(ids):
        raise ValueError("node ids must be distinct")
    return sorted(ids)


def _check_bit(name: str, v: object) -> int:
    if isinstance(v, bool | np.bool_) or not isinstance(v, Integral) or int(v) not in (0, 1):
        raise ValueError(f"{name} must be the int 0 or 1, got {v!r}")
    return int(v)


def random_pairing(
    node_ids: Sequence[int],
    rng: np.random.Generator,
) -> tuple[list[tuple[int, int]], list[int]]:
    """Uniformly random pairing of the nodes (Algorithm 3 line 2).

    A uniformly random permutation of the (sorted) ids is cut into consecutive pairs; each of
    the ``(2k)! / (2^k k!)`` pairings of ``2k`` nodes arises from exactly ``2^k k!``
    permutations, so all pairings are equally likely; with an odd count, the last node of the
    permutation is left unpaired, each node with probability ``1/n``.

    Parameters
    ----------
    node_ids : Sequence[int]
        Distinct node ids (any order).
    rng : numpy.random.Generator
        Source of randomness.

    Returns
    -------
    pairs : list of tuple of int
        ``floor(n/2)`` disjoint pairs, each ``(a, b)`` in permutation order.
    unpaired : list of int
        The node left out (one element for odd ``n``, empty otherwise).
    """
    ids = _check_ids(node_ids)
    gen = generator(rng)
    perm = [ids[i] for i in gen.permutation(len(ids))]
    pairs = [(perm[i], perm[i + 1]) for i in range(0, len(perm) - 1, 2)]
    unpaired = perm[len(pairs) * 2 :]
    return pairs, unpaired


def lead_node(node_a: int, node_b: int, y_a: int, y_b: int) -> int:
    """The lead of a pair (Algorithm 3 lines 9-13).

    ``Y_a == Y_b`` makes ``min(a, b)`` the lead, otherwise ``max(a, b)``. The lead's seed
    becomes the pair's common randomness; the other node is the follow. Symmetric:
    ``lead_node(a, b, y_a, y_b) == lead_node(b, a, y_b, y_a)``.

    Parameters
    ----------
    node_a, node_b : int
        The two (distinct) node ids.
    y_a, y_b : int
        Their fair bits, 0 or 1.

    Returns
    -------
    int
        The id of the lead.
    """
    a = integer(node_a, "node_a")
    b = integer(node_b, "node_b")
    if a == b:
        raise ValueError(f"a node cannot pair with itself (node {a})")
    ya = _check_bit("y_a", y_a)
    yb = _check_bit("y_b", y_b)
    return min(a, b) if ya == yb else max(a, b)


def is_lead(self_id: int, partner_id: int, y_self: int, y_partner: int) -> bool:
    """Whether ``self_id`` leads its pair with ``partner_id`` (see :func:`lead_node`)."""
    return lead_node(self_id, partner_id, y_self, y_partner) == int(self_id)


def independent_split(
    node_ids: Sequence[int],
    gamma: float,
    rng: np.random.Generator,
) -> tuple[list[int], list[int]]:
    """AugCorBin-FL split into an independent (LDPQ) set and a correlated (CorBinQ) set.

    A uniformly random subset of ``k = floor(gamma * n + 1/2)`` nodes (``gamma * n`` rounded
    to the nearest integer, halves up: the privacy analysis of Theorem 3 needs ``n gamma``
    independent nodes) quantizes independently; the rest is to be paired with
    :func:`random_pairing`.

    Parameters
    ----------
    node_ids : Sequence[int]
        Distinct node ids.
    gamma : float
        Fraction of independent nodes, in ``[0, 1]``.
    rng : numpy.random.Generator
        Source of randomness.

    Returns
    -------
    independent : list of int
        The ``k`` independent nodes, sorted.
    correlated : list of int
        The other ``n - k`` nodes, sorted.
    """
    ids = _check_ids(node_ids)
    gen = generator(rng)
    if isinstance(gamma, bool) or not isinstance(gamma, Real):
        raise TypeError(f"gamma must be a real number, got {type(gamma).__name__}")
    g = float(gamma)
    if not (math.isfinite(g) and 0.0 <= g <= 1.0):
        raise ValueError(f"gamma must be in [0, 1], got {g!r}")
    k = min(len(ids), math.floor(g * len(ids) + 0.5))
    perm = gen.permutation(len(ids))
    chosen = set(perm[:k].tolist())
    independent = [v for i, v in enumerate(ids) if i in chosen]
    correlated = [v for i, v in enumerate(ids) if i not in chosen]
    return independent, correlated
