"""Privacy categories: what the accounting needs to know about a mechanism, by name.

:mod:`mechanisms.accounting` turns releases into guarantees; which composition and which words
apply depend only on the mechanism's *category* (:class:`Privacy`): the family of its noise, the
unit one epsilon bounds, whether it pairs clients, the few sentences that describe it and, for
a mechanism with an analysis of its own, the ``"module:function"`` of it (imported on use). The
accounting holds no list of mechanism names: each mechanism's category is declared once, by the
component registry (``corbin_fl.registry.register`` calls :func:`declare` with the entry's
``privacy``), and the accounting looks it up here (:func:`category`). This module is plain data
(no torch, no Flower, no import of the registry), so the math layer stays free of the protocol.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final, Literal

Family = Literal["pure", "gdp", "none", "central"]
"""How the releases of a mechanism compose against an eavesdropper on one uplink (threat model A):

- ``"pure"``: every released parameter is pure ``eps_p``-DP (dominated by randomized response;
  ``k`` of them compose as ``k``-fold RR);
- ``"gdp"``: an analytic Gaussian release at ``(eps_p, delta)`` of one parameter or of one
  update (:attr:`Privacy.unit`); releases compose exactly as one Gaussian (``mu``-GDP, Gaussian
  differential privacy, Dong, Roth and Su 2019: hence the name; several mechanisms release so,
  the ``gaussian`` mechanism among them);
- ``"none"``: no noise at all, no DP against any adversary;
- ``"central"``: DP-FedAvg's Gaussian sum query: the server adds the noise, so nothing holds on
  the uplink, and the released models are central-DP.
"""

FAMILIES: Final[tuple[str, ...]] = ("pure", "gdp", "none", "central")
UNITS: Final[tuple[str, ...]] = ("parameter", "update")


@dataclass(frozen=True)
class NoDPText:
    """The report's sentences of a mechanism without DP (family ``"none"``), per threat model.

    ``a_headline``/``a_guarantee``: an eavesdropper on one uplink; ``b_headline``/``b_guarantee``:
    the server that sees every upload (also the malicious server's guarantee);
    ``c_guarantee``: a malicious client, which sees the global model.
    """

    a_headline: str
    a_guarantee: str
    b_headline: str
    b_guarantee: str
    c_guarantee: str


@dataclass(frozen=True)
class Privacy:
    """The privacy category of one mechanism (everything ``privacy_report`` and the ledger use).

    Attributes
    ----------
    family : str
        One of :data:`FAMILIES` (see :data:`Family`).
    unit : str
        What one epsilon bounds (:data:`UNITS`): each released parameter, or a client's whole
        update (Fed-CAD); a per-update release composes once per round, not once per parameter,
        and keeps its guarantee for any model the server sends.
    randomized_response : bool
        Each release is one binary randomized-response bit (LDPQ, CorBinQ's marginal): the report
        names it so and adds the MSE bounds of Theorems 1-2 when ``n`` and ``r`` are given.
    paired : bool
        Releases may be CorBinQ-paired: the pair-joint view of threat model B applies (no DP
        against the server), and the ledger accepts paired events.
    independent_share : bool
        A ``gamma`` fraction of the clients quantizes independently (AugCorBin-FL): the
        guarantee against the sum is its :attr:`sum_guarantee`, and ``gamma = 1`` means no
        client is paired.
    release : str
        How one release is randomized, as the report's threat-model-A sentence says it
        (``"released parameter carries Laplace noise"``). Empty for a pure mechanism means
        ``"released parameter is one symbol of <name> (exact pure eps_p)"``; for a Gaussian one it
        is the parenthesis after the guarantee.
    caveat_a, caveat_b : str
        Sentences appended to the guarantees against threat models A and B (what the accounting
        leaves out, e.g. Fed-CAD's E[Diff] estimate); empty for none.
    method_note : str
        The report's "(A) ..." note on how the numbers were obtained; empty takes the family's.
    bound_note : str
        Why the report prints nothing from a published bound of this mechanism that is not
        valid (AugCorBin-FL: the paper's eq. (5)); appended to the guarantees that such a bound
        would claim to give (a malicious client's, and the sum-seeing server's with secure
        aggregation). Empty for none.
    sum_guarantee : str
        ``"module:function"`` of its exact guarantee against a server that sees only the sum of
        the clients' symbols (secure aggregation), for a mechanism with an independent share (and
        only for one): called as ``fn(eps_p, n, gamma, m, rounds, delta, *, independent=None,
        paired=None, max_exact_n=None)``, it returns the blocks of
        :func:`corbin_fl.mechanisms.augcorbin.augcorbin_guarantee` (:meth:`exact_sum`).
    no_dp : NoDPText or None
        The sentences of a mechanism of family ``"none"`` (required there, unused elsewhere).
    """

    family: Family
    unit: str = "parameter"
    randomized_response: bool = False
    paired: bool = False
    independent_share: bool = False
    release: str = ""
    caveat_a: str = ""
    caveat_b: str = ""
    method_note: str = ""
    bound_note: str = ""
    sum_guarantee: str = ""
    no_dp: NoDPText | None = None

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"family must be one of {FAMILIES}, got {self.family!r}")
        if self.unit not in UNITS:
            raise ValueError(f"unit must be one of {UNITS}, got {self.unit!r}")
        if (self.family == "none") != (self.no_dp is not None):
            raise ValueError('no_dp texts are given exactly for family "none"')
        if (self.paired or self.randomized_response) and self.family != "pure":
            raise ValueError("paired and randomized-response releases are pure eps_p-DP")
        if self.independent_share and not self.paired:
            raise ValueError("an independent share needs a paired mechanism")
        if self.independent_share != bool(self.sum_guarantee):
            raise ValueError(
                "an independent share needs its exact guarantee against the sum "
                "(sum_guarantee), and only it"
            )
        if self.sum_guarantee and ":" not in self.sum_guarantee:
            raise ValueError(f'sum_guarantee is a "module:function", got {self.sum_guarantee!r}')

    @property
    def local_dp(self) -> bool:
        """Every release is DP at the client (families ``"pure"`` and ``"gdp"``)."""
        return self.family in ("pure", "gdp")

    def exact_sum(self) -> Callable[..., dict[str, Any]] | None:
        """Its exact guarantee against the sum (:attr:`sum_guarantee`, imported now: the math
        imports scipy and dp_accounting, which a process pays only when it computes), or None
        where it declares none."""
        if not self.sum_guarantee:
            return None
        module, _, function = self.sum_guarantee.partition(":")
        fn: Callable[..., dict[str, Any]] = getattr(importlib.import_module(module), function)
        return fn


_DECLARED: dict[str, Privacy] = {}
_ALIASES: dict[str, str] = {}
"""Other spellings of a declared name (lower case) -> the name."""


def declare(name: str, privacy: Privacy, aliases: Iterable[str] = ()) -> None:
    """Declare the category of mechanism ``name`` and the other spellings the ledger and the
    report accept for it (the component registry does, once per name)."""
    if not isinstance(privacy, Privacy):
        raise TypeError(f"expected a Privacy, got {type(privacy).__name__}")
    _DECLARED[name] = privacy
    for alias in aliases:
        _ALIASES[alias.strip().lower()] = name


def withdraw(name: str) -> None:
    """Forget the category of ``name`` and its aliases (a mechanism unregistered again)."""
    _DECLARED.pop(name, None)
    for alias in [a for a, n in _ALIASES.items() if n == name]:
        del _ALIASES[alias]


def canonical(name: object) -> str:
    """The declared name of ``name`` (case and surrounding spaces ignored, aliases resolved).

    Raises
    ------
    TypeError
        If ``name`` is not a str.
    ValueError
        If no mechanism of that name has a declared category (the message lists them).
    """
    if not isinstance(name, str):
        raise TypeError(f"mechanism must be a str, got {type(name).__name__}")
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in _DECLARED:
        raise ValueError(f"unknown mechanism {name!r}; expected one of {', '.join(_DECLARED)}")
    return key


def declared() -> tuple[str, ...]:
    """The names with a declared category, in declaration order."""
    return tuple(_DECLARED)


def category(name: str) -> Privacy:
    """The declared category of ``name``.

    Raises
    ------
    ValueError
        If ``name`` has none (the message lists the declared names).
    """
    try:
        return _DECLARED[name]
    except KeyError:
        raise ValueError(
            f"unknown mechanism {name!r}; expected one of {', '.join(_DECLARED)}"
        ) from None
