"""Closed forms for CorBin-FL: exact pair laws, MSEs and the bounds of Theorems 1-4.

Privacy claims: none of the functions here is a privacy guarantee the project prints. Theorem 3's
eq. (5) is kept only as a documented finding (:func:`eq5_as_printed`: it is not a valid bound);
Theorem 3's condition and MSE bound and Theorem 4's MSE bound are what they say, not privacy
claims. The guarantees the reports print come from :mod:`corbin_fl.mechanisms.accounting` and
:mod:`corbin_fl.mechanisms.secure_sum`, each tested against a realisable lower bound
(:mod:`corbin_fl.mechanisms.lower_bounds`).

Everything here is float64 NumPy and accepts Python scalars or broadcastable arrays. The
notation follows the CorBin-FL paper (Salehi et al., arXiv:2409.13133):

* ``alpha(eps) = (e^eps + 1) / (e^eps - 1) = coth(eps / 2)`` (Algorithm 1, line 1);
* ``q = 1/2 + (w - c) / (2 r alpha)`` is the probability that a quantizer outputs
  ``c + r alpha`` (Algorithm 1, line 2; Algorithm 2, line 2); inputs are first clipped to
  ``[c - r, c + r]`` exactly as the quantizers do, so every MSE below is measured against the
  *clipped* inputs;
* output index ``0`` means ``c - r alpha`` and index ``1`` means ``c + r alpha``; a joint law is
  an array ``P[..., i, j] = P(Q1 = index i, Q2 = index j)`` where ``Q1`` is the lead quantizer
  (lines 4-11 of Algorithm 2) and ``Q2`` the follower (lines 12-19).

The exact joint law of a CorBinQ pair (derived in :func:`corbin_pair_joint`) is the basis of
the pair-joint privacy accounting in :mod:`mechanisms.accounting`.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from corbin_fl.mechanisms.validate import integer, positive, positive_array, probability, real_array

logger = logging.getLogger(__name__)

__all__ = [
    "Theorem3ConditionError",
    "Theorem4Result",
    "alpha64",
    "corbin_pair_joint",
    "corbin_pair_joint_from_q",
    "corbin_pair_mse",
    "eq5_as_printed",
    "ldpq_mse",
    "ldpq_pair_mse",
    "optimal_pair_mse",
    "prob_plus64",
    "theorem1_bound",
    "theorem2_bound",
    "theorem3_condition",
    "theorem3_min_clients",
    "theorem3_mse_bound",
    "theorem4",
]

FloatOrArray = float | NDArray[np.float64]

#: Largest number of shared bits the exact codebook search supports (int64 indices).
MAX_D = 60


# ----------------------------------------------------------------------------- helpers


def _out(x: NDArray[np.float64]) -> FloatOrArray:
    """Return a Python float for 0-d results, the array otherwise."""
    return float(x) if x.ndim == 0 else x


def alpha64(eps: ArrayLike) -> FloatOrArray:
    r"""Privacy scale factor of LDPQ in float64 (CorBin-FL Algorithm 1, line 1).

    .. math:: \alpha(\epsilon) = \frac{e^\epsilon + 1}{e^\epsilon - 1} = \coth(\epsilon/2),

    evaluated as ``1 / tanh(eps / 2)``, which is accurate for tiny and large ``eps`` alike.

    Parameters
    ----------
    eps : float or array_like
        Per-parameter privacy budget ``eps_p > 0``.

    Returns
    -------
    float or ndarray
        ``alpha(eps) > 1``.
    """
    e = positive_array(eps)
    return _out(1.0 / np.tanh(e / 2.0))


def _clip_inputs(
    w: ArrayLike, c: ArrayLike, r: ArrayLike
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    wa, ca, ra = real_array(w, "w"), real_array(c, "c"), real_array(r, "r")
    if not np.all(np.isfinite(ra)) or np.any(ra <= 0):
        raise ValueError("r must be finite and > 0")
    if not np.all(np.isfinite(ca)):
        raise ValueError("c must be finite")
    return np.clip(wa, ca - ra, ca + ra), ca, ra


def prob_plus64(w: ArrayLike, c: ArrayLike, r: ArrayLike, eps: ArrayLike) -> FloatOrArray:
    r"""Probability that LDPQ outputs ``c + r alpha`` (Algorithm 1, line 2), float64.

    .. math:: q = \frac12 + \frac{\mathrm{clip}(w) - c}{2 r \alpha(\epsilon)}
              \in \Big[\frac{1}{1+e^\epsilon}, \frac{e^\epsilon}{1+e^\epsilon}\Big].

    Parameters
    ----------
    w, c, r : float or array_like
        Weight, center and radius (``r > 0``); ``w`` is clipped into ``[c - r, c + r]``.
    eps : float or array_like
        Per-parameter privacy budget.

    Returns
    -------
    float or ndarray
        ``q`` (broadcast shape of the inputs).
    """
    wc, ca, ra = _clip_inputs(w, c, r)
    a = np.asarray(alpha64(eps))
    return _out(0.5 + (wc - ca) / (2.0 * ra * a))


def _codebook_cell(
    q: NDArray[np.float64], d: int, p_x: float
) -> tuple[NDArray[np.int64], NDArray[np.float64], NDArray[np.float64]]:
    r"""Locate ``q`` in the lexicographic codebook of ``d`` shared bits.

    The shared vector ``Z`` has i.i.d. bits with ``P(bit = 1) = p_x`` (``p_x = 1/2`` is CorBin-FL;
    other values are the biased codebook of CoQ-FL, Algorithm 2 and Appendix A of the unpublished
    CoQ-FL draft; see README "References"). With ``F(k) = P(Z < k)`` (integer order = lexicographic
    order, MSB first) the function returns the cell ``A`` with ``F(A) <= q < F(A + 1)``, ``F(A)``
    and ``P(Z = A) = F(A + 1) - F(A)``. The search walks the ``d`` bits from the MSB: at each node
    the 0-subtree holds mass ``m (1 - p_x)``; ``q`` goes right iff it is at least the cumulative
    mass at the start of the 1-subtree. For ``p_x = 1/2`` this is ``A = floor(2^d q)``,
    ``F(A) = A / 2^d`` and ``P(A) = 2^{-d}`` exactly (dyadic arithmetic), i.e. Algorithm 2 line 3.
    """
    idx = np.zeros(q.shape, dtype=np.int64)
    cum = np.zeros(q.shape, dtype=np.float64)
    mass = np.ones(q.shape, dtype=np.float64)
    for _ in range(d):
        zero_mass = mass * (1.0 - p_x)
        right = q >= cum + zero_mass
        idx = idx * 2 + right.astype(np.int64)
        cum = np.where(right, cum + zero_mass, cum)
        mass = np.where(right, mass * p_x, zero_mass)
    return idx, cum, mass


def corbin_pair_joint(
    w1: ArrayLike,
    w2: ArrayLike,
    c: ArrayLike,
    r: ArrayLike,
    eps: ArrayLike,
    d: int,
    p_x: float = 0.5,
) -> NDArray[np.float64]:
    r"""Exact joint law of a CorBinQ pair ``(Q1(w1, Z), Q2(w2, Z))`` for finite ``d``.

    Derivation (CorBin-FL Algorithm 2 and Appendix B). Let ``q1, q2`` be the LDPQ probabilities
    of ``+`` (line 2) and ``F(k) = P(Z < k)`` the codebook CDF (``F(k) = k / 2^d`` for fair bits).
    The lead's threshold cell is ``A`` with ``F(A) <= q1 < F(A+1)`` and the follower's is ``B``
    with ``F(B) <= 1 - q2 < F(B+1)`` (line 3: ``T1 = B_d(floor(2^d q1))``,
    ``T2 = B_d(floor(2^d (1 - q2)))``). Given ``Z = z`` the two local tie-break coins are
    independent, and

    * ``P(Q1 = + | z) = 1[z < A] + f_a 1[z = A]`` with ``f_a = (q1 - F(A)) / P(A)``
      (lines 4-10; ``f_a = 2^d q1 - floor(2^d q1)`` for fair bits),
    * ``P(Q2 = + | z) = 1[z > B] + (1 - f_b) 1[z = B]`` with ``f_b = (1 - q2 - F(B)) / P(B)``
      (lines 12-18: ``Q2 = c - U' r alpha`` and ``P(U' = 1) = f_b``).

    Summing ``P(z) P(Q1 = + | z) P(Q2 = + | z)`` over ``z``:

    * ``A > B``: ``P(++) = P(B)(1 - f_b) + F(A) - F(B+1) + P(A) f_a = q1 + q2 - 1`` and
      ``P(--) = 0``;
    * ``A < B``: ``P(++) = 0`` and, symmetrically, ``P(--) = 1 - q1 - q2``;
    * ``A = B`` (the tie cell, the ``T1 = T2`` case of Appendix B):
      ``P(++) = P(A) f_a (1 - f_b)`` and ``P(--) = P(A) (1 - f_a) f_b``.

    So ``P(++) = max(0, q1 + q2 - 1)`` and ``P(--) = max(0, 1 - q1 - q2)`` (the optimum of
    eqs. 18-22) except on the tie cell, where each exceeds its optimum by
    ``P(A) min(f_a (1 - f_b), f_b (1 - f_a)) <= P(A) / 4``. The mixed cells follow from the exact
    LDPQ marginals (Appendix B): ``P(+-) = q1 - P(++)``, ``P(-+) = q2 - P(++)``. With ``d = 0``
    every input falls in the single tie cell and the pair is independent (LDP-FL).

    Parameters
    ----------
    w1, w2 : float or array_like
        Inputs of the lead (``Q1``) and of the follower (``Q2``); clipped to ``[c - r, c + r]``.
    c, r : float or array_like
        Center and radius (``r > 0``).
    eps : float or array_like
        Per-parameter privacy budget ``eps_p > 0``.
    d : int
        Number of shared random bits per parameter, ``0 <= d <= 60``.
    p_x : float, optional
        Probability that a shared bit is 1 (``1/2`` in CorBin-FL; CoQ-FL's biased codebook
        otherwise).

    Returns
    -------
    ndarray
        Shape ``broadcast_shape + (2, 2)``; ``P[..., i, j] = P(Q1 = i, Q2 = j)`` with index
        ``0 = c - r alpha`` and ``1 = c + r alpha``. Each 2x2 block sums to 1.
    """
    q1 = np.asarray(prob_plus64(w1, c, r, eps))
    q2 = np.asarray(prob_plus64(w2, c, r, eps))
    return corbin_pair_joint_from_q(q1, 1.0 - q2, d, p_x)


def corbin_pair_joint_from_q(
    q1: ArrayLike, s2: ArrayLike, d: int, p_x: float = 0.5
) -> NDArray[np.float64]:
    r"""Exact CorBinQ pair law from the lead's ``q1`` and the follower's ``s2 = 1 - q2``.

    Same law as :func:`corbin_pair_joint` (see its derivation), parametrised by the two numbers
    the quantizers actually threshold: the lead compares the codeword with ``q1`` and the
    follower with ``s2 = 1 - q2`` (Algorithm 2, line 3). Working with ``s2`` directly keeps the
    zero cells exact: off the tie cell ``P(++) = max(0, q1 - s2)`` and
    ``P(--) = max(0, s2 - q1)``, whose signs are computed without rounding. This is the form
    used by the pair-joint privacy accounting.

    Parameters
    ----------
    q1, s2 : float or array_like
        Probabilities in ``[0, 1]``, broadcast together.
    d : int
        Number of shared bits, ``0 <= d <= 60``.
    p_x : float, optional
        Probability that a shared bit is 1.

    Returns
    -------
    ndarray
        Shape ``broadcast_shape + (2, 2)``, ``P[..., i, j] = P(Q1 = i, Q2 = j)``.
    """
    d = integer(d, "d", 0, MAX_D)
    px = probability(p_x, "p_x")
    qa = real_array(q1, "q1")
    sb = real_array(s2, "s2")
    if np.any((qa < 0) | (qa > 1)) or np.any((sb < 0) | (sb > 1)):
        raise ValueError("q1 and s2 must lie in [0, 1]")
    qa, sb = np.broadcast_arrays(qa, sb)
    a_idx, a_cum, a_mass = _codebook_cell(qa, d, px)
    b_idx, b_cum, b_mass = _codebook_cell(sb, d, px)
    fa = np.clip((qa - a_cum) / a_mass, 0.0, 1.0)
    fb = np.clip((sb - b_cum) / b_mass, 0.0, 1.0)
    tie = a_idx == b_idx
    p11 = np.where(tie, a_mass * fa * (1.0 - fb), np.maximum(0.0, qa - sb))
    p00 = np.where(tie, a_mass * (1.0 - fa) * fb, np.maximum(0.0, sb - qa))
    out = np.empty((*qa.shape, 2, 2), dtype=np.float64)
    out[..., 0, 0] = p00
    out[..., 0, 1] = np.maximum(0.0, (1.0 - sb) - p11)
    out[..., 1, 0] = np.maximum(0.0, qa - p11)
    out[..., 1, 1] = p11
    return out


def corbin_pair_mse(
    w1: ArrayLike,
    w2: ArrayLike,
    c: ArrayLike,
    r: ArrayLike,
    eps: ArrayLike,
    d: int,
    p_x: float = 0.5,
) -> FloatOrArray:
    r"""Exact MSE ``E[(Q1 + Q2 - w1 - w2)^2]`` of a CorBinQ pair (Theorem 1's ``m(Q1, Q2, w, w')``).

    Both quantizers are unbiased (C4), so with ``s = w1 + w2 - 2c`` (clipped inputs)

    .. math:: m = E[(Q_1 + Q_2 - 2c)^2] - s^2 = 4 r^2 \alpha^2 (P_{--} + P_{++}) - s^2,

    because the mixed outcomes give ``Q1 + Q2 = 2c``; ``P`` is :func:`corbin_pair_joint`.

    Parameters
    ----------
    w1, w2, c, r, eps, d, p_x
        As in :func:`corbin_pair_joint`.

    Returns
    -------
    float or ndarray
        The MSE (broadcast shape).
    """
    joint = corbin_pair_joint(w1, w2, c, r, eps, d, p_x)
    w1c, ca, ra = _clip_inputs(w1, c, r)
    w2c, _, _ = _clip_inputs(w2, c, r)
    a = np.asarray(alpha64(eps))
    s = w1c + w2c - 2.0 * ca
    mse = 4.0 * ra**2 * a**2 * (joint[..., 0, 0] + joint[..., 1, 1]) - s**2
    return _out(np.maximum(mse, 0.0))


def ldpq_pair_mse(
    w1: ArrayLike, w2: ArrayLike, c: ArrayLike, r: ArrayLike, eps: ArrayLike
) -> FloatOrArray:
    r"""MSE of two independent LDPQ quantizers (LDP-FL; Proposition 1 and [17, Lemma 3]).

    ``Var(LDPQ(w)) = E[(Q - c)^2] - (w - c)^2 = r^2 alpha^2 - (w - c)^2``, so

    .. math:: m_{\mathrm{LDPQ}} = 2 r^2 \alpha^2 - (w_1 - c)^2 - (w_2 - c)^2 .

    Parameters
    ----------
    w1, w2, c, r : float or array_like
        Inputs (clipped to ``[c - r, c + r]``), center and radius.
    eps : float or array_like
        Per-parameter privacy budget.

    Returns
    -------
    float or ndarray
        The MSE of the sum of the two outputs.
    """
    w1c, ca, ra = _clip_inputs(w1, c, r)
    w2c, _, _ = _clip_inputs(w2, c, r)
    a = np.asarray(alpha64(eps))
    return _out(2.0 * ra**2 * a**2 - (w1c - ca) ** 2 - (w2c - ca) ** 2)


def optimal_pair_mse(
    w1: ArrayLike, w2: ArrayLike, c: ArrayLike, r: ArrayLike, eps: ArrayLike
) -> FloatOrArray:
    r"""Minimum pair MSE over the class ``Q`` of Theorem 1 (unbiased, ``eps``-PLDP pairs).

    Appendix B, eqs. (18)-(22): the optimal outputs are ``c -/+ r alpha`` and, with
    ``s = w1 + w2 - 2c``, the optimal joint puts ``P_{++} = 0`` when ``s <= 0`` (and
    ``P_{--} = 0`` when ``s > 0``), so ``P_{--} + P_{++} = |s| / (2 r alpha)`` and

    .. math:: m^* = 4 r^2 \alpha^2 \frac{|s|}{2 r \alpha} - s^2 = |s| (2 r \alpha - |s|).

    This is also the ``d -> infinity`` limit of :func:`corbin_pair_mse`.

    Parameters
    ----------
    w1, w2, c, r : float or array_like
        Inputs (clipped), center and radius.
    eps : float or array_like
        Per-parameter privacy budget.

    Returns
    -------
    float or ndarray
        The lower bound ``m*``.
    """
    w1c, ca, ra = _clip_inputs(w1, c, r)
    w2c, _, _ = _clip_inputs(w2, c, r)
    a = np.asarray(alpha64(eps))
    s = np.abs(w1c + w2c - 2.0 * ca)
    return _out(s * (2.0 * ra * a - s))


def theorem1_bound(
    w1: ArrayLike, w2: ArrayLike, c: ArrayLike, r: ArrayLike, eps: ArrayLike, d: int
) -> FloatOrArray:
    r"""Upper bound (4) of Theorem 1 on the CorBinQ pair MSE for ``d`` shared bits.

    .. math:: m(Q_1, Q_2, w, w') \le m^* + \frac{r^2 \alpha^2(\epsilon_p)}{2^{d - 6}}.

    Parameters
    ----------
    w1, w2, c, r, eps
        As in :func:`optimal_pair_mse`.
    d : int
        Number of shared bits.

    Returns
    -------
    float or ndarray
        The bound.
    """
    d = integer(d, "d", 0, MAX_D)
    _, _, ra = _clip_inputs(w1, c, r)
    a = np.asarray(alpha64(eps))
    opt = np.asarray(optimal_pair_mse(w1, w2, c, r, eps))
    return _out(opt + ra**2 * a**2 * 2.0 ** (6 - d))


def theorem2_bound(r: ArrayLike, eps: ArrayLike, n: int) -> FloatOrArray:
    r"""Theorem 2: ``d -> infinity`` bound on the MSE of the CorBin-FL average of ``n`` clients.

    .. math:: \lim_{d\to\infty} E\Big[\big(\overline W_{g,j} - \tfrac1n \textstyle\sum_i w_{i,j}
              \big)^2\Big] \le \frac{r^2}{2n} \big((\sqrt2 - 1)\alpha + 1\big)
              \big((\sqrt2 + 1)\alpha - 1\big) = \frac{r^2}{2n}\big(2\alpha^2 - (\alpha-1)^2\big).

    Parameters
    ----------
    r : float or array_like
        Radius ``r_j > 0``.
    eps : float or array_like
        Per-parameter privacy budget.
    n : int
        Number of clients (even in Algorithm 3).

    Returns
    -------
    float or ndarray
        The bound.
    """
    n = integer(n, "n", 1)
    ra = real_array(r, "r")
    if np.any(ra <= 0):
        raise ValueError("r must be > 0")
    a = np.asarray(alpha64(eps))
    s2 = math.sqrt(2.0)
    return _out(ra**2 / (2.0 * n) * ((s2 - 1.0) * a + 1.0) * ((s2 + 1.0) * a - 1.0))


def ldpq_mse(r: ArrayLike, eps: ArrayLike, n: int) -> FloatOrArray:
    r"""Worst-case MSE of the average of ``n`` independent LDPQ releases (Algorithm 1; the
    LDP-FL average of ``n`` clients), ``r^2 alpha^2 / n`` ([17, Lemma 3]).

    Parameters
    ----------
    r : float or array_like
        Radius.
    eps : float or array_like
        Per-parameter privacy budget.
    n : int
        Number of clients.

    Returns
    -------
    float or ndarray
        ``r^2 alpha(eps)^2 / n``.
    """
    n = integer(n, "n", 1)
    ra = real_array(r, "r")
    if np.any(ra <= 0):
        raise ValueError("r must be > 0")
    a = np.asarray(alpha64(eps))
    return _out(ra**2 * a**2 / n)


# ----------------------------------------------------------------------------- Theorem 3


class Theorem3ConditionError(ValueError):
    """Raised when the client-count condition of Theorem 3 (or 4) does not hold."""


def theorem3_condition(
    eps_p: float, delta: float, n: int, gamma: float, m: int, r: float, *, standalone: bool = False
) -> tuple[bool, str]:
    r"""Check the hypothesis of Theorem 3 on the number of clients (the condition above eq. (5)).

    Not a privacy claim: it is the hypothesis under which the paper states eq. (5), which is not
    a valid bound whether or not it holds (:func:`eq5_as_printed`); Theorem 4 checks it as its
    hypothesis.

    .. math:: (n\gamma - 1)\Big(\frac14 - \frac{1}{4\alpha^2(\epsilon_p)}\Big) \ge
              \max\Big(23 \log\frac{m}{\delta},\; 2 r \alpha(\epsilon_p)\Big).

    Parameters
    ----------
    eps_p : float
        Per-parameter budget.
    delta : float
        Target ``delta`` in ``(0, 1)``.
    n : int
        Number of clients per round.
    gamma : float
        Fraction of clients that use LDPQ (AugCorBin-FL), in ``(0, 1]``.
    m : int
        Number of model parameters.
    r : float
        ``max_j r_j``.
    standalone : bool
        How a failing condition is worded; the figures are the same. ``False``: a clause that
        follows "Theorem 3 does not apply" (:func:`theorem4`'s error),
        ``"fails: (n*gamma-1)(1/4-1/(4 alpha^2)) = L with n = .., gamma = .. is below T; Theorem 3
        needs n >= N"``. ``True``: a sentence that names the theorem and the whole inequality,
        ``"Theorem 3 condition (n*gamma-1)(1/4-1/(4 alpha^2)) >=
        max(23 log(m/delta), 2 r alpha) fails: L with n = .., gamma = .. is below T; it needs
        n >= N"``. A holding condition reads the same either way.

    Returns
    -------
    tuple of (bool, str)
        Whether the condition holds, and a sentence saying which side fails (or that it holds).
    """
    eps_p = positive(eps_p, "eps_p")
    delta = probability(delta, "delta")
    n = integer(n, "n", 1)
    gamma = probability(gamma, "gamma", hi_open=False)
    m = integer(m, "m", 1)
    r = positive(r, "r")
    a = float(alpha64(eps_p))
    lhs = (n * gamma - 1.0) * (0.25 - 0.25 / a**2)
    t_log = 23.0 * math.log(m / delta)
    t_r = 2.0 * r * a
    if lhs >= t_log and lhs >= t_r:
        return True, (
            f"holds: (n*gamma-1)(1/4-1/(4 alpha^2)) = {lhs:.6g} >= "
            f"max(23 log(m/delta) = {t_log:.6g}, 2 r alpha = {t_r:.6g})"
        )
    failing = []
    if lhs < t_log:
        failing.append(f"23 log(m/delta) = {t_log:.6g}")
    if lhs < t_r:
        failing.append(f"2 r alpha = {t_r:.6g}")
    need = theorem3_min_clients(eps_p, delta, gamma, m, r)
    below = f"with n = {n}, gamma = {gamma} is below {' and '.join(failing)}"
    if standalone:
        return False, (
            "Theorem 3 condition (n*gamma-1)(1/4-1/(4 alpha^2)) >= max(23 log(m/delta), 2 r alpha) "
            f"fails: {lhs:.6g} {below}; it needs n >= {need}"
        )
    return False, (
        f"fails: (n*gamma-1)(1/4-1/(4 alpha^2)) = {lhs:.6g} {below}; Theorem 3 needs n >= {need}"
    )


def theorem3_min_clients(eps_p: float, delta: float, gamma: float, m: int, r: float) -> int:
    """Smallest ``n`` satisfying :func:`theorem3_condition` (see eq. above (5)).

    Parameters
    ----------
    eps_p, delta, gamma, m, r
        As in :func:`theorem3_condition`.

    Returns
    -------
    int
        ``ceil((1 + max(23 log(m/delta), 2 r alpha) / (1/4 - 1/(4 alpha^2))) / gamma)``.
    """
    eps_p = positive(eps_p, "eps_p")
    delta = probability(delta, "delta")
    gamma = probability(gamma, "gamma", hi_open=False)
    m = integer(m, "m", 1)
    r = positive(r, "r")
    a = float(alpha64(eps_p))
    rhs = max(23.0 * math.log(m / delta), 2.0 * r * a)
    n_gamma = 1.0 + rhs / (0.25 - 0.25 / a**2)
    n = max(1, math.ceil(n_gamma / gamma))
    while (n * gamma - 1.0) * (0.25 - 0.25 / a**2) < rhs:  # guard against rounding
        n += 1
    return n


def eq5_as_printed(eps_p: float, delta: float, n_gamma_minus_1: float, m: int, r: float) -> float:
    r"""Eq. (5) of Theorem 3 (arXiv:2409.13133) exactly as printed. NOT a valid privacy bound.

    .. math::
        \frac{\epsilon_u}{r\alpha} = \sqrt{\frac{8 m \log\frac{1.25}{\delta}}{N e_p}}
        + \frac{8(\log\frac{1.25}{\delta} + \log\frac{20m}{\delta}\log\frac{10}{\delta})}{3N}
        + \frac{4 b_p \sqrt{2m}(1.75 + 3.75/\alpha^2)\sqrt{\log\frac{10}{\delta}}}
               {N (1-\frac{\delta}{10}) e_p},

    with ``N = n gamma - 1``, ``e_p = 1 + 1/alpha^2`` and ``b_p = e_p / 3 + 1/alpha`` (it
    instantiates cpSGD, Agarwal et al. NeurIPS 2018, Thm. 1, with ``p = 1/2 - 1/(2 alpha)``;
    ``N p (1 - p) = N (1 - 1/alpha^2) / 4`` is the left side of Theorem 3's condition).

    Why it cannot hold: ``eps_u`` grows linearly with the radius ``r``, but the output law of
    LDPQ depends on the inputs only through ``(w - c) / r`` (Algorithm 1, line 2), so a valid
    ``eps`` cannot depend on ``r``; as ``r -> 0`` eq. (5) promises any ``eps_u > 0``. A realisable
    configuration bounds the true per-round ``eps`` from below
    (:func:`corbin_fl.mechanisms.augcorbin.augcorbin_round_lower_bound`), and eq. (5) falls
    below it: at ``delta = 1e-5``, ``gamma = 0.2`` and the smallest ``n`` of Theorem 3's
    condition, ``eps_p = 1``, ``m = 1000``, ``r = 0.01``: 0.150 against >= 2.91 per round;
    ``eps_p = 3``: 0.0300 against >= 6.41, and still 3.00 against 6.41 at ``r = 1`` (README,
    "AugCorBin-FL's eq. (5) is not a bound"; ``tests/unit/test_lower_bounds.py``). The project
    prints no guarantee from it; AugCorBin-FL's guarantee against the sum is the exact one of
    :func:`corbin_fl.mechanisms.augcorbin.augcorbin_guarantee`.

    Parameters
    ----------
    eps_p : float
        Per-parameter budget, ``> 0``.
    delta : float
        ``delta`` in ``(0, 1)``.
    n_gamma_minus_1 : float
        ``N = n gamma - 1 > 0``.
    m : int
        Number of model parameters, ``>= 1``.
    r : float
        ``max_j r_j > 0``.

    Returns
    -------
    float
        The number eq. (5) prints (not a guarantee).
    """
    eps_p = positive(eps_p, "eps_p")
    delta = probability(delta, "delta")
    big_n = positive(n_gamma_minus_1, "n_gamma_minus_1")
    m = integer(m, "m", 1)
    r = positive(r, "r")
    a = float(alpha64(eps_p))
    e_p = 1.0 + 1.0 / a**2
    b_p = e_p / 3.0 + 1.0 / a
    l125 = math.log(1.25 / delta)
    l10 = math.log(10.0 / delta)
    t1 = math.sqrt(8.0 * m * l125 / (big_n * e_p))
    t2 = 8.0 * (l125 + math.log(20.0 * m / delta) * l10) / (3.0 * big_n)
    t3 = (
        4.0
        * b_p
        * math.sqrt(2.0 * m)
        * (1.75 + 3.75 / a**2)
        * math.sqrt(l10)
        / (big_n * (1.0 - delta / 10.0) * e_p)
    )
    return r * a * (t1 + t2 + t3)


def theorem3_mse_bound(r: ArrayLike, eps: ArrayLike, n: int, gamma: float) -> FloatOrArray:
    r"""MSE bound of AugCorBin-FL (Theorem 3, ``d -> infinity``).

    .. math:: \frac{\gamma r^2 \alpha^2}{n} + \frac{1-\gamma}{2n} r^2
              \big((\sqrt2-1)\alpha+1\big)\big((\sqrt2+1)\alpha-1\big).

    Parameters
    ----------
    r : float or array_like
        Radius ``r_j``.
    eps : float or array_like
        Per-parameter budget.
    n : int
        Clients per round.
    gamma : float
        Fraction of LDPQ clients, in ``[0, 1]`` (``0`` is CorBin-FL, ``1`` is LDP-FL).

    Returns
    -------
    float or ndarray
        The bound.
    """
    g = float(gamma)
    if not 0.0 <= g <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma!r}")
    ldp = np.asarray(ldpq_mse(r, eps, n))
    cb = np.asarray(theorem2_bound(r, eps, n))
    return _out(g * ldp + (1.0 - g) * cb)


# ----------------------------------------------------------------------------- Theorem 4


@dataclass(frozen=True)
class Theorem4Result:
    """The MSE side of Theorem 4 (CorBin-FL under independent client dropout).

    Theorem 4 also states ``(eps_u, delta)``-UCDP with ``eps_u`` from eq. (5) at
    ``(gamma, delta_1)``; that is not a valid bound (:func:`eq5_as_printed`), so no epsilon is
    given here. Against the sum, AugCorBin-FL's and a dropout run's guarantee is the exact one of
    :func:`corbin_fl.mechanisms.augcorbin.augcorbin_guarantee` at the clients that quantized
    independently.

    Attributes
    ----------
    delta : float
        The theorem's target ``delta`` (``delta - delta_1`` pays for the Chebyshev event).
    gamma, gamma_prime : float
        Chebyshev bounds on the fraction of pairs with exactly one dropout.
    theta : float
        Chebyshev lower bound of Theorem 4 on the surviving fraction.
    mse_bound : float
        ``d -> infinity`` MSE bound of the average of the survivors (not a privacy claim).
    """

    delta: float
    gamma: float
    gamma_prime: float
    theta: float
    mse_bound: float


def theorem4(
    eps_p: float, delta: float, delta1: float, p: float, n: int, m: int, r: float
) -> Theorem4Result:
    r"""Chebyshev fractions and MSE bound of CorBin-FL with dropout probability ``p`` (Theorem 4).

    With ``u = p(1-p)`` and ``v = p(1-p)(1 - 2p(1-p))``:

    .. math::
        \gamma = u - \sqrt{\frac{v}{4(\delta-\delta_1)n}},\quad
        \gamma' = u + \sqrt{\frac{v}{4(\delta-\delta_1)n}},\quad
        \theta = u - \sqrt{\frac{u}{(\delta-\delta_1)n}},

    (``theta`` exactly as printed in the theorem and Appendix E); the theorem's hypothesis is
    Theorem 3's condition at ``(gamma, delta_1)`` (:func:`theorem3_condition`), checked here,
    and then

    .. math:: \mathrm{MSE} \le \frac{\gamma' r^2\alpha^2}{n\theta} + 8 r^2 \alpha^2 \delta_1
              + \frac{1-\gamma}{2 n\theta} r^2 \big((\sqrt2-1)\alpha+1\big)
              \big((\sqrt2+1)\alpha-1\big).

    The theorem's privacy half, ``eps_u`` = eq. (5) at ``(gamma, delta_1)``, is not returned:
    eq. (5) is not a valid bound (:func:`eq5_as_printed`).

    Parameters
    ----------
    eps_p : float
        Per-parameter budget.
    delta : float
        Target UCDP delta.
    delta1 : float
        ``0 < delta1 < delta``.
    p : float
        Dropout probability per client and round, in ``(0, 1)``.
    n : int
        Number of clients.
    m : int
        Number of parameters.
    r : float
        ``max_j r_j``.

    Returns
    -------
    Theorem4Result
        ``gamma``, ``gamma'``, ``theta`` and the MSE bound.

    Raises
    ------
    Theorem3ConditionError
        If ``gamma <= 0``, ``theta <= 0`` or the Theorem 3 condition fails at ``(gamma, delta1)``.
    """
    eps_p = positive(eps_p, "eps_p")
    delta = probability(delta, "delta")
    delta1 = probability(delta1, "delta1")
    if not delta1 < delta:
        raise ValueError(f"delta1 must be < delta, got delta1={delta1}, delta={delta}")
    pf = float(p)
    if not 0.0 < pf < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p!r}")
    n = integer(n, "n", 1)
    m = integer(m, "m", 1)
    r = positive(r, "r")
    u = pf * (1.0 - pf)
    v = u * (1.0 - 2.0 * u)
    spread = math.sqrt(v / (4.0 * (delta - delta1) * n))
    gamma = u - spread
    gamma_prime = u + spread
    theta = u - math.sqrt(u / ((delta - delta1) * n))
    if gamma <= 0.0:
        raise Theorem3ConditionError(
            f"Theorem 4 does not apply: gamma = {gamma:.6g} <= 0 (n = {n} too small for "
            f"p = {pf}, delta - delta1 = {delta - delta1:.3g})"
        )
    if theta <= 0.0:
        raise Theorem3ConditionError(
            f"Theorem 4 does not apply: theta = {theta:.6g} <= 0 (n = {n} too small)"
        )
    ok, reason = theorem3_condition(eps_p, delta1, n, min(gamma, 1.0), m, r)
    if not ok:
        raise Theorem3ConditionError(f"Theorem 4 does not apply: {reason}")
    a = float(alpha64(eps_p))
    s2 = math.sqrt(2.0)
    mse = (
        gamma_prime * r**2 * a**2 / (n * theta)
        + 8.0 * r**2 * a**2 * delta1
        + (1.0 - gamma) / (2.0 * n * theta) * r**2 * ((s2 - 1.0) * a + 1.0) * ((s2 + 1.0) * a - 1.0)
    )
    return Theorem4Result(
        delta=delta,
        gamma=gamma,
        gamma_prime=gamma_prime,
        theta=theta,
        mse_bound=mse,
    )
