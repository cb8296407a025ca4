"""Argument validators shared by every module of ``mechanisms/``.

Each returns the value in its canonical Python type or raises ``TypeError`` (wrong type: a
``bool`` is never a number here) or ``ValueError`` (right type, outside its domain), with a
message that names the argument. NumPy scalars count as numbers (``numbers.Integral`` /
``numbers.Real``); a one-element tensor counts as a scalar where :func:`positive` says so.

Importing this module does not import torch (about 1.3 CPU-s): the accountant and the
privacy-loss math use the scalar checks and need no torch. A value can be a tensor only once
torch is imported, so the scalar checks look for torch in ``sys.modules``; the device and
generator checks, which only torch code calls, import it when they run.
"""

from __future__ import annotations

import math
import secrets
import sys
from numbers import Integral, Real
from typing import TYPE_CHECKING, TypeGuard

import numpy as np
from numpy.typing import ArrayLike, NDArray

if TYPE_CHECKING:
    import torch

__all__ = [
    "generator",
    "integer",
    "interval",
    "one_device",
    "operand",
    "positive",
    "positive_array",
    "probability",
    "real",
    "real_array",
    "same_device",
    "torch_generator",
]


def _is_bool(v: object) -> bool:
    return isinstance(v, bool | np.bool_)


def _is_tensor(v: object) -> TypeGuard[torch.Tensor]:
    """Whether ``v`` is a ``torch.Tensor``, without importing torch (no tensor exists before)."""
    torch_module = sys.modules.get("torch")
    return torch_module is not None and isinstance(v, torch_module.Tensor)


def integer(v: object, name: str, lo: int | None = None, hi: int | None = None) -> int:
    """``v`` as an ``int`` in ``[lo, hi]`` (either bound may be absent)."""
    if _is_bool(v) or not isinstance(v, Integral):
        raise TypeError(f"{name} must be an integer, got {type(v).__name__}")
    value = int(v)
    if lo is not None and hi is not None and not lo <= value <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {value}")
    if lo is not None and value < lo:
        raise ValueError(f"{name} must be >= {lo}, got {value}")
    if hi is not None and value > hi:
        raise ValueError(f"{name} must be <= {hi}, got {value}")
    return value


def real(v: object, name: str, *, finite: bool = True) -> float:
    """``v`` as a ``float``; never NaN, and finite unless ``finite=False`` (then +-inf pass)."""
    if _is_bool(v) or not isinstance(v, Real):
        raise TypeError(f"{name} must be a real number, got {type(v).__name__}")
    value = float(v)
    if math.isnan(value) or (finite and not math.isfinite(value)):
        raise ValueError(f"{name} must be a finite real number, got {value!r}")
    return value


def positive(v: object, name: str = "eps") -> float:
    """``v`` as a finite ``float > 0``; a one-element tensor is read as its value."""
    if _is_tensor(v):
        if v.numel() != 1:
            raise ValueError(f"{name} must be a scalar, got a tensor of shape {tuple(v.shape)}")
        v = v.item()
    if _is_bool(v) or not isinstance(v, Real):
        raise TypeError(f"{name} must be a real number, got {type(v).__name__}")
    value = float(v)
    if not math.isfinite(value) or value <= 0.0:
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    return value


def interval(v: object, name: str, lo: float, hi: float, *, lo_open: bool, hi_open: bool) -> float:
    """``v`` as a ``float`` in the interval from ``lo`` to ``hi``, each end open or closed."""
    value = real(v, name, finite=False)
    ok_lo = value > lo if lo_open else value >= lo
    ok_hi = value < hi if hi_open else value <= hi
    if not (ok_lo and ok_hi):
        shown = ("(" if lo_open else "[") + f"{lo:g}, {hi:g}" + (")" if hi_open else "]")
        raise ValueError(f"{name} must be in {shown}, got {value!r}")
    return value


def probability(v: object, name: str, *, lo_open: bool = True, hi_open: bool = True) -> float:
    """:func:`interval` from 0 to 1; both ends open unless said otherwise."""
    return interval(v, name, 0.0, 1.0, lo_open=lo_open, hi_open=hi_open)


def operand(v: object, name: str, *, finite: bool = True) -> torch.Tensor | float:
    """A floating-point tensor (returned as is) or a real number (returned as a ``float``,
    finite unless ``finite=False``)."""
    if _is_tensor(v):
        if not v.dtype.is_floating_point:
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {v.dtype}")
        return v
    if _is_bool(v) or not isinstance(v, Real):
        raise TypeError(f"{name} must be a tensor or a real number, got {type(v).__name__}")
    value = float(v)
    if finite and not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return value


def real_array(x: ArrayLike, name: str) -> NDArray[np.float64]:
    """``x`` (a real number or array of reals) as a float64 array without NaN."""
    if _is_bool(x):
        raise TypeError(f"{name} must be a real number or array, not bool")
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be a real number or array of reals, got {x!r}") from exc
    if np.isnan(arr).any():
        raise ValueError(f"{name} must not be NaN, got {x!r}")
    return arr


def positive_array(x: ArrayLike, name: str = "eps") -> NDArray[np.float64]:
    """:func:`real_array` whose every element is finite and ``> 0``."""
    arr = real_array(x, name)
    if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        raise ValueError(f"{name} must be finite and > 0, got {x!r}")
    return arr


def _canonical(device: torch.device) -> torch.device:
    """``cuda`` and ``cuda:<current>`` are the same device."""
    import torch  # on demand, not at import time (see the module docstring)

    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return device


def same_device(a: torch.device, b: torch.device) -> bool:
    """Device equality that treats ``cuda`` and ``cuda:<current>`` as one device."""
    return _canonical(a) == _canonical(b)


def one_device(tensors: list[torch.Tensor]) -> torch.device:
    """The device of every tensor in ``tensors`` (CPU for none); raise if they differ."""
    if not tensors:
        import torch  # on demand, not at import time (see the module docstring)

        return torch.device("cpu")
    dev = tensors[0].device
    for t in tensors[1:]:
        if not same_device(t.device, dev):
            raise ValueError(
                f"all tensor arguments must be on one device, got {dev} and {t.device}"
            )
    return dev


def torch_generator(generator: object, device: torch.device) -> torch.Generator:
    """``generator`` if it is a ``torch.Generator`` on ``device``; ``None`` gives a fresh one
    on ``device`` seeded with ``secrets.randbits(63)`` (the OS CSPRNG, never the global RNG)."""
    import torch  # on demand, not at import time (see the module docstring)

    if generator is None:
        g = torch.Generator(device=device)
        g.manual_seed(secrets.randbits(63))
        return g
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    if not same_device(generator.device, device):
        raise ValueError(
            f"generator is on {generator.device} but the tensors are on {device}; "
            "create it with torch.Generator(device=<tensor device>)"
        )
    return generator


def generator(rng: object, name: str = "rng") -> np.random.Generator:
    """``rng`` if it is a ``numpy.random.Generator`` (randomness is always injected)."""
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"{name} must be a numpy.random.Generator, got {type(rng).__name__}")
    return rng
