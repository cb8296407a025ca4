r"""Privacy against a server that sees only the SUM of the clients' symbols (secure aggregation).

With secure aggregation (SecAgg+, Bell et al., CCS 2020; Bonawitz et al., CCS 2017) the server
of threat model B learns, per parameter and round, only ``S = sum_i U_i``, the sum of the ``n``
participating clients' quantized symbols (and who took part). This module is the math of the
guarantee one client's symbols then get against that server. Pure NumPy / SciPy, plus
``dp_accounting``'s privacy-loss-distribution (PLD) accountant for composition; ``alpha`` comes
from :mod:`corbin_fl.mechanisms.theory`. No guarantee here comes from the paper's eq. (5)
(Theorem 3), which is not a valid bound (:func:`corbin_fl.mechanisms.theory.eq5_as_printed`).

Papers (public references): CorBin-FL = Salehi et al., "CorBin-FL: a differentially private
federated learning mechanism using common randomness", arXiv:2409.13133 (Algorithms 1-2,
Theorem 3); PBM = Chen, Ozgur & Kairouz, "The Poisson binomial mechanism for unbiased federated
learning with secure aggregation", ICML 2022 (arXiv:2108.09449); cpSGD = Agarwal et al.,
NeurIPS 2018; dominating pairs = Zhu, Dong & Wang, "Optimal accounting of differential privacy
via characteristic function", AISTATS 2022; connect-the-dots = Doroshenko, Ghazi, Kamath, Kumar
& Manurangsi, "Connect the dots: tighter discrete approximations of privacy loss
distributions", PETS 2022; hockey-stick divergence and PLDs = Meiser & Mohammadi (CCS 2018),
Koskela et al. (AISTATS 2020).

Neighbouring relation: one client replaces its input (any input in its clipping box) while
every other client keeps its own; the worst case is taken over both inputs of that client AND
over all inputs of the other ``n - 1`` clients. ``(eps, delta)`` is the usual
``P(S in A) <= e^eps P'(S in A) + delta`` for every set ``A``, in both directions.

Independent one-bit mechanisms (``ldpfl``, ``pbm`` with ``m = 1``, ``rqm`` with 2 levels)
-----------------------------------------------------------------------------------------
All three send one bit with ``P(bit = 1) = p`` in ``[a, b]``, ``a = 1/(e^eps_p + 1)``,
``b = e^eps_p/(e^eps_p + 1)`` (LDPQ: ``q = 1/2 + (w - c)/(2 r alpha)``, ``alpha =
coth(eps_p/2)``; PBM with one trial: ``p = 1/2 + theta x``, ``theta = tanh(eps_p/2)/2``; RQM with
two levels: ``P(X | x) = (X + x)/(2X)``, ``X = alpha``; the same law exactly). The server sees
``S = X_1 + Y``, ``Y = sum_{j >= 2} X_j`` independent of ``X_1``.

*Worst case at the vertices.* The hockey-stick divergence
``H_g(P || Q) = sup_A P(A) - g Q(A) = sum_s (P(s) - g Q(s))_+`` is jointly convex in ``(P, Q)``.
The pmf of ``S`` is affine in each single probability ``p_j`` (condition on the other bits:
``P(S = s) = p_j P(R = s - 1) + (1 - p_j) P(R = s)``), under both neighbouring inputs alike,
so ``H_g`` is a convex function of each ``p_j`` over ``[a, b]`` and is largest at an end point;
fixing the others and repeating, the supremum over the box ``[a, b]^(n-1)`` is attained at a
vertex. The same argument for the client's own pair ``(p_1, p_1')`` gives ``{a, b}`` (and equal
end points give 0). ``S`` depends on the vertex only through ``k``, the number of others at
``b``: the worst case is the maximum over ``k = 0..n-1`` (and both directions) of the pair

    ``P_k = Bern(b) * Bin(k, b) * Bin(n-1-k, a)``,  ``Q_k = Bern(a) * Bin(k, b) * Bin(n-1-k, a)``

(``*`` is convolution). :func:`one_bit_profile` computes every ``delta_k(eps)`` exactly (float64,
from the binomial pmfs; sums of non-negative terms, so relative accuracy ~1e-13) and the
per-parameter guarantee is ``delta(eps) = max_k max(H(P_k || Q_k), H(Q_k || P_k))``.
With ``delta = 0`` nothing improves: ``S = n`` has likelihood ratio ``b/a = e^eps_p`` at
``k = n - 1``, so the pure guarantee is ``eps_p`` for every ``n``; the gain needs ``delta > 0``.
It never gets worse with ``n``: adding an independent client's bit to ``S`` is post-processing
of ``S`` (its law does not depend on client 1), and the worst case over more others is the
worst case over fewer others with one more post-processing step.

*Composition (sound when the worst ``k`` differs from step to step).* Parameters and rounds are
``K = m T`` steps, and the others' inputs (hence ``k``) and the side to which the client's input
moves may differ at every step, adaptively. Every step's ordered pair is in the set ``S`` of all
``(P_k, Q_k)`` and ``(Q_k, P_k)``, which is closed under reversal, so both directions of the
guarantee compose the same set (and the flip ``s -> n - s`` maps ``(Q_k, P_k)`` to
``(P_{n-1-k}, Q_{n-1-k})``). :mod:`corbin_fl.mechanisms.server_pld` bounds the composition by
the least of three sound bounds: (1) where one ordered vertex pair dominates all of ``S``
(``H_g`` above every other pair's for every ``g >= 0``, checked exactly at every kink of the
curves), the ``K``-fold composition of that pair's exact pmfs (pessimistic rounding);
otherwise (2) the connect-the-dots PLD (Doroshenko et al. 2022) of the envelope
``max_S H_g`` on a grid of ``eps`` covering every finite loss (exact at both ends; as a function
of ``g = e^eps`` the chord interpolation of that convex envelope, never below any pair), the
tightest single dominating pair; and (3) Renyi DP, ``K max_S D_alpha`` converted to
``(eps, delta)`` (Canonne, Kamath & Steinke 2020, Prop. 12) at the best of a grid of orders.
(1) and (2) dominate every step, and the product of per-step dominating pairs dominates the
adaptive composition (Zhu, Dong & Wang 2022, Theorem 10); Renyi divergences of an adaptive
composition add up (Mironov 2017, Prop. 1). :func:`dominating_pld` builds (1) or (2),
:func:`compose` self-composes it ``K`` times (FFT, pessimistic tail truncation;
:func:`compose_run` gives one update and the run from one chain) and both take the minimum
with (3). Among the one-bit mechanisms no vertex pair dominates for ``n >= 2`` (the exact check
finds none for ``n`` = 2 .. 12 and 50): the worst pair changes with ``g``, and (2) alone costs
up to 1.23x over the worst fixed vertex composed exactly; the least of (2) and (3) is within
6.1% of it on ``bench/bench_server_accounting.py``'s grid (docs/BENCHMARKS.md). The result is
never below the worst single vertex composed exactly (tested).

PBM with ``M`` trials (its native setting)
-------------------------------------------
Each client sends ``Binomial(M, p_i)``, ``p_i = 1/2 + theta x_i`` in ``[pl, ph]`` with
``theta = tanh(eps/(2M))/2`` (so ``ph/pl = e^(eps/M)``; the project's calibration to pure
``eps``-LDP per coordinate), and the server sees the Poisson-binomial sum. The pmf is not affine
in ``p_i`` (degree ``M``), but ``Bin(M, p) = sum_j Bin(M, lam)(j) V_j`` with
``V_j = Bin(j, ph) * Bin(M - j, pl)`` and ``lam = (p - pl)/(ph - pl)`` (each trial is the mixture
``lam Bern(ph) + (1 - lam) Bern(pl)``): every input is a mixture of the ``M + 1`` vertex laws,
with the same weights under both neighbouring inputs for the others. Joint convexity bounds
``H`` by its maximum over vertex configurations. Aligning the exchangeable trials, a vertex
configuration is ``D`` trials of client 1 that differ (``ph`` against ``pl``) and ``N = nM - D``
trials (the other clients' and client 1's common ones) of which ``k`` are at ``ph``:
``P = Bin(D, ph) * Bin(k, ph) * Bin(N - k, pl)``, ``Q = Bin(D, pl) * (same)``, ``D = 1..M``,
``k = 0..N``. :func:`binomial_profile` takes the maximum over all of them (a sound upper bound;
exact for ``M = 1``), composition as above.

AugCorBin-FL
------------
A fraction ``gamma`` of the clients quantizes independently (LDPQ), the others in CorBinQ pairs
(arXiv:2409.13133, Section 5). :mod:`corbin_fl.mechanisms.augcorbin` applies this module's exact
worst-case method to it (an independent client is the one-bit pair above among the other
independent ones; a paired client's bit, given its partner's, can be a point mass over the
independent clients' sum), composed like the others; the paper's eq. (5) is not a valid bound
and is not used there either.

CorBin-FL against the sum: no DP
--------------------------------
With common randomness ``Z`` (uniform over ``2^d`` codewords) the two partners' bits are
``U_1 = [Z < T_1]`` and ``U_2 = [Z > T_2]`` (Algorithm 2; ``mechanisms/quantizers.py``:
``T_1 = floor(2^d q_1)``, ``T_2 = floor(2^d (1 - q_2))``, local coins only on the codeword equal to
the threshold). If ``q_1 + q_2 <= 1`` the two ``+1`` regions are disjoint, so ``U_1 + U_2`` is 1
with probability ``q_1 + q_2`` and 0 otherwise; if ``q_1 + q_2 > 1`` they overlap and the sum is 2
with probability ``q_1 + q_2 - 1`` and 1 otherwise. So the pair's sum is the randomized rounding
of ``q_1 + q_2`` to one of the two integers around it, deterministic when ``q_1 + q_2`` is an
integer, except on the tie codewords (probability at most ``2^-d`` each). Take every other pair at
``q = 1/2`` (sum exactly 1), client 1's partner at ``q_2 = 1 - q_1`` with ``2^d q_1`` an integer
(no tie coin): under ``w_1`` the total ``S`` is deterministic; changing ``w_1`` to the top of its
range (``q_1' = b``) makes ``S`` one larger with probability ``b - q_1``, an outcome of probability
0 before. So the privacy loss has an atom at ``+infinity`` of mass
``p_inf = b - ceil(2^d a)/2^d >= 1/alpha - 2^-d`` per parameter (0.450 at ``eps_p = 1``,
``d = 5``), ``delta >= 1 - (1 - p_inf)^k`` for ``k`` parameters, whatever ``eps``
(:func:`corbin_against_sum`, ``dp: false``). Secure aggregation does not help CorBin-FL: the
pair's noise cancels by design, which is also why it is accurate.

What does not change (quotable)
-------------------------------
* **Threat model A** (an eavesdropper on one uplink): unchanged. Secure aggregation masks what
  the server receives, but each client still sends its own upload; with SecAgg+ the upload is
  masked, and an eavesdropper without the masks learns less, never more, than the per-upload
  LDP guarantee: each parameter stays ``eps_p``-LDP (PLDP, eq. (3)), ``k`` parameters compose as
  ``k``-fold randomized response. The guarantee of A is the same number as without secure
  aggregation.
* **Threat model D** (a malicious server): secure aggregation protects a client only against a
  server that follows the protocol (honest-but-curious). What the code enforces
  (:mod:`corbin_fl.secagg.client`): an honest client refuses an unmask request that names one
  client both survivor and dropped, answers one unmask request per round (a replay is refused),
  refuses at the share stage a threshold ``t <= |N|/2`` or ``t < 2`` and a neighbour set other
  than the graph derived from every participant's keys, and refuses an unmask whose survivor
  list is disconnected in that graph (SECURITY.md: what chosen dropouts can still get); so no
  single holder reveals both the self-mask share and the mask-key share of one client. It does
  NOT enforce more: the SecAgg+ public keys are relayed by the server and not authenticated end to
  end (a server that substitutes its own opens every share ciphertext and unmasks anyone), and
  no round checks that every client received the same survivor list (Bonawitz et al.'s
  consistency check with signatures is not implemented), so a server that names a victim a
  survivor to the victim's neighbours and each of those neighbours dropped to ``t`` of theirs
  recovers the victim's self mask and all its pairwise mask keys from honest clients alone
  (tests/unit/test_secure_report.py does it at ``n = 10``, ``t = 5``). What remains against a
  deviating server is the per-upload local guarantee of A (``eps_p`` per parameter for the
  mechanisms whose noise is drawn on the client) and, for CorBin-FL's paired clients, none
  (SECURITY.md, threat model 4). The server also chooses who takes part, so it can shrink the
  sum to few honest clients (or Sybils): the ``n`` of this module is the number of honest
  clients in the sum, not the number of participants.
* Threat model C (a malicious client) receives only the global model, a post-processing of
  ``S``, but it knows its own symbols: this module's numbers hold for it at ``n - 1`` (``n - c``
  for ``c`` colluding clients); for AugCorBin-FL at one independent client fewer.
* All numbers assume a client takes part in every round (worst case) and count parameters, not
  users.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy import stats

from corbin_fl.mechanisms import server_pld
from corbin_fl.mechanisms.theory import alpha64

__all__ = [
    "REPORT_MAX_N",
    "ComposedGuarantee",
    "SumProfile",
    "SumView",
    "VertexFamily",
    "binomial_guarantee",
    "binomial_profile",
    "binomial_range",
    "compose",
    "compose_run",
    "composed_report",
    "corbin_against_sum",
    "dominating_pld",
    "hockey_stick",
    "one_bit_guarantee",
    "one_bit_profile",
    "rr_range",
    "run_args",
]

Array = NDArray[np.float64]

_GRID_POINTS = 1 << 13
"""Fine grid: ``2^13`` steps per side of ``[-L, L]`` (``L`` = largest finite privacy loss)."""

_TINY = 1e-250
"""Probabilities below this count as outcomes of infinite privacy loss (sound; see _Curve)."""

_REL_SLACK = 1e-9
_ABS_SLACK = 1e-15
"""Added to every computed ``delta`` before it enters a composition (float64 rounding)."""

_CACHE_OUTCOMES = 2_000_000
"""Keep the sorted curves in memory up to this many outcomes (about 100 MB); else recompute."""

_MAX_FFT = 1 << 22
"""Target size of the composed PLD array (:func:`compose` picks the discretization)."""

_REPORT_FFT = 1 << 20
"""Target size of the composed PLD array of :func:`compose_run` (the guarantees and the run's
privacy report): a few seconds for the quick-scale model, figures within 0.05% of ``2^22``."""

REPORT_MAX_N = 1000
"""The run's privacy report computes the exact worst case at most at this many clients in the
sum: the guarantee never gets worse as ``n`` grows (module docstring), so the figure at
``REPORT_MAX_N`` bounds any larger ``n`` (the profile costs ``O(n^2)``)."""


# =================================================================================== ranges


def rr_range(eps_p: float) -> tuple[float, float]:
    """``(a, b) = (1/(e^eps_p + 1), e^eps_p/(e^eps_p + 1))``: the range of ``P(bit = 1)``.

    LDPQ (CorBin-FL Algorithm 1), PBM with one trial and RQM with two levels all have exactly
    this range (``q = 1/2 + (w - c)/(2 r alpha)``, ``alpha = coth(eps_p/2)``).
    """
    e = _positive(eps_p, "eps_p")
    a = 1.0 / (1.0 + math.exp(e)) if e < 700 else math.exp(-e)
    return a, 1.0 - a


def binomial_range(eps: float, trials: int) -> tuple[float, float]:
    """Per-trial range ``(1/2 - theta, 1/2 + theta)``, ``theta = tanh(eps/(2M))/2``: the range of
    ``(eps/M)``-randomized response (the Poisson binomial mechanism's calibration)."""
    m = _integer(trials, "trials")
    return rr_range(_positive(eps, "eps") / m)


# =================================================================================== pairs


def hockey_stick(p: Array, q: Array, eps: float | Array) -> float | Array:
    r"""``H_{e^eps}(P || Q) = sum_s (P(s) - e^eps Q(s))_+`` of two pmfs on the same outcomes.

    Vectorized over ``eps``: outcomes are sorted by privacy loss ``log(P/Q)`` (``+inf`` where
    ``Q = 0 < P``) and ``H = sum_{L_s > eps} P(s) - e^eps Q(s)`` from cumulative sums.
    """
    c = _Curve.of(np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64))
    e = np.asarray(eps, dtype=np.float64)
    out = c(e.ravel()).reshape(e.shape)
    return float(out) if out.ndim == 0 else out


@dataclass(frozen=True)
class _Curve:
    """Sorted privacy losses of one pair, for fast ``delta(eps)`` (see :func:`hockey_stick`)."""

    neg_loss: Array  # -L, increasing (finite losses only)
    cum_p: Array
    cum_q: Array
    inf_mass: float
    max_loss: float  # largest finite |L| over outcomes with P > 0 or Q > 0 on both sides

    @classmethod
    def of(cls, p: Array, q: Array) -> _Curve:
        # An outcome with a probability below _TINY (where float64 loses relative precision)
        # counts as an infinite loss: its whole P-mass goes to delta (an over-estimate).
        both = (p >= _TINY) & (q >= _TINY)
        inf_mass = float(np.sum(p[~both]))
        loss = np.log(p[both]) - np.log(q[both])
        order = np.argsort(-loss, kind="stable")
        loss = loss[order]
        return cls(
            -loss,
            np.cumsum(p[both][order]),
            np.cumsum(q[both][order]),
            inf_mass,
            float(np.max(np.abs(loss))) if loss.size else 0.0,
        )

    def __call__(self, eps: Array) -> Array:
        j = np.searchsorted(self.neg_loss, -eps, side="left")  # number of losses > eps
        out = np.zeros(eps.shape, dtype=np.float64)
        ok = j > 0
        jj = j[ok] - 1
        out[ok] = self.cum_p[jj] - np.exp(eps[ok]) * self.cum_q[jj]
        return np.minimum(1.0, np.maximum(out, 0.0) + self.inf_mass)


def _binom(n: int, p: float) -> Array:
    if n == 0:
        return np.ones(1)
    if p <= 0.0 or p >= 1.0:
        out = np.zeros(n + 1)
        out[n if p >= 1.0 else 0] = 1.0
        return out
    return stats.binom.pmf(np.arange(n + 1), n, p)


@dataclass(frozen=True)
class VertexFamily:
    """The vertex pairs ``(P, Q)`` of one case of the worst-case analysis.

    ``P = Bin(D, hi) * Bin(k, p_hi) * Bin(N - k, p_lo)`` and ``Q = Bin(D, lo) * (same)`` for
    ``k = 0..N`` (``*``: convolution). ``hi``/``lo`` are the client's differing trials'
    probabilities under its two inputs (``b``/``a``, or ``1``/``0`` for a paired client given its
    partner), ``[p_lo, p_hi]`` the others' range. Both directions are always taken.
    """

    label: str
    d_trials: int
    hi: float
    lo: float
    others: int
    p_lo: float
    p_hi: float

    def pairs(self) -> Iterator[tuple[int, Array, Array]]:
        """Yield ``(k, P, Q)`` for ``k = 0..N``."""
        xp = _binom(self.d_trials, self.hi)
        xq = _binom(self.d_trials, self.lo)
        lo_pmfs = {}
        for k in range(self.others + 1):
            y_hi = _binom(k, self.p_hi)
            nk = self.others - k
            if nk not in lo_pmfs:
                lo_pmfs[nk] = _binom(nk, self.p_lo)
            y = np.convolve(y_hi, lo_pmfs.pop(nk))
            yield k, np.convolve(xp, y), np.convolve(xq, y)

    @property
    def size(self) -> int:
        """Total number of outcomes over all ``k`` (the cost of one sweep)."""
        return (self.others + 1) * (self.others + self.d_trials + 1)


@dataclass
class SumProfile:
    """Worst-case privacy profile of one client against the sum-seeing server, per parameter.

    ``delta(eps) = max`` over every vertex pair of every family, both directions, of the exact
    hockey-stick divergence. :meth:`delta` and :meth:`epsilon` are the per-parameter guarantee;
    :func:`dominating_pld` turns the profile into a PLD for composition.
    """

    name: str
    n: int
    families: tuple[VertexFamily, ...]
    local_eps: float
    _curves: list[tuple[str, int, _Curve, _Curve]] | None = field(default=None, repr=False)
    _max_loss: float | None = field(default=None, repr=False)

    def _all(self) -> Iterator[tuple[str, int, _Curve, _Curve]]:
        if self._curves is not None:
            yield from self._curves
            return
        cache = sum(f.size for f in self.families) <= _CACHE_OUTCOMES
        keep: list[tuple[str, int, _Curve, _Curve]] = []
        for fam in self.families:
            for k, p, q in fam.pairs():
                item = (fam.label, k, _Curve.of(p, q), _Curve.of(q, p))
                if cache:
                    keep.append(item)
                yield item
        if cache:
            self._curves = keep

    @property
    def max_loss(self) -> float:
        """Largest finite ``|privacy loss|`` over all vertex pairs (both directions)."""
        if self._max_loss is None:
            self._max_loss = max(max(f.max_loss, r.max_loss) for _, _, f, r in self._all())
        return self._max_loss

    def deltas(self, eps: Array) -> Array:
        """Envelope ``max_k max(H(P_k||Q_k), H(Q_k||P_k))`` at each ``eps`` (vectorized)."""
        e = np.asarray(eps, dtype=np.float64).ravel()
        out = np.zeros(e.shape)
        for _, _, f, r in self._all():
            np.maximum(out, f(e), out=out)
            np.maximum(out, r(e), out=out)
        return out

    def delta(self, eps: float) -> float:
        """Per-parameter ``delta`` at ``eps`` (exact worst case)."""
        return float(self.deltas(np.array([float(eps)]))[0])

    def worst(self, eps: float) -> tuple[str, int, str]:
        """Which vertex attains :meth:`delta` at ``eps``: ``(family, k, direction)``."""
        e = np.array([float(eps)])
        best = (-1.0, ("", -1, ""))
        for lab, k, f, r in self._all():
            for d, c in (("P||Q", f), ("Q||P", r)):
                v = float(c(e)[0])
                if v > best[0]:
                    best = (v, (lab, k, d))
        return best[1]

    def epsilon(self, delta: float) -> float:
        """Smallest ``eps >= 0`` with ``delta(eps) <= delta`` (upper end of a ``1e-9`` bracket).

        ``inf`` if the mass of outcomes impossible under the neighbour exceeds ``delta``.
        """
        target = _probability(delta, "delta")
        top = self.max_loss
        if self.delta(top + 1e-12) > target:
            return math.inf
        lo, hi = 0.0, top + 1e-12
        if self.delta(0.0) <= target:
            return 0.0
        for _ in range(4):  # grid refinement: 4 passes of 257 points
            grid = np.linspace(lo, hi, 257)
            d = self.deltas(grid)
            i = int(np.argmax(d <= target))
            lo, hi = float(grid[i - 1]), float(grid[i])
            if hi - lo <= 1e-9 * max(1.0, hi):
                break
        return hi


def one_bit_profile(eps_p: float, n: int) -> SumProfile:
    """Worst case of one client's LDPQ / PBM(m=1) / RQM(2) bit inside a sum of ``n`` bits.

    Parameters
    ----------
    eps_p : float
        Per-parameter local budget.
    n : int
        Clients in the sum (client 1 included), ``>= 1``; ``n = 1`` is randomized response.
    """
    a, b = rr_range(eps_p)
    n = _integer(n, "n")
    fam = VertexFamily("independent", 1, b, a, n - 1, a, b)
    return SumProfile("one-bit", n, (fam,), float(eps_p))


def binomial_profile(eps: float, trials: int, n: int) -> SumProfile:
    """Symbols ``Binomial(M, p)``, ``p`` in :func:`binomial_range` (PBM with ``M = trials``
    trials), one per client, ``n`` clients in the sum (module docstring)."""
    m = _integer(trials, "trials")
    n = _integer(n, "n")
    pl, ph = binomial_range(eps, m)
    fams = tuple(VertexFamily(f"D={d}", d, ph, pl, n * m - d, pl, ph) for d in range(1, m + 1))
    return SumProfile(f"binomial(M={m})", n, fams, float(eps))


# =================================================================================== PLD


def _ctd_masses(deltas: Array, h: float) -> tuple[Array, float]:
    """Connect-the-dots masses on a fixed gap (Doroshenko et al. 2022, Alg. 1); for moments."""
    e = math.expm1(h)
    dd = np.diff(deltas)
    p = np.empty_like(deltas)
    p[0] = 1.0 - deltas[0] + (dd[0] / e if dd.size else 0.0)
    if deltas.size > 2:
        p[1:-1] = (dd[1:] - math.exp(h) * dd[:-1]) / e
    if deltas.size > 1:
        p[-1] = dd[-1] / math.expm1(-h)
    return np.maximum(p, 0.0), float(deltas[-1])


@dataclass(frozen=True)
class _Grid:
    h: float
    lo: int
    hi: int
    deltas: Array


def _grid(profile: SumProfile, points: int = _GRID_POINTS) -> _Grid:
    """Envelope on ``eps = i h``, ``i = -I..I``, covering every finite loss with a margin."""
    top = profile.max_loss
    span = top * (1.0 + 1e-6) + 1e-9
    h = span / points
    idx = np.arange(-points, points + 1)
    d = profile.deltas((idx * h).astype(np.float64))
    d = np.minimum(1.0, d * (1.0 + _REL_SLACK) + _ABS_SLACK)
    d = np.maximum.accumulate(d[::-1])[::-1]  # non-increasing, only ever raised
    return _Grid(h, -points, points, d)


def dominating_pld(profile: SumProfile, stride: int = 1, grid: _Grid | None = None) -> Any:
    """A PLD that dominates every ordered vertex pair of ``profile`` (both directions).

    Where one ordered vertex pair dominates all the others for every ``g >= 0``
    (:func:`corbin_fl.mechanisms.server_pld.dominant_pair`, an exact check), that pair's exact
    pmfs, losses rounded up to multiples of ``stride h``. Otherwise the connect-the-dots PLD of
    the envelope: ``eps`` grid ``(stride h) i``, covering ``[-L, L]`` (``L`` the largest finite
    loss), with the envelope's ``delta`` (computed exactly, raised by ``1e-9`` relative +
    ``1e-15`` absolute for float64 rounding) at each point; mass above the grid is the
    ``+infinity`` atom. Returns a symmetric ``dp_accounting`` ``PrivacyLossDistribution``: the
    two directions compose the same reversal-closed set of pairs (module docstring).
    """
    from dp_accounting.pld import pld_pmf
    from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

    g = grid if grid is not None else _grid(profile)
    s = int(stride)
    if s < 1 or (g.hi - g.lo) % (2 * s) or g.hi % s:
        raise ValueError(f"stride must divide {g.hi}, got {stride}")
    dom = server_pld.dominant_pair(profile)
    if dom is not None:
        return server_pld.pair_pld(dom.upper, dom.lower, g.h * s)
    d = g.deltas[::s]
    pmf = pld_pmf.create_pmf_pessimistic_connect_dots_fixed_gap(g.h * s, g.lo // s, g.hi // s, d)
    return PrivacyLossDistribution(pmf)


@dataclass(frozen=True)
class ComposedGuarantee:
    """``(eps, delta)`` of ``steps`` composed parameters (PLD accountant, sound upper bound).

    Attributes
    ----------
    eps, delta : float
        The guarantee.
    steps : int
        Composed steps (``m`` per update, ``m T`` for ``T`` rounds).
    per_step_eps : float
        The per-parameter ``eps`` at the same ``delta`` (exact worst case), for comparison.
    discretization : float
        Loss grid of the composed PLD.
    """

    eps: float
    delta: float
    steps: int
    per_step_eps: float
    discretization: float

    def as_dict(self) -> dict[str, float | int]:
        """Plain JSON types."""
        return dataclasses.asdict(self)


def _stride(g: _Grid, steps: int, max_fft: int) -> int:
    """The power of two by which the fine gap ``h`` is coarsened for ``steps`` compositions.

    The per-step mean ``mu`` and variance ``s^2`` of the loss (of the fine connect-the-dots PLD)
    give the composed spread ``s sqrt(K)``; the gap is chosen so ``16 s sqrt(K)`` spans about
    ``max_fft`` grid points, keeping at least 128 grid points per side of the per-step PLD.
    """
    probs, _ = _ctd_masses(g.deltas, g.h)
    losses = np.arange(g.lo, g.hi + 1) * g.h
    mass = probs.sum()
    mu = float(np.sum(probs * losses) / mass) if mass > 0 else 0.0
    var = float(np.sum(probs * (losses - mu) ** 2) / mass) if mass > 0 else 0.0
    want = 16.0 * math.sqrt(steps * var) / max_fft
    stride = 1
    while stride * 2 * g.h <= want and g.hi % (stride * 2) == 0 and g.hi // (stride * 2) >= 128:
        stride *= 2
    return stride


def _atoms_exceed(inf: float, steps: int, target: float) -> bool:
    """Whether the ``+infinity`` atoms of ``steps`` composed steps alone exceed ``target``."""
    if inf >= 1.0:
        return True
    return inf > 0 and -math.expm1(steps * math.log1p(-inf)) > target


def compose(profile: SumProfile, steps: int, delta: float) -> ComposedGuarantee:
    """``eps`` of ``steps`` steps, each dominated by ``profile``, at ``delta``.

    The least of the composed :func:`dominating_pld` and the Renyi-DP bound
    (:func:`corbin_fl.mechanisms.server_pld.rdp_epsilon`), both sound for an adaptive choice of
    vertex and direction per step (module docstring). The per-step grid is chosen so the
    composed PLD array has about ``2^22`` entries (:func:`_stride`): the gap is ``h`` times a
    power of two. Every grid gives a sound upper bound (pessimistic rounding at any grid that
    covers the losses); a finer one is tighter. :func:`compose_run` gives one update and the
    run together, faster.
    """
    k = _integer(steps, "steps")
    target = _probability(delta, "delta")
    g = _grid(profile)
    stride = _stride(g, k, _MAX_FFT)
    pld = dominating_pld(profile, stride, g)
    if _atoms_exceed(float(g.deltas[-1]), k, target):
        eps = math.inf  # the +infinity atoms alone exceed delta
    else:
        eps = float(_self_compose(pld, k).get_epsilon_for_delta(target))
        eps = min(eps, server_pld.rdp_epsilon(profile, k, target))
    return ComposedGuarantee(eps, target, k, profile.epsilon(target), g.h * stride)


def compose_run(
    profile: SumProfile, m: int, rounds: int, delta: float, *, max_fft: int = _REPORT_FFT
) -> tuple[ComposedGuarantee, ComposedGuarantee]:
    """One update (``m`` steps) and the whole run (``m T`` steps) from ONE chain of compositions.

    The per-step PLD is discretized once for the run's ``m T`` steps (:func:`_stride` with an
    array of about ``max_fft`` entries), composed ``m`` times by repeated squaring (one
    update), and that PLD ``T`` times (the run): about ``2 log2 m + 2 log2 T`` FFT convolutions,
    where two calls of :func:`compose` at ``2^22`` redo the whole chain twice. The result is as
    sound as :func:`compose`'s (the same pessimistic connect-the-dots discretization and tail
    truncation, exact convolutions); the coarser grid costs a little tightness. Each figure is
    then the least of the PLD's and the Renyi-DP bound's
    (:func:`corbin_fl.mechanisms.server_pld.rdp_epsilon`, one curve of orders for both).

    Returns
    -------
    (ComposedGuarantee, ComposedGuarantee)
        One update, the run.
    """
    m = _integer(m, "m")
    t = _integer(rounds, "rounds")
    target = _probability(delta, "delta")
    g = _grid(profile)
    stride = _stride(g, m * t, int(max_fft))
    inf = float(g.deltas[-1])
    per_step = profile.epsilon(target)
    gap = g.h * stride
    if _atoms_exceed(inf, m, target):  # the +infinity atoms alone exceed delta: nothing to compose
        eps_u = eps_r = math.inf
    else:
        curve = server_pld.coarse_rdp_curve(profile)
        update = _self_compose(dominating_pld(profile, stride, g), m)
        eps_u = float(update.get_epsilon_for_delta(target))
        eps_u = min(eps_u, server_pld.rdp_epsilon(profile, m, target, curve=curve))
        if t == 1:
            eps_r = eps_u
        elif _atoms_exceed(inf, m * t, target):
            eps_r = math.inf
        else:
            eps_r = float(_self_compose(update, t).get_epsilon_for_delta(target))
            eps_r = min(eps_r, server_pld.rdp_epsilon(profile, m * t, target, curve=curve))
    return (
        ComposedGuarantee(eps_u, target, m, per_step, gap),
        ComposedGuarantee(eps_r, target, m * t, per_step, gap),
    )


def _self_compose(pld: Any, k: int) -> Any:
    """``k``-fold composition by repeated squaring (``dp_accounting`` ``compose``).

    Each ``compose`` is an FFT convolution whose tails below ``1e-15`` are truncated
    pessimistically (the lower tail onto the smallest kept loss, the upper tail to
    ``+infinity``), so the result stays an upper bound; at most ``2 log2 k`` compositions.
    ``dp_accounting``'s ``self_compose`` sizes its FFT with Chernoff orders that are far too
    large for ``k`` in the millions (its array then does not fit in memory).
    (:func:`corbin_fl.mechanisms.server_pld.self_compose`.)
    """
    return server_pld.self_compose(pld, k)


# =================================================================================== a run's view


@dataclass(frozen=True)
class SumView:
    """What a run's secure aggregation showed the server, for its privacy report.

    ``server/records.py`` builds it from the rounds' ``secure_aggregation`` records
    (``metrics.jsonl``); :func:`corbin_fl.mechanisms.report.privacy_report` turns it into the
    guarantee against the server (threat model B) with this module's functions.

    Attributes
    ----------
    n : int
        The fewest clients whose symbols the server unmasked as one sum, over the run's rounds
        (the worst round); the configured clients when no round unmasked a sum.
    independent : int or None
        AugCorBin-FL: the fewest clients in such a sum that quantized independently (LDPQ:
        drawn independent, unpaired, or without a partner); None: ``floor(gamma n + 1/2)``.
    paired : bool or None
        Whether a paired client was in some unmasked sum; None: derived from ``n`` and the
        independent clients.
    trials : int or None
        Binomial trials of one symbol (``ldpfl`` and ``rqm`` with 2 levels: 1, ``pbm``: its
        trials): the exact worst case of :func:`one_bit_profile` / :func:`binomial_profile` applies.
        None: no analysis of the sum for this mechanism and settings.
    rounds, abandoned : int
        Rounds whose sum was unmasked; rounds abandoned (nothing unmasked, nothing applied).
    threshold, neighbours, bits : int or None
        The smallest Shamir threshold ``t`` and neighbour count ``k``, the largest width ``b``
        of those rounds.
    p_security, p_abandon : float or None
        The largest bounds of those rounds' ``k``, ``t`` (:func:`corbin_fl.secagg.graph.
        failure_probabilities` at the stated dropout and collusion fractions): some client has
        ``t`` colluding neighbours; a round is abandoned for lack of share holders.
    source : str
        ``"rounds"`` (the records) or ``"configuration"`` (no round unmasked a sum).
    """

    n: int
    independent: int | None = None
    paired: bool | None = None
    trials: int | None = None
    rounds: int = 0
    abandoned: int = 0
    threshold: int | None = None
    neighbours: int | None = None
    bits: int | None = None
    source: str = "rounds"
    p_security: float | None = None
    p_abandon: float | None = None

    def __post_init__(self) -> None:
        _integer(self.n, "n")
        if self.independent is not None and not 0 <= self.independent <= self.n:
            raise ValueError(f"independent must be in [0, n = {self.n}], got {self.independent}")
        if self.trials is not None:
            _integer(self.trials, "trials")
        if self.source not in ("rounds", "configuration"):
            raise ValueError(f"source must be 'rounds' or 'configuration', got {self.source!r}")

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON types (the report's ``secure_aggregation`` block)."""
        return dataclasses.asdict(self)


# =================================================================================== reports


def one_bit_guarantee(eps_p: float, n: int, m: int, rounds: int, delta: float) -> dict[str, Any]:
    """Threat model B with secure aggregation for ``ldpfl`` / ``pbm`` m=1 / ``rqm`` 2 levels.

    Returns ``{"dp": True, "n", "per_parameter": {"eps", "delta"}, "per_update": {...},
    "all_rounds": {...}, "method"}`` (each block ``eps, delta, steps``; the composed ones from
    :func:`compose_run`). Cached: the same arguments return a copy of the same figures.
    """
    key = (_positive(eps_p, "eps_p"), _integer(n, "n"), *run_args(m, rounds, delta))
    return copy.deepcopy(_one_bit_cached(*key))


@functools.lru_cache(maxsize=32)
def _one_bit_cached(eps_p: float, n: int, m: int, rounds: int, delta: float) -> dict[str, Any]:
    return composed_report("one-bit", one_bit_profile(eps_p, n), m, rounds, delta)


def binomial_guarantee(
    eps: float, trials: int, n: int, m: int, rounds: int, delta: float
) -> dict[str, Any]:
    """Threat model B with secure aggregation for symbols of ``trials`` binomial trials each
    (:func:`binomial_profile`; PBM's native setting). Cached."""
    key = (
        _positive(eps, "eps"),
        _integer(trials, "trials"),
        _integer(n, "n"),
        *run_args(m, rounds, delta),
    )
    return copy.deepcopy(_binomial_cached(*key))


@functools.lru_cache(maxsize=32)
def _binomial_cached(
    eps: float, trials: int, n: int, m: int, rounds: int, delta: float
) -> dict[str, Any]:
    prof = binomial_profile(eps, trials, n)
    out = composed_report(f"binomial(M={trials})", prof, m, rounds, delta)
    out["bits_per_parameter"] = max(1, math.ceil(math.log2(trials + 1)))
    return out


def run_args(m: object, rounds: object, delta: object) -> tuple[int, int, float]:
    """``(m, rounds, delta)`` checked: ints ``>= 1`` and a ``delta`` in ``(0, 1)``."""
    return _integer(m, "m"), _integer(rounds, "rounds"), _probability(delta, "delta")


def composed_report(
    name: str, prof: SumProfile, m: int, rounds: int, delta: float
) -> dict[str, Any]:
    """The guarantee blocks of ``prof`` over one update of ``m`` parameters and ``rounds``
    rounds at ``delta`` (:func:`compose_run`): ``{"mechanism": name, "dp", "n", "local_eps",
    "per_parameter", "per_update", "all_rounds", "discretization", "method"}``."""
    m = _integer(m, "m")
    rounds = _integer(rounds, "rounds")
    upd, allr = compose_run(prof, m, rounds, delta)
    return {
        "mechanism": name,
        "dp": math.isfinite(allr.eps),
        "n": prof.n,
        "local_eps": prof.local_eps,
        "per_parameter": {"eps": upd.per_step_eps, "delta": delta, "steps": 1},
        "per_update": {"eps": upd.eps, "delta": delta, "steps": m},
        "all_rounds": {"eps": allr.eps, "delta": delta, "steps": m * rounds},
        "discretization": upd.discretization,
        "method": (
            "exact worst case over all inputs (vertices of the probability box), both "
            "directions; composed with a connect-the-dots PLD of the envelope (dp_accounting)"
        ),
    }


# =================================================================================== CorBin


def corbin_against_sum(eps_p: float, d: int, m: int, rounds: int) -> dict[str, Any]:
    """CorBin-FL with secure aggregation: no DP against the server (module docstring).

    Returns ``{"dp": False, "guarantee": str, "per_parameter": {"inf_mass"}, "per_update":
    {"delta_lower_bound"}, "all_rounds": {"delta_lower_bound"}}``: ``p_inf = b -
    ceil(2^d a)/2^d`` is the probability of an outcome impossible under the neighbouring input
    (a realisable configuration: every other pair at ``q = 1/2``, the partner at ``1 - q_1``).
    """
    a, b = rr_range(eps_p)
    d = _integer(d, "d")
    m = _integer(m, "m")
    rounds = _integer(rounds, "rounds")
    q1 = math.ceil(a * 2**d) / 2**d
    p_inf = max(0.0, b - q1)
    upd = -math.expm1(m * math.log1p(-p_inf)) if p_inf < 1 else 1.0
    allr = -math.expm1(m * rounds * math.log1p(-p_inf)) if p_inf < 1 else 1.0
    alpha = float(alpha64(eps_p))
    return {
        "mechanism": "corbin",
        "dp": False,
        "guarantee": (
            "No DP, even with secure aggregation. With common randomness the two partners' "
            "bits sum to the randomized rounding of q1 + q2 to an adjacent integer "
            "(Algorithm 2: U1 = [Z < T1], U2 = [Z > T2]), deterministic when q1 + q2 is an "
            "integer; with every other pair's sum deterministic too, changing one client's "
            f"input makes a sum possible that had probability 0: mass p_inf = {p_inf:.4g} "
            f"(>= 1/alpha - 2^-d = {1 / alpha - 2.0**-d:.4g}) per parameter, so delta >= "
            "1 - (1 - p_inf)^k for k parameters, whatever eps."
        ),
        "per_parameter": {"inf_mass": p_inf},
        "per_update": {"steps": m, "delta_lower_bound": upd},
        "all_rounds": {"steps": m * rounds, "delta_lower_bound": allr},
    }


# =================================================================================== validation


def _positive(x: object, name: str) -> float:
    if isinstance(x, bool) or not isinstance(x, int | float | np.floating | np.integer):
        raise TypeError(f"{name} must be a real number, got {type(x).__name__}")
    v = float(x)
    if not (math.isfinite(v) and v > 0.0):
        raise ValueError(f"{name} must be finite and > 0, got {x!r}")
    return v


def _integer(x: object, name: str) -> int:
    if isinstance(x, bool) or not isinstance(x, int | np.integer):
        raise TypeError(f"{name} must be an int, got {type(x).__name__}")
    if int(x) < 1:
        raise ValueError(f"{name} must be >= 1, got {x!r}")
    return int(x)


def _probability(x: object, name: str) -> float:
    v = _positive(x, name)
    if not v < 1.0:
        raise ValueError(f"{name} must be in (0, 1), got {x!r}")
    return v
