r"""The privacy-loss math of CorBin-FL: exact compositions and their (eps, delta) conversions.

Pure functions on float64 (NumPy; no torch, no Flower, no state), in the shape of
``dp_accounting``'s PLD module. The ledger and the accountant that compose releases live in
:mod:`corbin_fl.mechanisms.accounting`; the report that states a guarantee per threat model in
:mod:`corbin_fl.mechanisms.report`.

Threat model (A): one uplink
----------------------------
An eavesdropper on one client's uplink (or a server that looks at one client's bits alone)
sees, per parameter, one bit whose law is LDPQ's whatever the pairing: the marginal of CorBinQ
equals LDPQ's (CorBin-FL Theorem 1, Appendix B). Each bit is binary randomized response with
``P(+) = q in [1/(1+e^eps_p), e^eps_p/(1+e^eps_p)]``; the worst neighbouring inputs are the end
points, so one parameter is exactly ``eps_p``-DP (PLDP, eq. (3)) and ``k`` released parameters
are the ``k``-fold composition of binary randomized response, whose privacy-loss distribution
is exact: ``L = eps_p (k - 2 J)``, ``J ~ Binomial(k, 1/(1+e^eps_p))`` (the number of flipped
bits). One update is ``k = m`` (the model size); ``T`` rounds are ``k = m T``
(:func:`rr_delta`, :func:`rr_epsilon`).

Threat model (B): both bits of a pair
-------------------------------------
An observer who sees both uplinks of a CorBinQ pair (for example the honest-but-curious server,
which receives both updates) sees, per parameter, ``(U1, U2)`` with the joint law of
:func:`mechanisms.theory.corbin_pair_joint`. Client 1 changes ``w1 -> w1'`` while ``w2`` stays.
The negative correlation that makes CorBinQ accurate puts *zero* mass on some outcomes
(``P(++) = 0`` when ``q1 + q2 < 1`` off the tie cell), so an outcome possible under ``w1`` can
be impossible under ``w1'``: the privacy loss has an atom at ``+infinity`` of mass ``p_inf``
(close to ``1/alpha(eps_p)``), there is no pure ``eps`` at all, and ``k`` parameters have
``delta >= 1 - (1 - p_inf)^k``, which is 1 to machine precision for any real model
(:func:`pair_joint_pld`, :func:`pair_joint_delta`, :func:`pair_joint_epsilon`).

Everything is SciPy-free; ``dp_accounting`` (a dependency) is used only by
:func:`pair_joint_delta` with ``method="dp_accounting"`` (imported there: a measured start-up
cost) and by the tests.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from corbin_fl.mechanisms.theory import corbin_pair_joint_from_q
from corbin_fl.mechanisms.validate import integer, positive, probability, real

__all__ = [
    "MAX_PAIR_D",
    "Method",
    "PairJointPLD",
    "eps_parameter",
    "pair_joint_delta",
    "pair_joint_epsilon",
    "pair_joint_pld",
    "rr_delta",
    "rr_epsilon",
]

#: Largest ``d`` for which the pair-joint view is computed (cost grows like ``2^d``); matches
#: ``mechanisms.quantizers.MAX_SHARED_BITS``.
MAX_PAIR_D = 16

_EXACT_MAX_TERMS = 1_000_000
_WINDOW_Z = 30.0


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
    cumulative ``log sum P e^{-L}`` is ``np.logaddexp.accumulate``). The mass outside the window
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
    log_cum_s2 = np.logaddexp.accumulate(logp - loss)
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
    # dp_accounting's PLD module costs about 1.2 CPU-s to import on top of this module
    # (time.process_time around the import, 2026-11-29); only method="dp_accounting" needs it
    from dp_accounting.pld import privacy_loss_distribution as dpl

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
