"""Plain (torch-free) types shared by the client handlers and the encoder."""

from __future__ import annotations

from dataclasses import dataclass

from corbin_fl import registry, wire
from corbin_fl.config import RunConfig


@dataclass(frozen=True)
class Fallback:
    """This node quantizes independently with ``ldpq`` (Alg. 1) instead of ``corbinq``.

    Attributes
    ----------
    reason : str
        One of :data:`corbin_fl.wire.FALLBACK_REASONS`.
    """

    reason: str

    def __post_init__(self) -> None:
        if self.reason not in wire.FALLBACK_REASONS:
            raise ValueError(f"unknown fall-back reason {self.reason!r}")


@dataclass(frozen=True)
class Shared:
    """The pair's common randomness, resolved (Alg. 3 lines 9-17).

    Attributes
    ----------
    partner : int
        Partner node id.
    lead : bool
        Whether this node is the lead (``Q1``) of the pair.
    secret : bytes
        The lead's 32-byte seed, or (exact mode) the lead's packed ``d*m`` bits of ``z``.
    exact : bool
        Whether ``secret`` is packed ``z`` rather than a seed.
    """

    partner: int
    lead: bool
    secret: bytes
    exact: bool = False

    def __repr__(self) -> str:  # never print the secret
        return f"Shared(partner={self.partner}, lead=<hidden>, secret=<{len(self.secret)} bytes>)"


def assignments_of(cfg: RunConfig) -> tuple[str, ...]:
    """The ``assignment`` values the server may send for ``cfg.mechanism`` (registry)."""
    return registry.get(cfg.mechanism).assignments
