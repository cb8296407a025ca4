"""Neighbour graph and round parameters (corbin_fl.secagg.graph)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from corbin_fl.secagg.graph import bit_width, choose_parameters, default_degree, harary_graph


@pytest.mark.parametrize(("n", "k"), [(3, 2), (5, 4), (10, 4), (40, 8), (101, 16), (7, 6)])
def test_harary_graph_is_k_regular_and_symmetric(n: int, k: int) -> None:
    nodes = [1000 + 13 * i for i in range(n)]
    g = harary_graph(nodes, k, np.random.default_rng(3))
    assert set(g) == set(nodes)
    for u, nbrs in g.items():
        assert len(nbrs) == k and u not in nbrs
        assert all(u in g[v] for v in nbrs)


def test_graph_is_drawn_from_the_injected_rng() -> None:
    nodes = list(range(1, 51))
    a = harary_graph(nodes, 6, np.random.default_rng(11))
    assert a == harary_graph(nodes, 6, np.random.default_rng(11))
    assert a != harary_graph(nodes, 6, np.random.default_rng(12))


def test_complete_graph_when_k_is_n_minus_1() -> None:
    g = harary_graph([4, 9, 2, 7], 3, np.random.default_rng(0))
    assert g[4] == {9, 2, 7}


@pytest.mark.parametrize("n", [2, 3, 10, 16, 17, 100, 1000, 10**5])
def test_default_parameters_satisfy_the_rule(n: int) -> None:
    k, t = choose_parameters(n)
    assert k == default_degree(n)
    assert k == n - 1 or (k % 2 == 0 and 2 <= k < n - 1)
    assert k / 2 < t <= k and t == k // 2 + 1
    if n > 16:
        assert k <= 2 * math.ceil(1.5 * math.log2(n))


@pytest.mark.parametrize(
    ("n", "k", "t", "match"),
    [
        (1, None, None, "at least 2"),
        (10, 5, None, "even"),
        (10, 0, None, "even"),
        (10, 4, 2, "k/2 < t"),
        (10, 4, 5, "k/2 < t"),
        (10, 9, 4, "k/2 < t"),
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
