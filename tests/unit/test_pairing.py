"""Tests of mechanisms.pairing: uniform pairing, Alg. 3 lead rule, AugCorBin-FL split."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
import pytest

from corbin_fl.mechanisms import independent_split, is_lead, lead_node, random_pairing


def _canon(pairs: list[tuple[int, int]]) -> frozenset[frozenset[int]]:
    return frozenset(frozenset(p) for p in pairs)


def _within_5se(count: int, trials: int, p: float) -> bool:
    return abs(count - trials * p) <= 5 * math.sqrt(trials * p * (1 - p))


def test_four_nodes_three_pairings_equally_likely() -> None:
    rng = np.random.default_rng(0)
    trials = 12_000
    seen: Counter[frozenset[frozenset[int]]] = Counter()
    for _ in range(trials):
        pairs, unpaired = random_pairing([4, 9, 2, 7], rng)
        assert unpaired == []
        seen[_canon(pairs)] += 1
    assert len(seen) == 3
    for count in seen.values():
        assert _within_5se(count, trials, 1 / 3)
    # chi-square with 2 dof, within 5 sd of its mean
    chi2 = sum((v - trials / 3) ** 2 / (trials / 3) for v in seen.values())
    assert abs(chi2 - 2) <= 5 * 2


def test_six_nodes_fifteen_pairings_equally_likely() -> None:
    rng = np.random.default_rng(1)
    trials = 15_000
    nodes = list(range(6))
    seen = Counter(_canon(random_pairing(nodes, rng)[0]) for _ in range(trials))
    assert len(seen) == 15  # 5!! pairings
    for count in seen.values():
        assert _within_5se(count, trials, 1 / 15)


def test_five_nodes_each_unpaired_with_prob_one_fifth() -> None:
    rng = np.random.default_rng(2)
    trials = 10_000
    nodes = [11, 22, 33, 44, 55]
    out: Counter[int] = Counter()
    for _ in range(trials):
        pairs, unpaired = random_pairing(nodes, rng)
        assert len(unpaired) == 1 and len(pairs) == 2
        flat = [v for p in pairs for v in p] + unpaired
        assert sorted(flat) == nodes
        out[unpaired[0]] += 1
    for node in nodes:
        assert _within_5se(out[node], trials, 1 / 5)


def test_pairing_structure_and_order_independence() -> None:
    ids = [int(v) for v in np.random.default_rng(3).choice(2**60, size=101, replace=False)]
    pairs, unpaired = random_pairing(ids, np.random.default_rng(9))
    assert len(pairs) == 50 and len(unpaired) == 1
    assert sorted([v for p in pairs for v in p] + unpaired) == sorted(ids)
    shuffled = list(reversed(ids))
    assert random_pairing(shuffled, np.random.default_rng(9)) == (pairs, unpaired)
    assert random_pairing([], np.random.default_rng(0)) == ([], [])
    assert random_pairing([5], np.random.default_rng(0)) == ([], [5])
    assert random_pairing(np.array([3, 1]), np.random.default_rng(0))[1] == []


@pytest.mark.parametrize(
    ("ids", "exc"),
    [([1, 1, 2], ValueError), ([1, True], TypeError), ([1, 2.0], TypeError), ("ab", TypeError)],
)
def test_pairing_validation(ids: object, exc: type[Exception]) -> None:
    with pytest.raises(exc):
        random_pairing(ids, np.random.default_rng(0))  # type: ignore[arg-type]


def test_pairing_requires_numpy_generator() -> None:
    with pytest.raises(TypeError, match="Generator"):
        random_pairing([1, 2], np.random.RandomState(0))  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- lead rule
def test_lead_node_truth_table() -> None:
    """Alg. 3 lines 9-12: equal Y -> min id leads, different Y -> max id leads."""
    assert lead_node(3, 8, 0, 0) == 3
    assert lead_node(3, 8, 1, 1) == 3
    assert lead_node(3, 8, 0, 1) == 8
    assert lead_node(3, 8, 1, 0) == 8
    assert lead_node(8, 3, 1, 0) == 8


def test_lead_rule_symmetric_and_exactly_one_lead() -> None:
    for a, b in ((1, 2), (2**63, 5), (7, 6)):
        leads = Counter()
        for ya, yb in itertools.product((0, 1), repeat=2):
            lead = lead_node(a, b, ya, yb)
            assert lead == lead_node(b, a, yb, ya)
            assert is_lead(a, b, ya, yb) != is_lead(b, a, yb, ya)  # exactly one leads
            assert is_lead(a, b, ya, yb) == (lead == a)
            leads[lead] += 1
        assert leads[a] == leads[b] == 2  # fair Y bits: each node leads w.p. 1/2


@pytest.mark.parametrize(
    ("args", "exc"),
    [
        ((1, 1, 0, 0), ValueError),
        ((1, 2, 2, 0), ValueError),
        ((1, 2, 0, -1), ValueError),
        ((1, 2, True, 0), ValueError),
        ((1.0, 2, 0, 0), TypeError),
    ],
)
def test_lead_validation(args: tuple[object, ...], exc: type[Exception]) -> None:
    with pytest.raises(exc):
        lead_node(*args)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- AugCorBin split
def test_independent_split_sizes() -> None:
    ids = list(range(100, 110))
    for gamma, k in ((0.0, 0), (0.2, 2), (0.25, 3), (0.5, 5), (0.55, 6), (1.0, 10)):
        ind, cor = independent_split(ids, gamma, np.random.default_rng(0))
        assert len(ind) == k and len(cor) == 10 - k
        assert sorted(ind + cor) == ids and not set(ind) & set(cor)
        assert ind == sorted(ind) and cor == sorted(cor)
    assert independent_split([], 0.5, np.random.default_rng(0)) == ([], [])


def test_independent_split_uniform() -> None:
    rng = np.random.default_rng(4)
    trials, ids = 10_000, [1, 2, 3, 4, 5]
    counts: Counter[int] = Counter()
    for _ in range(trials):
        ind, _ = independent_split(ids, 0.4, rng)  # k = 2
        counts.update(ind)
    for node in ids:
        assert _within_5se(counts[node], trials, 2 / 5)


@pytest.mark.parametrize(
    ("gamma", "exc"),
    [(-0.1, ValueError), (1.1, ValueError), (math.nan, ValueError), ("0.5", TypeError)],
)
def test_augcorbin_validation(gamma: object, exc: type[Exception]) -> None:
    with pytest.raises(exc):
        independent_split([1, 2, 3], gamma, np.random.default_rng(0))  # type: ignore[arg-type]
