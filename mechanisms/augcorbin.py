r"""AugCorBin-FL against a server that sees only the sum of the clients' bits (secure aggregation).

AugCorBin-FL (CorBin-FL, Salehi et al., arXiv:2409.13133, Section 5): each round a fraction
``gamma`` of the clients quantizes independently (LDPQ, Algorithm 1) and the others in CorBinQ
pairs (Algorithm 2); the server draws the roles (:func:`corbin_fl.mechanisms.pairing.
independent_split`, ``n_ind = floor(gamma n + 1/2)``) and sees them. This module is its math
against the sum ``S`` that secure aggregation shows the server (threat model B), with the method
of :mod:`corbin_fl.mechanisms.secure_sum` (worst case at the vertices of the probability box,
both directions, composed with a dominating privacy-loss distribution); the registry's entry
declares :func:`augcorbin_guarantee` as its privacy category's guarantee against the sum.

The paper's eq. (5) is not a bound
----------------------------------
The paper's Theorem 3 bounds the aggregate by eq. (5), which is not a valid bound: it grows with
the radius ``r`` although the mechanism's law depends only on ``(w - c)/r``, and a realisable
configuration beats it by up to 200 times (:func:`corbin_fl.mechanisms.theory.eq5_as_printed`,
:func:`augcorbin_round_lower_bound`, README "AugCorBin-FL's eq. (5) is not a bound"). Nothing
here uses it.

The exact worst case (an upper bound)
-------------------------------------
:func:`augcorbin_profile` applies secure_sum's exact worst-case method, per parameter and given
the round's roles: an independent client is the one-bit pair of
:func:`corbin_fl.mechanisms.secure_sum.one_bit_profile` with ``n_ind - 1`` independent others
(``P_k = Bern(b) * Bin(k, b) * Bin(n_ind - 1 - k, a)``, ``Q_k = Bern(a) * (same)``,
``a = 1/(e^eps_p + 1)``, ``b = 1 - a``); a paired client, given its partner's bit, emits a bit
whose conditional law can be a point mass, so its worst case is ``(1 + Y, 0 + Y)`` with ``Y``
the sum of the ``n_ind`` independent clients (the other pairs' sums are independent of it and
can be deterministic, so they are dropped: post-processing). Its ``(eps, delta)`` is the maximum
over both cases, composed like secure_sum's others (:func:`augcorbin_guarantee`). A malicious
client (threat model C) knows its own bit: the figures hold for it at one independent client
fewer.

A realisable configuration (a lower bound)
------------------------------------------
:func:`augcorbin_round_pair` is one configuration AugCorBin-FL can be run on, and
:func:`augcorbin_round_lower_bound` its exact ``eps`` over the ``m`` parameters of one round
(:func:`corbin_fl.mechanisms.lower_bounds.composed_epsilon`, optimistic rounding): a lower bound
on the true per-round ``eps`` against the sum, which eq. (5) falls below
(``tests/unit/test_lower_bounds.py``).
"""

from __future__ import annotations

import copy
import functools
import math
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy import stats

from corbin_fl.mechanisms.lower_bounds import DISCRETIZATION, composed_epsilon
from corbin_fl.mechanisms.secure_sum import (
    SumProfile,
    VertexFamily,
    composed_report,
    rr_range,
    run_args,
)
from corbin_fl.mechanisms.validate import integer, positive

__all__ = [
    "SUM_NOTE",
    "augcorbin_guarantee",
    "augcorbin_profile",
    "augcorbin_round_lower_bound",
    "augcorbin_round_pair",
]

SUM_NOTE = (
    "AugCorBin-FL against the sum: the exact worst case of mechanisms/augcorbin.py "
    "(augcorbin_profile) at the fewest independent clients in an unmasked sum, composed with "
    "dp_accounting's PLD; nothing from the paper's eq. (5) (not a valid bound)"
)
"""How :func:`augcorbin_guarantee` computes, as a run's privacy report notes it (its ``note``)."""


# =================================================================================== upper bound


def augcorbin_profile(
    eps_p: float,
    n: int,
    gamma: float,
    *,
    independent: int | None = None,
    paired: bool | None = None,
) -> SumProfile:
    """Exact per-parameter worst case of AugCorBin-FL against the sum (module docstring).

    ``n_ind = floor(gamma n + 1/2)`` clients quantize independently (``mechanisms/pairing.py``),
    or ``independent`` when given (a run's records: clients that quantized with LDPQ, whether
    drawn independent, unpaired or left without a partner); an odd leftover client adds noise and
    is ignored (sound). Independent client: the one-bit pair with ``n_ind - 1`` independent
    others; paired client: ``(1 + Y, 0 + Y)``, ``Y`` the sum of ``n_ind`` independent bits (it
    needs ``n - n_ind >= 2`` paired clients to occur, or ``paired`` when given).
    """
    n = integer(n, "n", 1)
    g = float(gamma)
    if not 0.0 <= g <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma!r}")
    a, b = rr_range(eps_p)
    n_ind = math.floor(g * n + 0.5) if independent is None else int(independent)
    if not 0 <= n_ind <= n:
        raise ValueError(f"independent must be in [0, n = {n}], got {independent!r}")
    fams = []
    if n_ind >= 1:
        fams.append(VertexFamily("independent", 1, b, a, n_ind - 1, a, b))
    if (n - n_ind >= 2) if paired is None else paired:
        fams.append(VertexFamily("paired", 1, 1.0, 0.0, n_ind, a, b))
    return SumProfile("augcorbin", n, tuple(fams), float(eps_p))


def augcorbin_guarantee(
    eps_p: float,
    n: int,
    gamma: float,
    m: int,
    rounds: int,
    delta: float,
    *,
    independent: int | None = None,
    paired: bool | None = None,
    max_exact_n: int | None = None,
) -> dict[str, Any]:
    """AugCorBin-FL against the sum: the exact worst case (:func:`augcorbin_profile`), composed.

    Returns ``{"mechanism", "n", "gamma", "independent", "independent_from", "dp", "note"}`` and,
    when some client's case exists, ``exact`` (the blocks of
    :func:`corbin_fl.mechanisms.secure_sum.one_bit_guarantee`, plus ``independent``: the count
    the profile was computed at). ``dp`` is whether the composed run is finite: it needs enough
    independent clients for the ``+infinity`` atoms of the paired case to stay below ``delta``.
    ``note`` is :data:`SUM_NOTE`. The paper's eq. (5) is not used (module docstring).

    ``gamma`` is the configured fraction, reported as given. ``independent``: the number of
    clients in the sum that quantize independently, when it is known (a run's records: the
    fewest in any round); default ``floor(gamma n + 1/2)``, as ``mechanisms/pairing.py`` draws
    it. ``independent_from`` says which (``"records"`` or ``"floor(gamma n + 1/2)"``): at small
    ``n`` the drawn share ``independent / n`` differs from ``gamma`` (``n = 3``,
    ``gamma = 0.2``: 1 of 3). ``paired``: whether a paired client is in some sum (default:
    ``n - independent >= 2``). ``max_exact_n`` caps the independent clients of the exact
    profile (sound: fewer independent clients is a worse case;
    :data:`corbin_fl.mechanisms.secure_sum.REPORT_MAX_N`). Cached.
    """
    g = float(gamma)
    if not 0.0 <= g <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma!r}")
    n = integer(n, "n", 1)
    if independent is not None:
        if isinstance(independent, bool) or not isinstance(independent, int | np.integer):
            raise TypeError(f"independent must be an int, got {type(independent).__name__}")
        if not 0 <= int(independent) <= n:
            raise ValueError(f"independent must be in [0, n = {n}], got {independent!r}")
        independent = int(independent)
    cap = None if max_exact_n is None else integer(max_exact_n, "max_exact_n", 1)
    key = (
        positive(eps_p, "eps_p"),
        n,
        g,
        *run_args(m, rounds, delta),
        independent,
        None if paired is None else bool(paired),
        cap,
    )
    return copy.deepcopy(_augcorbin_cached(*key))


@functools.lru_cache(maxsize=32)
def _augcorbin_cached(
    eps_p: float,
    n: int,
    gamma: float,
    m: int,
    rounds: int,
    delta: float,
    independent: int | None,
    paired: bool | None,
    cap: int | None,
) -> dict[str, Any]:
    n_ind = math.floor(gamma * n + 0.5) if independent is None else independent
    out: dict[str, Any] = {
        "mechanism": "augcorbin",
        "n": n,
        "gamma": gamma,
        "independent": n_ind,
        "independent_from": "floor(gamma n + 1/2)" if independent is None else "records",
        "note": SUM_NOTE,
    }
    has_paired = n - n_ind >= 2 if paired is None else paired
    n_exact = n_ind if cap is None else min(n_ind, cap)
    prof = augcorbin_profile(eps_p, n, gamma, independent=n_exact, paired=has_paired)
    out["dp"] = False
    if prof.families:
        out["exact"] = composed_report("augcorbin", prof, m, rounds, delta)
        out["exact"]["independent"] = n_exact
        out["dp"] = math.isfinite(out["exact"]["all_rounds"]["eps"])
    return out


# =================================================================================== lower bound


def augcorbin_round_pair(
    eps_p: float, n_ind: int
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    r"""The per-parameter pair of the realisable AugCorBin-FL configuration against the sum.

    The server draws the roles (``mechanisms/pairing.py``) and sees them; eq. (5) depends on the
    roles only through ``n gamma`` and its proof conditions on them. Fix a round's roles with
    ``n_ind`` independent (LDPQ) clients. Configuration (``alpha = coth(eps_p/2)``,
    ``a = 1/(1 + e^eps_p)``, ``b = 1 - a``):

    * every paired client has ``w = c`` (``q = 1/2``): with ``d >= 1`` shared bits its pair's
      bits are ``[Z < 2^(d-1)]`` and ``[Z >= 2^(d-1)]`` (Algorithm 2; no tie coin since
      ``2^d q`` is an integer), which sum to exactly 1: a constant the server subtracts;
    * the other ``n_ind - 1`` independent clients have ``w = c - r`` (``P(bit = 1) = a``);
    * the client under test is independent, with ``w = c + r`` (``P(1) = b``) or ``w' = c - r``
      (``P(1) = a``).

    The sum is then ``const + X + Y``, ``X ~ Bern(b)`` or ``Bern(a)``, ``Y ~ Bin(n_ind - 1, a)``:

        ``P = Bern(b) * Bin(n_ind - 1, a)``,  ``Q = Bern(a) * Bin(n_ind - 1, a)``

    (``*``: convolution),

    computed exactly from the binomial pmfs (SciPy).

    Parameters
    ----------
    eps_p : float
        Per-parameter budget, ``> 0``.
    n_ind : int
        Independent clients in the sum, the client under test included, ``>= 1``.

    Returns
    -------
    (ndarray, ndarray)
        ``P`` and ``Q`` on the outcomes ``0..n_ind`` of ``X + Y``.
    """
    e = positive(eps_p, "eps_p")
    n_ind = integer(n_ind, "n_ind", 1)
    a = 1.0 / (1.0 + math.exp(e)) if e < 700 else math.exp(-e)
    b = 1.0 - a
    y = stats.binom.pmf(np.arange(n_ind), n_ind - 1, a) if n_ind > 1 else np.ones(1)
    return np.convolve([1.0 - b, b], y), np.convolve([1.0 - a, a], y)


def augcorbin_round_lower_bound(
    eps_p: float, n_ind: int, m: int, delta: float, *, discretization: float = DISCRETIZATION
) -> float:
    r"""Lower bound on AugCorBin-FL's true per-round ``eps`` against the sum, ``m`` parameters.

    The pair of :func:`augcorbin_round_pair` for each of the ``m`` parameters (the client under
    test moves every parameter from ``c - r`` to ``c + r``; the parameters' randomness is
    independent), composed ``m`` times with
    :func:`corbin_fl.mechanisms.lower_bounds.composed_epsilon` (optimistic rounding), both
    directions. The configuration is realisable whatever the radius ``r``, and its ``eps`` does
    not depend on ``r`` (nor on ``d >= 1`` or on how many clients are paired).

    Parameters
    ----------
    eps_p : float
        Per-parameter budget.
    n_ind : int
        Independent clients in the sum, ``>= 1`` (``floor(gamma n + 1/2)`` as the pairing draws).
    m : int
        Parameters released per round.
    delta : float
        In ``(0, 1)``.
    discretization : float, optional
        Loss grid of the optimistic PLD.

    Returns
    -------
    float
        ``eps`` with ``eps <= `` the true per-round ``eps`` of AugCorBin-FL against the sum.
    """
    p, q = augcorbin_round_pair(eps_p, n_ind)
    return composed_epsilon(p, q, integer(m, "m", 1), delta, discretization=discretization)
