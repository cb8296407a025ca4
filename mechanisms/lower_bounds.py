r"""Realisable lower bounds on the true epsilon of a mechanism, to test printed guarantees against.

A printed guarantee ``(eps, delta)`` claims ``H_{e^eps}(P || Q) <= delta`` for EVERY pair of
neighbouring inputs (``H_g(P || Q) = sum_s (P(s) - g Q(s))_+``, the hockey-stick divergence).
One concrete pair of inputs that the mechanism can be run on (a *realisable configuration*)
therefore gives a lower bound: the smallest ``eps`` with ``H_{e^eps}(P || Q) <= delta`` and
``H_{e^eps}(Q || P) <= delta`` for that pair is at most the true ``eps``. Composed over ``k``
releases of the same pair, the ``k``-fold product pair gives the lower bound of the composed
guarantee. This module computes such lower bounds, and only lower bounds:

* exactly from the pmfs of the pair (:func:`pair_epsilon`, a single release);
* composed with ``dp_accounting``'s privacy-loss distribution (PLD) with *optimistic* rounding
  (``pessimistic_estimate=False``): every loss is rounded down to the grid and the mass below
  the truncation bound is dropped, so the computed hockey-stick divergence never exceeds the
  true one and the ``eps`` read from it never exceeds the true ``eps`` of the configuration
  (:func:`composed_epsilon`; Meiser & Mohammadi, CCS 2018; Koskela et al., AISTATS 2020;
  ``dp_accounting`` documents the two rounding directions).

A test then holds a printed guarantee against the lower bound: ``printed >= lower bound`` at a
grid of settings (``tests/unit/test_lower_bounds.py``). A printed number below a lower bound is
not a guarantee.

AugCorBin-FL's eq. (5) (Theorem 3 of CorBin-FL, Salehi et al., arXiv:2409.13133) fails this test
(:func:`corbin_fl.mechanisms.augcorbin.augcorbin_round_lower_bound`, a realisable configuration
composed with :func:`composed_epsilon`; README, "AugCorBin-FL's eq. (5) is not a bound").
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from dp_accounting.pld import privacy_loss_distribution as pldm
from numpy.typing import ArrayLike, NDArray

from corbin_fl.mechanisms.validate import integer, positive, probability

__all__ = [
    "composed_epsilon",
    "gaussian_composed_lower_bound",
    "pair_epsilon",
]

_TINY = 1e-300
"""Outcomes with a probability below this under either law are dropped (a lower bound: the
divergence of the remaining sub-probability pair is smaller)."""

DISCRETIZATION = 1e-4
"""Loss grid of the optimistic PLD (a coarser grid lowers the bound; it stays a lower bound)."""

_TAIL = 1e-15
"""``dp_accounting``'s composition drops tail mass up to this and then adds this much to its
``+infinity`` mass whatever the rounding; :func:`_compose` asks for ``delta + _TAIL``, which
undoes the addition (dropped mass only lowers ``delta``)."""


def _pmf(x: ArrayLike, name: str) -> NDArray[np.float64]:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-d pmf, got shape {a.shape}")
    if not np.all(np.isfinite(a)) or np.any(a < 0):
        raise ValueError(f"{name} must have finite non-negative entries")
    if not abs(float(a.sum()) - 1.0) <= 1e-9:
        raise ValueError(f"{name} must sum to 1, got {float(a.sum())!r}")
    return a


def _pair(p: ArrayLike, q: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    pa, qa = _pmf(p, "p"), _pmf(q, "q")
    if pa.shape != qa.shape:
        raise ValueError(f"p and q must be on the same outcomes, got {pa.shape} and {qa.shape}")
    return pa, qa


def _hockey(p: NDArray[np.float64], q: NDArray[np.float64], eps: float) -> float:
    """``sum_s (P(s) - e^eps Q(s))_+``, exactly (float64 sums of non-negative terms)."""
    return float(np.sum(np.maximum(p - math.exp(eps) * q, 0.0)))


def pair_epsilon(p: ArrayLike, q: ArrayLike, delta: float) -> float:
    r"""Exact ``eps`` of ONE release of the pair ``(P, Q)`` at ``delta``, both directions.

    The smallest ``eps >= 0`` with ``max(H_{e^eps}(P||Q), H_{e^eps}(Q||P)) <= delta``, found by
    bisection on the exact divergence (``H`` is non-increasing in ``eps``) to ``1e-12``
    relative and returned at the LOWER end of the bracket, so it never exceeds the true value.
    ``inf`` when the mass of ``P`` where ``Q = 0`` (or the reverse) exceeds ``delta``.

    Parameters
    ----------
    p, q : array_like
        Two pmfs on the same outcomes (the mechanism's output laws at two neighbouring inputs).
    delta : float
        In ``(0, 1)``.

    Returns
    -------
    float
        The ``eps`` of this pair: a lower bound on the mechanism's ``eps`` at ``delta``.
    """
    pa, qa = _pair(p, q)
    target = probability(delta, "delta")

    def worst(eps: float) -> float:
        return max(_hockey(pa, qa, eps), _hockey(qa, pa, eps))

    if worst(0.0) <= target:
        return 0.0
    both = (pa > 0) & (qa > 0)
    if float(pa[~both].sum()) > target or float(qa[~both].sum()) > target:
        return math.inf
    top = float(np.max(np.abs(np.log(pa[both]) - np.log(qa[both])))) if both.any() else 0.0
    lo, hi = 0.0, top + 1e-9
    while hi - lo > 1e-12 * max(1.0, hi):
        mid = 0.5 * (lo + hi)
        if worst(mid) <= target:
            hi = mid
        else:
            lo = mid
    return lo


def _optimistic_pld(p: NDArray[np.float64], q: NDArray[np.float64], discretization: float) -> Any:
    keep = np.nonzero((p >= _TINY) & (q >= _TINY))[0]
    if keep.size == 0:
        raise ValueError("p and q share no outcome: the pair has no finite privacy loss")
    return pldm.from_two_probability_mass_functions(
        dict(zip(keep.tolist(), np.log(q[keep]).tolist(), strict=True)),
        dict(zip(keep.tolist(), np.log(p[keep]).tolist(), strict=True)),
        pessimistic_estimate=False,
        value_discretization_interval=discretization,
    )


def composed_epsilon(
    p: ArrayLike, q: ArrayLike, k: int, delta: float, *, discretization: float = DISCRETIZATION
) -> float:
    r"""Lower bound on the ``eps`` of ``k`` releases of the pair ``(P, Q)`` at ``delta``.

    The ``k``-fold product ``(P^k, Q^k)`` is the output of ``k`` independent releases at the
    same two inputs; its PLD is built by ``dp_accounting`` with optimistic rounding (losses
    rounded down, outcomes where ``P`` or ``Q`` is below ``1e-300`` dropped) and self-composed
    ``k`` times (FFT; its tail truncation drops mass, which lowers ``delta`` again), both
    directions, and ``eps`` is the larger of the two. Every step can only lower ``H``, so the
    result never exceeds the true ``eps`` of the ``k``-fold pair.

    Parameters
    ----------
    p, q : array_like
        Two pmfs on the same outcomes.
    k : int
        Releases, ``>= 1``.
    delta : float
        In ``(0, 1)``.
    discretization : float, optional
        Loss grid (default :data:`DISCRETIZATION`).

    Returns
    -------
    float
        ``eps`` (a lower bound on the composed guarantee's ``eps``).
    """
    pa, qa = _pair(p, q)
    k = integer(k, "k", 1)
    target = probability(delta, "delta")
    h = positive(discretization, "discretization")
    out = 0.0
    for x, y in ((pa, qa), (qa, pa)):
        out = max(out, _compose(_optimistic_pld(x, y, h), k, target))
    return out


def _compose(pld: Any, k: int, delta: float) -> float:
    """``eps`` at ``delta`` of ``k`` self-compositions of an optimistic ``pld`` (:data:`_TAIL`)."""
    composed = pld if k == 1 else pld.self_compose(k, tail_mass_truncation=_TAIL)
    slack = 0.0 if k == 1 else _TAIL
    # Private fields (dp_accounting has no public getter of the masses): its own
    # get_epsilon_for_delta returns the loss itself where exp(-loss) underflows (losses above
    # ~745), an UPPER estimate there; _epsilon_for_delta solves in log space.
    dense = composed._pmf_remove.to_dense_pmf()
    losses = (dense._lower_loss + np.arange(len(dense._probs))) * dense._discretization
    return _epsilon_for_delta(
        losses,
        np.asarray(dense._probs, dtype=np.float64),
        float(dense._infinity_mass),
        delta + slack,
    )


def _epsilon_for_delta(
    losses: NDArray[np.float64], probs: NDArray[np.float64], inf_mass: float, delta: float
) -> float:
    r"""Smallest ``eps >= 0`` with ``inf_mass + sum_{L > eps} p_L (1 - e^{eps - L}) <= delta``.

    Exact for the given discrete PLD, in log space: between consecutive losses
    ``delta(eps) = inf_mass + S - e^eps T`` with ``S = sum p_L``, ``T = sum p_L e^{-L}`` over the
    losses above ``eps``; ``log T`` is a running log-sum-exp, so no ``e^{-L}`` underflows.
    """
    if inf_mass > delta:
        return math.inf
    keep = probs > 0
    order = np.argsort(-losses[keep], kind="stable")
    loss, p = losses[keep][order], probs[keep][order]
    if loss.size == 0:
        return 0.0
    s_cum = inf_mass + np.cumsum(p)  # mass of the losses >= loss[i], plus the atom at infinity
    with np.errstate(divide="ignore"):
        log_t = np.logaddexp.accumulate(np.log(p) - loss)
    # delta at eps = loss[i]: the losses strictly above it are 0..i-1
    above = np.concatenate(([inf_mass], s_cum[:-1]))
    log_t_above = np.concatenate(([-np.inf], log_t[:-1]))
    at = above - np.exp(log_t_above + loss)
    over = np.nonzero(at > delta)[0]
    if over.size:  # the solution lies in [loss[i], loss[i-1]) with i the first such index
        i = int(over[0])
        if i == 0:
            return math.inf
        eps = math.log(s_cum[i - 1] - delta) - float(log_t[i - 1])
        return max(0.0, min(eps, float(loss[i - 1])))
    if s_cum[-1] <= delta:
        return 0.0
    return max(0.0, math.log(s_cum[-1] - delta) - float(log_t[-1]))


def gaussian_composed_lower_bound(
    sensitivity_over_sigma: float, k: int, delta: float, *, discretization: float = DISCRETIZATION
) -> float:
    r"""Lower bound on the ``eps`` of ``k`` Gaussian releases with ``mu = Delta / sigma`` each.

    The realisable pair is ``N(0, sigma^2)`` against ``N(Delta, sigma^2)`` (two inputs at the
    sensitivity ``Delta`` apart), ``k`` times; ``dp_accounting``'s Gaussian PLD with optimistic
    rounding (``pessimistic_estimate=False``), self-composed ``k`` times. An independent check of
    the closed forms that compose Gaussians as one with ``mu sqrt(k)``.

    Parameters
    ----------
    sensitivity_over_sigma : float
        ``mu = Delta / sigma > 0``.
    k : int
        Releases, ``>= 1``.
    delta : float
        In ``(0, 1)``.
    discretization : float, optional
        Loss grid.

    Returns
    -------
    float
        ``eps`` (a lower bound).
    """
    mu = positive(sensitivity_over_sigma, "sensitivity_over_sigma")
    k = integer(k, "k", 1)
    target = probability(delta, "delta")
    pld = pldm.from_gaussian_mechanism(
        1.0 / mu,
        sensitivity=1.0,
        pessimistic_estimate=False,
        value_discretization_interval=positive(discretization, "discretization"),
        use_connect_dots=False,  # connect-the-dots is pessimistic only
    )
    return _compose(pld, k, target)
