"""The shapes of the hooks a mechanism's module gives the protocol (the registry names them).

A mechanism's registry entry (:class:`corbin_fl.registry.Mechanism`) names its hooks by
``"module:function"``; the client's and the server's generic steps call them, so that no code
outside the mechanism's module (and its one entry) depends on which mechanism it is:

- :data:`BlockRelease` (``block_release``): the client encodes ``w`` range block by range block
  (:func:`corbin_fl.client.encode.encode_bits`, ``encode_values``): ``hook(job)`` prepares what the
  whole update needs (a shared offset, an L2 clip) and returns ``release(s, c, r)``, the released
  tensor of the slice ``s`` of ``job.w`` with that block's center ``c`` and radius ``r``;
- :data:`CountDecode` (``count_decode``): the server's one-bit aggregator
  (:class:`corbin_fl.server.aggregation.BitsAggregator`) turns the counts ``k`` of ``+1`` bits of
  ``n`` clients into the estimate of the mean, ``hook(k, n, c, r, cfg)``;
- :data:`Pack`, :data:`Symbols`, :data:`SumDecode` (``pack``, ``symbols``, ``sum_decode``): a
  mechanism whose update is integer symbols in ``[0, levels]`` (its entry's ``sum_levels``)
  in a wire form of its own: the client's ``encode_symbols`` packs the block releases,
  ``hook(t, cfg)``; the server (``SymbolSumAggregator``) and a secure sum
  (:func:`corbin_fl.secure.symbols`) read them back, ``hook(values, m, cfg)`` (ValueError on a
  bad update), and the aggregator decodes their exact sum ``S`` of ``n`` clients,
  ``hook(S, n, c, r, cfg)``;
- :data:`SharedRanks` (``shared_ranks``): a mechanism with a server-shared seed (its entry's
  ``shared_seed`` keys): the rank the server sends each of the round's participants,
  ``hook(seed, n)[i]`` for the ``i``-th by node id; the client's encoder finds
  ``(seed, rank, n)`` in ``job.shared_seed``;
- :data:`UpdateBound`, :data:`ServerNoise` (``update_bound``, ``server_noise``): central DP, the
  server's noise on the clients' clipped updates (``NoisySumAggregator``): it refuses an update
  whose L2 norm is above ``hook(cfg)`` and adds ``hook(cfg, m, generator)`` to their sum;
- :data:`NodeState`, :data:`StatefulRelease` (``node_state``, ``stateful_release``): a
  mechanism with a state on the node across rounds (``client.encode:encode_stateful``):
  ``hook(cfg)`` builds it (an object with ``state_dict``, ``load_state_dict`` and the keys it
  keeps, ``STATE_SCALARS`` and ``STATE_TENSORS``), the node restores its saved state into it,
  ``hook(state, job)`` releases the update (float32) and advances it, and the node saves it;
- :data:`ReleaseLimit` (``release_limit``): the server's float aggregator
  (:func:`corbin_fl.server.aggregation.float_release_bounds`) admits a release ``v`` when
  ``|v - c| <= hook(cfg, c, r)`` (float64 tensors; the honest releases' tail beyond it is
  negligible).

``cfg`` is the run's :class:`corbin_fl.config.RunConfig` and ``job`` the client encoder's
:class:`corbin_fl.client.encode.EncodeInput`; the math reads them through the protocols below (it
imports nothing of the rest of the project).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np
    import torch

__all__ = [
    "Block",
    "BlockRelease",
    "CountDecode",
    "EncodeJob",
    "NodeState",
    "Pack",
    "ReleaseLimit",
    "ServerNoise",
    "Settings",
    "SharedRanks",
    "StatefulRelease",
    "SumDecode",
    "Symbols",
    "UpdateBound",
]


class Settings(Protocol):
    """What a hook reads of the run's configuration (:class:`corbin_fl.config.RunConfig`)."""

    @property
    def epsilon(self) -> float: ...

    @property
    def delta(self) -> float: ...

    @property
    def num_rounds(self) -> int: ...

    def param(self, key: str) -> Any:
        """A registered parameter of the run (``"central-clip"``, ...)."""


class EncodeJob(Protocol):
    """What a block release reads of the encoder's input
    (:class:`corbin_fl.client.encode.EncodeInput`)."""

    @property
    def cfg(self) -> Any: ...

    @property
    def w(self) -> torch.Tensor: ...

    @property
    def w_global(self) -> torch.Tensor: ...

    @property
    def gen(self) -> torch.Generator: ...


Block = Callable[[slice, "torch.Tensor | float", "torch.Tensor | float"], "torch.Tensor"]
"""``release(s, c, r)``: the released tensor of ``job.w[s]`` with the block's ``c`` and ``r``."""

BlockRelease = Callable[[EncodeJob], Block]
"""``hook(job) -> release``: one update's per-block release (module docstring)."""

CountDecode = Callable[
    ["torch.Tensor", int, "torch.Tensor | float", "torch.Tensor | float", Settings],
    "torch.Tensor",
]
"""``hook(k, n, c, r, cfg)``: the estimate of the mean from the counts ``k`` of ``+1`` bits."""

ReleaseLimit = Callable[[Settings, "torch.Tensor", "torch.Tensor"], "torch.Tensor"]
"""``hook(cfg, c, r)``: the largest honest ``|v - c|`` of a float release (float64)."""

Pack = Callable[["np.ndarray", Settings], "np.ndarray"]
"""``hook(t, cfg)``: the update's array from the block releases ``t`` (host numpy)."""

Symbols = Callable[["np.ndarray", int, Settings], "np.ndarray"]
"""``hook(values, m, cfg)``: the ``m`` symbols in ``[0, levels]`` of an update's array."""

SumDecode = Callable[
    ["torch.Tensor", int, "torch.Tensor | float", "torch.Tensor | float", Settings],
    "torch.Tensor",
]
"""``hook(S, n, c, r, cfg)``: the estimate of the mean from the sum ``S`` of ``n`` symbols."""

SharedRanks = Callable[[int, int], "list[int]"]
"""``hook(seed, n)``: the rank of each of ``n`` participants (by node id) under a shared seed."""

UpdateBound = Callable[[Settings], float]
"""``hook(cfg)``: the largest L2 norm of a client's (clipped) update the server admits."""

ServerNoise = Callable[[Settings, int, "torch.Generator | None"], "torch.Tensor"]
"""``hook(cfg, m, generator)``: the server's noise on the sum of the updates (float64 ``[m]``)."""

NodeState = Callable[[Settings], Any]
"""``hook(cfg)``: a node's state of a stateful mechanism before its first round."""

StatefulRelease = Callable[[Any, EncodeJob], "torch.Tensor"]
"""``hook(state, job)``: the release of the update, advancing ``state``."""
