"""Wire packing of one-bit updates and streaming server-side aggregation.

A one-bit update (LDPQ or CorBinQ output, ``True`` means ``U = +1``) of ``m`` parameters travels
as ``ceil(m/8)`` bytes in ``np.packbits`` order (parameter ``8i + j`` is bit ``7 - j`` of byte
``i``: big-endian within a byte), with zero padding bits in the last byte. The server needs only
the number ``k_j`` of ``+1`` per parameter over the ``n`` updates of a round, since the average of
the decoded values is (CorBin-FL Algorithm 3 line 23, Algorithm 1 line 4)::

    (1/n) sum_i (c + U_i r alpha) = c + r alpha (2 k / n - 1).

:class:`BitCounter` accumulates ``k`` without unpacking any update: the counts are kept
bit-sliced (64 parameters per machine word) in a carry-save adder tree, about 5 word operations
per ``m/64`` words per update; counts are converted to integers once, at the end.
:func:`mean_from_counts` turns counts into the float32 average.
"""

from __future__ import annotations

import logging
import math
from numbers import Integral
from typing import Final

import numpy as np
import torch

from corbin_fl.mechanisms.quantizers import alpha as _alpha
from corbin_fl.mechanisms.validate import integer, positive

__all__ = [
    "BitCounter",
    "SumAccumulator",
    "mean_from_counts",
    "pack_bits",
    "pack_symbols",
    "packed_len",
    "symbols_len",
    "unpack_bits",
    "unpack_symbols",
]

logger = logging.getLogger(__name__)

_MAX_M: Final[int] = 1 << 34
_MAX_UPDATES: Final[int] = (1 << 31) - 1


def packed_len(m: int) -> int:
    """Bytes of a packed one-bit update of ``m`` parameters: ``ceil(m / 8)``."""
    return (integer(m, "m", 0, _MAX_M) + 7) // 8


def _pad_mask(m: int) -> int:
    """Mask of the padding bits of the last byte (low bits in ``np.packbits`` order)."""
    pad = (-m) % 8
    return (1 << pad) - 1


def _as_packed_array(packed: object, m: int, what: str = "packed") -> np.ndarray:
    """Validate a packed update (dtype, shape, length, zero padding) and view it as uint8."""
    if isinstance(packed, np.ndarray):
        if packed.dtype != np.uint8:
            raise TypeError(f"{what} must have dtype uint8, got {packed.dtype}")
        if packed.ndim != 1:
            raise ValueError(f"{what} must be 1-D, got shape {packed.shape}")
        arr = packed
    elif isinstance(packed, bytes | bytearray | memoryview):
        arr = np.frombuffer(packed, dtype=np.uint8)
    else:
        raise TypeError(f"{what} must be a uint8 numpy array or bytes, got {type(packed).__name__}")
    expected = (m + 7) // 8
    if arr.shape[0] != expected:
        raise ValueError(f"{what} must be exactly ceil(m/8) = {expected} bytes, got {arr.shape[0]}")
    mask = _pad_mask(m)
    if mask and int(arr[-1]) & mask:
        raise ValueError(f"padding bits of {what} are not zero (malformed or tampered update)")
    return arr


# ------------------------------------------------------------------------------ pack / unpack
def pack_bits(bits: torch.Tensor) -> np.ndarray:
    """Pack a ``torch.bool`` tensor into ``ceil(m/8)`` bytes (``np.packbits`` order).

    Parameters
    ----------
    bits : torch.Tensor
        ``torch.bool`` tensor of any shape (flattened in C order), on any device; ``True`` is
        bit 1 (``U = +1``).

    Returns
    -------
    numpy.ndarray
        ``uint8`` array of ``ceil(m/8)`` bytes; parameter ``8i + j`` is bit ``7 - j`` of byte
        ``i`` and the padding bits of the last byte are zero.
    """
    if not isinstance(bits, torch.Tensor) or bits.dtype != torch.bool:
        got = bits.dtype if isinstance(bits, torch.Tensor) else type(bits).__name__
        raise TypeError(f"bits must be a torch.bool tensor, got {got}")
    flat = bits.detach().reshape(-1)
    if flat.device.type != "cpu":
        flat = _pack_bits_torch(flat)  # pack on the device, ship m/8 bytes
        return flat.cpu().numpy()
    return np.packbits(flat.numpy())


def _pack_bits_torch(flat: torch.Tensor) -> torch.Tensor:
    """``np.packbits`` with torch ops (used on accelerators): returns a uint8 tensor."""
    m = flat.numel()
    nbytes = (m + 7) // 8
    padded = torch.zeros(nbytes * 8, dtype=torch.uint8, device=flat.device)
    padded[:m] = flat.to(torch.uint8)
    weights = torch.tensor([128, 64, 32, 16, 8, 4, 2, 1], dtype=torch.uint8, device=flat.device)
    return (padded.view(nbytes, 8) * weights).sum(dim=1, dtype=torch.uint8)


def unpack_bits(
    packed: np.ndarray | bytes,
    m: int,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Inverse of :func:`pack_bits`, with validation of the wire format.

    Parameters
    ----------
    packed : numpy.ndarray or bytes
        ``uint8`` 1-D array (or bytes) of exactly ``ceil(m/8)`` bytes whose padding bits are
        zero; anything else is rejected (a malformed or tampered update).
    m : int
        Number of parameters.
    device : torch.device or str, optional
        Device of the result (default CPU).

    Returns
    -------
    torch.Tensor
        ``torch.bool`` of shape ``(m,)``.
    """
    m_v = integer(m, "m", 0, _MAX_M)
    arr = _as_packed_array(packed, m_v)
    bits = np.unpackbits(arr, count=m_v)
    out = torch.from_numpy(bits).view(torch.bool)
    return out.to(device) if device is not None else out


# ------------------------------------------------------------------------------ b-bit symbols
_SYMBOL_BITS: Final[tuple[int, ...]] = (1, 2, 4, 8)


def _check_bits(bits: object) -> int:
    if isinstance(bits, bool) or not isinstance(bits, Integral) or int(bits) not in _SYMBOL_BITS:
        raise ValueError(f"bits per symbol must be one of {_SYMBOL_BITS}, got {bits!r}")
    return int(bits)


def symbols_len(m: int, bits: int) -> int:
    """Bytes of ``m`` symbols of ``bits`` bits: ``ceil(m b / 8)``."""
    return (integer(m, "m", 0, _MAX_M) * _check_bits(bits) + 7) // 8


def pack_symbols(symbols: torch.Tensor | np.ndarray, bits: int) -> np.ndarray:
    """Pack symbols in ``[0, 2^b)`` at ``b`` bits each (``b`` in 1, 2, 4, 8), big-endian.

    Symbol ``i`` occupies bits ``[i b, (i + 1) b)`` of the stream, most significant bit first,
    the stream in ``np.packbits`` order; the padding bits of the last byte are zero. ``b = 1``
    is :func:`pack_bits` of ``symbols == 1``.

    Returns
    -------
    numpy.ndarray
        ``uint8[ceil(m b / 8)]``.
    """
    b = _check_bits(bits)
    arr = symbols.detach().cpu().numpy() if isinstance(symbols, torch.Tensor) else symbols
    flat = np.ascontiguousarray(np.asarray(arr).reshape(-1))
    if flat.size and (flat.min() < 0 or flat.max() >= 1 << b):
        raise ValueError(f"symbols must be in [0, {1 << b}) for {b} bits")
    per = 8 // b
    padded = np.zeros(-(-flat.size // per) * per, dtype=np.uint8)
    padded[: flat.size] = flat
    shifts = np.arange(8 - b, -1, -b, dtype=np.uint8)  # first symbol in the high bits
    return np.bitwise_or.reduce(padded.reshape(-1, per) << shifts, axis=1).astype(np.uint8)


def unpack_symbols(packed: np.ndarray | bytes, m: int, bits: int) -> np.ndarray:
    """Inverse of :func:`pack_symbols`: ``uint8[m]``; wrong length or set padding raises.

    Raises
    ------
    ValueError
        Not ``uint8[ceil(m b / 8)]``, or non-zero padding bits.
    """
    b, m_v = _check_bits(bits), integer(m, "m", 0, _MAX_M)
    arr = np.frombuffer(packed, dtype=np.uint8) if isinstance(packed, bytes) else packed
    if not isinstance(arr, np.ndarray) or arr.dtype != np.uint8 or arr.ndim != 1:
        raise ValueError("packed symbols must be a 1-D uint8 array")
    if arr.size != symbols_len(m_v, b):
        raise ValueError(f"packed symbols: expected {symbols_len(m_v, b)} bytes, got {arr.size}")
    shifts = np.arange(8 - b, -1, -b, dtype=np.uint8)
    out = ((arr[:, None] >> shifts) & np.uint8((1 << b) - 1)).reshape(-1)
    if out[m_v:].any():
        raise ValueError("packed symbols have non-zero padding bits")
    return np.ascontiguousarray(out[:m_v])


# ------------------------------------------------------------------------------ BitCounter
_COUNT_BLOCK: Final[int] = 1 << 14
"""Packed bytes per block when converting bit planes to counts (keeps the block in L2)."""


class BitCounter:
    """Streaming per-parameter count of ``+1`` bits over packed one-bit updates.

    The counts are kept bit-sliced, 64 parameters per ``uint64`` word, in a carry-save adder
    tree (Harley-Seal): level ``i`` holds an accumulator vector ``A_i`` and at most one pending
    vector ``B_i``, both of weight ``2^i``, so that for every parameter::

        count = sum_i 2^i * (A_i + B_i)          (bits of the parameter in A_i, B_i)

    A new update ``x`` enters level 0. If level ``i`` has no pending vector, ``x`` waits there;
    otherwise a full adder (5 word operations: XOR/AND/OR) replaces ``(A_i, B_i, x)`` by
    ``A_i' = A_i ^ B_i ^ x`` and ``carry = maj(A_i, B_i, x)``, and ``carry`` moves to level
    ``i + 1``. This costs about 5 word operations per update per ``m/64`` words (amortised),
    against ``2 log2 n`` for a plain ripple-carry counter, and never materialises the ``n``
    updates as floats. :meth:`counts` converts the tree to integers once (Horner over the
    levels, ``np.unpackbits`` per vector, in cache-sized blocks).

    Parameters
    ----------
    m : int
        Number of parameters per update.

    Examples
    --------
    >>> counter = BitCounter(10)
    >>> counter.add(pack_bits(torch.ones(10, dtype=torch.bool)))
    >>> counter.counts()[:3]
    array([1, 1, 1], dtype=int32)
    """

    def __init__(self, m: int) -> None:
        self._m = integer(m, "m", 0, _MAX_M)
        self._nbytes = (self._m + 7) // 8
        self._nwords = (self._nbytes + 7) // 8
        self._acc: list[np.ndarray] = []
        self._pending: list[np.ndarray | None] = []
        self._pool: list[np.ndarray] = []
        self._n = 0

    @property
    def m(self) -> int:
        """Number of parameters per update."""
        return self._m

    @property
    def n(self) -> int:
        """Number of updates added so far."""
        return self._n

    def _buffer(self) -> np.ndarray:
        return self._pool.pop() if self._pool else np.empty(self._nwords, dtype=np.uint64)

    def add(self, packed: np.ndarray | bytes) -> None:
        """Add one packed update (see :func:`pack_bits`).

        Parameters
        ----------
        packed : numpy.ndarray or bytes
            ``uint8`` 1-D array (or bytes) of exactly ``ceil(m/8)`` bytes with zero padding
            bits.

        Raises
        ------
        TypeError
            Wrong type or dtype.
        ValueError
            Wrong length, non-zero padding bits, or ``n`` would exceed ``2^31 - 1``.
        """
        arr = _as_packed_array(packed, self._m)
        if self._n >= _MAX_UPDATES:
            raise ValueError("BitCounter holds 2^31 - 1 updates; counts would overflow int32")
        x = self._buffer()
        x8 = x.view(np.uint8)
        x8[: self._nbytes] = arr
        x8[self._nbytes :] = 0
        level = 0
        while True:
            if level == len(self._acc):
                self._acc.append(x)
                self._pending.append(None)
                logger.debug("BitCounter: n=%d, %d carry-save levels", self._n + 1, level + 1)
                break
            b = self._pending[level]
            if b is None:
                self._pending[level] = x
                break
            a = self._acc[level]
            t = self._buffer()
            np.bitwise_and(a, b, out=t)  # t = a & b
            np.bitwise_xor(a, b, out=a)  # a = a ^ b
            np.bitwise_and(a, x, out=b)  # b = (a ^ b) & x
            np.bitwise_xor(a, x, out=a)  # a = a ^ b ^ x          (sum, weight 2^level)
            np.bitwise_or(t, b, out=t)  # t = maj(a, b, x)       (carry, weight 2^(level+1))
            self._pending[level] = None
            self._pool.append(b)
            self._pool.append(x)
            x = t
            level += 1
        self._n += 1

    def _vectors(self) -> list[list[np.ndarray]]:
        """Per level (lowest first), the bit vectors of weight ``2^level``."""
        return [[a] if p is None else [a, p] for a, p in zip(self._acc, self._pending, strict=True)]

    def counts(self) -> np.ndarray:
        """Per-parameter number of ``+1`` bits over the updates added so far.

        Returns
        -------
        numpy.ndarray
            ``int32`` array of length ``m`` with values in ``[0, n]``.
        """
        m, nbytes = self._m, self._nbytes
        result = np.zeros(m, dtype=np.int32)
        if self._n == 0 or m == 0:
            return result
        levels = self._vectors()[::-1]  # Horner: highest weight first
        # Every partial sum floor(count / 2^i) <= n fits the accumulator dtype.
        acc_dtype = np.uint8 if self._n < 256 else np.uint16 if self._n < 65536 else np.int32
        digits = np.empty(8 * _COUNT_BLOCK, dtype=acc_dtype)
        for lo in range(0, nbytes, _COUNT_BLOCK):
            hi = min(lo + _COUNT_BLOCK, nbytes)
            p_lo, p_hi = 8 * lo, min(8 * hi, m)
            d = digits[: p_hi - p_lo]
            d.fill(0)
            for vectors in levels:
                np.add(d, d, out=d)
                for v in vectors:
                    bits = np.unpackbits(v.view(np.uint8)[lo:hi], count=p_hi - p_lo)
                    np.add(d, bits, out=d, casting="unsafe")
            np.copyto(result[p_lo:p_hi], d, casting="unsafe")
        return result

    def __repr__(self) -> str:
        return f"BitCounter(m={self._m}, n={self._n}, levels={len(self._acc)})"


# ------------------------------------------------------------------------------ means
def mean_from_counts(
    counts: np.ndarray | torch.Tensor,
    n: int,
    c: torch.Tensor | float,
    r: torch.Tensor | float,
    eps: float,
    *,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    r"""Average of ``n`` decoded one-bit updates from the per-parameter ``+1`` counts.

    .. math:: \bar W_j = c_j + r_j \alpha(\epsilon) \frac{2 k_j - n}{n}

    which equals :math:`\frac1n \sum_i (c_j + U_{i,j} r_j \alpha(\epsilon))` (Algorithm 1
    line 4, Algorithm 3 line 23). Evaluated in float32 as
    ``c + (k - n/2) * (2 r alpha / n)``: ``k - n/2`` is exact for ``n < 2^23`` (so a balanced
    count gives exactly ``c``) and the result is within a few ulps of ``|c| + r alpha``.

    Parameters
    ----------
    counts : numpy.ndarray or torch.Tensor
        Integer counts ``k`` in ``[0, n]`` (e.g. :meth:`BitCounter.counts`).
    n : int
        Number of updates, ``>= 1``.
    c, r : torch.Tensor or float
        Centers and radii ``> 0`` (broadcast against ``counts``).
    eps : float
        Privacy budget ``eps > 0``.
    device : torch.device or str, optional
        Device of the result; default: the device of ``c`` / ``r`` if tensors, else of
        ``counts`` (CPU for numpy).

    Returns
    -------
    torch.Tensor
        ``float32`` mean, shape of ``counts`` broadcast with ``c`` and ``r``.
    """
    if isinstance(n, bool) or not isinstance(n, Integral) or int(n) < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    n_v = int(n)
    a = _alpha(positive(eps))
    if isinstance(counts, np.ndarray):
        if not np.issubdtype(counts.dtype, np.integer):
            raise TypeError(f"counts must have an integer dtype, got {counts.dtype}")
        k = torch.from_numpy(counts)
    elif isinstance(counts, torch.Tensor):
        if counts.dtype.is_floating_point or counts.dtype.is_complex or counts.dtype == torch.bool:
            raise TypeError(f"counts must have an integer dtype, got {counts.dtype}")
        k = counts
    else:
        raise TypeError(f"counts must be a numpy array or tensor, got {type(counts).__name__}")
    if k.numel():
        lo, hi = torch.aminmax(k)
        if int(lo) < 0 or int(hi) > n_v:
            raise ValueError(f"counts must lie in [0, n] = [0, {n_v}], got [{int(lo)}, {int(hi)}]")
    for name, v in (("c", c), ("r", r)):
        if isinstance(v, torch.Tensor):
            if not v.dtype.is_floating_point:
                raise TypeError(f"{name} must be a floating tensor, got dtype {v.dtype}")
        elif isinstance(v, bool) or not isinstance(v, float | int):
            raise TypeError(f"{name} must be a tensor or a real number, got {type(v).__name__}")
    if device is None:
        tens = [v for v in (c, r) if isinstance(v, torch.Tensor)]
        dev = tens[0].device if tens else k.device
    else:
        dev = torch.device(device)
    r_t = r.to(device=dev, dtype=torch.float32) if isinstance(r, torch.Tensor) else float(r)
    c_t = c.to(device=dev, dtype=torch.float32) if isinstance(c, torch.Tensor) else float(c)
    if isinstance(r_t, torch.Tensor):
        if r_t.numel() and not bool(((r_t > 0) & torch.isfinite(r_t)).all()):
            raise ValueError("r must be finite and > 0 everywhere")
    elif not (math.isfinite(r_t) and r_t > 0):
        raise ValueError(f"r must be finite and > 0, got {r_t!r}")
    if isinstance(c_t, torch.Tensor):
        if c_t.numel() and not bool(torch.isfinite(c_t).all()):
            raise ValueError("c must be finite")
    elif not math.isfinite(c_t):
        raise ValueError(f"c must be finite, got {c_t!r}")
    a_r = r_t * a if isinstance(r_t, torch.Tensor) else float(r_t * a)
    try:  # numpy's broadcasting rule (torch.broadcast_shapes imports sympy on first use)
        shape = torch.Size(
            np.broadcast_shapes(
                tuple(k.shape), *(tuple(v.shape) for v in (c_t, a_r) if isinstance(v, torch.Tensor))
            )
        )
    except ValueError as exc:
        raise ValueError("counts, c and r are not broadcastable") from exc
    return _affine_counts(k, n_v, c_t, a_r, shape, dev)


_MEAN_CHUNK: Final[int] = 1 << 15
"""At torch's intra-op grain size: chunk operations never open OpenMP parallel regions (see
``mechanisms.quantizers._CPU_CHUNK``)."""


@torch.no_grad()
def _affine_counts(
    k: torch.Tensor,
    n: int,
    c: torch.Tensor | float,
    a_r: torch.Tensor | float,
    shape: torch.Size,
    dev: torch.device,
) -> torch.Tensor:
    """``c + a_r * (2k - n) / n`` in float32, in cache-sized chunks on CPU."""
    if n >= 1 << 23:
        raise ValueError(f"n must be < 2^23 for an exact float32 k - n/2, got {n}")

    def flat(v: torch.Tensor | float) -> torch.Tensor | float:
        if isinstance(v, float):
            return v
        if v.numel() == 1:
            return float(v.item())
        return (v if v.shape == shape else torch.broadcast_to(v, shape)).reshape(-1)

    kf, cf, af = flat(k.to(dev)), flat(c), flat(a_r)
    assert isinstance(kf, torch.Tensor)
    total = math.prod(shape)
    out = torch.empty(total, dtype=torch.float32, device=dev)
    step = _MEAN_CHUNK if dev.type == "cpu" else max(total, 1)
    half_n = 0.5 * n
    for lo in range(0, total, step):
        hi = min(lo + step, total)
        v = out[lo:hi]
        v.copy_(kf[lo:hi])
        v.sub_(half_n)  # k - n/2: exact (half-integers below 2^23); 0 exactly when balanced
        if isinstance(af, float):
            v.mul_(2.0 * af / n)
        else:
            v.mul_(2.0 / n).mul_(af[lo:hi])
        v.add_(cf if isinstance(cf, float) else cf[lo:hi])
    return out.reshape(shape)


class SumAccumulator:
    """Streaming sum of float updates (for the float mechanisms: Gaussian, Laplace, vanilla).

    Parameters
    ----------
    shape : int or tuple of int
        Shape of every update (an ``int`` means a flat vector of that length).
    dtype : torch.dtype, default torch.float64
        Accumulation dtype (float64 keeps the sum of many float32 updates exact to ~1e-16).
    device : torch.device or str, optional
        Device of the running sum (default CPU); updates are moved there.
    """

    def __init__(
        self,
        shape: int | tuple[int, ...],
        *,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str | None = None,
    ) -> None:
        if isinstance(shape, Integral) and not isinstance(shape, bool):
            shape_t: tuple[int, ...] = (integer(shape, "m", 0, _MAX_M),)
        elif isinstance(shape, tuple) and all(
            isinstance(s, Integral) and not isinstance(s, bool) and s >= 0 for s in shape
        ):
            shape_t = tuple(int(s) for s in shape)
        else:
            raise TypeError(f"shape must be an int or a tuple of non-negative ints, got {shape!r}")
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
        self._shape = torch.Size(shape_t)
        self._dtype = dtype
        self._device = torch.device(device) if device is not None else torch.device("cpu")
        self._sum = torch.zeros(self._shape, dtype=dtype, device=self._device)
        self._n = 0

    @property
    def n(self) -> int:
        """Number of updates added so far."""
        return self._n

    @property
    def shape(self) -> torch.Size:
        """Shape of every update."""
        return self._shape

    def add(self, update: torch.Tensor | np.ndarray) -> None:
        """Add one update after validating its shape, dtype and finiteness.

        Raises
        ------
        TypeError
            Not a floating tensor / array.
        ValueError
            Wrong shape or a non-finite value.
        """
        if isinstance(update, np.ndarray):
            if not np.issubdtype(update.dtype, np.floating):
                raise TypeError(f"update must be floating point, got {update.dtype}")
            t = torch.from_numpy(update)
        elif isinstance(update, torch.Tensor):
            if not update.dtype.is_floating_point:
                raise TypeError(f"update must be floating point, got {update.dtype}")
            t = update.detach()
        else:
            raise TypeError(f"update must be a tensor or numpy array, got {type(update).__name__}")
        if t.shape != self._shape:
            raise ValueError(f"update shape {tuple(t.shape)} != expected {tuple(self._shape)}")
        t = t.to(device=self._device, dtype=self._dtype)
        if t.numel() and not bool(torch.isfinite(t).all()):
            raise ValueError("update contains NaN or infinite values")
        self._sum.add_(t)
        self._n += 1

    def sum(self) -> torch.Tensor:
        """The running sum (a copy), in the accumulation dtype."""
        return self._sum.clone()

    def mean(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Average of the updates, cast to ``dtype``.

        Raises
        ------
        ValueError
            If no update was added.
        """
        if self._n == 0:
            raise ValueError("no update has been added")
        return (self._sum / self._n).to(dtype)
