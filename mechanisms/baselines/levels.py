r"""Finite-output scalar mechanisms: the common frame of PBM, RQM and I-MVU.

Each mechanism here releases, for every coordinate independently, one of ``K`` symbols. With the
coordinate clipped into ``[c - r, c + r]`` and normalised to ``x = (clip(w) - c) / r`` in
``[-1, 1]``, symbol ``k`` is drawn with probability ``P(k | x)`` and decoded as
``c + r v_k`` (the normalised level ``v_k``). The three properties every subclass states and the
tests check:

- **unbiased**: ``sum_k P(k | x) v_k = x`` for every ``x`` in ``[-1, 1]``;
- **pure local DP**: ``P(k | x) <= e^eps P(k | x')`` for every ``k, x, x'``
  (:meth:`FiniteMechanism.epsilon` is the exact ``sup log`` of that ratio);
- **bits**: a symbol travels in ``bits`` bits (1, 2, 4 or 8, the smallest that holds ``K``),
  packed by :func:`mechanisms.packing.pack_symbols`.

The output law depends on ``x`` only, so the exact ``eps`` is a property of the ``K`` functions
``P(k | .)`` on ``[-1, 1]`` (the radius ``r`` is the sensitivity scale, as in every baseline).
Sampling is by inverse CDF on ``float64`` uniforms from the injected generator.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

import numpy as np
import torch

from corbin_fl.mechanisms.baselines._common import clip_to_box, prepare
from corbin_fl.mechanisms.validate import torch_generator

__all__ = ["FiniteMechanism", "log_ratio", "symbol_bits"]

_CHUNK = 1 << 16
"""Coordinates sampled at once (``K`` float64 probabilities each)."""


def symbol_bits(num_levels: int) -> int:
    """Bits per symbol of ``num_levels`` symbols: the smallest of 1, 2, 4, 8 with ``2^b >= K``."""
    if isinstance(num_levels, bool) or not isinstance(num_levels, int) or num_levels < 2:
        raise ValueError(f"a mechanism needs at least 2 output levels, got {num_levels!r}")
    for b in (1, 2, 4, 8):
        if num_levels <= 1 << b:
            return b
    raise ValueError(f"at most 256 output levels fit one byte, got {num_levels}")


class FiniteMechanism(ABC):
    """A per-coordinate mechanism with ``K`` outputs on ``x`` in ``[-1, 1]`` (module docstring).

    Subclasses set :attr:`levels` (``float64 [K]``, the normalised decoded values) and implement
    :meth:`probabilities` and :meth:`epsilon`.
    """

    levels: np.ndarray

    @property
    def num_levels(self) -> int:
        """``K``, the number of output symbols."""
        return int(self.levels.size)

    @property
    def bits(self) -> int:
        """Bits per coordinate on the wire (:func:`symbol_bits`)."""
        return symbol_bits(self.num_levels)

    @abstractmethod
    def probabilities(self, x: torch.Tensor) -> torch.Tensor:
        """``P(k | x)`` for ``x`` in ``[-1, 1]``: ``float64 [..., K]``, rows summing to 1."""

    @abstractmethod
    def epsilon(self) -> float:
        """The exact pure-LDP epsilon: ``sup_{k, x, x'} log P(k | x) / P(k | x')``."""

    def boundaries(self, x: torch.Tensor) -> torch.Tensor:
        """The inner CDF ``F_k(x) = sum_{j <= k} P(j | x)``, ``k = 0 .. K - 2``: ``float64
        [n, K - 1]`` for ``x`` of shape ``[n]`` (:meth:`sample` draws symbol ``#{k : u >= F_k}``
        for ``u ~ U[0, 1)``). A subclass may override it with a cheaper form of the same
        values, bit for bit."""
        return torch.cumsum(self.probabilities(x), dim=-1)[:, :-1]

    def variance(self, x: torch.Tensor) -> torch.Tensor:
        """``Var[v_K | x] = sum_k P(k | x) v_k^2 - x^2`` (normalised; times ``r^2`` decoded)."""
        v = torch.as_tensor(self.levels, dtype=torch.float64, device=x.device)
        p = self.probabilities(x.to(torch.float64))
        return p @ (v * v) - x.to(torch.float64) ** 2

    def sample(
        self,
        w: torch.Tensor | float,
        c: torch.Tensor | float,
        r: torch.Tensor | float,
        *,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Draw one symbol per coordinate of ``clip(w)``: ``uint8`` of the broadcast shape.

        Parameters
        ----------
        w, c, r : torch.Tensor or float
            Weights, centers, radii ``> 0`` (broadcast together; ``w`` clipped into the box).
        generator : torch.Generator, optional
            The coins, on the tensors' device; ``None`` seeds a fresh one from the OS CSPRNG.
        """
        wt, ct, rt = prepare(w, c, r)
        g = torch_generator(generator, wt.device)
        x = ((clip_to_box(wt, ct, rt) - ct).to(torch.float64) / rt.to(torch.float64)).reshape(-1)
        x.clamp_(-1.0, 1.0)
        out = torch.empty(x.numel(), dtype=torch.uint8, device=x.device)
        for lo in range(0, x.numel(), _CHUNK):
            hi = min(lo + _CHUNK, x.numel())
            cdf = self.boundaries(x[lo:hi])
            u = torch.rand(hi - lo, dtype=torch.float64, device=x.device, generator=g)
            out[lo:hi] = (u[:, None] >= cdf).sum(dim=-1).to(torch.uint8)
        return out.reshape(wt.shape)

    def decode(
        self, symbols: torch.Tensor, c: torch.Tensor | float, r: torch.Tensor | float
    ) -> torch.Tensor:
        """``c + r v_k`` per symbol (``float64``); symbols outside ``[0, K)`` raise ValueError."""
        s = symbols.to(torch.int64)
        if s.numel() and (int(s.min()) < 0 or int(s.max()) >= self.num_levels):
            raise ValueError(f"symbols must be in [0, {self.num_levels}), got out-of-range values")
        v = torch.as_tensor(self.levels, dtype=torch.float64, device=s.device)
        return c + r * v[s]

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(K={self.num_levels}, bits={self.bits}, "
            f"eps={self.epsilon():.6g})"
        )


def log_ratio(p_max: float, p_min: float) -> float:
    """``log(p_max / p_min)``, ``inf`` when ``p_min = 0 < p_max`` and 0 when both are 0."""
    if p_max <= 0.0:
        return 0.0
    if p_min <= 0.0:
        return math.inf
    return math.log(p_max / p_min)
