"""Vanilla FedAvg baseline: the weights are sent as they are (no privacy, no compression).

This is the "Vanilla-FL" reference of the CorBin-FL experiments (Experiment 1 and Figure 2c).
By default nothing is clipped, which is plain FedAvg; ``clip=True`` clips into
``[c - r, c + r]`` like every other mechanism, to separate the effect of clipping from the
effect of noise or quantization in ablations.

Aggregation: the server averages the returned values directly.
"""

from __future__ import annotations

import logging

import torch

from corbin_fl.mechanisms.baselines._common import COMPUTE_DTYPE, clip_to_box, prepare
from corbin_fl.mechanisms.baselines.hooks import Block, EncodeJob

logger = logging.getLogger(__name__)

__all__ = ["block_release", "vanilla"]


def vanilla(
    w: torch.Tensor,
    c: torch.Tensor | float | None = None,
    r: torch.Tensor | float | None = None,
    *,
    clip: bool = False,
) -> torch.Tensor:
    """Identity release (FedAvg); optionally clip into ``[c - r, c + r]``.

    Parameters
    ----------
    w : torch.Tensor
        Floating-point weights.
    c, r : torch.Tensor or float, optional
        Center and radius, required only when ``clip`` is ``True``.
    clip : bool, default False
        Clip into ``[c - r, c + r]`` first.

    Returns
    -------
    torch.Tensor
        A new ``float32`` tensor on ``w``'s device (``w`` itself is never modified).
    """
    if not isinstance(clip, bool):
        raise TypeError(f"clip must be a bool, got {type(clip).__name__}")
    if not isinstance(w, torch.Tensor) or not w.dtype.is_floating_point:
        got = w.dtype if isinstance(w, torch.Tensor) else type(w).__name__
        raise TypeError(f"w must be a floating-point tensor, got {got}")
    if not clip:
        return w.to(dtype=COMPUTE_DTYPE, copy=True)
    if c is None or r is None:
        raise ValueError("clip=True needs both c and r")
    wt, ct, rt = prepare(w, c, r)
    return clip_to_box(wt, ct, rt)


def block_release(job: EncodeJob) -> Block:
    """The client's release of one range block (:data:`.hooks.BlockRelease`): ``w`` itself, no
    clip, no privacy (FedAvg)."""
    w = job.w
    return lambda s, c, r: vanilla(w[s])
