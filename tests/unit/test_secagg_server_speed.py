"""The SecAgg server's fast paths equal their references (issue 29, server CPU at n = 100).

:class:`corbin_fl.secagg.shamir.LagrangeBasis` (one batched inverse per set of x's) against the
textbook Lagrange formula with one inverse per term, and :func:`corbin_fl.secagg.prg.expand`
(keystream written in place, reduced in one pass) against ``update`` + ``astype`` + ``&=``, the
stream as first released: bit-for-bit, no timing.
"""

from __future__ import annotations

import random
import secrets

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from corbin_fl.secagg import prg
from corbin_fl.secagg.shamir import MERSENNE_521, LagrangeBasis, ShamirError, ShamirField


def _reference_interpolate(points: list[tuple[int, int]], at: int, p: int) -> int:
    total = 0
    for i, (xi, yi) in enumerate(points):
        num, den = 1, 1
        for j, (xj, _) in enumerate(points):
            if j != i:
                num = num * (at - xj) % p
                den = den * (xi - xj) % p
        total = (total + yi * num * pow(den, -1, p)) % p
    return total


def _reference_expand(key: bytes, length: int, bits: int) -> np.ndarray:
    word = np.dtype("<u4") if bits <= 32 else np.dtype("<u8")
    encryptor = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor()
    stream = encryptor.update(bytes(length * word.itemsize))
    values: np.ndarray = np.frombuffer(stream, dtype=word).astype(np.uint64)
    values &= np.uint64((1 << bits) - 1)
    return values


@pytest.mark.parametrize("prime", [13, 101, 2**61 - 1, MERSENNE_521])
@pytest.mark.parametrize("t", [1, 2, 5, 11])
def test_lagrange_basis_equals_the_textbook_formula(prime: int, t: int) -> None:
    rng = random.Random(prime * 31 + t)
    xs = [0] if t > 2 else []  # x = 0 is allowed, as ShamirField.interpolate allows it
    while len(xs) < t:
        x = rng.randrange(1, min(prime, 2**64))
        xs += [x] if x not in xs else []
    ys = [rng.randrange(prime) for _ in xs]
    basis = LagrangeBasis(prime, xs)
    targets = [0, 1, prime - 1, *xs, *(rng.randrange(prime) for _ in range(5))]
    for at in targets:
        expected = _reference_interpolate(list(zip(xs, ys, strict=True)), at, prime)
        assert basis.evaluate(ys, at) == expected
        assert ShamirField(prime).interpolate(list(zip(xs, ys, strict=True)), at) == expected
    for i, x in enumerate(xs):  # at a node of the basis: that node's value
        assert basis.evaluate(ys, x) == ys[i]


def test_lagrange_basis_checks_its_inputs() -> None:
    with pytest.raises(ShamirError):
        LagrangeBasis(101, [3, 3])
    with pytest.raises(ShamirError):
        LagrangeBasis(101, [3, 101])
    with pytest.raises(ShamirError):
        LagrangeBasis(101, [1, 2]).evaluate([5], 0)
    assert LagrangeBasis(101, []).evaluate([], 7) == 0


def test_the_server_basis_recovers_secrets_and_finds_wrong_shares() -> None:
    field = ShamirField(MERSENNE_521)
    secret = int.from_bytes(secrets.token_bytes(32), "big")
    holders = [2**64 - 1 - 977 * i for i in range(20)]  # Flower-sized node ids
    shares = dict(field.split(secret, 11, holders))
    shares[holders[3]] = (shares[holders[3]] + 1) % MERSENNE_521  # not among the first t
    subset = sorted(holders)[:11]
    basis = LagrangeBasis(MERSENNE_521, subset, checked=True)
    ys = [shares[x] for x in subset]
    assert basis.evaluate(ys, 0) == secret
    bad = [x for x in sorted(holders) if x not in subset and basis.evaluate(ys, x) != shares[x]]
    assert bad == [holders[3]]


@pytest.mark.parametrize("bits", [1, 7, 31, 32, 33, 62])
@pytest.mark.parametrize("length", [0, 1, 3, 16, 1001, 421_642])
def test_expand_is_the_released_stream(bits: int, length: int) -> None:
    key = secrets.token_bytes(32)
    got = prg.expand(key, length, bits)
    assert got.dtype == np.uint64 and got.shape == (length,)
    assert np.array_equal(got, _reference_expand(key, length, bits))
