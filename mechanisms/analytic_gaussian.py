r"""The analytic Gaussian mechanism's privacy math (Balle & Wang 2018); no torch.

A Gaussian mechanism with L2 sensitivity ``D`` and noise ``sigma`` is ``mu``-GDP with
``mu = D / sigma``; it is ``(eps, delta)``-DP iff (Balle & Wang, "Improving the Gaussian
mechanism for differential privacy: analytical calibration and optimal denoising", ICML 2018,
Theorem 8 / Algorithm 1)

.. math:: \Phi\Big(\frac{D}{2\sigma} - \frac{\epsilon\sigma}{D}\Big)
          - e^{\epsilon}\,\Phi\Big(-\frac{D}{2\sigma} - \frac{\epsilon\sigma}{D}\Big)
          \le \delta .

This module holds that profile (:func:`gaussian_delta`), its inverse (:func:`gaussian_epsilon`),
the calibrated ``sigma`` (:func:`analytic_gaussian_sigma`) and the log normal CDF they rest on
(:func:`log_ndtr`), in float64 with ``math.erfc`` (no SciPy, no torch at runtime). The Gaussian
baseline (:mod:`corbin_fl.mechanisms.baselines.gaussian`, which re-exports these names), the
central Gaussian, Fed-CAD, the accountant and the privacy report use them; keeping them apart
from the torch mechanism lets the accountant be imported without torch (about 1.3 CPU-s).
"""

from __future__ import annotations

import math

from corbin_fl.mechanisms.validate import integer, positive, probability

__all__ = [
    "analytic_gaussian_sigma",
    "central_epsilon",
    "central_noise_multiplier",
    "gaussian_delta",
    "gaussian_epsilon",
    "log_ndtr",
]

_SQRT2 = math.sqrt(2.0)
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


def log_ndtr(x: float) -> float:
    r"""Natural log of the standard normal CDF, :math:`\log\Phi(x)`, accurate in both tails.

    ``Phi(x) = erfc(-x / sqrt 2) / 2``. For ``x >= 0`` it uses ``log1p(-erfc(x/sqrt 2)/2)``;
    for ``-37 < x < 0`` ``log(erfc(-x/sqrt 2)/2)``; below ``-37`` (where ``erfc`` underflows)
    the asymptotic series :math:`\log\Phi(x) = -x^2/2 - \log(-x) - \log\sqrt{2\pi} +
    \log(1 - x^{-2} + 3x^{-4} - 15x^{-6} + 105x^{-8})`, whose relative error is below
    ``945 / 37^10 < 1e-12``.

    Parameters
    ----------
    x : float
        Argument (``-inf`` gives ``-inf``, ``+inf`` gives ``0``).

    Returns
    -------
    float
        :math:`\log\Phi(x)`.
    """
    if math.isnan(x):
        raise ValueError("log_ndtr of NaN")
    if x == math.inf:
        return 0.0
    if x == -math.inf:
        return -math.inf
    if x >= 0.0:
        return math.log1p(-0.5 * math.erfc(x / _SQRT2))
    if x > -37.0:
        return math.log(0.5 * math.erfc(-x / _SQRT2))
    x2 = 1.0 / (x * x)
    series = 1.0 - x2 * (1.0 - x2 * (3.0 - x2 * (15.0 - 105.0 * x2)))
    return -0.5 * x * x - math.log(-x) - _LOG_SQRT_2PI + math.log(series)


def gaussian_delta(eps: float, mu: float) -> float:
    r"""Privacy profile of a Gaussian mechanism with ``mu = sensitivity / sigma`` (``mu``-GDP).

    .. math:: \delta(\epsilon) = \Phi\Big(\frac{\mu}{2} - \frac{\epsilon}{\mu}\Big)
              - e^{\epsilon}\Phi\Big(-\frac{\mu}{2} - \frac{\epsilon}{\mu}\Big)

    (Balle & Wang 2018, Theorem 8; Dong, Roth & Su 2022, Corollary 2.13). The second term is
    evaluated as ``exp(eps + log Phi(.))`` so that large ``eps`` and ``mu`` do not overflow.
    A ``k``-fold composition of such mechanisms is ``sqrt(k) mu``-GDP, so this is also the exact
    profile of composed Gaussians.

    Parameters
    ----------
    eps : float
        Any real ``eps`` (``delta`` is defined for negative ``eps`` too).
    mu : float
        ``sensitivity / sigma > 0``.

    Returns
    -------
    float
        ``delta(eps)`` in ``[0, 1]``.
    """
    mu = positive(mu, "mu")
    if math.isnan(eps):
        raise ValueError("eps must not be NaN")
    a = mu / 2.0 - eps / mu
    b = -mu / 2.0 - eps / mu
    first = math.exp(log_ndtr(a))
    second = math.exp(eps + log_ndtr(b)) if eps + log_ndtr(b) > -745.0 else 0.0
    return min(1.0, max(0.0, first - second))


def gaussian_epsilon(delta: float, mu: float) -> float:
    """Smallest ``eps >= 0`` with :func:`gaussian_delta` ``(eps, mu) <= delta`` (rounded up).

    Parameters
    ----------
    delta : float
        Target in ``(0, 1)``.
    mu : float
        ``sensitivity / sigma > 0`` of the (composed) Gaussian mechanism.

    Returns
    -------
    float
        ``eps`` (``0.0`` when ``delta(0) <= delta`` already).
    """
    delta = probability(delta, "delta")
    if gaussian_delta(0.0, mu) <= delta:
        return 0.0
    lo, hi = 0.0, max(1.0, mu * mu / 2.0 + mu)
    while gaussian_delta(hi, mu) > delta:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if gaussian_delta(mid, mu) > delta:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
    return hi


def analytic_gaussian_sigma(eps: float, delta: float, sensitivity: float) -> float:
    r"""Smallest ``sigma`` making the Gaussian mechanism ``(eps, delta)``-DP (Balle & Wang 2018).

    Solves the exact condition (Balle & Wang 2018, Theorem 8, calibrated by Algorithm 1)

    .. math:: \Phi\Big(\frac{D}{2\sigma} - \frac{\epsilon\sigma}{D}\Big)
              - e^{\epsilon}\Phi\Big(-\frac{D}{2\sigma} - \frac{\epsilon\sigma}{D}\Big)
              \le \delta

    for ``sigma`` by bisection on ``log sigma`` (the left side decreases in ``sigma``), to a
    relative precision of ``1e-12``, returning the upper end of the final bracket so the
    returned ``sigma`` always satisfies the condition. The result is ``sensitivity`` times the
    solution for ``D = 1``.

    Parameters
    ----------
    eps : float
        ``eps > 0``.
    delta : float
        ``delta`` in ``(0, 1)``.
    sensitivity : float
        L2 sensitivity ``D > 0`` (``2 r`` per parameter after clipping).

    Returns
    -------
    float
        ``sigma > 0``.
    """
    eps = positive(eps)
    delta = probability(delta, "delta")
    sens = positive(sensitivity, "sensitivity")

    def excess(sigma: float) -> float:
        return gaussian_delta(eps, 1.0 / sigma) - delta

    hi = max(1.0, math.sqrt(2.0 * math.log(1.25 / delta)) / eps)
    while excess(hi) > 0.0:
        hi *= 2.0
    lo = hi / 2.0
    while excess(lo) <= 0.0:
        lo /= 2.0
        if lo < 1e-300:
            break
    for _ in range(400):
        mid = math.sqrt(lo * hi)
        if excess(mid) > 0.0:
            lo = mid
        else:
            hi = mid
        if hi / lo - 1.0 <= 1e-12:
            break
    return hi * sens


def central_noise_multiplier(epsilon: float, delta: float, rounds: int) -> float:
    """``z = sqrt(T) sigma_1(eps, delta)``: ``T`` rounds of the Gaussian sum are (eps, delta)-DP."""
    e = positive(epsilon, "epsilon")
    d = probability(delta, "delta")
    t = integer(rounds, "rounds", 1)
    return math.sqrt(t) * analytic_gaussian_sigma(e, d, 1.0)


def central_epsilon(z: float, delta: float, rounds: int) -> float:
    """The exact ``eps`` at ``delta`` of ``rounds`` Gaussian sums with noise multiplier ``z``."""
    zz = positive(z, "z")
    t = integer(rounds, "rounds", 1)
    return gaussian_epsilon(delta, math.sqrt(t) / zz)
