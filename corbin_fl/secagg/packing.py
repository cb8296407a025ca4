"""``b``-bit packing of masked vectors: ``n`` values below ``2^b`` in ``ceil(n b / 8)`` bytes.

Value ``i`` occupies bits ``[i b, (i + 1) b)`` of the stream, most significant bit first
(``numpy.packbits`` order), so the upload of one client is ``b`` bits per parameter, not 64.
"""

from __future__ import annotations

import numpy as np

from .prg import check_bits


def pack(values: np.ndarray, bits: int) -> bytes:
    """Pack non-negative integers below ``2^bits`` (``ValueError`` otherwise)."""
    check_bits(bits)
    v = np.asarray(values, dtype=np.uint64).reshape(-1)
    if v.size and int(v.max()) >> bits:
        raise ValueError(f"a value does not fit {bits} bits")
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
    flat = np.unpackbits(np.frombuffer(bytes(data), dtype=np.uint8))
    if flat[count * bits :].any():
        raise ValueError("padding bits are set")
    matrix = flat[: count * bits].reshape(count, bits).astype(np.uint64)
    out = np.zeros(count, dtype=np.uint64)
    for j in range(bits):
        out = (out << np.uint64(1)) | matrix[:, j]
    return out
