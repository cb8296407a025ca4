"""Key agreement, share encryption and commitments of the SecAgg+ rounds (no Flower).

* Each client holds two X25519 key pairs per round (Bonawitz et al. 2017, "AdvertiseKeys"):
  ``c`` to encrypt the shares it sends, ``s`` whose agreement ``s_uv = X25519(s_u, s_v^pk)``
  seeds the pairwise mask of ``u`` and ``v``.
* A share ciphertext from ``u`` to ``v`` is AES-256-GCM under
  ``HKDF-SHA256(X25519(c_u, c_v^pk), info = v1/share-key | run | round | u | v)`` with a random
  96-bit nonce and associated data ``v1/share | run | round | u | v``: a ciphertext replayed into
  another run, round or direction fails authentication (``InvalidTag``).
* The server checks a reconstructed self-mask seed against the commitment
  ``SHA-256(v1/commit | run | round | u | b_u)`` the owner sent with its shares (a hash of a
  uniform 256-bit seed hides it), and a reconstructed mask key against the advertised public key.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from .prg import context_info, hkdf

KEY_BYTES: Final[int] = 32
NONCE_BYTES: Final[int] = 12
TAG_BYTES: Final[int] = 16


class DecryptionError(ValueError):
    """A share ciphertext that does not authenticate or does not parse."""


@dataclass(frozen=True)
class KeyPair:
    """An X25519 private key (raw 32 bytes) and its public key."""

    private: bytes
    public: bytes

    @classmethod
    def generate(cls) -> KeyPair:
        """A fresh pair from the OS CSPRNG (``X25519PrivateKey.generate``)."""
        sk = X25519PrivateKey.generate()
        return cls(sk.private_bytes_raw(), sk.public_key().public_bytes_raw())

    def __repr__(self) -> str:  # never print a private key
        return f"KeyPair(public={self.public.hex()[:16]}...)"


def public_of(private: bytes) -> bytes:
    """The X25519 public key of a raw private key."""
    return X25519PrivateKey.from_private_bytes(private).public_key().public_bytes_raw()


def check_public_key(pk: object) -> bytes:
    """``pk`` if it is 32 bytes and loads as an X25519 public key, else ``ValueError``."""
    if not isinstance(pk, bytes) or len(pk) != KEY_BYTES:
        raise ValueError("an X25519 public key is 32 bytes")
    X25519PublicKey.from_public_bytes(pk)
    return pk


def agree(private: bytes, peer_public: bytes) -> bytes:
    """The raw X25519 shared secret (``ValueError`` on a low-order peer key)."""
    return X25519PrivateKey.from_private_bytes(private).exchange(
        X25519PublicKey.from_public_bytes(peer_public)
    )


def _share_key(
    c_private: bytes, peer_c_public: bytes, run_id: int, rnd: int, src: int, dst: int
) -> bytes:
    return hkdf(agree(c_private, peer_c_public), context_info("share-key", run_id, rnd, src, dst))


def encrypt_shares(
    plaintext: bytes,
    *,
    c_private: bytes,
    peer_c_public: bytes,
    run_id: int,
    server_round: int,
    src: int,
    dst: int,
) -> bytes:
    """``nonce || AES-GCM(key_{src->dst}, plaintext, ad = v1/share|run|round|src|dst)``."""
    key = _share_key(c_private, peer_c_public, run_id, server_round, src, dst)
    nonce = secrets.token_bytes(NONCE_BYTES)
    ad = context_info("share", run_id, server_round, src, dst)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, ad)


def decrypt_shares(
    ciphertext: bytes,
    *,
    c_private: bytes,
    peer_c_public: bytes,
    run_id: int,
    server_round: int,
    src: int,
    dst: int,
) -> bytes:
    """The plaintext of :func:`encrypt_shares`; :class:`DecryptionError` if it does not verify."""
    if not isinstance(ciphertext, bytes) or len(ciphertext) < NONCE_BYTES + TAG_BYTES:
        raise DecryptionError("ciphertext too short")
    try:
        key = _share_key(c_private, peer_c_public, run_id, server_round, src, dst)
        ad = context_info("share", run_id, server_round, src, dst)
        return AESGCM(key).decrypt(ciphertext[:NONCE_BYTES], ciphertext[NONCE_BYTES:], ad)
    except (InvalidTag, ValueError) as exc:
        raise DecryptionError(f"share ciphertext from {src} does not authenticate") from exc


def commitment(seed: bytes, run_id: int, server_round: int, owner: int) -> bytes:
    """``SHA-256(v1/commit | run | round | owner || seed)``: binds the self-mask seed."""
    return hashlib.sha256(context_info("commit", run_id, server_round, owner) + seed).digest()
