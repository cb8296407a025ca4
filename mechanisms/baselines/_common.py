"""Shared input handling of the baseline mechanisms (validation, clipping, generators).

Every baseline takes ``w, c, r`` as tensors or real numbers that broadcast together (per
element or per layer ``c, r``), works in ``float32`` on the device of its tensor arguments (CPU
or CUDA, same code path), and clips ``w`` into ``[c - r, c + r]`` first, so the per-parameter
sensitivity of the clipped value is ``2 r``.
"""

from __future__ import annotations

import math
import secrets
from numbers import Integral, Real

import torch

__all__ = [
    "COMPUTE_DTYPE",
    "Operand",
    "check_eps",
    "check_int",
    "check_prob",
    "clip_to_box",
    "prepare",
    "resolve_generator",
]

COMPUTE_DTYPE = torch.float32

Operand = torch.Tensor | float | int


def check_eps(eps: object, name: str = "eps") -> float:
    """Return ``eps`` as a finite float ``> 0`` (accepts a one-element tensor) or raise."""
    if isinstance(eps, torch.Tensor):
        if eps.numel() != 1:
            raise ValueError(f"{name} must be a scalar, got a tensor of shape {tuple(eps.shape)}")
        eps = eps.item()
    if isinstance(eps, bool) or not isinstance(eps, Real):
        raise TypeError(f"{name} must be a real number, got {type(eps).__name__}")
    value = float(eps)
    if not math.isfinite(value) or value <= 0.0:
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    return value


def check_prob(p: object, name: str, *, lo_open: bool, hi_open: bool) -> float:
    """Return ``p`` as a float in the interval ``(0|[0, 1)|1]`` given by the flags, or raise."""
    if isinstance(p, bool) or not isinstance(p, Real):
        raise TypeError(f"{name} must be a real number, got {type(p).__name__}")
    value = float(p)
    ok_lo = value > 0.0 if lo_open else value >= 0.0
    ok_hi = value < 1.0 if hi_open else value <= 1.0
    if not (math.isfinite(value) and ok_lo and ok_hi):
        interval = ("(" if lo_open else "[") + "0, 1" + (")" if hi_open else "]")
        raise ValueError(f"{name} must be in {interval}, got {value!r}")
    return value


def check_int(v: object, name: str, lo: int) -> int:
    """Return ``v`` as an ``int >= lo`` (bool rejected) or raise."""
    if isinstance(v, bool) or not isinstance(v, Integral):
        raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    value = int(v)
    if value < lo:
        raise ValueError(f"{name} must be >= {lo}, got {value}")
    return value


def _check_operand(name: str, v: object) -> Operand:
    if isinstance(v, torch.Tensor):
        if not v.dtype.is_floating_point:
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {v.dtype}")
        return v
    if isinstance(v, bool) or not isinstance(v, Real):
        raise TypeError(f"{name} must be a tensor or a real number, got {type(v).__name__}")
    value = float(v)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return value


def _norm_device(dev: torch.device) -> torch.device:
    """``cuda`` and ``cuda:<current>`` are the same device."""
    if dev.type == "cuda" and dev.index is None and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return dev


def _device_of(tensors: list[torch.Tensor]) -> torch.device:
    if not tensors:
        return torch.device("cpu")
    dev = tensors[0].device
    for t in tensors[1:]:
        if _norm_device(t.device) != _norm_device(dev):
            raise ValueError(
                f"all tensor arguments must be on one device, got {dev} and {t.device}"
            )
    return dev


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
    wv = _check_operand("w", w)
    cv = _check_operand("c", c)
    rv = _check_operand("r", r)
    tensors = [t for t in (wv, cv, rv) if isinstance(t, torch.Tensor)]
    device = _device_of(tensors)
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


def resolve_generator(generator: object, device: torch.device) -> torch.Generator:
    """Return the injected generator, or a fresh one seeded from the OS CSPRNG.

    Parameters
    ----------
    generator : torch.Generator or None
        Must live on ``device``; ``None`` creates ``torch.Generator(device)`` seeded with
        ``secrets.randbits(63)`` (never the global RNG).
    device : torch.device
        Device of the tensors being perturbed.

    Returns
    -------
    torch.Generator
        A generator on ``device``.
    """
    if generator is None:
        g = torch.Generator(device=device)
        g.manual_seed(secrets.randbits(63))
        return g
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    if _norm_device(generator.device) != _norm_device(device):
        raise ValueError(
            f"generator is on {generator.device} but the tensors are on {device}; "
            "create it with torch.Generator(device=<tensor device>)"
        )
    return generator
