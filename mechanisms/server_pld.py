r"""Composing the per-parameter guarantee against the sum-seeing server (threat model B).

:mod:`corbin_fl.mechanisms.secure_sum` reduces one parameter of one round to a finite set of
vertex pairs ``(P_k, Q_k)`` (the laws of the sum when the client's own bit is at the top/bottom
of its range and ``k`` of the others at the top), both orders ``(P_k, Q_k)`` and ``(Q_k, P_k)``
(the client's input may move up at one parameter and down at the next). This module composes
that per-step worst case over ``K = m T`` steps, where the adversary (the others' inputs) may pick
a different pair at every step, adaptively. Pure NumPy / SciPy / ``dp_accounting``; no Flower.

Papers (public references): dominating pairs and their adaptive composition = Zhu, Dong & Wang,
"Optimal accounting of differential privacy via characteristic function", AISTATS 2022
(arXiv:2106.08567), Definition 7 and Theorem 10; connect-the-dots = Doroshenko et al., PETS 2022
(arXiv:2207.04380); Renyi DP = Mironov, CSF 2017 (arXiv:1702.07476), Proposition 1 (adaptive
composition); its conversion to ``(eps, delta)`` = Canonne, Kamath & Steinke, NeurIPS 2020
(arXiv:2004.00010), Proposition 12, the same as Balle et al., AISTATS 2020 (arXiv:1905.09982),
Theorem 21, and ``dp_accounting``'s ``RdpAccountant``.

Notation. ``H_g(A || B) = sum_s (A(s) - g B(s))_+`` for ``g = e^eps >= 0``. A pair ``(X, Y)``
*dominates* a set ``S`` of ordered pairs if ``H_g(A || B) <= H_g(X || Y)`` for every ``(A, B)``
in ``S`` and EVERY ``g >= 0`` (``eps`` in all of ``R``, not only ``eps >= 0``: the composed
hockey-stick at ``eps >= 0`` depends on the per-step curves at negative ``eps`` too). Then the
``K``-fold composition of ``(X, Y)`` bounds every adaptive ``K``-step composition of pairs of
``S`` (Zhu, Dong & Wang, Theorem 10).

The two directions are one here
-------------------------------
The neighbouring relation (one client replaces its input) is symmetric, and a step's ordered pair
can be ``(P_k, Q_k)`` or ``(Q_k, P_k)``, so the per-step pairs of "``M(D)`` against ``M(D')``" and
of "``M(D')`` against ``M(D)``" are the same set ``S``, closed under reversal. Both directions'
dominating pairs must therefore dominate all of ``S``, and building one PLD per direction (a
``PrivacyLossDistribution`` with distinct remove/add pmfs) gives the same PLD twice. In every
family of :mod:`~corbin_fl.mechanisms.secure_sum` the reversal is also a relabeling: the flip
``s -> N - s`` of the sum maps ``(Q_k, P_k)`` to ``(P_{N-k}, Q_{N-k})``, so the envelope of one
order over all ``eps`` in ``R`` already equals the two-way envelope
(``tests/unit/test_server_pld.py`` checks it). A per-direction split that composed only
``(P_k, Q_k)`` in one direction would be unsound for this relation.

What the composition uses (:func:`best_of`)
-------------------------------------------
1. **A single dominating vertex** (:func:`dominant_pair`): when one ordered pair ``(X, Y)`` of
   ``S`` has ``H_g(X || Y) >= H_g(A || B)`` for every ``(A, B)`` in ``S`` and every ``g >= 0``,
   its exact pmfs are composed (pessimistic rounding of the losses,
   ``from_two_probability_mass_functions``): the figure is then the exact ``K``-fold composition
   of a realisable pair, up to the discretization. The check is exact, not sampled: each
   ``g -> H_g`` is piecewise linear with kinks at the likelihood ratios, so a difference of two
   curves is non-negative everywhere iff it is at the union of their kinks (every finite loss of
   either pair), at ``g = 0`` (both are 1) and beyond the last kink (the masses of infinite
   loss). Tolerance: ``1e-12`` relative plus ``1e-18`` absolute (the curves' float64 rounding;
   a pair and its isomorphic reverse agree to about ``1e-15``). Since ``S`` is closed under
   reversal, such a pair must be its own reverse up to a relabeling: the middle vertex of an odd
   number of outcomes' worth of others (``n`` odd for the one-bit family) is the only candidate,
   and for even ``n`` no vertex dominates.
2. **Otherwise the envelope**: the pointwise maximum over ``S`` of ``g -> H_g`` is itself a
   privacy curve, and its connect-the-dots PLD (``secure_sum.dominating_pld``) dominates ``S``;
   it is the tightest *single* dominating pair (any dominating pair's curve is above the envelope,
   and composition is monotone under domination). It is loose when the worst vertex changes with
   ``eps`` (and, for even ``n``, a vertex and its reverse are never the same pair), because the
   envelope's pair is more distinguishable than every vertex.
3. **Renyi DP** (:func:`rdp_epsilon`): for every order ``alpha > 1``,
   ``D_alpha = max`` over ``S`` of ``D_alpha(A || B)``; adaptive composition adds them
   (Mironov 2017, Proposition 1), so ``K D_alpha`` bounds the composition whatever pair each step
   uses, and Canonne-Kamath-Steinke's conversion turns it into ``eps`` at ``delta``, minimised
   over a grid of orders. It bounds each order separately and is within a few percent of the
   fixed-vertex lower bound where the envelope is not.

Each of the three is a sound upper bound for the adaptive composition, so their minimum is.
:func:`fixed_vertex_lower_bound` is the matching lower bound: the worst single ordered pair of
``S`` composed with itself ``K`` times, optimistic rounding (a realisable adversary: the same
vertex at every step).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from corbin_fl.mechanisms.validate import positive

if TYPE_CHECKING:  # secure_sum imports this module
    from corbin_fl.mechanisms.secure_sum import SumProfile, VertexFamily

__all__ = [
    "DOMINANCE_ABS",
    "DOMINANCE_REL",
    "TINY",
    "Dominant",
    "dominant_pair",
    "fixed_vertex_lower_bound",
    "loss_bound",
    "pair_pld",
    "rdp_curve",
    "rdp_epsilon",
    "rdp_to_epsilon",
    "self_compose",
    "spread_gap",
]

Array = NDArray[np.float64]

TINY = 1e-250
"""Probabilities below this count as outcomes of infinite privacy loss (``secure_sum._TINY``)."""

DOMINANCE_REL = 1e-12
DOMINANCE_ABS = 1e-18
"""Tolerance of the dominance check: ``H_g(X||Y) >= H_g(A||B) (1 - 1e-12) - 1e-18``."""

TRUNCATION = 1e-15
"""Tail mass truncated at each composition (pessimistically or optimistically, as the PLD)."""

RDP_SLACK_REL = 1e-9
RDP_SLACK_ABS = 1e-12
"""Added to every computed Renyi divergence (float64 rounding of the pmfs and their logs)."""

_ORDERS = 1.0 + np.geomspace(1e-7, 1e3, 97)
"""Coarse grid of Renyi orders ``alpha`` (``alpha - 1`` log-spaced, ratio 1.33); refined around
the best order of each conversion (:func:`rdp_epsilon`)."""


# =================================================================================== pairs


def _ordered_curves(profile: SumProfile) -> Iterator[tuple[str, int, str, Any]]:
    """Every ordered pair of ``S`` as ``(family, k, direction, curve)`` (secure_sum's curves)."""
    for label, k, fwd, rev in profile._all():
        yield label, k, "P||Q", fwd
        yield label, k, "Q||P", rev


def _pair(profile: SumProfile, label: str, k: int, direction: str) -> tuple[Array, Array]:
    """The pmfs ``(A, B)`` of one ordered pair of ``profile``."""
    for fam in profile.families:
        if fam.label != label:
            continue
        for kk, p, q in fam.pairs():
            if kk == k:
                return (p, q) if direction == "P||Q" else (q, p)
    raise ValueError(f"no vertex ({label!r}, k = {k}) in profile {profile.name!r}")


def loss_bound(family: VertexFamily) -> float:
    """``Lambda``: a bound on ``|log(P_k(s)/Q_k(s))|`` over every ``k`` and outcome ``s``.

    ``P_k(s)/Q_k(s) = sum_x Bin(D, hi)(x) Y(s - x) / sum_x Bin(D, lo)(x) Y(s - x)`` is at most
    the largest ratio of the client's own laws, ``max((hi/lo)^D, ((1 - hi)/(1 - lo))^D)``, and at
    least the smallest; ``inf`` when ``lo`` or ``hi`` is 0 or 1 (a paired client).
    """
    hi, lo, d = family.hi, family.lo, family.d_trials
    if not (0.0 < lo < 1.0 and 0.0 < hi < 1.0):
        return math.inf
    return d * max(abs(math.log(hi / lo)), abs(math.log((1.0 - hi) / (1.0 - lo))))


# =================================================================================== dominance


@dataclass(frozen=True)
class Dominant:
    """An ordered vertex pair ``(upper, lower)`` that dominates every ordered pair of a profile."""

    family: str
    k: int
    direction: str
    upper: Array
    lower: Array


def _dominates(x: Any, c: Any, top: float) -> bool:
    """Exact check ``H_g(x) >= H_g(c)`` for all ``g >= 0`` at the kinks of both curves."""
    pts = np.concatenate([-x.neg_loss, -c.neg_loss, [top + 1.0]])
    vx, vc = x(pts), c(pts)
    return bool(np.all(vx >= vc * (1.0 - DOMINANCE_REL) - DOMINANCE_ABS))


def dominant_pair(profile: SumProfile, points: int = 4097) -> Dominant | None:
    """The ordered vertex pair that dominates all of ``S`` for every ``g >= 0``, or None.

    One pass over the ordered pairs on a grid of ``points`` values of ``eps`` in ``[-L, L]``
    (``L`` the largest finite loss) keeps the pairs that are nowhere below another (within the
    tolerance :data:`DOMINANCE_REL`, :data:`DOMINANCE_ABS`); each survivor is then checked
    exactly against every ordered pair at the union of both curves' kinks (module docstring) and
    the first that passes is returned with its pmfs.
    """
    top = profile.max_loss
    span = top * (1.0 + 1e-6) + 1e-9
    grid = np.linspace(-span, span, int(points))
    envelope = np.zeros(grid.shape)
    cands: list[tuple[tuple[str, int, str], Any, Array]] = []
    for label, k, direction, c in _ordered_curves(profile):
        v = c(grid)
        low = v * (1.0 - DOMINANCE_REL) - DOMINANCE_ABS
        cands = [(i, cc, vv) for i, cc, vv in cands if np.all(vv >= low)]
        if np.all(v >= envelope * (1.0 - DOMINANCE_REL) - DOMINANCE_ABS):
            cands.append(((label, k, direction), c, v))
        np.maximum(envelope, v, out=envelope)
    for (label, k, direction), x, _ in cands:
        if all(_dominates(x, c, top) for _, _, _, c in _ordered_curves(profile)):
            upper, lower = _pair(profile, label, k, direction)
            return Dominant(label, k, direction, upper, lower)
    return None


# =================================================================================== PLDs


def pair_pld(upper: Array, lower: Array, gap: float, *, pessimistic: bool = True) -> Any:
    """``dp_accounting`` PLD of the pair ``(upper, lower)``, losses rounded to multiples of
    ``gap``.

    Pessimistic (losses rounded up): outcomes where either probability is below :data:`TINY`
    count as infinite loss (their ``upper`` mass joins the ``+infinity`` atom), as secure_sum's
    curves do; the pair so formed dominates the original (the original is its post-processing),
    so the PLD is an upper bound. Optimistic (rounded down, for lower bounds): those outcomes are
    dropped, which only lowers every ``H_g`` (a sum of non-negative terms loses some), except
    that an outcome with ``lower`` exactly 0 keeps its infinite loss.
    Symmetric (the add pmf is the remove pmf): both directions compose the same set of pairs.
    """
    from dp_accounting.pld import privacy_loss_distribution as pldm

    p = np.asarray(upper, dtype=np.float64)
    q = np.asarray(lower, dtype=np.float64)
    if p.shape != q.shape or p.ndim != 1:
        raise ValueError(f"upper and lower must be 1-d pmfs of one shape, got {p.shape}, {q.shape}")
    gap = positive(gap, "gap")
    both = (p >= TINY) & (q >= TINY)
    up: dict[Any, float] = {int(i): math.log(p[i]) for i in np.flatnonzero(both)}
    lo: dict[Any, float] = {int(i): math.log(q[i]) for i in np.flatnonzero(both)}
    if pessimistic:
        inf_mass = float(np.sum(p[~both]))
    else:
        inf_mass = float(np.sum(p[(q == 0.0) & (p >= TINY)]))
    if inf_mass > 0.0:
        up["inf"] = math.log(inf_mass)  # absent from ``lo``: an outcome of infinite loss
    return pldm.from_two_probability_mass_functions(
        lo, up, pessimistic_estimate=pessimistic, value_discretization_interval=gap
    )


def spread_gap(upper: Array, lower: Array, steps: int, max_fft: int) -> float:
    """Loss grid for ``steps`` compositions of one pair: ``16 s sqrt(K)`` spans ``max_fft`` points.

    ``s`` is the standard deviation of the pair's finite loss under ``upper``; the gap is at most
    ``L/128`` (``L`` its largest finite ``|loss|``) so the one-step pmf keeps some resolution.
    """
    p, q = np.asarray(upper), np.asarray(lower)
    both = (p >= TINY) & (q >= TINY)
    loss = np.log(p[both]) - np.log(q[both])
    w = p[both] / max(float(np.sum(p[both])), TINY)
    mu = float(np.sum(w * loss))
    sd = math.sqrt(max(float(np.sum(w * (loss - mu) ** 2)), 0.0))
    top = float(np.max(np.abs(loss))) if loss.size else 1.0
    want = 16.0 * sd * math.sqrt(steps) / max_fft
    return max(min(want, top / 128.0), 1e-9)


def self_compose(pld: Any, k: int) -> Any:
    """``k``-fold composition by repeated squaring (``dp_accounting`` ``compose``).

    Each ``compose`` is an FFT convolution whose tails below :data:`TRUNCATION` are truncated in
    the PLD's own direction (pessimistic: the lower tail onto the smallest kept loss, the upper
    tail to ``+infinity``), at most ``2 log2 k`` compositions. ``dp_accounting``'s
    ``self_compose`` sizes its FFT with Chernoff orders far too large for ``k`` in the millions.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    result = None
    power = pld
    while True:
        if k & 1:
            result = power if result is None else result.compose(power, TRUNCATION)
        k >>= 1
        if not k:
            return result
        power = power.compose(power, TRUNCATION)


# =================================================================================== Renyi DP


def _pair_rdp(p: Array, q: Array, bound: float, u: Array) -> Array:
    """``D_alpha(p || q)`` at ``alpha = 1 + u`` (upper bound, float64 rounding covered).

    ``D_alpha = log(sum_s p(s) e^{u L(s)}) / u`` with ``L = log(p/q)``, computed as
    ``log1p(sum_s p(s) expm1(u L(s))) / u`` (stable as ``u -> 0``). ``L`` is clipped to
    ``[-Lambda, Lambda]`` (:func:`loss_bound`: subnormal pmfs lose their ratio's accuracy);
    an outcome with ``q = 0 < p`` is ``+inf`` unless ``Lambda`` is finite (then ``q`` underflowed
    and ``L <= Lambda``); outcomes with ``p = 0`` (underflow, below ``5e-324`` each) are bounded
    by ``1e-300`` of mass each at loss ``Lambda``.
    """
    pos = p > 0
    qz = pos & (q <= 0)
    if np.any(qz) and not math.isfinite(bound):
        return np.full(u.shape, np.inf)
    ok = pos & (q > 0)
    lam = bound if math.isfinite(bound) else np.inf
    loss = np.clip(np.log(p[ok]) - np.log(q[ok]), -lam, lam)
    w = p[ok]
    extra_w = float(np.sum(p[qz])) + (1e-300 * int(np.sum(~pos)) if math.isfinite(bound) else 0.0)
    with np.errstate(over="ignore", invalid="ignore"):
        x = np.expm1(np.outer(u, loss)) @ w
        if extra_w > 0.0:
            x = x + extra_w * np.expm1(u * bound)
        d = np.log1p(x) / u
    d = np.where(np.isnan(d), np.inf, d)
    return d * (1.0 + RDP_SLACK_REL) + RDP_SLACK_ABS


def rdp_curve(profile: SumProfile, orders: Sequence[float] | Array) -> Array:
    """``max`` over every ordered vertex pair of ``profile`` of ``D_alpha``, at each order.

    Sound for any adaptive choice of pair per step: Renyi divergences of an adaptive composition
    add up (Mironov 2017, Proposition 1), each step bounded by this maximum.
    """
    a = np.asarray(orders, dtype=np.float64)
    if a.ndim != 1 or not np.all(a > 1.0):
        raise ValueError("orders must be a 1-d array of Renyi orders > 1")
    u = a - 1.0
    out = np.zeros(u.shape)
    for fam in profile.families:
        lam = loss_bound(fam)
        for _, p, q in fam.pairs():
            np.maximum(out, _pair_rdp(p, q, lam, u), out=out)
            np.maximum(out, _pair_rdp(q, p, lam, u), out=out)
    return out


def rdp_to_epsilon(orders: Sequence[float] | Array, rdp: Array, delta: float) -> float:
    """``min_alpha rdp(alpha) + log1p(-1/alpha) - (log delta + log alpha)/(alpha - 1)``.

    Canonne, Kamath & Steinke 2020, Proposition 12 (= Balle et al. 2020, Theorem 21;
    ``dp_accounting``'s ``rdp_privacy_accountant.compute_epsilon``, which uses it only above
    ``alpha = 1.01`` for numerical stability): written with ``u = alpha - 1`` as
    ``rdp + log u - log1p(u) - (log delta + log1p(u))/u``, stable down to ``u = 1e-7``.
    """
    a = np.asarray(orders, dtype=np.float64)
    r = np.asarray(rdp, dtype=np.float64)
    if a.shape != r.shape:
        raise ValueError(f"orders and rdp must have one shape, got {a.shape} and {r.shape}")
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    u = a - 1.0
    with np.errstate(invalid="ignore"):
        eps = r + np.log(u) - np.log1p(u) - (math.log(delta) + np.log1p(u)) / u
    eps = np.where(np.isfinite(eps), eps, np.inf)
    return max(0.0, float(np.min(eps)))


def rdp_epsilon(
    profile: SumProfile, steps: int, delta: float, *, curve: tuple[Array, Array] | None = None
) -> float:
    """Renyi-DP upper bound of ``steps`` adaptive steps of ``profile`` at ``delta``.

    ``K max_S D_alpha`` converted with :func:`rdp_to_epsilon` on a coarse grid of orders
    (``alpha - 1`` from ``1e-7`` to ``1e3``), then on 33 orders between the best one's
    neighbours. ``curve``: ``(orders, max D_alpha)`` of the coarse grid, when already computed.
    """
    k = int(steps)
    if k < 1:
        raise ValueError(f"steps must be >= 1, got {steps!r}")
    orders, d = curve if curve is not None else (_ORDERS, rdp_curve(profile, _ORDERS))
    i = int(np.argmin(_converted(orders, d, k, delta)))
    lo_o = orders[max(i - 1, 0)]
    hi_o = orders[min(i + 1, len(orders) - 1)]
    fine = 1.0 + np.geomspace(lo_o - 1.0, hi_o - 1.0, 33)
    both = np.concatenate([orders, fine])
    dd = np.concatenate([d, rdp_curve(profile, fine)])
    return rdp_to_epsilon(both, k * dd, delta)


def _converted(orders: Array, d: Array, k: int, delta: float) -> Array:
    u = orders - 1.0
    with np.errstate(invalid="ignore"):
        eps = k * d + np.log(u) - np.log1p(u) - (math.log(delta) + np.log1p(u)) / u
    return np.where(np.isfinite(eps), eps, np.inf)


def coarse_rdp_curve(profile: SumProfile) -> tuple[Array, Array]:
    """``(orders, max D_alpha)`` on the coarse grid, to share between several ``steps``."""
    return _ORDERS, rdp_curve(profile, _ORDERS)


# =================================================================================== lower bound


def fixed_vertex_lower_bound(
    profile: SumProfile, steps: int, delta: float, *, max_fft: int = 1 << 21, top: int = 3
) -> tuple[float, tuple[str, int, str]]:
    """``eps`` of the worst single ordered vertex pair composed ``steps`` times (a lower bound).

    Each ordered pair of ``S`` is ranked by a coarse optimistic composition (``2^14`` points; a
    pessimistic one is infinite for a pair whose outcomes below :data:`TINY` weigh more than
    ``delta`` over ``steps``, and would crowd out the pairs that matter);
    the ``top`` best are composed exactly with optimistic rounding (losses rounded down, tails
    truncated optimistically) on a grid of about ``max_fft`` points, and the largest is returned
    with its ``(family, k, direction)``. Every value is realised by an adversary that keeps the
    others at one vertex and the client's input on one side at every step, so the maximum over
    any subset of pairs is a lower bound on the true composed guarantee.
    """
    k = int(steps)
    if k < 1:
        raise ValueError(f"steps must be >= 1, got {steps!r}")
    ranked: list[tuple[float, tuple[str, int, str], Array, Array]] = []
    for fam in profile.families:
        for kk, p, q in fam.pairs():
            for direction, (a, b) in (("P||Q", (p, q)), ("Q||P", (q, p))):
                gap = spread_gap(a, b, k, 1 << 14)  # optimistic: finite for every pair
                coarse = _eps(self_compose(pair_pld(a, b, gap, pessimistic=False), k), delta)
                ranked.append((coarse, (fam.label, kk, direction), a, b))
    ranked.sort(key=lambda r: -r[0])
    best = (-math.inf, ("", -1, ""))
    for _, ident, a, b in ranked[: max(1, int(top))]:
        gap = spread_gap(a, b, k, max_fft)
        e = _eps(self_compose(pair_pld(a, b, gap, pessimistic=False), k), delta)
        if e > best[0]:
            best = (e, ident)
    return best


def _eps(pld: Any, delta: float) -> float:
    return float(pld.get_epsilon_for_delta(delta))
