"""Tests of mechanisms.theory: exact CorBinQ pair law, MSEs and Theorems 1-4."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from corbin_fl.mechanisms.quantizers import alpha, corbinq, decode
from corbin_fl.mechanisms.theory import (
    Theorem3ConditionError,
    alpha64,
    corbin_pair_joint,
    corbin_pair_joint_from_q,
    corbin_pair_mse,
    eq5_as_printed,
    ldpq_mse,
    ldpq_pair_mse,
    optimal_pair_mse,
    prob_plus64,
    theorem1_bound,
    theorem2_bound,
    theorem3_condition,
    theorem3_min_clients,
    theorem3_mse_bound,
    theorem4,
)

EPS_GRID = (0.1, 0.5, 1.0, 3.0, 8.0)


def _brute_joint(w1: float, w2: float, c: float, r: float, eps: float, d: int, px: float):
    """Joint law by summing Algorithm 2 over every codeword z (independent of theory.py)."""
    a = (math.exp(eps) + 1.0) / (math.exp(eps) - 1.0)
    w1 = min(max(w1, c - r), c + r)
    w2 = min(max(w2, c - r), c + r)
    q1 = 0.5 + (w1 - c) / (2 * r * a)
    q2 = 0.5 + (w2 - c) / (2 * r * a)
    n = 1 << d
    pz = np.array([px ** bin(z).count("1") * (1 - px) ** (d - bin(z).count("1")) for z in range(n)])
    cdf = np.concatenate([[0.0], np.cumsum(pz)])
    t1 = min(int(np.searchsorted(cdf, q1, side="right")) - 1, n - 1)
    t2 = min(int(np.searchsorted(cdf, 1 - q2, side="right")) - 1, n - 1)
    u = (q1 - cdf[t1]) / pz[t1]  # line 9 tie probability of U = +1
    u2 = (1 - q2 - cdf[t2]) / pz[t2]  # line 17 tie probability of U' = 1 (Q2 = -)
    out = np.zeros((2, 2))
    for z in range(n):
        p1 = 1.0 if z < t1 else (0.0 if z > t1 else u)  # P(Q1 = +)
        p2 = 0.0 if z < t2 else (1.0 if z > t2 else 1.0 - u2)  # P(Q2 = +)
        out[1, 1] += pz[z] * p1 * p2
        out[1, 0] += pz[z] * p1 * (1 - p2)
        out[0, 1] += pz[z] * (1 - p1) * p2
        out[0, 0] += pz[z] * (1 - p1) * (1 - p2)
    return out


def test_alpha64_matches_quantizers_alpha() -> None:
    for eps in (1e-6, 0.01, 0.5, 1.0, 5.0, 30.0):
        assert alpha64(eps) == pytest.approx(alpha(eps), rel=1e-14)
        assert alpha64(eps) == pytest.approx((math.exp(eps) + 1) / (math.exp(eps) - 1), rel=1e-9)


def test_joint_matches_codeword_enumeration() -> None:
    rng = np.random.default_rng(1)
    for _ in range(300):
        d = int(rng.integers(0, 9))
        px = 0.5 if rng.random() < 0.5 else float(rng.uniform(0.2, 0.8))
        eps = float(rng.uniform(0.05, 6.0))
        c, r = float(rng.normal()), float(rng.uniform(0.1, 2.0))
        w1, w2 = rng.uniform(c - 1.2 * r, c + 1.2 * r, 2)
        got = corbin_pair_joint(w1, w2, c, r, eps, d, px)
        np.testing.assert_allclose(got, _brute_joint(w1, w2, c, r, eps, d, px), atol=1e-13)


@pytest.mark.parametrize("px", [0.5, 0.3])
def test_joint_is_a_law_with_exact_ldpq_marginals(px: float) -> None:
    w = np.linspace(-1.3, 1.3, 53)
    w1, w2 = np.meshgrid(w, w)
    for eps in EPS_GRID:
        q1 = np.asarray(prob_plus64(w1, 0.0, 1.0, eps))
        q2 = np.asarray(prob_plus64(w2, 0.0, 1.0, eps))
        for d in (0, 1, 2, 5, 12):
            j = corbin_pair_joint(w1, w2, 0.0, 1.0, eps, d, px)
            assert j.shape == (53, 53, 2, 2)
            assert np.all(j >= 0)
            np.testing.assert_allclose(j.sum(axis=(-1, -2)), 1.0, atol=1e-14)
            np.testing.assert_allclose(j[..., 1, :].sum(-1), q1, atol=1e-14)
            np.testing.assert_allclose(j[..., :, 1].sum(-1), q2, atol=1e-14)


def test_d_zero_is_independent_ldpq() -> None:
    q1, q2 = 0.3, 0.8
    j = corbin_pair_joint_from_q(q1, 1 - q2, 0)
    np.testing.assert_allclose(j, np.outer([1 - q1, q1], [1 - q2, q2]), atol=1e-15)


def test_off_tie_cells_have_exact_zeros() -> None:
    # q1 + q2 < 1 and different cells: P(++) must be exactly zero (the pair-joint view relies on it)
    j = corbin_pair_joint_from_q(0.30, 0.70, 4)
    assert j[1, 1] == 0.0
    assert j[0, 0] == pytest.approx(0.40, abs=1e-15)
    j = corbin_pair_joint_from_q(0.80, 0.30, 4)
    assert j[0, 0] == 0.0
    assert j[1, 1] == pytest.approx(0.50, abs=1e-15)


CASES = [
    # (w1, w2, eps, d, p_x): includes a zero cell, a tie-dominated case, a biased codebook
    (0.3, -0.45, 1.0, 3, 0.5),
    (0.9, 0.7, 0.5, 2, 0.5),
    (-0.2, 0.1, 2.0, 5, 0.5),
    (0.3, -0.1, 1.0, 3, 0.3),
]


@pytest.mark.parametrize(("w1", "w2", "eps", "d", "px"), CASES)
def test_sampled_corbinq_pair_matches_closed_form(
    w1: float, w2: float, eps: float, d: int, px: float
) -> None:
    n = 100_000
    g = torch.Generator().manual_seed(12345 + d)
    if px == 0.5:
        z = torch.randint(0, 1 << d, (n,), generator=g)
    else:
        bits = (torch.rand(n, d, generator=g) < px).long()
        z = (bits * (2 ** torch.arange(d - 1, -1, -1))).sum(1)
    a = corbinq(torch.full((n,), w1), 0.0, 1.0, eps, z, d, lead=True, generator=g, p_x=px)
    b = corbinq(torch.full((n,), w2), 0.0, 1.0, eps, z, d, lead=False, generator=g, p_x=px)
    theory = corbin_pair_joint(w1, w2, 0.0, 1.0, eps, d, px)
    for i in (0, 1):
        for k in (0, 1):
            emp = ((a == bool(i)) & (b == bool(k))).double().mean().item()
            p = theory[i, k]
            if p == 0.0:
                assert emp == 0.0
                continue
            se = math.sqrt(p * (1 - p) / n)
            assert abs(emp - p) <= 5 * se, (i, k, emp, p)
    # pair MSE of the decoded outputs
    err = (decode(a, 0.0, 1.0, eps).double() + decode(b, 0.0, 1.0, eps).double() - w1 - w2) ** 2
    mse = corbin_pair_mse(w1, w2, 0.0, 1.0, eps, d, px)
    se = err.std().item() / math.sqrt(n)
    assert abs(err.mean().item() - mse) <= 5 * se + 1e-6


def test_corbin_mse_between_optimum_and_ldpq_and_within_theorem1() -> None:
    w = np.linspace(-1.0, 1.0, 41)
    w1, w2 = np.meshgrid(w, w)
    for c, r in ((0.0, 1.0), (0.3, 0.05)):
        x1, x2 = c + r * w1, c + r * w2
        for eps in EPS_GRID:
            a2 = alpha64(eps) ** 2
            opt = optimal_pair_mse(x1, x2, c, r, eps)
            ldp = ldpq_pair_mse(x1, x2, c, r, eps)
            for d in range(1, 13):
                mse = corbin_pair_mse(x1, x2, c, r, eps, d)
                tol = 1e-12 * r * r * a2
                assert np.all(mse <= ldp + tol), (eps, d)
                assert np.all(mse >= opt - tol), (eps, d)  # Theorem 1: lower bound
                assert np.all(mse <= theorem1_bound(x1, x2, c, r, eps, d) + tol)
                # the exact excess is at most 2 r^2 alpha^2 / 2^d (tie cell), 32x below eq. (4)
                assert np.all(mse - opt <= 2 * r * r * a2 * 2.0**-d + tol)


def test_corbin_mse_converges_to_optimum() -> None:
    w = np.linspace(-1, 1, 21)
    w1, w2 = np.meshgrid(w, w)
    for eps in EPS_GRID:
        gap = corbin_pair_mse(w1, w2, 0, 1, eps, 40) - optimal_pair_mse(w1, w2, 0, 1, eps)
        assert np.max(np.abs(gap)) <= 1e-9 * alpha64(eps) ** 2


def test_optimal_pair_mse_closed_form_from_eqs_21_22() -> None:
    # s = w1 + w2 - 2c <= 0: P11 = (2c - w1 - w2)/(2 r alpha), P12 = q2, P21 = q1, P22 = 0
    c, r, eps, w1, w2 = 0.1, 0.5, 0.7, -0.2, 0.05
    a = alpha64(eps)
    p11 = (2 * c - w1 - w2) / (2 * r * a)
    q1, q2 = prob_plus64(w1, c, r, eps), prob_plus64(w2, c, r, eps)
    g1, g2 = c - r * a, c + r * a
    mse = (
        p11 * (2 * g1 - w1 - w2) ** 2
        + q2 * (g1 + g2 - w1 - w2) ** 2
        + q1 * (g2 + g1 - w1 - w2) ** 2
    )
    assert optimal_pair_mse(w1, w2, c, r, eps) == pytest.approx(mse, rel=1e-12)


def test_theorem2_bound_holds_for_d16_pair() -> None:
    w = np.linspace(-1, 1, 101)
    w1, w2 = np.meshgrid(w, w)
    for eps in EPS_GRID:
        mse_mean = corbin_pair_mse(w1, w2, 0.0, 1.0, eps, 16) / 4.0  # mean of n = 2 clients
        assert np.max(mse_mean) <= theorem2_bound(1.0, eps, 2)
        assert theorem2_bound(1.0, eps, 2) <= ldpq_mse(1.0, eps, 2)
        # identity of the two forms in Theorem 2 / Appendix C
        a = alpha64(eps)
        assert theorem2_bound(1.0, eps, 2) == pytest.approx((2 * a * a - (a - 1) ** 2) / 4)


def test_theorem3_condition_and_eq5_as_printed() -> None:
    """The condition, and eq. (5) as printed (the documented finding, not a guarantee: its
    lower-bound counterexample is tests/unit/test_lower_bounds.py)."""
    eps_p, delta, gamma, m, r = 1.0, 1e-5, 0.2, 1000, 0.05
    ok, reason = theorem3_condition(eps_p, delta, 50, gamma, m, r)
    assert not ok
    assert "23 log(m/delta)" in reason
    n_min = theorem3_min_clients(eps_p, delta, gamma, m, r)
    assert theorem3_condition(eps_p, delta, n_min, gamma, m, r)[0]
    assert not theorem3_condition(eps_p, delta, n_min - 1, gamma, m, r)[0]
    e1 = eq5_as_printed(eps_p, delta, n_min * gamma - 1, m, r)
    e2 = eq5_as_printed(eps_p, delta, 4 * n_min * gamma - 1, m, r)
    assert 0 < e2 < e1
    # linear in r: the reason it cannot be a bound (the law depends only on (w - c) / r)
    assert eq5_as_printed(eps_p, delta, n_min * gamma - 1, m, 2 * r) == pytest.approx(2 * e1)
    with pytest.raises(ValueError, match="n_gamma_minus_1"):
        eq5_as_printed(eps_p, delta, 0.0, m, r)
    # eq. (5) evaluated independently
    a = alpha64(eps_p)
    e_p, n1 = 1 + 1 / a**2, n_min * gamma - 1
    b_p = e_p / 3 + 1 / a
    ref = (
        r
        * a
        * (
            math.sqrt(8 * m * math.log(1.25 / delta) / (n1 * e_p))
            + 8
            * (math.log(1.25 / delta) + math.log(20 * m / delta) * math.log(10 / delta))
            / (3 * n1)
            + 4
            * b_p
            * math.sqrt(2 * m)
            * (1.75 + 3.75 / a**2)
            * math.sqrt(math.log(10 / delta))
            / (n1 * (1 - delta / 10) * e_p)
        )
    )
    assert e1 == pytest.approx(ref, rel=1e-12)
    # the 2 r alpha term of the condition is the binding one for a large radius
    ok, reason = theorem3_condition(eps_p, delta, n_min, gamma, m, 1e6)
    assert not ok
    assert "2 r alpha" in reason


def test_theorem3_condition_standalone_wording_carries_the_same_figures() -> None:
    """The two wordings of the condition (standalone, and the clause of Theorem 4's error)."""
    eps_p, delta, gamma, m, r = 0.3, 1e-5, 0.2, 421_642, 50.0
    for n in (10, 100_000, 10**7):
        ok, clause = theorem3_condition(eps_p, delta, n, gamma, m, r)
        ok2, sentence = theorem3_condition(eps_p, delta, n, gamma, m, r, standalone=True)
        assert ok == ok2
        if ok:
            assert sentence == clause and clause.startswith("holds: ")
            continue
        need = theorem3_min_clients(eps_p, delta, gamma, m, r)
        head = "(n*gamma-1)(1/4-1/(4 alpha^2))"
        assert clause.startswith(f"fails: {head} = ")
        assert clause.endswith(f"; Theorem 3 needs n >= {need}")
        assert sentence.startswith(
            f"Theorem 3 condition {head} >= max(23 log(m/delta), 2 r alpha) fails: "
        )
        assert sentence.endswith(f"; it needs n >= {need}")
        figures = clause.split(f"{head} = ")[1].split("; ")[0]
        assert sentence.split(" fails: ")[1].split("; ")[0] == figures


def test_theorem3_mse_bound_interpolates() -> None:
    for eps in EPS_GRID:
        assert theorem3_mse_bound(0.2, eps, 10, 0.0) == pytest.approx(theorem2_bound(0.2, eps, 10))
        assert theorem3_mse_bound(0.2, eps, 10, 1.0) == pytest.approx(ldpq_mse(0.2, eps, 10))


def test_theorem4() -> None:
    res = theorem4(1.0, 1e-3, 5e-4, 0.5, 2_000_000, 100, 0.01)
    u = 0.25
    assert res.gamma < u < res.gamma_prime
    assert 0 < res.theta < u
    assert res.mse_bound > 0
    assert not hasattr(res, "eps_u")  # eq. (5) is not a bound: Theorem 4 reuses it, so no eps
    with pytest.raises(Theorem3ConditionError):
        theorem4(1.0, 1e-3, 5e-4, 0.5, 100, 100, 0.01)
    with pytest.raises(ValueError, match="delta1"):
        theorem4(1.0, 1e-3, 2e-3, 0.5, 100, 100, 0.01)


def test_input_validation() -> None:
    with pytest.raises(ValueError, match="d must be"):
        corbin_pair_joint(0.0, 0.0, 0.0, 1.0, 1.0, 61)
    with pytest.raises(ValueError, match="r must be"):
        corbin_pair_mse(0.0, 0.0, 0.0, 0.0, 1.0, 3)
    with pytest.raises(ValueError, match="eps"):
        ldpq_pair_mse(0.0, 0.0, 0.0, 1.0, -1.0)
    with pytest.raises(ValueError, match="NaN"):
        optimal_pair_mse(float("nan"), 0.0, 0.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="p_x"):
        corbin_pair_joint(0.0, 0.0, 0.0, 1.0, 1.0, 3, p_x=1.0)
    with pytest.raises(TypeError):
        theorem2_bound(1.0, 1.0, 2.5)  # type: ignore[arg-type]
