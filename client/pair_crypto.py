"""Pairwise cryptography of CorBin-FL: X25519 key agreement, HKDF-SHA256, AES-GCM blobs.

This is paper Alg. 3 line 1 (``DIFFIEHELLMANEXCHANGE``) and line 8 (``ENCRYPTEXCHANGE``) made
concrete. Every derived key is domain-separated: the HKDF ``info`` names the protocol version
(:data:`corbin_fl.wire.PROTOCOL_VERSION`), the purpose, the run, the round and both node ids in
canonical (ascending) order, so a key of one run, round or pair is useless in any other. Every
ciphertext's AAD binds version, run, round, sender and recipient, so the server can neither replay
a blob into another round or pair nor swap the two blobs of a pair without failing authentication.

Key pairs are fresh per round (forward secrecy across rounds); private keys never leave the node
(they live in ``context.state``). All randomness here comes from the OS CSPRNG.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import struct
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from corbin_fl.mechanisms.validate import require, why_at_least
from corbin_fl.wire import KEY_BYTES, NONCE_BYTES, PROTOCOL_VERSION, SEED_BYTES, blob_len

logger = logging.getLogger(__name__)

_U64 = struct.Struct(">Q")


class PairCryptoError(ValueError):
    """A pairwise-crypto input is malformed (bad key, bad length, bad ids)."""


class BlobAuthError(PairCryptoError):
    """A blob failed AES-GCM authentication: wrong key, round, pair, sender, or tampered."""


@dataclass(frozen=True)
class PairContext:
    """What a pair key and its blobs are bound to (the HKDF ``info`` and AEAD AAD).

    Attributes
    ----------
    run_id : int
        Flower run id (unsigned 64-bit).
    round : int
        Federated round ``t >= 1``.
    self_id : int
        This node's id (unsigned 64-bit).
    partner_id : int
        The partner's node id, different from ``self_id``.
    """

    run_id: int
    round: int
    self_id: int
    partner_id: int

    def __post_init__(self) -> None:
        for name in ("run_id", "round", "self_id", "partner_id"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
            if not 0 <= value < 2**64:
                raise PairCryptoError(f"{name} must fit in an unsigned 64-bit integer, got {value}")
        require("round", why_at_least(self.round, 1), PairCryptoError)
        if self.self_id == self.partner_id:
            raise PairCryptoError(f"a node cannot pair with itself (node {self.self_id})")

    @property
    def low_high(self) -> tuple[int, int]:
        """Both node ids in canonical (ascending) order."""
        return min(self.self_id, self.partner_id), max(self.self_id, self.partner_id)

    def info(self, purpose: str) -> bytes:
        """HKDF ``info``: ``version | purpose | run | round | min(id) | max(id)``."""
        low, high = self.low_high
        return b"|".join(
            (
                PROTOCOL_VERSION.encode(),
                purpose.encode(),
                _U64.pack(self.run_id),
                _U64.pack(self.round),
                _U64.pack(low),
                _U64.pack(high),
            )
        )

    def aad(self, sender: int, recipient: int) -> bytes:
        """AEAD associated data: ``version | "blob" | run | round | sender | recipient``."""
        if {sender, recipient} != {self.self_id, self.partner_id}:
            raise PairCryptoError(
                f"sender/recipient ({sender}, {recipient}) are not the pair "
                f"({self.self_id}, {self.partner_id})"
            )
        return b"|".join(
            (
                PROTOCOL_VERSION.encode(),
                b"blob",
                _U64.pack(self.run_id),
                _U64.pack(self.round),
                _U64.pack(sender),
                _U64.pack(recipient),
            )
        )


# ------------------------------------------------------------------------------ keys
def generate_keypair() -> tuple[bytes, bytes]:
    """Fresh X25519 key pair from the OS CSPRNG.

    Returns
    -------
    tuple[bytes, bytes]
        ``(private_key, public_key)``, 32 raw bytes each.
    """
    private = X25519PrivateKey.generate()
    return private.private_bytes_raw(), private.public_key().public_bytes_raw()


def check_public_key(public_key: object) -> bytes:
    """Validate the encoding of an X25519 public key.

    Parameters
    ----------
    public_key : object
        Candidate key; must be 32 raw bytes.

    Returns
    -------
    bytes
        The key unchanged.

    Raises
    ------
    PairCryptoError
        If it is not ``bytes`` of length 32. Low-order points are caught by
        :func:`shared_secret` (the all-zero shared secret is refused there).
    """
    if not isinstance(public_key, bytes):
        raise PairCryptoError(f"public key must be bytes, got {type(public_key).__name__}")
    if len(public_key) != KEY_BYTES:
        raise PairCryptoError(f"public key must be {KEY_BYTES} bytes, got {len(public_key)}")
    return public_key


def shared_secret(private_key: bytes, partner_public_key: bytes) -> bytes:
    """X25519 Diffie-Hellman (RFC 7748 Sec. 6.1): ``X25519(a, B)``.

    Parameters
    ----------
    private_key : bytes
        Own 32-byte private key.
    partner_public_key : bytes
        Partner's 32-byte public key.

    Returns
    -------
    bytes
        The 32-byte shared secret.

    Raises
    ------
    PairCryptoError
        Bad key lengths, or a low-order public key (all-zero shared secret, which
        ``cryptography`` refuses).
    """
    if not isinstance(private_key, bytes) or len(private_key) != KEY_BYTES:
        raise PairCryptoError(f"private key must be {KEY_BYTES} bytes")
    check_public_key(partner_public_key)
    try:
        own = X25519PrivateKey.from_private_bytes(private_key)
        return own.exchange(X25519PublicKey.from_public_bytes(partner_public_key))
    except ValueError as exc:
        raise PairCryptoError(f"invalid partner public key: {exc}") from exc


def hkdf(secret: bytes, info: bytes, length: int) -> bytes:
    """HKDF-SHA256 (RFC 5869) with an all-zero salt, the given ``info`` and output ``length``."""
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=None, info=info).derive(secret)


def derive_pair_key(private_key: bytes, partner_public_key: bytes, ctx: PairContext) -> bytes:
    """The pair's AES-256-GCM key ``K_{i,p_i}`` (Alg. 3 line 1).

    ``K = HKDF-SHA256(X25519(sk_self, pk_partner), info=version|pair-key|run|round|lo|hi)``.
    Both partners derive the same key (X25519 is symmetric and the ids are canonically ordered);
    any other run, round or pair gives an independent key.
    """
    return hkdf(shared_secret(private_key, partner_public_key), ctx.info("pair-key"), KEY_BYTES)


@dataclass(frozen=True)
class DerivedRandomness:
    """Common randomness of ``cr-mode = derived`` (no blob on the wire).

    Attributes
    ----------
    seed : bytes
        32-byte seed of ``z`` (``mechanisms.randomness.expand_seed``).
    role_bit : int
        Bit ``b``; each side calls ``is_lead(self, partner, b, 0)``, which by Alg. 3 lines 9-12
        makes ``min(id)`` the lead when ``b = 0`` and ``max(id)`` when ``b = 1``: opposite roles.
    """

    seed: bytes
    role_bit: int


def derive_randomness(
    private_key: bytes, partner_public_key: bytes, ctx: PairContext
) -> DerivedRandomness:
    """Seed and role bit of ``cr-mode = derived``, from HKDF of the X25519 secret.

    ``seed || b = HKDF-SHA256(X25519(sk, pk'), info=version|derived-randomness|run|round|lo|hi,
    L=33)``, role bit ``b mod 2``. Both partners compute the same values; the server, which lacks
    both private keys, learns neither.
    """
    out = hkdf(
        shared_secret(private_key, partner_public_key),
        ctx.info("derived-randomness"),
        SEED_BYTES + 1,
    )
    return DerivedRandomness(seed=out[:SEED_BYTES], role_bit=out[SEED_BYTES] & 1)


# ------------------------------------------------------------------------------ blobs
def draw_y() -> int:
    """``Y = BINRAND(1/2)`` of Alg. 3 lines 6-7, from the CSPRNG."""
    return secrets.randbits(1)


def draw_seed() -> bytes:
    """A fresh 32-byte common-randomness seed from the CSPRNG."""
    return secrets.token_bytes(SEED_BYTES)


def seal_blob(pair_key: bytes, y: int, secret: bytes, ctx: PairContext) -> bytes:
    """Encrypt ``Y || secret`` to the partner (Alg. 3 line 8, ENCRYPTEXCHANGE).

    Parameters
    ----------
    pair_key : bytes
        32-byte key from :func:`derive_pair_key`.
    y : int
        Own role bit ``Y`` in {0, 1}.
    secret : bytes
        The seed (relay mode) or packed ``z`` bits (exact mode).
    ctx : PairContext
        Binding; sender is ``ctx.self_id``, recipient ``ctx.partner_id``.

    Returns
    -------
    bytes
        ``nonce (12) || AES-256-GCM(pair_key, nonce, Y || secret, aad) (with 16-byte tag)``;
        its length depends only on ``len(secret)``, never on ``Y`` or the role.
    """
    if len(pair_key) != KEY_BYTES:
        raise PairCryptoError(f"pair key must be {KEY_BYTES} bytes, got {len(pair_key)}")
    if y not in (0, 1) or isinstance(y, bool):
        raise PairCryptoError(f"Y must be 0 or 1, got {y!r}")
    if not isinstance(secret, bytes):
        raise PairCryptoError(f"secret must be bytes, got {type(secret).__name__}")
    nonce = os.urandom(NONCE_BYTES)
    aad = ctx.aad(ctx.self_id, ctx.partner_id)
    return nonce + AESGCM(pair_key).encrypt(nonce, bytes([y]) + secret, aad)


def open_blob(
    pair_key: bytes, blob: object, ctx: PairContext, secret_len: int
) -> tuple[int, bytes]:
    """Authenticate and decrypt the partner's blob.

    Parameters
    ----------
    pair_key : bytes
        32-byte pair key.
    blob : object
        Candidate blob (must be ``bytes`` of :func:`blob_size` ``(secret_len)``).
    ctx : PairContext
        Binding; the blob must have been sealed by ``ctx.partner_id`` for ``ctx.self_id``.
    secret_len : int
        Expected secret length.

    Returns
    -------
    tuple[int, bytes]
        The partner's ``(Y, secret)``.

    Raises
    ------
    PairCryptoError
        Wrong type or size, or a decrypted ``Y`` outside {0, 1}.
    BlobAuthError
        The tag does not verify (another key, run, round or pair, swapped direction, tampered).
    """
    if not isinstance(blob, bytes):
        raise PairCryptoError(f"blob must be bytes, got {type(blob).__name__}")
    if len(blob) != blob_len(secret_len):
        raise PairCryptoError(f"blob must be {blob_len(secret_len)} bytes, got {len(blob)}")
    aad = ctx.aad(ctx.partner_id, ctx.self_id)
    try:
        plain = AESGCM(pair_key).decrypt(blob[:NONCE_BYTES], blob[NONCE_BYTES:], aad)
    except InvalidTag as exc:
        raise BlobAuthError("blob failed AES-GCM authentication") from exc
    if plain[0] not in (0, 1):
        raise PairCryptoError(f"decrypted Y must be 0 or 1, got {plain[0]}")
    return plain[0], plain[1:]


def z_digest(z_packed: bytes) -> bytes:
    """Test-only fingerprint of a pair's common randomness: ``SHA-256(prefix || z)``.

    The prefix domain-separates it from every other hash of the protocol. Only sent when the
    run config sets ``test-z-digest``.
    """
    return hashlib.sha256(PROTOCOL_VERSION.encode() + b"|test-z-digest|" + z_packed).digest()
