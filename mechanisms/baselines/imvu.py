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
is a linear programme in ``P`` (solved with HiGHS through ``scipy.optimize.linprog``;
:func:`mvu_at`, "the LP at the values"). Its optimum ``f(v)`` is searched over free output
values, asymmetric ones included:

1. starts: the caller's values, evenly spaced values on ``[-1.5 s, 1.5 s]``
   (``s = 1 / tanh(eps / 2)``, randomized response's scale), ``+-s`` (randomized response), the
   design with the next smaller budget, the ``K`` most used values of the LP over a refined grid
   of candidate outputs (which may use any number of them), and two seeded random ones; starts
   with fewer than ``K`` values are completed (:func:`complete_values`), which can only lower
   ``f``;
2. from each, L-BFGS-B with the envelope theorem's gradient
   ``df/dv_k = sum_i P_ik (2 (v_k - x_i) / n - mu_i)`` (``mu_i``: the multiplier of row ``i``'s
   unbiasedness), the unbiasedness rows priced by an exact penalty so that every ``v`` has a
   value; then Nelder-Mead from the best result, since the optimum sits on kinks of ``f``;
3. the answer is the best cleaned, exactly checked table among the LP at every start, at every
   search result, and the lower-bit design itself (:func:`embed`): so it is never worse than the
   design with fewer bits, nor than the LP at any start.

The solution is computed once per ``(eps, b, n)`` and cached on disk with its inputs by the app's
design store (``corbin_fl/design_store.py``); this module is the math only: what a stored design
is (:class:`MVUDesigns`: its key, file name and document, the check of one read back, the solve
from the next smaller budget), no file access.

Interpolation: an ``x`` between ``x_i`` and ``x_{i+1}`` (``x = (1 - t) x_i + t x_{i+1}``) is
released with the mixture ``P(k | x) = (1 - t) P_{ik} + t P_{i+1,k}``, which is the same law as
rounding ``x`` without bias to ``x_i`` or ``x_{i+1}`` and then applying the row. Both properties
then hold on the whole interval exactly: the mixture is unbiased, and every ``P(k | x)`` lies
between ``min_i P_{ik}`` and ``max_i P_{ik}``, so the exact epsilon is
``max_k log(max_i P_ik / min_i P_ik)`` (:meth:`IMVU.epsilon`). The reference code
(``IMVUMechanismPyTorch`` of Guo et al.'s dp_compression) interpolates the log-probabilities and
normalises with a softmax instead: between design points that is biased, and at 2 and 4 bits
not eps-LDP (README, mechanisms); the linear form keeps both exact.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from numpy.typing import ArrayLike
from scipy import sparse
from scipy.optimize import linprog, minimize

from corbin_fl.mechanisms.baselines.levels import FiniteMechanism, log_ratio
from corbin_fl.mechanisms.validate import integer, positive

logger = logging.getLogger(__name__)

__all__ = [
    "IMVU",
    "IMVU_BITS",
    "MVU_DESIGNS",
    "MVUDesigns",
    "MVUKey",
    "MVUTable",
    "complete_values",
    "embed",
    "evenly_spaced",
    "mvu_at",
    "solve_mvu",
    "table_epsilon",
    "two_level_scale",
]

IMVU_BITS: tuple[int, ...] = (1, 2, 4)
INPUT_POINTS = 8
"""``n``, the input points of the design (the authors' default of 3 input bits)."""
SOLVER_VERSION = 2
"""Part of the cache key: bump when the optimisation changes (2: asymmetric multi-start search)."""
_EPS_MARGIN = 1e-7
"""The LP is solved at ``eps (1 - margin)`` so that solver tolerance cannot exceed ``eps``."""
_DEAD = 1e-7
"""An output whose largest probability is below this is dropped (set to 0 in every row)."""
_GRID = 241
"""Candidate output values of the grid LP (a start of the search): evenly on ``[-3 s, 3 s]``."""
_REFINE = 6
"""Refinement rounds of the grid LP (each: a quarter of the spacing around the used values)."""
_SPAN = 5.0
"""The search keeps every output value in ``[-5 s, 5 s]`` (``s``: the two-level scale)."""
_RANDOM_STARTS = 2
"""Seeded random asymmetric starts (seed :data:`_SEED`) besides the structured ones."""
_SEED = 20230721
_POLISH_EVALS = 1500
"""Nelder-Mead evaluations of the final polish."""


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


def two_level_scale(eps: float) -> float:
    """``s = 1 / tanh(eps / 2)``: the output values ``+-s`` of randomized response at ``eps``."""
    return 1.0 / math.tanh(positive(eps) / 2.0)


@dataclass(frozen=True)
class _Solution:
    """One LP solution: objective, its gradient in the output values, ``P``, the slack used."""

    fun: float
    grad: np.ndarray
    p: np.ndarray
    slack: float


class _Design:
    r"""The LP of one ``(eps, n, K)`` for fixed output values ``v`` (module docstring).

    The LDP constraints ``P_ik <= e^eps P_jk`` (all pairs) are written with one auxiliary
    ``m_k`` per output: ``m_k <= P_ik <= e^eps m_k`` for every ``i``, the same feasible set with
    ``2 n K`` rows instead of ``n (n - 1) K``. With ``penalty > 0`` the unbiasedness rows get
    slacks ``s_i^+, s_i^- >= 0`` priced at ``penalty`` (an exact penalty when it exceeds the
    rows' multipliers), so that every ``v`` has a finite value and a gradient for the search;
    the designs themselves are solved with ``penalty = 0`` (no slack).
    """

    def __init__(self, eps: float, x: np.ndarray, k: int, penalty: float = 0.0) -> None:
        n = x.size
        self.eps, self.x, self.n, self.k, self.penalty = eps, x, n, k, penalty
        nk = n * k
        self.size = nk + k + 2 * n  # P (row-major), m, s^+, s^-
        r = np.arange(nk)
        m_cols = nk + np.tile(np.arange(k), n)
        self.a_ub = sparse.csr_array(
            (
                np.concatenate(
                    [np.ones(nk), -np.ones(nk), np.ones(nk), np.full(nk, -math.exp(eps))]
                ),
                (np.concatenate([r, r, nk + r, nk + r]), np.concatenate([m_cols, r, r, m_cols])),
            ),
            shape=(2 * nk, self.size),
        )
        self.b_ub = np.zeros(2 * nk)
        self.row_of = np.repeat(np.arange(n), k)

    def solve(self, values: np.ndarray, dead: np.ndarray | None = None) -> _Solution | None:
        r"""The optimal ``P`` for fixed output values (None when the LP has no solution).

        ``dead`` marks output columns forced to 0 (the clean-up of :func:`mvu_at`). The
        gradient of the optimum in ``v`` is the envelope theorem's:
        ``df/dv_k = sum_i P_ik (2 (v_k - x_i) / n - mu_i)`` with ``mu_i`` the multiplier of the
        unbiasedness row ``i`` (moving ``v_k`` at fixed ``P`` moves that row's right-hand side
        by ``-P_ik``).
        """
        n, k, x = self.n, self.k, self.x
        nk = n * k
        cost = np.concatenate(
            [
                ((values[None, :] - x[:, None]) ** 2).reshape(-1) / n,
                np.zeros(k),
                np.full(2 * n, self.penalty),
            ]
        )
        cols, si = np.arange(nk), np.arange(n)
        a_eq = sparse.csr_array(
            (
                np.concatenate([np.ones(nk), np.tile(values, n), np.ones(n), -np.ones(n)]),
                (
                    np.concatenate([self.row_of, n + self.row_of, n + si, n + si]),
                    np.concatenate([cols, cols, nk + k + si, nk + k + n + si]),
                ),
            ),
            shape=(2 * n, self.size),
        )
        upper = np.ones(self.size)
        if self.penalty <= 0.0:
            upper[nk + k :] = 0.0
        if dead is not None:
            upper[:nk] = np.where(np.tile(dead, n), 0.0, 1.0)
        res = linprog(
            cost,
            A_ub=self.a_ub,
            b_ub=self.b_ub,
            A_eq=a_eq,
            b_eq=np.concatenate([np.ones(n), x]),
            bounds=np.stack([np.zeros(self.size), upper], axis=1),
            method="highs",
            options={"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10},
        )
        if res.status != 0:
            return None
        p = res.x[:nk].reshape(n, k)
        mu = np.asarray(res.eqlin.marginals)[n:]
        grad = (p * (2.0 * (values[None, :] - x[:, None]) / n - mu[:, None])).sum(axis=0)
        return _Solution(float(res.fun), grad, p, float(res.x[nk + k :].sum()))


def evenly_spaced(eps: float, k: int) -> np.ndarray:
    """``K`` output values evenly on ``[-1.5 s, 1.5 s]``, ``s`` the two-level scale at the LP's
    ``eps (1 - 1e-7)``: a start of :func:`solve_mvu` (always feasible: it spans ``+-s``)."""
    scale = two_level_scale(positive(eps) * (1.0 - _EPS_MARGIN))
    return np.linspace(-1.5 * scale, 1.5 * scale, integer(k, "k", 2))


def complete_values(values: ArrayLike, k: int) -> np.ndarray:
    """``values`` (at most ``K``, distinct) completed to ``K`` sorted output values.

    Each added value is the midpoint of the widest gap between the current values or, every
    other time, a value beyond the wider end (one gap past it): the given values stay, so the LP
    at the completed values is never worse than at the given ones (it may leave the new ones
    unused).
    """
    v = np.sort(np.asarray(values, dtype=np.float64).reshape(-1))
    if v.size > k or v.size < 1 or not np.isfinite(v).all():
        raise ValueError(f"need 1 to {k} finite output values, got {v.size}")
    if np.unique(v).size != v.size:
        raise ValueError("output values must be distinct")
    outside = True
    while v.size < k:
        if v.size == 1:
            new = v[0] + 1.0
        elif outside:
            gap = float(np.diff(v).max())
            new = v[-1] + gap if abs(v[-1]) >= abs(v[0]) else v[0] - gap
        else:
            i = int(np.argmax(np.diff(v)))
            new = 0.5 * (v[i] + v[i + 1])
        v = np.sort(np.append(v, new))
        outside = not outside
    return v


def mvu_at(eps: float, values: ArrayLike, inputs: int = INPUT_POINTS) -> MVUTable | None:
    """The best unbiased, exactly ``eps``-LDP design with these output values ("the LP at the
    values"), cleaned and checked; None when there is none.

    ``values`` has ``K = 2^b`` entries for ``b`` in :data:`IMVU_BITS` (unsorted is fine; the
    table stores them sorted). The LP is solved at ``eps (1 - margin)``; outputs the optimum
    (almost) never uses are removed, the LP solved again without them, and the margin widened
    (1e-7, 1e-5, 1e-3) until :meth:`MVUTable.check` passes: solver round-off on a near-zero
    column would otherwise turn into an unbounded likelihood ratio.
    """
    e = positive(eps)
    n = integer(inputs, "inputs", 2)
    v = np.sort(np.asarray(values, dtype=np.float64).reshape(-1))
    k = v.size
    if k < 2 or k & (k - 1) or (k.bit_length() - 1) not in IMVU_BITS:
        raise ValueError(f"need 2^b output values with b in {IMVU_BITS}, got {k}")
    if not np.isfinite(v).all():
        raise ValueError("output values must be finite")
    b = k.bit_length() - 1
    x = np.linspace(-1.0, 1.0, n)
    for margin in (_EPS_MARGIN, 1e-5, 1e-3):
        final = _Design(e * (1.0 - margin), x, k)
        sol = final.solve(v)
        if sol is None:
            return None  # no unbiased eps-LDP design with these values (a wider margin: neither)
        dead = sol.p.max(axis=0) < _DEAD
        sol = final.solve(v, dead)
        if sol is None:
            continue
        p = np.clip(sol.p, 0.0, None)
        p[:, dead] = 0.0
        p /= p.sum(axis=1, keepdims=True)
        table = MVUTable(e, b, n, p, v, sol.fun)
        try:
            table.check()
        except ValueError as exc:
            logger.debug("MVU clean-up at margin %g: %s", margin, exc)
            continue
        return table
    return None


def embed(table: MVUTable, bits: int) -> MVUTable:
    """``table`` as a design with ``2^bits >= K`` outputs: the same law, the added outputs
    (:func:`complete_values`) never drawn. Same mean variance, same exact epsilon."""
    k = 1 << integer(bits, "bits", table.bits)
    values = complete_values(table.values, k)
    p = np.zeros((table.inputs, k))
    p[:, np.searchsorted(values, table.values)] = table.transition
    out = MVUTable(table.eps, bits, table.inputs, p, values, table.mean_variance)
    out.check()
    return out


def _grid_start(design: _Design, scale: float) -> np.ndarray:
    """The ``K`` most used values of the LP over candidate outputs (any number of them used):
    :data:`_GRID` values on ``[-3 s, 3 s]``, then :data:`_REFINE` rounds that keep the used
    values and add 4 on each side of each at a quarter of the last spacing (the LP then
    approaches the design with free outputs; its support, when at most ``K``, is that design).
    """
    grid = np.linspace(-3.0 * scale, 3.0 * scale, _GRID)
    step = float(grid[1] - grid[0])
    mass = np.ones(grid.size)
    for round_ in range(_REFINE + 1):
        sol = _Design(design.eps, design.x, grid.size, design.penalty).solve(grid)
        if sol is None:  # pragma: no cover - the slack keeps the LP feasible
            break
        mass = sol.p.sum(axis=0)
        if round_ == _REFINE:
            break
        used = grid[mass > _DEAD]
        step /= 4.0
        grid = np.unique(np.concatenate([used + j * step for j in range(-4, 5)]))
    top = np.sort(np.argsort(-mass, kind="stable")[: design.k])
    return np.asarray(grid[top])


def _value(design: _Design, values: np.ndarray) -> float:
    """The (penalised) LP optimum at ``values``; ``inf`` when HiGHS finds none."""
    sol = design.solve(values)
    return math.inf if sol is None else sol.fun


def _descend(design: _Design, start: np.ndarray, span: float) -> np.ndarray:
    """L-BFGS-B on the output values from ``start`` (values kept in ``[-span, span]``); returns
    the best values it evaluated (never worse than ``start``)."""
    best: list[tuple[float, np.ndarray]] = []
    worst = design.penalty * 4.0 * span * span

    def fg(v: np.ndarray) -> tuple[float, np.ndarray]:
        sol = design.solve(v)
        if sol is None:
            return worst, np.zeros_like(v)
        if not best or sol.fun < best[0][0]:
            best[:] = [(sol.fun, v.copy())]
        return sol.fun, sol.grad

    minimize(
        fg,
        np.clip(start, -span, span),
        jac=True,
        method="L-BFGS-B",
        bounds=[(-span, span)] * start.size,
        options={"maxiter": 200, "ftol": 1e-13, "gtol": 1e-11, "maxcor": 30},
    )
    return best[0][1] if best else start


def _polish(design: _Design, start: np.ndarray, span: float) -> np.ndarray:
    """Nelder-Mead (adaptive) on the output values from ``start``: the optimum sits on kinks of
    the LP value (where its basis changes), which stall the gradient search but not the simplex.
    Returns the best values it evaluated (never worse than ``start``)."""
    worst = design.penalty * 4.0 * span * span

    def f(v: np.ndarray) -> float:
        sol = design.solve(np.clip(v, -span, span))
        return worst if sol is None else sol.fun

    res = minimize(
        f,
        start,
        method="Nelder-Mead",
        options={
            "xatol": 1e-9,
            "fatol": 1e-13 * max(1.0, f(start)),
            "maxfev": _POLISH_EVALS,
            "adaptive": True,
        },
    )
    return np.clip(np.asarray(res.x), -span, span) if res.fun <= f(start) else start


def solve_mvu(
    eps: float,
    bits: int,
    inputs: int = INPUT_POINTS,
    *,
    starts: Sequence[ArrayLike] = (),
    lower: MVUTable | None = None,
) -> MVUTable:
    """Solve the MVU design (module docstring) for ``eps``, ``b`` bits, ``n`` input points.

    Parameters
    ----------
    eps, bits, inputs : float, int, int
        The budget, the bits (one of :data:`IMVU_BITS`) and the input points.
    starts : sequence of array-likes
        Extra starting output values (each at most ``K``, completed by
        :func:`complete_values`), searched besides the built-in starts.
    lower : MVUTable, optional
        The design with the next smaller budget in :data:`IMVU_BITS` for this ``eps`` and
        ``n``; solved here when not given.

    Returns the best of the cleaned, checked tables of :func:`mvu_at` at every start and at
    the end of every search, and of ``lower`` embedded (:func:`embed`): never worse than the
    lower-bit design nor than the LP at any start. Deterministic (seeded starts, HiGHS).
    """
    e = positive(eps)
    b = integer(bits, "bits", 1)
    if b not in IMVU_BITS:
        raise ValueError(f"bits must be one of {IMVU_BITS}, got {b}")
    n = integer(inputs, "inputs", 2)
    k = 1 << b
    below = [c for c in IMVU_BITS if c < b]
    if below and lower is None:
        lower = solve_mvu(e, below[-1], n)
    if lower is not None and ((lower.eps, lower.inputs) != (e, n) or lower.bits >= b):
        raise ValueError("lower must be a design for the same eps and inputs with fewer bits")
    x = np.linspace(-1.0, 1.0, n)
    target = e * (1.0 - _EPS_MARGIN)
    scale = two_level_scale(target)  # randomized response: feasible for any K
    span = _SPAN * scale
    design = _Design(target, x, k, penalty=100.0 * scale * scale)
    candidates: list[np.ndarray] = [complete_values(s, k) for s in starts]
    candidates.append(evenly_spaced(e, k))
    candidates.append(complete_values([-scale, scale], k))  # randomized response
    if lower is not None:
        candidates.append(complete_values(lower.values, k))
    candidates.append(_grid_start(design, scale))
    rng = np.random.default_rng(_SEED + 1000 * b)
    for _ in range(_RANDOM_STARTS):
        candidates.append(np.sort(rng.uniform(-2.0 * scale, 2.0 * scale, k)))
    searched = [_descend(design, start, span) for start in candidates]
    best_found = min(searched, key=lambda v: _value(design, v))
    finals = [*candidates, *searched, _polish(design, best_found, span)]
    tables: list[MVUTable] = [] if lower is None else [embed(lower, b)]
    for values in finals:
        if np.unique(values).size != k:
            continue
        table = mvu_at(e, values, n)
        if table is not None:
            tables.append(table)
    if not tables:
        raise RuntimeError(f"MVU: no exactly {e}-LDP unbiased table found (b = {b}, n = {n})")
    best = min(tables, key=lambda t: t.mean_variance)
    logger.debug("MVU eps %g bits %d: mean variance %.9g", e, b, best.mean_variance)
    return best


class IMVU(FiniteMechanism):
    """I-MVU with ``b`` bits calibrated to pure ``eps``-LDP per coordinate (module docstring).

    Parameters
    ----------
    eps : float
        Per-coordinate ``eps > 0``.
    bits : int
        1, 2 or 4 (``K = 2^b`` outputs).
    table : MVUTable
        The design for ``(eps, bits)``: :func:`solve_mvu`, or the app's stored one,
        ``corbin_fl.design_store.designs(MVU_DESIGNS).get(MVUKey(eps, bits))`` (shipped, cached
        or solved once per machine).
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


@dataclass(frozen=True)
class MVUKey:
    """The inputs of one design: ``eps``, the bits (one of :data:`IMVU_BITS`) and the input
    points, checked (``ValueError``) and normalised (``eps`` a float)."""

    eps: float
    bits: int
    inputs: int = INPUT_POINTS

    def __post_init__(self) -> None:
        object.__setattr__(self, "eps", positive(self.eps))
        object.__setattr__(self, "bits", integer(self.bits, "bits", 1))
        object.__setattr__(self, "inputs", integer(self.inputs, "inputs", 2))
        if self.bits not in IMVU_BITS:
            raise ValueError(f"bits must be one of {IMVU_BITS}, got {self.bits}")


@dataclass(frozen=True)
class MVUDesigns:
    """I-MVU's designs as a kind of stored design (``corbin_fl.design_store.DesignKind``).

    The store keeps them under ``$CORBIN_FL_CACHE/imvu/`` (:attr:`folder`) and ships the
    experiments' eps grid in ``corbin_fl/mvu_tables/`` (:attr:`shipped`). A file holds its
    inputs (solver version, ``eps``, bits, input points) beside the table; :meth:`decode` ignores
    one for other inputs and refuses one whose table fails :meth:`MVUTable.check` (stochastic,
    unbiased, exactly eps-LDP), so a tampered file cannot weaken the privacy. This class is the
    format and the math only; the store reads and writes the files.
    """

    folder: str = "imvu"
    """The cache's folder under ``$CORBIN_FL_CACHE`` (users' caches live there: keep it)."""
    shipped: str = "mvu_tables"
    """The folder of the installed package ``corbin_fl`` holding the designs solved ahead
    (``bench/solve_mvu_tables.py``)."""
    label: str = "MVU"
    """What the store's log messages call these designs (``MVU table ...``, ``MVU cache ...``)."""

    def file_name(self, key: MVUKey) -> str:
        """``mvu-b<bits>-n<inputs>-<hash>.json``, the hash of the solver version, ``eps`` (exact,
        as hex) and the budget: the shipped files' names."""
        digest = json.dumps([SOLVER_VERSION, float(key.eps).hex(), key.bits, key.inputs])
        name = hashlib.sha256(digest.encode()).hexdigest()[:16]
        return f"mvu-b{key.bits}-n{key.inputs}-{name}.json"

    def key_of(self, design: MVUTable) -> MVUKey:
        """The inputs ``design`` was solved for."""
        return MVUKey(design.eps, design.bits, design.inputs)

    def encode(self, design: MVUTable) -> dict[str, Any]:
        """``design`` with its inputs as plain JSON types."""
        return {
            "version": SOLVER_VERSION,
            "eps": design.eps,
            "bits": design.bits,
            "inputs": design.inputs,
            "transition": design.transition.tolist(),
            "values": design.values.tolist(),
            "mean_variance": design.mean_variance,
        }

    def decode(self, doc: Any, key: MVUKey) -> MVUTable | None:
        """The checked table in ``doc`` if it was solved for ``key`` (this solver version), else
        None; raises ``ValueError``, ``KeyError`` or ``TypeError`` for a malformed document or a
        table that fails :meth:`MVUTable.check`."""
        if (doc["version"], doc["eps"], doc["bits"], doc["inputs"]) != (
            SOLVER_VERSION,
            key.eps,
            key.bits,
            key.inputs,
        ):
            return None
        table = MVUTable(
            key.eps,
            key.bits,
            key.inputs,
            np.array(doc["transition"], dtype=np.float64),
            np.array(doc["values"], dtype=np.float64),
            float(doc["mean_variance"]),
        )
        table.check()
        return table

    def solve(self, key: MVUKey, design: Callable[[MVUKey], MVUTable]) -> MVUTable:
        """:func:`solve_mvu` for ``key``, searched from ``design`` (the store's lookup) of the
        next smaller budget, which it is never worse than."""
        below = [c for c in IMVU_BITS if c < key.bits]
        lower = design(MVUKey(key.eps, below[-1], key.inputs)) if below else None
        return solve_mvu(key.eps, key.bits, key.inputs, lower=lower)


MVU_DESIGNS = MVUDesigns()
"""I-MVU's designs (:class:`MVUDesigns`); the app's store of them is
``corbin_fl.design_store.designs(MVU_DESIGNS)``."""
