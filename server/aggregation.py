"""Server-side decoding and aggregation of the updates, and the global update (paper eq. 6).

Each aggregator validates one client update (:class:`corbin_fl.wire.WireError` on any problem),
folds it into a streaming accumulator, and at the end gives the estimate ``w_bar`` of the mean
local model ``(1/n) sum_i w_i`` (Alg. 3 line 23):

- one-bit mechanisms (corbin, augcorbin, ldpfl): a bit-sliced ``BitCounter`` counts the ``+1``
  signs ``k_j`` per parameter; ``w_bar_j = c_j + r_j alpha(eps) (2 k_j / n - 1)``, the mean of
  the decoded values ``c + U r alpha`` (Alg. 1 line 4);
- cq: the same counts, ``w_bar_j = c_j + r_j (2 k_j / n - 1)`` (``alpha = 1``, no privacy);
- ternary: the sum of ``t_j`` in {-1, 0, 1}; ``w_bar_j = c_j + B_j (sum t_j) / n`` (fdp Def. 6);
- float mechanisms (gaussian, laplace, fedavg): float64 sum of the released models / n;
- fedcad: float64 sum of the released updates / n, added to the global model.

:func:`apply_global_lr` is paper eq. (6): ``w_g <- (1 - lambda) w_g + lambda w_bar``.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod

import numpy as np
import torch
from flwr.app import ArrayRecord

from corbin_fl import wire
from corbin_fl.config import RunConfig

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
        Per-element center and radius sent this round, float32 ``[m]``.
    """

    def __init__(
        self, cfg: RunConfig, w_global: torch.Tensor, c: torch.Tensor, r: torch.Tensor
    ) -> None:
        self.cfg = cfg
        self.m = int(w_global.numel())
        self.w_global = w_global
        self.c = c
        self.r = r
        self.n = 0
        self.key, self.dtype, self.length = wire.update_spec(
            cfg.mechanism, self.m, cfg.ternary_encoding
        )

    def add(self, record: ArrayRecord) -> None:
        """Validate one update record and fold it in (raises :class:`WireError`)."""
        wire.check_keys(record, {self.key}, what="update")
        values = wire.read_array(record, self.key, self.dtype, self.length, finite=True)
        self._add(values)
        self.n += 1

    @abstractmethod
    def _add(self, values: np.ndarray) -> None: ...

    @abstractmethod
    def _estimate(self) -> torch.Tensor: ...

    def estimate(self) -> torch.Tensor | None:
        """The estimate of the mean local model (float32 ``[m]``), or None if no update came."""
        if self.n == 0:
            return None
        out = self._estimate().to(torch.float32)
        if not bool(torch.isfinite(out).all()):
            raise FloatingPointError("the aggregate has non-finite entries")
        return out


class BitsAggregator(Aggregator):
    """One bit per parameter (corbin, augcorbin, ldpfl, cq), counted by a ``BitCounter``."""

    def __init__(
        self, cfg: RunConfig, w_global: torch.Tensor, c: torch.Tensor, r: torch.Tensor
    ) -> None:
        from mechanisms.packing import BitCounter

        super().__init__(cfg, w_global, c, r)
        self.counter = BitCounter(self.m)
        pad = 8 * self.length - self.m
        self._pad_mask = np.uint8((1 << pad) - 1) if pad else None

    def _add(self, values: np.ndarray) -> None:
        if self._pad_mask is not None and values[-1] & self._pad_mask:
            raise wire.WireError("update has non-zero padding bits")
        self.counter.add(values)

    def _estimate(self) -> torch.Tensor:
        from mechanisms.packing import mean_from_counts

        counts = torch.as_tensor(np.asarray(self.counter.counts()), device=self.c.device)
        if self.cfg.mechanism == "cq":
            return self.c + self.r * (2.0 * counts.to(torch.float64) / self.n - 1.0)
        return mean_from_counts(counts, self.n, self.c, self.r, self.cfg.epsilon)


class TernaryAggregator(Aggregator):
    """Ternary compressor: sum of ``t`` in {-1, 0, 1}; decode ``c + B * mean(t)``."""

    def __init__(
        self, cfg: RunConfig, w_global: torch.Tensor, c: torch.Tensor, r: torch.Tensor
    ) -> None:
        super().__init__(cfg, w_global, c, r)
        self.total = torch.zeros(self.m, dtype=torch.int32, device=c.device)

    def _add(self, values: np.ndarray) -> None:
        t = wire.decode_ternary(values, self.m, self.cfg.ternary_encoding)
        self.total += torch.from_numpy(t).to(self.total.device, torch.int32)

    def _estimate(self) -> torch.Tensor:
        from mechanisms.baselines.ternary import ternary_params

        _, big_b = ternary_params(self.r, self.cfg.epsilon, self.cfg.ternary_sparsity)
        return self.c + big_b * (self.total.to(torch.float64) / self.n)


class FloatAggregator(Aggregator):
    """float32 releases (gaussian, laplace, fedavg models; fedcad updates), float64 sum."""

    def __init__(
        self, cfg: RunConfig, w_global: torch.Tensor, c: torch.Tensor, r: torch.Tensor
    ) -> None:
        super().__init__(cfg, w_global, c, r)
        self.total = torch.zeros(self.m, dtype=torch.float64, device=c.device)

    def _add(self, values: np.ndarray) -> None:
        self.total += torch.from_numpy(values).to(self.total.device, torch.float64)

    def _estimate(self) -> torch.Tensor:
        mean = self.total / self.n
        if self.cfg.mechanism == "fedcad":
            return self.w_global.to(torch.float64) + mean
        return mean


def make_aggregator(
    cfg: RunConfig, w_global: torch.Tensor, c: torch.Tensor, r: torch.Tensor
) -> Aggregator:
    """The aggregator of ``cfg.mechanism``."""
    if cfg.mechanism in wire.BITS_MECHANISMS:
        return BitsAggregator(cfg, w_global, c, r)
    if cfg.mechanism == "ternary":
        return TernaryAggregator(cfg, w_global, c, r)
    return FloatAggregator(cfg, w_global, c, r)


def apply_global_lr(w_global: torch.Tensor, estimate: torch.Tensor, lam: float) -> torch.Tensor:
    """Paper eq. (6): ``w_g <- (1 - lambda) w_{g,init} + lambda w_{g,final}``.

    Parameters
    ----------
    w_global : torch.Tensor
        ``w_{g,init}``, float32 ``[m]``.
    estimate : torch.Tensor
        ``w_{g,final}``, the aggregate of the round, float32 ``[m]``.
    lam : float
        Global learning rate ``lambda`` in (0, 1].

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
    if lam == 1.0:
        return est.clone()
    return ((1.0 - lam) * w_global + lam * est).to(torch.float32)
