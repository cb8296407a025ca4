"""Shamir sharing (corbin_fl.secagg.shamir): round trips, every misuse, perfect secrecy."""

from __future__ import annotations

import itertools
import secrets
from collections import Counter

import pytest

from corbin_fl.secagg.shamir import (
    MERSENNE_521,
    SHARE_BYTES,
    ShamirError,
    ShamirField,
    combine_shares,
    decode_share,
    encode_share,
    split_secret,
)


@pytest.mark.parametrize(("t", "n"), [(1, 1), (1, 3), (2, 3), (3, 5), (5, 5), (7, 12)])
def test_any_t_shares_recover_the_secret(t: int, n: int) -> None:
    secret = secrets.token_bytes(32)
    holders = [11 * i + 5 for i in range(n)]
    shares = split_secret(secret, t, holders)
    assert sorted(shares) == holders and all(len(s) == SHARE_BYTES for s in shares.values())
    for subset in itertools.islice(itertools.combinations(holders, t), 20):
        assert combine_shares({h: shares[h] for h in subset}, t, 32) == secret
    assert combine_shares(list(shares.values()), t, 32) == secret  # more than t: consistent


def test_secret_lengths_and_leading_zeros() -> None:
    for secret in (b"\x00" * 31 + b"\x01", b"\x00" * 64, b"\xff" * 64, b"a"):
        shares = split_secret(secret, 2, [1, 2, 3])
        assert combine_shares([shares[1], shares[3]], 2, len(secret)) == secret


@pytest.mark.parametrize(
    ("holders", "t", "match"),
    [
        ([1, 2, 2], 2, "duplicate"),
        ([0, 1, 2], 2, "zero"),
        ([1, 2, 3], 4, "exceeds"),
        ([1, 2, 3], 0, "positive"),
        ([1, True, 3], 2, "integer"),
        ([1, MERSENNE_521, 3], 2, "zero"),
    ],
)
def test_split_refuses_bad_requests(holders: list[int], t: int, match: str) -> None:
    with pytest.raises(ShamirError, match=match):
        split_secret(b"s" * 32, t, holders)


def test_split_refuses_bad_secrets() -> None:
    for secret in (b"", b"x" * 65, "text"):
        with pytest.raises(ShamirError, match="secret"):
            split_secret(secret, 2, [1, 2])  # type: ignore[arg-type]


def test_combine_refuses_bad_share_sets() -> None:
    shares = split_secret(b"k" * 32, 3, [4, 5, 6, 7])
    with pytest.raises(ShamirError, match="exceeds"):  # too few
        combine_shares([shares[4], shares[5]], 3, 32)
    with pytest.raises(ShamirError, match="duplicate"):
        combine_shares([shares[4], shares[4], shares[5]], 3, 32)
    with pytest.raises(ShamirError, match="bytes"):  # wrong length
        combine_shares([shares[4], shares[5], shares[6][:-1]], 3, 32)
    with pytest.raises(ShamirError, match="x = 0"):
        combine_shares([shares[4], shares[5], encode_share(0, 1)], 3, 32)
    with pytest.raises(ShamirError, match="carries"):  # holder and x disagree
        combine_shares({4: shares[4], 5: shares[5], 9: shares[6]}, 3, 32)
    x, y = decode_share(shares[7])
    with pytest.raises(ShamirError, match="inconsistent"):
        combine_shares(
            [shares[4], shares[5], shares[6], encode_share(x, (y + 1) % MERSENNE_521)], 3, 32
        )
    with pytest.raises(ShamirError, match="GF"):
        decode_share(encode_share(3, MERSENNE_521 - 1)[:8] + b"\xff" * 66)


@pytest.mark.parametrize(("p", "t", "xs"), [(13, 3, (1, 2)), (11, 2, (5,)), (7, 4, (1, 3, 5))])
def test_t_minus_1_shares_are_uniform_whatever_the_secret(p: int, t: int, xs: tuple) -> None:
    """Perfect secrecy, exactly: over GF(p), enumerate every coefficient vector; for EVERY secret
    the t - 1 shares at ``xs`` take every value tuple exactly once (so their law is the same
    uniform law on GF(p)^(t-1) for every secret)."""
    field = ShamirField(p)
    assert len(xs) == t - 1
    holders = [*xs, p - 1]  # one honest holder besides the t - 1 colluders
    for secret in range(p):
        counts = Counter(
            tuple(y for _, y in field.split(secret, t, holders, coefficients=list(coef))[:-1])
            for coef in itertools.product(range(p), repeat=t - 1)
        )
        assert len(counts) == p ** (t - 1) and set(counts.values()) == {1}


def test_colluders_shares_fit_every_secret_in_the_real_field() -> None:
    """t - 1 real shares: for any candidate secret there is a degree-(t-1) polynomial through
    (0, candidate) and all of them, so the colluders cannot rule out any secret."""
    field = ShamirField()
    t, holders = 4, [3, 8, 21, 34, 55]
    shares = field.split(secrets.randbelow(2**256), t, holders)
    held = shares[: t - 1]
    for candidate in (0, 1, secrets.randbelow(2**256)):
        poly_points = [(0, candidate), *held]  # t points define the polynomial
        for x, y in held:
            assert field.interpolate(poly_points, x) == y
        assert field.interpolate(poly_points, 0) == candidate
