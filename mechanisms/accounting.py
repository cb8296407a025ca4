r"""The privacy ledger and the accountant: what was released, and what it composes to.

Structured like ``dp_accounting``: the *ledger* (:class:`PrivacyLedger`, one
:class:`PrivacyEvent` per released update) only records what was released, and the server keeps
it (``server/strategy.py`` appends, ``server/checkpoint.py`` persists it, ``server/records.py``
reads it at the end of the run); the *accountant* (:class:`Accountant`) composes releases,
``compose(event, count)``, and answers ``get_epsilon(delta)`` against an
eavesdropper on one uplink (threat model A), the numbers the run's report
(:func:`corbin_fl.mechanisms.report.privacy_report`) prints for one update and for the run. The
math is :mod:`corbin_fl.mechanisms.privacy_loss`; the words per adversary are
:mod:`corbin_fl.mechanisms.threat_models`.

No mechanism is named here: which composition applies to a release depends only on its
mechanism's privacy category (:func:`corbin_fl.mechanisms.categories.category`, declared by the
registry).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from corbin_fl.mechanisms.analytic_gaussian import analytic_gaussian_sigma, gaussian_epsilon
from corbin_fl.mechanisms.categories import canonical, category, declared
from corbin_fl.mechanisms.privacy_loss import rr_epsilon
from corbin_fl.mechanisms.validate import integer, positive, probability

__all__ = [
    "THREAT_MODELS",
    "Accountant",
    "PrivacyEvent",
    "PrivacyLedger",
    "canonical_mechanism",
]

#: The four threat models of the report, by key, with the plain-language name every view prints
#: (SECURITY.md describes each one; the keys are those of ``privacy_report()["threat_models"]``).
THREAT_MODELS: dict[str, str] = {
    "A": "eavesdropper on one uplink",
    "B": "server that sees every bit",
    "C": "malicious client",
    "D": "malicious server",
}


def __getattr__(name: str) -> Any:
    if name == "MECHANISMS":  # the names with a declared category, now (a test may add one)
        return declared()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


canonical_mechanism = canonical
"""The registered name of a mechanism's name or alias (:func:`categories.canonical`)."""


# ============================================================================ ledger


@dataclass(frozen=True)
class PrivacyEvent:
    """One release: a client's update in one round.

    Attributes
    ----------
    round : int
        Server round (``>= 1``).
    node : str
        Client (node) identifier.
    mechanism : str
        Canonical mechanism name (one with a declared privacy category).
    eps_p : float or None
        Per-parameter budget (per-round budget of the whole update for a mechanism whose
        category's unit is ``"update"``); ``None`` for mechanisms without local DP.
    m : int
        Number of released parameters.
    paired : bool
        Whether the update was CorBinQ-paired (threat model B applies).
    d : int or None
        Shared bits per parameter for paired releases.
    delta : float or None
        The mechanism's own ``delta`` per parameter or per update (family ``"gdp"``).
    """

    round: int
    node: str
    mechanism: str
    eps_p: float | None
    m: int
    paired: bool = False
    d: int | None = None
    delta: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "mechanism", canonical_mechanism(self.mechanism))
        if isinstance(self.round, bool) or not isinstance(self.round, int) or self.round < 0:
            raise ValueError(f"round must be an int >= 0, got {self.round!r}")
        object.__setattr__(self, "node", str(self.node))
        integer(self.m, "m", 1)
        cat = category(self.mechanism)
        if not cat.local_dp:  # no local DP on what a client releases
            if self.eps_p is not None:
                raise ValueError(f"{self.mechanism} has no local DP guarantee; eps_p must be None")
        else:
            if self.eps_p is None:
                raise ValueError(f"{self.mechanism} needs eps_p")
            object.__setattr__(self, "eps_p", positive(self.eps_p, "eps_p"))
        if cat.family == "gdp":
            if self.delta is None:
                raise ValueError(f"{self.mechanism} needs the mechanism's delta")
            object.__setattr__(self, "delta", probability(self.delta, "delta"))
        if not isinstance(self.paired, bool):
            raise TypeError("paired must be a bool")
        if self.paired:
            if not cat.paired:
                raise ValueError(
                    f"only releases of a pairing mechanism can be paired, not {self.mechanism}"
                )
            if self.d is None:
                raise ValueError("a paired release needs d")
            if isinstance(self.d, bool) or not isinstance(self.d, int) or self.d < 1:
                raise ValueError(f"d must be an int >= 1, got {self.d!r}")


class PrivacyLedger:
    """Append-only record of released updates, serialisable to JSON for checkpointing."""

    def __init__(self, events: Iterable[PrivacyEvent] = ()) -> None:
        self._events: list[PrivacyEvent] = []
        for e in events:
            self.add(e)

    def add(self, event: PrivacyEvent) -> None:
        """Append an event."""
        if not isinstance(event, PrivacyEvent):
            raise TypeError(f"expected a PrivacyEvent, got {type(event).__name__}")
        self._events.append(event)

    def record(
        self,
        round: int,
        node: str | int,
        mechanism: str,
        eps_p: float | None,
        m: int,
        paired: bool = False,
        d: int | None = None,
        delta: float | None = None,
    ) -> PrivacyEvent:
        """Create, validate and append an event; returns it."""
        event = PrivacyEvent(round, str(node), mechanism, eps_p, m, paired, d, delta)
        self.add(event)
        return event

    @property
    def events(self) -> tuple[PrivacyEvent, ...]:
        """All events in insertion order."""
        return tuple(self._events)

    def __len__(self) -> int:
        return len(self._events)

    def __iter__(self) -> Iterator[PrivacyEvent]:
        return iter(self._events)

    def nodes(self) -> list[str]:
        """Sorted node identifiers that appear in the ledger."""
        return sorted({e.node for e in self._events})

    def to_json(self) -> str:
        """Serialise (``{"version": 1, "events": [...]}``)."""
        return json.dumps(
            {"version": 1, "events": [dataclasses.asdict(e) for e in self._events]},
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> PrivacyLedger:
        """Inverse of :meth:`to_json` (every event is re-validated)."""
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("version") != 1:
            raise ValueError("not a version-1 privacy ledger")
        events = data.get("events")
        if not isinstance(events, list):
            raise ValueError("ledger 'events' must be a list")
        fields = {f.name for f in dataclasses.fields(PrivacyEvent)}
        out = cls()
        for raw in events:
            if not isinstance(raw, dict) or set(raw) != fields:
                raise ValueError(f"malformed ledger event: {raw!r}")
            out.add(PrivacyEvent(**raw))
        return out


# ============================================================================ accountant


@dataclass(frozen=True)
class _Kind:
    """The releases that compose alike: a family, its unit, its ``eps_p`` and own ``delta``."""

    family: str
    unit: str
    eps_p: float
    delta: float  # 0 for a pure release


class Accountant:
    r"""Composes releases against an eavesdropper on one uplink (threat model A).

    ``dp_accounting``'s shape: :meth:`compose` adds ``count`` releases of one
    :class:`PrivacyEvent` (one client's update; every composed release is assumed to be the same
    client's, the worst case), :meth:`get_epsilon` converts what was composed.
    :func:`corbin_fl.mechanisms.report.privacy_report` composes one update and ``T`` of them
    with it.

    Composition, by the mechanism's category (family ``"pure"``, ``"gdp"``, or without
    local DP: ``"none"`` and ``"central"``, whose uplink carries no noise):

    - pure ``eps_p``-DP parameters are each dominated by randomized response with their
      ``eps_p`` (optimal composition, Kairouz, Oh & Viswanath 2015), hence all ``k`` together by
      ``k``-fold RR with the largest ``eps_p`` (exact when all are equal:
      :func:`~corbin_fl.mechanisms.privacy_loss.rr_epsilon`);
    - Gaussian releases (per parameter, or per update for a category whose unit is
      ``"update"``) compose exactly to one Gaussian, ``mu = sqrt(sum_i mu_i^2)``
      (``mu_i = 1/sigma`` of the analytic Gaussian at the release's ``(eps_p, delta)``, Balle &
      Wang 2018);
    - both families together: basic composition, ``delta`` split evenly;
    - a release without local DP: no finite ``eps`` (``get_epsilon`` is ``inf``).
    """

    def __init__(self) -> None:
        self._units: dict[_Kind, int] = {}
        self._no_dp = False

    def compose(self, event: PrivacyEvent, count: int = 1) -> Accountant:
        """Add ``count`` releases like ``event`` (its ``m`` parameters, or one update each).

        Returns the accountant, so that ``Accountant().compose(e, T).get_epsilon(d)`` reads as
        one line.
        """
        if not isinstance(event, PrivacyEvent):
            raise TypeError(f"expected a PrivacyEvent, got {type(event).__name__}")
        count = integer(count, "count", 1)
        cat = category(event.mechanism)
        if not cat.local_dp:
            self._no_dp = True
            return self
        if event.eps_p is None:  # PrivacyEvent refuses it for local DP; for the type checker
            raise ValueError(f"{event.mechanism} needs eps_p")
        kind = _Kind(cat.family, cat.unit, event.eps_p, event.delta or 0.0)
        units = event.m * count if cat.family == "pure" or cat.unit == "parameter" else count
        self._units[kind] = self._units.get(kind, 0) + units
        return self

    def _pure_parameters(self) -> int:
        return sum(n for kind, n in self._units.items() if kind.family == "pure")

    def _gaussian_mu(self) -> float:
        """``mu`` of the one Gaussian that the composed Gaussian releases are (0 without any).

        A single kind of release composed ``n`` times is ``mu_1 sqrt(n)`` exactly (``hypot`` of
        one term is that term).
        """
        terms = [
            (1.0 / analytic_gaussian_sigma(kind.eps_p, kind.delta, 1.0)) * math.sqrt(n)
            for kind, n in self._units.items()
            if kind.family == "gdp"
        ]
        return math.hypot(*terms)

    def _families(self) -> int:
        return len({kind.family for kind in self._units})

    def get_epsilon(self, delta: float) -> float:
        """Smallest ``eps`` (rounded up) at which what was composed is ``(eps, delta)``-DP.

        ``0`` when nothing was composed, ``inf`` when a release without local DP was.
        """
        delta = probability(delta, "delta")
        if self._no_dp:
            return math.inf
        families = self._families()
        if families == 0:
            return 0.0
        share = delta / families
        eps = 0.0
        k_pure = self._pure_parameters()
        if k_pure:
            eps += rr_epsilon(self._max_pure_eps(), k_pure, share)
        if any(kind.family == "gdp" for kind in self._units):
            eps += gaussian_epsilon(share, self._gaussian_mu())
        return eps

    def _max_pure_eps(self) -> float:
        return max(kind.eps_p for kind in self._units if kind.family == "pure")
