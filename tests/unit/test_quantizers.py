"""Tests of mechanisms.quantizers: LDPQ (Alg. 1), CorBinQ (Alg. 2), CoQ-FL biased codebook.

Statistical checks use fixed seeds and a tolerance of 5 standard errors derived from the
binomial variance of the estimate (per grid point).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from corbin_fl.mechanisms import alpha, corbinq, decode, ldpq, prob_plus, validate
from corbin_fl.mechanisms import quantizers as qz

torch.set_num_threads(1)

EPSILONS = (0.5, 1.0, 5.0)
CENTERS_RADII = ((0.0, 1.0), (0.3, 0.05), (-2.0, 3.0))
# Positions of w in units of r around c: beyond both ends (clipped), both endpoints, inside.
W_UNITS = (-1.7, -1.0, -0.7, -0.25, 0.0, 0.1, 0.5, 0.99, 1.0, 1.3)
D_VALUES = (1, 2, 3, 5, 8, 12, 16)


def q_ref(w: float, c: float, r: float, eps: float) -> float:
    """Float64 reference of the LDPQ marginal after clipping (Alg. 1 line 2)."""
    a = (math.exp(eps) + 1.0) / (math.exp(eps) - 1.0)
    wc = min(max(w, c - r), c + r)
    return 0.5 + (wc - c) / (2.0 * r * a)


def f32(x: float) -> float:
    """Round to the nearest float32 (the grid is built from float32-exact values)."""
    return float(np.float32(x))


def grid() -> list[tuple[float, float, float, float]]:
    return [
        (f32(c + u * r), f32(c), f32(r), eps)
        for eps in EPSILONS
        for c, r in CENTERS_RADII
        for u in W_UNITS
    ]


def replicated(points: list[tuple[float, ...]], reps: int) -> tuple[torch.Tensor, ...]:
    """Per-element tensors (w, c, r) with every grid point repeated ``reps`` times."""
    cols = list(zip(*points, strict=True))
    return tuple(torch.tensor(col, dtype=torch.float32).repeat_interleave(reps) for col in cols[:3])


# ----------------------------------------------------------------------------------- alpha/q
def test_alpha_matches_closed_form() -> None:
    for eps in (1e-6, 0.01, 0.5, 1.0, 5.0, 30.0):
        expected = (math.exp(eps) + 1.0) / (math.exp(eps) - 1.0)
        assert alpha(eps) == pytest.approx(expected, rel=1e-9)
    assert alpha(800.0) == 1.0  # no overflow for huge eps
    t = torch.tensor([0.1, 1.0, 4.0], dtype=torch.float64)
    ref = (torch.exp(t) + 1) / (torch.exp(t) - 1)
    got = alpha(t)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float64
    assert bool(torch.allclose(got, ref, rtol=1e-12, atol=0.0))


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan])
def test_alpha_rejects_bad_eps(bad: float) -> None:
    with pytest.raises(ValueError, match="eps"):
        alpha(bad)
    with pytest.raises(ValueError, match="eps"):
        alpha(torch.tensor([1.0, bad]))


def test_alpha_rejects_wrong_types() -> None:
    with pytest.raises(TypeError):
        alpha(True)
    with pytest.raises(TypeError):
        alpha("1.0")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        alpha(torch.tensor([1, 2]))


def test_prob_plus_matches_reference_and_clips() -> None:
    pts = grid()
    w, c, r = replicated(pts, 1)
    for eps in EPSILONS:
        sel = torch.tensor([p[3] == eps for p in pts])
        q = prob_plus(w[sel], c[sel], r[sel], eps)
        ref = torch.tensor([q_ref(*p) for p in pts if p[3] == eps], dtype=torch.float64)
        assert float((q.double() - ref).abs().max()) <= 3e-7
    # scalar operands give a 0-d tensor; clipping maps everything beyond the ends to the ends
    assert prob_plus(5.0, 0.0, 1.0, 1.0).shape == ()
    assert prob_plus(5.0, 0.0, 1.0, 1.0).item() == prob_plus(1.0, 0.0, 1.0, 1.0).item()
    assert prob_plus(-5.0, 0.0, 1.0, 1.0).item() == prob_plus(-1.0, 0.0, 1.0, 1.0).item()


@pytest.mark.parametrize("eps", [0.1, 1.0, 3.0, 8.0])
def test_pldp_ratio_of_marginals_closed_form(eps: float) -> None:
    """max_w q / min_w q = e^eps (eq. 3), for both outputs, attained at the range ends.

    Closed form in float64; the float32 ``prob_plus`` satisfies it up to its documented
    absolute rounding error ``2^-23`` (relative ``2^-23 / q_min`` on each end).
    """
    w = np.linspace(-1.5, 1.5, 2001)
    q = np.array([q_ref(float(v), 0.0, 1.0, eps) for v in w])
    for p in (q, 1.0 - q):
        assert p.max() / p.min() <= math.exp(eps) * (1 + 1e-12)
        assert p.max() / p.min() == pytest.approx(math.exp(eps), rel=1e-9)
    q32 = prob_plus(torch.from_numpy(w).float(), 0.0, 1.0, eps).double()
    slack = 2 * 2.0**-23 / float(q32.min())
    assert float((q32 - torch.from_numpy(q)).abs().max()) <= 2.0**-23
    for p32 in (q32, 1.0 - q32):
        assert float(p32.max() / p32.min()) <= math.exp(eps) * (1 + slack)


# ----------------------------------------------------------------------------------- marginals
def _check_marginals(bits: torch.Tensor, q: list[float], reps: int) -> None:
    emp = bits.view(len(q), reps).double().mean(dim=1)
    qt = torch.tensor(q, dtype=torch.float64)
    se = torch.sqrt(qt * (1 - qt) / reps)
    z = (emp - qt).abs() / se.clamp_min(1e-12)
    worst = int(torch.argmax(z))
    assert bool((z <= 5.0).all()), f"grid point {worst}: emp {emp[worst]:.5f} vs q {q[worst]:.5f}"


@pytest.mark.parametrize("d", D_VALUES)
def test_corbinq_marginals_match_ldpq(d: int) -> None:
    """Both roles with random z: P(U=+1) = q within 5 SE at every grid point (Theorem 1)."""
    reps = 6000
    pts = grid()
    w, c, r = replicated(pts, reps)
    gen = torch.Generator().manual_seed(1000 + d)
    for eps in EPSILONS:
        sel = torch.tensor([p[3] == eps for p in pts]).repeat_interleave(reps)
        q = [q_ref(*p) for p in pts if p[3] == eps]
        z = torch.randint(0, 2**d, (int(sel.sum()),), generator=gen, dtype=torch.int32)
        for lead in (True, False):
            bits = corbinq(w[sel], c[sel], r[sel], eps, z, d, lead=lead, generator=gen)
            assert bits.dtype == torch.bool and bits.shape == z.shape
            _check_marginals(bits, q, reps)


def test_ldpq_marginals() -> None:
    reps = 6000
    pts = grid()
    w, c, r = replicated(pts, reps)
    gen = torch.Generator().manual_seed(7)
    for eps in EPSILONS:
        sel = torch.tensor([p[3] == eps for p in pts]).repeat_interleave(reps)
        bits = ldpq(w[sel], c[sel], r[sel], eps, generator=gen)
        _check_marginals(bits, [q_ref(*p) for p in pts if p[3] == eps], reps)


@pytest.mark.parametrize("d", [1, 2, 3, 5, 8])
def test_corbinq_threshold_structure_and_tie_coin(d: int) -> None:
    """Enumerating every codeword: Alg. 2 lines 4-7 / 12-15 hold exactly, ties are Bernoulli.

    Lead: z < T1 -> +1, z > T1 -> -1; follow: z < T2 -> -1, z > T2 -> +1, with
    T1 = floor(2^d q), T2 = floor(2^d (1 - q)). At the tie the frequency of the local coin's
    outcome matches the fractional part within 5 SE, so the marginal is q up to that SE only.
    """
    reps = 3000 if d <= 5 else 1000
    K = 2**d
    gen = torch.Generator().manual_seed(d)
    wv = torch.tensor([-1.0, -0.61, -0.2, 0.0, 0.013, 0.4, 0.77, 1.0])
    for eps in (0.7, 2.0):
        for lead in (True, False):
            w = wv.repeat_interleave(K * reps)
            z = torch.arange(K, dtype=torch.int32).repeat_interleave(reps).repeat(len(wv))
            bits = corbinq(w, 0.0, 1.0, eps, z, d, lead=lead, generator=gen)
            freq = bits.view(len(wv), K, reps).double().mean(dim=2)
            # the role's own probability, as the quantizer evaluates it (c = 0: -w is exact)
            own = prob_plus(wv if lead else -wv, 0.0, 1.0, eps).double()
            s = own * K
            T = torch.floor(s)
            frac = s - T
            for i in range(len(wv)):
                ti = int(T[i])
                f_plus = freq[i] if lead else 1.0 - freq[i]  # the role's "own" output
                assert bool((f_plus[:ti] == 1.0).all())
                assert bool((f_plus[ti + 1 :] == 0.0).all())
                if ti < K:
                    fi = float(frac[i])
                    se = math.sqrt(fi * (1 - fi) / reps)
                    assert abs(float(f_plus[ti]) - fi) <= 5 * se + 1e-12
                q_emp = float(freq[i].mean())
                q_true = q_ref(float(wv[i]), 0.0, 1.0, eps)
                se_q = math.sqrt(float(frac[i]) * (1 - float(frac[i])) / reps) / K
                assert abs(q_emp - q_true) <= 5 * se_q + 1e-6


def test_corbinq_exact_endpoints_q0_q1() -> None:
    """q = 1 (T = 2^d) and q = 0 (T = 0) are handled exactly for both roles."""
    eps = 60.0  # alpha rounds to 1.0: q is exactly 0 or 1 at the ends
    assert alpha(eps) == 1.0
    d = 4
    z = torch.arange(16, dtype=torch.int32).repeat(50)
    gen = torch.Generator().manual_seed(3)
    top = torch.full_like(z, 1.0, dtype=torch.float32)
    for lead in (True, False):
        assert bool(corbinq(top, 0.0, 1.0, eps, z, d, lead=lead, generator=gen).all())
        assert not bool(corbinq(-top, 0.0, 1.0, eps, z, d, lead=lead, generator=gen).any())
    assert bool(ldpq(top, 0.0, 1.0, eps, generator=gen).all())
    assert not bool(ldpq(-top, 0.0, 1.0, eps, generator=gen).any())


def test_unbiased_decode() -> None:
    """E[decode(corbinq)] = E[decode(ldpq)] = clip(w) within 5 SE (conditions C1, C4)."""
    reps = 20000
    pts = [p for p in grid() if p[3] == 1.0]
    w, c, r = replicated(pts, reps)
    gen = torch.Generator().manual_seed(11)
    a = alpha(1.0)
    z = torch.randint(0, 32, w.shape, generator=gen, dtype=torch.int32)
    outs = {
        "lead": corbinq(w, c, r, 1.0, z, 5, lead=True, generator=gen),
        "follow": corbinq(w, c, r, 1.0, z, 5, lead=False, generator=gen),
        "ldpq": ldpq(w, c, r, 1.0, generator=gen),
    }
    for name, bits in outs.items():
        vals = decode(bits, c, r, 1.0).double().view(len(pts), reps)
        for i, (wi, ci, ri, _) in enumerate(pts):
            target = min(max(wi, ci - ri), ci + ri)
            var = (ri * a) ** 2 - (target - ci) ** 2
            se = math.sqrt(var / reps)
            assert abs(float(vals[i].mean()) - target) <= 5 * se, (name, i)


# ----------------------------------------------------------------------------------- joint law
def test_same_z_pair_is_negatively_correlated_and_beats_ldpq() -> None:
    """Lead and follow with the same z: Cov < 0 and pair MSE below the LDPQ pair MSE."""
    reps = 40000
    eps, c, r, d = 1.0, 0.0, 0.5, 5
    a = alpha(eps)
    gen = torch.Generator().manual_seed(21)
    for w1, w2 in ((0.0, 0.0), (0.3, -0.1), (-0.45, -0.2), (0.5, 0.5), (0.2, 0.35)):
        z = torch.randint(0, 2**d, (reps,), generator=gen, dtype=torch.int32)
        u1 = corbinq(torch.full((reps,), w1), c, r, eps, z, d, lead=True, generator=gen)
        u2 = corbinq(torch.full((reps,), w2), c, r, eps, z, d, lead=False, generator=gen)
        v1, v2 = decode(u1, c, r, eps).double(), decode(u2, c, r, eps).double()
        cov = float(((v1 - v1.mean()) * (v2 - v2.mean())).mean())
        sq = (v1 + v2 - w1 - w2) ** 2
        mse, se_mse = float(sq.mean()), float(sq.std() / math.sqrt(reps))
        ldpq_mse = 2 * (r * a) ** 2 - (w1 - c) ** 2 - (w2 - c) ** 2  # independent: Var1 + Var2
        se_cov = float(((v1 - v1.mean()) * (v2 - v2.mean())).std() / math.sqrt(reps))
        assert cov < -5 * se_cov, (w1, w2, cov)
        assert mse + 5 * se_mse < ldpq_mse, (w1, w2, mse, ldpq_mse)
    # q1 = q2 = 1/2 with d >= 1: perfectly anti-correlated, the pair sum is exactly 2c.
    z = torch.randint(0, 2**d, (1000,), generator=gen, dtype=torch.int32)
    zero = torch.zeros(1000)
    u1 = corbinq(zero, c, r, eps, z, d, lead=True, generator=gen)
    u2 = corbinq(zero, c, r, eps, z, d, lead=False, generator=gen)
    assert bool((u1 != u2).all())


def test_ldpq_pair_is_independent() -> None:
    reps = 40000
    gen = torch.Generator().manual_seed(5)
    w = torch.full((reps,), 0.1)
    u1 = ldpq(w, 0.0, 1.0, 1.0, generator=gen).double()
    u2 = ldpq(w, 0.0, 1.0, 1.0, generator=gen).double()
    cov = float(((u1 - u1.mean()) * (u2 - u2.mean())).mean())
    assert abs(cov) <= 5 * 0.25 / math.sqrt(reps)


# ----------------------------------------------------------------------------------- biased
def _codebook(d: int, px: float) -> np.ndarray:
    ones = np.array([bin(k).count("1") for k in range(2**d)])
    return px**ones * (1 - px) ** (d - ones)


def _biased_z(n: int, d: int, px: float, seed: int) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    bits = rng.random((n, d)) < px  # column 0 is the MSB
    weights = 1 << np.arange(d - 1, -1, -1)
    return torch.from_numpy((bits * weights).sum(axis=1).astype(np.int32))


@pytest.mark.parametrize(("d", "px"), [(1, 0.2), (3, 0.7), (5, 0.3), (8, 0.1), (12, 0.6)])
def test_biased_codebook_marginals(d: int, px: float) -> None:
    reps = 5000
    pts = [p for p in grid() if p[3] in (0.5, 5.0) and p[1] != f32(-2.0)]
    w, c, r = replicated(pts, reps)
    gen = torch.Generator().manual_seed(d)
    z = _biased_z(w.numel(), d, px, seed=d)
    for eps in (0.5, 5.0):
        sel = torch.tensor([p[3] == eps for p in pts]).repeat_interleave(reps)
        q = [q_ref(*p) for p in pts if p[3] == eps]
        for lead in (True, False):
            bits = corbinq(w[sel], c[sel], r[sel], eps, z[sel], d, lead=lead, generator=gen, p_x=px)
            _check_marginals(bits, q, reps)


@pytest.mark.parametrize(("d", "px"), [(1, 0.2), (2, 0.7), (3, 0.25), (4, 0.9)])
def test_biased_codebook_threshold_structure(d: int, px: float) -> None:
    """Every codeword enumerated: F(z+1) <= q -> +1, F(z) >= q -> -1, straddling -> coin.

    The exact marginal sum_z P(z) f_z then equals q within 5 SE of the one tie codeword.
    """
    reps = 3000
    K = 2**d
    pz = _codebook(d, px)
    F = np.concatenate([[0.0], np.cumsum(pz)])
    gen = torch.Generator().manual_seed(40 + d)
    wv = torch.tensor([-1.0, -0.5, -0.05, 0.0, 0.3, 0.9, 1.0])
    eps = 1.0
    for lead in (True, False):
        w = wv.repeat_interleave(K * reps)
        z = torch.arange(K, dtype=torch.int32).repeat_interleave(reps).repeat(len(wv))
        bits = corbinq(w, 0.0, 1.0, eps, z, d, lead=lead, generator=gen, p_x=px)
        freq = bits.view(len(wv), K, reps).double().mean(dim=2).numpy()
        for i in range(len(wv)):
            qi = q_ref(float(wv[i]), 0.0, 1.0, eps)
            own = qi if lead else 1.0 - qi
            f_own = freq[i] if lead else 1.0 - freq[i]
            for k in range(K):
                if F[k + 1] <= own - 1e-6:
                    assert f_own[k] == 1.0, (i, k)
                elif own + 1e-6 <= F[k]:
                    assert f_own[k] == 0.0, (i, k)
                else:
                    p = (own - F[k]) / pz[k]
                    assert abs(f_own[k] - p) <= 5 * math.sqrt(p * (1 - p) / reps) + 1e-5
            est = float((pz * freq[i]).sum())
            se = math.sqrt(float((pz**2 * freq[i] * (1 - freq[i])).sum()) / reps)
            assert abs(est - qi) <= 5 * se + 1e-5


@pytest.mark.parametrize("d", [1, 3, 5, 8, 12, 16])
def test_biased_rule_at_half_is_bit_identical_to_uniform(d: int) -> None:
    """p_x = 1/2 through the bit-by-bit codebook rule == the uniform rule, coins included."""
    gen = torch.Generator().manual_seed(d)
    m = 100_000
    w = torch.rand(m, generator=gen) * 2.6 - 1.3
    w[:1000] = 1.0  # q = max and exact grid points
    w[1000:2000] = -1.0
    w[2000:3000] = 0.0
    z = torch.randint(0, 2**d, (m,), generator=gen, dtype=torch.int32)
    for c, r, eps in ((0.0, 1.0, 1.0), (0.25, 0.4, 0.3), (0.0, 1.0, 60.0)):
        for role in ("lead", "follow"):
            flat = qz._prepare(w, c, r, z)
            uni = qz._run(flat, eps, d, role, torch.Generator().manual_seed(9), 0.5, biased=False)
            bia = qz._run(flat, eps, d, role, torch.Generator().manual_seed(9), 0.5, biased=True)
            assert torch.equal(uni, bia), (d, c, r, eps, role, int((uni != bia).sum()))


# ----------------------------------------------------------------------------------- API
def test_shapes_broadcasting_and_per_layer_params() -> None:
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(4, 1000, generator=gen) * 0.1
    c = torch.tensor([[0.0], [0.1], [-0.1], [0.05]])
    r = torch.tensor([[0.2], [0.3], [0.1], [0.25]])
    z = torch.randint(0, 8, (4, 1000), generator=gen, dtype=torch.int16)
    per_layer = corbinq(w, c, r, 1.0, z, 3, generator=torch.Generator().manual_seed(1))
    per_elem = corbinq(
        w, c.expand(4, 1000), r.expand(4, 1000), 1.0, z, 3,
        generator=torch.Generator().manual_seed(1),
    )  # fmt: skip
    assert per_layer.shape == (4, 1000)
    assert torch.equal(per_layer, per_elem)
    ld = ldpq(w, c, r, 1.0, generator=gen)
    assert ld.shape == (4, 1000) and ld.dtype == torch.bool
    assert ldpq(0.3, 0.0, 1.0, 1.0, generator=gen).shape == ()
    vals = decode(per_layer, c, r, 1.0)
    a = alpha(1.0)
    assert torch.equal(vals, torch.where(per_layer, c + r * a, c - r * a))
    assert decode(torch.tensor([True, False]), 0.5, 0.1, 1.0).dtype == torch.float32
    # empty and 0-d inputs
    empty = torch.zeros(0)
    assert corbinq(empty, 0.0, 1.0, 1.0, torch.zeros(0, dtype=torch.int32), 3).shape == (0,)
    assert ldpq(empty, 0.0, 1.0, 1.0).shape == (0,)
    assert prob_plus(empty, 0.0, 1.0, 1.0).shape == (0,)
    assert corbinq(0.3, 0.0, 1.0, 1.0, torch.tensor(5), 3, generator=gen).shape == ()
    assert corbinq(0.3, torch.zeros(2, 1), 1.0, 1.0, torch.tensor([1, 2, 3]), 3).shape == (2, 3)


def test_clipping_is_applied_before_quantization() -> None:
    """Weights beyond [c - r, c + r] behave exactly like the nearest endpoint."""
    z = torch.randint(0, 32, (5000,), generator=torch.Generator().manual_seed(2), dtype=torch.int32)
    for far, edge in ((7.0, 1.2), (-9.0, -0.8)):
        a = corbinq(torch.full((5000,), far), 0.2, 1.0, 1.0, z, 5,
                    generator=torch.Generator().manual_seed(4))  # fmt: skip
        b = corbinq(torch.full((5000,), edge), 0.2, 1.0, 1.0, z, 5,
                    generator=torch.Generator().manual_seed(4))  # fmt: skip
        assert torch.equal(a, b)


def test_determinism_and_no_global_rng() -> None:
    w = torch.randn(10_000, generator=torch.Generator().manual_seed(0))
    z = torch.randint(0, 64, (10_000,), generator=torch.Generator().manual_seed(1))
    a = corbinq(w, 0.0, 2.0, 1.0, z, 6, generator=torch.Generator().manual_seed(5))
    b = corbinq(w, 0.0, 2.0, 1.0, z, 6, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a, b)
    state = torch.random.get_rng_state()
    corbinq(w, 0.0, 2.0, 1.0, z, 6)  # default generator: CSPRNG-seeded, not the global one
    ldpq(w, 0.0, 2.0, 1.0)
    assert torch.equal(state, torch.random.get_rng_state())


def test_chunking_does_not_change_deterministic_outputs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inputs on the 2^-d grid have no random tie: output independent of the chunk size."""
    d, eps = 4, 60.0  # alpha == 1.0: q = (w + 1) / 2 exactly
    gen = torch.Generator().manual_seed(3)
    k = torch.randint(0, 2**d + 1, (10_001,), generator=gen)
    w = k.float() * (2.0 / 2**d) - 1.0  # q = k / 2^d exactly
    z = torch.randint(0, 2**d, (10_001,), generator=gen, dtype=torch.int32)
    s = prob_plus(w, 0.0, 1.0, eps).double() * 2**d
    assert bool((s == torch.floor(s)).all())
    for lead in (True, False):
        full = corbinq(
            w, 0.0, 1.0, eps, z, d, lead=lead, generator=torch.Generator().manual_seed(0)
        )
        with monkeypatch.context() as mp:
            mp.setattr(qz, "_CPU_CHUNK", 1000)
            small = corbinq(
                w, 0.0, 1.0, eps, z, d, lead=lead, generator=torch.Generator().manual_seed(1)
            )
        assert torch.equal(full, small)
        assert torch.equal(full, z < k if lead else z >= 2**d - k)


def test_dtype_handling() -> None:
    gen = torch.Generator().manual_seed(0)
    w64 = torch.randn(1000, generator=gen, dtype=torch.float64)
    z = torch.randint(0, 4, (1000,), generator=gen, dtype=torch.uint8)
    a = corbinq(w64, 0.0, 1.0, 1.0, z, 2, generator=torch.Generator().manual_seed(1))
    b = corbinq(w64.float(), 0.0, 1.0, 1.0, z.long(), 2, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b)
    wh = w64.to(torch.bfloat16)
    assert corbinq(wh, 0.0, 1.0, 1.0, z, 2, generator=gen).shape == (1000,)


# ----------------------------------------------------------------------------------- validation
def _args() -> dict[str, object]:
    return {
        "w": torch.zeros(8),
        "c": 0.0,
        "r": 1.0,
        "eps": 1.0,
        "z": torch.zeros(8, dtype=torch.int32),
        "d": 3,
    }


@pytest.mark.parametrize(
    ("change", "exc", "match"),
    [
        ({"eps": 0.0}, ValueError, "eps"),
        ({"eps": -1.0}, ValueError, "eps"),
        ({"eps": math.inf}, ValueError, "eps"),
        ({"eps": math.nan}, ValueError, "eps"),
        ({"eps": True}, TypeError, "eps"),
        ({"r": 0.0}, ValueError, "r must be"),
        ({"r": -0.5}, ValueError, "r must be"),
        ({"r": math.nan}, ValueError, "r must be"),
        ({"r": torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])}, ValueError, "r must be"),
        ({"r": torch.full((8,), math.inf)}, ValueError, "r must be"),
        ({"c": math.inf}, ValueError, "c must be"),
        ({"c": torch.full((8,), math.nan)}, ValueError, "c must be"),
        ({"d": 0}, ValueError, "d must be"),
        ({"d": 17}, ValueError, "d must be"),
        ({"d": 3.0}, TypeError, "d must be"),
        ({"d": True}, TypeError, "d must be"),
        ({"z": torch.zeros(8)}, TypeError, "integer dtype"),
        ({"z": torch.zeros(8, dtype=torch.bool)}, TypeError, "integer dtype"),
        ({"z": [0] * 8}, TypeError, "z must be"),
        ({"z": torch.full((8,), 8, dtype=torch.int32)}, ValueError, r"\[0, 2\*\*d\)"),
        ({"z": torch.full((8,), -1, dtype=torch.int32)}, ValueError, r"\[0, 2\*\*d\)"),
        ({"z": torch.zeros(5, dtype=torch.int32)}, ValueError, "broadcastable"),
        ({"w": torch.zeros(8, dtype=torch.int32)}, TypeError, "w must be"),
        ({"w": "0.5"}, TypeError, "w must be"),
        ({"w": torch.tensor([0.0] * 7 + [math.nan])}, ValueError, "NaN"),
    ],
)
def test_corbinq_validation(change: dict[str, object], exc: type[Exception], match: str) -> None:
    args = _args() | change
    with pytest.raises(exc, match=match):
        corbinq(
            args["w"], args["c"], args["r"], args["eps"], args["z"], args["d"],  # type: ignore[arg-type]
            generator=torch.Generator().manual_seed(0),
        )  # fmt: skip


def test_other_validation() -> None:
    z = torch.zeros(4, dtype=torch.int32)
    w = torch.zeros(4)
    with pytest.raises(TypeError, match="lead"):
        corbinq(w, 0.0, 1.0, 1.0, z, 2, lead=1)  # type: ignore[arg-type]
    for px in (0.0, 1.0, 1e-9, 1.5):
        with pytest.raises(ValueError, match="p_x"):
            corbinq(w, 0.0, 1.0, 1.0, z, 2, p_x=px)
    with pytest.raises(TypeError, match="generator"):
        ldpq(w, 0.0, 1.0, 1.0, generator=np.random.default_rng(0))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="generator is on"):
        validate.torch_generator(torch.Generator(), torch.device("meta"))
    with pytest.raises(ValueError, match="one device"):
        validate.one_device([torch.zeros(1), torch.zeros(1, device="meta")])
    with pytest.raises(TypeError, match="bits"):
        decode(torch.zeros(3), 0.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="r must be"):
        decode(torch.zeros(3, dtype=torch.bool), 0.0, -1.0, 1.0)
    with pytest.raises(ValueError, match="NaN"):
        ldpq(torch.tensor([math.nan]), 0.0, 1.0, 1.0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_path_matches_marginals() -> None:
    dev = torch.device("cuda")
    reps = 20000
    gen = torch.Generator(device=dev).manual_seed(0)
    wv = torch.tensor([-1.0, -0.3, 0.0, 0.6, 1.0], device=dev)
    w = wv.repeat_interleave(reps)
    z = torch.randint(0, 32, w.shape, generator=gen, device=dev, dtype=torch.int32)
    q = [q_ref(float(v), 0.0, 1.0, 1.0) for v in wv.cpu()]
    for lead in (True, False):
        bits = corbinq(w, 0.0, 1.0, 1.0, z, 5, lead=lead, generator=gen)
        assert bits.device.type == "cuda"
        _check_marginals(bits.cpu(), q, reps)
    _check_marginals(ldpq(w, 0.0, 1.0, 1.0, generator=gen).cpu(), q, reps)
    with pytest.raises(ValueError, match="generator is on"):
        ldpq(w, 0.0, 1.0, 1.0, generator=torch.Generator())
