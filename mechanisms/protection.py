r"""When a differential-privacy epsilon still protects anything: the words every report uses.

A guarantee ``(eps, delta)`` bounds every test that tries to tell two neighbouring inputs apart:
its power is at most ``e^eps alpha + delta`` at false-positive rate ``alpha`` (the
hypothesis-testing view of DP, Kairouz, Oh & Viswanath, ICML 2015, arXiv:1311.0776, Thm. 2.1;
Wasserman & Zhou 2010). Above :data:`MEANINGFUL_EPS` ``= 10`` that bound is vacuous at any
false-positive rate anyone would accept: ``e^10 = 22,026``, so a test that errs once in 22,026
tries may be right every time. Such an ``eps`` is formally DP and practically none: a report says
so next to the number (:func:`protection`) instead of leaving a composed ``3e5`` to read as a
gain over a per-upload ``5.9e5``.

The threshold is a reading aid, not a guarantee: a guarantee at ``eps = 9`` is not strong either,
and nothing below 10 is called "meaningful" by these words; they only mark the numbers that bound
nothing.
"""

from __future__ import annotations

import math
from typing import Final

__all__ = ["MEANINGFUL_EPS", "NO_PROTECTION", "per_parameter_text", "protection"]

MEANINGFUL_EPS: Final[float] = 10.0
"""Above this ``eps`` a guarantee bounds no test anyone would run (module docstring)."""

NO_PROTECTION: Final[str] = "no meaningful protection"
"""What a report says next to an ``eps`` above :data:`MEANINGFUL_EPS`."""


def protection(eps: float | None) -> str:
    """:data:`NO_PROTECTION` for ``eps > MEANINGFUL_EPS`` (``inf`` included), else ``""``.

    Parameters
    ----------
    eps : float or None
        A (composed) epsilon; ``None`` (no number) gives ``""``.

    Returns
    -------
    str
        The words to print beside the number, or the empty string.
    """
    if eps is None:
        return ""
    if isinstance(eps, bool) or not isinstance(eps, int | float):
        raise TypeError(f"eps must be a real number or None, got {type(eps).__name__}")
    e = float(eps)
    if math.isnan(e):
        raise ValueError("eps must not be NaN")
    return NO_PROTECTION if e > MEANINGFUL_EPS else ""


def per_parameter_text(eps: float, eps_p: float | None) -> str:
    """``eps`` per parameter to 5 significant digits, and whether it improves on ``eps_p``.

    Five digits, because the per-parameter figure against a small sum sits just below ``eps_p``
    (0.99997 at ``eps_p = 1``, ``n = 3``), which four digits would print as ``eps_p`` itself.
    ``"0.99997 (no better than eps_p = 1)"`` when ``eps >= eps_p - 1e-3 eps_p``, else the number.
    """
    if isinstance(eps, bool) or not isinstance(eps, int | float):
        raise TypeError(f"eps must be a real number, got {type(eps).__name__}")
    text = f"{float(eps):.5g}"
    if eps_p is not None and float(eps) >= float(eps_p) * (1.0 - 1e-3):
        text += f" (no better than eps_p = {float(eps_p):g})"
    return text
