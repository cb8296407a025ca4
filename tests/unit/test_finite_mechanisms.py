"""PBM, RQM and I-MVU: equal laws at one bit, unbiasedness, the LDP bound, bits, the cache.

Statistical checks use fixed seeds and tolerances of 5 standard deviations of the estimate
(the mechanism's own variance divided by the number of draws).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from wire_helpers import encode_solo

from corbin_fl import design_store
from corbin_fl.config import ConfigError, RunConfig
from corbin_fl.mechanisms.baselines import imvu as imvu_module
from corbin_fl.mechanisms.baselines.imvu import (
    IMVU,
    MVU_DESIGNS,
    MVUKey,
    MVUTable,
    table_epsilon,
)
from corbin_fl.mechanisms.baselines.levels import FiniteMechanism, symbol_bits
from corbin_fl.mechanisms.baselines.pbm import PBM, pbm_theta
from corbin_fl.mechanisms.baselines.rqm import RQM, rqm_epsilon, rqm_optimal_q, rqm_xmax
from corbin_fl.mechanisms.packing import pack_bits, pack_symbols, symbols_len, unpack_symbols
from corbin_fl.mechanisms.quantizers import alpha, prob_plus
from corbin_fl.registry import finite_mechanism, symbol_bits_of

EPSILONS = (0.1, 0.3, 1.0, 3.0)
"""The experiments' grid: its I-MVU tables ship with the package (no solve in the tests)."""
GRID = torch.linspace(-1.0, 1.0, 4001, dtype=torch.float64)
MVU_STORE = design_store.designs(MVU_DESIGNS)
"""The app's store of the I-MVU designs (the one ``registry``'s I-MVU entry reads)."""


def mvu_table(eps: float, bits: int) -> MVUTable:
    """The stored I-MVU design for ``(eps, bits)`` (shipped, cached or solved)."""
    return MVU_STORE.get(MVUKey(eps, bits))


@pytest.fixture(autouse=True)
def _mvu_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The I-MVU tables of this module live in one temporary cache (solved once per session)."""
    monkeypatch.setenv(design_store.CACHE_ENV, str(tmp_path_factory.getbasetemp() / "mvu-cache"))


def mechanisms_at(eps: float) -> list[FiniteMechanism]:
    """Every configuration the issue names: PBM m = 1, 2; RQM 2, 3 levels; I-MVU 1, 2, 4 bits."""
    return [
        PBM(eps, 1),
        PBM(eps, 2),
        RQM(eps, 2),
        RQM(eps, 3, 0.5),
        RQM(eps, 3, rqm_optimal_q(eps)),
        IMVU(eps, 1, mvu_table(eps, 1)),
        IMVU(eps, 2, mvu_table(eps, 2)),
        IMVU(eps, 4, mvu_table(eps, 4)),
    ]


# ---------------------------------------------------------------- one bit: one randomized response
@pytest.mark.parametrize("eps", [*EPSILONS, 8.0, 20.0])
def test_one_bit_pbm_rqm_and_ldpq_have_the_same_law(eps: float) -> None:
    """P(top | x) = 1/2 + x tanh(eps/2)/2 and levels +-alpha(eps) for all three, every x."""
    want_p = 0.5 + GRID * math.tanh(eps / 2.0) / 2.0
    a = alpha(eps)
    for mech in (PBM(eps, 1), RQM(eps, 2)):
        p = mech.probabilities(GRID)
        torch.testing.assert_close(p[:, 1], want_p, rtol=0, atol=1e-15)
        torch.testing.assert_close(p[:, 0], 1.0 - want_p, rtol=0, atol=1e-15)
        np.testing.assert_allclose(mech.levels, [-a, a], rtol=1e-14, atol=0)
        assert mech.bits == 1
    # LDPQ computes its P(+) in float32 (CorBin-FL Alg. 1 line 2): equal to float32 rounding.
    ldpq_p = prob_plus(GRID.to(torch.float32), 0.0, 1.0, eps).to(torch.float64)
    torch.testing.assert_close(ldpq_p, want_p, rtol=0, atol=2e-7)


def test_one_bit_samples_are_the_same_randomized_response() -> None:
    """Same coins, same symbols: PBM(m=1) and RQM(2) draw identically from one generator."""
    w = torch.linspace(-1.3, 1.3, 10_001)
    draws = []
    for mech in (PBM(1.0, 1), RQM(1.0, 2)):
        draws.append(mech.sample(w, 0.0, 1.0, generator=torch.Generator().manual_seed(7)))
    assert torch.equal(draws[0], draws[1])


@pytest.mark.parametrize("eps", [*EPSILONS, 8.0])
def test_one_bit_pbm_fast_cdf_is_the_general_one_bit_for_bit(eps: float) -> None:
    """PBM's ``m = 1`` inner CDF (no ``pow``) equals the general cumulative sum exactly, so its
    draws are the general path's, coin for coin, across the sampler's chunks."""
    mech = PBM(eps, 1)
    gen = torch.Generator().manual_seed(11)
    x = torch.cat([GRID, torch.rand(200_000, dtype=torch.float64, generator=gen) * 2.0 - 1.0])
    x = torch.cat([x, torch.tensor([0.0, -0.0, 1e-300, -1e-300, 1.0, -1.0], dtype=torch.float64)])
    assert torch.equal(mech.boundaries(x), FiniteMechanism.boundaries(mech, x))
    w = torch.randn(150_000, generator=gen)  # more than two chunks, some clipped
    fast = mech.sample(w, 0.1, 1.5, generator=torch.Generator().manual_seed(3))

    class General(PBM):
        def boundaries(self, x: torch.Tensor) -> torch.Tensor:
            return FiniteMechanism.boundaries(self, x)

    slow = General(eps, 1).sample(w, 0.1, 1.5, generator=torch.Generator().manual_seed(3))
    assert torch.equal(fast, slow)
    assert 0 < int(fast.sum()) < fast.numel()


# ---------------------------------------------------------------- unbiasedness and LDP
@pytest.mark.parametrize("eps", [0.3, 1.0, 3.0])
def test_every_mechanism_is_unbiased_exactly_and_in_samples(eps: float) -> None:
    x = GRID
    for mech in mechanisms_at(eps):
        p = mech.probabilities(x)
        torch.testing.assert_close(p.sum(-1), torch.ones_like(x), rtol=0, atol=1e-12)
        assert bool((p >= 0).all())
        mean = p @ torch.as_tensor(mech.levels)
        torch.testing.assert_close(mean, x, rtol=0, atol=1e-7 * float(np.abs(mech.levels).max()))
    # Samples: the mean decoded value of n draws at x is within 5 sd of x.
    n = 200_000
    gen = torch.Generator().manual_seed(11)
    for mech in mechanisms_at(eps):
        for x0 in (-1.0, -0.37, 0.0, 0.61, 1.0):
            s = mech.sample(torch.full((n,), x0), 0.0, 1.0, generator=gen)
            est = float(mech.decode(s, 0.0, 1.0).mean())
            sd = math.sqrt(float(mech.variance(torch.tensor([x0], dtype=torch.float64))) / n)
            assert abs(est - x0) <= 5 * sd, (mech, x0, est, sd)


@pytest.mark.parametrize("eps", EPSILONS)
def test_likelihood_ratio_of_every_output_is_at_most_e_eps(eps: float) -> None:
    """Over a dense grid (with every interpolation point), max_x P(k|x) / min_x P(k|x) <= e^eps,
    and the mechanism's exact epsilon is eps (I-MVU: at most eps, within 1e-4 of it)."""
    x = torch.cat([GRID, torch.linspace(-1, 1, 8, dtype=torch.float64)])
    for mech in mechanisms_at(eps):
        p = mech.probabilities(x)
        hi, lo = p.max(dim=0).values, p.min(dim=0).values
        used = hi > 0
        ratio = float((hi[used] / lo[used]).max())
        assert bool((lo[used] > 0).all())
        assert math.log(ratio) <= eps * (1 + 1e-9), mech
        exact = mech.epsilon()
        assert exact <= eps * (1 + 1e-9)
        if isinstance(mech, IMVU):
            assert exact >= eps * (1 - 1e-4), mech
        else:
            assert exact == pytest.approx(eps, rel=1e-9), mech
        assert math.log(ratio) <= exact * (1 + 1e-9)


def test_sampled_symbol_frequencies_follow_the_law() -> None:
    """Each symbol's frequency at a few inputs is within 5 binomial sd of P(k | x)."""
    n = 100_000
    gen = torch.Generator().manual_seed(3)
    for mech in mechanisms_at(1.0):
        for x0 in (-0.8, 0.1, 0.95):
            s = mech.sample(torch.full((n,), x0), 0.0, 1.0, generator=gen).to(torch.int64)
            freq = torch.bincount(s, minlength=mech.num_levels).to(torch.float64) / n
            p = mech.probabilities(torch.tensor([x0], dtype=torch.float64))[0]
            sd = torch.sqrt(p * (1 - p) / n)
            assert bool(((freq - p).abs() <= 5 * sd + 1e-12).all()), (mech, x0, freq, p)


# ---------------------------------------------------------------- each mechanism's own facts
@pytest.mark.parametrize("eps", EPSILONS)
@pytest.mark.parametrize("trials", [1, 2, 3, 7])
def test_pbm_theta_calibration_and_variance(eps: float, trials: int) -> None:
    mech = PBM(eps, trials)
    assert mech.theta == pytest.approx(math.tanh(eps / (2 * trials)) / 2, rel=1e-15)
    assert pbm_theta(eps, trials) == mech.theta
    x = torch.linspace(-1, 1, 11, dtype=torch.float64)
    want = (0.25 - mech.theta**2 * x**2) / (trials * mech.theta**2)  # Chen et al., Var[x_hat]
    torch.testing.assert_close(mech.variance(x), want, rtol=1e-10, atol=0)
    assert mech.bits == symbol_bits(trials + 1)


@pytest.mark.parametrize("eps", EPSILONS)
@pytest.mark.parametrize("q", [0.0, 0.2, 0.5, 0.9])
def test_rqm_epsilon_is_the_grid_maximum_and_xmax_solves_it(eps: float, q: float) -> None:
    x_max = rqm_xmax(eps, q)
    assert rqm_epsilon(x_max, q) == pytest.approx(eps, rel=1e-12)
    mech = RQM(eps, 3, q)
    p = mech.probabilities(GRID)
    used = p.max(dim=0).values > 0
    brute = math.log(float((p.max(dim=0).values[used] / p.min(dim=0).values[used]).max()))
    assert brute == pytest.approx(eps, rel=1e-9)
    x = torch.linspace(-1, 1, 21, dtype=torch.float64)
    want = q * x_max * x.abs() + (1 - q) * x_max**2 - x**2
    torch.testing.assert_close(mech.variance(x), want, rtol=1e-10, atol=1e-12)


def test_rqm_optimal_q_minimises_the_worst_case_variance() -> None:
    """Small eps: dropping the middle level is best (q = 0); at eps = 3 keeping it helps."""
    assert rqm_optimal_q(0.1) == 0.0
    q3 = rqm_optimal_q(3.0)
    assert 0.3 < q3 < 0.9

    def worst(q: float) -> float:
        return float(RQM(3.0, 3, q).variance(GRID).max())

    for other in (0.0, q3 - 0.05, q3 + 0.05):
        assert worst(q3) <= worst(other) + 1e-9
    assert worst(q3) < worst(0.0)


def test_imvu_one_bit_design_is_randomized_response() -> None:
    """With one bit the MVU design is binary RR at eps: outputs +-alpha(eps)."""
    for eps in (0.3, 1.0, 3.0):
        table = mvu_table(eps, 1)
        np.testing.assert_allclose(np.sort(table.values), [-alpha(eps), alpha(eps)], rtol=1e-4)


def test_imvu_more_bits_never_raise_the_variance() -> None:
    """The 2- and 4-bit designs are never worse than the design with fewer bits (exactly: the
    solver keeps the lower-bit design as a candidate), and much better at eps = 3."""
    for eps in EPSILONS:
        v = [mvu_table(eps, b).mean_variance for b in (1, 2, 4)]
        assert v[1] <= v[0] and v[2] <= v[1], v
    assert mvu_table(3.0, 4).mean_variance < 0.4 * mvu_table(3.0, 1).mean_variance


def test_shipped_tables_are_what_the_solver_gives() -> None:
    """The shipped designs pass the check, and a re-solve reproduces one (deterministic)."""
    files = sorted(MVU_STORE.shipped.glob("*.json"))
    assert len(files) == len(EPSILONS) * len(imvu_module.IMVU_BITS)
    assert {f.name for f in files} == {  # found under the names the store looks up
        MVU_DESIGNS.file_name(MVUKey(eps, bits))
        for eps in EPSILONS
        for bits in imvu_module.IMVU_BITS
    }
    for eps in EPSILONS:
        for bits in imvu_module.IMVU_BITS:
            mvu_table(eps, bits).check()
    again = imvu_module.solve_mvu(1.0, 2, lower=mvu_table(1.0, 1))  # as the bench solves it
    np.testing.assert_allclose(again.transition, mvu_table(1.0, 2).transition, atol=1e-9)
    np.testing.assert_allclose(again.values, mvu_table(1.0, 2).values, rtol=1e-12)


def test_imvu_table_cache_round_trip_and_tampering(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(design_store.CACHE_ENV, str(tmp_path))
    MVU_STORE.cache_clear()
    eps = 0.7  # not shipped: solved (1 bit: seconds; more bits also cache the lower designs)
    try:
        first = mvu_table(eps, 1)
        files = list((tmp_path / "imvu").glob("*.json"))
        assert len(files) == 1
        doc = json.loads(files[0].read_text())
        assert (doc["eps"], doc["bits"], doc["inputs"]) == (eps, 1, imvu_module.INPUT_POINTS)
        MVU_STORE.cache_clear()
        again = mvu_table(eps, 1)  # from the file
        np.testing.assert_array_equal(again.transition, first.transition)
        # A tampered table (one entry scaled by 10, its row re-summed to 1) is refused and
        # solved again.
        doc["transition"][0][0] *= 10.0
        row = doc["transition"][0]
        row[1] = 1.0 - row[0] - sum(row[2:])
        files[0].write_text(json.dumps(doc))
        MVU_STORE.cache_clear()
        fixed = mvu_table(eps, 1)
        np.testing.assert_allclose(fixed.transition, first.transition, atol=1e-12)
        assert table_epsilon(fixed.transition) <= eps
    finally:
        MVU_STORE.cache_clear()


def test_mvu_table_check_rejects_weaker_privacy_and_bias() -> None:
    good = mvu_table(1.0, 1)
    p = good.transition.copy()
    p[0] = [0.999, 0.001] if good.values[0] < 0 else [0.001, 0.999]
    with pytest.raises(ValueError, match=r"LDP|biased"):
        MVUTable(1.0, 1, good.inputs, p, good.values, good.mean_variance).check()
    with pytest.raises(ValueError, match="biased"):
        MVUTable(1.0, 1, good.inputs, good.transition, good.values * 1.1, 0.0).check()
    with pytest.raises(ValueError, match="another eps"):
        IMVU(2.0, 1, table=good)


# ---------------------------------------------------------------- wire: packed b-bit symbols
@pytest.mark.parametrize("bits", [1, 2, 4, 8])
@pytest.mark.parametrize("m", [0, 1, 3, 7, 8, 9, 1001])
def test_symbols_pack_round_trip(bits: int, m: int) -> None:
    sym = np.random.default_rng(m + bits).integers(0, 1 << bits, m).astype(np.uint8)
    packed = pack_symbols(sym, bits)
    assert packed.dtype == np.uint8 and packed.size == symbols_len(m, bits) == -(-m * bits // 8)
    np.testing.assert_array_equal(unpack_symbols(packed, m, bits), sym)
    if bits == 1:
        np.testing.assert_array_equal(packed, pack_bits(torch.from_numpy(sym == 1)))


def test_unpack_symbols_rejects_bad_packing() -> None:
    packed = pack_symbols(np.array([1, 2, 3], dtype=np.uint8), 2)  # 6 bits: 2 padding bits
    with pytest.raises(ValueError, match="padding"):
        unpack_symbols(packed | np.uint8(1), 3, 2)
    with pytest.raises(ValueError, match="expected 1 bytes"):
        unpack_symbols(np.zeros(2, np.uint8), 3, 2)
    with pytest.raises(ValueError, match="bits per symbol"):
        pack_symbols(np.zeros(3, np.uint8), 3)
    with pytest.raises(ValueError, match=r"in \[0, 4\)"):
        pack_symbols(np.array([4], dtype=np.uint8), 2)


@pytest.mark.parametrize(
    ("params", "bits"),
    [
        ({"mechanism": "pbm", "pbm_trials": 1}, 1),
        ({"mechanism": "pbm", "pbm_trials": 2}, 2),
        ({"mechanism": "rqm", "rqm_levels": 2}, 1),
        ({"mechanism": "rqm", "rqm_levels": 3}, 2),
        ({"mechanism": "imvu", "imvu_bits": 1}, 1),
        ({"mechanism": "imvu", "imvu_bits": 2}, 2),
        ({"mechanism": "imvu", "imvu_bits": 4}, 4),
    ],
)
def test_the_uplink_is_the_stated_bits_per_coordinate(params: dict[str, object], bits: int) -> None:
    """The client encoder's update is ceil(m b / 8) bytes and the server decodes it unbiasedly."""
    from corbin_fl.server.aggregation import make_aggregator

    cfg = RunConfig().replace(epsilon=1.0, range_mode="layer", **params)
    assert symbol_bits_of(cfg) == bits == finite_mechanism(cfg).bits
    m, n = 4001, 64
    w = torch.linspace(-0.9, 0.9, m)
    c, r = torch.zeros(m), torch.ones(m)
    agg = make_aggregator(cfg, torch.zeros(m), c, r)
    from flwr.app import ArrayRecord

    from corbin_fl import wire

    for i in range(n):
        key, array, _ = encode_solo(cfg, i + 1, w, c, r)
        assert array.dtype == np.uint8 and array.size == -(-m * bits // 8)
        agg.add(ArrayRecord({key: wire.to_array(array)}))
    est = agg.estimate()
    assert est is not None
    mech = finite_mechanism(cfg)
    sd = torch.sqrt(mech.variance(w.to(torch.float64)) / n)
    # Mean over all coordinates of the standardised error: N(0, 1/m) when unbiased.
    z = ((est.to(torch.float64) - w.to(torch.float64)) / sd).mean()
    assert abs(float(z)) <= 5 / math.sqrt(m)


# ---------------------------------------------------------------- signsgd (no privacy)
def test_signsgd_bits_and_fair_coin_for_zeros() -> None:
    from corbin_fl.mechanisms.baselines.signsgd import majority_vote, sign_bits

    d = torch.tensor([-2.0, -1e-30, 3.0, 1e-30])
    assert sign_bits(d).tolist() == [False, False, True, True]
    n = 100_000
    coins = sign_bits(torch.zeros(n), generator=torch.Generator().manual_seed(1))
    assert abs(float(coins.double().mean()) - 0.5) <= 5 * math.sqrt(0.25 / n)
    assert majority_vote(torch.tensor([0, 1, 2, 3]), 3).tolist() == [-1.0, -1.0, 1.0, 1.0]
    assert majority_vote(torch.tensor([2]), 4).tolist() == [0.0]  # a tie moves nothing
    with pytest.raises(ValueError, match="at least one voter"):
        majority_vote(torch.tensor([0]), 0)


def test_signsgd_through_encoder_and_aggregator_moves_by_r_in_the_voted_direction() -> None:
    from flwr.app import ArrayRecord

    from corbin_fl import wire
    from corbin_fl.server.aggregation import make_aggregator

    cfg = RunConfig(mechanism="signsgd", range_mode="update")
    m = 6
    # Three voters; coordinates: all +, all -, 2 of 3 +, 1 of 3 +, +/-/0 mix, all 0 (coins).
    updates = torch.tensor(
        [
            [1.0, -1.0, 1.0, -1.0, 1.0, 0.0],
            [2.0, -2.0, 1.0, 1.0, -1.0, 0.0],
            [3.0, -3.0, -1.0, -1.0, 0.0, 0.0],
        ]
    )
    c, r = torch.zeros(m), torch.full((m,), 0.25)
    agg = make_aggregator(cfg, torch.zeros(m), c, r)
    for i, u in enumerate(updates):
        key, array, _ = encode_solo(cfg, i + 1, u, c, r)
        assert key == wire.BITS and array.size == 1
        agg.add(ArrayRecord({key: wire.to_array(array)}))
    est = agg.estimate()
    assert est is not None
    assert est[:4].tolist() == [0.25, -0.25, 0.25, -0.25]
    assert abs(float(est[4])) == 0.25 and abs(float(est[5])) == 0.25  # odd n: never a tie
    with pytest.raises(ConfigError, match="range-mode"):
        RunConfig.from_flower({"mechanism": "signsgd", "range-mode": "layer"})


# ---------------------------------------------------------- central Gaussian (trusts the server)
def test_central_noise_multiplier_is_exact_against_dp_accounting() -> None:
    """z from the analytic calibration gives exactly eps after T rounds (dp-accounting's PLD)."""
    import dp_accounting
    from dp_accounting.pld import PLDAccountant

    from corbin_fl.mechanisms.baselines.central_gaussian import (
        central_epsilon,
        central_noise_multiplier,
    )

    for eps, rounds in ((1.0, 10), (3.0, 50), (0.5, 1)):
        z = central_noise_multiplier(eps, 1e-5, rounds)
        assert central_epsilon(z, 1e-5, rounds) == pytest.approx(eps, rel=1e-9)
        acc = PLDAccountant()
        acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), rounds))
        assert acc.get_epsilon(1e-5) == pytest.approx(eps, rel=1e-3)
        # A smaller z is weaker: the calibration is the smallest that reaches eps.
        assert central_epsilon(0.99 * z, 1e-5, rounds) > eps


def test_central_gaussian_clips_rejects_and_adds_noise_of_the_calibrated_scale() -> None:
    from flwr.app import ArrayRecord

    from corbin_fl import wire
    from corbin_fl.mechanisms.baselines.central_gaussian import central_noise_multiplier, clip_l2
    from corbin_fl.server.aggregation import make_aggregator

    d = torch.tensor([3.0, 4.0])
    torch.testing.assert_close(clip_l2(d, 1.0), torch.tensor([0.6, 0.8]))
    torch.testing.assert_close(clip_l2(d, 10.0), d)
    cfg = RunConfig().replace(
        mechanism="central-gaussian", epsilon=2.0, num_rounds=4, central_clip=0.5
    )
    m, cohort = 20_000, 4
    agg = make_aggregator(cfg, torch.zeros(m), torch.zeros(m), torch.ones(m), cohort=cohort)
    agg.noise_generator = torch.Generator().manual_seed(5)
    update = clip_l2(torch.ones(m), 0.5).numpy().astype(np.float32)
    for _ in range(3):  # one of the cohort of 4 did not answer
        agg.add(ArrayRecord({wire.VALUES: wire.to_array(update)}))
    with pytest.raises(wire.WireError, match="L2 norm"):
        agg.add(ArrayRecord({wire.VALUES: wire.to_array(2 * update)}))
    est = agg.estimate()
    assert est is not None
    noise = est.to(torch.float64) * cohort - 3 * torch.from_numpy(update).to(torch.float64)
    sigma = central_noise_multiplier(2.0, cfg.delta, 4) * 0.5
    # The sample sd of m normals is within 5 of its own sd (sigma / sqrt(2m)) of sigma.
    assert abs(float(noise.std()) - sigma) <= 5 * sigma / math.sqrt(2 * m)
    assert abs(float(noise.mean())) <= 5 * sigma / math.sqrt(m)


def test_central_gaussian_report_trusts_the_server() -> None:
    from corbin_fl.mechanisms.report import privacy_report

    rep = privacy_report("central-gaussian", 2.0, 1e-5, 1000, 3, planned_rounds=4)
    tm = rep["threat_models"]
    assert [tm[k]["dp"] for k in "ABCD"] == [False, False, True, False]
    assert "trusts the server" in tm["C"]["guarantee"]
    # 3 of the 4 planned rounds ran: less than the target epsilon.
    assert tm["C"]["all_rounds"]["eps"] < 2.0
    full = privacy_report("central-gaussian", 2.0, 1e-5, 1000, 4, planned_rounds=4)
    assert full["threat_models"]["C"]["all_rounds"]["eps"] == pytest.approx(2.0, rel=1e-9)


def test_levels_aggregator_rejects_symbols_outside_the_levels_and_set_padding() -> None:
    from flwr.app import ArrayRecord

    from corbin_fl import wire
    from corbin_fl.server.aggregation import make_aggregator

    m = 5  # 3-level RQM: 2 bits per symbol, 10 bits, 2 bytes with 6 padding bits
    cfg = RunConfig().replace(mechanism="rqm", rqm_levels=3, epsilon=1.0)
    agg = make_aggregator(cfg, torch.zeros(m), torch.zeros(m), torch.ones(m))
    good = pack_symbols(np.array([0, 1, 2, 2, 0], dtype=np.uint8), 2)
    agg.add(ArrayRecord({wire.BITS: wire.to_array(good)}))
    with pytest.raises(wire.WireError, match=r"outside \[0, 3\)"):
        bad = pack_symbols(np.array([0, 1, 3, 2, 0], dtype=np.uint8), 2)
        agg.add(ArrayRecord({wire.BITS: wire.to_array(bad)}))
    with pytest.raises(wire.WireError, match="padding"):
        agg.add(ArrayRecord({wire.BITS: wire.to_array(good | np.uint8(1))}))
    with pytest.raises(wire.WireError):
        agg.add(ArrayRecord({wire.BITS: wire.to_array(np.zeros(3, np.uint8))}))
    assert agg.n == 1
    est = agg.estimate()
    x_max = RQM(1.0, 3, rqm_optimal_q(1.0)).xmax
    assert est is not None
    torch.testing.assert_close(
        est, torch.tensor([-x_max, 0.0, x_max, x_max, -x_max], dtype=torch.float32)
    )
