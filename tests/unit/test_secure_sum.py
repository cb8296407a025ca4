"""Tests of mechanisms/secure_sum.py: the guarantee against a server that sees only the sum."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from corbin_fl.mechanisms import augcorbin
from corbin_fl.mechanisms import secure_sum as ss

DELTA = 1e-5


def _sum_pmf(probs: list[float]) -> np.ndarray:
    """Brute force: the law of the sum of independent bits, by enumerating all 2^n outcomes."""
    out = np.zeros(len(probs) + 1)
    for bits in itertools.product((0, 1), repeat=len(probs)):
        w = 1.0
        for b, p in zip(bits, probs, strict=True):
            w *= p if b else 1.0 - p
        out[sum(bits)] += w
    return out


def _hs(p: np.ndarray, q: np.ndarray, eps: float) -> float:
    return float(np.sum(np.maximum(p - math.exp(eps) * q, 0.0)))


def _rr_exact_delta(eps_p: float, k: int, eps: float) -> float:
    """Exact delta of k-fold randomized response: L = eps_p (k - 2J), J ~ Bin(k, a)."""
    a, _ = ss.rr_range(eps_p)
    j = np.arange(k + 1)
    loss = eps_p * (k - 2 * j)
    pj = stats.binom.pmf(j, k, a)
    m = loss > eps
    return float(np.sum(pj[m] * -np.expm1(eps - loss[m])))


def _rr_exact_eps(eps_p: float, k: int, delta: float) -> float:
    lo, hi = 0.0, k * eps_p
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if _rr_exact_delta(eps_p, k, mid) > delta else (lo, mid)
    return hi


# ------------------------------------------------------------------ ranges


def test_ranges_are_ldpq_law() -> None:
    a, b = ss.rr_range(1.0)
    alpha = 1.0 / math.tanh(0.5)
    assert a == pytest.approx(0.5 - 0.5 / alpha, rel=1e-14)
    assert b / a == pytest.approx(math.e, rel=1e-14)
    pl, ph = ss.binomial_range(2.0, 4)
    assert ph / pl == pytest.approx(math.exp(0.5), rel=1e-14)  # theta = tanh(eps/2M)/2
    assert ph - 0.5 == pytest.approx(0.5 * math.tanh(2.0 / 8), rel=1e-12)


# ------------------------------------------------------------------ brute force, small n


@pytest.mark.parametrize("n", [2, 3, 5])
def test_vertex_pmfs_match_enumeration(n: int) -> None:
    a, b = ss.rr_range(0.7)
    fam = ss.one_bit_profile(0.7, n).families[0]
    for k, p, q in fam.pairs():
        others = [b] * k + [a] * (n - 1 - k)
        np.testing.assert_allclose(p, _sum_pmf([b, *others]), rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(q, _sum_pmf([a, *others]), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("n", [2, 4])
def test_envelope_is_exact_worst_case_over_all_inputs(n: int) -> None:
    """delta(eps) equals the max over enumerated vertices and bounds random interior inputs."""
    eps_p = 1.0
    a, b = ss.rr_range(eps_p)
    prof = ss.one_bit_profile(eps_p, n)
    rng = np.random.default_rng(0)
    for eps in (0.0, 0.2, 0.5, 0.9):
        vert = 0.0
        for others in itertools.product((a, b), repeat=n - 1):
            p = _sum_pmf([b, *others])
            q = _sum_pmf([a, *others])
            vert = max(vert, _hs(p, q, eps), _hs(q, p, eps))
        assert prof.delta(eps) == pytest.approx(vert, rel=1e-9, abs=1e-15)
        for _ in range(50):  # any inputs in the box: never above the vertex maximum
            x1, x2 = rng.uniform(a, b, 2)
            others = list(rng.uniform(a, b, n - 1))
            p = _sum_pmf([x1, *others])
            q = _sum_pmf([x2, *others])
            assert max(_hs(p, q, eps), _hs(q, p, eps)) <= prof.delta(eps) + 1e-12


def test_pbm_native_bounds_random_inputs_and_brute_force() -> None:
    """PBM with M = 2, n = 2: the vertex bound is above every enumerated input configuration."""
    eps, m_trials, n = 1.0, 2, 2
    pl, ph = ss.binomial_range(eps, m_trials)
    prof = ss.binomial_profile(eps, m_trials, n)
    rng = np.random.default_rng(1)
    for eps_t in (0.0, 0.3, 0.6):
        bound = prof.delta(eps_t)
        # the natural extreme: client at ph vs pl, other client at a vertex
        for po in (pl, ph):
            p = _sum_pmf([ph, ph, po, po])
            q = _sum_pmf([pl, pl, po, po])
            assert max(_hs(p, q, eps_t), _hs(q, p, eps_t)) <= bound + 1e-12
        for _ in range(50):
            x1, x2, xo = rng.uniform(pl, ph, 3)
            p = _sum_pmf([x1, x1, xo, xo])
            q = _sum_pmf([x2, x2, xo, xo])
            assert max(_hs(p, q, eps_t), _hs(q, p, eps_t)) <= bound + 1e-12
    assert prof.epsilon(DELTA) <= eps + 1e-9  # never worse than the local pure eps


# ------------------------------------------------------------------ n = 1 and monotone in n


def test_n1_is_randomized_response() -> None:
    eps_p = 1.0
    a, b = ss.rr_range(eps_p)
    prof = ss.one_bit_profile(eps_p, 1)
    for eps in (0.0, 0.3, 0.99):
        assert prof.delta(eps) == pytest.approx(b - math.exp(eps) * a, rel=1e-12)
    assert prof.delta(1.0 + 1e-9) == 0.0
    # dp_accounting's randomized response with two buckets (keep w.p. 1 - p, else uniform)
    from dp_accounting.pld import privacy_loss_distribution as pldm

    rr = pldm.from_randomized_response(2 * a, 2, value_discretization_interval=1e-6)
    for eps in (0.0, 0.5):
        assert prof.delta(eps) == pytest.approx(rr.get_delta_for_epsilon(eps), rel=1e-4)
    assert prof.epsilon(DELTA) == pytest.approx(1.0 + math.log1p(-DELTA / b), abs=1e-8)


def test_monotone_decrease_in_n() -> None:
    eps_prev = math.inf
    for n in (1, 2, 5, 10, 30, 100):
        e = ss.one_bit_profile(1.0, n).epsilon(1e-3)
        assert e <= eps_prev + 1e-12
        eps_prev = e
    assert eps_prev < 0.5  # n = 100 really helps at delta = 1e-3
    assert ss.one_bit_profile(1.0, 100).epsilon(DELTA) < ss.one_bit_profile(1.0, 10).epsilon(DELTA)


def test_pure_eps_does_not_improve() -> None:
    """The all-ones sum has likelihood ratio e^eps_p at k = n - 1: delta(eps_p - x) > 0."""
    assert ss.one_bit_profile(1.0, 20).delta(0.999) > 0.0
    assert ss.one_bit_profile(1.0, 20).delta(1.0 + 1e-9) == 0.0


# ------------------------------------------------------------------ composition


def test_composition_n1_matches_exact_randomized_response() -> None:
    prof = ss.one_bit_profile(1.0, 1)
    for k in (10, 300):
        got = ss.compose(prof, k, DELTA)
        exact = _rr_exact_eps(1.0, k, DELTA)
        assert got.eps >= exact - 1e-9  # sound
        assert got.eps <= exact * 1.01 + 0.02  # and tight


def test_composition_never_below_per_step_or_any_single_vertex() -> None:
    from dp_accounting.pld import privacy_loss_distribution as pldm

    prof = ss.one_bit_profile(1.0, 6)
    for k in (1, 50):
        comp = ss.compose(prof, k, DELTA)
        assert comp.eps >= prof.epsilon(DELTA) - 1e-6
        for _, p, q in prof.families[0].pairs():  # optimistic PLD of each single vertex pair
            lo = {i: math.log(x) for i, x in enumerate(p) if x > 0}
            up = {i: math.log(x) for i, x in enumerate(q) if x > 0}
            for a_, b_ in ((lo, up), (up, lo)):
                pld = pldm.from_two_probability_mass_functions(
                    a_, b_, pessimistic_estimate=False, value_discretization_interval=1e-4
                )
                single = (
                    pld.self_compose(k).get_epsilon_for_delta(DELTA)
                    if k > 1
                    else (pld.get_epsilon_for_delta(DELTA))
                )
                assert comp.eps >= single - 1e-3


def test_compose_run_is_sound_and_tight_for_randomized_response() -> None:
    """One chain (update, then the run from the update's PLD) against the exact RR figures."""
    prof = ss.one_bit_profile(1.0, 1)
    upd, run = ss.compose_run(prof, 100, 3, DELTA)
    assert (upd.steps, run.steps) == (100, 300)
    for got in (upd, run):
        exact = _rr_exact_eps(1.0, got.steps, DELTA)
        assert got.eps >= exact - 1e-9  # sound
        assert got.eps <= exact * 1.01 + 0.02  # and tight
    one, same = ss.compose_run(prof, 50, 1, DELTA)
    assert one.eps == same.eps


def test_compose_run_stops_where_the_infinite_atoms_exceed_delta() -> None:
    prof = augcorbin.augcorbin_profile(1.0, 10, 0.2)  # a paired client over 2 independent bits
    upd, run = ss.compose_run(prof, 1000, 2, DELTA)
    assert upd.eps == run.eps == math.inf


def test_guarantees_are_cached_copies() -> None:
    g = ss.one_bit_guarantee(1.0, 5, 100, 2, DELTA)
    g["per_update"]["eps"] = -1.0
    assert ss.one_bit_guarantee(1.0, 5, 100, 2, DELTA)["per_update"]["eps"] > 0
    with pytest.raises(TypeError):
        ss.one_bit_guarantee(1.0, True, 100, 2, DELTA)


def test_augcorbin_counts_from_a_run() -> None:
    """independent / paired given (a run's records) replace floor(gamma n + 1/2)."""
    prof = augcorbin.augcorbin_profile(1.0, 10, 0.2, independent=4, paired=True)
    assert [(f.label, f.others) for f in prof.families] == [("independent", 3), ("paired", 4)]
    alone = augcorbin.augcorbin_profile(1.0, 10, 0.2, independent=10, paired=False)
    assert [f.label for f in alone.families] == ["independent"]
    g = augcorbin.augcorbin_guarantee(1.0, 10, 0.2, 100, 1, DELTA, independent=0)
    assert g["dp"] is False


def test_dominating_pld_is_above_the_envelope() -> None:
    prof = ss.one_bit_profile(0.5, 8)
    pld = ss.dominating_pld(prof, stride=16)
    for eps in np.linspace(-0.6, 0.6, 25):
        assert pld.get_delta_for_epsilon(float(eps)) >= prof.delta(float(eps)) - 1e-12


def test_composed_falls_with_n() -> None:
    e = [ss.compose(ss.one_bit_profile(1.0, n), 2000, DELTA).eps for n in (1, 10, 100)]
    assert e[0] > e[1] > e[2]


def test_one_bit_guarantee_is_finite_dp() -> None:
    g = ss.one_bit_guarantee(1.0, 50, 100, 2, DELTA)
    assert g["dp"] is True
    for key in ("per_parameter", "per_update", "all_rounds"):
        assert math.isfinite(g[key]["eps"])
    assert g["per_parameter"]["eps"] <= g["per_update"]["eps"] <= g["all_rounds"]["eps"]


# ------------------------------------------------------------------ AugCorBin-FL, CorBin-FL


def test_augcorbin_guarantee_is_the_exact_one_and_says_which_share_it_used() -> None:
    """No eq. (5) anywhere (not a valid bound); the configured gamma is reported as given and
    the independent count says where it comes from (n = 3, gamma = 0.2: 1 of 3 drawn)."""
    out = augcorbin.augcorbin_guarantee(1.0, 3, 0.2, 50, 2, DELTA)
    assert "theorem3" not in out
    assert not any(hasattr(mod, "augcorbin_theorem3") for mod in (ss, augcorbin))
    assert out["gamma"] == 0.2 and out["independent"] == 1
    assert out["independent_from"] == "floor(gamma n + 1/2)"
    rec = augcorbin.augcorbin_guarantee(1.0, 40, 0.2, 50, 2, DELTA, independent=10, paired=True)
    assert rec["independent_from"] == "records" and rec["independent"] == 10
    prof = augcorbin.augcorbin_profile(1.0, 40, 0.2, independent=10, paired=True)
    want = ss.compose_run(prof, 50, 2, DELTA)[1].eps
    assert rec["dp"] is math.isfinite(want) and rec["exact"]["all_rounds"]["eps"] == want


def test_augcorbin_exact_paired_case_is_the_worse() -> None:
    prof = augcorbin.augcorbin_profile(1.0, 20, 0.5)
    assert {f.label for f in prof.families} == {"independent", "paired"}
    ind = ss.one_bit_profile(1.0, 10)
    assert prof.epsilon(1e-3) >= ind.epsilon(1e-3)


def test_corbin_has_no_dp_against_the_sum() -> None:
    c = ss.corbin_against_sum(1.0, 5, 421_642, 10)
    assert c["dp"] is False
    assert c["per_parameter"]["inf_mass"] == pytest.approx(0.4499, abs=1e-3)
    assert c["per_update"]["delta_lower_bound"] == 1.0
    assert "No DP" in c["guarantee"]


def test_corbin_pair_sum_is_randomized_rounding() -> None:
    """Algorithm 2 with a uniform codebook: the pair's sum is floor/ceil of q1 + q2."""
    d = 5
    for q1, q2 in ((0.5, 0.5), (9 / 32, 23 / 32), (0.7311, 0.5), (0.3, 0.4)):
        s1, s2 = 2**d * q1, 2**d * (1 - q2)
        t1, t2 = math.floor(s1), math.floor(s2)
        law = np.zeros(3)
        for z in range(2**d):
            p1 = 1.0 if z < t1 else (s1 - t1 if z == t1 else 0.0)  # lead: P(U1 = 1 | z)
            p2 = 1.0 if z > t2 else (1.0 - (s2 - t2) if z == t2 else 0.0)  # follow
            law += np.array([(1 - p1) * (1 - p2), p1 * (1 - p2) + p2 * (1 - p1), p1 * p2])
        law /= 2**d
        lo = math.floor(q1 + q2 + 1e-12)
        off = [i for i in range(3) if i not in (lo, lo + 1)]
        assert sum(law[i] for i in off) <= 2.0 * 2.0**-d
        assert law @ np.arange(3) == pytest.approx(q1 + q2, abs=1e-12)
