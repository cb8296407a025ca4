"""The messages of one SecAgg+ round, as plain frozen dataclasses (no Flower).

Stages (Bonawitz et al. 2017, rounds 0-3; Bell et al. 2020 restrict them to the neighbour
graph):

0. ``advertise``: the client answers :class:`KeyAdvert` (its ``c`` and ``s`` public keys).
1. ``share``: :class:`ShareKeysRequest` (round config, every participant's keys, from which
   the client derives the neighbour graph, and the neighbour set the server derived) ->
   :class:`ShareKeysReply` (one ciphertext per neighbour, the self-mask commitment).
2. ``mask``: :class:`MaskRequest` (the ciphertexts addressed to it) -> :class:`MaskReply`
   (``y_u`` and the senders whose ciphertexts it rejected).
3. ``unmask``: :class:`UnmaskRequest` (survivors and dropped among its neighbours, and every
   survivor of the round: the client checks the survivors' graph is connected) ->
   :class:`UnmaskReply` (self-mask shares of survivors, mask-key shares of the dropped, and,
   pipelined, its keys for the next round).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

import numpy as np

ADVERTISE: Final[str] = "advertise"
SHARE: Final[str] = "share"
MASK: Final[str] = "mask"
UNMASK: Final[str] = "unmask"
STAGES: Final[tuple[str, ...]] = (ADVERTISE, SHARE, MASK, UNMASK)


class SecAggError(Exception):
    """Base of every protocol failure."""


class RefusalError(SecAggError):
    """An honest client refuses an instruction (nothing is revealed, its state is unchanged)."""


class MalformedMessageError(SecAggError):
    """A message that does not decode or does not fit the round."""


@dataclass(frozen=True)
class RoundConfig:
    """The public parameters of one round, sent to every client with its share instruction.

    ``bits`` is the modulus exponent (``y`` lives in ``Z_{2^bits}``), ``levels`` the largest input
    value (inputs in ``[0, levels]``), ``threshold`` the Shamir ``t``, ``degree`` the graph's
    ``k`` over the participants (:func:`.graph.derived_graph`; 0 before the graph is drawn).
    """

    run_id: int
    server_round: int
    bits: int
    levels: int
    threshold: int
    degree: int = 0


@dataclass(frozen=True)
class KeyAdvert:
    """A client's two X25519 public keys for one round: ``c`` (encryption), ``s`` (masks)."""

    c_public: bytes
    s_public: bytes


@dataclass(frozen=True)
class ShareKeysRequest:
    config: RoundConfig
    participants: Mapping[int, KeyAdvert]
    """Every participant's advertised keys (this node's included): the graph's input."""
    neighbours: tuple[int, ...]
    """The neighbour set the server derived for this node (checked against the client's)."""


@dataclass(frozen=True)
class ShareKeysReply:
    ciphertexts: Mapping[int, bytes]
    """Receiver node id -> ``nonce || AES-GCM(shares)``."""
    commitment: bytes
    """``SHA-256`` commitment to the self-mask seed (see :func:`crypto.commitment`)."""


@dataclass(frozen=True)
class MaskRequest:
    server_round: int
    ciphertexts: Mapping[int, bytes]
    """Sender node id -> the ciphertext that sender addressed to this client."""


@dataclass(frozen=True)
class MaskReply:
    masked: np.ndarray
    """``y_u`` (uint64, each entry in ``[0, 2^bits)``)."""
    rejected: tuple[int, ...] = ()
    """Senders whose ciphertexts did not authenticate or parse (the server drops them)."""


@dataclass(frozen=True)
class UnmaskRequest:
    server_round: int
    survivors: tuple[int, ...]
    dropped: tuple[int, ...]
    advertise_next: bool = False
    all_survivors: tuple[int, ...] = ()
    """Every node whose masked input is in the sum (the same list for every client)."""


@dataclass(frozen=True)
class UnmaskReply:
    self_mask_shares: Mapping[int, bytes]
    """Survivor -> this client's share of its self-mask seed ``b``."""
    key_shares: Mapping[int, bytes]
    """Dropped neighbour -> this client's share of its mask private key ``s``."""
    next_keys: KeyAdvert | None = None
    """Pipelined advertise of the next round's keys (when asked)."""


@dataclass
class RoundOutcome:
    """What the server learns from one round: the exact sum, or why it was abandoned.

    ``total`` is the sum of the survivors' inputs (int64, exact: ``2^bits`` exceeds the largest
    possible sum); ``None`` when abandoned. ``dropped`` maps node -> ``"stage: reason"`` (not
    in the sum); ``faulty`` maps survivors whose unmask reply was missing or wrong (their input
    is in the sum, their shares were not used).
    """

    server_round: int
    sampled: tuple[int, ...]
    total: np.ndarray | None = None
    survivors: tuple[int, ...] = ()
    dropped: dict[int, str] = field(default_factory=dict)
    abandoned: str | None = None
    faulty: dict[int, str] = field(default_factory=dict)
    next_keys: dict[int, KeyAdvert] = field(default_factory=dict)
