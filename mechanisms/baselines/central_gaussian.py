r"""Gaussian central DP: the server adds the noise to the aggregate (DP-FedAvg).

McMahan, Ramage, Talwar & Zhang, "Learning differentially private recurrent language models"
(ICLR 2018, arXiv:1710.06963), the Gaussian sum query of DP-FedAvg: each client clips its update
``Delta_i = w_i - w_g`` to L2 norm ``C``, the server adds ``N(0, z^2 C^2 I)`` to their sum and
divides by the round's cohort size ``n`` (fixed before any update is seen):

.. math::
    \bar\Delta = \frac1n\Bigl(\sum_i \Delta_i \min\bigl(1, C / \|\Delta_i\|_2\bigr)
    + \mathcal N(0, z^2 C^2 I)\Bigr).

**Trust.** The server sees every clipped update in the clear and is trusted to add the noise:
there is no privacy against the server, nor on the uplink (only TLS hides the update). The
guarantee is *central*, user level (add or remove one client's data): the sequence of global
models, which every client receives, is ``(eps, delta)``-DP.

**Accounting.** Adding or removing one client changes the sum by at most ``C``, so one round is
a Gaussian mechanism with ``mu = C / (z C) = 1 / z`` (``mu``-GDP, Dong, Roth & Su 2022), and
``T`` rounds compose exactly to ``mu_T = sqrt(T) / z``. The worst case is assumed: the client
takes part in every round (no amplification by sampling is claimed). Its exact privacy profile
is that of one Gaussian (Balle & Wang 2018, Theorem 8; :func:`gaussian_delta`), so

.. math:: z = \sqrt T\,\sigma_1(\epsilon, \delta),

with ``sigma_1`` the analytic Gaussian calibration at sensitivity 1
(:func:`analytic_gaussian_sigma`): the smallest ``z`` whose ``T`` rounds are ``(eps, delta)``-DP.
"""

from __future__ import annotations

import math

import torch

from corbin_fl.mechanisms.analytic_gaussian import central_epsilon, central_noise_multiplier
from corbin_fl.mechanisms.baselines.hooks import Block, EncodeJob, Settings
from corbin_fl.mechanisms.validate import positive, torch_generator

__all__ = [
    "block_release",
    "central_epsilon",
    "central_noise",
    "central_noise_multiplier",
    "clip_l2",
    "server_noise",
    "update_bound",
]


def clip_l2(delta: torch.Tensor, clip: float) -> torch.Tensor:
    """``Delta min(1, C / ||Delta||_2)`` (a new tensor; the norm is taken in float64)."""
    c = positive(clip, "clip")
    norm = float(torch.linalg.vector_norm(delta.to(torch.float64)))
    if not math.isfinite(norm):
        raise ValueError("the update has a non-finite entry")
    return delta * (c / norm) if norm > c else delta.clone()


def central_noise(
    shape: tuple[int, ...], z: float, clip: float, *, generator: torch.Generator | None = None
) -> torch.Tensor:
    """``N(0, (z C)^2)`` of ``shape`` in float64 (``generator`` None: seeded from the CSPRNG).

    The server's noise must be unpredictable to everyone else: pass None in production; an
    injected generator is for tests.
    """
    sigma = positive(z, "z") * positive(clip, "clip")
    g = torch_generator(generator, torch.device("cpu"))
    return sigma * torch.randn(shape, generator=g, dtype=torch.float64)


def block_release(job: EncodeJob) -> Block:
    """The client's release (:data:`.hooks.BlockRelease`): the update ``w_i - w_g`` clipped to
    L2 norm ``central-clip`` as a whole (float32), block by block. No noise: the server adds
    it (the client trusts the server; its policy must admit the mechanism explicitly)."""
    clipped = clip_l2(job.w, job.cfg.param("central-clip")).to(torch.float32)
    return lambda s, c, r: clipped[s]


def update_bound(cfg: Settings) -> float:
    """``C = central-clip`` (:data:`.hooks.UpdateBound`): the sensitivity of the server's sum
    that the accounting assumes."""
    return float(cfg.param("central-clip"))


def server_noise(cfg: Settings, m: int, generator: torch.Generator | None) -> torch.Tensor:
    """``N(0, (z C)^2 I_m)`` (:data:`.hooks.ServerNoise`), ``z`` for (epsilon, delta) over
    ``num-rounds`` rounds (:func:`central_noise_multiplier`)."""
    z = central_noise_multiplier(cfg.epsilon, cfg.delta, cfg.num_rounds)
    return central_noise((m,), z, update_bound(cfg), generator=generator)
