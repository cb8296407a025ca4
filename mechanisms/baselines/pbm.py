r"""The Poisson binomial mechanism, pure-LDP per coordinate (Chen, Ozgur & Kairouz, ICML 2022).

Chen, Ozgur & Kairouz, "The Poisson binomial mechanism for unbiased federated learning with
secure aggregation" (ICML 2022, arXiv:2108.09449), Algorithm 1, for one client and one
coordinate, with ``x = (clip(w) - c) / r`` in ``[-1, 1]``:

.. math::
    p(x) = \tfrac12 + \theta x, \qquad Z \sim \mathrm{Binomial}(m, p(x)), \qquad
    \hat x = \frac{1}{m\theta}\Bigl(Z - \frac m2\Bigr),

so ``E[x_hat] = x`` (the unbiased decode) and ``Var[x_hat] = (1/4 - theta^2 x^2) / (m theta^2)``.
The paper relies on secure aggregation and accounts for the sum; here each client's ``Z`` is
seen by the server, so the guarantee is the local one. The likelihood ratio of ``Z = k`` is
largest at ``k = m`` (or 0) between ``x = 1`` and ``x = -1``:

.. math::
    \epsilon = m \log\frac{1/2 + \theta}{1/2 - \theta} = 2m\,\mathrm{artanh}(2\theta)
    \quad\Longleftrightarrow\quad \theta = \tfrac12 \tanh\frac{\epsilon}{2m} ,

the calibration used here. ``Z`` takes ``m + 1`` values: ``ceil(log2(m + 1))`` bits rounded up to
1, 2, 4 or 8 (m = 1: one bit; m = 2 or 3: two bits). With ``m = 1`` the law is LDPQ's (CorBin-FL
Alg. 1): ``P(Z = 1) = 1/2 + x tanh(eps/2) / 2`` and ``x_hat = +-1/tanh(eps/2) = +-alpha(eps)``.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from corbin_fl.mechanisms.baselines.levels import FiniteMechanism
from corbin_fl.mechanisms.validate import integer, positive

__all__ = ["PBM", "pbm_theta"]

MAX_TRIALS = 255
"""Largest ``m`` whose ``m + 1`` symbols fit one byte."""


def pbm_theta(eps: float, trials: int) -> float:
    """``theta = tanh(eps / (2 m)) / 2``: the PBM parameter whose pure-LDP epsilon is ``eps``."""
    e = positive(eps)
    m = integer(trials, "trials", 1)
    return 0.5 * math.tanh(e / (2.0 * m))


class PBM(FiniteMechanism):
    """PBM with ``m`` trials calibrated to pure ``eps``-LDP per coordinate (module docstring).

    Parameters
    ----------
    eps : float
        Per-coordinate ``eps > 0``.
    trials : int
        ``m`` in ``[1, 255]``.
    """

    def __init__(self, eps: float, trials: int) -> None:
        self.eps = positive(eps)
        self.trials = integer(trials, "trials", 1)
        if self.trials > MAX_TRIALS:
            raise ValueError(f"trials must be <= {MAX_TRIALS}, got {self.trials}")
        self.theta = pbm_theta(self.eps, self.trials)
        m = self.trials
        self.levels = (np.arange(m + 1, dtype=np.float64) - m / 2.0) / (m * self.theta)
        self._comb = torch.tensor(
            [float(math.comb(m, k)) for k in range(m + 1)], dtype=torch.float64
        )

    def trial_probability(self, x: torch.Tensor) -> torch.Tensor:
        """``p(x) = 1/2 + theta x`` (Chen et al., Alg. 1), ``float64``, clamped into ``[0, 1]``."""
        return (0.5 + self.theta * x.to(torch.float64)).clamp(0.0, 1.0)

    def probabilities(self, x: torch.Tensor) -> torch.Tensor:
        """``P(Z = k | x) = C(m, k) p^k (1 - p)^(m - k)``, ``p = 1/2 + theta x``."""
        p = self.trial_probability(x)[..., None]
        k = torch.arange(self.trials + 1, dtype=torch.float64, device=x.device)
        # Plain powers (exact for m = 1: P(Z = 1) = p, LDPQ's law to the last bit).
        return self._comb.to(x.device) * p**k * (1.0 - p) ** (self.trials - k)

    def boundaries(self, x: torch.Tensor) -> torch.Tensor:
        """``F_0 = 1 - p`` for ``m = 1`` (LDPQ's single coin), the general inner CDF otherwise.

        Bit for bit the general form: :meth:`probabilities` at ``m = 1`` is ``(1 * p^0) (1 - p)^1
        = 1 - p`` and ``(1 * p^1) (1 - p)^0 = p`` (torch's ``pow`` returns ``1`` and ``p``
        exactly at exponents 0 and 1, which the tests check on every ``x`` they draw), and a
        cumulative sum's first entry is the entry itself. This form skips the ``pow`` calls,
        about two thirds of a release's time (docs/BENCHMARKS.md, ``bench_mechanisms.py``)."""
        if self.trials != 1:
            return super().boundaries(x)
        return (1.0 - self.trial_probability(x))[:, None]

    def epsilon(self) -> float:
        """``m log((1/2 + theta) / (1/2 - theta))``: the ratio of ``Z = m`` at ``x = 1, -1``."""
        return self.trials * math.log((0.5 + self.theta) / (0.5 - self.theta))
