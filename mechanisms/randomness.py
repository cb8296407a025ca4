"""Common randomness of a CorBin-FL pair: expand a 32-byte secret seed into ``z``.

Algorithm 3 lines 14-17 of the CorBin-FL paper have the lead draw ``d*m`` fair bits and send
them to the follow. Here the lead sends a 32-byte seed instead (inside the pair's AEAD blob) and
both partners expand it deterministically with a standard stream cipher, so both hold the same
``z`` for every parameter, bit for bit, on every machine. The paper's "ship ``d*m`` raw bits"
variant is kept as the exact mode (:func:`pack_z` / :func:`unpack_z`).

Expansion (version ``corbin-fl/v1``)
-----------------------------------
1. ``key = HKDF-SHA256(ikm=seed, salt=None, length=32,
   info=b"corbin-fl/v1/z-expansion" || u8(d) || u16be(P) || label)`` where ``P`` is the
   ``p_x`` threshold below (``32768`` for ``p_x = 1/2``). Binding ``d`` and ``P`` makes streams
   for different parameters independent.
2. Keystream ``K = ChaCha20(key, nonce = 16 zero bytes)`` (RFC 7539 layout as in OpenSSL /
   ``cryptography``: 32-bit little-endian block counter 0, 96-bit nonce 0; each key is used
   for one stream only, so the fixed nonce never repeats under a key).
3. Uniform codebook (``p_x = 1/2``):
   ``d <= 8``: ``z[j] = K[j] & (2^d - 1)`` (one byte per parameter; the low ``d`` bits of a
   uniform byte are uniform); ``9 <= d <= 16``: ``z[j] = (K[2j] | K[2j+1] << 8) & (2^d - 1)``
   (little-endian ``uint16`` per parameter).
4. Biased codebook (CoQ-FL, ``p_x != 1/2``): ``P = round(p_x * 2^16)``; bit ``k`` (``k = 0`` is
   the MSB) of parameter ``j`` is ``1`` iff the little-endian ``uint16`` made of bytes
   ``K[2(jd+k)], K[2(jd+k)+1]`` is ``< P``; ``z[j] = sum_k bit_k << (d - 1 - k)``. The realised
   bias is ``P / 2^16`` (:func:`realized_px`), a ``2^-16`` grid: give :func:`corbinq
   <mechanisms.quantizers.corbinq>` that value for exact marginals.

``z`` is returned as ``torch.int16`` for ``d <= 15`` and ``torch.int32`` for ``d = 16`` (the
smallest signed dtype holding ``[0, 2^d)``); values are MSB-first codewords, so integer order is
the paper's lexicographic order.
"""

from __future__ import annotations

import math
import struct
from numbers import Real
from typing import Final

import numpy as np
import torch
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from corbin_fl.mechanisms.validate import integer

__all__ = [
    "PROTOCOL_VERSION",
    "SEED_BYTES",
    "context_label",
    "expand_seed",
    "pack_z",
    "px_threshold",
    "realized_px",
    "unpack_z",
    "z_dtype",
]

PROTOCOL_VERSION: Final[bytes] = b"corbin-fl/v1"
"""Protocol version prefix of every label and KDF context (same as ``corbin_fl.wire``)."""

SEED_BYTES: Final[int] = 32
"""Length of the secret seed that the lead shares with the follow."""

MAX_PARAMS: Final[int] = 1 << 34
"""Largest ``m`` accepted (the ChaCha20 32-bit block counter covers 256 GiB of keystream)."""

MAX_D: Final[int] = 16
"""Most shared bits per parameter (one 16-bit keystream word each; as
``mechanisms.quantizers.MAX_SHARED_BITS``)."""

_INFO_PREFIX: Final[bytes] = PROTOCOL_VERSION + b"/z-expansion"
_LABEL_TAG: Final[bytes] = PROTOCOL_VERSION + b"/pair-z"
_NONCE: Final[bytes] = bytes(16)
_UNIFORM_P: Final[int] = 1 << 15
_BLOCK: Final[int] = 1 << 20
"""Parameters expanded per keystream block (bounds the scratch memory)."""

_U64_MAX: Final[int] = (1 << 64) - 1


# ------------------------------------------------------------------------------ validation


def px_threshold(p_x: float) -> int:
    """Integer threshold ``P = round(p_x * 2^16)`` of the biased shared bits.

    A shared bit is ``1`` iff a uniform 16-bit keystream word is ``< P``, so it is
    Bernoulli(``P / 2^16``). ``p_x = 1/2`` gives ``P = 32768``.

    Parameters
    ----------
    p_x : float
        Desired probability of a ``1`` bit, with ``1 <= round(p_x * 2^16) <= 2^16 - 1``.

    Returns
    -------
    int
        ``P`` in ``[1, 65535]``.
    """
    if isinstance(p_x, bool) or not isinstance(p_x, Real):
        raise TypeError(f"p_x must be a real number, got {type(p_x).__name__}")
    value = float(p_x)
    if not math.isfinite(value):
        raise ValueError(f"p_x must be finite, got {value!r}")
    p16 = round(value * 65536.0)
    if not 1 <= p16 <= 65535:
        raise ValueError(f"p_x must satisfy 1 <= round(p_x * 2^16) <= 65535, got p_x={value!r}")
    return p16


def realized_px(p_x: float) -> float:
    """Bias actually realised by :func:`expand_seed` for a requested ``p_x``: ``P / 2^16``.

    Pass this value as ``p_x`` to :func:`mechanisms.quantizers.corbinq` so that the quantizer's
    codebook law matches the shared bits exactly.
    """
    return px_threshold(p_x) / 65536.0


def z_dtype(d: int) -> torch.dtype:
    """Dtype of ``z`` returned by :func:`expand_seed` / :func:`unpack_z` for ``d`` bits.

    ``torch.int16`` for ``d <= 15``, ``torch.int32`` for ``d = 16``.
    """
    return torch.int16 if integer(d, "d", 1, MAX_D) <= 15 else torch.int32


def _np_z_dtype(d: int) -> type[np.signedinteger]:
    return np.int16 if d <= 15 else np.int32


def _resolve_device(device: torch.device | str | None) -> torch.device:
    if device is None:
        return torch.device("cpu")
    if isinstance(device, str | torch.device):
        return torch.device(device)
    raise TypeError(f"device must be a torch.device, a str or None, got {type(device).__name__}")


# ------------------------------------------------------------------------------ labels
def context_label(run_id: int, round: int, node_a: int, node_b: int) -> bytes:
    """Canonical context label of a pair's common randomness for one round.

    ``b"corbin-fl/v1/pair-z" || u64be(run_id) || u64be(round) || u64be(min) || u64be(max)``
    with ``min, max`` the two node ids in ascending order, so both partners compute the same
    label whatever their role (Algorithm 3 line 17 binds ``Z`` to the pair ``(C_i, C_{p_i})``).

    Parameters
    ----------
    run_id, round : int
        Flower run id and round number, unsigned 64-bit.
    node_a, node_b : int
        The two node ids (unsigned 64-bit, distinct); their order does not matter.

    Returns
    -------
    bytes
        A 51-byte label.
    """
    run_v = integer(run_id, "run_id", 0, _U64_MAX)
    round_v = integer(round, "round", 0, _U64_MAX)
    a = integer(node_a, "node_a", 0, _U64_MAX)
    b = integer(node_b, "node_b", 0, _U64_MAX)
    if a == b:
        raise ValueError(f"node_a and node_b must differ (a node cannot pair with itself: {a})")
    lo, hi = (a, b) if a < b else (b, a)
    return _LABEL_TAG + struct.pack(">QQQQ", run_v, round_v, lo, hi)


# ------------------------------------------------------------------------------ expansion
def _derive_key(seed: bytes, label: bytes, d: int, p16: int) -> bytes:
    info = _INFO_PREFIX + struct.pack(">BH", d, p16) + label
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(seed)


def _check_seed_label(seed: object, label: object) -> tuple[bytes, bytes]:
    if not isinstance(seed, bytes | bytearray):
        raise TypeError(f"seed must be bytes, got {type(seed).__name__}")
    if len(seed) != SEED_BYTES:
        raise ValueError(f"seed must be exactly {SEED_BYTES} bytes, got {len(seed)}")
    if not isinstance(label, bytes | bytearray):
        raise TypeError(f"label must be bytes, got {type(label).__name__}")
    if len(label) == 0:
        raise ValueError("label must be non-empty (use context_label())")
    return bytes(seed), bytes(label)


def expand_seed(
    seed: bytes,
    label: bytes,
    m: int,
    d: int,
    *,
    p_x: float = 0.5,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Expand a 32-byte secret seed into ``m`` shared ``d``-bit codewords ``z``.

    Deterministic: the same ``(seed, label, m, d, p_x)`` gives the same ``z`` on every machine
    (see the module docstring for the exact construction: HKDF-SHA256 key, ChaCha20 keystream,
    one byte per parameter for ``d <= 8``, a little-endian ``uint16`` for ``9 <= d <= 16``, and
    ``d`` thresholded ``uint16`` words per parameter when ``p_x != 1/2``). The expansion of ``m``
    parameters is a prefix of the expansion of any ``m' > m``.

    Parameters
    ----------
    seed : bytes
        32 secret bytes drawn by the lead from the OS CSPRNG.
    label : bytes
        Non-empty context label, normally :func:`context_label`.
    m : int
        Number of parameters, ``0 <= m <= 2^34``.
    d : int
        Shared bits per parameter, ``1 <= d <= 16``.
    p_x : float, keyword-only, default 0.5
        Probability that a shared bit is ``1`` (CoQ-FL biased codebook), realised on a
        ``2^-16`` grid (:func:`realized_px`).
    device : torch.device or str, optional
        Where to put the result (default CPU). The expansion itself runs on the CPU.

    Returns
    -------
    torch.Tensor
        Shape ``(m,)``, dtype :func:`z_dtype` (``int16`` for ``d <= 15``, ``int32`` for
        ``d = 16``), values in ``[0, 2^d)``.
    """
    seed_b, label_b = _check_seed_label(seed, label)
    m_v = integer(m, "m", 0, MAX_PARAMS)
    d_v = integer(d, "d", 1, MAX_D)
    p16 = px_threshold(p_x)
    dev = _resolve_device(device)
    out = np.empty(m_v, dtype=_np_z_dtype(d_v))
    if m_v:
        key = _derive_key(seed_b, label_b, d_v, p16)
        encryptor = Cipher(algorithms.ChaCha20(key, _NONCE), mode=None).encryptor()
        if p16 == _UNIFORM_P:
            _expand_uniform(encryptor, out, d_v)
        else:
            _expand_biased(encryptor, out, d_v, p16)
    return torch.from_numpy(out).to(dev)


def _expand_uniform(encryptor: object, out: np.ndarray, d: int) -> None:
    m = out.shape[0]
    width = 1 if d <= 8 else 2
    block = min(_BLOCK, m)
    zeros = memoryview(bytes(block * width))
    buf = bytearray(block * width)
    mask = (1 << d) - 1
    src_dtype = np.uint8 if width == 1 else np.dtype("<u2")
    for lo in range(0, m, block):
        n = min(block, m - lo)
        encryptor.update_into(zeros[: n * width], buf)  # type: ignore[attr-defined]
        words = np.frombuffer(buf, dtype=src_dtype, count=n)
        np.bitwise_and(words, mask, out=out[lo : lo + n], casting="unsafe")


def _expand_biased(encryptor: object, out: np.ndarray, d: int, p16: int) -> None:
    m = out.shape[0]
    per = 2 * d
    block = min(_BLOCK // d + 1, m)
    zeros = memoryview(bytes(block * per))
    buf = bytearray(block * per)
    shift = 8 * ((d + 7) // 8) - d
    for lo in range(0, m, block):
        n = min(block, m - lo)
        encryptor.update_into(zeros[: n * per], buf)  # type: ignore[attr-defined]
        words = np.frombuffer(buf, dtype="<u2", count=n * d).reshape(n, d)
        bits = words < p16  # (n, d), column 0 is the MSB
        packed = np.packbits(bits, axis=1)  # MSB first, zero-padded on the right
        if d <= 8:
            np.right_shift(packed[:, 0], shift, out=out[lo : lo + n], casting="unsafe")
        else:
            hi16 = packed[:, 0].astype(np.int32) << 8 | packed[:, 1]
            np.right_shift(hi16, shift, out=out[lo : lo + n], casting="unsafe")


# ------------------------------------------------------------------------------ exact mode
def _z_numpy(z: object, d: int) -> np.ndarray:
    if not isinstance(z, torch.Tensor):
        raise TypeError(f"z must be an integer torch.Tensor, got {type(z).__name__}")
    if z.dtype.is_floating_point or z.dtype.is_complex or z.dtype == torch.bool:
        raise TypeError(f"z must have an integer dtype, got {z.dtype}")
    flat = z.detach().reshape(-1)
    if flat.numel():
        lo, hi = torch.aminmax(flat)
        if int(lo) < 0 or int(hi) >= (1 << d):
            raise ValueError(
                f"z must lie in [0, 2**d) = [0, {1 << d}), got min {int(lo)}, max {int(hi)}"
            )
    return flat.cpu().numpy()


def pack_z(z: torch.Tensor, d: int) -> bytes:
    """Exact mode: bit-pack ``m`` codewords of ``d`` bits, ``ceil(d*m/8)`` bytes.

    The paper's Algorithm 3 line 17 (the lead ships ``Z`` itself): codeword ``j`` occupies bits
    ``d*j .. d*j + d - 1`` of the stream, MSB first, and the stream is packed 8 bits per byte,
    most significant bit first (``np.packbits`` order); the last byte is zero-padded.

    Parameters
    ----------
    z : torch.Tensor
        Integer tensor (any shape, flattened in C order) with values in ``[0, 2^d)``.
    d : int
        Bits per codeword, ``1 <= d <= 16``.

    Returns
    -------
    bytes
        Exactly ``ceil(d * z.numel() / 8)`` bytes.
    """
    d_v = integer(d, "d", 1, MAX_D)
    zn = _z_numpy(z, d_v)
    m = zn.shape[0]
    chunks: list[bytes] = []
    block = 8 * (_BLOCK // 8)  # a multiple of 8 codewords is a whole number of bytes
    for lo in range(0, m, block):
        part = zn[lo : lo + block]
        bits = np.empty((part.shape[0], d_v), dtype=np.uint8)
        for k in range(d_v):  # column k holds bit d-1-k (MSB first)
            np.bitwise_and(part >> (d_v - 1 - k), 1, out=bits[:, k], casting="unsafe")
        chunks.append(np.packbits(bits.reshape(-1)).tobytes())
    return b"".join(chunks)


def unpack_z(
    buf: bytes, m: int, d: int, *, device: torch.device | str | None = None
) -> torch.Tensor:
    """Inverse of :func:`pack_z`: ``m`` codewords of ``d`` bits from ``ceil(d*m/8)`` bytes.

    Parameters
    ----------
    buf : bytes
        The packed codewords; the length must be exactly ``ceil(d*m/8)`` and the padding bits
        of the last byte must be zero (anything else is rejected as malformed or tampered).
    m : int
        Number of codewords, ``>= 0``.
    d : int
        Bits per codeword, ``1 <= d <= 16``.
    device : torch.device or str, optional
        Where to put the result (default CPU).

    Returns
    -------
    torch.Tensor
        Shape ``(m,)``, dtype :func:`z_dtype`.
    """
    if not isinstance(buf, bytes | bytearray | memoryview):
        raise TypeError(f"buf must be bytes, got {type(buf).__name__}")
    m_v = integer(m, "m", 0, MAX_PARAMS)
    d_v = integer(d, "d", 1, MAX_D)
    dev = _resolve_device(device)
    raw = np.frombuffer(buf, dtype=np.uint8)
    nbits = d_v * m_v
    expected = (nbits + 7) // 8
    if raw.shape[0] != expected:
        raise ValueError(
            f"packed z must be exactly ceil(d*m/8) = {expected} bytes, got {raw.shape[0]}"
        )
    pad = 8 * expected - nbits
    if pad and int(raw[-1]) & ((1 << pad) - 1):
        raise ValueError("padding bits of packed z are not zero (malformed or tampered)")
    out = np.empty(m_v, dtype=_np_z_dtype(d_v))
    block = 8 * (_BLOCK // 8)
    for lo in range(0, m_v, block):
        n = min(block, m_v - lo)
        byte_lo = lo * d_v // 8
        bits = np.unpackbits(raw[byte_lo : byte_lo + (n * d_v + 7) // 8], count=n * d_v)
        cols = bits.reshape(n, d_v)
        acc = out[lo : lo + n]
        acc.fill(0)
        for k in range(d_v):  # column k holds bit d-1-k (MSB first)
            acc |= cols[:, k].astype(acc.dtype) << (d_v - 1 - k)
    return torch.from_numpy(out).to(dev)
