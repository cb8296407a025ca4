"""t-out-of-n Shamir secret sharing over a prime field (Shamir 1979), as SecAgg uses it.

A secret ``s`` in GF(p) is the constant term of a random polynomial of degree ``t - 1``,

    f(x) = s + a_1 x + ... + a_{t-1} x^{t-1}  (mod p),   a_i uniform in GF(p) (CSPRNG),

and the share of holder ``i`` is ``(x_i, f(x_i))`` for distinct non-zero ``x_i``. Any ``t``
shares give ``s = f(0) = sum_i y_i prod_{j != i} x_j / (x_j - x_i)`` (Lagrange at 0); any
``t - 1`` shares are uniformly distributed whatever ``s`` is (perfect secrecy: for every ``s``
exactly one polynomial of degree ``t - 1`` passes through ``(0, s)`` and the ``t - 1`` points).
Bonawitz et al. 2017 ("Practical Secure Aggregation for Privacy-Preserving Machine Learning")
share each client's self-mask seed and mask key this way; Bell et al. 2020 ("Secure
Single-Server Aggregation with (Poly)Logarithmic Overhead") share them among a client's ``k``
neighbours only.

The byte layer works over the Mersenne prime ``p = 2^521 - 1``: a secret of up to 64 bytes is an
integer below ``2^512 < p``, so no chunking is needed. A share is ``x`` (8 bytes, big-endian, the
holder's node id) followed by ``y`` (66 bytes, big-endian).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from typing import Final

MERSENNE_521: Final[int] = 2**521 - 1
"""The field's prime for the byte layer (a Mersenne prime; ``2^521 - 1 > 2^512``)."""

MAX_SECRET_BYTES: Final[int] = 64
"""The longest secret the byte layer shares (``256^64 = 2^512 < p``)."""

X_BYTES: Final[int] = 8
Y_BYTES: Final[int] = (MERSENNE_521.bit_length() + 7) // 8  # 66
SHARE_BYTES: Final[int] = X_BYTES + Y_BYTES
"""Length of one encoded share: ``x`` (8 bytes) then ``y`` (66 bytes), both big-endian."""


class ShamirError(ValueError):
    """A sharing request or a set of shares that cannot be valid."""


class ShamirField:
    """Shamir sharing of integers over GF(prime); one instance per prime.

    Parameters
    ----------
    prime
        The field's modulus; must be an odd prime (not checked beyond ``prime > 2``: the default
        is the Mersenne prime ``2^521 - 1``; tests use small primes to enumerate exactly).
    """

    def __init__(self, prime: int = MERSENNE_521) -> None:
        if not isinstance(prime, int) or prime <= 2:
            raise ShamirError(f"prime must be an integer above 2, got {prime!r}")
        self.prime = prime

    # ------------------------------------------------------------------ validation
    def _check_threshold(self, threshold: int, available: int) -> None:
        if not isinstance(threshold, int) or isinstance(threshold, bool) or threshold < 1:
            raise ShamirError(f"threshold must be a positive integer, got {threshold!r}")
        if threshold > available:
            raise ShamirError(f"threshold {threshold} exceeds the {available} share(s) available")

    def _check_xs(self, xs: Sequence[int], allow_zero: bool = False) -> None:
        seen: set[int] = set()
        for x in xs:
            if not isinstance(x, int) or isinstance(x, bool):
                raise ShamirError(f"x-coordinate must be an integer, got {x!r}")
            if x % self.prime == 0 and not (allow_zero and x == 0):
                raise ShamirError(f"x-coordinate {x} is zero in GF(p): it would reveal the secret")
            if not 0 <= x < self.prime:
                raise ShamirError(f"x-coordinate {x} is outside 1..p-1")
            if x in seen:
                raise ShamirError(f"duplicate x-coordinate {x}")
            seen.add(x)

    # ------------------------------------------------------------------ sharing
    def split(
        self,
        secret: int,
        threshold: int,
        xs: Sequence[int],
        coefficients: Sequence[int] | None = None,
    ) -> list[tuple[int, int]]:
        """Shares ``(x, f(x))`` of ``secret`` for each ``x`` in ``xs``.

        ``coefficients`` (``a_1 .. a_{t-1}``) default to CSPRNG draws (``secrets.randbelow``);
        passing them is for exhaustive tests only.
        """
        self._check_xs(xs)
        self._check_threshold(threshold, len(xs))
        if not isinstance(secret, int) or not 0 <= secret < self.prime:
            raise ShamirError("secret must be an integer in [0, p)")
        if coefficients is None:
            coefficients = [secrets.randbelow(self.prime) for _ in range(threshold - 1)]
        elif len(coefficients) != threshold - 1:
            raise ShamirError(f"need {threshold - 1} coefficients, got {len(coefficients)}")
        poly = [secret, *coefficients]
        return [(x, self._eval(poly, x)) for x in xs]

    def _eval(self, poly: Sequence[int], x: int) -> int:
        acc = 0
        for a in reversed(poly):  # Horner
            acc = (acc * x + a) % self.prime
        return acc

    def interpolate(self, shares: Sequence[tuple[int, int]], at: int = 0) -> int:
        """``f(at)`` of the unique polynomial of degree ``len(shares) - 1`` through ``shares``.

        Points may include ``x = 0`` here (e.g. a candidate secret ``(0, s)``).
        """
        xs = [x for x, _ in shares]
        self._check_xs(xs, allow_zero=True)
        p = self.prime
        for xi, yi in shares:
            if not 0 <= yi < p:
                raise ShamirError(f"share value for x={xi} is outside GF(p)")
        return LagrangeBasis(p, xs, checked=True).evaluate([y for _, y in shares], at)

    def combine(self, shares: Sequence[tuple[int, int]], threshold: int) -> int:
        """The secret from at least ``threshold`` shares (the first ``threshold`` by ``x``).

        Raises :class:`ShamirError` on too few shares, duplicate or zero ``x``; extra shares must
        lie on the same polynomial, else :class:`ShamirError` names the ones that do not.
        """
        self._check_xs([x for x, _ in shares])
        self._check_threshold(threshold, len(shares))
        ordered = sorted(shares)
        base = ordered[:threshold]
        for x, y in base:
            if not 0 <= y < self.prime:
                raise ShamirError(f"share value for x={x} is outside GF(p)")
        basis = LagrangeBasis(self.prime, [x for x, _ in base], checked=True)
        ys = [y for _, y in base]
        bad = [x for x, y in ordered[threshold:] if basis.evaluate(ys, x) != y]
        if bad:
            raise ShamirError(f"shares at x={bad} are inconsistent with the others")
        return basis.evaluate(ys, 0)


class LagrangeBasis:
    """Lagrange interpolation over GF(prime) through a fixed set of x-coordinates.

    For distinct ``xs = (x_1 .. x_t)`` and any point ``a``, the polynomial ``f`` of degree
    ``< t`` with ``f(x_i) = y_i`` has ``f(a) = sum_i c_i(a) y_i`` with

        c_i(a) = prod_{j != i} (a - x_j) / prod_{j != i} (x_i - x_j)   (mod p).

    The denominators depend on the x's only: they are inverted once here, together (one modular
    inverse and ``3 t`` products, Montgomery's batch inversion), and every evaluation then costs
    ``O(t)`` products and no inverse. ``c(0)`` is kept, since secrets are read at ``0``. The
    results are those of :meth:`ShamirField.interpolate` (the same exact field arithmetic),
    which uses this class; the SecAgg server reuses one basis per set of share holders.

    Parameters
    ----------
    prime
        The field's modulus (an odd prime, as for :class:`ShamirField`).
    xs
        Distinct x-coordinates in ``[0, prime)``; :class:`ShamirError` otherwise (``0`` is
        allowed, as :meth:`ShamirField.interpolate` allows it).
    checked
        The caller has validated ``xs`` already (skips the check).
    """

    def __init__(self, prime: int, xs: Sequence[int], *, checked: bool = False) -> None:
        if not checked:
            ShamirField(prime)._check_xs(xs, allow_zero=True)
        p = prime
        self.prime = p
        self.xs: tuple[int, ...] = tuple(xs)
        t = len(self.xs)
        dens = []
        for i, xi in enumerate(self.xs):
            den = 1
            for j, xj in enumerate(self.xs):
                if j != i:
                    den = den * (xi - xj) % p
            dens.append(den)
        # Batch inversion: prefix[i] = dens[0] .. dens[i-1]; one pow for the whole product.
        prefix = [1] * (t + 1)
        for i, den in enumerate(dens):
            prefix[i + 1] = prefix[i] * den % p
        inv = pow(prefix[t], -1, p) if t else 1
        inv_dens = [0] * t
        for i in range(t - 1, -1, -1):
            inv_dens[i] = inv * prefix[i] % p
            inv = inv * dens[i] % p
        self._inv_dens = inv_dens
        self._at_zero = self._coefficients(0)

    def coefficients(self, at: int) -> tuple[int, ...]:
        """``c_i(at)`` for each ``x_i`` (``f(at) = sum_i c_i(at) y_i``); ``c(0)`` is cached."""
        return self._at_zero if at == 0 else self._coefficients(at)

    def _coefficients(self, at: int) -> tuple[int, ...]:
        p = self.prime
        diffs = [(at - x) % p for x in self.xs]
        t = len(diffs)
        # prod_{j != i} (at - x_j) as prefix[i] * suffix[i + 1]: no division, so a point
        # ``at`` equal to some x_i needs no special case (its coefficient vector is e_i).
        suffix = [1] * (t + 1)
        for i in range(t - 1, -1, -1):
            suffix[i] = suffix[i + 1] * diffs[i] % p
        out = []
        prefix = 1
        for i in range(t):
            out.append(prefix * suffix[i + 1] % p * self._inv_dens[i] % p)
            prefix = prefix * diffs[i] % p
        return tuple(out)

    def evaluate(self, ys: Sequence[int], at: int = 0) -> int:
        """``f(at)`` for the values ``ys`` at ``xs`` (in order; each in ``[0, p)``)."""
        if len(ys) != len(self.xs):
            raise ShamirError(f"{len(ys)} value(s) for {len(self.xs)} x-coordinate(s)")
        total = 0
        for c, y in zip(self.coefficients(at), ys, strict=True):
            total += c * y
        return total % self.prime


_FIELD: Final[ShamirField] = ShamirField()


def encode_share(x: int, y: int) -> bytes:
    """``x`` (8 bytes) || ``y`` (66 bytes), big-endian."""
    return x.to_bytes(X_BYTES, "big") + y.to_bytes(Y_BYTES, "big")


def decode_share(share: bytes) -> tuple[int, int]:
    """The ``(x, y)`` of an encoded share; :class:`ShamirError` on a wrong length or range."""
    if not isinstance(share, bytes) or len(share) != SHARE_BYTES:
        raise ShamirError(
            f"a share is {SHARE_BYTES} bytes, got "
            f"{len(share) if isinstance(share, bytes) else type(share).__name__}"
        )
    x = int.from_bytes(share[:X_BYTES], "big")
    y = int.from_bytes(share[X_BYTES:], "big")
    if x == 0 or y >= MERSENNE_521:
        raise ShamirError("share has x = 0 or y outside GF(p)")
    return x, y


def split_secret(secret: bytes, threshold: int, holders: Sequence[int]) -> dict[int, bytes]:
    """``threshold``-out-of-``len(holders)`` shares of ``secret``; holder ``h`` gets ``x = h``.

    The secret (1..64 bytes) is read as a big-endian integer below ``2^512``; its length is not
    part of the share, so :func:`combine_shares` takes it.
    """
    if not isinstance(secret, bytes) or not 1 <= len(secret) <= MAX_SECRET_BYTES:
        raise ShamirError(f"secret must be 1..{MAX_SECRET_BYTES} bytes")
    value = int.from_bytes(secret, "big")
    return {x: encode_share(x, y) for x, y in _FIELD.split(value, threshold, list(holders))}


def combine_shares(
    shares: Sequence[bytes] | Mapping[int, bytes], threshold: int, length: int
) -> bytes:
    """The ``length``-byte secret from at least ``threshold`` encoded shares.

    With a mapping, each key must equal its share's ``x`` (the holder it came from).
    """
    if not 1 <= length <= MAX_SECRET_BYTES:
        raise ShamirError(f"secret length must be 1..{MAX_SECRET_BYTES}")
    if isinstance(shares, Mapping):
        points = []
        for holder, share in shares.items():
            x, y = decode_share(share)
            if x != holder:
                raise ShamirError(f"share from holder {holder} carries x={x}")
            points.append((x, y))
    else:
        points = [decode_share(s) for s in shares]
    value = _FIELD.combine(points, threshold)
    if value >= 256**length:
        raise ShamirError("reconstructed value does not fit the secret length")
    return value.to_bytes(length, "big")
