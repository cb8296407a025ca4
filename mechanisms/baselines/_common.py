"""Shared input handling of the baseline mechanisms (validation, clipping, generators).

Every baseline takes ``w, c, r`` as tensors or real numbers that broadcast together (per
element or per layer ``c, r``), works in ``float32`` on the device of its tensor arguments (CPU
or CUDA, same code path), and clips ``w`` into ``[c - r, c + r]`` first, so the per-parameter
sensitivity of the clipped value is ``2 r``.
"""

from __future__ import annotations

import torch

from corbin_fl.mechanisms.validate import one_device, operand

__all__ = [
    "COMPUTE_DTYPE",
    "clip_to_box",
    "prepare",
]

COMPUTE_DTYPE = torch.float32


def prepare(w: object, c: object, r: object) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Validate ``w, c, r`` and return them as broadcast ``float32`` tensors on one device.

    Parameters
    ----------
    w, c, r : torch.Tensor or float
        Weights, centers and radii; ``r > 0`` and finite, ``c`` finite, ``w`` not NaN.

    Returns
    -------
    tuple of torch.Tensor
        ``(w, c, r)`` broadcast to a common shape, ``float32``, on the tensors' device
        (CPU if all are Python numbers). ``c`` and ``r`` may be expanded views.

    Raises
    ------
    TypeError
        Non-floating tensors or non-real arguments.
    ValueError
        Non-positive or non-finite ``r``, non-finite ``c``, NaN in ``w``, shapes that do not
        broadcast, tensors on different devices.
    """
    wv = operand(w, "w")
    cv = operand(c, "c")
    rv = operand(r, "r")
    tensors = [t for t in (wv, cv, rv) if isinstance(t, torch.Tensor)]
    device = one_device(tensors)
    wt = torch.as_tensor(wv, dtype=COMPUTE_DTYPE, device=device)
    ct = torch.as_tensor(cv, dtype=COMPUTE_DTYPE, device=device)
    rt = torch.as_tensor(rv, dtype=COMPUTE_DTYPE, device=device)
    try:
        wt, ct, rt = torch.broadcast_tensors(wt, ct, rt)
    except RuntimeError as exc:
        raise ValueError(
            "shapes of w, c, r are not broadcastable: "
            f"{tuple(wt.shape)}, {tuple(ct.shape)}, {tuple(rt.shape)}"
        ) from exc
    if rt.numel() and not bool(((rt > 0) & torch.isfinite(rt)).all()):
        raise ValueError("r must be finite and > 0 everywhere (clipping radius)")
    if ct.numel() and not bool(torch.isfinite(ct).all()):
        raise ValueError("c must be finite everywhere")
    if wt.numel() and bool(torch.isnan(wt).any()):
        raise ValueError("w contains NaN")
    return wt, ct, rt


def clip_to_box(w: torch.Tensor, c: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """Clip ``w`` elementwise into ``[c - r, c + r]`` (new tensor; inputs from :func:`prepare`)."""
    return torch.minimum(torch.maximum(w, c - r), c + r)
