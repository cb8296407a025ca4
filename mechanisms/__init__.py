"""Pure math of CorBin-FL on torch tensors (CPU or CUDA); no Flower imports.

Re-exports the core API: the quantizers (:mod:`mechanisms.quantizers`), the common-randomness
expansion (:mod:`mechanisms.randomness`), bit packing and streaming aggregation
(:mod:`mechanisms.packing`) and the pairing rules (:mod:`mechanisms.pairing`). The theory,
accounting and baseline modules are imported from their own submodules.

The re-exports are loaded on first use (PEP 562 ``__getattr__``), so that importing a submodule
that needs no torch (``categories``, ``pairing``, ``secure_sum``...) does not import torch: every
ClientApp process imports the registry, which reads ``categories``, and only the ones that train or
encode need torch (about 2 CPU-s per process on the development machine).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from corbin_fl.mechanisms.packing import (
        BitCounter,
        SumAccumulator,
        mean_from_counts,
        pack_bits,
        packed_len,
        unpack_bits,
    )
    from corbin_fl.mechanisms.pairing import independent_split, is_lead, lead_node, random_pairing
    from corbin_fl.mechanisms.quantizers import (
        MAX_SHARED_BITS,
        alpha,
        corbinq,
        decode,
        ldpq,
        prob_plus,
    )
    from corbin_fl.mechanisms.randomness import (
        PROTOCOL_VERSION,
        SEED_BYTES,
        context_label,
        expand_seed,
        pack_z,
        px_threshold,
        realized_px,
        unpack_z,
        z_dtype,
    )

_SOURCE: dict[str, str] = {
    **dict.fromkeys(
        ("BitCounter", "SumAccumulator", "mean_from_counts", "pack_bits", "packed_len",
         "unpack_bits"),
        "packing",
    ),
    **dict.fromkeys(("independent_split", "is_lead", "lead_node", "random_pairing"), "pairing"),
    **dict.fromkeys(
        ("MAX_SHARED_BITS", "alpha", "corbinq", "decode", "ldpq", "prob_plus"), "quantizers"
    ),
    **dict.fromkeys(
        ("PROTOCOL_VERSION", "SEED_BYTES", "context_label", "expand_seed", "pack_z",
         "px_threshold", "realized_px", "unpack_z", "z_dtype"),
        "randomness",
    ),
}  # fmt: skip
"""The submodule each re-exported name comes from."""


def __getattr__(name: str) -> Any:
    """Load a re-exported name from its submodule on first use."""
    module = _SOURCE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "MAX_SHARED_BITS",
    "PROTOCOL_VERSION",
    "SEED_BYTES",
    "BitCounter",
    "SumAccumulator",
    "alpha",
    "context_label",
    "corbinq",
    "decode",
    "expand_seed",
    "independent_split",
    "is_lead",
    "ldpq",
    "lead_node",
    "mean_from_counts",
    "pack_bits",
    "pack_z",
    "packed_len",
    "prob_plus",
    "px_threshold",
    "random_pairing",
    "realized_px",
    "unpack_bits",
    "unpack_z",
    "z_dtype",
]
