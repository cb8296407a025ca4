r"""Ternary stochastic compressor (Definition 6 of the f-DP discrete-mechanisms paper).

Jin, Su, Zhong, Zhang, Quek & Dai, "Breaking the communication-privacy-accuracy tradeoff with
f-differential privacy" (NeurIPS 2023, arXiv:2302.09624), Definition 6, eq. (12): for ``x`` in
``[-c, c]``

.. math::
    \mathrm{ternary}(x, A, B) = \begin{cases} +1 & \text{w.p. } \frac{A + x}{2B} \\
    0 & \text{w.p. } 1 - \frac{A}{B} \\ -1 & \text{w.p. } \frac{A - x}{2B} \end{cases}

with ``B >= A > c``; ``B t`` is unbiased for ``x`` with variance ``A B - x^2`` (Section 6).

Here ``x = clip(w) - c_center`` lies in ``[-r, r]`` (the paper's ``c`` is our radius ``r``), and
``A`` is chosen from the per-parameter budget so that the extreme likelihood ratio of the
non-zero outputs equals ``e^eps``:

.. math:: \frac{A + r}{A - r} = e^{\epsilon} \iff A = r\,\alpha(\epsilon),

which is the slope at the end points of the trade-off function of Theorem 3 (eq. 13), i.e. the
mechanism is pure ``eps``-DP per parameter, the same PLDP as LDPQ. The sparsity is
``p0 = 1 - A/B`` (``B = A / (1 - p0)``): zeros need not be sent, and Theorem 3 shows the
sparsification strictly improves the trade-off in its middle segment. With ``p0 = 0`` the
compressor is LDPQ with outputs ``c -/+ r alpha``.

Decoding (unbiased): ``c + B t``.
"""

from __future__ import annotations

import logging
from numbers import Real

import numpy as np
import torch
from numpy.typing import ArrayLike, NDArray

from corbin_fl.mechanisms.baselines._common import (
    COMPUTE_DTYPE,
    clip_to_box,
    prepare,
)
from corbin_fl.mechanisms.baselines.hooks import Block, EncodeJob, Settings
from corbin_fl.mechanisms.quantizers import alpha
from corbin_fl.mechanisms.validate import positive, probability, torch_generator

logger = logging.getLogger(__name__)

__all__ = [
    "block_release",
    "decode_ternary",
    "encode_ternary",
    "pack",
    "sum_decode",
    "symbols",
    "ternary",
    "ternary_decode",
    "ternary_params",
    "ternary_tradeoff",
]


def ternary_params(
    r: torch.Tensor | float, eps: float, p0: float = 0.0
) -> tuple[torch.Tensor | float, torch.Tensor | float]:
    """Return ``(A, B)`` with ``A = r alpha(eps)`` and ``B = A / (1 - p0)``.

    Parameters
    ----------
    r : torch.Tensor or float
        Radius (the bound ``c`` of Definition 6), ``> 0``.
    eps : float
        Per-parameter ``eps > 0``.
    p0 : float, default 0
        Probability of a zero output, in ``[0, 1)``.

    Returns
    -------
    tuple
        ``(A, B)`` of the same type as ``r``.
    """
    e = positive(eps)
    p = probability(p0, "p0", lo_open=False, hi_open=True)
    if isinstance(r, torch.Tensor):
        if r.numel() and not bool(((r > 0) & torch.isfinite(r)).all()):
            raise ValueError("r must be finite and > 0 everywhere")
    elif isinstance(r, bool) or not isinstance(r, Real) or not 0 < float(r) < np.inf:
        raise ValueError(f"r must be a finite real > 0 or a tensor, got {r!r}")
    a_val = float(alpha(e))
    big_a = r * a_val
    return big_a, big_a / (1.0 - p)


def ternary(
    w: torch.Tensor | float,
    c: torch.Tensor | float,
    r: torch.Tensor | float,
    eps: float,
    p0: float = 0.0,
    *,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    r"""Ternary stochastic compressor with ``A = r alpha(eps)``, ``B = A / (1 - p0)``.

    One uniform ``u`` per element: ``+1`` if ``u < (A + x)/(2B)``, ``-1`` if
    ``u >= (A + x)/(2B) + p0``, else ``0`` (Definition 6, eq. 12), ``x = clip(w) - c``.

    Parameters
    ----------
    w, c, r : torch.Tensor or float
        Weights, centers and radii (``r > 0``), broadcast together.
    eps : float
        Per-parameter ``eps > 0`` (pure ``eps``-DP per parameter).
    p0 : float, default 0
        Sparsity, the probability of a ``0``, in ``[0, 1)``.
    generator : torch.Generator, optional
        Coin source on the tensors' device; ``None`` uses a fresh generator seeded from the OS
        CSPRNG.

    Returns
    -------
    torch.Tensor
        ``torch.int8`` in ``{-1, 0, 1}`` of the broadcast shape.
    """
    e = positive(eps)
    p = probability(p0, "p0", lo_open=False, hi_open=True)
    wt, ct, rt = prepare(w, c, r)
    g = torch_generator(generator, wt.device)
    a_val = float(alpha(e))
    x = (clip_to_box(wt, ct, rt) - ct).to(torch.float64)
    big_a = rt.to(torch.float64) * a_val
    big_b = big_a / (1.0 - p)
    p_plus = (big_a + x) / (2.0 * big_b)
    u = torch.rand(wt.shape, generator=g, dtype=torch.float64, device=wt.device)
    out = torch.zeros(wt.shape, dtype=torch.int8, device=wt.device)
    out[u < p_plus] = 1
    out[u >= p_plus + p] = -1
    return out


def ternary_decode(
    t: torch.Tensor,
    c: torch.Tensor | float,
    r: torch.Tensor | float,
    eps: float,
    p0: float = 0.0,
) -> torch.Tensor:
    """Unbiased decoding ``c + B t`` of :func:`ternary` (``E[B t] = x``, Section 6).

    Parameters
    ----------
    t : torch.Tensor
        ``int8`` output of :func:`ternary`.
    c, r, eps, p0
        The parameters used to compress.

    Returns
    -------
    torch.Tensor
        ``float32`` estimates of the clipped weights.
    """
    if not isinstance(t, torch.Tensor) or t.dtype not in (torch.int8, torch.int16, torch.int32):
        got = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
        raise TypeError(f"t must be an int8 tensor with values in {{-1, 0, 1}}, got {got}")
    tf = t.to(COMPUTE_DTYPE)
    _, ct, rt = prepare(tf, c, r)
    _, big_b = ternary_params(rt, eps, p0)
    return ct + big_b * tf


def ternary_tradeoff(alpha_grid: ArrayLike, A: float, B: float, c: float) -> NDArray[np.float64]:
    r"""Trade-off function ``f(alpha)`` of the ternary compressor (Theorem 3, eq. 13).

    .. math::
        f(\alpha) = \begin{cases}
        1 - \frac{A+c}{A-c}\alpha, & \alpha \in [0, \frac{A-c}{2B}] \\
        1 - \frac{c}{B} - \alpha, & \alpha \in [\frac{A-c}{2B}, 1 - \frac{A+c}{2B}] \\
        \frac{A-c}{A+c} - \frac{A-c}{A+c}\alpha, & \alpha \in [1 - \frac{A+c}{2B}, 1]
        \end{cases}

    ``alpha`` is the type I error of a test between two inputs and ``f(alpha)`` the smallest
    achievable type II error; here ``c`` is the *input bound* of Definition 6 (our radius ``r``),
    not the center.

    Parameters
    ----------
    alpha_grid : array_like
        Type I errors in ``[0, 1]``.
    A, B : float
        Compressor parameters, ``B >= A > c``.
    c : float
        Input bound ``c > 0``.

    Returns
    -------
    ndarray
        ``f(alpha)`` (float64, same shape as ``alpha_grid``).
    """
    x = np.asarray(alpha_grid, dtype=np.float64)
    if np.isnan(x).any() or np.any(x < 0.0) or np.any(x > 1.0):
        raise ValueError("alpha_grid must lie in [0, 1]")
    big_a, big_b, cc = float(A), float(B), float(c)
    if not (cc > 0.0 and big_a > cc and big_b >= big_a and np.isfinite(big_b)):
        raise ValueError(f"need B >= A > c > 0, got A={A!r}, B={B!r}, c={c!r}")
    ratio = (big_a + cc) / (big_a - cc)
    first_end = (big_a - cc) / (2.0 * big_b)
    last_start = 1.0 - (big_a + cc) / (2.0 * big_b)
    return np.where(
        x <= first_end,
        1.0 - ratio * x,
        np.where(x <= last_start, 1.0 - cc / big_b - x, (1.0 - x) / ratio),
    )


# ----------------------------------------------------------------------------- on the wire
def encode_ternary(t: np.ndarray, encoding: str) -> np.ndarray:
    """Wire form of ternary symbols (run config ``ternary-encoding``): ``int8`` as is, or 2 bits
    per symbol.

    ``bits``: the first ``m`` bits say ``t != 0``, the next ``m`` say ``t > 0``, packed MSB-first
    with ``np.packbits`` (``2m`` bits, ``ceil(2m/8)`` bytes).
    """
    if encoding == "int8":
        return t.astype(np.int8, copy=False)
    return np.packbits(np.concatenate([t != 0, t > 0]))


def decode_ternary(values: np.ndarray, m: int, encoding: str) -> np.ndarray:
    """Inverse of :func:`encode_ternary`.

    Raises
    ------
    ValueError
        If a symbol is outside {-1, 0, 1}, a padding bit is set, or a sign bit is set on a zero
        symbol (the server reports it as a bad update).
    """
    if encoding == "int8":
        if values.size and (values.min() < -1 or values.max() > 1):
            raise ValueError("ternary symbols must be in {-1, 0, 1}")
        return values.astype(np.int8)
    bits = np.unpackbits(values, count=2 * m)
    if np.unpackbits(values)[2 * m :].any():
        raise ValueError("update has non-zero padding bits")
    nonzero, positive = bits[:m].astype(bool), bits[m:].astype(bool)
    if (positive & ~nonzero).any():
        raise ValueError("ternary sign bit set on a zero symbol")
    return np.where(nonzero, np.where(positive, 1, -1), 0).astype(np.int8)


# ----------------------------------------------------------------------------- the hooks
def block_release(job: EncodeJob) -> Block:
    """The client's release of one range block (:data:`.hooks.BlockRelease`): the ternary
    symbols ``t`` in {-1, 0, 1} (int8) of ``clip(w)`` at ``ternary-sparsity``."""
    w, gen, cfg = job.w, job.gen, job.cfg
    sparsity = cfg.param("ternary-sparsity")
    return lambda s, c, r: ternary(w[s], c, r, cfg.epsilon, sparsity, generator=gen)


def pack(t: np.ndarray, cfg: Settings) -> np.ndarray:
    """The update's array (:data:`.hooks.Pack`): ``t`` in the run's ``ternary-encoding``."""
    return encode_ternary(t, cfg.param("ternary-encoding"))


def symbols(values: np.ndarray, m: int, cfg: Settings) -> np.ndarray:
    """The update's symbols ``t + 1`` in {0, 1, 2} (:data:`.hooks.Symbols`; int64), what the
    server and a secure sum add up; ValueError on a bad update."""
    return decode_ternary(values, m, cfg.param("ternary-encoding")).astype(np.int64) + 1


def sum_decode(
    total: torch.Tensor, n: int, c: torch.Tensor | float, r: torch.Tensor | float, cfg: Settings
) -> torch.Tensor:
    """``c + B (S - n) / n`` (:data:`.hooks.SumDecode`): the mean of the decoded ``c + B t`` of
    ``n`` clients from the sum ``S`` of their symbols ``t + 1`` (fdp paper Def. 6)."""
    _, big_b = ternary_params(r, cfg.epsilon, cfg.param("ternary-sparsity"))
    return c + big_b * ((total - n).to(torch.float64) / n)
