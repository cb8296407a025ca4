"""The project's one module of value checks: the math's argument guards and the configuration's
range and choice checks, each range rule written once.

Two styles over the same rules:

* **Reasons** (``why_*``, for configuration values): each takes a value that already has its type
  (the caller coerced it) and returns why it is refused, or None when it is accepted. The reason
  names the cause and the value, never the key (``"must be in [0.0, 1.0), got 1.5"``): the caller
  names the key, as :class:`corbin_fl.config.ConfigError` does (``"  - gamma: must be in [0.0,
  1.0], got 1.5"``), a mechanism parameter's check in :mod:`corbin_fl.registry`, and an experiment
  spec's :class:`~corbin_fl.experiments.spec.SpecError` (file, table and key first). NaN fails
  every numeric check (each is written as the condition a valid value meets). Bounds print as
  given: ``0.0`` and ``0`` read differently, so a float setting passes float bounds.
  :func:`reasons` collects ``(key, reason)`` pairs; :func:`require` raises with the argument's name
  first (``require("num_clients", why_at_least(n, 1))`` raises ``ValueError("num_clients must be
  >= 1, got 0")``).
* **Guards** (:func:`integer`, :func:`real`, :func:`positive`, :func:`interval`, ...; for the
  math's arguments): each returns the value in its canonical Python type or raises ``TypeError``
  (wrong type: a ``bool`` is never a number here) or ``ValueError`` (right type, outside its
  domain), with a message that names the argument. NumPy scalars count as numbers
  (``numbers.Integral`` / ``numbers.Real``); a one-element tensor counts as a scalar where
  :func:`positive` says so. :func:`integer` raises the reasons' messages; :func:`interval` shares
  their rule and prints its bounds with ``:g``.

This module imports nothing of the project (the math, ``corbin_fl.mechanisms``, imports nothing
else of it), so every layer can use it. Importing it does not import torch (about 1.3 CPU-s): the
accountant, the privacy-loss math and the configuration use the scalar checks and need no torch. A
value can be a tensor only once torch is imported, so the scalar checks look for torch in
``sys.modules``; the device and generator checks, which only torch code calls, import it when they
run.
"""

from __future__ import annotations

import difflib
import math
import secrets
import sys
from collections.abc import Sequence
from numbers import Integral, Real
from typing import TYPE_CHECKING, Any, TypeGuard

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
    "reasons",
    "require",
    "same_device",
    "torch_generator",
    "why_above",
    "why_at_least",
    "why_at_most",
    "why_interval",
    "why_one_of",
    "why_positive",
    "why_probability",
]


# -- reasons: why a configuration value is refused, or None ----------------------------------


def _inside(value: float, low: float, high: float, *, lo_open: bool, hi_open: bool) -> bool:
    """The interval rule: ``value`` lies between ``low`` and ``high``, each end open or closed
    (False for NaN)."""
    ok_low = value > low if lo_open else value >= low
    ok_high = value < high if hi_open else value <= high
    return ok_low and ok_high


def _shown(low: object, high: object, *, lo_open: bool, hi_open: bool) -> str:
    """The interval as printed: ``[0.0, 1.0)``."""
    return ("(" if lo_open else "[") + f"{low}, {high}" + (")" if hi_open else "]")


def why_one_of(value: Any, allowed: Sequence[Any]) -> str | None:
    """Why ``value`` is not one of ``allowed``, or None.

    Strings are listed with a did-you-mean (``"must be one of relay, derived, exact, got 'rely';
    did you mean 'relay'?"``); other values as a phrase (``"must be 1, 2 or 4, got 3"``).
    """
    if value in allowed:
        return None
    if all(isinstance(a, str) for a in allowed):
        close = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1, cutoff=0.5)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        return f"must be one of {', '.join(allowed)}, got {value!r:.80}{hint}"
    names = [str(a) for a in allowed]
    listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
    return f"must be {listed}, got {value}"


def why_interval(
    value: float, low: float, high: float, *, lo_open: bool = False, hi_open: bool = False
) -> str | None:
    """Why ``value`` does not lie between ``low`` and ``high``, or None; each end is closed (``[``,
    the default) or open (``(``, with ``lo_open`` / ``hi_open``): ``"must be in (0.0, 1.0], got
    1.5"``."""
    if _inside(value, low, high, lo_open=lo_open, hi_open=hi_open):
        return None
    return f"must be in {_shown(low, high, lo_open=lo_open, hi_open=hi_open)}, got {value}"


def why_probability(value: float, *, lo_open: bool = True, hi_open: bool = True) -> str | None:
    """:func:`why_interval` from ``0.0`` to ``1.0``; both ends open unless said otherwise."""
    return why_interval(value, 0.0, 1.0, lo_open=lo_open, hi_open=hi_open)


def why_at_least(value: float, low: float, *, note: str = "") -> str | None:
    """Why not ``value >= low``, or None: ``"must be >= 0 (0 = default), got -1"`` (``note`` in
    parentheses)."""
    if value >= low:
        return None
    return f"must be >= {low}{f' ({note})' if note else ''}, got {value}"


def why_above(value: float, low: float) -> str | None:
    """Why not ``value > low``, or None: ``"must be > 0, got 0"``."""
    return None if value > low else f"must be > {low}, got {value}"


def why_positive(value: float) -> str | None:
    """Why not ``value > 0``, or None (:func:`why_above` zero)."""
    return why_above(value, 0)


def why_at_most(value: float, high: float) -> str | None:
    """Why not ``value <= high``, or None: ``"must be <= 10, got 11"``."""
    return None if value <= high else f"must be <= {high}, got {value}"


def reasons(*checks: tuple[str, str | None]) -> dict[str, str]:
    """``(key, reason or None)`` pairs -> the keys with a reason (a later pair of a key wins):
    ``reasons(("d", why_interval(d, 1, 16)), ("lr", why_positive(lr)))``."""
    return {key: why for key, why in checks if why is not None}


def require(name: str, why: str | None, error: type[Exception] = ValueError) -> None:
    """Raise ``error("<name> <why>")`` when a check gave a reason (``why`` is not None):
    ``require("quantile", why_interval(q, 0.5, 1, lo_open=True))``."""
    if why is not None:
        raise error(f"{name} {why}")


# -- guards: the math's arguments, returned in their canonical type or raised -----------------


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
    if lo is not None and hi is not None:
        require(name, why_interval(value, lo, hi))
    elif lo is not None:
        require(name, why_at_least(value, lo))
    elif hi is not None:
        require(name, why_at_most(value, hi))
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
    if not _inside(value, lo, hi, lo_open=lo_open, hi_open=hi_open):
        shown = _shown(f"{lo:g}", f"{hi:g}", lo_open=lo_open, hi_open=hi_open)
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
