"""Pairwise crypto: X25519 (RFC 7748 vectors), HKDF binding, AES-GCM blobs and their AAD."""

from __future__ import annotations

import dataclasses

import pytest

from corbin_fl import wire
from corbin_fl.client import pair_crypto as pc

# RFC 7748, Section 6.1 (Curve25519 Diffie-Hellman test vector).
ALICE_SK = bytes.fromhex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
ALICE_PK = bytes.fromhex("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a")
BOB_SK = bytes.fromhex("5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb")
BOB_PK = bytes.fromhex("de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f")
SHARED = bytes.fromhex("4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742")

RUN, RND, A, B = 77, 3, 1111, 2222


def ctx(self_id: int = A, partner: int = B, run: int = RUN, rnd: int = RND) -> pc.PairContext:
    return pc.PairContext(run, rnd, self_id, partner)


def test_rfc7748_shared_secret() -> None:
    assert pc.shared_secret(ALICE_SK, BOB_PK) == SHARED
    assert pc.shared_secret(BOB_SK, ALICE_PK) == SHARED


def test_generate_keypair_is_fresh_and_consistent() -> None:
    sk1, pk1 = pc.generate_keypair()
    sk2, pk2 = pc.generate_keypair()
    assert len(sk1) == len(pk1) == wire.KEY_BYTES
    assert sk1 != sk2 and pk1 != pk2
    assert pc.shared_secret(sk1, pk2) == pc.shared_secret(sk2, pk1)


def test_both_sides_derive_the_same_pair_key() -> None:
    k_a = pc.derive_pair_key(ALICE_SK, BOB_PK, ctx(A, B))
    k_b = pc.derive_pair_key(BOB_SK, ALICE_PK, ctx(B, A))
    assert k_a == k_b and len(k_a) == wire.KEY_BYTES
    assert k_a != SHARED  # never the raw DH output


@pytest.mark.parametrize(
    "other",
    [
        {"run": RUN + 1},
        {"rnd": RND + 1},
        {"partner": B + 1},
        {"self_id": A + 1},
    ],
)
def test_pair_key_binds_run_round_and_ids(other: dict[str, int]) -> None:
    base = pc.derive_pair_key(ALICE_SK, BOB_PK, ctx())
    assert pc.derive_pair_key(ALICE_SK, BOB_PK, ctx(**other)) != base


def test_info_is_canonical_and_versioned() -> None:
    assert ctx(A, B).info("pair-key") == ctx(B, A).info("pair-key")
    assert ctx().info("pair-key").startswith(wire.PROTOCOL_VERSION.encode())
    assert ctx().info("pair-key") != ctx().info("derived-randomness")


def test_derived_mode_same_seed_opposite_roles() -> None:
    from corbin_fl.mechanisms.pairing import is_lead

    seen_bits = set()
    for rnd in range(1, 41):
        ra = pc.derive_randomness(ALICE_SK, BOB_PK, ctx(A, B, rnd=rnd))
        rb = pc.derive_randomness(BOB_SK, ALICE_PK, ctx(B, A, rnd=rnd))
        assert ra == rb and len(ra.seed) == wire.SEED_BYTES
        assert ra.seed != pc.derive_pair_key(ALICE_SK, BOB_PK, ctx(A, B, rnd=rnd))
        lead_a = is_lead(A, B, ra.role_bit, 0)
        lead_b = is_lead(B, A, rb.role_bit, 0)
        assert lead_a != lead_b
        seen_bits.add(ra.role_bit)
    assert seen_bits == {0, 1}  # 40 rounds: both roles occur (fails with prob. 2^-39)


def test_blob_round_trip_and_equal_sizes() -> None:
    key = pc.derive_pair_key(ALICE_SK, BOB_PK, ctx())
    seed = pc.draw_seed()
    blob0 = pc.seal_blob(key, 0, seed, ctx(A, B))
    blob1 = pc.seal_blob(key, 1, pc.draw_seed(), ctx(B, A))
    assert len(blob0) == len(blob1) == wire.blob_len(wire.SEED_BYTES)
    assert pc.open_blob(key, blob0, ctx(B, A), wire.SEED_BYTES) == (0, seed)
    assert pc.open_blob(key, blob1, ctx(A, B), wire.SEED_BYTES)[0] == 1
    assert seed not in blob0  # encrypted


@pytest.mark.parametrize(
    "wrong",
    [
        {"rnd": RND + 1},
        {"run": RUN + 1},
        {"partner": B + 1},
    ],
)
def test_blob_for_another_round_run_or_pair_fails(wrong: dict[str, int]) -> None:
    key = pc.derive_pair_key(ALICE_SK, BOB_PK, ctx())
    blob = pc.seal_blob(key, 1, pc.draw_seed(), ctx(A, B))
    fields = {"run": "run_id", "rnd": "round", "partner": "partner_id"}
    reader = dataclasses.replace(ctx(B, A), **{fields[k]: v for k, v in wrong.items()})
    with pytest.raises(pc.BlobAuthError):
        pc.open_blob(key, blob, reader, wire.SEED_BYTES)


def test_blob_direction_is_bound() -> None:
    key = pc.derive_pair_key(ALICE_SK, BOB_PK, ctx())
    blob = pc.seal_blob(key, 0, pc.draw_seed(), ctx(A, B))
    with pytest.raises(pc.BlobAuthError):  # reflected back to its sender
        pc.open_blob(key, blob, ctx(A, B), wire.SEED_BYTES)


def test_tampered_blob_and_wrong_key_fail() -> None:
    key = pc.derive_pair_key(ALICE_SK, BOB_PK, ctx())
    blob = pc.seal_blob(key, 0, pc.draw_seed(), ctx(A, B))
    for pos in (0, 12, len(blob) - 1):
        bad = bytearray(blob)
        bad[pos] ^= 0x01
        with pytest.raises(pc.BlobAuthError):
            pc.open_blob(key, bytes(bad), ctx(B, A), wire.SEED_BYTES)
    with pytest.raises(pc.BlobAuthError):
        pc.open_blob(bytes(32), blob, ctx(B, A), wire.SEED_BYTES)


def test_malformed_blobs_are_rejected_before_decryption() -> None:
    key = pc.derive_pair_key(ALICE_SK, BOB_PK, ctx())
    blob = pc.seal_blob(key, 0, pc.draw_seed(), ctx(A, B))
    with pytest.raises(pc.PairCryptoError, match="bytes"):
        pc.open_blob(key, blob[:-1], ctx(B, A), wire.SEED_BYTES)
    with pytest.raises(pc.PairCryptoError, match="must be bytes"):
        pc.open_blob(key, "blob", ctx(B, A), wire.SEED_BYTES)
    with pytest.raises(pc.PairCryptoError, match="Y must be 0 or 1"):
        pc.seal_blob(key, 2, pc.draw_seed(), ctx(A, B))


def test_decrypted_y_outside_bit_is_rejected() -> None:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    key = pc.derive_pair_key(ALICE_SK, BOB_PK, ctx())
    nonce = bytes(12)
    blob = nonce + AESGCM(key).encrypt(nonce, b"\x07" + bytes(32), ctx(A, B).aad(A, B))
    with pytest.raises(pc.PairCryptoError, match="decrypted Y"):
        pc.open_blob(key, blob, ctx(B, A), wire.SEED_BYTES)


def test_invalid_public_keys() -> None:
    with pytest.raises(pc.PairCryptoError, match="32 bytes"):
        pc.shared_secret(ALICE_SK, BOB_PK[:31])
    with pytest.raises(pc.PairCryptoError, match="must be bytes"):
        pc.shared_secret(ALICE_SK, "x" * 32)  # type: ignore[arg-type]
    for low_order in (bytes(32), (1).to_bytes(32, "little")):
        with pytest.raises(pc.PairCryptoError, match="invalid partner public key"):
            pc.derive_pair_key(ALICE_SK, low_order, ctx())
        with pytest.raises(wire.WireError):
            wire.check_pubkey(low_order)
    assert wire.check_pubkey(BOB_PK) == BOB_PK


def test_pair_context_validation() -> None:
    with pytest.raises(pc.PairCryptoError, match="itself"):
        pc.PairContext(RUN, RND, A, A)
    with pytest.raises(pc.PairCryptoError, match="round"):
        pc.PairContext(RUN, 0, A, B)
    with pytest.raises(pc.PairCryptoError, match="64-bit"):
        pc.PairContext(2**64, RND, A, B)
    with pytest.raises(TypeError):
        pc.PairContext(RUN, RND, A, True)  # type: ignore[arg-type]
    with pytest.raises(pc.PairCryptoError, match="not the pair"):
        ctx().aad(A, B + 5)


def test_y_and_seed_draws() -> None:
    ys = {pc.draw_y() for _ in range(200)}
    assert ys == {0, 1}
    seeds = {pc.draw_seed() for _ in range(50)}
    assert len(seeds) == 50


def test_z_digest_is_domain_separated() -> None:
    import hashlib

    z = bytes(range(64))
    assert len(pc.z_digest(z)) == 32
    assert pc.z_digest(z) != hashlib.sha256(z).digest()
    assert pc.z_digest(z) != pc.z_digest(z[:-1] + b"\x00")
