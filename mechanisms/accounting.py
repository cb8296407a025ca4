r"""Privacy accounting for CorBin-FL and the baselines.

Structured like ``dp_accounting``: the *math* (privacy-loss distributions, their exact
composition and conversions) is a set of pure functions; the *ledger*
(:class:`PrivacyLedger`) only records what was released; the *accountant*
(:class:`Accountant`) turns a ledger into guarantees; :func:`privacy_report` is the one-call
summary the server writes at the end of a run.

Threat models
-------------
(A) **One uplink.** An eavesdropper on one client's uplink (or a server that looks at one
    client's bits alone) sees, per parameter, one bit whose law is LDPQ's whatever the pairing:
    the marginal of CorBinQ equals LDPQ's (CorBin-FL Theorem 1, Appendix B). Each bit is binary
    randomized response with ``P(+) = q in [1/(1+e^eps_p), e^eps_p/(1+e^eps_p)]``; the worst
    neighbouring inputs are the end points, so one parameter is exactly ``eps_p``-DP
    (PLDP, eq. (3)) and ``k`` released parameters are the ``k``-fold composition of binary
    randomized response, whose privacy-loss distribution is exact:
    ``L = eps_p (k - 2 J)``, ``J ~ Binomial(k, 1/(1+e^eps_p))`` (the number of flipped bits).
    One update is ``k = m`` (the model size); ``T`` rounds are ``k = m T``.

(B) **Both bits of a pair.** An observer who sees both uplinks of a CorBinQ pair (for example
    the honest-but-curious server, which receives both updates) sees, per parameter,
    ``(U1, U2)`` with the joint law of :func:`mechanisms.theory.corbin_pair_joint`. Client 1
    changes ``w1 -> w1'`` while ``w2`` stays. The negative correlation that makes CorBinQ
    accurate puts *zero* mass on some outcomes (``P(++) = 0`` when ``q1 + q2 < 1`` off the tie
    cell), so an outcome possible under ``w1`` can be impossible under ``w1'``: the privacy
    loss has an atom at ``+infinity`` of mass ``p_inf`` (close to ``1/alpha(eps_p)``), there is
    no pure ``eps`` at all, and ``k`` parameters have ``delta >= 1 - (1 - p_inf)^k``, which is 1
    to machine precision for any real model. This view is reported honestly: CorBin-FL's PLDP
    is a guarantee against threat (A) only, and against the server the report says "no DP".

:func:`privacy_report` states one guarantee per adversary (``threat_models``, keys
:data:`THREAT_MODELS`): (A) and (B) as above, (C) a malicious client, which receives only the
global model (post-processing of (B)'s view, plus its partner's ``z`` when paired; the paper's
user-level bound for AugCorBin-FL, eq. (5) of Theorem 3, is not a valid bound and is not printed:
:func:`corbin_fl.mechanisms.theory.eq5_as_printed`), and (D) a malicious server, which can learn
every pair's ``z`` (SECURITY.md, threat model 4) and keeps only the per-parameter (per-update for
``fedcad``) guarantee of the mechanisms whose noise is drawn on the client. Every entry has a
``dp`` flag; an entry without DP has no ``delta``.

With secure aggregation (``secure=`` a :class:`~corbin_fl.mechanisms.secure_sum.SumView` of the
run) the server sees only the sum of the clients' symbols, and (B) is the guarantee against that
sum, computed by :mod:`corbin_fl.mechanisms.secure_sum` from what the run did (the fewest clients
in an unmasked sum, the parameters, the rounds): :func:`_secure_threat_models`. (A) does not
change; (C) and (D) say what the sum does not give them. A run without it gets the report it
always had.

All functions are float64 and SciPy-free; ``dp_accounting`` is used only by
:func:`pair_joint_delta` with ``method="dp_accounting"`` (lazy import), by the secure-aggregation
view (through :mod:`~corbin_fl.mechanisms.secure_sum`, imported only for it) and by the tests.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
from numpy.typing import NDArray

from corbin_fl.mechanisms.baselines.gaussian import (
    analytic_gaussian_sigma,
    gaussian_epsilon,
)
from corbin_fl.mechanisms.categories import Privacy, category, declared
from corbin_fl.mechanisms.protection import NO_PROTECTION, per_parameter_text, protection
from corbin_fl.mechanisms.theory import (
    alpha64,
    corbin_pair_joint_from_q,
    ldpfl_mse,
    theorem2_bound,
    theorem3_mse_bound,
)
from corbin_fl.mechanisms.validate import integer, positive, probability, real

if TYPE_CHECKING:
    from corbin_fl.mechanisms.secure_sum import SumView

logger = logging.getLogger(__name__)

__all__ = [
    "MAX_PAIR_D",
    "REPORT_VERSION",
    "THREAT_MODELS",
    "Accountant",
    "ClientPrivacy",
    "PairJointPLD",
    "PrivacyEvent",
    "PrivacyLedger",
    "eps_parameter",
    "pair_joint_delta",
    "pair_joint_epsilon",
    "pair_joint_pld",
    "privacy_report",
    "rr_delta",
    "rr_epsilon",
]

_ALIASES = {"ldp": "ldpfl", "ldp-fl": "ldpfl", "vanilla": "fedavg", "corbin-fl": "corbin"}
"""Other spellings of registered names that the ledger and :func:`privacy_report` accept."""


def __getattr__(name: str) -> Any:
    if name == "MECHANISMS":  # the names with a declared category, now (a test may add one)
        return declared()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: Largest ``d`` for which the pair-joint view is computed (cost grows like ``2^d``); matches
#: ``mechanisms.quantizers.MAX_SHARED_BITS``.
MAX_PAIR_D = 16

_EXACT_MAX_TERMS = 1_000_000
_WINDOW_Z = 30.0


# ============================================================================ validation


def _canonical_mechanism(name: object) -> str:
    if not isinstance(name, str):
        raise TypeError(f"mechanism must be a str, got {type(name).__name__}")
    key = _ALIASES.get(name.strip().lower(), name.strip().lower())
    if key not in declared():
        raise ValueError(f"unknown mechanism {name!r}; expected one of {', '.join(declared())}")
    return key


# ============================================================================ threat model (A)


def eps_parameter(eps_p: float) -> float:
    """Per-parameter ``eps`` of LDPQ / CorBinQ under threat model (A): ``eps_p`` itself.

    One bit is binary randomized response with ``P(+) = q(w)``; the likelihood ratio of any
    output for two inputs is at most ``q_hi / q_lo = e^eps_p`` (Proposition 1, eq. (8)-(9);
    Theorem 1 for CorBinQ, whose marginal equals LDPQ's). So the identity is exact and tight.

    Parameters
    ----------
    eps_p : float
        Per-parameter budget ``> 0``.

    Returns
    -------
    float
        ``eps_p``.
    """
    return positive(eps_p, "eps_p")


def _softplus(x: float) -> float:
    return max(x, 0.0) + math.log1p(math.exp(-abs(x)))


@dataclass(frozen=True)
class _RRLattice:
    """Window of the exact binomial PLD of ``k``-fold binary randomized response.

    ``neg_loss[i] = -eps_p (k - 2 j_i)`` for ``j_i = j_lo + i`` (increasing), ``logp[i]`` is
    ``log P(J = j_i)`` under the "true" input, ``tail_lo`` bounds the mass of ``j < j_lo``
    (larger losses) and ``tail_hi`` the mass of ``j > j_hi``.
    """

    eps_p: float
    k: int
    neg_loss: NDArray[np.float64]
    logp: NDArray[np.float64]
    tail_lo: float
    tail_hi: float
    cum_p: NDArray[np.float64]
    log_cum_s2: NDArray[np.float64]


@functools.lru_cache(maxsize=64)
def _rr_lattice(eps_p: float, k: int) -> _RRLattice:
    r"""Build the window of ``J ~ Binomial(k, p)``, ``p = 1/(1+e^eps_p)``, around its mean.

    The window is ``mean +/- (30 sd + 20)`` (clipped to ``[0, k]``); ``log P(J = j)`` is
    computed from ``math.lgamma`` at one anchor and the exact ratio recurrence
    ``P(j+1)/P(j) = (k - j) p / ((j + 1)(1 - p))`` elsewhere (vectorised, no SciPy; the
    cumulative ``log sum P e^{-L}`` uses ``torch.logcumsumexp``). The mass outside the window
    is bounded by a geometric series: the pmf is log-concave, so beyond an edge below (above)
    the mode each step multiplies the mass by at most the edge ratio ``rho < 1`` and the tail
    is at most ``pmf(edge) rho / (1 - rho)``.
    """
    log_p = -_softplus(eps_p)  # log(1/(1+e^eps))
    log_1mp = -_softplus(-eps_p)  # log(e^eps/(1+e^eps))
    p = math.exp(log_p)
    mean = k * p
    sd = math.sqrt(k * p * (1.0 - p))
    half = _WINDOW_Z * sd + 20.0
    j_lo = max(0, math.floor(mean - half))
    j_hi = min(k, math.ceil(mean + half))
    j = np.arange(j_lo, j_hi + 1, dtype=np.float64)
    anchor = math.lgamma(k + 1) - math.lgamma(j_lo + 1) - math.lgamma(k - j_lo + 1)
    anchor += j_lo * log_p + (k - j_lo) * log_1mp
    steps = np.log((k - j[:-1]) / (j[:-1] + 1.0)) + (log_p - log_1mp)
    logp = np.empty_like(j)
    logp[0] = anchor
    logp[1:] = anchor + np.cumsum(steps)
    loss = eps_p * (k - 2.0 * j)
    tail_lo = 0.0
    if j_lo > 0:
        rho = j_lo * (1.0 - p) / ((k - j_lo + 1.0) * p)
        tail_lo = math.exp(logp[0]) * rho / (1.0 - rho) if rho < 1.0 else 1.0
    tail_hi = 0.0
    if j_hi < k:
        rho = (k - j_hi) * p / ((j_hi + 1.0) * (1.0 - p))
        tail_hi = math.exp(logp[-1]) * rho / (1.0 - rho) if rho < 1.0 else 1.0
    cum_p = np.cumsum(np.exp(logp))
    log_cum_s2 = torch.logcumsumexp(torch.from_numpy(logp - loss), dim=0).numpy()
    return _RRLattice(eps_p, k, -loss, logp, tail_lo, tail_hi, cum_p, log_cum_s2)


def rr_delta(eps_p: float, k: int, eps: float) -> float:
    r"""Exact ``delta(eps)`` of the ``k``-fold composition of binary randomized response.

    Threat model (A). The privacy loss of one bit is ``+eps_p`` (kept) or ``-eps_p`` (flipped,
    probability ``p = 1/(1+e^eps_p)``), so ``L = eps_p (k - 2J)`` with
    ``J ~ Binomial(k, p)`` and

    .. math:: \delta(\epsilon) = \sum_{j:\,L_j > \epsilon} P(J = j)
              \big(1 - e^{\epsilon - L_j}\big).

    Only ``j`` in a window of ``+/- 30`` standard deviations around the mean are summed, in log
    space; the mass outside the window (a rigorous geometric bound, below ``1e-300`` in
    practice) is added in full, so the result is an upper bound that equals the exact value to
    float precision. Runs in ``O(sqrt(k))`` (``k`` up to ``1e9`` and beyond).

    Parameters
    ----------
    eps_p : float
        Per-parameter budget ``> 0``.
    k : int
        Number of composed bits (``m`` per update, ``m T`` for ``T`` rounds).
    eps : float
        Target ``eps`` (any real; ``delta`` is 0 for ``eps >= k eps_p``).

    Returns
    -------
    float
        ``delta`` in ``[0, 1]``.
    """
    eps_p = positive(eps_p, "eps_p")
    k = integer(k, "k", 1)
    eps = real(eps, "eps", finite=False)
    if eps >= k * eps_p:
        return 0.0
    lat = _rr_lattice(eps_p, k)
    idx = int(np.searchsorted(lat.neg_loss, -eps, side="left"))  # window terms with L > eps
    total = lat.tail_lo
    if -lat.neg_loss[-1] > eps:
        total += lat.tail_hi
    if idx > 0:
        total += float(lat.cum_p[idx - 1]) - math.exp(eps + float(lat.log_cum_s2[idx - 1]))
    return min(1.0, max(0.0, total))


def rr_epsilon(eps_p: float, k: int, delta: float) -> float:
    r"""Smallest ``eps >= 0`` with :func:`rr_delta` ``(eps_p, k, eps) <= delta`` (rounded up).

    ``delta(eps)`` is continuous and decreasing; on each lattice interval
    ``[L_{j+1}, L_j)`` it equals ``S1_j - e^eps S2_j`` with ``S1_j = sum_{i<=j} P(J=i)`` and
    ``S2_j = sum_{i<=j} P(J=i) e^{-L_i}``, both precomputed as cumulative sums (the latter in
    log space), so one evaluation costs a binary search. Bisection on ``[0, k eps_p]`` to a
    relative ``1e-12`` returns the upper end of the final bracket. Reproduces, for
    ``eps_p = 1`` and ``delta = 1e-5``, ``eps = 577.8`` (``k = 1000``) and ``eps = 47,404``
    (``k = 100,000``).

    Parameters
    ----------
    eps_p : float
        Per-parameter budget ``> 0``.
    k : int
        Number of composed bits.
    delta : float
        Target ``delta`` in ``(0, 1)``.

    Returns
    -------
    float
        ``eps`` (never above the basic-composition bound ``k eps_p``).
    """
    eps_p = positive(eps_p, "eps_p")
    k = integer(k, "k", 1)
    delta = probability(delta, "delta")
    if rr_delta(eps_p, k, 0.0) <= delta:
        return 0.0
    lo, hi = 0.0, k * eps_p
    for _ in range(400):
        mid = 0.5 * (lo + hi)
        if rr_delta(eps_p, k, mid) > delta:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return hi


# ============================================================================ threat model (B)


@dataclass(frozen=True)
class PairJointPLD:
    """Dominating per-parameter privacy-loss distribution of the pair-joint view (B).

    Attributes
    ----------
    eps_p : float
        Per-parameter budget.
    d : int
        Shared bits per parameter.
    p_x : float
        Bias of the shared bits.
    losses : ndarray
        Finite privacy-loss values (decreasing), under the dominating ``P``.
    probs : ndarray
        Their ``P``-probabilities.
    inf_mass : float
        ``P``-mass of the ``+infinity`` loss (outcomes impossible under the neighbour).
    single_inf_mass : float
        Largest ``+infinity`` mass of one *realisable* neighbouring triple; ``k`` parameters
        have ``delta >= 1 - (1 - single_inf_mass)^k`` for every ``eps`` (lower bound).
    triples : int
        Number of candidate ``(w1, w1', w2)`` triples the envelope was taken over.
    """

    eps_p: float
    d: int
    p_x: float
    losses: NDArray[np.float64]
    probs: NDArray[np.float64]
    inf_mass: float
    single_inf_mass: float
    triples: int

    @property
    def max_finite_loss(self) -> float:
        """Largest finite loss (``0`` if there is none)."""
        return float(self.losses[0]) if self.losses.size else 0.0

    def delta(self, eps: float) -> float:
        """``delta(eps)`` of one parameter: ``inf_mass + sum P (1 - e^{eps - L})_+``."""
        e = real(eps, "eps", finite=False)
        mask = self.losses > e
        tail = float(np.sum(self.probs[mask] * -np.expm1(e - self.losses[mask])))
        return min(1.0, self.inf_mass + tail)


def _codebook_cdf(d: int, p_x: float) -> NDArray[np.float64]:
    """``F(k) = P(Z < k)`` for ``k = 0..2^d`` (exact dyadics for ``p_x = 1/2``)."""
    n = 1 << d
    if p_x == 0.5:
        return np.arange(n + 1, dtype=np.float64) / n
    z = np.arange(n, dtype=np.int64)
    pop = np.zeros(n, dtype=np.int64)
    for b in range(d):
        pop += (z >> b) & 1
    pz = np.exp(pop * math.log(p_x) + (d - pop) * math.log1p(-p_x))
    cdf = np.concatenate([[0.0], np.cumsum(pz)])
    cdf[-1] = 1.0
    return cdf


def _candidate_triples(
    q_lo: float, q_hi: float, cdf: NDArray[np.float64]
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """Candidates ``(t, t', o)`` for the changing client's threshold ``t -> t'`` and the other's.

    For the cell ``[F(B), F(B+1)]`` holding the other client's threshold ``o``, the changing
    client's threshold ranges over ``{q_lo, q_hi} U ({F(B), F(B+1)} n (q_lo, q_hi))`` and ``o``
    over the two cell end points (clipped to ``[q_lo, q_hi]``). See :func:`pair_joint_pld`.
    """
    cells = np.nonzero((cdf[1:] > q_lo) & (cdf[:-1] < q_hi))[0]
    lo_end = np.maximum(cdf[cells], q_lo)
    hi_end = np.minimum(cdf[cells + 1], q_hi)
    f_lo = np.where((cdf[cells] > q_lo) & (cdf[cells] < q_hi), cdf[cells], q_lo)
    f_hi = np.where((cdf[cells + 1] > q_lo) & (cdf[cells + 1] < q_hi), cdf[cells + 1], q_hi)
    values = np.stack([np.full(cells.size, q_lo), np.full(cells.size, q_hi), f_lo, f_hi], 1)
    others = np.stack([lo_end, hi_end], 1)
    ii, jj = np.meshgrid(np.arange(4), np.arange(4), indexing="ij")
    keep = ii.ravel() != jj.ravel()
    ii, jj = ii.ravel()[keep], jj.ravel()[keep]
    t = np.repeat(values[:, ii][:, None, :], 2, axis=1)
    tp = np.repeat(values[:, jj][:, None, :], 2, axis=1)
    o = np.repeat(others[:, :, None], ii.size, axis=2)
    t, tp, o = t.ravel(), tp.ravel(), o.ravel()
    distinct = t != tp
    return t[distinct], tp[distinct], o[distinct]


def _upper_hull(x: NDArray[np.float64], y: NDArray[np.float64]) -> NDArray[np.float64]:
    """Vertices of the upper concave hull of ROC points in ``[0, 1]^2`` (vectorised quickhull).

    Returns an array of shape ``(n, 2)`` from ``(0, max y at x = 0)`` to ``(1, 1)``, in
    increasing ``x``.
    """
    at0 = x <= 0.0
    start = np.array([0.0, float(y[at0].max()) if at0.any() else 0.0])
    end = np.array([1.0, 1.0])
    pts = np.stack([x, y], 1)
    keep = (pts[:, 0] > 0.0) & (pts[:, 0] < 1.0)
    pts = np.unique(pts[keep], axis=0)

    def cross(a: NDArray[np.float64], b: NDArray[np.float64], p: NDArray[np.float64]) -> Any:
        return (b[0] - a[0]) * (p[:, 1] - a[1]) - (b[1] - a[1]) * (p[:, 0] - a[0])

    result: list[NDArray[np.float64]] = [start]
    # iterative in-order quickhull: (a, b, candidates above segment ab) or a vertex to emit
    todo: list[tuple[NDArray[np.float64], NDArray[np.float64] | None, NDArray[np.float64]]] = [
        (start, end, pts[cross(start, end, pts) > 1e-15])
    ]
    while todo:
        a, b, cand = todo.pop()
        if b is None:
            result.append(a)
            continue
        if cand.shape[0] == 0:
            continue
        far = cand[int(np.argmax(cross(a, b, cand)))]
        todo.append((far, b, cand[cross(far, b, cand) > 1e-15]))
        todo.append((far, None, cand[:0]))
        todo.append((a, far, cand[cross(a, far, cand) > 1e-15]))
    result.append(end)
    return np.array(result)


def _pld_from_pairs(
    p: NDArray[np.float64], q: NDArray[np.float64]
) -> tuple[NDArray[np.float64], NDArray[np.float64], float]:
    """Envelope of the ROC curves of pairs ``(p[i], q[i])`` -> dominating (losses, probs, inf)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(q > 0, p / np.where(q > 0, q, 1.0), np.where(p > 0, np.inf, 0.0))
    order = np.argsort(-ratio, axis=1, kind="stable")
    xs = np.cumsum(np.take_along_axis(q, order, 1), axis=1)
    ys = np.cumsum(np.take_along_axis(p, order, 1), axis=1)
    hull = _upper_hull(xs.ravel(), ys.ravel())
    inf_mass = float(hull[0, 1])
    dx = np.diff(hull[:, 0])
    dy = np.diff(hull[:, 1])
    ok = (dx > 0) & (dy > 0)
    losses = np.log(dy[ok] / dx[ok])
    probs = dy[ok]
    return losses, probs, inf_mass


def _joint_flat(
    q_lead: NDArray[np.float64], s_follow: NDArray[np.float64], d: int, p_x: float
) -> NDArray[np.float64]:
    return corbin_pair_joint_from_q(q_lead, s_follow, d, p_x).reshape(-1, 4)


@functools.lru_cache(maxsize=32)
def _pair_joint_pld_cached(eps_p: float, d: int, p_x: float) -> PairJointPLD:
    q_lo = 1.0 / (1.0 + math.exp(eps_p))
    q_hi = 1.0 / (1.0 + math.exp(-eps_p))
    cdf = _codebook_cdf(d, p_x)
    t, tp, o = _candidate_triples(q_lo, q_hi, cdf)
    # client 1 is the lead: its q changes t -> t'; the follower's s = 1 - q2 is ``o``
    p_lead = _joint_flat(t, o, d, p_x)
    q_lead = _joint_flat(tp, o, d, p_x)
    # client 1 is the follower: its s = 1 - q changes t -> t'; the lead's q is ``o``
    p_fol = _joint_flat(o, t, d, p_x)
    q_fol = _joint_flat(o, tp, d, p_x)
    p_all = np.concatenate([p_lead, p_fol])
    q_all = np.concatenate([q_lead, q_fol])
    losses, probs, inf_mass = _pld_from_pairs(p_all, q_all)
    single = float(np.max(np.sum(np.where(q_all <= 0.0, p_all, 0.0), axis=1)))
    return PairJointPLD(
        eps_p=eps_p,
        d=d,
        p_x=p_x,
        losses=losses,
        probs=probs,
        inf_mass=inf_mass,
        single_inf_mass=single,
        triples=int(p_all.shape[0]),
    )


def pair_joint_pld(eps_p: float, d: int, p_x: float = 0.5) -> PairJointPLD:
    r"""Worst-case privacy-loss distribution of one parameter seen as a pair (threat model B).

    The observer sees ``(U1, U2)`` with law ``P_{w1, w2}`` (exact, finite ``d``, from
    :func:`mechanisms.theory.corbin_pair_joint_from_q`); neighbouring inputs change one
    client's weight (``w1 -> w1'``, ``w2`` fixed), with client 1 either the lead or the follower.

    *Which triples.* Write the lead's threshold as ``q1`` and the follower's as ``s2 = 1 - q2``,
    both ranging over ``[q_lo, q_hi] = [1/(1+e^eps), e^eps/(1+e^eps)]``. For a fixed other
    threshold in the codebook cell ``[F(B), F(B+1)]``, the joint law is continuous and affine in
    the changing client's threshold on the pieces cut at ``F(B)`` and ``F(B+1)`` only (off the
    tie cell ``P(++) = max(0, q1 - s2)``, on it ``P(A) f_a (1 - f_b)``, both affine); and for
    fixed changing thresholds it is affine in the other threshold inside the cell (the cut
    points are cell boundaries). The hockey-stick divergence
    ``H_gamma(P||Q) = sum (P - gamma Q)_+`` is convex in ``(P, Q)``, so for every
    ``gamma = e^eps`` its supremum over the continuum is attained on the finite set
    ``{q_lo, q_hi, F(B), F(B+1)}^2 x {cell end points}`` over all cells ``B``: this is the grid.

    *Worst case.* No single triple dominates all others for every ``eps`` at finite ``d``, so
    the reported distribution is the *dominating pair* of the envelope: the upper concave hull
    of the union of all candidates' ROC curves (equivalently ``delta(eps) = max_triples
    H_{e^eps}``, exact for one parameter), turned back into a discrete privacy-loss
    distribution with an atom at ``+infinity``. Composing it upper-bounds every sequence of
    per-parameter choices (Zhu, Dong & Wang 2022, dominating pairs).

    Parameters
    ----------
    eps_p : float
        Per-parameter budget.
    d : int
        Shared bits per parameter, ``1 <= d <= 16``.
    p_x : float, default 0.5
        Bias of the shared bits (CoQ-FL codebook when not 1/2).

    Returns
    -------
    PairJointPLD
        Finite losses, their probabilities, the ``+infinity`` mass and a realisable lower bound.
    """
    eps_p = positive(eps_p, "eps_p")
    if isinstance(d, bool) or not isinstance(d, int | np.integer):
        raise TypeError(f"d must be an int, got {type(d).__name__}")
    if not 1 <= int(d) <= MAX_PAIR_D:
        raise ValueError(f"d must be in 1..{MAX_PAIR_D} for the pair-joint view, got {d}")
    px = real(p_x, "p_x", finite=False)
    if not 0.0 < px < 1.0:
        raise ValueError(f"p_x must be in (0, 1), got {p_x!r}")
    return _pair_joint_pld_cached(eps_p, int(d), px)


def _compositions(k: int, parts: int) -> NDArray[np.int64]:
    """All vectors of ``parts`` non-negative ints summing to ``k`` (stars and bars), vectorised.

    Built one coordinate at a time: each partial row with remainder ``rem`` is expanded into
    ``rem + 1`` rows choosing the next count in ``0..rem``; the last count is the remainder.
    """
    rows = np.zeros((1, 0), dtype=np.int64)
    rem = np.array([k], dtype=np.int64)
    for _ in range(parts - 1):
        reps = rem + 1
        idx = np.repeat(np.arange(rows.shape[0]), reps)
        starts = np.repeat(np.cumsum(reps) - reps, reps)
        within = np.arange(idx.size, dtype=np.int64) - starts
        rows = np.concatenate([rows[idx], within[:, None]], axis=1)
        rem = rem[idx] - within
    return np.concatenate([rows, rem[:, None]], axis=1)


def _exact_terms(pld: PairJointPLD, k: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Exact composed finite losses and log-probabilities (multinomial over the atoms)."""
    counts = _compositions(k, pld.losses.size)
    log_fact = np.array([math.lgamma(i + 1.0) for i in range(k + 1)])
    logp = log_fact[k] - log_fact[counts].sum(axis=1) + counts @ np.log(pld.probs)
    return counts @ pld.losses, logp


def _n_compositions(k: int, parts: int) -> int:
    return math.comb(k + parts - 1, parts - 1)


Method = Literal["auto", "exact", "bound", "dp_accounting"]


def _bound_delta(pld: PairJointPLD, k: int, eps: float) -> float:
    """Optimal-composition bound: ``(e0, d0)``-DP per parameter, composed ``k`` times.

    Kairouz, Oh & Viswanath (2015, Thm. 3.3): the ``k``-fold composition of ``(e0, d0)``-DP
    mechanisms is dominated by ``d0``-atoms at infinity times ``k``-fold randomized response:
    ``delta(eps) <= 1 - (1 - d0)^k (1 - rr_delta(e0, k, eps))``. Minimised over
    ``e0`` in the per-parameter loss values.
    """
    candidates = {0.0, *[float(x) for x in pld.losses if x > 0.0]}
    best = 1.0
    for e0 in sorted(candidates):
        d0 = pld.delta(e0)
        if d0 >= 1.0:
            continue
        keep = math.exp(k * math.log1p(-d0))
        rr = 0.0 if e0 <= 0.0 else rr_delta(e0, k, eps)
        if e0 <= 0.0 and eps < 0.0:
            continue
        best = min(best, 1.0 - keep * (1.0 - rr))
    return max(best, 0.0)


def _dp_accounting_delta(pld: PairJointPLD, k: int, eps: float) -> float:
    try:
        from dp_accounting.pld import privacy_loss_distribution as dpl
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "method='dp_accounting' needs the optional package dp-accounting "
            "(pip install 'corbin-fl[dev]' or pip install dp-accounting)"
        ) from exc
    upper: dict[int, float] = {}
    lower: dict[int, float] = {}
    for i, (loss, prob) in enumerate(zip(pld.losses, pld.probs, strict=True)):
        upper[i] = math.log(prob)
        lower[i] = math.log(prob) - float(loss)
    if pld.inf_mass > 0.0:
        upper[-1] = math.log(pld.inf_mass)
    q_rest = 1.0 - sum(math.exp(v) for v in lower.values())
    if q_rest > 0.0:
        lower[-2] = math.log(q_rest)
    dist = dpl.from_two_probability_mass_functions(lower, upper, symmetric=False)
    if k > 1:
        dist = dist.self_compose(k)
    return float(dist.get_delta_for_epsilon(eps))


def pair_joint_delta(
    eps_p: float, d: int, k: int, eps: float, *, p_x: float = 0.5, method: Method = "auto"
) -> float:
    r"""``delta(eps)`` of ``k`` parameters under the pair-joint view (threat model B).

    Composes the dominating per-parameter distribution of :func:`pair_joint_pld`:

    .. math:: \delta_k(\epsilon) = 1 - (1 - p_\infty)^k +
              E\big[(1 - e^{\epsilon - L_1 - \dots - L_k})_+;\ \text{all } L_i \text{ finite}\big].

    Methods: ``"exact"`` enumerates every multiset of per-parameter outcomes (multinomial
    weights; feasible while ``C(k + K - 1, K - 1) <= 1e6`` for ``K`` finite atoms) and is exact
    for the dominating pair; ``"bound"`` is the optimal composition theorem for
    ``(e0, delta(e0))``-DP mechanisms (Kairouz, Oh & Viswanath 2015), a rigorous upper bound;
    ``"dp_accounting"`` uses dp-accounting's PLD engine (pessimistic discretisation; lazy
    import). ``"auto"`` returns ``1 - (1 - p_inf)^k`` when ``(1 - p_inf)^k < 1e-17`` (then
    ``delta`` is 1 to float precision: the observer can distinguish with near certainty), else
    ``"exact"`` when feasible, else ``"bound"``.

    Parameters
    ----------
    eps_p : float
        Per-parameter budget.
    d : int
        Shared bits per parameter (``1..16``).
    k : int
        Number of parameters (``m`` per update, ``m T`` for ``T`` rounds).
    eps : float
        Target ``eps``.
    p_x : float, default 0.5
        Bias of the shared bits.
    method : {"auto", "exact", "bound", "dp_accounting"}
        Composition engine.

    Returns
    -------
    float
        ``delta`` in ``[0, 1]``; never below ``1 - (1 - p_inf)^k``.
    """
    k = integer(k, "k", 1)
    eps = real(eps, "eps", finite=False)
    pld = pair_joint_pld(eps_p, d, p_x)
    floor = 1.0 - math.exp(k * math.log1p(-pld.inf_mass)) if pld.inf_mass < 1.0 else 1.0
    if method == "auto":
        if pld.inf_mass > 0.0 and k * -math.log1p(-pld.inf_mass) > 39.0:
            return floor
        method = "exact" if _n_compositions(k, pld.losses.size) <= _EXACT_MAX_TERMS else "bound"
    if method == "exact":
        if _n_compositions(k, pld.losses.size) > _EXACT_MAX_TERMS:
            raise ValueError(f"exact composition of k={k} parameters is too large; use 'bound'")
        return _PairComposition(pld, k).delta(eps)
    if method == "bound":
        return max(floor, _bound_delta(pld, k, eps))
    if method == "dp_accounting":
        return max(floor, _dp_accounting_delta(pld, k, eps))
    raise ValueError(f"unknown method {method!r}")


class _PairComposition:
    """Exact ``k``-fold composition of a :class:`PairJointPLD` (enumerated once)."""

    def __init__(self, pld: PairJointPLD, k: int) -> None:
        self.k = k
        self.keep = math.exp(k * math.log1p(-pld.inf_mass)) if pld.inf_mass < 1.0 else 0.0
        if pld.losses.size:
            self.loss, self.logp = _exact_terms(pld, k)
        else:
            self.loss, self.logp = np.empty(0), np.empty(0)

    def delta(self, eps: float) -> float:
        mask = self.loss > eps
        finite = float(np.sum(np.exp(self.logp[mask]) * -np.expm1(eps - self.loss[mask])))
        return min(1.0, 1.0 - self.keep + finite)


def pair_joint_epsilon(
    eps_p: float, d: int, k: int, delta: float, *, p_x: float = 0.5, method: Method = "auto"
) -> float:
    """Smallest ``eps >= 0`` with :func:`pair_joint_delta` ``<= delta`` (``inf`` if none).

    ``delta(eps) >= 1 - (1 - p_inf)^k`` for every ``eps``: when the target is below this floor
    no finite ``eps`` exists and ``math.inf`` is returned (the pair view gives no guarantee).
    Otherwise bisection on ``[0, k L_max]`` (``L_max`` the largest finite per-parameter loss;
    beyond it only the infinite atoms remain) to a relative ``1e-9``, rounded up.

    Parameters
    ----------
    eps_p, d, k, p_x, method
        As in :func:`pair_joint_delta`.
    delta : float
        Target ``delta`` in ``(0, 1)``.

    Returns
    -------
    float
        ``eps`` or ``math.inf``.
    """
    k = integer(k, "k", 1)
    delta = probability(delta, "delta")
    pld = pair_joint_pld(eps_p, d, p_x)
    floor = 1.0 - math.exp(k * math.log1p(-pld.inf_mass)) if pld.inf_mass < 1.0 else 1.0
    if floor >= delta:
        return math.inf
    if method == "exact" or (
        method == "auto" and _n_compositions(k, pld.losses.size) <= _EXACT_MAX_TERMS
    ):
        comp = _PairComposition(pld, k)

        def fn(e: float) -> float:
            return comp.delta(e)
    else:

        def fn(e: float) -> float:
            return pair_joint_delta(eps_p, d, k, e, p_x=p_x, method=method)

    if fn(0.0) <= delta:
        return 0.0
    hi = max(k * pld.max_finite_loss, 1e-12)
    if fn(hi) > delta:
        return math.inf
    lo = 0.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if fn(mid) > delta:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-9 * max(1.0, hi):
            break
    return hi


# ============================================================================ ledger


@dataclass(frozen=True)
class PrivacyEvent:
    """One release: a client's update in one round.

    Attributes
    ----------
    round : int
        Server round (``>= 1``).
    node : str
        Client (node) identifier.
    mechanism : str
        Canonical mechanism name (see :data:`MECHANISMS`).
    eps_p : float or None
        Per-parameter budget (per-round update-level budget for ``fedcad``); ``None`` for
        mechanisms without DP.
    m : int
        Number of released parameters.
    paired : bool
        Whether the update was CorBinQ-paired (threat model B applies).
    d : int or None
        Shared bits per parameter for paired releases.
    delta : float or None
        Per-parameter (``gaussian``) or per-round (``fedcad``) ``delta`` of the mechanism.
    """

    round: int
    node: str
    mechanism: str
    eps_p: float | None
    m: int
    paired: bool = False
    d: int | None = None
    delta: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "mechanism", _canonical_mechanism(self.mechanism))
        if isinstance(self.round, bool) or not isinstance(self.round, int) or self.round < 0:
            raise ValueError(f"round must be an int >= 0, got {self.round!r}")
        object.__setattr__(self, "node", str(self.node))
        integer(self.m, "m", 1)
        cat = category(self.mechanism)
        if not cat.local_dp:  # no local DP on what a client releases
            if self.eps_p is not None:
                raise ValueError(f"{self.mechanism} has no local DP guarantee; eps_p must be None")
        else:
            if self.eps_p is None:
                raise ValueError(f"{self.mechanism} needs eps_p")
            object.__setattr__(self, "eps_p", positive(self.eps_p, "eps_p"))
        if cat.family == "gaussian":
            if self.delta is None:
                raise ValueError(f"{self.mechanism} needs the mechanism's delta")
            object.__setattr__(self, "delta", probability(self.delta, "delta"))
        if not isinstance(self.paired, bool):
            raise TypeError("paired must be a bool")
        if self.paired:
            if not cat.paired:
                raise ValueError(
                    f"only corbin/augcorbin releases can be paired, not {self.mechanism}"
                )
            if self.d is None:
                raise ValueError("a paired release needs d")
            if isinstance(self.d, bool) or not isinstance(self.d, int) or self.d < 1:
                raise ValueError(f"d must be an int >= 1, got {self.d!r}")


class PrivacyLedger:
    """Append-only record of released updates, serialisable to JSON for checkpointing."""

    def __init__(self, events: Iterable[PrivacyEvent] = ()) -> None:
        self._events: list[PrivacyEvent] = []
        for e in events:
            self.add(e)

    def add(self, event: PrivacyEvent) -> None:
        """Append an event."""
        if not isinstance(event, PrivacyEvent):
            raise TypeError(f"expected a PrivacyEvent, got {type(event).__name__}")
        self._events.append(event)

    def record(
        self,
        round: int,
        node: str | int,
        mechanism: str,
        eps_p: float | None,
        m: int,
        paired: bool = False,
        d: int | None = None,
        delta: float | None = None,
    ) -> PrivacyEvent:
        """Create, validate and append an event; returns it."""
        event = PrivacyEvent(round, str(node), mechanism, eps_p, m, paired, d, delta)
        self.add(event)
        return event

    @property
    def events(self) -> tuple[PrivacyEvent, ...]:
        """All events in insertion order."""
        return tuple(self._events)

    def __len__(self) -> int:
        return len(self._events)

    def __iter__(self) -> Iterator[PrivacyEvent]:
        return iter(self._events)

    def nodes(self) -> list[str]:
        """Sorted node identifiers that appear in the ledger."""
        return sorted({e.node for e in self._events})

    def to_json(self) -> str:
        """Serialise (``{"version": 1, "events": [...]}``)."""
        return json.dumps(
            {"version": 1, "events": [dataclasses.asdict(e) for e in self._events]},
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> PrivacyLedger:
        """Inverse of :meth:`to_json` (every event is re-validated)."""
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("version") != 1:
            raise ValueError("not a version-1 privacy ledger")
        events = data.get("events")
        if not isinstance(events, list):
            raise ValueError("ledger 'events' must be a list")
        fields = {f.name for f in dataclasses.fields(PrivacyEvent)}
        out = cls()
        for raw in events:
            if not isinstance(raw, dict) or set(raw) != fields:
                raise ValueError(f"malformed ledger event: {raw!r}")
            out.add(PrivacyEvent(**raw))
        return out


# ============================================================================ accountant


@dataclass(frozen=True)
class ClientPrivacy:
    """Guarantees of one client over the recorded events.

    Attributes
    ----------
    node : str
        Client identifier.
    rounds : int
        Number of released updates.
    k : int
        Total number of released parameters.
    eps_a, delta : float
        ``(eps, delta)`` against threat model (A) (``inf`` when no DP).
    eps_b : float or None
        ``eps`` at the same ``delta`` against threat model (B) (``None`` when no paired
        release, ``inf`` when no finite ``eps`` exists).
    delta_b_floor : float or None
        Lower bound ``1 - (1 - p_inf)^k`` on ``delta`` in view (B).
    notes : tuple of str
        How the numbers were obtained.
    """

    node: str
    rounds: int
    k: int
    eps_a: float
    delta: float
    eps_b: float | None
    delta_b_floor: float | None
    notes: tuple[str, ...]


class Accountant:
    """Turns a :class:`PrivacyLedger` into per-client guarantees for threat models (A) and (B).

    Parameters
    ----------
    ledger : PrivacyLedger
        The events.
    """

    def __init__(self, ledger: PrivacyLedger) -> None:
        if not isinstance(ledger, PrivacyLedger):
            raise TypeError(f"expected a PrivacyLedger, got {type(ledger).__name__}")
        self.ledger = ledger

    def client(self, node: str | int, delta: float) -> ClientPrivacy:
        r"""Guarantees of one client at target ``delta``.

        Threat model (A): pure-``eps`` releases (``corbin``, ``augcorbin``, ``ldpfl``,
        ``laplace``, ``ternary``, ``pbm``, ``rqm``, ``imvu``) are each dominated by randomized
        response with their ``eps_p`` (optimal composition, Kairouz et al. 2015), hence all
        together by ``k``-fold RR with the largest ``eps_p`` (exact when all are equal);
        Gaussian releases compose exactly as ``mu = sqrt(sum mu_i^2)`` GDP; different families
        are combined by basic composition (``delta`` split evenly). Threat model (B): the paired
        parameters, grouped by ``(eps_p, d)``, through :func:`pair_joint_epsilon`; unpaired
        parameters of the same
        client are added by basic composition.
        """
        delta = probability(delta, "delta")
        key = str(node)
        events = [e for e in self.ledger if e.node == key]
        if not events:
            raise ValueError(f"no events for node {key!r}")
        k = sum(e.m for e in events)
        rounds = len({e.round for e in events})
        notes: list[str] = []
        cats = {e.mechanism: category(e.mechanism) for e in events}
        if any(not cats[e.mechanism].local_dp for e in events):
            notes.append(
                "a release without local DP (cq/fedavg/signsgd, or central-gaussian, whose "
                "noise the server adds): no guarantee on the uplink"
            )
            return ClientPrivacy(key, rounds, k, math.inf, delta, None, None, tuple(notes))
        pure = [e for e in events if cats[e.mechanism].family == "pure"]
        gauss = [e for e in events if cats[e.mechanism].family == "gaussian"]
        families = int(bool(pure)) + int(bool(gauss))
        d_each = delta / families
        eps_a = 0.0
        if pure:
            eps_max = max(float(e.eps_p) for e in pure)  # type: ignore[arg-type]
            k_pure = sum(e.m for e in pure)
            eps_a += rr_epsilon(eps_max, k_pure, d_each)
            notes.append(f"(A) {k_pure} pure-DP parameters as {k_pure}-fold RR(eps_p={eps_max})")
        if gauss:
            mu2 = 0.0
            for e in gauss:
                mu_i = 1.0 / analytic_gaussian_sigma(float(e.eps_p), float(e.delta), 1.0)  # type: ignore[arg-type]
                mu2 += mu_i * mu_i * (e.m if cats[e.mechanism].unit == "parameter" else 1)
            eps_a += gaussian_epsilon(d_each, math.sqrt(mu2))
            notes.append(f"(A) Gaussian releases composed exactly: mu = {math.sqrt(mu2):.6g}")
        if families > 1:
            notes.append("(A) families combined by basic composition")
        paired = [e for e in events if e.paired]
        if not paired:
            return ClientPrivacy(key, rounds, k, eps_a, delta, None, None, tuple(notes))
        groups: dict[tuple[float, int], int] = {}
        for e in paired:
            gk = (float(e.eps_p), int(e.d))  # type: ignore[arg-type]
            groups[gk] = groups.get(gk, 0) + e.m
        n_parts = len(groups) + int(any(not e.paired for e in events))
        part = delta / n_parts
        eps_b = 0.0
        keep = 1.0
        for (ep, dd), kk in sorted(groups.items()):
            pld = pair_joint_pld(ep, dd)
            keep *= math.exp(kk * math.log1p(-pld.single_inf_mass))
            eps_b += pair_joint_epsilon(ep, dd, kk, part)
        unpaired = [e for e in events if not e.paired]
        if unpaired:
            eps_u = max(float(e.eps_p) for e in unpaired)  # type: ignore[arg-type]
            eps_b += rr_epsilon(eps_u, sum(e.m for e in unpaired), part)
        notes.append(f"(B) pair-joint view over {sum(groups.values())} paired parameters")
        return ClientPrivacy(key, rounds, k, eps_a, delta, eps_b, 1.0 - keep, tuple(notes))

    def all_clients(self, delta: float) -> dict[str, ClientPrivacy]:
        """:meth:`client` for every node of the ledger."""
        return {n: self.client(n, delta) for n in self.ledger.nodes()}


# ============================================================================ report

#: The four threat models of the report, by key, with the plain-language name every view prints
#: (SECURITY.md describes each one; the keys are those of ``privacy_report()["threat_models"]``).
THREAT_MODELS: dict[str, str] = {
    "A": "eavesdropper on one uplink",
    "B": "server that sees every bit",
    "C": "malicious client",
    "D": "malicious server",
}

#: Version of the report's layout (one entry per threat model under ``threat_models``). The first
#: layout (a single ``dp`` flag) is no longer read: every committed run was rewritten once.
REPORT_VERSION = 2


def _central_threat_models(
    epsilon: float, delta: float, rounds: int, planned: int
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """The threat-model view of ``central-gaussian`` (DP-FedAvg's Gaussian sum query).

    The noise multiplier ``z`` is calibrated for ``planned`` rounds at (epsilon, delta); the run's
    ``rounds`` (at most ``planned``) compose exactly to one Gaussian with ``mu = sqrt(T) / z``
    (``mechanisms/baselines/central_gaussian.py``).
    """
    from corbin_fl.mechanisms.baselines.central_gaussian import (
        central_epsilon,
        central_noise_multiplier,
    )

    z = central_noise_multiplier(epsilon, delta, planned)
    tm: dict[str, dict[str, Any]] = {
        key: {"name": name, "dp": False} for key, name in THREAT_MODELS.items()
    }
    tm["A"]["headline"] = "no DP (the clipped update in the clear)"
    tm["A"]["guarantee"] = (
        "No DP: central-gaussian uploads the client's clipped update as it is (the server adds "
        "the noise); only TLS hides it on the link."
    )
    tm["B"]["headline"] = "no DP (it sees every clipped update)"
    tm["B"]["guarantee"] = (
        "No DP: the server receives every clipped update as it is; the noise is its own to add."
    )
    eps_run = central_epsilon(z, delta, rounds)
    tm["C"].update(
        {
            "dp": True,
            "headline": (
                f"{NO_PROTECTION}: central eps {eps_run:.3g}"
                if protection(eps_run)
                else f"({eps_run:.3g}, {delta:.3g}) central, {rounds} rounds"
            ),
            "guarantee": (
                f"The {rounds} global models every client receives are ({eps_run:g}, {delta:g})-DP "
                "with respect to any one client's data (add or remove one client; worst case: it "
                f"takes part in every round): each round adds N(0, (z C)^2) with z = {z:.4g} to "
                "the sum of updates clipped to L2 norm C, and the rounds compose exactly to one "
                f"Gaussian with mu = sqrt({rounds})/z. This trusts the server to add the noise."
                + _protection_sentence(eps_run, rounds)
            ),
            "per_update": {
                "k": 1,
                "eps": central_epsilon(z, delta, 1),
                "delta": delta,
                "mu": 1 / z,
            },
            "all_rounds": {
                "k": rounds,
                "eps": eps_run,
                "delta": delta,
                "mu": math.sqrt(rounds) / z,
            },
        }
    )
    tm["D"]["headline"] = "no DP (it need not add the noise)"
    tm["D"]["guarantee"] = (
        "No DP: a malicious server sees every clipped update and need not add any noise."
    )
    notes = [
        "central DP (DP-FedAvg's Gaussian sum query): clients send their clipped updates in the "
        f"clear and the server adds the noise; z = {z:.6g} makes {planned} rounds "
        f"({epsilon:g}, {delta:g})-DP (analytic Gaussian calibration, exact GDP composition)",
        "worst case: a client is assumed to take part in every round; no amplification by "
        "sampling is claimed",
    ]
    return tm, notes


def _rr_block(eps_p: float, k: int, delta: float) -> dict[str, Any]:
    return {"k": k, "eps": rr_epsilon(eps_p, k, delta), "delta": delta}


def _pair_block(eps_p: float, d: int, k: int, delta: float) -> dict[str, Any]:
    pld = pair_joint_pld(eps_p, d)
    floor_single = 1.0 - math.exp(k * math.log1p(-pld.single_inf_mass))
    eps = pair_joint_epsilon(eps_p, d, k, delta)
    return {
        "k": k,
        "eps": eps if math.isfinite(eps) else None,
        "eps_is_infinite": not math.isfinite(eps),
        "delta": delta,
        "delta_lower_bound": floor_single,
    }


def _g(x: Any) -> str:
    """Four significant digits (the precision every view prints)."""
    return f"{float(x):.4g}"


_EQ5_NOT_A_BOUND = (
    "The paper's user-level bound for AugCorBin-FL (arXiv 2409.13133, Theorem 3, eq. 5) is not "
    "a valid bound (it grows with the radius r, which the mechanism's law does not depend on, "
    "and a realisable configuration beats it: README, \"AugCorBin-FL's eq. (5) is not a "
    'bound"), so no guarantee is printed from it.'
)
"""Why the report prints nothing from Theorem 3 (``theory.eq5_as_printed``)."""


def _run_headline(eps: float, delta: float, tail: str) -> str:
    """``"(eps, delta) <tail>"``, or :data:`NO_PROTECTION` with the ``eps`` when it bounds
    nothing (``eps > MEANINGFUL_EPS``, :mod:`corbin_fl.mechanisms.protection`)."""
    if protection(eps):
        return f"{NO_PROTECTION}: run eps {_g(eps)}"
    return f"({_g(eps)}, {delta:g}) {tail}"


def _per_parameter_sentence(eps: float, delta: float, eps_p: float | None) -> str:
    """``"per parameter (0.99997, 1e-05)-DP, no better than eps_p = 1"`` (5 digits)."""
    text = per_parameter_text(eps, eps_p)
    number, _, rest = text.partition(" (")
    return f"per parameter ({number}, {delta:g})-DP" + (f", {rest[:-1]}" if rest else "")


def _protection_sentence(run_eps: float, rounds: int) -> str:
    """The plain words when the run's ``eps`` bounds nothing, else ``""``."""
    if not protection(run_eps):
        return ""
    return (
        f" Over all {rounds} rounds eps = {_g(run_eps)} is formally DP and practically none "
        f"({NO_PROTECTION}: above eps = 10 a test may tell two inputs apart every time at a "
        "false-positive rate of 1 in e^10 = 22,026; mechanisms/protection.py)."
    )


def _blocks(view: Mapping[str, Any] | None, *parts: str) -> dict[str, Any]:
    """Copies of the numeric blocks ``parts`` of ``view`` that exist (``None`` ones left out)."""
    out: dict[str, Any] = {}
    for part in parts:
        block = view.get(part) if isinstance(view, Mapping) else None
        if isinstance(block, Mapping):
            out[part] = dict(block)
    return out


def _composed_sentence(view: Mapping[str, Any], m: int, rounds: int) -> str:
    """``"one update of m = ...: (eps, delta)-DP; over T rounds: (eps, delta)-DP"``."""
    parts = []
    upd = view.get("per_update")
    if isinstance(upd, Mapping) and int(upd.get("k", 0)) == m:
        parts.append(
            f"one update of m = {m:,} parameters is ({_g(upd['eps'])}, {upd['delta']:g})-DP"
        )
    run = view.get("all_rounds")
    if isinstance(run, Mapping):
        parts.append(f"all {rounds} rounds are ({_g(run['eps'])}, {run['delta']:g})-DP")
    return "; ".join(parts)


def _pair_joint_numbers(pair: Mapping[str, Any]) -> dict[str, Any]:
    """Supporting numbers of the pair-joint view, with ``eps``/``delta`` only where an ``eps``
    exists (``delta_lower_bound`` is the lower bound ``1 - (1 - p_inf)^k`` on ``delta``)."""
    out: dict[str, Any] = {}
    pp = pair.get("per_parameter")
    if isinstance(pp, Mapping):
        out["per_parameter"] = {
            key: pp[key]
            for key in ("inf_mass", "single_triple_inf_mass", "max_finite_loss")
            if key in pp
        }
    for part in ("per_update", "all_rounds"):
        block = pair.get(part)
        if not isinstance(block, Mapping):
            continue
        entry: dict[str, Any] = {"k": block.get("k")}
        entry["delta_lower_bound"] = block.get("delta_lower_bound")
        if block.get("eps") is not None and not block.get("eps_is_infinite"):
            entry["eps"] = block["eps"]
            entry["delta"] = block.get("delta")
        out[part] = entry
    return out


def _threat_models(
    mech: str,
    cat: Privacy,
    eps_p: float | None,
    m: int,
    rounds: int,
    view_a: Mapping[str, Any] | None,
    pair: Mapping[str, Any] | None,
    pair_reason: str | None,
    gamma: float | None,
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """The per-threat-model view and the notes of one mechanism.

    Every entry has ``name`` (:data:`THREAT_MODELS`), ``dp`` (whether the report gives a
    differential-privacy guarantee against that adversary), ``headline`` (at most 46
    characters, for tables) and ``guarantee`` (one plain-language paragraph); entries with
    ``dp`` true add the numbers (``per_parameter``, ``per_update``, ``all_rounds``: blocks
    ``{"k", "eps", "delta"}`` as in threat model A); entries without DP
    carry no ``delta`` anywhere (the paired mechanisms' ``pair_joint`` block holds only the
    lower bounds on ``delta`` that show why).

    The inputs are the computed blocks of each view (threat model A's numbers, the pair-joint
    view of B) before they are arranged per threat model. A headline whose composed ``eps``
    exceeds :data:`~corbin_fl.mechanisms.protection.MEANINGFUL_EPS` says
    :data:`~corbin_fl.mechanisms.protection.NO_PROTECTION`.
    """
    tm: dict[str, dict[str, Any]] = {
        key: {"name": name, "dp": False} for key, name in THREAT_MODELS.items()
    }
    notes: list[str] = []
    if cat.no_dp is not None:
        text = cat.no_dp
        tm["A"]["headline"], tm["A"]["guarantee"] = text.a_headline, text.a_guarantee
        tm["B"]["headline"], tm["B"]["guarantee"] = text.b_headline, text.b_guarantee
        tm["C"]["headline"], tm["C"]["guarantee"] = "no DP", text.c_guarantee
        tm["D"]["headline"] = "no DP"
        tm["D"]["guarantee"] = text.b_guarantee
        notes.append(f"{mech} has no privacy mechanism: no (eps, delta) exists for any adversary")
        return tm, notes
    if not isinstance(view_a, Mapping) or eps_p is None:
        raise ValueError(f"{mech}: the threat model A numbers are missing")
    ep = float(eps_p)

    # ---------------------------------------------------------------- (A) one uplink
    a = tm["A"]
    a["dp"] = True
    a.update(_blocks(view_a, "per_parameter", "per_update", "all_rounds"))
    composed = _composed_sentence(view_a, m, rounds)
    if cat.family == "gaussian" and cat.unit == "parameter":
        pp = view_a["per_parameter"]
        a["headline"] = f"({ep:g}, {pp['delta']:.3g}) per parameter"
        a["guarantee"] = (
            f"Each released parameter is ({ep:g}, {pp['delta']:g})-DP {cat.release}; "
            f"composed exactly, {composed}.{cat.caveat_a}"
        )
    elif cat.family == "gaussian":
        pu = view_a["per_update"]
        a["headline"] = f"({ep:g}, {pu['delta']:.3g}) per update"
        a["guarantee"] = (
            f"Each round's release is ({ep:g}, {pu['delta']:g})-DP for the whole update "
            f"{cat.release}; {composed}.{cat.caveat_a}"
        )
    else:
        what = (
            "uploaded bit is randomized response"
            if cat.randomized_response
            else cat.release or f"released parameter is one symbol of {mech} (exact pure eps_p)"
        )
        a["headline"] = f"eps_p = {ep:g} per parameter"
        a["guarantee"] = (
            f"Each {what} with eps_p = {ep:g} (pure eps_p-DP per parameter"
            + (
                "; a bit's law is the same whether or not its client is paired"
                if cat.paired
                else ""
            )
            + f"); composed exactly, {composed}.{cat.caveat_a}"
        )

    # ---------------------------------------------------------------- (B) sees every bit
    b = tm["B"]
    paired = cat.paired and not (cat.independent_share and gamma is not None and gamma >= 1.0)
    if paired:
        b["headline"] = "no DP (paired bits are not private against it)"
        joint = _pair_joint_numbers(pair) if isinstance(pair, Mapping) else None
        run_eps = (joint or {}).get("all_rounds", {}).get("eps")
        if joint is not None and run_eps is not None:
            # Only for tiny models and budgets; reported as what it is.
            b["dp"] = True
            run = joint["all_rounds"]
            b["headline"] = _run_headline(run_eps, run["delta"], "over the run (pair-joint)")
            b["guarantee"] = (
                "The server receives both bits of every pair; their joint law still gives "
                f"({_g(run_eps)}, {run['delta']:g})-DP over all {rounds} rounds at this tiny "
                "model size (exact pair-joint composition)."
            )
        else:
            who = (
                "Each round a random fraction 1 - gamma of the clients is paired, and the "
                "server receives both bits of every pair"
                if cat.independent_share
                else "The server receives both bits of every pair"
            )
            if joint is not None:
                lb_u = joint.get("per_update", {}).get("delta_lower_bound")
                why = (
                    f": for one update delta >= {_g(lb_u)} whatever eps" if lb_u is not None else ""
                )
            else:
                why = f" (pair-joint numbers not computed: {pair_reason or 'not in this report'})"
            b["guarantee"] = (
                f"No DP. {who}; their joint law gives zero probability to outcomes that a "
                f"neighbouring input makes possible, so no eps holds at any useful delta{why}. "
                "The per-parameter eps_p holds only against an eavesdropper on one uplink (A)."
                + (
                    " A client that quantizes independently in a round gets A's eps_p for that "
                    "round, but it cannot know beforehand that it will."
                    if cat.independent_share
                    else ""
                )
            )
        if joint is not None:
            b["pair_joint"] = joint
    else:
        b["dp"] = True
        b.update(_blocks(view_a, "per_parameter", "per_update", "all_rounds"))
        b["headline"] = "same as A (independent local noise)"
        alone = "With gamma = 1 no client is paired: each" if cat.independent_share else "Each"
        b["guarantee"] = (
            f"Same as A. {alone} client randomizes its own upload independently of the others, "
            "so seeing every client's upload tells the server about one client only what that "
            "client's upload tells (the other uploads do not depend on its data)." + cat.caveat_b
        )

    # ---------------------------------------------------------------- (C) malicious client
    c = tm["C"]
    if paired:
        c["headline"] = "no DP (nothing bounds the global model)"
        if cat.independent_share:
            c["guarantee"] = (
                "No DP. A client receives the global model, computed from every bit the server "
                "sees (no DP there), and a paired client also knows its partner's common "
                "randomness z. " + _EQ5_NOT_A_BOUND
            )
        else:
            c["guarantee"] = (
                "No DP. A client receives the global model, computed from every paired bit, "
                "and a paired client also knows its partner's common randomness z, which the "
                "pair-joint view of B assumes secret; no accounting bounds what the global "
                "model reveals."
            )
    else:
        c["dp"] = True
        c.update(_blocks(b, "per_parameter", "per_update", "all_rounds"))
        c["headline"] = "same as B (it sees only the global model)"
        c["guarantee"] = (
            "At least B's guarantee: a client receives only the global model, which the server "
            "computes from the uploads it sees (post-processing of B's view)."
        )

    # ---------------------------------------------------------------- (D) malicious server
    d = tm["D"]
    if cat.paired:
        d["headline"] = "no DP (it can learn each pair's z)"
        d["guarantee"] = (
            "No DP (SECURITY.md, threat model 4). The X25519 public keys it relays are not "
            "authenticated end to end, so it can substitute its own, open each pair's sealed "
            "seed and learn the common randomness z; it also chooses the pairing, so it can "
            "pair a client with one it controls. Given z, a paired bit is a threshold "
            "comparison."
            + (
                " It also chooses which clients quantize independently."
                if cat.independent_share
                else ""
            )
        )
    else:
        d["dp"] = True
        unit = cat.unit
        d.update(_blocks(view_a, "per_update" if unit == "update" else "per_parameter"))
        d["headline"] = f"per-{unit} eps_p only, at the eps it sets"
        d["guarantee"] = (
            f"Per {unit} only: the noise is drawn on the client, so each release stays "
            f"eps_p-DP per {unit} (here eps_p = {ep:g}) for any "
            + ("model" if unit == "update" else "model, center and radius")
            + " the server sends, at an epsilon no larger than the client's own policy allows "
            "(corbin-max-epsilon, checked on every instruction); but the server sets the number "
            "of rounds, so A's composed numbers do not bind it."
        )

    # ---------------------------------------------------------------- notes (this mechanism only)
    notes.append(
        "worst case: a client is assumed to take part in every one of the "
        f"{rounds} rounds; the numbers count parameters (or updates), not users"
    )
    if cat.method_note:
        notes.append(cat.method_note)
    elif cat.randomized_response:
        notes.append(
            "(A) each bit is binary randomized response with P(+) in [1/(1+e^eps_p), "
            "e^eps_p/(1+e^eps_p)]; k composed bits have an exact binomial privacy-loss "
            "distribution, which gives (eps, delta)"
            + ("; CorBinQ's marginal equals LDPQ's (Theorem 1)" if cat.paired else "")
        )
    elif cat.family == "pure":
        notes.append(
            f"(A) {mech} is pure eps_p-DP per parameter; k parameters are dominated by k-fold "
            "randomized response (optimal composition, Kairouz et al. 2015)"
        )
    elif cat.unit == "parameter":
        notes.append(
            "(A) analytic Gaussian noise per parameter (mu = 2r/sigma); k Gaussian releases "
            "compose exactly to one with mu*sqrt(k)"
        )
    else:
        notes.append(
            f"(A) {mech}: update-level (eps_p, delta) per round; rounds compose as Gaussian "
            "releases"
        )
    if isinstance(pair, Mapping) and cat.paired:
        p_inf = (pair.get("per_parameter") or {}).get("single_triple_inf_mass")
        if p_inf is not None:
            notes.append(
                "(B) the pair-joint privacy loss has an atom at +infinity of mass "
                f"p_inf = {_g(p_inf)} per parameter, so k parameters have "
                "delta >= 1-(1-p_inf)^k for every eps"
            )
    elif cat.paired:
        notes.append(f"(B) pair-joint view not computed: {pair_reason or 'not in this report'}")
    return tm, notes


# ============================================================================ secure aggregation

_SUM_NAME = "server, sees only the sum"
"""Threat model B's name in a report with secure aggregation (the server sees only sums)."""


def _sum_who(s: SumView) -> str:
    """Who is in the sum the server sees, in the words every (B) sentence starts with."""
    if s.source == "rounds":
        where = (
            f"at least n = {s.n} clients in each of the {s.rounds} round(s) whose sum it unmasked "
            "(the fewest survivors of any round"
            + (f"; {s.abandoned} round(s) abandoned, nothing unmasked" if s.abandoned else "")
            + ")"
        )
    else:
        where = f"the configured n = {s.n} clients (no round of this run unmasked a sum)"
    return (
        "With secure aggregation (SecAgg+) the server learns, per parameter and round, only the "
        f"sum of the symbols of {where}"
    )


_SUM_ASSUMES = (
    " This holds against a server that follows the protocol (honest-but-curious; D says what "
    "a deviating one can do) and colludes with no client: a client knows its own symbols, so "
    "against the server and c colluding clients these figures hold at n - c."
)


def _secagg_deviation(s: SumView) -> str:
    """What secure aggregation leaves against a malicious server (the code's checks, exactly)."""
    params = (
        f" This run: Shamir threshold t >= {s.threshold} of k >= {s.neighbours} neighbours."
        if s.threshold is not None and s.neighbours is not None
        else ""
    )
    return (
        " Secure aggregation does not bind a deviating server. It relays the SecAgg+ public keys, "
        "which are not authenticated end to end either, so it can substitute its own, open every "
        "share ciphertext and unmask any client's input. Relaying them honestly, it can still lie "
        "about dropouts: an honest client refuses an unmask request that names one client both "
        "survivor and dropped, answers one unmask request per round, and refuses a threshold "
        "t <= k/2 of its k neighbours, but no round checks that every client got the same "
        "survivor list, so a server that names a victim a survivor to the victim's neighbours "
        "and each of those neighbours dropped to t of theirs recovers the victim's self mask and "
        "every mask key of its pairwise masks, hence its symbols (tested: 10 clients, t = 5, no "
        f"colluding client).{params}"
    )


def _secure_blocks(
    sum_view: Mapping[str, Any], view_a: Mapping[str, Any] | None, m: int, rounds: int
) -> tuple[dict[str, Any], bool]:
    """``per_parameter`` / ``per_update`` / ``all_rounds`` blocks of one ``secure_sum`` result.

    A composed ``eps`` above threat model A's at the same ``delta`` (both hold; only at a tiny
    ``n``, where the PLD grid costs more than the sum gains) is replaced by A's. Returns the
    blocks and whether one was.
    """
    pp = sum_view["per_parameter"]
    out: dict[str, Any] = {"per_parameter": {"eps": pp["eps"], "delta": pp["delta"]}}
    took_a = False
    for part, k in (("per_update", m), ("all_rounds", m * rounds)):
        eps = float(sum_view[part]["eps"])
        a_block = view_a.get(part) if isinstance(view_a, Mapping) else None
        same_delta = isinstance(a_block, Mapping) and a_block["delta"] == sum_view[part]["delta"]
        if same_delta and not eps <= float(a_block["eps"]):  # type: ignore[index]
            eps, took_a = float(a_block["eps"]), True  # type: ignore[index]
        out[part] = {"k": k, "eps": eps, "delta": sum_view[part]["delta"]}
    return out, took_a


def _secure_threat_models(
    report: dict[str, Any],
    cat: Privacy,
    eps_p: float | None,
    view_a: Mapping[str, Any] | None,
    d: int | None,
    gamma: float | None,
    r: float | None,
    s: SumView,
) -> None:
    """Threat models B, C and D of a run with secure aggregation (``report`` is changed in place).

    (B) is computed by :mod:`corbin_fl.mechanisms.secure_sum` from ``s`` (the fewest clients in
    an unmasked sum), the report's ``m`` and rounds, at the report's ``delta``:

    - independent mechanisms whose symbols are binomial (``s.trials``: one bit, or PBM's
      trials): the exact worst case over all inputs, composed (``dp`` true);
    - AugCorBin-FL: the exact worst case at the independent clients of the worst round (the
      entry's ``independent`` block says how many, of how many, and from where); ``dp`` where it
      is finite; nothing from the paper's eq. (5), which is not a valid bound;
    - CorBin-FL: no DP (a pair's sum is nearly deterministic), with the lower bound on ``delta``;
    - a mechanism without DP: no DP (the sum carries no noise);
    - any other local-DP mechanism: A's guarantee, which the sum can only improve (not computed).

    (A) does not change. (C): a client knows its own symbols, so B's sum figures do not carry
    over to it as they are; its entry says so where it quoted B. (D) keeps its guarantee and
    says what secure aggregation leaves against a deviating server (:func:`_secagg_deviation`).
    The exact profile is computed at ``min(n, secure_sum.REPORT_MAX_N)``, which bounds any larger
    ``n``.
    """
    from corbin_fl.mechanisms import secure_sum as ss

    tm: dict[str, dict[str, Any]] = report["threat_models"]
    m, rounds = int(report["m"]), int(report["rounds"])
    delta = float(report["delta"]) if "delta" in report else 0.0  # none without DP
    notes = [n for n in report["notes"] if not n.startswith("(B)")]
    n_eff = min(s.n, ss.REPORT_MAX_N)
    capped = (
        f" (computed at n = {n_eff}, which bounds every larger n: the guarantee never gets worse "
        "as n grows)"
        if n_eff < s.n
        else ""
    )
    block = {**s.as_dict(), "computed_at_n": n_eff}
    b: dict[str, Any] = {"name": _SUM_NAME, "dp": False}
    who = _sum_who(s)
    b_note = ""
    if cat.no_dp is not None:
        b["headline"] = "no DP (the sum carries no noise)"
        b["guarantee"] = (
            f"No DP. {who}; the symbols carry no noise, so their sum is a deterministic function "
            "of the clients' updates and no eps holds."
        )
    elif cat.paired and not cat.independent_share:
        if d is None:
            b["headline"] = "no DP (a pair's sum is nearly deterministic)"
            b["guarantee"] = (
                f"No DP, even with secure aggregation. {who}; a pair's bits sum to the randomized "
                "rounding of q1 + q2 (nearly deterministic), so a neighbouring input makes an "
                "impossible sum possible (d not given: no numbers)."
            )
        else:
            c = ss.corbin_against_sum(float(eps_p or 0.0), int(d), m, rounds)
            b["headline"] = "no DP (a pair's sum is nearly deterministic)"
            b["guarantee"] = f"{c['guarantee']} {who}: that does not help."
            b["sum"] = {
                "per_parameter": {"inf_mass": c["per_parameter"]["inf_mass"]},
                "per_update": {"k": m, "delta_lower_bound": c["per_update"]["delta_lower_bound"]},
                "all_rounds": {
                    "k": m * rounds,
                    "delta_lower_bound": c["all_rounds"]["delta_lower_bound"],
                },
            }
            b_note = (
                "(B) secure aggregation: CorBin-FL's pair sum is the randomized rounding of "
                f"q1 + q2; an outcome impossible under a neighbouring input has mass p_inf = "
                f"{_g(c['per_parameter']['inf_mass'])} per parameter (mechanisms/secure_sum.py, "
                "corbin_against_sum)"
            )
    elif cat.paired:  # AugCorBin-FL
        ep = float(eps_p or 0.0)
        g_eff = gamma if gamma is not None else (s.independent or 0) / s.n
        ac = ss.augcorbin_guarantee(
            ep,
            s.n,
            g_eff,
            m,
            rounds,
            delta,
            independent=s.independent,
            paired=s.paired,
            max_exact_n=ss.REPORT_MAX_N,
        )
        n_ind = int(ac["independent"])
        exact = ac.get("exact")
        b["dp"] = bool(ac["dp"])
        if s.independent is not None:
            drawn = "the fewest in any unmasked sum"
        else:
            drawn = "floor(gamma n + 1/2) as the pairing draws it"
        configured = (
            f"; gamma = {gamma:g} configured, so {n_ind} of {s.n} is the share used"
            if gamma is not None
            else ""
        )
        who_ind = f"{who}, of which {n_ind} quantized independently ({drawn}{configured})"
        b["independent"] = {"count": n_ind, "of": s.n, "from": ac["independent_from"]}
        if b["dp"] and isinstance(exact, Mapping):
            blocks, took_a = _secure_blocks(exact, view_a, m, rounds)
            b.update(blocks)
            run = blocks["all_rounds"]
            pp = blocks["per_parameter"]
            b["headline"] = _run_headline(run["eps"], delta, f"over the run, n >= {s.n}")
            b["guarantee"] = (
                f"{who_ind}. The exact worst case (an independent client's bit among the other "
                "independent ones, or a paired client's bit, which given its partner's can be "
                "a point mass, over the independent clients' bits) gives "
                f"{_per_parameter_sentence(pp['eps'], delta, ep)}; composed, one update "
                f"of m = {m:,} parameters is ({_g(blocks['per_update']['eps'])}, "
                f"{delta:g})-DP and all {rounds} rounds are ({_g(run['eps'])}, "
                f"{delta:g})-DP{capped}.{_protection_sentence(run['eps'], rounds)} "
                f"{_EQ5_NOT_A_BOUND}{_SUM_ASSUMES}"
            )
        else:
            b["headline"] = "no DP (too few independent clients)"
            b["guarantee"] = (
                f"No DP. {who_ind}. A paired client's bit, given its partner's, can be a point "
                "mass, so only the independent clients' bits hide it, and with so few of them "
                "a sum impossible under a neighbouring input keeps a mass that, composed over "
                f"the run, exceeds delta = {delta:g}. {_EQ5_NOT_A_BOUND}"
            )
        b_note = (
            "(B) secure aggregation: AugCorBin-FL against the sum: the exact worst case of "
            "mechanisms/secure_sum.py (augcorbin_profile) at the fewest independent clients in "
            "an unmasked sum, composed with dp_accounting's PLD; nothing from the paper's eq. (5) "
            "(not a valid bound)"
        )
    elif s.trials is not None:
        ep = float(eps_p or 0.0)
        if s.trials == 1:
            g = ss.one_bit_guarantee(ep, n_eff, m, rounds, delta)
            what = "each symbol is one bit with P(1) in [1/(1+e^eps_p), e^eps_p/(1+e^eps_p)]"
        else:
            g = ss.pbm_guarantee(ep, s.trials, n_eff, m, rounds, delta)
            what = (
                f"each symbol counts the successes of {s.trials} trials with P in the range of "
                "(eps_p/M)-randomized response (PBM's native setting, arXiv 2108.09449)"
            )
        blocks, took_a = _secure_blocks(g, view_a, m, rounds)
        b.update(blocks)
        b["dp"] = True
        run = blocks["all_rounds"]
        b["headline"] = _run_headline(run["eps"], delta, f"over the run, n >= {s.n}")
        a_run = (view_a or {}).get("all_rounds", {}).get("eps")
        pp_eps = blocks["per_parameter"]["eps"]
        b["guarantee"] = (
            f"{who}; {what}. The exact worst case over every input of this client and of the "
            f"other n - 1 gives {_per_parameter_sentence(pp_eps, delta, ep)}; composed with a "
            "dominating privacy-loss distribution, one update of "
            f"m = {m:,} parameters is ({_g(blocks['per_update']['eps'])}, {delta:g})-DP and all "
            f"{rounds} rounds are ({_g(run['eps'])}, {delta:g})-DP{capped}"
            + (f" (A's, the uploads one by one: {_g(a_run)})" if a_run is not None else "")
            + "."
            + _protection_sentence(run["eps"], rounds)
            + _SUM_ASSUMES
        )
        b_note = (
            "(B) secure aggregation: exact worst case of one client's symbols in the sum over "
            "every input of it and of the others (vertices of the probability box, both "
            "directions; mechanisms/secure_sum.py), composed over m parameters and T rounds "
            "with a dominating connect-the-dots PLD (dp_accounting), one chain of FFT "
            "compositions for the update and the run"
            + ("; a composed eps above A's is replaced by A's (both hold)" if took_a else "")
        )
    else:  # local DP whose sum this report does not analyse: at least A's
        b["dp"] = True
        b.update(_blocks(view_a, "per_parameter", "per_update", "all_rounds"))
        b["headline"] = "at least A's (the sum is not analysed)"
        b["guarantee"] = (
            f"At least A's. {who}, a function of the uploads, so each client keeps A's "
            "guarantee; how much the sum adds is not computed for this mechanism and settings "
            "(only binomial symbols have the exact worst case of mechanisms/secure_sum.py)."
            + _SUM_ASSUMES
        )
        b_note = "(B) secure aggregation: the sum is not analysed for these settings; A's numbers"
    tm["B"] = b
    if b_note:
        notes.append(b_note)

    # (C): a client knows its own symbols; the entries that quoted B or the pair-joint view
    c = tm["C"]
    if not cat.paired and c.get("dp") and cat.no_dp is None:
        c["headline"] = "at least A's (it sees only the global model)"
        c["guarantee"] = (
            "At least A's guarantee (these numbers): a client receives only the global model, a "
            "function of the uploads. B's figures for the sum do not carry over as they are: a "
            "client knows its own symbols, so for it they hold at n - 1 (n - c for c colluding "
            "clients), which this report does not compute."
        )
    elif cat.paired and not c.get("dp"):
        c["guarantee"] = (
            "No DP. A client receives the global model, a function of the sum the server sees, "
            "but a paired client also knows its partner's common randomness z, which the "
            "analysis against the server (B) assumes secret, and its own bits; no accounting "
            "here bounds what the global model reveals to it."
            + (f" {_EQ5_NOT_A_BOUND}" if cat.independent_share else "")
        )

    # (D): its guarantee stays; what secure aggregation leaves against a deviating server
    if cat.no_dp is not None:
        tm["D"]["guarantee"] = (
            "No DP: the uploads carry no noise, and a deviating server can unmask each of them."
        )
    tm["D"]["guarantee"] = str(tm["D"].get("guarantee", "")) + _secagg_deviation(s)
    notes.append(
        "(D) secure aggregation protects against an honest-but-curious server only: the "
        "SecAgg+ keys it relays are not authenticated, and no round checks that all clients got "
        "the same survivor list (SECURITY.md, Secure aggregation)"
    )
    report["notes"] = notes
    report["secure_aggregation"] = block


def privacy_report(
    mechanism: str,
    eps_p: float | None,
    delta: float,
    m: int,
    rounds: int,
    d: int | None = None,
    gamma: float | None = None,
    n: int | None = None,
    *,
    r: float | None = None,
    delta_p: float | None = None,
    fedcad_delta: float | None = None,
    planned_rounds: int | None = None,
    secure: SumView | None = None,
) -> dict[str, Any]:
    """JSON-ready privacy summary of a run, per threat model (the server calls this once).

    Parameters
    ----------
    mechanism : str
        One of :data:`MECHANISMS` (aliases ``ldp``, ``vanilla`` accepted).
    eps_p : float or None
        Per-parameter budget (per-round update budget for ``fedcad``); ignored for
        ``cq``/``fedavg``.
    delta : float
        Target ``delta`` of the composed guarantees.
    m : int
        Parameters per update.
    rounds : int
        Number of rounds ``T`` a client may take part in (worst case: all).
    d : int, optional
        Shared bits (``corbin``/``augcorbin``): enables the pair-joint numbers of (B).
    gamma : float, optional
        AugCorBin LDPQ fraction (with ``gamma = 1`` no client is paired; the MSE bound of
        Theorem 3).
    n : int, optional
        Clients per round (the MSE bounds).
    r : float, optional
        ``max_j r_j`` (the MSE bounds).
    delta_p : float, optional
        Per-parameter ``delta`` of the ``gaussian`` mechanism (default ``delta``).
    fedcad_delta : float, optional
        Per-round ``delta`` of ``fedcad`` (default ``delta``).
    planned_rounds : int, optional
        ``central-gaussian``: the rounds its noise was calibrated for (``num-rounds``; default
        ``rounds``); ``eps_p`` is then the central ``epsilon`` of those rounds.
    secure : SumView, optional
        The run had secure aggregation (:class:`corbin_fl.mechanisms.secure_sum.SumView`: the
        fewest clients in an unmasked sum, ...): (B) is then the guarantee against a server that
        sees only the sum, and the report gets a ``secure_aggregation`` block
        (:func:`_secure_threat_models`). None (the default): the report of a run without it.

    Returns
    -------
    dict
        Plain JSON types. Keys: ``version`` (:data:`REPORT_VERSION`), ``mechanism``, ``m``,
        ``rounds``, ``eps_p`` (``None`` without DP), ``delta`` (the target of the composed
        guarantees; absent for ``fedavg`` and ``cq``, which have none), ``threat_models``
        (``A``: eavesdropper on one uplink, ``B``: server that sees every bit, ``C``: malicious
        client, ``D``: malicious server; see :func:`_threat_models` for each entry), ``notes``
        (how the numbers were obtained, about this mechanism only) and, for ``corbin``,
        ``augcorbin`` and ``ldpfl`` with ``n`` and ``r``, ``mse_bounds`` (accuracy, not
        privacy). No figure comes from the paper's eq. (5), which is not a valid bound
        (:func:`corbin_fl.mechanisms.theory.eq5_as_printed`).

        Against (A), ``k`` released parameters compose exactly: pure ``eps_p``-DP bits as
        ``k``-fold randomized response (``L = eps_p (k - 2J)``, ``J ~ Binomial(k,
        1/(1+e^eps_p))``), Gaussian ones as one Gaussian with ``mu sqrt(k)``; one update is
        ``k = m``, the run ``k = m T`` (``T`` updates for ``fedcad``). Against (B), paired
        bits have a privacy loss with an atom at ``+infinity`` of mass ``p_inf`` per parameter,
        hence ``delta >= 1 - (1 - p_inf)^k`` for every ``eps``: no DP (with ``secure``: see
        :func:`_secure_threat_models`).
    """
    mech = _canonical_mechanism(mechanism)
    cat = category(mech)
    delta = probability(delta, "delta")
    m = integer(m, "m", 1)
    rounds = integer(rounds, "rounds", 1)
    if gamma is not None:
        gamma = real(gamma, "gamma", finite=False)
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {gamma!r}")
    report: dict[str, Any] = {
        "version": REPORT_VERSION,
        "mechanism": mech,
        "m": m,
        "rounds": rounds,
        "eps_p": None,
    }
    if cat.family == "none":
        report["threat_models"], report["notes"] = _threat_models(
            mech, cat, None, m, rounds, None, None, None, gamma
        )
        if secure is not None:
            _secure_threat_models(report, cat, None, None, d, gamma, r, secure)
        return report
    if cat.family == "central":
        if secure is not None:
            raise ValueError(f"{mech}: the server adds the noise, so it cannot sum masked inputs")
        target = positive(eps_p, "eps_p")
        planned = rounds if planned_rounds is None else integer(planned_rounds, "rounds", 1)
        report["delta"] = delta
        report["threat_models"], report["notes"] = _central_threat_models(
            target, delta, rounds, planned
        )
        return report
    ep = positive(eps_p, "eps_p")
    report["eps_p"] = ep
    report["delta"] = delta
    k_all = m * rounds
    view_a: dict[str, Any]
    if cat.family == "pure":
        view_a = {
            "per_parameter": {"eps": eps_parameter(ep), "delta": 0.0},
            "per_update": _rr_block(ep, m, delta),
            "all_rounds": _rr_block(ep, k_all, delta),
        }
    elif cat.unit == "parameter":
        dp = delta if delta_p is None else probability(delta_p, "delta_p")
        mu1 = 1.0 / analytic_gaussian_sigma(ep, dp, 1.0)
        view_a = {
            "per_parameter": {"eps": ep, "delta": dp, "mu": mu1},
            "per_update": {
                "k": m,
                "eps": gaussian_epsilon(delta, mu1 * math.sqrt(m)),
                "delta": delta,
            },
            "all_rounds": {
                "k": k_all,
                "eps": gaussian_epsilon(delta, mu1 * math.sqrt(k_all)),
                "delta": delta,
            },
        }
    else:  # a Gaussian release of the whole update, once per round (fedcad)
        dp = delta if fedcad_delta is None else probability(fedcad_delta, "fedcad_delta")
        mu1 = 1.0 / analytic_gaussian_sigma(ep, dp, 1.0)
        view_a = {
            "per_update": {"k": 1, "eps": ep, "delta": dp, "mu": mu1},
            "all_rounds": {
                "k": rounds,
                "eps": gaussian_epsilon(delta, mu1 * math.sqrt(rounds)),
                "delta": delta,
            },
        }
    pair: dict[str, Any] | None = None
    pair_reason: str | None = None
    if cat.paired and secure is not None:
        pair_reason = "secure aggregation: the server sees no pair's two bits"
    elif cat.paired:
        if d is None:
            pair_reason = "d not given"
        elif isinstance(d, bool) or not isinstance(d, int | np.integer):
            raise TypeError(f"d must be an int, got {type(d).__name__}")
        elif not 1 <= int(d) <= MAX_PAIR_D:
            pair_reason = f"d = {int(d)} is outside 1..{MAX_PAIR_D}"
        else:
            pld = pair_joint_pld(ep, int(d))
            pair = {
                "per_parameter": {
                    "inf_mass": pld.inf_mass,
                    "single_triple_inf_mass": pld.single_inf_mass,
                    "max_finite_loss": pld.max_finite_loss,
                },
                "per_update": _pair_block(ep, int(d), m, delta),
                "all_rounds": _pair_block(ep, int(d), k_all, delta),
            }
    report["threat_models"], report["notes"] = _threat_models(
        mech, cat, ep, m, rounds, view_a, pair, pair_reason, gamma
    )
    if n is not None and r is not None and cat.randomized_response:
        report["mse_bounds"] = {
            "ldpfl": float(ldpfl_mse(r, ep, n)),
            "corbin_theorem2": float(theorem2_bound(r, ep, n)),
            "alpha": float(alpha64(ep)),
        }
        if cat.independent_share and gamma is not None:
            # Theorem 3's MSE bound (d -> infinity): accuracy, not privacy
            report["mse_bounds"]["augcorbin_theorem3"] = float(theorem3_mse_bound(r, ep, n, gamma))
    if secure is not None:
        _secure_threat_models(report, cat, ep, view_a, d, gamma, r, secure)
    return report
