r"""The randomized quantization mechanism, RQM (Youn, Hu, Ziani & Abernethy, 2023, Alg. 2).

Youn, Hu, Ziani & Abernethy, "Randomized quantization is all you need for differential privacy
in federated learning" (arXiv:2306.11913), Algorithm 2, for one coordinate with
``x = (clip(w) - c) / r`` in ``[-1, 1]`` (the paper's ``c`` is 1 here) and levels evenly spaced
on ``[-X_max, X_max]``; the end levels are always kept and each interior level is kept with
probability ``q``; then ``x`` is rounded at random, without bias, to one of the two kept levels
around it. Decoded value: the level itself (``E = x``).

Two levels ``{-X, X}`` (1 bit): ``P(X | x) = (X + x) / (2X)``; the ratio of ``P(X | 1)`` to
``P(X | -1)`` is ``(X + 1) / (X - 1)``, so

.. math:: \epsilon = \log\frac{X + 1}{X - 1} \iff X = \frac{e^\epsilon + 1}{e^\epsilon - 1},

LDPQ's law exactly (CorBin-FL Alg. 1, ``X = alpha(eps)``).

Three levels ``{-X, 0, X}`` (2 bits), 0 kept with probability ``q``; for ``x >= 0`` (mirror for
``x < 0``):

.. math::
    P(X | x) = q\frac{x}{X} + (1 - q)\frac{X + x}{2X},\quad P(0 | x) = q\Bigl(1 - \frac{x}{X}\Bigr),
    \quad P(-X | x) = (1 - q)\frac{X - x}{2X}.

``P(X | .)`` rises with ``x``, ``P(0 | .)`` peaks at 0, so the exact pure-LDP epsilon is

.. math::
    \epsilon(X, q) = \log\max\Bigl(\frac{1}{1 - 1/X},\;
        \frac{2q + (1 - q)(1 + X)}{(1 - q)(X - 1)}\Bigr)

(the first term only when ``q > 0``). Both terms fall strictly with ``X``, so the calibrated
``X_max`` (``epsilon(X_max, q) = eps``) is the unique root, found by bracketing (``brentq``).
With ``q = 0`` it is the two-level mechanism in two bits. Variance for ``|x| <= 1``:
``q X |x| + (1 - q) X^2 - x^2``.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch
from scipy.optimize import brentq, minimize_scalar

from corbin_fl.mechanisms.baselines.levels import FiniteMechanism
from corbin_fl.mechanisms.validate import positive, probability

__all__ = ["RQM", "rqm_epsilon", "rqm_optimal_q", "rqm_xmax"]

RQM_LEVELS: tuple[int, ...] = (2, 3)
MAX_Q = 0.999
"""Largest ``q`` searched by :func:`rqm_optimal_q` (``q -> 1`` sends ``X_max`` to infinity)."""


def rqm_epsilon(xmax: float, q: float, levels: int = 3) -> float:
    """The exact pure-LDP epsilon of RQM with levels ``{-X, (0,) X}`` on ``[-1, 1]``."""
    x = float(xmax)
    if not x > 1.0:
        return math.inf
    if levels == 2:
        return math.log((x + 1.0) / (x - 1.0))
    if levels != 3:
        raise ValueError(f"levels must be 2 or 3, got {levels!r}")
    q = probability(q, "q", lo_open=False, hi_open=True)
    top = (2.0 * q + (1.0 - q) * (1.0 + x)) / ((1.0 - q) * (x - 1.0))
    zero = 1.0 / (1.0 - 1.0 / x) if q > 0.0 else 1.0
    return math.log(max(top, zero))


@lru_cache(maxsize=256)
def rqm_xmax(eps: float, q: float, levels: int = 3) -> float:
    """``X_max`` with ``rqm_epsilon(X_max, q) = eps`` (closed form for 2 levels, else brentq)."""
    e = positive(eps)
    if levels == 2 or q == 0.0:
        return 1.0 / math.tanh(e / 2.0)
    lo = 1.0 + 1e-15
    hi = 2.0
    while rqm_epsilon(hi, q, levels) > e:
        hi *= 2.0
        if hi > 1e300:
            raise ValueError(f"no X_max reaches eps = {e} with q = {q}")
    return float(brentq(lambda x: rqm_epsilon(x, q, levels) - e, lo, hi, xtol=1e-14, rtol=1e-15))


def _worst_variance(eps: float, q: float) -> float:
    """``max_{|x| <= 1} q X |x| + (1 - q) X^2 - x^2`` at the calibrated ``X`` (at ``x = qX/2``)."""
    x_max = rqm_xmax(eps, q)
    x = min(1.0, q * x_max / 2.0)
    return q * x_max * x + (1.0 - q) * x_max**2 - x * x


@lru_cache(maxsize=256)
def rqm_optimal_q(eps: float) -> float:
    """The ``q`` in ``[0, MAX_Q]`` that minimises the worst-case variance of 3-level RQM at eps."""
    e = positive(eps)
    res = minimize_scalar(
        lambda q: _worst_variance(e, float(q)),
        bounds=(0.0, MAX_Q),
        method="bounded",
        options={"xatol": 1e-6},
    )
    best = float(res.x)
    # The bounded search never evaluates the end point q = 0 (two levels in two bits).
    return 0.0 if _worst_variance(e, 0.0) <= _worst_variance(e, best) else best


class RQM(FiniteMechanism):
    """RQM with 2 or 3 levels calibrated to pure ``eps``-LDP per coordinate (module docstring).

    Parameters
    ----------
    eps : float
        Per-coordinate ``eps > 0``.
    levels : int
        2 (``{-X, X}``, 1 bit) or 3 (``{-X, 0, X}``, 2 bits).
    q : float
        Probability in ``[0, 1)`` that level 0 is kept (3 levels only).
    """

    def __init__(self, eps: float, levels: int = 2, q: float = 0.0) -> None:
        self.eps = positive(eps)
        if levels not in RQM_LEVELS:
            raise ValueError(f"levels must be one of {RQM_LEVELS}, got {levels!r}")
        self.q = probability(q, "q", lo_open=False, hi_open=True) if levels == 3 else 0.0
        self.xmax = rqm_xmax(self.eps, self.q, levels)
        self.levels = (
            np.array([-self.xmax, self.xmax])
            if levels == 2
            else np.array([-self.xmax, 0.0, self.xmax])
        )

    def probabilities(self, x: torch.Tensor) -> torch.Tensor:
        """The laws of the module docstring (``float64 [..., K]``)."""
        x = x.to(torch.float64)
        big = self.xmax
        up = (big + x) / (2.0 * big)
        if self.num_levels == 2:
            return torch.stack([1.0 - up, up], dim=-1)
        q, a = self.q, x.abs() / big
        p_top = (1.0 - q) * up + q * torch.where(x > 0, a, torch.zeros_like(a))
        p_bottom = (1.0 - q) * (1.0 - up) + q * torch.where(x < 0, a, torch.zeros_like(a))
        return torch.stack([p_bottom, q * (1.0 - a), p_top], dim=-1)

    def epsilon(self) -> float:
        """:func:`rqm_epsilon` at this ``X_max`` and ``q``."""
        return rqm_epsilon(self.xmax, self.q, self.num_levels)
