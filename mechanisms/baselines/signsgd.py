r"""SignSGD with majority vote (Bernstein, Zhao, Azizzadenesheli & Anandkumar, ICLR 2019).

"signSGD with majority vote is communication efficient and fault tolerant" (arXiv:1810.05291),
Algorithm 1: each worker sends the sign of its update, one bit per coordinate; the server takes
the majority vote and every coordinate moves by a fixed step in the voted direction:

.. math::
    b_{ij} = \mathrm{sign}(\Delta_{ij}), \qquad
    \hat\Delta_j = \eta_j\,\mathrm{sign}\Bigl(\sum_i b_{ij}\Bigr),

where ``Delta_i = w_i - w_g`` is client ``i``'s local update (here ``range-mode = "update"``)
and the step ``eta_j`` is the layer's update radius ``R`` (the same scale every other
mechanism's update lives in). A zero coordinate has no sign: it votes +1 or -1 with a fair
coin (from the injected generator), so frozen parameters do not drift; a tied vote moves
nothing. No privacy: the bit is a deterministic function of the update's sign. A
communication baseline.
"""

from __future__ import annotations

import torch

from corbin_fl.mechanisms.baselines._common import prepare
from corbin_fl.mechanisms.baselines.hooks import Block, EncodeJob, Settings
from corbin_fl.mechanisms.validate import torch_generator

__all__ = ["block_release", "decode_counts", "majority_vote", "sign_bits"]


def sign_bits(
    delta: torch.Tensor | float, *, generator: torch.Generator | None = None
) -> torch.Tensor:
    """``sign(Delta) > 0`` per coordinate (``torch.bool``); exact zeros get a fair coin."""
    d, _, _ = prepare(delta, 0.0, 1.0)
    bits = d > 0
    zero = d == 0
    if bool(zero.any()):
        g = torch_generator(generator, d.device)
        coin = torch.rand(d.shape, generator=g, device=d.device) < 0.5
        bits = torch.where(zero, coin, bits)
    return bits


def majority_vote(plus: torch.Tensor, n: int) -> torch.Tensor:
    """``sign(2 k - n)`` in ``{-1, 0, +1}`` (``float64``) from the counts ``k`` of +1 votes."""
    if n < 1:
        raise ValueError(f"a vote needs at least one voter, got n = {n}")
    return torch.sign(2.0 * plus.to(torch.float64) - n)


def block_release(job: EncodeJob) -> Block:
    """The client's release of one range block (:data:`.hooks.BlockRelease`): the signs of
    ``w - c``, one bit each (the update's signs: its registry entry needs range-mode "update",
    where ``c`` is 0)."""
    w, gen = job.w, job.gen
    return lambda s, c, r: sign_bits(w[s] - c, generator=gen)


def decode_counts(
    k: torch.Tensor, n: int, c: torch.Tensor | float, r: torch.Tensor | float, cfg: Settings
) -> torch.Tensor:
    """``c + r sign(2 k - n)`` (:data:`.hooks.CountDecode`): the layer's step ``r = R`` in the
    direction the majority of the ``n`` clients voted for."""
    return c + r * majority_vote(k, n)
