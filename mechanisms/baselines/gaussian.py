r"""Gaussian mechanism baseline, calibrated with the analytic Gaussian of Balle & Wang (2018).

Each parameter is clipped into ``[c - r, c + r]`` (so its sensitivity is ``D = 2 r``) and
released as ``w + N(0, sigma^2)`` with the smallest ``sigma`` for which the release is
``(eps, delta)``-DP per parameter (CorBin-FL Experiment 1 uses this baseline, citing [33]).

Calibration (Balle & Wang, "Improving the Gaussian mechanism for differential privacy:
analytical calibration and optimal denoising", ICML 2018, Theorem 8 / Algorithm 1): the
Gaussian mechanism with L2 sensitivity ``D`` and noise ``sigma`` is ``(eps, delta)``-DP iff

.. math:: \Phi\Big(\frac{D}{2\sigma} - \frac{\epsilon\sigma}{D}\Big)
          - e^{\epsilon}\,\Phi\Big(-\frac{D}{2\sigma} - \frac{\epsilon\sigma}{D}\Big)
          \le \delta .

The left side depends on ``D, sigma`` only through ``mu = D / sigma`` (it is the privacy profile
of ``mu``-GDP) and decreases in ``sigma``; :func:`analytic_gaussian_sigma` bisects on it in
float64 with ``math.erfc`` (no SciPy at runtime) and rounds up. That math (with
:func:`gaussian_delta`, :func:`gaussian_epsilon` and :func:`log_ndtr`) lives in the torch-free
:mod:`corbin_fl.mechanisms.analytic_gaussian`, so that the accountant imports it without torch;
this module re-exports it.

Aggregation: the released values are unbiased estimates of the clipped weights; the server
averages them as they are (no decoding step).
"""

from __future__ import annotations

import torch

from corbin_fl.mechanisms.analytic_gaussian import (
    analytic_gaussian_sigma,
    gaussian_delta,
    gaussian_epsilon,
    log_ndtr,
)
from corbin_fl.mechanisms.baselines._common import (
    clip_to_box,
    prepare,
)
from corbin_fl.mechanisms.baselines.hooks import Block, EncodeJob, Settings
from corbin_fl.mechanisms.validate import torch_generator

__all__ = [
    "GAUSS_TAIL_Z",
    "analytic_gaussian_sigma",
    "block_release",
    "gaussian",
    "gaussian_delta",
    "gaussian_epsilon",
    "log_ndtr",
    "release_limit",
]

GAUSS_TAIL_Z = 12.0
"""The server admits a release at most ``GAUSS_TAIL_Z`` noise standard deviations outside the
clip box (:func:`release_limit`); ``P(|N(0, 1)| > 12) = erfc(12 / sqrt 2) < 4e-33`` per
parameter."""


def gaussian(
    w: torch.Tensor | float,
    c: torch.Tensor | float,
    r: torch.Tensor | float,
    eps: float,
    delta: float,
    *,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    r"""Per-parameter ``(eps, delta)``-DP Gaussian mechanism on clipped weights.

    ``out = clip(w, c - r, c + r) + N(0, sigma^2)`` with
    ``sigma = analytic_gaussian_sigma(eps, delta, 2 r)`` (elementwise in ``r``; ``sigma`` is
    linear in the sensitivity, so it is ``2 r`` times the unit-sensitivity solution).
    ``E[out] = clip(w)``; ``Var[out] = sigma^2``.

    Parameters
    ----------
    w, c, r : torch.Tensor or float
        Weights, centers and radii (``r > 0``), broadcast together (per element or per layer).
    eps : float
        Per-parameter ``eps > 0``.
    delta : float
        Per-parameter ``delta`` in ``(0, 1)``.
    generator : torch.Generator, optional
        Noise source on the tensors' device; ``None`` uses a fresh generator seeded from the OS
        CSPRNG.

    Returns
    -------
    torch.Tensor
        ``float32`` noisy weights of the broadcast shape on the tensors' device.
    """
    sigma_unit = analytic_gaussian_sigma(eps, delta, 1.0)
    wt, ct, rt = prepare(w, c, r)
    g = torch_generator(generator, wt.device)
    noise = torch.randn(wt.shape, generator=g, dtype=wt.dtype, device=wt.device)
    return clip_to_box(wt, ct, rt) + noise * (2.0 * sigma_unit) * rt


def block_release(job: EncodeJob) -> Block:
    """The client's release of one range block (:data:`.hooks.BlockRelease`):
    ``clip(w) + N(0, sigma^2)``, the analytic sigma for (eps, delta)."""
    w, gen, cfg = job.w, job.gen, job.cfg
    return lambda s, c, r: gaussian(w[s], c, r, cfg.epsilon, cfg.delta, generator=gen)


def release_limit(cfg: Settings, c: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """``r + GAUSS_TAIL_Z sigma`` (:data:`.hooks.ReleaseLimit`): ``clip(w)`` lies in
    ``[c - r, c + r]`` and its noise has ``sigma = 2 r sigma_1(eps, delta)`` (unit
    sensitivity)."""
    sigma = 2.0 * analytic_gaussian_sigma(cfg.epsilon, cfg.delta, 1.0) * r
    return r + GAUSS_TAIL_Z * sigma
