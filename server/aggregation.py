"""Server-side decoding and aggregation of the updates, and the global update (paper eq. 6).

Each aggregator validates one client update (:class:`corbin_fl.wire.WireError` on any problem),
folds it into a streaming accumulator, and at the end gives the estimate ``w_bar`` of the mean
local model ``(1/n) sum_i w_i`` (Alg. 3 line 23):

- one-bit mechanisms (corbin, augcorbin, ldpfl): a bit-sliced ``BitCounter`` counts the ``+1``
  signs ``k_j`` per parameter; ``w_bar_j = c_j + r_j alpha(eps) (2 k_j / n - 1)``, the mean of
  the decoded values ``c + U r alpha`` (Alg. 1 line 4); another one-bit mechanism decodes the
  same counts with its registered ``count_decode`` (cq: ``alpha = 1``; signsgd: the majority
  vote ``c_j + r_j sign(2 k_j - n)``);
- pbm, rqm, imvu: the float64 sum of the decoded levels, ``w_bar_j = c_j + r_j (sum v) / n``;
- integer symbols in a wire form of the mechanism's own (ternary: ``t_j + 1``, ``t_j`` in
  {-1, 0, 1}): their exact sum, decoded by its ``sum_decode`` (``c_j + B_j (sum t_j) / n``);
- float mechanisms (gaussian, laplace, fedavg): float64 sum of the released models / n, each
  release within its registered ``release_limit``;
- fedcad: float64 sum of the released updates / n, added to the global model;
- central DP (central-gaussian): float64 sum of the clipped updates plus the server's noise (the
  entry's ``server_noise``), divided by the round's cohort (DP-FedAvg's Gaussian sum query);
  a float release outside :func:`float_release_bounds` (or NaN/inf) is rejected, not averaged.

:func:`apply_global_lr` is paper eq. (6): ``w_g <- (1 - lambda) w_g + lambda w_bar``.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final

import numpy as np
import torch
from flwr.app import ArrayRecord

from corbin_fl import registry, wire
from corbin_fl.config import RunConfig
from corbin_fl.layout import ParamLayout, RangeBlock, range_blocks
from corbin_fl.mechanisms.packing import BitCounter, mean_from_counts, unpack_symbols
from corbin_fl.registry import finite_mechanism

logger = logging.getLogger(__name__)


class Aggregator(ABC):
    """Streaming aggregator of the updates of one round.

    Parameters
    ----------
    cfg : RunConfig
        Run configuration (mechanism, eps, ...).
    w_global : torch.Tensor
        The global model sent this round, float32 ``[m]``.
    c, r : torch.Tensor
        Center and radius sent this round: per layer (``[L]``, with ``layout``; what the
        deployment uses) or per element (``[m]``, without).
    layout : ParamLayout, optional
        The model's layer layout when ``c`` and ``r`` are per layer.
    cohort : int, optional
        Nodes asked for an update this round, fixed before any reply (the central Gaussian's
        denominator); default: the number of accepted updates.

    Memory: the accumulator is the only model-sized state (int32 counts, float64 sums); ``c`` and
    ``r`` are walked layer by layer (:func:`corbin_fl.layout.range_blocks`), never expanded.
    """

    def __init__(
        self,
        cfg: RunConfig,
        w_global: torch.Tensor,
        c: torch.Tensor,
        r: torch.Tensor,
        layout: ParamLayout | None = None,
        cohort: int | None = None,
    ) -> None:
        self.cfg = cfg
        self.cohort = cohort
        self.m = int(w_global.numel())
        self.w_global = w_global
        self.blocks = range_blocks(_cpu(c), _cpu(r), self.m, layout)
        self.n = 0
        self.key, self.dtype, self.length = registry.update_spec(cfg, self.m)
        self._start()

    def add(self, record: ArrayRecord) -> None:
        """Validate one update record and fold it in (raises :class:`WireError`)."""
        wire.check_keys(record, {self.key}, what="update")
        values = wire.read_array(record, self.key, self.dtype, self.length, finite=True)
        self._add(values)
        self.n += 1

    @abstractmethod
    def _start(self) -> None:
        """Allocate the accumulator (called once by ``__init__``)."""

    def _hooks(self, *names: str) -> tuple[Callable[..., Any], ...]:
        """The run's mechanism's hooks ``names`` (its registry entry); ``ValueError`` naming
        the mechanism and the hooks when it registers any of them not."""
        entry = registry.get(self.cfg.mechanism)
        hooks = tuple(entry.hook(name) for name in names)
        if any(h is None for h in hooks):
            raise ValueError(f"{entry.name} registers no {' / '.join(names)} hooks")
        return tuple(h for h in hooks if h is not None)

    @abstractmethod
    def _add(self, values: np.ndarray) -> None: ...

    @abstractmethod
    def _estimate(self) -> torch.Tensor: ...

    def estimate(self) -> torch.Tensor | None:
        """The estimate of the mean local model (float32 ``[m]``, CPU), or None if no update came.

        May reuse the accumulator's memory: call it once, after the last :meth:`add`.
        """
        if self.n == 0:
            return None
        out = self._estimate().to(torch.float32)
        for lo in range(0, self.m, CHUNK):
            if not bool(torch.isfinite(out[lo : lo + CHUNK]).all()):
                raise FloatingPointError("the aggregate has non-finite entries")
        return out

    def from_symbol_sum(self, total: np.ndarray, n: int) -> None:
        """Take the exact sum ``total`` (int64 ``[m]``) of ``n`` clients' symbols in place of
        their updates (secure aggregation, :mod:`corbin_fl.secure`): the estimate is then what
        the plain path gives for the same symbols. Only a mechanism whose estimate is affine in
        the symbol sum (registry ``sum_levels``) implements it."""
        raise NotImplementedError(f"{type(self).__name__} cannot decode a symbol sum")

    def _take_sum(self, total: np.ndarray, n: int) -> np.ndarray:
        total = np.asarray(total, dtype=np.int64)
        if total.shape != (self.m,):
            raise ValueError(f"a sum of {total.size} symbols for {self.m} parameters")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"a symbol sum needs n >= 1 clients, got {n!r}")
        self.n = n
        return total


class _SummedCounts:
    """The counts of ``+1`` bits given whole (a secure-aggregation sum), where a ``BitCounter``
    would have counted the packed updates one by one."""

    def __init__(self, counts: np.ndarray) -> None:
        self._counts = counts

    def counts(self) -> np.ndarray:
        return self._counts


class BitsAggregator(Aggregator):
    """One bit per parameter, counted by a ``BitCounter``, decoded with the mechanism's
    registered ``count_decode`` (LDPQ's decode where it has none)."""

    def _start(self) -> None:
        self.counter = BitCounter(self.m)
        self.count_decode = registry.get(self.cfg.mechanism).hook("count_decode")
        pad = 8 * self.length - self.m
        self._pad_mask = np.uint8((1 << pad) - 1) if pad else None

    def _add(self, values: np.ndarray) -> None:
        if self._pad_mask is not None and values[-1] & self._pad_mask:
            raise wire.WireError("update has non-zero padding bits")
        self.counter.add(values)

    def from_symbol_sum(self, total: np.ndarray, n: int) -> None:
        """The sums of the bits are the counts ``k`` of ``+1`` bits."""
        self.counter = _SummedCounts(self._take_sum(total, n).astype(np.int32))  # type: ignore[assignment]

    def _estimate(self) -> torch.Tensor:
        """``w_bar = c + r alpha (2 k / n - 1)`` per block (or the registered ``count_decode``).

        The int32 counts ``k`` are overwritten block by block with the float32 estimate (same
        size), so the estimate needs no second model-sized buffer.
        """
        counts = np.ascontiguousarray(self.counter.counts(), dtype=np.int32)
        self.counter = None  # type: ignore[assignment]  # its bit planes are not needed any more
        out = counts.view(np.float32)
        for lo, hi, c, r in _chunks(self.blocks):
            k = torch.from_numpy(counts[lo:hi].copy())
            out[lo:hi] = self._decode(k, c, r).numpy()
        return torch.from_numpy(out)

    def _decode(
        self, k: torch.Tensor, c: torch.Tensor | float, r: torch.Tensor | float
    ) -> torch.Tensor:
        """``c + r alpha(eps) (2 k / n - 1)``: the mean of the decoded bits (Alg. 1 line 4), or
        the mechanism's own ``count_decode(k, n, c, r, cfg)``."""
        if self.count_decode is not None:
            out: torch.Tensor = self.count_decode(k, self.n, c, r, self.cfg)
            return out
        return mean_from_counts(k, self.n, c, r, self.cfg.epsilon)


class SymbolSumAggregator(Aggregator):
    """Integer symbols in ``[0, levels]`` in a wire form of the mechanism's own (ternary: ``t +
    1``): read back with its registered ``symbols`` hook (a bad update is a
    :class:`~corbin_fl.wire.WireError`), summed exactly (int32), the sum ``S`` decoded with its
    ``sum_decode`` (ternary: ``c + B (S - n) / n``)."""

    def _start(self) -> None:
        self.read, self.decode = self._hooks("symbols", "sum_decode")
        self.total = torch.zeros(self.m, dtype=torch.int32)

    def _add(self, values: np.ndarray) -> None:
        try:
            symbols = self.read(values, self.m, self.cfg)
        except ValueError as exc:
            raise wire.WireError(str(exc)) from exc
        self.total += torch.from_numpy(symbols).to(self.total.device, torch.int32)

    def from_symbol_sum(self, total: np.ndarray, n: int) -> None:
        """The secure sum is the sum of the same symbols."""
        self.total = torch.from_numpy(self._take_sum(total, n)).to(torch.int32)

    def _estimate(self) -> torch.Tensor:
        out = torch.empty(self.m, dtype=torch.float32)
        for lo, hi, c, r in _chunks(self.blocks):
            out[lo:hi] = self.decode(self.total[lo:hi], self.n, c, r, self.cfg)
        return out


class LevelsAggregator(Aggregator):
    """Finite-output mechanisms (pbm, rqm, imvu): ``b``-bit symbols decoded to their levels.

    The accumulator is the float64 sum of the normalised levels ``v_k`` per parameter;
    ``w_bar = c + r (sum v) / n``, the mean of the decoded values ``c + r v_k``. A symbol outside
    ``[0, K)`` (possible when ``K`` is not a power of 2) or a set padding bit is rejected.
    """

    def _start(self) -> None:
        self.mechanism = finite_mechanism(self.cfg)
        self.levels = torch.as_tensor(self.mechanism.levels, dtype=torch.float64)
        self.total = torch.zeros(self.m, dtype=torch.float64)

    def _add(self, values: np.ndarray) -> None:
        try:
            symbols = unpack_symbols(values, self.m, self.mechanism.bits)
        except ValueError as exc:
            raise wire.WireError(str(exc)) from exc
        if symbols.size and int(symbols.max()) >= self.mechanism.num_levels:
            raise wire.WireError(
                f"update has a symbol outside [0, {self.mechanism.num_levels}) "
                f"({self.cfg.mechanism} has {self.mechanism.num_levels} levels)"
            )
        self.total += self.levels[torch.from_numpy(symbols).to(torch.int64)]

    def from_symbol_sum(self, total: np.ndarray, n: int) -> None:
        """Evenly spaced levels ``v_k = v_0 + k step`` (pbm, rqm): the sum of the levels is
        ``n v_0 + S step`` (float64; the plain path's float64 sum up to rounding)."""
        k = self.levels.numel()
        step = (self.levels[-1] - self.levels[0]) / (k - 1)
        spaced = self.levels[0] + step * torch.arange(k, dtype=torch.float64)
        if not torch.allclose(spaced, self.levels, rtol=0.0, atol=1e-12):
            raise ValueError(f"{self.cfg.mechanism}'s levels are not evenly spaced")
        s = torch.from_numpy(self._take_sum(total, n)).to(torch.float64)
        self.total = n * self.levels[0] + s * step

    def _estimate(self) -> torch.Tensor:
        out = torch.empty(self.m, dtype=torch.float32)
        for lo, hi, c, r in _chunks(self.blocks):
            out[lo:hi] = c + r * (self.total[lo:hi] / self.n)
        return out


FLOAT_ABS_LIMIT: Final[float] = 1e6
"""Largest magnitude accepted in a ``fedavg`` model or a ``fedcad`` update (no clip the server
could check, no noise scale it knows). No weight of this project's models comes near it; it
keeps one float32 near ``3.4e38`` from swamping the average. A sanity bound, not robustness:
these two baselines let one client move the mean by up to ``2 FLOAT_ABS_LIMIT / n``."""


def float_release_bounds(
    cfg: RunConfig, c: torch.Tensor | float, r: torch.Tensor | float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(reference, limit)`` of the admissible float releases: ``|v - reference| <= limit``.

    - a mechanism with a registered ``release_limit`` (a clip and noise the server knows):
      ``reference = c``, ``limit = release_limit(cfg, c, r)`` (gaussian: ``r + 12 sigma``,
      ``sigma = 2 r sigma_1(eps, delta)``; laplace: ``r + 75 b``, ``b = 2 r / eps``);
    - any other (fedavg, fedcad): ``reference = 0``, ``limit = FLOAT_ABS_LIMIT``.

    Both limits get a relative slack of ``1e-5`` of ``|c| + limit`` for float32 rounding. An
    honest release falls outside with probability below ``4e-33`` per parameter; what falls
    outside is rejected, never averaged. The limits also bound what one malicious client can do
    to the mean: replacing its honest release by any admissible one moves parameter ``j`` of the
    mean by at most ``2 limit_j / n``.

    Returns
    -------
    tuple[torch.Tensor, torch.Tensor]
        float64 tensors on ``c``'s device, broadcastable to ``c`` (scalars for scalar ``c``, ``r``).
    """
    c64 = torch.as_tensor(c).to(torch.float64)
    r64 = torch.as_tensor(r).to(device=c64.device, dtype=torch.float64)
    release_limit = registry.get(cfg.mechanism).hook("release_limit")
    if release_limit is None:
        zero = torch.zeros((), dtype=torch.float64, device=c64.device)
        return zero, torch.full((), FLOAT_ABS_LIMIT, dtype=torch.float64, device=c64.device)
    limit: torch.Tensor = release_limit(cfg, c64, r64)
    return c64, limit + 1e-5 * (c64.abs() + limit)


class FloatAggregator(Aggregator):
    """float32 releases (gaussian, laplace, fedavg models; fedcad updates), float64 sum.

    Each release must be finite and within :func:`float_release_bounds`; one that is not is
    rejected (:class:`corbin_fl.wire.WireError`) before anything is added.
    """

    def _start(self) -> None:
        self.total = torch.zeros(self.m, dtype=torch.float64)
        self.bounds = [float_release_bounds(self.cfg, b.c, b.r) for b in self.blocks]

    def _add(self, values: np.ndarray) -> None:
        v = torch.from_numpy(values)
        for b, (reference, limit) in zip(self.blocks, self.bounds, strict=True):
            part = v[b.lo : b.hi].to(torch.float64)
            outside = (part - reference).abs() > limit
            if bool(outside.any()):
                j = b.lo + int(torch.nonzero(outside)[0, 0])
                raise wire.WireError(
                    f"update value {float(v[j]):.6g} at index {j} is outside the admissible "
                    f"range of {self.cfg.mechanism} releases "
                    f"({int(outside.sum())} value(s) outside in [{b.lo}, {b.hi}))"
                )
        self.total += v

    def _estimate(self) -> torch.Tensor:
        return self.total / self.n


class NoisySumAggregator(Aggregator):
    """Central DP (central-gaussian, DP-FedAvg's Gaussian sum query): the server's noise.

    Each update is the client's clipped ``w_i - w_g``; one whose L2 norm exceeds the entry's
    ``update_bound`` ``C`` (with a float32 slack of ``1e-5``) or that is not finite is rejected,
    so no client can exceed the sensitivity the accounting assumes. The estimate is
    ``(sum + noise) / cohort`` with the entry's ``server_noise`` (central-gaussian:
    ``N(0, z^2 C^2 I)``, ``z`` for (epsilon, delta) over ``num-rounds`` rounds), drawn from a
    generator seeded by the OS CSPRNG (:attr:`noise_generator`, None, in production).
    """

    noise_generator: torch.Generator | None = None

    def _start(self) -> None:
        self.bound, self.noise = self._hooks("update_bound", "server_noise")
        self.total = torch.zeros(self.m, dtype=torch.float64)

    def _add(self, values: np.ndarray) -> None:
        v = torch.from_numpy(values).to(torch.float64)
        norm = float(torch.linalg.vector_norm(v))
        clip = float(self.bound(self.cfg))
        limit = clip * (1.0 + 1e-5)
        if not norm <= limit:  # also NaN
            raise wire.WireError(
                f"update L2 norm {norm:.6g} is above the clip {clip:g} of "
                f"{self.cfg.mechanism} (the sensitivity the accounting assumes)"
            )
        self.total += v

    def _estimate(self) -> torch.Tensor:
        noise = self.noise(self.cfg, self.m, self.noise_generator)
        denominator = self.cohort if self.cohort else self.n
        total: torch.Tensor = self.total.add_(noise).div_(denominator)
        return total


class FloatUpdateAggregator(FloatAggregator):
    """Float releases of the updates ``w_i - w_g`` (fedcad): their mean is added back to the
    global model."""

    def _estimate(self) -> torch.Tensor:
        return self.w_global.to("cpu", torch.float64) + super()._estimate()


def make_aggregator(
    cfg: RunConfig,
    w_global: torch.Tensor,
    c: torch.Tensor,
    r: torch.Tensor,
    layout: ParamLayout | None = None,
    cohort: int | None = None,
) -> Aggregator:
    """The registered aggregator of ``cfg.mechanism`` (``c``, ``r`` per layer with ``layout``;
    :mod:`corbin_fl.registry`)."""
    cls = registry.get(cfg.mechanism).aggregator_class()
    return cls(cfg, w_global, c, r, layout, cohort)


def _cpu(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu()


CHUNK: Final[int] = 1 << 18
"""Elements decoded at a time: the temporaries of the estimate stay a few MiB, whatever ``m``."""


def _chunks(
    blocks: Sequence[RangeBlock],
) -> Iterator[tuple[int, int, torch.Tensor | float, torch.Tensor | float]]:
    """``(lo, hi, c, r)`` over ``blocks`` cut into runs of at most :data:`CHUNK` elements."""
    for b in blocks:
        for lo in range(b.lo, b.hi, CHUNK):
            hi = min(lo + CHUNK, b.hi)
            if isinstance(b.c, torch.Tensor):
                yield lo, hi, b.c[lo - b.lo : hi - b.lo], b.r[lo - b.lo : hi - b.lo]  # type: ignore[index]
            else:
                yield lo, hi, b.c, b.r


def apply_global_lr(
    w_global: torch.Tensor, estimate: torch.Tensor, lam: float, *, inplace: bool = False
) -> torch.Tensor:
    """Paper eq. (6): ``w_g <- (1 - lambda) w_{g,init} + lambda w_{g,final}``.

    Parameters
    ----------
    w_global : torch.Tensor
        ``w_{g,init}``, float32 ``[m]``.
    estimate : torch.Tensor
        ``w_{g,final}``, the aggregate of the round, float32 ``[m]``.
    lam : float
        Global learning rate ``lambda`` in (0, 1].
    inplace : bool
        Write the result into ``estimate`` when it is float32 on ``w_global``'s device (the
        server does: no third model-sized vector); otherwise ``estimate`` is left untouched.

    Returns
    -------
    torch.Tensor
        The new global model, float32 ``[m]``.
    """
    if not 0.0 < lam <= 1.0:
        raise ValueError(f"global learning rate must be in (0, 1], got {lam}")
    if estimate.shape != w_global.shape:
        raise ValueError(f"estimate shape {tuple(estimate.shape)} != {tuple(w_global.shape)}")
    est = estimate.to(w_global.device, torch.float32)
    if not inplace and est is estimate:
        est = est.clone()
    if lam == 1.0:
        return est
    return est.mul_(lam).add_(w_global.to(torch.float32), alpha=1.0 - lam)
