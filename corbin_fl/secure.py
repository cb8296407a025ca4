"""Secure aggregation composed with CorBin-FL: what both sides share (no torch, no protocol).

With ``secure-aggregation = true`` (``CorBin(..., secure_aggregation=True)``) every client masks
its mechanism's *symbol vector* with SecAgg+ (:mod:`corbin_fl.secagg`, Bell et al. 2020) and the
server learns only the exact sum of the surviving clients' symbols. That is enough for every
mechanism whose server estimate is affine in the symbol sum (:data:`SECURE_MECHANISMS`); the
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
to CorBin-FL's own records, and the update reply carries ``corbin.reply`` (round, next public
key, pipelined blob: opaque), :data:`SECAGG_REC` (the mask reply head: rejected senders,
length, layout) and :data:`MASKED_REC` (the ``b``-bit packed masked vector) instead of
``corbin.update`` and ``corbin.metrics``; the app's own metric records stay on the node.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import numpy as np

if TYPE_CHECKING:
    from corbin_fl.config import RunConfig

SECURE_MECHANISMS: Final[tuple[str, ...]] = (
    "corbin",
    "augcorbin",
    "ldpfl",
    "pbm",
    "rqm",
    "ternary",
    "signsgd",
)
"""Mechanisms whose server estimate is affine in the sum of the clients' symbols."""
ONE_BIT: Final[frozenset[str]] = frozenset({"corbin", "augcorbin", "ldpfl", "signsgd"})

ADVERTISE: Final[str] = "secagg-advertise"
SHARE: Final[str] = "secagg-share"
UNMASK: Final[str] = "secagg-unmask"
STAGES: Final[tuple[str, ...]] = (ADVERTISE, SHARE, UNMASK)
"""The ``corbin`` stages of the SecAgg+ round (the mask stage is CorBin-FL's ``update``)."""
SECAGG_REC: Final[str] = "corbin.secagg"
"""ConfigRecord: the SecAgg+ record (:data:`corbin_fl.secagg.wire.RECORD`) under a protocol name."""
MASKED_REC: Final[str] = "corbin.masked"
"""ArrayRecord of the update reply: the masked vector (``secagg.wire.MASKED_RECORD``)."""
SYMBOLS_KEY: Final[str] = "symbols"
"""The one layout entry of a masked update: ``(symbols, (m,))``."""


def refusal(mechanism: str) -> str | None:
    """Why ``mechanism`` cannot run with secure aggregation, or None when it can."""
    if mechanism in SECURE_MECHANISMS:
        return None
    return (
        f"secure aggregation gives the server only the sum of the clients' symbols, and "
        f"{mechanism!r} has no estimate affine in that sum; use one of "
        f"{', '.join(SECURE_MECHANISMS)}, or secure-aggregation = false"
    )


def levels_of(cfg: RunConfig) -> int:
    """The top symbol value of ``cfg.mechanism`` (module table); ValueError when refused."""
    why = refusal(cfg.mechanism)
    if why is not None:
        raise ValueError(why)
    if cfg.mechanism in ONE_BIT:
        return 1
    if cfg.mechanism == "pbm":
        return int(cfg.pbm_trials)
    if cfg.mechanism == "rqm":
        return int(cfg.rqm_levels) - 1
    return 2  # ternary: t + 1


def bit_width(num_clients: int, levels: int) -> int:
    """``b = ceil(log2(n * levels + 1))`` (:func:`corbin_fl.secagg.graph.bit_width`)."""
    from corbin_fl.secagg.graph import bit_width as width

    return width(num_clients, levels)


def config_errors(cfg: RunConfig) -> dict[str, str]:
    """The run-config errors of the secure-aggregation keys (empty when fine)."""
    errors: dict[str, str] = {}
    if cfg.secagg_neighbours < 0:
        errors["secagg-neighbours"] = f"must be >= 0 (0 = default), got {cfg.secagg_neighbours}"
    if cfg.secagg_threshold < 0:
        errors["secagg-threshold"] = f"must be >= 0 (0 = default), got {cfg.secagg_threshold}"
    if cfg.secure_aggregation:
        why = refusal(cfg.mechanism)
        if why is not None:
            errors["secure-aggregation"] = why
        if cfg.secagg_neighbours % 2 and cfg.secagg_neighbours:
            errors.setdefault(
                "secagg-neighbours",
                f"must be even (k of a Harary graph; n - 1 is taken when larger), got "
                f"{cfg.secagg_neighbours}",
            )
    elif cfg.secagg_neighbours or cfg.secagg_threshold:
        errors["secure-aggregation"] = "secagg-neighbours / secagg-threshold need it = true"
    return errors


def symbols(cfg: RunConfig, key: str, array: np.ndarray, num_params: int) -> np.ndarray:
    """The symbol vector (uint64 ``[m]``, in ``[0, levels]``) of one encoded update.

    ``key``/``array`` are what the mechanism's encoder returned (its wire form: packed bits,
    packed ``b``-bit symbols, or ternary bits / int8); the symbols are read back from it, so the
    masked vector is exactly what the plain protocol would have sent.
    """
    from corbin_fl import wire

    m = int(num_params)
    arr = np.asarray(array)
    if cfg.mechanism in ONE_BIT:
        if key != wire.BITS:
            raise ValueError(f"{cfg.mechanism} encodes bits, got {key!r}")
        out = np.unpackbits(arr.astype(np.uint8, copy=False), count=m)
    elif cfg.mechanism in ("pbm", "rqm"):
        from corbin_fl.mechanisms.packing import unpack_symbols
        from corbin_fl.registry import symbol_bits_of

        out = unpack_symbols(arr.astype(np.uint8, copy=False), m, symbol_bits_of(cfg))
    elif cfg.mechanism == "ternary":
        out = wire.decode_ternary(arr, m, cfg.ternary_encoding).astype(np.int64) + 1
    else:
        raise ValueError(refusal(cfg.mechanism) or cfg.mechanism)
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
    "SECURE_MECHANISMS",
    "SHARE",
    "STAGES",
    "SYMBOLS_KEY",
    "UNMASK",
    "bit_width",
    "config_errors",
    "levels_of",
    "refusal",
    "symbols",
]
