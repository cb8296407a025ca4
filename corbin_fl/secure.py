"""Secure aggregation composed with CorBin-FL: what both sides share (no torch, no protocol).

With ``secure-aggregation = true`` (``CorBin(..., secure_aggregation=True)``) every client masks
its mechanism's *symbol vector* with SecAgg+ (:mod:`corbin_fl.secagg`, Bell et al. 2020) and the
server learns only the exact sum of the surviving clients' symbols. That is enough for every
mechanism whose server estimate is affine in the symbol sum (registry entries with
``sum_levels``: :func:`secure_mechanisms`); the
others are refused by the run configuration before anything starts.

Symbols (integers in ``[0, levels]``) and their top value ``levels``, per mechanism:

=================================  =================================  =======================
mechanism                          symbol of one parameter            levels
=================================  =================================  =======================
corbin, augcorbin, ldpfl, signsgd  the sent bit (1 = ``U = +1``)      1
pbm (``pbm-trials`` m)             the number of successes, 0..m      m
rqm (``rqm-levels`` K)             the level index, 0..K-1            K - 1
ternary                            ``t + 1`` for ``t`` in {-1, 0, 1}  2
=================================  =================================  =======================

Arithmetic is mod ``2^b`` with ``b = ceil(log2(n * levels + 1))`` (:func:`bit_width`), the
smallest width that holds the exact sum of ``n`` clients. ``imvu`` is refused: its output levels
are not evenly spaced, so its estimate is not a function of the symbol sum.

Wire (records of the ``corbin`` protocol, so an app never sees them): the SecAgg+ stage
instructions are ``train`` messages whose ``corbin`` record names the stage
(:data:`ADVERTISE`, :data:`SHARE`, :data:`UNMASK`) and carries the mechanism settings like
every instruction, plus the SecAgg+ record of :mod:`corbin_fl.secagg.wire` under the name
:data:`SECAGG_REC`; the update instruction adds the node's mask request (:data:`SECAGG_REC`)
to CorBin-FL's own records (and, pipelined, :data:`NEXT_REC`: the next round's advertise
request; the unmask instruction carries the next round's share request there), and the update
reply carries ``corbin.reply`` (round, next public
key, pipelined blob: opaque), :data:`SECAGG_REC` (the mask reply head: rejected senders,
length, layout) and :data:`MASKED_REC` (the ``b``-bit packed masked vector) instead of
``corbin.update`` and ``corbin.metrics``; the app's own metric records stay on the node.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Protocol

import numpy as np

from corbin_fl import registry, wire
from corbin_fl.mechanisms import validate
from corbin_fl.mechanisms.categories import category

if TYPE_CHECKING:
    from corbin_fl.config import RunConfig


ADVERTISE: Final[str] = "secagg-advertise"
SHARE: Final[str] = "secagg-share"
UNMASK: Final[str] = "secagg-unmask"
STAGES: Final[tuple[str, ...]] = (ADVERTISE, SHARE, UNMASK)
"""The ``corbin`` stages of the SecAgg+ round (the mask stage is CorBin-FL's ``update``)."""
SECAGG_REC: Final[str] = "corbin.secagg"
"""ConfigRecord: the SecAgg+ record (:data:`corbin_fl.secagg.wire.RECORD`) under a protocol name."""
NEXT_REC: Final[str] = "corbin.secagg-next"
"""ConfigRecord of the next round's SecAgg+ stage riding this round's message (pipelined): the
update instruction carries round ``t+1``'s advertise request (its reply the keys), the unmask
instruction round ``t+1``'s share request (its reply the share ciphertexts)."""
MASKED_REC: Final[str] = "corbin.masked"
"""ArrayRecord of the update reply: the masked vector (``secagg.wire.MASKED_RECORD``)."""
SYMBOLS_KEY: Final[str] = "symbols"
"""The one layout entry of a masked update: ``(symbols, (m,))``."""
SECAGG_RECORDS: Final[dict[str, str]] = {
    "secagg": SECAGG_REC,
    "secagg-next": NEXT_REC,
    "secagg-masked": MASKED_REC,
}
"""The records of :mod:`corbin_fl.secagg.wire` (``RECORD``, ``NEXT_RECORD``,
``MASKED_RECORD``; not imported here, for its start-up cost: see :func:`bit_width`) -> their
names in this protocol (:func:`corbin_fl.secagg.wire.renamed`)."""


def secure_mechanisms() -> tuple[str, ...]:
    """The registered mechanisms whose server estimate is affine in the sum of the clients'
    symbols (their registry entry has ``sum_levels``)."""
    return tuple(name for name, m in registry.REGISTRY.items() if m.sum_levels is not None)


def refusal(mechanism: str) -> str | None:
    """Why ``mechanism`` cannot run with secure aggregation, or None when it can."""
    entry = registry.REGISTRY.get(mechanism)
    if entry is not None and entry.sum_levels is not None:
        return None
    return (
        f"secure aggregation gives the server only the sum of the clients' symbols, and "
        f"{mechanism!r} has no estimate affine in that sum; use {_by_server_guarantee()}, or "
        "secure-aggregation = false"
    )


def _by_server_guarantee() -> str:
    """The secure mechanisms grouped by what they give against the server (their privacy
    category, :mod:`corbin_fl.mechanisms.categories`): local noise on every client first, then a
    share of independent clients (AugCorBin-FL), then those with no DP against it."""
    local, share, none = [], [], []
    for name in secure_mechanisms():
        cat = category(name)
        if cat.no_dp is not None or (cat.paired and not cat.independent_share):
            none.append(name)
        elif cat.paired:
            share.append(name)
        else:
            local.append(name)
    parts = []
    if local:
        parts.append(f"{', '.join(local)} (DP against the server: each client's own noise)")
    if share:
        parts.append(
            f"{', '.join(share)} (DP against the server only with enough independent clients)"
        )
    if none:
        parts.append(f"{', '.join(none)} (they run, but give no DP against the server)")
    return "; ".join(parts)


def levels_of(cfg: RunConfig) -> int:
    """The top symbol value of ``cfg.mechanism`` (its entry's ``sum_levels``); ValueError when
    the mechanism is refused with secure aggregation."""
    why = refusal(cfg.mechanism)
    if why is not None:
        raise ValueError(why)
    levels = registry.get(cfg.mechanism).sum_levels
    assert levels is not None  # refusal() checked it
    return int(levels(cfg))


def bit_width(num_clients: int, levels: int) -> int:
    """``b = ceil(log2(n * levels + 1))`` (:func:`corbin_fl.secagg.graph.bit_width`)."""
    # Imported here for its start-up cost: the corbin_fl.secagg package loads its client,
    # server and crypto modules (0.17 s measured with -X importtime), which the run config,
    # imported by every process of the tooling too, does not need.
    from corbin_fl.secagg.graph import bit_width as width

    return width(num_clients, levels)


def config_errors(cfg: RunConfig) -> dict[str, str]:
    """The run-config errors of the secure-aggregation keys (empty when fine).

    With secure aggregation: a mechanism affine in the symbol sum, at least
    :data:`~corbin_fl.secagg.graph.MIN_CLIENTS` (3) clients per round when ``clients-per-round``
    fixes it (``corbin-fl local`` also refuses fewer than 3 SuperNodes before starting; the
    protocol abandons a round with fewer), an even ``secagg-neighbours`` and
    ``secagg-threshold`` 0 (default) or at least 2.
    """
    from corbin_fl.secagg.graph import MIN_CLIENTS  # start-up cost: see bit_width

    errors: dict[str, str] = {}
    for key, value in (
        ("secagg-neighbours", cfg.secagg_neighbours),
        ("secagg-threshold", cfg.secagg_threshold),
    ):
        why = validate.why_at_least(value, 0, note="0 = default")
        if why is not None:
            errors[key] = why
    if cfg.secure_aggregation:
        why = refusal(cfg.mechanism)
        if why is not None:
            errors["secure-aggregation"] = why
        if 0 < cfg.clients_per_round < MIN_CLIENTS:
            errors["clients-per-round"] = (
                f"secure aggregation needs at least {MIN_CLIENTS} clients per round, got "
                f"{cfg.clients_per_round} (with 2, each client's update is the sum minus the "
                f"other's): use clients-per-round = 0 (all) or >= {MIN_CLIENTS}"
            )
        if cfg.secagg_threshold == 1:
            errors["secagg-threshold"] = (
                "must be >= 2 (0 = default): a 1-out-of-k Shamir share is the secret itself"
            )
        if cfg.secagg_neighbours % 2 and cfg.secagg_neighbours:
            errors.setdefault(
                "secagg-neighbours",
                f"must be even (k of a k-regular graph; n - 1 is taken when larger), got "
                f"{cfg.secagg_neighbours}",
            )
    elif cfg.secagg_neighbours or cfg.secagg_threshold:
        errors["secure-aggregation"] = "secagg-neighbours / secagg-threshold need it = true"
    return errors


def _bits(cfg: RunConfig, key: str, arr: np.ndarray, m: int) -> np.ndarray:
    """One packed bit per parameter (:func:`corbin_fl.registry.one_bit`)."""
    if key != wire.BITS:
        raise ValueError(f"{cfg.mechanism} encodes bits, got {key!r}")
    return np.unpackbits(arr.astype(np.uint8, copy=False), count=m)


def _levels(cfg: RunConfig, key: str, arr: np.ndarray, m: int) -> np.ndarray:
    """``b``-bit packed symbols (:func:`corbin_fl.registry.symbols_wire`)."""
    # Imported here for its start-up cost: mechanisms.packing imports torch (about 2 CPU-s per
    # process; mechanisms/__init__.py), which the run config's checks do not need.
    from corbin_fl.mechanisms.packing import unpack_symbols

    return unpack_symbols(arr.astype(np.uint8, copy=False), m, registry.symbol_bits_of(cfg))


def _own(cfg: RunConfig, key: str, arr: np.ndarray, m: int) -> np.ndarray:
    """Symbols in a wire form of the mechanism's own: its registered ``symbols`` hook."""
    read = registry.get(cfg.mechanism).hook("symbols")
    assert read is not None  # symbols() reads with it only where the entry names one
    out: np.ndarray = read(arr, m, cfg)
    return out


class _Reader(Protocol):
    """Reads the symbols of ``m`` parameters back from one encoded update."""

    def __call__(self, cfg: RunConfig, key: str, arr: np.ndarray, m: int) -> np.ndarray: ...


_READERS: Final[dict[object, _Reader]] = {
    registry.one_bit: _bits,
    registry.symbols_wire: _levels,
}
"""The symbol reader of each wire format that carries symbols (by the entry's ``wire``); an
entry with a ``symbols`` hook is read with it."""


def symbols(cfg: RunConfig, key: str, array: np.ndarray, num_params: int) -> np.ndarray:
    """The symbol vector (uint64 ``[m]``, in ``[0, levels]``) of one encoded update.

    ``key``/``array`` are what the mechanism's encoder returned (its wire form: packed bits,
    packed ``b``-bit symbols, or ternary bits / int8); the symbols are read back from it, so the
    masked vector is exactly what the plain protocol would have sent.
    """
    m = int(num_params)
    arr = np.asarray(array)
    entry = registry.get(cfg.mechanism)
    read = _own if entry.symbols else _READERS.get(entry.wire)
    if read is None:
        raise ValueError(refusal(cfg.mechanism) or f"{cfg.mechanism}: no symbol reader")
    out = read(cfg, key, arr, m)
    out = np.asarray(out, dtype=np.uint64).reshape(-1)
    if out.size != m:
        raise ValueError(f"{out.size} symbols for {m} parameters")
    top = levels_of(cfg)
    if out.size and int(out.max()) > top:
        raise ValueError(f"a symbol above levels = {top}")
    return out


__all__ = [
    "ADVERTISE",
    "MASKED_REC",
    "SECAGG_REC",
    "SECAGG_RECORDS",
    "SHARE",
    "STAGES",
    "SYMBOLS_KEY",
    "UNMASK",
    "bit_width",
    "config_errors",
    "levels_of",
    "refusal",
    "secure_mechanisms",
    "symbols",
]
