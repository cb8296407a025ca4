"""Pure math of CorBin-FL on torch tensors (CPU or CUDA); no Flower imports.

Re-exports the core API: the quantizers (:mod:`mechanisms.quantizers`), the common-randomness
expansion (:mod:`mechanisms.randomness`), bit packing and streaming aggregation
(:mod:`mechanisms.packing`) and the pairing rules (:mod:`mechanisms.pairing`). The theory,
accounting and baseline modules are imported from their own submodules.
"""

from corbin_fl.mechanisms.packing import (
    BitCounter,
    SumAccumulator,
    mean_from_counts,
    pack_bits,
    packed_len,
    unpack_bits,
)
from corbin_fl.mechanisms.pairing import augcorbin_split, is_lead, lead_node, random_pairing
from corbin_fl.mechanisms.quantizers import MAX_SHARED_BITS, alpha, corbinq, decode, ldpq, prob_plus
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

__all__ = [
    "MAX_SHARED_BITS",
    "PROTOCOL_VERSION",
    "SEED_BYTES",
    "BitCounter",
    "SumAccumulator",
    "alpha",
    "augcorbin_split",
    "context_label",
    "corbinq",
    "decode",
    "expand_seed",
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
