r"""Interpolated minimum-variance unbiased mechanism, I-MVU (Guo, Chaudhuri, Stock & Rabbat, 2023).

Guo, Chaudhuri, Stock & Rabbat, "Privacy-aware compression for federated learning through
numerical mechanism design" (ICML 2023, arXiv:2211.03942). The MVU mechanism is designed
numerically for a budget of ``b`` bits: ``n`` input points ``x_i`` evenly spaced on ``[-1, 1]``
(``x = (clip(w) - c) / r``), ``K = 2^b`` output values ``v_k``, and a transition matrix ``P``
that solves

.. math::
    \min_{P, v}\; \frac1n \sum_i \sum_k P_{ik} (v_k - x_i)^2
    \quad\text{s.t.}\quad \sum_k P_{ik} = 1,\;\; \sum_k P_{ik} v_k = x_i,\;\;
    P_{ik} \le e^{\epsilon} P_{jk},\;\; P \ge 0

(the mean variance over the input points, unbiasedness, pure ``eps``-LDP). For fixed ``v`` this
is a linear programme in ``P`` (solved with HiGHS through ``scipy.optimize.linprog``); the
output values, symmetric about 0 (``v_{K-1-k} = -v_k``), are optimised around it with
Nelder-Mead on their log-gaps. The solution is computed once per ``(eps, b, n)`` and cached on
disk with its inputs by the app (``corbin_fl/mvu_store.py``); this module is the math only.

Interpolation: an ``x`` between ``x_i`` and ``x_{i+1}`` (``x = (1 - t) x_i + t x_{i+1}``) is
released with the mixture ``P(k | x) = (1 - t) P_{ik} + t P_{i+1,k}``, which is the same law as
rounding ``x`` without bias to ``x_i`` or ``x_{i+1}`` and then applying the row. Both properties
then hold on the whole interval exactly: the mixture is unbiased, and every ``P(k | x)`` lies
between ``min_i P_{ik}`` and ``max_i P_{ik}``, so the exact epsilon is
``max_k log(max_i P_ik / min_i P_ik)`` (:meth:`IMVU.epsilon`). The authors' code interpolates the
log-probabilities instead; the linear form is used here because it keeps unbiasedness and the
LDP bound exact between the grid points.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
import torch
from scipy import sparse
from scipy.optimize import linprog, minimize

from mechanisms.baselines.levels import FiniteMechanism, log_ratio
from mechanisms.validate import integer, positive

logger = logging.getLogger(__name__)

__all__ = [
    "IMVU",
    "IMVU_BITS",
    "MVUTable",
    "solve_mvu",
    "table_epsilon",
]

IMVU_BITS: tuple[int, ...] = (1, 2, 4)
INPUT_POINTS = 8
"""``n``, the input points of the design (the authors' default of 3 input bits)."""
SOLVER_VERSION = 1
"""Part of the cache key: bump when the optimisation changes."""
_EPS_MARGIN = 1e-7
"""The LP is solved at ``eps (1 - margin)`` so that solver tolerance cannot exceed ``eps``."""
_DEAD = 1e-7
"""An output whose largest probability is below this is dropped (set to 0 in every row)."""


@dataclass(frozen=True)
class MVUTable:
    """A solved MVU design: ``P`` (``[n, K]``) and the output values ``v`` (``[K]``)."""

    eps: float
    bits: int
    inputs: int
    transition: np.ndarray
    values: np.ndarray
    mean_variance: float

    def check(self) -> None:
        """Raise ValueError unless ``P`` is stochastic, unbiased and within ``eps`` (exactly)."""
        p, v = self.transition, self.values
        n, k = self.inputs, 1 << self.bits
        if p.shape != (n, k) or v.shape != (k,):
            raise ValueError(f"MVU table shapes {p.shape}, {v.shape}; expected ({n}, {k}), ({k},)")
        if not (np.isfinite(p).all() and np.isfinite(v).all()) or (p < 0).any():
            raise ValueError("MVU table has negative or non-finite entries")
        if np.abs(p.sum(axis=1) - 1.0).max() > 1e-9:
            raise ValueError("MVU table rows do not sum to 1")
        x = np.linspace(-1.0, 1.0, n)
        bias = np.abs(p @ v - x).max()
        if bias > 1e-7 * max(1.0, float(np.abs(v).max())):
            raise ValueError(f"MVU table is biased by {bias:.3g}")
        eps = table_epsilon(p)
        if eps > self.eps:
            raise ValueError(f"MVU table is {eps!r}-LDP, more than eps = {self.eps!r}")


def table_epsilon(p: np.ndarray) -> float:
    """``max_k log(max_i P_ik / min_i P_ik)``: the exact epsilon of the interpolated mechanism."""
    return max(log_ratio(float(col.max()), float(col.min())) for col in p.T)


class _Design:
    """The LP of one ``(eps, n, K)``: the LDP rows are built once, sparse."""

    def __init__(self, eps: float, x: np.ndarray, k: int) -> None:
        n = x.size
        self.x, self.n, self.k = x, n, k
        pairs = np.array([(i, j) for i in range(n) for j in range(n) if i != j])
        rows = np.arange(len(pairs) * k)
        cols_i = (pairs[:, 0, None] * k + np.arange(k)).reshape(-1)
        cols_j = (pairs[:, 1, None] * k + np.arange(k)).reshape(-1)
        self.a_ub = sparse.csr_array(
            (
                np.concatenate([np.ones(rows.size), np.full(rows.size, -math.exp(eps))]),
                (np.concatenate([rows, rows]), np.concatenate([cols_i, cols_j])),
            ),
            shape=(rows.size, n * k),
        )
        self.b_ub = np.zeros(rows.size)
        self.row_of = np.repeat(np.arange(n), k)

    def solve(
        self, values: np.ndarray, dead: np.ndarray | None = None
    ) -> tuple[float, np.ndarray] | None:
        """The optimal ``P`` for fixed output values (None when no unbiased eps-LDP ``P``).

        ``dead`` marks output columns forced to 0 (the clean-up of :func:`solve_mvu`).
        """
        n, k, x = self.n, self.k, self.x
        cost = ((values[None, :] - x[:, None]) ** 2).reshape(-1) / n
        cols = np.arange(n * k)
        a_eq = sparse.csr_array(
            (
                np.concatenate([np.ones(n * k), np.tile(values, n)]),
                (np.concatenate([self.row_of, n + self.row_of]), np.concatenate([cols, cols])),
            ),
            shape=(2 * n, n * k),
        )
        upper = np.ones(n * k) if dead is None else np.where(np.tile(dead, n), 0.0, 1.0)
        res = linprog(
            cost,
            A_ub=self.a_ub,
            b_ub=self.b_ub,
            A_eq=a_eq,
            b_eq=np.concatenate([np.ones(n), x]),
            bounds=np.stack([np.zeros(n * k), upper], axis=1),
            method="highs",
            options={"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10},
        )
        if res.status != 0:
            return None
        return float(res.fun), res.x.reshape(n, k)


def _values(z: np.ndarray, k: int) -> np.ndarray:
    """Symmetric sorted output values from log-gaps ``z`` (``K/2`` of them)."""
    half = np.cumsum(np.exp(z))  # v_{K/2} < ... < v_{K-1}, all > 0
    if k == 2:
        return np.array([-half[0], half[0]])
    return np.concatenate([-half[::-1], half])


def solve_mvu(eps: float, bits: int, inputs: int = INPUT_POINTS) -> MVUTable:
    """Solve the MVU design (module docstring) for ``eps``, ``b`` bits, ``n`` input points.

    Deterministic: Nelder-Mead from the two-level (randomized response) scale, HiGHS for the
    inner LP. The returned table is cleaned (entries below 1e-15 of their column's scale set to
    0 together, rows renormalised) and checked with :meth:`MVUTable.check`.
    """
    e = positive(eps)
    b = integer(bits, "bits", 1)
    if b not in IMVU_BITS:
        raise ValueError(f"bits must be one of {IMVU_BITS}, got {b}")
    n = integer(inputs, "inputs", 2)
    k = 1 << b
    x = np.linspace(-1.0, 1.0, n)
    target = e * (1.0 - _EPS_MARGIN)
    rr = 1.0 / math.tanh(target / 2.0)  # the two-level scale: feasible for any K
    # Start: K/2 positive values evenly spaced up to 1.5 x the RR scale.
    start_half = np.linspace(1.5 * rr / (k // 2), 1.5 * rr, k // 2)
    z0 = np.log(np.diff(np.concatenate([[0.0], start_half])))

    design = _Design(target, x, k)

    def objective(z: np.ndarray) -> float:
        sol = design.solve(_values(z, k))
        return math.inf if sol is None else sol[0]

    f0 = objective(z0)
    if f0 == math.inf:
        raise RuntimeError(f"MVU: no feasible start for eps = {e}, bits = {b}")
    res = minimize(
        objective,
        z0,
        method="Nelder-Mead",
        options={"xatol": 1e-5, "fatol": 1e-9 * f0, "maxiter": 4000, "maxfev": 8000},
    )
    values = _values(np.asarray(res.x), k)
    # Clean-up: outputs the optimum (almost) never uses are removed, the LP solved again without
    # them, and the margin widened until the exact check passes: solver round-off on a
    # near-zero column would otherwise turn into an unbounded likelihood ratio.
    for margin in (_EPS_MARGIN, 1e-5, 1e-3):
        final = _Design(e * (1.0 - margin), x, k)
        sol = final.solve(values)
        if sol is None:
            continue
        dead = sol[1].max(axis=0) < _DEAD
        sol = final.solve(values, dead)
        if sol is None:
            continue
        fun, p = sol
        p = np.clip(p, 0.0, None)
        p[:, dead] = 0.0
        p /= p.sum(axis=1, keepdims=True)
        table = MVUTable(e, b, n, p, values, fun)
        try:
            table.check()
        except ValueError as exc:
            logger.debug("MVU clean-up at margin %g: %s", margin, exc)
            continue
        return table
    raise RuntimeError(f"MVU: no exactly {e}-LDP unbiased table found (b = {b}, n = {n})")


class IMVU(FiniteMechanism):
    """I-MVU with ``b`` bits calibrated to pure ``eps``-LDP per coordinate (module docstring).

    Parameters
    ----------
    eps : float
        Per-coordinate ``eps > 0``.
    bits : int
        1, 2 or 4 (``K = 2^b`` outputs).
    table : MVUTable
        The design for ``(eps, bits)``: :func:`solve_mvu`, or ``corbin_fl.mvu_store.mvu_table``
        (shipped, cached or solved once per machine).
    """

    def __init__(self, eps: float, bits: int, table: MVUTable) -> None:
        self.eps = positive(eps)
        if not isinstance(table, MVUTable):
            raise TypeError(f"table must be an MVUTable, got {type(table).__name__}")
        self.table = table
        if (self.table.eps, self.table.bits) != (self.eps, bits):
            raise ValueError("the MVU table was solved for another eps or budget")
        self.table.check()
        self.levels = self.table.values
        self._p = torch.as_tensor(self.table.transition, dtype=torch.float64)

    def probabilities(self, x: torch.Tensor) -> torch.Tensor:
        """``(1 - t) P_i + t P_{i+1}`` for ``x`` between input points ``i`` and ``i + 1``."""
        x = x.to(torch.float64)
        n = self.table.inputs
        pos = ((x + 1.0) * 0.5 * (n - 1)).clamp(0.0, n - 1.0)
        i = pos.floor().clamp(max=n - 2).to(torch.int64)
        t = (pos - i)[..., None]
        p = self._p.to(x.device)
        return (1.0 - t) * p[i] + t * p[i + 1]

    def epsilon(self) -> float:
        """:func:`table_epsilon` of the design."""
        return table_epsilon(self.table.transition)
