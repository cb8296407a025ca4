"""Neighbour graph and round parameters (corbin_fl.secagg.graph)."""

from __future__ import annotations

import math

import pytest
from scipy.stats import binom, hypergeom

from corbin_fl.secagg import crypto
from corbin_fl.secagg.graph import (
    bit_width,
    choose_parameters,
    derived_graph,
    failure_probabilities,
    graph_seed,
    is_connected,
    random_regular_graph,
    secagg_parameters,
)
from corbin_fl.secagg.messages import KeyAdvert


def adverts(ids: list[int]) -> dict[int, KeyAdvert]:
    return {
        u: KeyAdvert(crypto.KeyPair.generate().public, crypto.KeyPair.generate().public)
        for u in ids
    }


@pytest.mark.parametrize(("n", "k"), [(3, 2), (5, 4), (10, 4), (40, 8), (101, 16), (7, 6)])
def test_random_regular_graph_is_k_regular_simple_and_symmetric(n: int, k: int) -> None:
    nodes = [1000 + 13 * i for i in range(n)]
    g = random_regular_graph(nodes, k, bytes(32))
    assert set(g) == set(nodes)
    for u, nbrs in g.items():
        assert len(nbrs) == k and u not in nbrs
        assert all(u in g[v] for v in nbrs)


def test_the_graph_is_a_function_of_every_advert() -> None:
    """Same adverts: same graph (the server's and each client's); one key changed, or another
    run, round or k: another seed and (with overwhelming probability) another graph."""
    ads = adverts(list(range(1, 51)))
    seed, g = derived_graph(7, 3, 6, ads)
    assert (seed, g) == derived_graph(7, 3, 6, dict(reversed(list(ads.items()))))
    changed = {**ads, 17: adverts([17])[17]}
    for other in (graph_seed(7, 3, 6, changed), graph_seed(8, 3, 6, ads), graph_seed(7, 4, 6, ads)):
        assert other != seed
    assert derived_graph(7, 3, 6, changed)[1] != g
    assert graph_seed(7, 3, 8, ads) != seed


def test_complete_graph_when_k_is_n_minus_1() -> None:
    g = random_regular_graph([4, 9, 2, 7], 3, bytes(32))
    assert g[4] == {9, 2, 7}


def test_is_connected() -> None:
    ring = {u: frozenset({(u - 1) % 6, (u + 1) % 6}) for u in range(6)}
    assert is_connected(ring, range(6)) and is_connected(ring, [0, 1, 2])
    assert not is_connected(ring, [0, 1, 3, 4]) and not is_connected(ring, [])


@pytest.mark.parametrize("n", [3, 4, 10, 16, 17, 20, 40, 100, 101, 200, 1000])
def test_default_parameters_meet_their_targets_or_are_the_complete_graph(n: int) -> None:
    p = secagg_parameters(n)
    assert (p.k, p.t) == choose_parameters(n)
    assert p.k == n - 1 or (p.k % 2 == 0 and 2 <= p.k < n - 1)
    assert p.k / 2 < p.t <= p.k and p.t >= 2
    assert p.p_security <= 2.0**-p.sigma
    if p.k < n - 1:
        assert p.meets_targets
        # the smallest k: k - 2 has no t meeting both targets
        for t in range(max(2, (p.k - 2) // 2 + 1), p.k - 1):
            ps, pa = failure_probabilities(n, p.k - 2, t, dropout=p.dropout, collusion=p.collusion)
            assert ps > 2.0**-p.sigma or pa > 2.0**-p.eta
    else:  # the complete graph: secure iff t > c; the most dropout-tolerant secure t
        assert p.t == max(2, p.k // 2 + 1, p.corrupt + 1)


def test_failure_probabilities_are_the_stated_tails() -> None:
    """The closed forms of the docstring, checked against scipy's tails directly."""
    q = 0.92**3
    ps, pa = failure_probabilities(1000, 222, 125, dropout=0.08, collusion=1 / 3)
    assert ps == pytest.approx(1000 * hypergeom.sf(124, 999, 333, 222), rel=1e-12)
    assert pa == pytest.approx(1000 * binom.cdf(124, 222, q), rel=1e-12)
    ps, pa = failure_probabilities(20, 19, 10, dropout=0.08, collusion=1 / 3)
    assert ps == 0.0 and pa == pytest.approx(binom.cdf(10, 20, q), rel=1e-12)
    assert failure_probabilities(20, 19, 6, dropout=0.08, collusion=1 / 3)[0] == 1.0  # c = 6


@pytest.mark.parametrize(
    ("n", "k", "t", "match"),
    [
        (1, None, None, "at least 3"),
        (2, None, None, "at least 3"),
        (10, 5, None, "even"),
        (10, 0, None, "even"),
        (10, 4, 2, "k/2 < t"),
        (10, 4, 5, "k/2 < t"),
        (10, 9, 4, "k/2 < t"),
        (3, 2, 1, "t >= 2"),
    ],
)
def test_bad_parameters_are_refused(n: int, k: int | None, t: int | None, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        choose_parameters(n, k, t)


def test_bit_width_is_the_smallest_that_holds_the_exact_sum() -> None:
    for n in (1, 2, 3, 7, 8, 10, 100, 1000):
        assert bit_width(n, 1) == math.ceil(math.log2(n + 1))  # one bit per input
    for n, levels in [(10, 1), (10, 3), (15, 1), (16, 1), (5, 7), (1000, 255)]:
        b = bit_width(n, levels)
        assert 2**b > n * levels >= 2 ** (b - 1)
    with pytest.raises(ValueError, match="bits"):
        bit_width(2**40, 2**30)
    with pytest.raises(ValueError, match="positive"):
        bit_width(0, 1)
