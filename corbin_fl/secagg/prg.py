"""The mask generator: a 32-byte seed -> ``n`` integers uniform modulo ``2^b`` (ChaCha20).

Every mask in SecAgg (Bonawitz et al. 2017) is ``PRG(seed)``: the self mask ``PRG(b_u)`` and the
pairwise masks ``PRG(s_uv)``. Here the seed is first bound to its context with HKDF-SHA256,

    key = HKDF-SHA256(ikm = seed, salt = none, info = "corbin-secagg/v1/prg" | run | round |
                      purpose | parties),

so the same seed never yields the same mask in another run, round or role (Bell et al. 2020
draw fresh keys every round as well; the binding makes a replayed seed useless too). The key
drives ChaCha20 (RFC 7539 block function, 256-bit key, zero nonce and counter: each key is used
for one stream only). For ``b <= 32`` the stream is read as little-endian 32-bit words, else as
64-bit words, and each word is reduced by ``& (2^b - 1)``; since ``2^b`` divides the word range
this is exactly uniform modulo ``2^b`` (no rejection needed).
"""

from __future__ import annotations

from typing import Final

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

PROTOCOL: Final[bytes] = b"corbin-secagg/v1"
"""Version label in every HKDF info and AES-GCM associated data of this package."""

MAX_BITS: Final[int] = 62
"""Widest supported modulus ``2^b`` (sums stay below ``2^63`` in int64 arithmetic)."""

SELF_MASK: Final[str] = "self-mask"
PAIR_MASK: Final[str] = "pair-mask"


def context_info(label: str, run_id: int, server_round: int, *parties: int) -> bytes:
    """``PROTOCOL / label | run | round | parties...``, each integer as 8 bytes big-endian."""
    if not label or "|" in label:
        raise ValueError(f"bad label {label!r}")
    parts = [PROTOCOL + b"/" + label.encode()]
    for value in (run_id, server_round, *parties):
        if not isinstance(value, int) or not 0 <= value < 2**64:
            raise ValueError(f"context integers must be in [0, 2^64), got {value!r}")
        parts.append(value.to_bytes(8, "big"))
    return b"|".join(parts)


def hkdf(ikm: bytes, info: bytes, length: int = 32) -> bytes:
    """HKDF-SHA256 with no salt (RFC 5869); ``ikm`` is a fresh uniform seed or X25519 output."""
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=None, info=info).derive(ikm)


def check_bits(bits: int) -> int:
    """``bits`` if it is an integer in ``1..62``, else ``ValueError``."""
    if not isinstance(bits, int) or isinstance(bits, bool) or not 1 <= bits <= MAX_BITS:
        raise ValueError(f"bit width must be an integer in 1..{MAX_BITS}, got {bits!r}")
    return bits


def expand(key: bytes, length: int, bits: int) -> np.ndarray:
    """``length`` integers uniform in ``[0, 2^bits)`` (uint64), ChaCha20 stream of ``key``."""
    check_bits(bits)
    if not isinstance(key, bytes) or len(key) != 32:
        raise ValueError("a PRG key is 32 bytes")
    if not isinstance(length, int) or length < 0:
        raise ValueError(f"length must be a non-negative integer, got {length!r}")
    word = np.dtype("<u4") if bits <= 32 else np.dtype("<u8")
    encryptor = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor()
    # The keystream (ChaCha20 of zeros) is written into a preallocated array and reduced into
    # the uint64 result in one pass (the same values as update() + astype() + &=, with one
    # allocation and one pass over the vector fewer).
    words = np.empty(length, dtype=word)
    encryptor.update_into(bytes(length * word.itemsize), words.view(np.uint8).data)
    values = np.empty(length, dtype=np.uint64)
    np.bitwise_and(words, word.type((1 << bits) - 1), out=values)
    return values


def mask(
    seed: bytes,
    length: int,
    bits: int,
    *,
    run_id: int,
    server_round: int,
    purpose: str,
    parties: tuple[int, ...],
) -> np.ndarray:
    """``PRG(seed)`` bound to (run, round, purpose, parties): ``expand(HKDF(seed, info))``."""
    if not isinstance(seed, bytes) or len(seed) < 16:
        raise ValueError("a mask seed is at least 16 bytes")
    key = hkdf(seed, context_info("prg/" + purpose, run_id, server_round, *parties))
    return expand(key, length, bits)
