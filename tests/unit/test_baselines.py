"""Tests of the baseline mechanisms (mechanisms.baselines)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from corbin_fl.mechanisms.baselines.cq import cq, cq_decode, cq_shared_randomness
from corbin_fl.mechanisms.baselines.fedcad import FedCAD
from corbin_fl.mechanisms.baselines.gaussian import (
    analytic_gaussian_sigma,
    gaussian,
    gaussian_delta,
    log_ndtr,
)
from corbin_fl.mechanisms.baselines.laplace import laplace, laplace_scale
from corbin_fl.mechanisms.baselines.ternary import (
    ternary,
    ternary_decode,
    ternary_params,
    ternary_tradeoff,
)
from corbin_fl.mechanisms.baselines.vanilla import vanilla
from corbin_fl.mechanisms.quantizers import alpha

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _gen(seed: int, device: str = "cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


# ------------------------------------------------------------------------------ Gaussian


@pytest.mark.parametrize(
    ("eps", "delta", "sens"),
    [(1.0, 1e-5, 1.0), (0.1, 1e-6, 2.0), (5.0, 1e-3, 0.3), (20.0, 1e-9, 1.0)],
)
def test_analytic_sigma_solves_balle_wang_condition(eps: float, delta: float, sens: float) -> None:
    scipy_stats = pytest.importorskip("scipy.stats")
    scipy_opt = pytest.importorskip("scipy.optimize")

    def cond(s: float) -> float:
        a, b = sens / (2 * s) - eps * s / sens, -sens / (2 * s) - eps * s / sens
        return scipy_stats.norm.cdf(a) - math.exp(eps) * scipy_stats.norm.cdf(b) - delta

    ref = scipy_opt.brentq(cond, 1e-6 * sens, 1e4 * sens, xtol=1e-14, rtol=1e-13)
    sigma = analytic_gaussian_sigma(eps, delta, sens)
    assert sigma == pytest.approx(ref, rel=1e-8)
    assert gaussian_delta(eps, sens / sigma) <= delta  # rounded up: always satisfies (eps, delta)
    assert gaussian_delta(eps, sens / (sigma * (1 - 1e-7))) > delta  # and is minimal


def test_analytic_sigma_against_dp_accounting_pld() -> None:
    dpl = pytest.importorskip("dp_accounting.pld.privacy_loss_distribution")
    for eps, delta in ((1.0, 1e-5), (3.0, 1e-6)):
        sigma = analytic_gaussian_sigma(eps, delta, 2.0)
        pld = dpl.from_gaussian_mechanism(
            standard_deviation=sigma, sensitivity=2.0, value_discretization_interval=1e-3
        )
        got = pld.get_delta_for_epsilon(eps)
        assert got == pytest.approx(delta, rel=1e-6)
        # the classical bound sqrt(2 log(1.25/delta)) D / eps is looser for eps < 1
    assert analytic_gaussian_sigma(0.5, 1e-5, 1.0) < math.sqrt(2 * math.log(1.25e5)) / 0.5


def test_log_ndtr_tails() -> None:
    scipy_special = pytest.importorskip("scipy.special")
    for x in (-60.0, -38.0, -36.9, -10.0, -1.0, 0.0, 2.0, 9.0):
        assert log_ndtr(x) == pytest.approx(float(scipy_special.log_ndtr(x)), rel=1e-12, abs=1e-300)


def test_gaussian_unbiased_with_calibrated_variance() -> None:
    n, c, r, eps, delta = 200_000, 0.1, 0.5, 1.0, 1e-5
    sigma = analytic_gaussian_sigma(eps, delta, 2 * r)
    w = torch.full((n,), 0.3)
    out = gaussian(w, c, r, eps, delta, generator=_gen(1)).double()
    assert out.dtype == torch.float64 and out.shape == (n,)
    assert abs(out.mean().item() - 0.3) <= 5 * sigma / math.sqrt(n)
    var_se = sigma**2 * math.sqrt(2.0 / (n - 1))
    assert abs(out.var().item() - sigma**2) <= 5 * var_se
    # clipping: a weight outside the box is released around c + r
    out = gaussian(torch.full((n,), 9.0), c, r, eps, delta, generator=_gen(2)).double()
    assert abs(out.mean().item() - (c + r)) <= 5 * sigma / math.sqrt(n)


def test_gaussian_per_layer_radius_and_determinism() -> None:
    w = torch.zeros(2, 50_000)
    r = torch.tensor([[0.1], [1.0]])
    out = gaussian(w, 0.0, r, 2.0, 1e-5, generator=_gen(3))
    sigma = analytic_gaussian_sigma(2.0, 1e-5, 1.0)
    for row, rr in enumerate((0.1, 1.0)):
        expected = 2 * rr * sigma
        assert out[row].std().item() == pytest.approx(expected, rel=5 * math.sqrt(2 / 50_000))
    again = gaussian(w, 0.0, r, 2.0, 1e-5, generator=_gen(3))
    assert torch.equal(out, again)


def test_gaussian_validation() -> None:
    with pytest.raises(ValueError, match="delta"):
        gaussian(torch.zeros(3), 0.0, 1.0, 1.0, 0.0)
    with pytest.raises(ValueError, match="r must be"):
        gaussian(torch.zeros(3), 0.0, -1.0, 1.0, 1e-5)
    with pytest.raises(TypeError, match="generator"):
        gaussian(torch.zeros(3), 0.0, 1.0, 1.0, 1e-5, generator=np.random.default_rng(0))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="broadcast"):
        gaussian(torch.zeros(3), torch.zeros(4), 1.0, 1.0, 1e-5)


# ------------------------------------------------------------------------------ Laplace


def test_laplace_scale_and_unbiasedness() -> None:
    n, c, r, eps = 200_000, -0.2, 0.25, 0.8
    b = laplace_scale(r, eps)
    assert b == pytest.approx(2 * r / eps)
    out = laplace(torch.full((n,), 0.0), c, r, eps, generator=_gen(4)).double()
    x = out - 0.0
    assert abs(x.mean().item()) <= 5 * math.sqrt(2) * b / math.sqrt(n)
    # Var = 2 b^2; Var(X^2) = E X^4 - (E X^2)^2 = 24 b^4 - 4 b^4
    assert abs((x**2).mean().item() - 2 * b * b) <= 5 * math.sqrt(20.0 / n) * b * b
    # P(|X| > b) = 1/e
    frac = (x.abs() > b).double().mean().item()
    assert abs(frac - math.exp(-1)) <= 5 * math.sqrt(math.exp(-1) * (1 - math.exp(-1)) / n)
    assert torch.isfinite(out).all()


def test_laplace_clips_first() -> None:
    n = 100_000
    out = laplace(torch.full((n,), -7.0), 1.0, 0.5, 2.0, generator=_gen(5)).double()
    b = laplace_scale(0.5, 2.0)
    assert abs(out.mean().item() - 0.5) <= 5 * math.sqrt(2) * b / math.sqrt(n)


# ------------------------------------------------------------------------------ vanilla


def test_vanilla_identity_and_optional_clip() -> None:
    w = torch.tensor([-3.0, 0.2, 4.0], dtype=torch.float64)
    out = vanilla(w)
    assert out.dtype == torch.float32
    assert torch.equal(out, w.float())
    out[0] = 100.0
    assert w[0] == -3.0  # a copy
    clipped = vanilla(w, 0.0, 1.0, clip=True)
    assert torch.equal(clipped, torch.tensor([-1.0, 0.2, 1.0]))
    with pytest.raises(ValueError, match="clip=True"):
        vanilla(w, clip=True)


# ------------------------------------------------------------------------------ CQ


def test_cq_shared_randomness_is_deterministic() -> None:
    perm, off = cq_shared_randomness(2024, 7, (3, 5))
    perm2, off2 = cq_shared_randomness(2024, 7, (3, 5))
    assert torch.equal(perm, perm2) and torch.equal(off, off2)
    assert sorted(perm.tolist()) == list(range(7))
    assert off.shape == (3, 5) and int(off.min()) >= 0 and int(off.max()) < 7
    assert not torch.equal(cq_shared_randomness(2025, 7, (3, 5))[1], off)


def test_cq_single_client_is_unbiased() -> None:
    m, n, c, r = 200_000, 8, 0.5, 2.0
    _, off = cq_shared_randomness(11, n, (m,))
    for w in (-1.2, 0.5, 2.1):
        bits = cq(torch.full((m,), w), c, r, 3, n, shared_offset=off, generator=_gen(6))
        vals = cq_decode(bits, c, r).double()
        x = (w - c + r) / (2 * r)
        se = 2 * r * math.sqrt(x * (1 - x) / m)
        assert abs(vals.mean().item() - w) <= 5 * se


def test_cq_identical_inputs_are_stratified_exactly() -> None:
    m, n, c, r = 5_000, 10, 0.0, 1.0
    perm, off = cq_shared_randomness(99, n, (m,))
    x = torch.rand(m, generator=_gen(7))
    w = c - r + 2 * r * x
    count = torch.zeros(m)
    for i in range(n):
        count += cq(w, c, r, int(perm[i]), n, shared_offset=off, generator=_gen(100 + i)).float()
    lo = torch.floor(n * x)
    assert bool(((count == lo) | (count == lo + 1)).all())


def _cq_and_independent_mse(w: torch.Tensor, r: float, seed: int) -> tuple[float, float]:
    n, m = w.shape
    g = _gen(seed)
    truth = w.double().mean(0)
    perm, off = cq_shared_randomness(seed, n, (m,))
    est_cq = torch.zeros(m, dtype=torch.float64)
    est_sr = torch.zeros(m, dtype=torch.float64)
    for i in range(n):
        bits = cq(w[i], 0.0, r, int(perm[i]), n, shared_offset=off, generator=g)
        est_cq += cq_decode(bits, 0.0, r).double() / n
        indep = cq(w[i], 0.0, r, 0, 1, generator=g)  # n = 1: U uniform, independent rounding
        est_sr += cq_decode(indep, 0.0, r).double() / n
    return ((est_cq - truth) ** 2).mean().item(), ((est_sr - truth) ** 2).mean().item()


def test_cq_mean_beats_independent_stochastic_rounding() -> None:
    m, n, r = 20_000, 16, 1.0
    g = _gen(8)
    # spread-out inputs: w_i uniform on the whole box
    w = torch.rand(n, m, generator=g) * 2 * r - r
    mse_cq, mse_sr = _cq_and_independent_mse(w, r, 5)
    # independent rounding: (4 r^2 / n^2) sum_i x_i (1 - x_i), about 2 r^2 / (3 n)
    assert mse_sr == pytest.approx(2 * r * r / (3 * n), rel=0.05)
    assert mse_cq < 0.75 * mse_sr
    # similar inputs (the FL case): the stratification removes most of the error
    base = torch.rand(m, generator=g) * 1.6 - 0.8
    w = base + 0.1 * (torch.rand(n, m, generator=g) * 2 - 1)
    mse_cq, mse_sr = _cq_and_independent_mse(w, r, 6)
    assert mse_cq < 0.25 * mse_sr


def test_cq_validation() -> None:
    with pytest.raises(ValueError, match="rank"):
        cq(torch.zeros(3), 0.0, 1.0, 4, 4)
    with pytest.raises(ValueError, match="shared_offset"):
        cq(torch.zeros(3), 0.0, 1.0, 1, 4, shared_offset=torch.tensor([0, 1, 4]))
    with pytest.raises(TypeError, match="bool"):
        cq_decode(torch.zeros(3), 0.0, 1.0)


# ------------------------------------------------------------------------------ ternary


@pytest.mark.parametrize("p0", [0.0, 0.6])
def test_ternary_marginals_and_unbiased_decode(p0: float) -> None:
    n, c, r, eps = 200_000, 0.3, 0.5, 1.5
    big_a, big_b = ternary_params(r, eps, p0)
    assert big_a == pytest.approx(r * alpha(eps))
    for w in (c - r, c, c + 0.2, c + r):
        x = w - c
        t = ternary(torch.full((n,), w), c, r, eps, p0, generator=_gen(9))
        assert t.dtype == torch.int8
        expected = {1: (big_a + x) / (2 * big_b), 0: p0, -1: (big_a - x) / (2 * big_b)}
        for value, p in expected.items():
            emp = (t == value).double().mean().item()
            assert abs(emp - p) <= 5 * math.sqrt(p * (1 - p) / n) + 1e-12, (w, value)
        dec = ternary_decode(t, c, r, eps, p0).double()
        var = big_a * big_b - x * x  # Section 6: Var(B t) = A B - x^2
        assert abs(dec.mean().item() - w) <= 5 * math.sqrt(var / n)


def test_ternary_pure_eps_ratio() -> None:
    r, eps, p0 = 0.7, 0.9, 0.3
    big_a, big_b = ternary_params(r, eps, p0)
    p_plus_hi, p_plus_lo = (big_a + r) / (2 * big_b), (big_a - r) / (2 * big_b)
    assert p_plus_hi / p_plus_lo == pytest.approx(math.exp(eps), rel=1e-12)
    # empirical likelihood ratio of +1 between the extreme inputs
    n = 400_000
    hi = (ternary(torch.full((n,), r), 0.0, r, eps, p0, generator=_gen(10)) == 1).double().mean()
    lo = (ternary(torch.full((n,), -r), 0.0, r, eps, p0, generator=_gen(11)) == 1).double().mean()
    ratio = (hi / lo).item()
    rel_se = math.sqrt((1 - p_plus_hi) / (n * p_plus_hi) + (1 - p_plus_lo) / (n * p_plus_lo))
    assert abs(math.log(ratio) - eps) <= 5 * rel_se


def _neyman_pearson(p: np.ndarray, q: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Trade-off T(P, Q): reject on outcomes in decreasing Q/P order, interpolate linearly."""
    order = np.argsort(-(q / p))
    alphas = np.concatenate([[0.0], np.cumsum(p[order])])
    betas = 1.0 - np.concatenate([[0.0], np.cumsum(q[order])])
    return np.interp(grid, alphas, betas)


@pytest.mark.parametrize(
    ("big_a", "big_b", "c"), [(0.25, 0.5, 0.1), (1.0, 1.0, 0.5), (2.0, 5.0, 1.0)]
)
def test_ternary_tradeoff_matches_eq13_and_neyman_pearson(
    big_a: float, big_b: float, c: float
) -> None:
    grid = np.linspace(0, 1, 2001)
    f = ternary_tradeoff(grid, big_a, big_b, c)

    def pmf(x: float) -> np.ndarray:
        return np.array([(big_a + x) / (2 * big_b), 1 - big_a / big_b, (big_a - x) / (2 * big_b)])

    p, q = pmf(-c), pmf(c)
    keep = p > 0
    np.testing.assert_allclose(f, _neyman_pearson(p[keep], q[keep], grid), atol=1e-12)
    eps = math.log((big_a + c) / (big_a - c))
    assert np.all(
        f
        >= np.maximum(0, np.maximum(1 - math.exp(eps) * grid, math.exp(-eps) * (1 - grid))) - 1e-12
    )
    assert f[0] == pytest.approx(1.0) and f[-1] == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="B >= A > c"):
        ternary_tradeoff(grid, 0.1, 0.5, 0.2)


def test_ternary_validation() -> None:
    with pytest.raises(ValueError, match="p0"):
        ternary(torch.zeros(3), 0.0, 1.0, 1.0, 1.0)
    with pytest.raises(TypeError):
        ternary_decode(torch.zeros(3), 0.0, 1.0, 1.0)


# ------------------------------------------------------------------------------ Fed-CAD


def test_fedcad_first_round_is_clip_plus_gaussian() -> None:
    f = FedCAD(1.5, eps=2.0, delta=1e-5)
    assert f.noise_multiplier == pytest.approx(analytic_gaussian_sigma(2.0, 1e-5, 3.0) / 1.5)
    x = torch.randn(1000, generator=_gen(12))
    x = x * (4.0 / x.norm())  # norm 4 > C
    out = f.perturb(x, generator=_gen(13))
    clipped = x * (1.5 / 4.0)
    noise = torch.randn(1000, generator=_gen(13)) * (f.noise_multiplier * 1.5)
    torch.testing.assert_close(out, clipped + noise, rtol=1e-6, atol=1e-5)
    assert f.round == 1 and f.v == 1.0
    torch.testing.assert_close(f.prev_update, clipped)


def test_fedcad_consecutive_noises_are_correlated_as_lines_14_16() -> None:
    dim, big_c = 200_000, 1.0
    f = FedCAD(big_c, eps=1.0, delta=1e-5, gamma=0.5, sigma_diff=0.0, diff_init=0.3)
    g = _gen(14)
    base = torch.randn(dim, generator=g) * (0.5 / math.sqrt(dim))
    out1 = f.perturb(base, generator=g)
    noise1 = out1 - f.prev_update
    out2 = f.perturb(base + torch.randn(dim, generator=g) * (0.01 / math.sqrt(dim)), generator=g)
    noise2 = out2 - f.prev_update
    sigma = f.noise_multiplier
    rel = 0.3
    r2 = (1 - rel) / ((1 - rel) ** 2 + 1.0)
    s2 = ((1 - r2) + r2 * rel) * sigma
    var2 = (s2**2 + r2**2 * sigma**2) * big_c**2
    corr_theory = r2 * sigma * big_c / math.sqrt(var2)
    corr = torch.corrcoef(torch.stack([noise1, noise2]))[0, 1].item()
    assert corr > 0.3
    assert abs(corr - corr_theory) <= 5 / math.sqrt(dim)
    assert noise2.var().item() == pytest.approx(var2, rel=5 * math.sqrt(2 / dim))
    assert var2 < (sigma * big_c) ** 2  # correlated noise is smaller than fresh noise
    assert f.v == pytest.approx(1.0 / ((1 - rel) ** 2 + 1.0))


def test_fedcad_pulls_large_jumps_back_to_expected_diff() -> None:
    f = FedCAD(1.0, eps=1.0, delta=1e-5, sigma_diff=0.0, diff_init=0.1)
    g = _gen(15)
    f.perturb(torch.full((100,), 0.05), generator=g)
    prev = f.prev_update.clone()
    bound = f.expected_diff
    f.perturb(torch.full((100,), -0.05), generator=g)  # jump of norm 1.0 > E[Diff] = 0.1
    assert (f.prev_update - prev).norm().item() == pytest.approx(bound, rel=1e-5)


def test_fedcad_state_round_trip() -> None:
    cfg = {"clip_norm": 1.0, "eps": 1.0, "delta": 1e-5, "gamma": 0.3, "sigma_diff": 0.02}
    a = FedCAD(**cfg)
    g = _gen(16)
    updates = [torch.randn(64, generator=g) * 0.1 for _ in range(4)]
    for u in updates[:2]:
        a.perturb(u, generator=_gen(17))
    state = a.state_dict()
    assert {type(v) for k, v in state.items() if k not in ("prev_update", "mu")} <= {int, float}
    b = FedCAD(**cfg)
    b.load_state_dict(state)
    for i, u in enumerate(updates[2:]):
        oa = a.perturb(u, generator=_gen(20 + i))
        ob = b.perturb(u, generator=_gen(20 + i))
        assert torch.equal(oa, ob)
    assert a.state_dict()["expected_diff"] == b.state_dict()["expected_diff"]
    with pytest.raises(ValueError, match="gamma"):
        FedCAD(1.0, 1.0, 1e-5, gamma=0.9).load_state_dict(state)
    with pytest.raises(ValueError, match="shape"):
        b.perturb(torch.zeros(65), generator=_gen(0))


# ------------------------------------------------------------------------------ devices


@pytest.mark.parametrize("device", DEVICES)
def test_same_code_path_on_every_device(device: str) -> None:
    w = torch.linspace(-2, 2, 1000, device=device)
    c = torch.zeros(1000, device=device)
    r = torch.ones(1000, device=device)
    outs = [
        gaussian(w, c, r, 1.0, 1e-5, generator=_gen(1, device)),
        laplace(w, c, r, 1.0, generator=_gen(2, device)),
        ternary(w, c, r, 1.0, 0.2, generator=_gen(3, device)),
        cq(w, c, r, 1, 4, generator=_gen(4, device)),
        FedCAD(1.0, 1.0, 1e-5).perturb(w, generator=_gen(5, device)),
    ]
    for out in outs:
        assert out.device.type == device
        assert out.shape == w.shape
