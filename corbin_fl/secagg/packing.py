"""``b``-bit packing of masked vectors: ``n`` values below ``2^b`` in ``ceil(n b / 8)`` bytes.

Value ``i`` occupies bits ``[i b, (i + 1) b)`` of the stream, most significant bit first
(``numpy.packbits`` order), so the upload of one client is ``b`` bits per parameter, not 64.

For ``b <= 8`` (``n * levels < 256``) eight values are exactly ``b`` bytes: the ``b`` bytes,
read big-endian, are the integer ``sum_i v_i 2^(b (7 - i))``, so a group packs and unpacks with
eight shifts over a ``uint64`` word per group (about ten times faster than one bit plane per
value bit, which wider ``b`` use).
"""

from __future__ import annotations

import numpy as np

from .prg import check_bits

_GROUP = 8
"""Values per group of ``b`` bytes (the fast path, ``b <= 8``)."""


def pack(values: np.ndarray, bits: int) -> bytes:
    """Pack non-negative integers below ``2^bits`` (``ValueError`` otherwise)."""
    check_bits(bits)
    v = np.asarray(values, dtype=np.uint64).reshape(-1)
    if v.size and int(v.max()) >> bits:
        raise ValueError(f"a value does not fit {bits} bits")
    if bits <= 8:
        return _pack_groups(v, bits)
    shifts = np.arange(bits - 1, -1, -1, dtype=np.uint64)
    matrix = ((v[:, None] >> shifts) & np.uint64(1)).astype(np.uint8)
    return np.packbits(matrix.reshape(-1)).tobytes()


def unpack(data: bytes, count: int, bits: int) -> np.ndarray:
    """Inverse of :func:`pack`: ``count`` uint64 values; ``ValueError`` on a wrong length."""
    check_bits(bits)
    if not isinstance(count, int) or count < 0:
        raise ValueError(f"bad count {count!r}")
    expected = (count * bits + 7) // 8
    if not isinstance(data, bytes | bytearray | memoryview) or len(data) != expected:
        raise ValueError(f"{count} values of {bits} bits take {expected} bytes")
    if bits <= 8:
        out = _unpack_groups(np.frombuffer(bytes(data), dtype=np.uint8), count, bits)
        if out[count:].any():
            raise ValueError("padding bits are set")
        return out[:count]
    flat = np.unpackbits(np.frombuffer(bytes(data), dtype=np.uint8))
    if flat[count * bits :].any():
        raise ValueError("padding bits are set")
    matrix = flat[: count * bits].reshape(count, bits)
    out = np.zeros(count, dtype=np.uint64)
    for j in range(bits):
        out <<= np.uint64(1)
        out |= matrix[:, j]
    return out


def _pack_groups(v: np.ndarray, bits: int) -> bytes:
    """``b <= 8``: each group of 8 values as the low ``8 b`` bits of a big-endian word."""
    groups = -(-v.size // _GROUP)
    padded = np.zeros(groups * _GROUP, dtype=np.uint64)
    padded[: v.size] = v
    cols = padded.reshape(groups, _GROUP)
    word = np.zeros(groups, dtype=np.uint64)
    for i in range(_GROUP):
        word |= cols[:, i] << np.uint64(bits * (_GROUP - 1 - i))
    raw = word.astype(">u8").view(np.uint8).reshape(groups, 8)[:, 8 - bits :]
    return raw.tobytes()[: (v.size * bits + 7) // 8]


def _unpack_groups(data: np.ndarray, count: int, bits: int) -> np.ndarray:
    """Inverse of :func:`_pack_groups`: ``8 ceil(count / 8)`` values (the tail is padding)."""
    groups = -(-count // _GROUP)
    raw = np.zeros((groups, 8), dtype=np.uint8)
    flat = np.zeros(groups * bits, dtype=np.uint8)
    flat[: data.size] = data
    raw[:, 8 - bits :] = flat.reshape(groups, bits)
    word = raw.view(">u8").reshape(groups).astype(np.uint64)
    out = np.empty((groups, _GROUP), dtype=np.uint64)
    mask = np.uint64((1 << bits) - 1)
    for i in range(_GROUP):
        np.bitwise_and(word >> np.uint64(bits * (_GROUP - 1 - i)), mask, out=out[:, i])
    return out.reshape(-1)
