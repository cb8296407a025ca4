"""Range and choice checks of configuration values: one copy, one message format.

Each check takes a value that already has its type (the caller coerced it) and returns the
reason it is refused, or None when it is accepted. The reason names the cause and the value,
never the key (``"must be in [0.0, 1.0), got 1.5"``): the caller names the key, as
:class:`corbin_fl.config.ConfigError` does (``"  - gamma: must be in [0.0, 1.0], got 1.5"``), a
mechanism parameter's check in :mod:`corbin_fl.registry`, and an experiment spec's
:class:`~corbin_fl.experiments.spec.SpecError` (file, table and key first). NaN fails every
numeric check (each is written as the condition a valid value meets). Bounds print as given:
``0.0`` and ``0`` read differently, so a float setting passes float bounds.

A function's argument check raises with the argument's name first: :func:`require`
(``require("num_clients", at_least(n, 1))`` raises ``ValueError("num_clients must be >= 1, got
0")``).

This module imports nothing of the project, so every layer can use it (the argument validators of
the math, :mod:`corbin_fl.mechanisms.validate`, raise instead and also check tensors).
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

__all__ = [
    "above",
    "at_least",
    "at_most",
    "interval",
    "one_of",
    "positive",
    "probability",
    "reasons",
    "require",
]


def one_of(value: Any, allowed: Sequence[Any]) -> str | None:
    """``value`` is one of ``allowed``.

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


def interval(
    value: float, low: float, high: float, *, lo_open: bool = False, hi_open: bool = False
) -> str | None:
    """``value`` lies between ``low`` and ``high``; each end is closed (``[``, the default) or
    open (``(``, with ``lo_open`` / ``hi_open``): ``"must be in (0.0, 1.0], got 1.5"``."""
    ok_low = value > low if lo_open else value >= low
    ok_high = value < high if hi_open else value <= high
    if ok_low and ok_high:
        return None
    lb, rb = ("(" if lo_open else "["), (")" if hi_open else "]")
    return f"must be in {lb}{low}, {high}{rb}, got {value}"


def probability(value: float, *, lo_open: bool = True, hi_open: bool = True) -> str | None:
    """:func:`interval` from ``0.0`` to ``1.0``; both ends open unless said otherwise."""
    return interval(value, 0.0, 1.0, lo_open=lo_open, hi_open=hi_open)


def at_least(value: float, low: float, *, note: str = "") -> str | None:
    """``value >= low``: ``"must be >= 0 (0 = default), got -1"`` (``note`` in parentheses)."""
    if value >= low:
        return None
    return f"must be >= {low}{f' ({note})' if note else ''}, got {value}"


def above(value: float, low: float) -> str | None:
    """``value > low``: ``"must be > 0, got 0"``."""
    return None if value > low else f"must be > {low}, got {value}"


def positive(value: float) -> str | None:
    """``value > 0`` (:func:`above` zero)."""
    return above(value, 0)


def at_most(value: float, high: float) -> str | None:
    """``value <= high``: ``"must be <= 10, got 11"``."""
    return None if value <= high else f"must be <= {high}, got {value}"


def reasons(*checks: tuple[str, str | None]) -> dict[str, str]:
    """``(key, reason or None)`` pairs -> the keys with a reason (a later pair of a key wins):
    ``reasons(("d", interval(d, 1, 16)), ("lr", positive(lr)))``."""
    return {key: why for key, why in checks if why is not None}


def require(name: str, why: str | None, error: type[Exception] = ValueError) -> None:
    """Raise ``error("<name> <why>")`` when a check gave a reason (``why`` is not None):
    ``require("quantile", interval(q, 0.5, 1, lo_open=True))``."""
    if why is not None:
        raise error(f"{name} {why}")
