"""Tests of the privacy accounting: the privacy-loss math (exact RR composition, pair-joint view),
the ledger and the accountant, the report."""

from __future__ import annotations

import itertools
import json
import math
import re
import time
from pathlib import Path

import numpy as np
import pytest
from report_keys import keys

from corbin_fl.config import MECHANISMS as CONFIG_MECHANISMS
from corbin_fl.mechanisms import privacy_loss
from corbin_fl.mechanisms.accounting import (
    MECHANISMS,
    THREAT_MODELS,
    Accountant,
    PrivacyEvent,
    PrivacyLedger,
)
from corbin_fl.mechanisms.baselines.gaussian import analytic_gaussian_sigma, gaussian_epsilon
from corbin_fl.mechanisms.privacy_loss import (
    eps_parameter,
    pair_joint_delta,
    pair_joint_epsilon,
    pair_joint_pld,
    rr_delta,
    rr_epsilon,
)
from corbin_fl.mechanisms.report import REPORT_VERSION, privacy_report
from corbin_fl.mechanisms.theory import alpha64, corbin_pair_joint_from_q, theorem3_mse_bound


def _hockey(p: np.ndarray, q: np.ndarray, eps: float) -> np.ndarray:
    return np.maximum(0.0, p - math.exp(eps) * q).sum(-1)


@pytest.fixture(scope="module")
def dpl():
    return pytest.importorskip("dp_accounting.pld.privacy_loss_distribution")


# ------------------------------------------------------------------------- threat model (A)


def test_eps_parameter_is_identity() -> None:
    assert eps_parameter(0.7) == 0.7
    with pytest.raises(ValueError):
        eps_parameter(0.0)


def test_rr_single_bit_closed_form() -> None:
    for eps_p in (0.3, 1.0, 4.0):
        q_hi = math.exp(eps_p) / (1 + math.exp(eps_p))
        for eps in (-1.0, 0.0, 0.5 * eps_p, eps_p, 2 * eps_p):
            expected = max(0.0, q_hi - math.exp(eps) * (1 - q_hi)) + max(
                0.0, (1 - q_hi) - math.exp(eps) * q_hi
            )
            assert rr_delta(eps_p, 1, eps) == pytest.approx(expected, abs=1e-15)


def test_rr_delta_matches_scipy_binomial_sum() -> None:
    stats = pytest.importorskip("scipy.stats")
    for eps_p, k in ((1.0, 10_000), (0.2, 3_000), (3.0, 500)):
        j = np.arange(k + 1)
        p = 1 / (1 + math.exp(eps_p))
        loss = eps_p * (k - 2 * j)
        pmf = stats.binom.pmf(j, k, p)
        for eps in np.linspace(0, k * eps_p * math.tanh(eps_p / 2) * 1.3, 7):
            mask = loss > eps
            ref = float(np.sum(pmf[mask] * -np.expm1(eps - loss[mask])))
            assert rr_delta(eps_p, k, float(eps)) == pytest.approx(ref, rel=1e-9, abs=1e-300)


@pytest.mark.parametrize(("eps_p", "k"), [(1.0, 10), (2.0, 50), (1.0, 40), (3.0, 20)])
def test_rr_delta_matches_dp_accounting_pld(dpl, eps_p: float, k: int) -> None:
    # noise_parameter is the probability of answering a uniformly random bucket, so the bit is
    # kept with probability 1 - p/2 = e^eps/(1+e^eps): p = 2/(1+e^eps). eps_p is a multiple of
    # the discretisation step, so dp-accounting's pessimistic rounding is exact here.
    pld = dpl.from_randomized_response(
        2 / (1 + math.exp(eps_p)), 2, value_discretization_interval=1e-4
    ).self_compose(k)
    mean = k * eps_p * math.tanh(eps_p / 2)
    for eps in (0.0, 0.5 * mean, mean, 1.3 * mean + 1.0):
        assert rr_delta(eps_p, k, eps) == pytest.approx(
            pld.get_delta_for_epsilon(eps), rel=1e-9, abs=1e-14
        )


def test_rr_delta_below_dp_accounting_for_off_grid_eps(dpl) -> None:
    eps_p, k = 0.37, 60
    pld = dpl.from_randomized_response(2 / (1 + math.exp(eps_p)), 2).self_compose(k)
    for eps in (0.0, 2.0, 5.0):
        ours, theirs = rr_delta(eps_p, k, eps), pld.get_delta_for_epsilon(eps)
        assert ours <= theirs + 1e-12  # theirs is a pessimistic discretisation
        assert theirs - ours <= 5e-3


def test_rr_epsilon_known_values() -> None:
    assert rr_epsilon(1.0, 1_000, 1e-5) == pytest.approx(577.8, rel=1e-3)
    assert rr_epsilon(1.0, 100_000, 1e-5) == pytest.approx(47_404, rel=1e-3)


def test_rr_epsilon_inverts_rr_delta() -> None:
    for eps_p, k, delta in ((1.0, 1000, 1e-5), (0.1, 50_000, 1e-8), (5.0, 200, 1e-3)):
        eps = rr_epsilon(eps_p, k, delta)
        assert 0 < eps <= k * eps_p
        assert rr_delta(eps_p, k, eps) <= delta
        assert rr_delta(eps_p, k, eps * (1 - 1e-9)) > delta * (1 - 1e-6)
    assert rr_epsilon(0.01, 1, 0.5) == 0.0  # delta(0) = tanh(eps_p/2) is below the target


def test_rr_epsilon_scales_to_huge_k() -> None:
    t0 = time.perf_counter()
    eps = rr_epsilon(1.0, 11_200_000 * 100, 1e-5)
    elapsed = time.perf_counter() - t0
    mean = 1.12e9 * math.tanh(0.5)
    sd = 2 * math.sqrt(1.12e9 * (1 / (1 + math.e)) * (1 - 1 / (1 + math.e)))
    assert mean + 3 * sd < eps < mean + 6 * sd  # the 1e-5 quantile region of the loss
    assert elapsed < 10.0


# ------------------------------------------------------------------------- threat model (B)


def _brute_triples(eps_p: float, d: int, px: float, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """All (P, Q) for thresholds on a grid of [q_lo, q_hi] holding every codebook boundary."""
    q_lo = 1 / (1 + math.exp(eps_p))
    q_hi = 1 - q_lo
    n = 1 << d
    pz = np.array([px ** bin(z).count("1") * (1 - px) ** (d - bin(z).count("1")) for z in range(n)])
    cdf = np.concatenate([[0.0], np.cumsum(pz)])
    grid = np.unique(
        np.concatenate(
            [np.linspace(q_lo, q_hi, steps), cdf[(cdf > q_lo) & (cdf < q_hi)], [q_lo, q_hi]]
        )
    )
    t, tp, o = (a.ravel() for a in np.meshgrid(grid, grid, grid, indexing="ij"))
    p_lead = corbin_pair_joint_from_q(t, o, d, px).reshape(-1, 4)
    q_lead = corbin_pair_joint_from_q(tp, o, d, px).reshape(-1, 4)
    p_fol = corbin_pair_joint_from_q(o, t, d, px).reshape(-1, 4)
    q_fol = corbin_pair_joint_from_q(o, tp, d, px).reshape(-1, 4)
    return np.concatenate([p_lead, p_fol]), np.concatenate([q_lead, q_fol])


@pytest.mark.parametrize(("eps_p", "d", "px"), [(1.0, 2, 0.5), (0.3, 3, 0.5), (1.0, 3, 0.3)])
def test_pair_joint_single_parameter_is_worst_case_over_a_finer_grid(
    eps_p: float, d: int, px: float
) -> None:
    p, q = _brute_triples(eps_p, d, px, 23)
    for eps in (-0.5, 0.0, 0.05, 0.3, 1.0, 2.5):
        brute = float(_hockey(p, q, eps).max())
        assert pair_joint_delta(eps_p, d, 1, eps, p_x=px) == pytest.approx(brute, abs=1e-12)
    # random thresholds never exceed the envelope
    rng = np.random.default_rng(3)
    q_lo = 1 / (1 + math.exp(eps_p))
    t, tp, o = rng.uniform(q_lo, 1 - q_lo, (3, 50_000))
    pr = corbin_pair_joint_from_q(t, o, d, px).reshape(-1, 4)
    qr = corbin_pair_joint_from_q(tp, o, d, px).reshape(-1, 4)
    pld = pair_joint_pld(eps_p, d, px)
    for eps in (0.0, 0.2, 1.0):
        assert _hockey(pr, qr, eps).max() <= pld.delta(eps) + 1e-12


def test_pair_joint_has_infinite_loss_close_to_one_over_alpha() -> None:
    for eps_p in (0.5, 1.0, 3.0):
        for d in (3, 5, 8):
            pld = pair_joint_pld(eps_p, d)
            inv_a = 1 / alpha64(eps_p)
            assert inv_a - 2.0 ** (1 - d) <= pld.inf_mass <= inv_a + 1e-15  # TV <= 1/alpha
            assert pld.single_inf_mass == pytest.approx(pld.inf_mass, abs=1e-15)
            assert pld.probs.sum() + pld.inf_mass == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_pair_joint_composition_matches_outcome_enumeration(k: int) -> None:
    pld = pair_joint_pld(1.0, 3)
    p1 = np.concatenate([[pld.inf_mass], pld.probs])
    q1 = np.concatenate([[0.0], pld.probs * np.exp(-pld.losses)])
    pk, qk = p1, q1
    for _ in range(k - 1):
        pk, qk = np.outer(pk, p1).ravel(), np.outer(qk, q1).ravel()
    for eps in (0.0, 0.5, 1.0, 2.0, 4.0):
        exact = pair_joint_delta(1.0, 3, k, eps, method="exact")
        assert exact == pytest.approx(float(_hockey(pk, qk, eps)), abs=1e-13)
        assert pair_joint_delta(1.0, 3, k, eps, method="bound") >= exact - 1e-13


def test_pair_joint_two_parameters_bounded_by_worst_pair_of_triples() -> None:
    eps_p, d = 1.0, 2
    p, q = _brute_triples(eps_p, d, 0.5, 5)
    p2 = np.einsum("ai,bj->abij", p, p).reshape(len(p), len(p), 16)
    q2 = np.einsum("ai,bj->abij", q, q).reshape(len(q), len(q), 16)
    floor = 1 - (1 - pair_joint_pld(eps_p, d).single_inf_mass) ** 2
    for eps in (0.0, 0.5, 1.5):
        realised = float(_hockey(p2, q2, eps).max())
        upper = pair_joint_delta(eps_p, d, 2, eps)
        assert floor - 1e-12 <= realised <= upper + 1e-12


def test_pair_joint_matches_dp_accounting_for_moderate_k(dpl) -> None:
    for k in (10, 30):
        for eps in (0.5, 2.0):
            exact = pair_joint_delta(0.1, 4, k, eps, method="exact")
            theirs = pair_joint_delta(0.1, 4, k, eps, method="dp_accounting")
            assert theirs >= exact - 1e-9
            assert theirs == pytest.approx(exact, abs=2e-3)


def test_pair_joint_saturates_and_has_no_finite_eps_for_real_models() -> None:
    pld = pair_joint_pld(1.0, 5)
    k = 11_200_000
    assert pair_joint_delta(1.0, 5, k, 1e6) == 1.0
    assert pair_joint_epsilon(1.0, 5, k, 1e-5) == math.inf
    assert pair_joint_epsilon(1.0, 5, 3, 1e-5) == math.inf  # 1-(1-0.45)^3 > 1e-5 already
    # a loose delta above the floor has a finite eps, consistent with pair_joint_delta
    floor = 1 - (1 - pld.inf_mass) ** 3
    target = floor + 0.5 * (pair_joint_delta(1.0, 5, 3, 0.0) - floor)
    eps = pair_joint_epsilon(1.0, 5, 3, target)
    assert math.isfinite(eps)
    assert pair_joint_delta(1.0, 5, 3, eps) <= target
    assert eps > 0.0
    assert pair_joint_delta(1.0, 5, 3, eps * (1 - 1e-6)) > target


def test_pair_joint_validation() -> None:
    with pytest.raises(ValueError, match="d must be"):
        pair_joint_pld(1.0, 17)
    with pytest.raises(ValueError, match="unknown method"):
        pair_joint_delta(1.0, 3, 2, 0.0, method="magic")  # type: ignore[arg-type]


# ------------------------------------------------------------------------- ledger, accountant


def _ledger() -> PrivacyLedger:
    led = PrivacyLedger()
    for rnd in (1, 2, 3):
        led.record(rnd, "a", "corbin", 1.0, 1000, paired=True, d=5)
        led.record(rnd, "b", "gaussian", 1.0, 1000, delta=1e-6)
        led.record(rnd, "c", "fedavg", None, 1000)
    led.record(3, "d", "ldp", 0.5, 200)
    return led


def test_ledger_json_round_trip_and_validation() -> None:
    led = _ledger()
    text = led.to_json()
    back = PrivacyLedger.from_json(text)
    assert back.events == led.events
    assert back.nodes() == ["a", "b", "c", "d"]
    assert back.events[-1].mechanism == "ldpfl"
    with pytest.raises(ValueError, match="version"):
        PrivacyLedger.from_json(json.dumps({"version": 2, "events": []}))
    with pytest.raises(ValueError, match="paired"):
        PrivacyEvent(1, "x", "laplace", 1.0, 10, paired=True, d=3)
    with pytest.raises(ValueError, match="needs eps_p"):
        PrivacyEvent(1, "x", "corbin", None, 10)
    with pytest.raises(ValueError, match="unknown mechanism"):
        PrivacyEvent(1, "x", "magic", 1.0, 10)


def _per_node(ledger: PrivacyLedger) -> dict[str, Accountant]:
    out: dict[str, Accountant] = {}
    for event in ledger:
        out.setdefault(event.node, Accountant()).compose(event)
    return out


def test_accountant_per_client() -> None:
    acc = _per_node(_ledger())
    assert acc["a"].get_epsilon(1e-5) == pytest.approx(rr_epsilon(1.0, 3000, 1e-5))
    # (B) of the paired client: no finite eps, delta >= 1 - (1 - p_inf)^k ~ 1
    single = pair_joint_pld(1.0, 5).single_inf_mass
    assert pair_joint_epsilon(1.0, 5, 3000, 1e-5) == math.inf
    assert 1.0 - math.exp(3000 * math.log1p(-single)) == pytest.approx(1.0)
    mu = math.sqrt(3000) / analytic_gaussian_sigma(1.0, 1e-6, 1.0)
    assert acc["b"].get_epsilon(1e-5) == pytest.approx(gaussian_epsilon(1e-5, mu))
    assert acc["c"].get_epsilon(1e-5) == math.inf
    assert acc["d"].get_epsilon(1e-5) == pytest.approx(rr_epsilon(0.5, 200, 1e-5))


def test_accountant_composes_counts_units_and_families() -> None:
    pure = PrivacyEvent(1, "x", "ldpfl", 0.5, 100)
    assert Accountant().get_epsilon(1e-5) == 0.0
    assert Accountant().compose(pure, 3).get_epsilon(1e-5) == rr_epsilon(0.5, 300, 1e-5)
    three = Accountant().compose(pure).compose(pure).compose(pure)
    assert three.get_epsilon(1e-5) == rr_epsilon(0.5, 300, 1e-5)
    # pure releases at different eps_p: k-fold RR at the largest (optimal composition bound)
    mixed_eps = Accountant().compose(pure).compose(PrivacyEvent(2, "x", "laplace", 0.8, 50))
    assert mixed_eps.get_epsilon(1e-5) == rr_epsilon(0.8, 150, 1e-5)
    # a per-update Gaussian (fedcad) counts updates, not parameters; exactly mu_1 sqrt(T)
    upd = PrivacyEvent(1, "x", "fedcad", 2.0, 10_000, delta=1e-4)
    mu1 = 1.0 / analytic_gaussian_sigma(2.0, 1e-4, 1.0)
    assert Accountant().compose(upd, 7).get_epsilon(1e-5) == gaussian_epsilon(
        1e-5, mu1 * math.sqrt(7)
    )
    # Gaussian per parameter: mu_1 sqrt(m T), bit for bit what the report prints
    gauss = PrivacyEvent(1, "x", "gaussian", 1.0, 40, delta=1e-6)
    mu_g = 1.0 / analytic_gaussian_sigma(1.0, 1e-6, 1.0)
    assert Accountant().compose(gauss, 5).get_epsilon(1e-5) == gaussian_epsilon(
        1e-5, mu_g * math.sqrt(200)
    )
    # two families: basic composition with delta split evenly
    both = Accountant().compose(pure).compose(gauss)
    assert both.get_epsilon(1e-5) == pytest.approx(
        rr_epsilon(0.5, 100, 5e-6) + gaussian_epsilon(5e-6, mu_g * math.sqrt(40))
    )
    # a release without local DP: no finite eps, whatever else was composed
    assert both.compose(PrivacyEvent(1, "x", "fedavg", None, 10)).get_epsilon(1e-5) == math.inf
    with pytest.raises(TypeError, match="PrivacyEvent"):
        Accountant().compose({"mechanism": "ldpfl"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="count"):
        Accountant().compose(pure, 0)
    with pytest.raises(ValueError, match="delta"):
        Accountant().compose(pure).get_epsilon(0.0)


@pytest.mark.parametrize("eps_p, k", [(0.1, 7), (1.0, 1000), (2.5, 10**6), (0.3, 10**9), (8.0, 50)])
def test_rr_lattice_log_cumsum_equals_torch_logcumsumexp(eps_p: float, k: int) -> None:
    """NumPy's ``logaddexp.accumulate`` gives torch's ``logcumsumexp`` bit for bit (the
    accounting dropped torch for it: every committed number stays)."""
    torch = pytest.importorskip("torch")
    privacy_loss._rr_lattice.cache_clear()
    lat = privacy_loss._rr_lattice(eps_p, k)
    x = lat.logp + lat.neg_loss  # log P - L
    want = torch.logcumsumexp(torch.from_numpy(x), dim=0).numpy()
    assert np.array_equal(lat.log_cum_s2, want)


# ------------------------------------------------------------------------- report


def test_privacy_report_is_json_and_fast() -> None:
    t0 = time.perf_counter()
    rep = privacy_report("corbin", 1.0, 1e-5, 11_200_000, 100, d=5, n=50, r=0.05)
    elapsed = time.perf_counter() - t0
    assert elapsed < 5.0  # < 1 s on an idle core; generous for a shared CI machine
    json.dumps(rep, allow_nan=False)
    assert rep["version"] == REPORT_VERSION and "dp" not in rep
    a = rep["threat_models"]["A"]
    assert a["dp"] is True
    assert a["per_parameter"] == {"eps": 1.0, "delta": 0.0}
    assert a["per_update"] == {
        "k": 11_200_000,
        "eps": pytest.approx(rr_epsilon(1.0, 11_200_000, 1e-5)),
        "delta": 1e-5,
    }
    assert a["all_rounds"]["eps"] == pytest.approx(rr_epsilon(1.0, 1_120_000_000, 1e-5))
    b = rep["threat_models"]["B"]
    assert b["dp"] is False and b["headline"].startswith("no DP")
    assert b["guarantee"].startswith("No DP.")
    joint = b["pair_joint"]
    pld = pair_joint_pld(1.0, 5)
    assert joint["per_parameter"]["single_triple_inf_mass"] == pld.single_inf_mass
    assert joint["per_update"] == {"k": 11_200_000, "delta_lower_bound": 1.0}
    assert joint["all_rounds"]["delta_lower_bound"] == 1.0
    assert rep["mse_bounds"]["corbin_theorem2"] < rep["mse_bounds"]["ldpq"]


def _reports() -> dict[str, dict]:
    return {
        mech: privacy_report(mech, 1.0, 1e-5, 5_000, 7, d=5, gamma=0.2, n=10, r=0.05)
        for mech in CONFIG_MECHANISMS
    }


#: What the report must say against each adversary: True = a DP guarantee, False = "no DP".
EXPECTED_DP = {
    "corbin": {"A": True, "B": False, "C": False, "D": False},
    "augcorbin": {"A": True, "B": False, "C": False, "D": False},
    "ldpfl": {"A": True, "B": True, "C": True, "D": True},
    "gaussian": {"A": True, "B": True, "C": True, "D": True},
    "laplace": {"A": True, "B": True, "C": True, "D": True},
    "ternary": {"A": True, "B": True, "C": True, "D": True},
    "pbm": {"A": True, "B": True, "C": True, "D": True},
    "rqm": {"A": True, "B": True, "C": True, "D": True},
    "imvu": {"A": True, "B": True, "C": True, "D": True},
    "fedcad": {"A": True, "B": True, "C": True, "D": True},
    "fedavg": {"A": False, "B": False, "C": False, "D": False},
    "cq": {"A": False, "B": False, "C": False, "D": False},
    "signsgd": {"A": False, "B": False, "C": False, "D": False},
    "central-gaussian": {"A": False, "B": False, "C": True, "D": False},
}


def test_every_run_mechanism_has_one_guarantee_per_threat_model() -> None:
    assert set(EXPECTED_DP) == set(CONFIG_MECHANISMS) == set(MECHANISMS)
    for mech, rep in _reports().items():
        json.dumps(rep, allow_nan=False)
        tm = rep["threat_models"]
        assert list(tm) == list(THREAT_MODELS), mech
        for key, entry in tm.items():
            assert entry["name"] == THREAT_MODELS[key]
            assert entry["dp"] is EXPECTED_DP[mech][key], (mech, key)
            assert 0 < len(entry["headline"]) <= 46, (mech, key, entry["headline"])
            assert entry["headline"].startswith("no DP") is not entry["dp"], (mech, key)
            assert entry["guarantee"].startswith("No DP") is not entry["dp"], (mech, key)
            if not entry["dp"]:
                assert "delta" not in keys(entry) and "eps" not in keys(entry), (mech, key)
            else:
                assert {"per_parameter", "per_update"} & set(entry), (mech, key)


def test_threat_model_numbers_are_the_exact_compositions() -> None:
    reps = _reports()
    m, t = 5_000, 7
    for mech in ("corbin", "augcorbin", "ldpfl", "laplace", "ternary"):
        a = reps[mech]["threat_models"]["A"]
        assert a["per_parameter"] == {"eps": 1.0, "delta": 0.0}
        assert a["per_update"]["eps"] == pytest.approx(rr_epsilon(1.0, m, 1e-5))
        assert a["all_rounds"]["eps"] == pytest.approx(rr_epsilon(1.0, m * t, 1e-5))
    # Independent local randomizers: the server (B) and a client (C) get A's numbers; a
    # malicious server (D) only the per-parameter (per-update) guarantee.
    for mech in ("ldpfl", "gaussian", "laplace", "ternary", "fedcad"):
        tm = reps[mech]["threat_models"]
        for part in ("per_update", "all_rounds"):
            assert tm["B"][part] == tm["A"][part] == tm["C"][part], (mech, part)
        assert "all_rounds" not in tm["D"]
    assert reps["fedcad"]["threat_models"]["D"]["per_update"]["k"] == 1
    assert reps["ldpfl"]["threat_models"]["D"]["per_parameter"] == {"eps": 1.0, "delta": 0.0}
    mu1 = 1 / analytic_gaussian_sigma(1.0, 1e-5, 1.0)
    g = reps["gaussian"]["threat_models"]["A"]
    assert g["all_rounds"]["eps"] == pytest.approx(gaussian_epsilon(1e-5, mu1 * math.sqrt(m * t)))
    rep = privacy_report("gaussian", 2.0, 1e-5, 100, 10, delta_p=1e-7)
    mu1 = 1 / analytic_gaussian_sigma(2.0, 1e-7, 1.0)
    assert rep["threat_models"]["A"]["all_rounds"]["eps"] == pytest.approx(
        gaussian_epsilon(1e-5, mu1 * math.sqrt(1000))
    )
    assert rep["threat_models"]["A"]["headline"] == "(2, 1e-07) per parameter"
    # Paired: the pair-joint lower bound on delta, 1 - (1 - p_inf)^k, is what B shows.
    p_inf = pair_joint_pld(1.0, 5).single_inf_mass
    joint = reps["corbin"]["threat_models"]["B"]["pair_joint"]
    assert joint["per_update"]["delta_lower_bound"] == pytest.approx(1 - (1 - p_inf) ** m)


def test_no_dp_mechanisms_have_no_delta_anywhere() -> None:
    for mech in ("fedavg", "vanilla", "cq"):
        rep = privacy_report(mech, None, 1e-5, 100, 10)
        assert "delta" not in keys(rep), mech
        assert rep["eps_p"] is None and not any(e["dp"] for e in rep["threat_models"].values())
    assert privacy_report("vanilla", None, 1e-5, 100, 10)["mechanism"] == "fedavg"


def test_notes_and_guarantees_speak_of_their_own_mechanism_only() -> None:
    names = {
        "corbin": ("corbin", "CorBin-FL", "CorBinQ"),
        "augcorbin": ("augcorbin", "AugCorBin-FL"),
        "ldpfl": ("ldpfl", "LDP-FL", "LDPQ"),
        "gaussian": ("gaussian",),
        "laplace": ("laplace",),
        "fedavg": ("fedavg", "FedAvg"),
        "cq": ("cq", "CQ"),
        "ternary": ("ternary",),
        "fedcad": ("fedcad", "Fed-CAD", "FedCAD"),
    }
    # A paired bit's marginal is LDPQ's (Theorem 1), and AugCorBin-FL mixes both quantizers:
    # naming a quantizer there explains the mechanism's own guarantee.
    allowed = {"corbin": {"LDPQ"}, "augcorbin": {"CorBinQ", "LDPQ"}}
    for mech, rep in _reports().items():
        texts = list(rep["notes"]) + [
            e[f] for e in rep["threat_models"].values() for f in ("headline", "guarantee")
        ]
        assert rep["notes"], mech
        for other, spellings in names.items():
            if other == mech:
                continue
            for name in set(spellings) - allowed.get(mech, set()):
                hits = [t for t in texts if re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", t)]
                assert not hits, (mech, name, hits)


def test_augcorbin_threat_models_follow_gamma_and_print_nothing_from_eq5() -> None:
    """Issue 38: where Theorem 3's condition holds (n = 100,000) the report used to print eq. (5)
    as C's guarantee; eq. (5) is not a valid bound, so C gives none, either way."""
    for n in (100_000, 50):
        rep = privacy_report("augcorbin", 1.0, 1e-5, 100, 2, d=3, gamma=0.5, n=n, r=0.01)
        c = rep["threat_models"]["C"]
        assert c["dp"] is False and "ucdp_theorem3" not in c
        assert "is not a valid bound" in c["guarantee"] and "Thm 3" not in c["headline"]
        assert rep["threat_models"]["B"]["dp"] is False  # the paired half: no DP
        # Theorem 3's MSE bound stays, as what it is (accuracy)
        assert rep["mse_bounds"]["corbin_theorem3"] == pytest.approx(
            theorem3_mse_bound(0.01, 1.0, n, 0.5)
        )
    # gamma = 1: nobody is paired, so the server sees independent LDPQ bits only.
    rep = privacy_report("augcorbin", 1.0, 1e-5, 100, 2, d=3, gamma=1.0, n=50, r=0.01)
    assert rep["threat_models"]["B"]["dp"] is True
    assert rep["threat_models"]["D"]["dp"] is False  # the server still chooses gamma
    with pytest.raises(ValueError, match="gamma"):
        privacy_report("augcorbin", 1.0, 1e-5, 100, 2, d=3, gamma=1.5)


def test_paired_report_without_pair_numbers_still_says_no_dp() -> None:
    for d in (None, 17):
        rep = privacy_report("corbin", 1.0, 1e-5, 100, 2, d=d)
        b = rep["threat_models"]["B"]
        assert b["dp"] is False and "pair_joint" not in b
        assert "not computed" in b["guarantee"]
    with pytest.raises(TypeError, match="d must be an int"):
        privacy_report("corbin", 1.0, 1e-5, 100, 2, d=2.5)
    with pytest.raises(ValueError, match="unknown mechanism"):
        privacy_report("magic", 1.0, 1e-5, 10, 1)


def test_pair_joint_dp_is_reported_where_it_exists() -> None:
    # Only for a budget so small that p_inf * k stays below delta: then the exact pair-joint
    # composition has a finite eps, and B says so with its numbers.
    rep = privacy_report("corbin", 1e-6, 1e-5, 2, 1, d=5)
    b = rep["threat_models"]["B"]
    assert b["dp"] is True and not b["headline"].startswith("no DP")
    run = b["pair_joint"]["all_rounds"]
    assert run["eps"] == pair_joint_epsilon(1e-6, 5, 2, 1e-5) and run["delta"] == 1e-5
    assert run["delta_lower_bound"] < 1e-5
    # A partner knows z, which the pair-joint view does not: still no DP against a client.
    assert rep["threat_models"]["C"]["dp"] is False


def test_every_committed_run_is_in_the_current_layout() -> None:
    """The committed runs were rewritten once from the first layout (one ``dp`` flag) into
    today's; the first layout is no longer read anywhere."""
    root = Path(__file__).resolve().parents[2] / "docs" / "results"
    paths = sorted(root.glob("**/runs/*/summary.json"))  # the pool and kept repetitions
    if not paths:
        pytest.skip("no committed runs in this checkout")
    seen: set[str] = set()
    for path in paths:
        report = json.loads(path.read_text())["privacy"]
        assert report["version"] == REPORT_VERSION and "threat_models" in report, path
        assert "dp" not in report and "threat_model_a" not in report, path
        json.dumps(report, allow_nan=False)
        mech = report["mechanism"]
        tm = report["threat_models"]
        assert set(tm) == set(THREAT_MODELS), path
        no_dp_vs_server = ("corbin", "augcorbin", "fedavg", "cq", "signsgd", "central-gaussian")
        assert tm["B"]["dp"] is (mech not in no_dp_vs_server), path
        if mech in ("fedavg", "cq"):
            assert "delta" not in keys(report), path
        seen.add(mech)
    assert {"corbin", "ldpfl", "fedavg"} <= seen


def test_rr_two_bits_by_enumeration() -> None:
    # explicit enumeration of 2 parameters of binary RR against the binomial formula
    eps_p = 0.8
    q = math.exp(eps_p) / (1 + math.exp(eps_p))
    p1 = {1: q, 0: 1 - q}
    q1 = {1: 1 - q, 0: q}
    for eps in (0.0, 0.4, 1.2):
        total = 0.0
        for o in itertools.product((0, 1), repeat=2):
            pp = p1[o[0]] * p1[o[1]]
            qq = q1[o[0]] * q1[o[1]]
            total += max(0.0, pp - math.exp(eps) * qq)
        assert rr_delta(eps_p, 2, eps) == pytest.approx(total, abs=1e-15)
