r"""Laplace mechanism baseline (Dwork, McSherry, Nissim & Smith 2006).

Each parameter is clipped into ``[c - r, c + r]``, so its (L1 = L-infinity) sensitivity is
``2 r``, and released as ``w + Laplace(0, b)`` with ``b = 2 r / eps``: the density ratio of the
outputs for two inputs is at most ``exp(|w - w'| / b) <= e^eps``, i.e. ``eps``-DP per parameter
(pure PLDP, CorBin-FL eq. (3); the paper's Laplace baseline, [34]).

Sampling uses the inverse CDF on ``float64`` uniforms from the injected generator: with
``u ~ U[0, 1)``, the sign is ``-1`` if ``u < 1/2`` (else ``+1``), ``t = 2u mod 1 ~ U[0, 1)``
and ``|X| = -b log(1 - t)`` (``1 - t > 0``, so the sample is always finite).

Aggregation: the released values are unbiased estimates of the clipped weights
(``E = clip(w)``, ``Var = 2 b^2``); the server averages them directly.
"""

from __future__ import annotations

import logging
from numbers import Real

import torch

from corbin_fl.mechanisms.baselines._common import clip_to_box, prepare
from corbin_fl.mechanisms.baselines.hooks import Block, EncodeJob, Settings
from corbin_fl.mechanisms.validate import positive, torch_generator

logger = logging.getLogger(__name__)

__all__ = ["LAPLACE_TAIL_K", "block_release", "laplace", "laplace_scale", "release_limit"]

LAPLACE_TAIL_K = 75.0
"""The server admits a release at most ``LAPLACE_TAIL_K`` noise scales outside the clip box
(:func:`release_limit`); ``P(|Lap(b)| > 75 b) = e^-75 < 3e-33`` per parameter."""


def laplace_scale(r: torch.Tensor | float, eps: float) -> torch.Tensor | float:
    """Laplace scale ``b = 2 r / eps`` for per-parameter sensitivity ``2 r`` (Dwork et al. 2006).

    Parameters
    ----------
    r : torch.Tensor or float
        Radius ``r > 0``.
    eps : float
        Per-parameter ``eps > 0``.

    Returns
    -------
    torch.Tensor or float
        ``b`` (same type as ``r``).
    """
    e = positive(eps)
    if isinstance(r, torch.Tensor):
        if r.numel() and not bool(((r > 0) & torch.isfinite(r)).all()):
            raise ValueError("r must be finite and > 0 everywhere")
        return 2.0 * r / e
    if isinstance(r, bool) or not isinstance(r, Real):
        raise TypeError(f"r must be a tensor or a real number, got {type(r).__name__}")
    if not (float(r) > 0.0 and float(r) < float("inf")):
        raise ValueError(f"r must be finite and > 0, got {r!r}")
    return 2.0 * float(r) / e


def laplace(
    w: torch.Tensor | float,
    c: torch.Tensor | float,
    r: torch.Tensor | float,
    eps: float,
    *,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    r"""Per-parameter ``eps``-DP Laplace mechanism on clipped weights.

    .. math:: \mathrm{out} = \mathrm{clip}(w, c - r, c + r) + X,\qquad
              X \sim \mathrm{Laplace}(0, b),\; b = 2r/\epsilon .

    Parameters
    ----------
    w, c, r : torch.Tensor or float
        Weights, centers and radii (``r > 0``), broadcast together.
    eps : float
        Per-parameter ``eps > 0``.
    generator : torch.Generator, optional
        Noise source on the tensors' device; ``None`` uses a fresh generator seeded from the OS
        CSPRNG.

    Returns
    -------
    torch.Tensor
        ``float32`` noisy weights of the broadcast shape.
    """
    e = positive(eps)
    wt, ct, rt = prepare(w, c, r)
    g = torch_generator(generator, wt.device)
    u = torch.rand(wt.shape, generator=g, dtype=torch.float64, device=wt.device)
    neg = u < 0.5
    t = torch.where(neg, 2.0 * u, 2.0 * u - 1.0)
    magnitude = -torch.log1p(-t)
    x = torch.where(neg, -magnitude, magnitude)
    b = (2.0 / e) * rt.to(torch.float64)
    return clip_to_box(wt, ct, rt) + (x * b).to(wt.dtype)


def block_release(job: EncodeJob) -> Block:
    """The client's release of one range block (:data:`.hooks.BlockRelease`):
    ``clip(w) + Lap(2 r / eps)``."""
    w, gen, cfg = job.w, job.gen, job.cfg
    return lambda s, c, r: laplace(w[s], c, r, cfg.epsilon, generator=gen)


def release_limit(cfg: Settings, c: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """``r + LAPLACE_TAIL_K b``, ``b = 2 r / eps`` (:data:`.hooks.ReleaseLimit`)."""
    return r + LAPLACE_TAIL_K * laplace_scale(r, cfg.epsilon)
