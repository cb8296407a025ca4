"""Tests of mechanisms.randomness: seed expansion (HKDF + ChaCha20), labels, exact mode."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from corbin_fl.mechanisms import (
    context_label,
    expand_seed,
    pack_z,
    px_threshold,
    realized_px,
    unpack_z,
    z_dtype,
)

SEED = bytes(range(32))
LABEL = context_label(7, 3, 1001, 42)


# ----------------------------------------------------------------------------- references
def _rotl(v: int, n: int) -> int:
    return ((v << n) | (v >> (32 - n))) & 0xFFFFFFFF


def chacha20_block(key: bytes, counter: int, nonce: bytes) -> bytes:
    """Pure-Python ChaCha20 block function (RFC 8439, section 2.3), independent of OpenSSL."""
    consts = (0x61707865, 0x3320646E, 0x79622D32, 0x6B206574)
    state = [*consts, *struct.unpack("<8I", key), counter, *struct.unpack("<3I", nonce)]
    x = list(state)

    def qr(a: int, b: int, c: int, d: int) -> None:
        x[a] = (x[a] + x[b]) & 0xFFFFFFFF
        x[d] = _rotl(x[d] ^ x[a], 16)
        x[c] = (x[c] + x[d]) & 0xFFFFFFFF
        x[b] = _rotl(x[b] ^ x[c], 12)
        x[a] = (x[a] + x[b]) & 0xFFFFFFFF
        x[d] = _rotl(x[d] ^ x[a], 8)
        x[c] = (x[c] + x[d]) & 0xFFFFFFFF
        x[b] = _rotl(x[b] ^ x[c], 7)

    for _ in range(10):
        qr(0, 4, 8, 12), qr(1, 5, 9, 13), qr(2, 6, 10, 14), qr(3, 7, 11, 15)
        qr(0, 5, 10, 15), qr(1, 6, 11, 12), qr(2, 7, 8, 13), qr(3, 4, 9, 14)
    return struct.pack("<16I", *((a + b) & 0xFFFFFFFF for a, b in zip(x, state, strict=True)))


def reference_key(seed: bytes, label: bytes, d: int, p_x: float) -> bytes:
    """The documented key derivation, written out independently of the module."""
    p16 = round(p_x * 65536)
    info = b"corbin-fl/v1/z-expansion" + bytes([d]) + p16.to_bytes(2, "big") + label
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(seed)


def reference_z(seed: bytes, label: bytes, m: int, d: int, p_x: float = 0.5) -> list[int]:
    """The documented expansion, in plain Python with the pure-Python ChaCha20 block."""
    key = reference_key(seed, label, d, p_x)
    p16 = round(p_x * 65536)
    need = (1 if d <= 8 else 2) * m if p16 == 32768 else 2 * d * m
    ks = b"".join(chacha20_block(key, i, bytes(12)) for i in range((need + 63) // 64))
    out = []
    for j in range(m):
        if p16 == 32768:
            v = ks[j] if d <= 8 else ks[2 * j] | ks[2 * j + 1] << 8
            out.append(v & ((1 << d) - 1))
        else:
            z = 0
            for k in range(d):
                word = int.from_bytes(ks[2 * (j * d + k) : 2 * (j * d + k) + 2], "little")
                z |= int(word < p16) << (d - 1 - k)
            out.append(z)
    return out


# ----------------------------------------------------------------------------- known answers
def test_chacha20_convention_of_cryptography() -> None:
    """`cryptography`'s 16-byte ChaCha20 nonce = LE 32-bit counter || 96-bit nonce (RFC 8439)."""
    key = bytes(range(32))
    nonce = bytes.fromhex("000000090000004a00000000")
    block = chacha20_block(key, 1, nonce)
    # RFC 8439 section 2.3.2 test vector (serialized block).
    assert block[:16].hex() == "10f1e7e4d13b5915500fdd1fa32071c4"
    enc = Cipher(algorithms.ChaCha20(key, (1).to_bytes(4, "little") + nonce), mode=None)
    assert enc.encryptor().update(bytes(64)) == block
    # all-zero key and nonce, counter 0: RFC 7539 appendix A.1 test vector 1
    zero = Cipher(algorithms.ChaCha20(bytes(32), bytes(16)), mode=None).encryptor()
    assert zero.update(bytes(16)).hex() == "76b8e0ada0f13d90405d6ae55386bd28"


def test_known_answer_vectors() -> None:
    """Hard-coded first 16 codewords: any change to the expansion breaks this test."""
    assert LABEL.hex() == (
        "636f7262696e2d666c2f76312f706169722d7a"
        "0000000000000007" "0000000000000003" "000000000000002a" "00000000000003e9"
    )  # fmt: skip
    assert expand_seed(SEED, LABEL, 64, 5)[:16].tolist() == [
        22, 18, 4, 18, 23, 6, 7, 4, 23, 29, 31, 15, 4, 29, 31, 19,
    ]  # fmt: skip
    assert expand_seed(SEED, LABEL, 64, 12)[:16].tolist() == [
        345, 164, 3145, 3902, 3031, 2361, 2320, 1530, 1956, 478, 4048, 2837, 1513, 570, 3724, 2862,
    ]  # fmt: skip
    assert expand_seed(SEED, LABEL, 64, 3, p_x=0.25)[:16].tolist() == [
        0, 2, 5, 0, 2, 2, 0, 2, 7, 0, 0, 2, 0, 3, 1, 0,
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("m", "d", "p_x"),
    [(300, 5, 0.5), (200, 12, 0.5), (130, 16, 0.5), (90, 3, 0.25), (70, 11, 0.8), (101, 1, 0.5)],
)
def test_expansion_matches_independent_reference(m: int, d: int, p_x: float) -> None:
    z = expand_seed(SEED, LABEL, m, d, p_x=p_x)
    assert z.shape == (m,) and z.dtype == z_dtype(d)
    assert z.tolist() == reference_z(SEED, LABEL, m, d, p_x)


def test_large_expansion_matches_numpy_reference() -> None:
    """Across several internal blocks (2^20 parameters each) the stream stays continuous."""
    m, d = (1 << 20) * 2 + 12345, 9
    key = reference_key(SEED, LABEL, d, 0.5)
    ks = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor().update(bytes(2 * m))
    ref = np.frombuffer(ks, dtype="<u2") & 511
    z = expand_seed(SEED, LABEL, m, d)
    assert np.array_equal(z.numpy(), ref)
    mb, db = 300_000, 4  # > 2^20 / d parameters per internal block of the biased expansion
    key = reference_key(SEED, LABEL, db, 0.125)
    ks = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor().update(bytes(8 * mb))
    words = np.frombuffer(ks, dtype="<u2").reshape(mb, db)
    ref_b = ((words < 8192) * np.array([8, 4, 2, 1])).sum(axis=1)
    zb = expand_seed(SEED, LABEL, mb, db, p_x=0.125)
    assert np.array_equal(zb.numpy(), ref_b)
    assert zb[:50].tolist() == reference_z(SEED, LABEL, 50, db, 0.125)


# ----------------------------------------------------------------------------- properties
def test_determinism_prefix_and_device() -> None:
    a = expand_seed(SEED, LABEL, 5000, 7)
    assert torch.equal(a, expand_seed(bytearray(SEED), LABEL, 5000, 7))
    assert torch.equal(a[:1234], expand_seed(SEED, LABEL, 1234, 7))
    assert expand_seed(SEED, LABEL, 0, 7).shape == (0,)
    assert expand_seed(SEED, LABEL, 10, 7, device="cpu").device.type == "cpu"
    assert z_dtype(15) == torch.int16 and z_dtype(16) == torch.int32
    assert int(expand_seed(SEED, LABEL, 20000, 16).max()) > 32767  # int32 needed for d = 16


def _equal_fraction_ok(a: torch.Tensor, b: torch.Tensor, d: int) -> bool:
    p = 2.0**-d
    frac = float((a == b).double().mean())
    return abs(frac - p) <= 5 * math.sqrt(p * (1 - p) / a.numel())


@pytest.mark.parametrize("d", [1, 5, 12])
def test_different_contexts_give_uncorrelated_streams(d: int) -> None:
    m = 100_000
    base = expand_seed(SEED, LABEL, m, d)
    other_label = expand_seed(SEED, context_label(7, 4, 1001, 42), m, d)
    other_seed = expand_seed(bytes(32), LABEL, m, d)
    other_pair = expand_seed(SEED, context_label(7, 3, 1001, 43), m, d)
    for other in (other_label, other_seed, other_pair):
        assert _equal_fraction_ok(base, other, d)
        x = base.double() - base.double().mean()
        y = other.double() - other.double().mean()
        corr = float((x * y).mean() / (x.std() * y.std()))
        assert abs(corr) <= 5 / math.sqrt(m)
    # d and p_x are bound into the key: the low 5 bits of d=6 are not the d=5 stream.
    z6 = expand_seed(SEED, LABEL, m, 6)
    assert _equal_fraction_ok(base if d == 5 else expand_seed(SEED, LABEL, m, 5), z6 & 31, 5)


@pytest.mark.parametrize(("d", "m"), [(1, 1 << 16), (5, 1 << 17), (12, 1 << 20), (16, 1 << 20)])
def test_uniformity_chi_square(d: int, m: int) -> None:
    """Pearson chi-square over the 2^d codewords within 5 sd of its mean (k - 1)."""
    z = expand_seed(SEED, LABEL, m, d).numpy().astype(np.int64)
    k = 1 << d
    counts = np.bincount(z, minlength=k)
    assert counts.shape == (k,)
    expected = m / k
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert abs(chi2 - (k - 1)) <= 5 * math.sqrt(2 * (k - 1))
    for bit in range(d):  # every bit position is fair
        ones = float(((z >> bit) & 1).mean())
        assert abs(ones - 0.5) <= 5 * math.sqrt(0.25 / m)


@pytest.mark.parametrize(("d", "p_x"), [(1, 0.3), (4, 0.3), (6, 0.8), (10, 0.05)])
def test_biased_bits(d: int, p_x: float) -> None:
    """Each shared bit is Bernoulli(P/2^16), pairs of positions independent, z in range."""
    m = 100_000
    p = realized_px(p_x)
    assert p == px_threshold(p_x) / 65536 and abs(p - p_x) <= 2.0**-17
    z = expand_seed(SEED, LABEL, m, d, p_x=p_x).numpy().astype(np.int64)
    assert z.min() >= 0 and z.max() < (1 << d)
    bits = [(z >> (d - 1 - k)) & 1 for k in range(d)]  # k = 0 is the MSB
    se = math.sqrt(p * (1 - p) / m)
    for b in bits:
        assert abs(float(b.mean()) - p) <= 5 * se
    if d > 1:
        both = float((bits[0] & bits[-1]).mean())
        assert abs(both - p * p) <= 5 * math.sqrt(p * p * (1 - p * p) / m)


# ----------------------------------------------------------------------------- labels
def test_context_label_canonical_and_versioned() -> None:
    lab = context_label(1, 2, 10, 20)
    assert lab == context_label(1, 2, 20, 10)
    assert lab.startswith(b"corbin-fl/v1")
    assert len(lab) == len(b"corbin-fl/v1/pair-z") + 32
    labels = {
        context_label(1, 2, 10, 20),
        context_label(2, 2, 10, 20),
        context_label(1, 3, 10, 20),
        context_label(1, 2, 11, 20),
        context_label(1, 2, 10, 21),
    }
    assert len(labels) == 5
    assert context_label(0, 0, 0, 2**64 - 1).endswith(b"\xff" * 8)


@pytest.mark.parametrize(
    ("args", "exc"),
    [
        ((1, 2, 5, 5), ValueError),
        ((-1, 2, 5, 6), ValueError),
        ((1, 2**64, 5, 6), ValueError),
        ((1, 2, True, 6), TypeError),
        ((1, 2, 5.0, 6), TypeError),
    ],
)
def test_context_label_validation(args: tuple[object, ...], exc: type[Exception]) -> None:
    with pytest.raises(exc):
        context_label(*args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"seed": bytes(31)}, ValueError, "32 bytes"),
        ({"seed": bytes(33)}, ValueError, "32 bytes"),
        ({"seed": "x" * 32}, TypeError, "seed must be bytes"),
        ({"label": "label"}, TypeError, "label must be bytes"),
        ({"label": b""}, ValueError, "non-empty"),
        ({"m": -1}, ValueError, "m must be"),
        ({"m": 3.0}, TypeError, "m must be"),
        ({"d": 0}, ValueError, "d must be"),
        ({"d": 17}, ValueError, "d must be"),
        ({"p_x": 0.0}, ValueError, "p_x"),
        ({"p_x": 1.0}, ValueError, "p_x"),
        ({"p_x": math.nan}, ValueError, "p_x"),
        ({"device": 3}, TypeError, "device"),
    ],
)
def test_expand_seed_validation(
    kwargs: dict[str, object], exc: type[Exception], match: str
) -> None:
    args: dict[str, object] = {"seed": SEED, "label": LABEL, "m": 10, "d": 5} | kwargs
    with pytest.raises(exc, match=match):
        expand_seed(**args)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- exact mode
def test_pack_z_layout() -> None:
    """Codewords are concatenated MSB first and packed big-endian within bytes."""
    z = torch.tensor([1, 2, 3], dtype=torch.int16)
    assert pack_z(z, 2) == bytes([0b01101100])
    z5 = torch.tensor([0b10110, 0b00001], dtype=torch.int32)
    assert pack_z(z5, 5) == bytes([0b10110000, 0b01000000])
    assert pack_z(torch.zeros(0, dtype=torch.int32), 5) == b""


@pytest.mark.parametrize("d", [1, 2, 3, 5, 7, 8, 9, 12, 15, 16])
def test_pack_unpack_z_round_trip(d: int) -> None:
    for m in (1, 7, 8, 9, 63, 1001):
        z = expand_seed(SEED, LABEL, m, d)
        buf = pack_z(z, d)
        assert len(buf) == (d * m + 7) // 8
        back = unpack_z(buf, m, d)
        assert back.dtype == z_dtype(d)
        assert torch.equal(back, z)
    big = expand_seed(SEED, LABEL, (1 << 20) + 77, d)  # crosses the internal block size
    assert torch.equal(unpack_z(pack_z(big, d), big.numel(), d), big)


def test_unpack_z_rejects_malformed() -> None:
    z = expand_seed(SEED, LABEL, 5, 3)
    buf = bytearray(pack_z(z, 3))  # 15 bits: one padding bit
    with pytest.raises(ValueError, match="exactly"):
        unpack_z(bytes(buf[:-1]), 5, 3)
    with pytest.raises(ValueError, match="exactly"):
        unpack_z(bytes(buf) + b"\x00", 5, 3)
    buf[-1] |= 1
    with pytest.raises(ValueError, match="padding"):
        unpack_z(bytes(buf), 5, 3)
    with pytest.raises(TypeError):
        unpack_z("abc", 5, 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"\[0, 2\*\*d\)"):
        pack_z(torch.tensor([8]), 3)
    with pytest.raises(TypeError, match="integer"):
        pack_z(torch.tensor([1.0]), 3)
