"""The wire format of CorBin-FL: message types, record names, keys, and their checks.

This module is the ONE definition of what travels between the :class:`server.strategy.CorBin`
strategy and :func:`client.mod.corbin_mod` (the pattern of
``flwr/common/secure_aggregation/secaggplus_constants.py``). Both sides import it; neither spells
a key or a record name anywhere else.

Every protocol message is a Flower ``train`` message, so that it reaches the app's own
``@app.train()`` handler and the mod in front of it can answer it (Flower's SecAgg+ does the
same). Its ``corbin`` ConfigRecord names the stage. One round (paper Alg. 3, see docs/DESIGN.md
"One round on the wire")::

    keygen  S->C  corbin{stage, round, params}                     (only nodes without a key)
            C->S  corbin.keys{round, pubkey}
    pair    S->C  corbin{stage, round, params, partner, partner-pubkey[, num-params]}
            C->S  corbin.pair{round, blob}         blob = nonce || AES-GCM(Y || seed or z)
    update  S->C  corbin{stage, round, params, assignment, arrays-key, ...
                         [, next-partner, next-partner-pubkey]},
                  corbin.range{center, radius}, and the wrapped strategy's own records
                  (``arrays``: the global model, ``config``: the app's train config)
            C->S  corbin.reply{round[, next-pubkey][, next-blob][, z-digest]},
                  corbin.update{bits | values}, corbin.metrics{...}, and the app's own
                  MetricRecords / ConfigRecords

Relay is pipelined one round ahead (:func:`pipelined`): round ``t``'s update instruction names
the node's partner for round ``t+1`` and that partner's public key, and the reply carries the
node's blob for round ``t+1`` (``next-blob``, sealed under the pair key of round ``t+1``). The
server relays it in round ``t+1``'s update instruction (``partner-blob``), so a steady relay round
is one round trip; the ``pair`` stage runs only for nodes without a usable pipelined pair
(round 1, a node that joined late, a partner that was not sampled or did not answer).

``params`` are the mechanism's settings (:data:`COMMON_PARAM_KEYS` and the registered
mechanisms' parameters: :data:`corbin_fl.registry.PARAM_KEYS`, with the key sets of each stage's
record, since they depend on the registered mechanisms): the client takes them from the
instruction, checks them against its own privacy policy (``client/policy.py``) and never from the
run config, which the server controls. The app's train handler sees only the wrapped strategy's
records; its ArrayRecords never leave the node (only the encoded update does).

Every instruction carries the round both in ``Message.metadata.group_id`` and in its config
record, and every reply repeats it; a reply for another round is rejected.

Validation helpers raise :class:`WireError` with a short reason string that names the offending
record or key; the server logs it next to the node id and drops the node for the round, the client
answers it as an error reply.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable, Mapping
from typing import Any, Final

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.constant import SType
from numpy.lib import format as npy_format

from corbin_fl.mechanisms.validate import require, why_at_least

PROTOCOL_VERSION: Final[str] = "corbin-fl/v1"
"""Bound into every HKDF ``info`` and AEAD AAD. Must equal
:data:`mechanisms.randomness.PROTOCOL_VERSION` (kept as a literal here so the torch-free key
handlers do not import torch through :mod:`mechanisms`; ``tests/unit/test_wire.py`` checks both)."""

KEY_BYTES: Final[int] = 32
"""Length of an X25519 private or public key, and of a pair key (AES-256)."""
SEED_BYTES: Final[int] = 32
"""Length of a common-randomness seed (expanded to ``z`` by ``mechanisms.randomness``)."""
NONCE_BYTES: Final[int] = 12
"""AES-GCM nonce length (random, prefixed to the ciphertext)."""
TAG_BYTES: Final[int] = 16
"""AES-GCM authentication tag length."""
SHARED_SEED_BYTES: Final[int] = 8
"""Length of a server-shared seed (a 64-bit integer, big-endian; the keys are the mechanism's:
``corbin_fl.registry.Mechanism.shared_seed``)."""
MAX_SHARED_CLIENTS: Final[int] = 1_000_000
"""Largest number of participants of a shared seed a client accepts: it draws a permutation of
that many ranks (8 bytes each), so an unbounded value would let an instruction exhaust the
client's memory."""

# ----------------------------------------------------------------------------- message types
TRAIN: Final[str] = "train"
"""Flower message type of every protocol message (Flower's ``MessageType.TRAIN``)."""
KEYGEN: Final[str] = "keygen"
PAIR: Final[str] = "pair"
UPDATE: Final[str] = "update"
STAGES: Final[tuple[str, ...]] = (KEYGEN, PAIR, UPDATE)
"""Protocol stages, named by the ``stage`` key of the ``corbin`` instruction record."""

# ----------------------------------------------------------------------------- record names
CFG: Final[str] = "corbin"  # ConfigRecord, server -> client instruction
RANGE: Final[str] = "corbin.range"  # ArrayRecord, per-layer center/radius of the update stage
KEYS: Final[str] = "corbin.keys"  # ConfigRecord, keygen reply
PAIR_REC: Final[str] = "corbin.pair"  # ConfigRecord, pair reply
REPLY: Final[str] = "corbin.reply"  # ConfigRecord, update reply header
UPDATE_REC: Final[str] = "corbin.update"  # ArrayRecord, the encoded update
METRICS: Final[str] = "corbin.metrics"  # MetricRecord, the mechanism's metrics
PREFIX: Final[str] = "corbin"
"""Records whose name is ``corbin`` or starts with ``corbin.`` belong to the protocol; every other
record of an update instruction or reply belongs to the app."""
MAX_APP_RECORDS: Final[int] = 8
"""Most app records (MetricRecords / ConfigRecords) an update reply may carry."""
MAX_APP_METRICS: Final[int] = 64
"""Most entries of one app MetricRecord the server accepts."""
MAX_APP_BYTES: Final[int] = 1 << 16
"""Most payload bytes (:func:`payload_bytes`) all app records of one update reply may carry."""

# ----------------------------------------------------------------------------- config keys
STAGE: Final[str] = "stage"
ROUND: Final[str] = "round"
ARRAYS_KEY: Final[str] = "arrays-key"
PUBKEY: Final[str] = "pubkey"
PARTNER: Final[str] = "partner"
PARTNER_PUBKEY: Final[str] = "partner-pubkey"
PARTNER_BLOB: Final[str] = "partner-blob"
CR_MODE: Final[str] = "cr-mode"
NUM_PARAMS: Final[str] = "num-params"
BLOB: Final[str] = "blob"
MECHANISM: Final[str] = "mechanism"
ASSIGNMENT: Final[str] = "assignment"
NEXT_PUBKEY: Final[str] = "next-pubkey"
NEXT_PARTNER: Final[str] = "next-partner"
NEXT_PARTNER_PUBKEY: Final[str] = "next-partner-pubkey"
NEXT_BLOB: Final[str] = "next-blob"
Z_DIGEST: Final[str] = "z-digest"

# ----------------------------------------------------------------------------- array keys
CENTER: Final[str] = "center"  # float32 [L], per layer
RADIUS: Final[str] = "radius"  # float32 [L], per layer
BITS: Final[str] = "bits"  # uint8 packed bits
VALUES: Final[str] = "values"  # float32 [m] or int8 [m]

# ----------------------------------------------------------------------------- assignments
PAIRED: Final[str] = "paired"  # corbinq with the pair's z
PARTNER_GONE: Final[str] = "partner-gone"  # partner dropped before its blob: ldpq
UNPAIRED: Final[str] = "unpaired"  # odd one out of the pairing: ldpq
INDEPENDENT: Final[str] = "independent"  # AugCorBin gamma-fraction: ldpq
SOLO: Final[str] = "solo"  # mechanisms that never pair
ASSIGNMENTS: Final[tuple[str, ...]] = (PAIRED, PARTNER_GONE, UNPAIRED, INDEPENDENT, SOLO)

# ----------------------------------------------------------------------------- metric keys
M_CLIP_FRACTION: Final[str] = "clip-fraction"
M_PAIRED: Final[str] = "paired"  # 1 if corbinq was used with the pair's z
M_FALLBACK: Final[str] = "fallback"  # 1 if the node meant to pair but used ldpq
M_FALLBACK_CODE: Final[str] = "fallback-code"  # index into FALLBACK_REASONS (0 = none)
M_IS_LEAD: Final[str] = "is-lead"  # never sent (roles stay hidden); listed to forbid it
M_ENCODE_SECONDS: Final[str] = "encode-seconds"
METRIC_KEYS: Final[frozenset[str]] = frozenset(
    {M_CLIP_FRACTION, M_PAIRED, M_FALLBACK, M_FALLBACK_CODE, M_ENCODE_SECONDS}
)
"""The keys of the ``corbin.metrics`` record (the mechanism's own metrics)."""
M_TRAIN_LOSS: Final[str] = "train-loss"
M_NUM_EXAMPLES: Final[str] = "num-examples"
"""App metric keys the server summarises when an app reports them (this project's app does)."""

COMMON_PARAM_KEYS: Final[tuple[str, ...]] = (
    "mechanism",
    "epsilon",
    "delta",
    "d",
    "p-x",
    "cr-mode",
    "range-mode",
    "test-z-digest",
)
"""The settings every instruction carries whatever the mechanism (``RunConfig`` keys); the
parameters of the registered mechanisms go before the last one
(:data:`corbin_fl.registry.PARAM_KEYS`)."""
TRAILING_PARAM_KEYS: Final[tuple[str, ...]] = ("secure-aggregation",)
"""Settings every instruction carries after the v1 keys (``PARAM_KEYS`` ends with them):
``secure-aggregation`` lets a node whose policy requires it refuse a run without it."""


FALLBACK_REASONS: Final[tuple[str, ...]] = (
    "none",
    "unpaired",
    "independent",
    "partner-gone",
    "blob-auth-failed",
    "blob-invalid",
    "no-pair-state",
)
"""Why a node that could have paired quantized with ``ldpq`` (the code is the index)."""

ERROR_CODE_REJECTED: Final[int] = 1000
"""Flower ``Error.code`` of a client that refused an instruction (reason in ``Error.reason``).
Flower's own codes are 0-8."""

ERROR_CODE_POLICY: Final[int] = 1001
"""Flower ``Error.code`` of a client whose own privacy policy refused the instruction's settings
(:class:`client.policy.Policy`; the reason names the run's setting and the node's limit). When
every sampled node answers with it, no round can run and the server stops the run."""

POLICY_REFUSAL: Final[str] = "refused by the node's privacy policy: "
"""How the reason of an :data:`ERROR_CODE_POLICY` reply begins; the node's own cause follows."""


class WireError(ValueError):
    """A message does not follow the wire format; ``str(err)`` is the reason."""


# ----------------------------------------------------------------------------- helpers
def blob_len(secret_len: int) -> int:
    """Bytes of a pair blob: ``nonce || AES-GCM(Y || secret)``, i.e. ``12 + 1 + len + 16``."""
    return NONCE_BYTES + 1 + secret_len + TAG_BYTES


def check_pubkey(value: object, what: str = "public key") -> bytes:
    """Require a usable X25519 public key: 32 bytes and not a low-order point.

    A low-order point makes every shared secret all-zero; ``cryptography`` refuses that
    exchange, which is what this check runs (against a throwaway key).
    """
    if not isinstance(value, bytes):
        raise WireError(f"{what} must be bytes, got {type(value).__name__}")
    if len(value) != KEY_BYTES:
        raise WireError(f"{what} must be {KEY_BYTES} bytes, got {len(value)}")
    try:
        X25519PrivateKey.generate().exchange(X25519PublicKey.from_public_bytes(value))
    except ValueError as exc:
        raise WireError(f"{what} is not a valid X25519 key ({exc})") from exc
    return value


def packed_len(num_bits: int) -> int:
    """Bytes of ``num_bits`` bits packed 8 to a byte: ``ceil(num_bits / 8)``."""
    return (num_bits + 7) // 8


def pipelined(paired: bool, cr_mode: str) -> bool:
    """Whether the pair stage rides one round ahead: a pairing mechanism in ``relay`` mode.

    ``derived`` needs no blob at all; ``exact`` keeps its own ``pair`` stage every round (its blob
    is ``d*m`` bits, too large to ride with every update reply).
    """
    return paired and cr_mode == "relay"


NEXT_PAIR_KEYS: Final[frozenset[str]] = frozenset({NEXT_PARTNER, NEXT_PARTNER_PUBKEY})
"""The optional keys of a pipelined update instruction (both or neither)."""


def is_protocol_record(name: str) -> bool:
    """Whether record ``name`` belongs to the protocol (``corbin`` or ``corbin.*``)."""
    return name == PREFIX or name.startswith(PREFIX + ".")


def stage_of(msg: Message) -> str | None:
    """The protocol stage a message carries, or None when it carries no CorBin-FL instruction.

    Never raises: a malformed instruction yields None or an unknown stage string, which the
    receiver then refuses.
    """
    if not msg.has_content():
        return None
    rec = msg.content.config_records.get(CFG)
    if rec is None:
        return None
    stage = rec.get(STAGE)
    return stage if isinstance(stage, str) else ""


MAX_ROUND_DIGITS: Final[int] = 18
"""Longest decimal round number accepted in a ``group_id`` (fits a signed 64-bit integer)."""


def round_of(msg: Message) -> int:
    """The round in ``msg.metadata.group_id`` (the protocol always sets it).

    Only ASCII decimal digits are accepted (``str.isdigit`` alone also accepts e.g. ``"²"``,
    which ``int`` refuses), at most :data:`MAX_ROUND_DIGITS` of them (``int`` refuses strings of
    more than 4300 digits, and no run has that many rounds).
    """
    group = msg.metadata.group_id
    if not isinstance(group, str) or not (
        group.isascii() and group.isdigit() and len(group) <= MAX_ROUND_DIGITS
    ):
        shown = group[:32] if isinstance(group, str) else type(group).__name__
        raise WireError(f"group_id {shown!r} is not a round number")
    return int(group)


def check_records(content: RecordDict, expected: Mapping[str, type]) -> None:
    """Require exactly the records ``expected`` (name -> record class), nothing missing or extra."""
    names = set(content.keys())
    missing = sorted(set(expected) - names)
    extra = sorted(names - set(expected))
    if missing or extra:
        raise WireError(f"records: missing {missing}, unexpected {extra}")
    for name, kind in expected.items():
        if not isinstance(content[name], kind):
            raise WireError(
                f"record {name!r} must be a {kind.__name__}, got {type(content[name]).__name__}"
            )


def check_keys(
    record: Mapping[str, Any], required: Iterable[str], optional: Iterable[str] = (), what: str = ""
) -> None:
    """Require every key of ``required``, allow those of ``optional``, refuse the rest."""
    req, opt = set(required), set(optional)
    keys = set(record.keys())
    missing = sorted(req - keys)
    extra = sorted(keys - req - opt)
    if missing or extra:
        raise WireError(f"{what or 'record'} keys: missing {missing}, unexpected {extra}")


def get_int(record: Mapping[str, Any], key: str, *, low: int | None = None) -> int:
    """``record[key]`` as an int (not a bool), at least ``low``."""
    if key not in record:
        raise WireError(f"{key!r} missing")
    value = record[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise WireError(f"{key!r} must be an int, got {type(value).__name__}")
    if low is not None:
        require(repr(key), why_at_least(value, low), WireError)
    return value


def get_str(record: Mapping[str, Any], key: str, allowed: Iterable[str] | None = None) -> str:
    """``record[key]`` as a str, one of ``allowed`` when given."""
    if key not in record:
        raise WireError(f"{key!r} missing")
    value = record[key]
    if not isinstance(value, str):
        raise WireError(f"{key!r} must be a str, got {type(value).__name__}")
    if allowed is not None and value not in set(allowed):
        raise WireError(f"{key!r} has unknown value {value!r}")
    return value


def get_bytes(record: Mapping[str, Any], key: str, length: int | None = None) -> bytes:
    """``record[key]`` as bytes, of exactly ``length`` bytes when given."""
    if key not in record:
        raise WireError(f"{key!r} missing")
    value = record[key]
    if not isinstance(value, bytes):
        raise WireError(f"{key!r} must be bytes, got {type(value).__name__}")
    if length is not None and len(value) != length:
        raise WireError(f"{key!r} must be {length} bytes, got {len(value)}")
    return value


def check_round(msg: Message, record: Mapping[str, Any], expected: int | None = None) -> int:
    """Check that ``record[round]`` equals the message's group id (and ``expected``)."""
    rnd = get_int(record, ROUND, low=1)
    if rnd != round_of(msg):
        raise WireError(f"round {rnd} in the record but {round_of(msg)} in group_id")
    if expected is not None and rnd != expected:
        raise WireError(f"reply for round {rnd}, expected round {expected}")
    return rnd


def to_array(values: np.ndarray) -> Array:
    """A 1-D numpy array as a Flower ``Array`` (``np.save`` bytes, never pickled)."""
    return Array(np.ascontiguousarray(values))


def read_array(
    record: ArrayRecord, key: str, dtype: np.dtype[Any] | type, length: int, *, finite: bool = False
) -> np.ndarray:
    """Decode ``record[key]`` and check it is 1-D, of ``dtype`` and ``length`` (and finite).

    The ``Array``'s declared dtype, shape and serialisation type are checked first; then the
    ``.npy`` header inside its bytes is parsed with ``numpy.lib.format`` (no pickle, header at
    most 10,000 bytes) and must say the same dtype and shape, and the payload after the header
    must be exactly ``itemsize * length`` bytes. Only then are the bytes decoded (one copy), so a
    hostile array can make the reader neither allocate more than the expected size (an ``.npy``
    header that claims a huge shape would make ``np.load`` allocate it) nor raise anything but
    :class:`WireError`.
    """
    want = np.dtype(dtype)
    if key not in record:
        raise WireError(f"array {key!r} missing")
    arr = record[key]
    if not isinstance(arr, Array):
        raise WireError(f"array {key!r} is a {type(arr).__name__}, not an Array")
    try:
        shape = tuple(arr.shape)
    except TypeError:
        shape = None
    if arr.dtype != str(want) or shape != (length,):
        raise WireError(
            f"array {key!r} must be {want}[{length}], got {str(arr.dtype)[:32]}"
            f"{list(shape) if shape is not None else '?'}"
        )
    if arr.stype != SType.NUMPY:
        raise WireError(f"array {key!r} has serialisation type {str(arr.stype)[:32]!r}")
    out = decode_npy(arr.data, key, want, (length,)).copy()
    if finite and out.dtype.kind == "f" and not np.isfinite(out).all():
        raise WireError(f"array {key!r} has NaN or inf")
    return out


def decode_npy(data: Any, key: str, want: np.dtype[Any], shape: tuple[int, ...]) -> np.ndarray:
    """A read-only view of ``.npy`` bytes that must hold exactly ``want[shape]``.

    The header is parsed first (:func:`_npy_header`) and must declare ``want`` and ``shape``,
    and the payload after it must be exactly ``itemsize * size`` bytes, so hostile bytes can
    make the reader allocate nothing beyond the declared size nor raise anything but
    :class:`WireError`.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise WireError(f"array {key!r} carries {type(data).__name__}, not bytes")
    size = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if len(data) > want.itemsize * size + 4096:
        raise WireError(f"array {key!r} carries {len(data)} bytes, too many for its shape")
    header_dtype, header_shape, offset = _npy_header(bytes(data), key)
    if header_dtype != want or tuple(header_shape) != tuple(shape):
        raise WireError(
            f"array {key!r} decodes to {header_dtype}{list(header_shape)}, not its header"
        )
    if len(data) - offset != want.itemsize * size:
        raise WireError(
            f"array {key!r} carries {len(data) - offset} payload bytes, "
            f"expected {want.itemsize * size}"
        )
    return np.frombuffer(data, dtype=want, count=size, offset=offset)


def _npy_header(data: bytes, key: str) -> tuple[np.dtype[Any], tuple[int, ...], int]:
    """``(dtype, shape, payload offset)`` of the ``.npy`` bytes ``data``.

    Only what ``np.save`` writes for a 1-D array is accepted: format version 1.0, C order, no
    object dtype. ``numpy.lib.format`` evaluates the header with ``ast.literal_eval`` (no code
    runs) and refuses headers over 10,000 bytes; every failure becomes a :class:`WireError`.
    """
    fp = io.BytesIO(data)
    try:
        version = npy_format.read_magic(fp)
        if version != (1, 0):
            raise WireError(f"array {key!r} uses .npy format {version}, expected (1, 0)")
        shape, fortran_order, header_dtype = npy_format.read_array_header_1_0(fp)
    except WireError:
        raise
    except (ValueError, TypeError, SyntaxError, EOFError, RecursionError, MemoryError) as exc:
        raise WireError(f"array {key!r} does not decode: {str(exc)[:200]}") from exc
    if header_dtype.hasobject:
        raise WireError(f"array {key!r} has an object dtype")
    if fortran_order is not False:
        raise WireError(f"array {key!r} has a Fortran-order header")
    return header_dtype, tuple(shape), fp.tell()


def payload_bytes(content: RecordDict) -> int:
    """Bytes of payload a message carries: array data, config values and metric values.

    This counts what we serialise (``np.save`` bytes of arrays, raw bytes/str of configs, 8 bytes
    per number), not Flower's protobuf framing.
    """
    total = 0
    for record in content.values():
        if isinstance(record, ArrayRecord):
            total += sum(len(arr.data) for arr in record.values())
        elif isinstance(record, ConfigRecord | MetricRecord):
            total += sum(_scalar_bytes(value) for value in record.values())
    return total


def _scalar_bytes(value: Any) -> int:
    if isinstance(value, list):
        return sum(_scalar_bytes(v) for v in value)
    if isinstance(value, bytes):
        return len(value)
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, bool):
        return 1
    return 8


def finite_metric(value: Any) -> bool:
    """Whether a metric value is a finite number (not a bool) that converts to a float.

    An int beyond the float range (``> 1.8e308``) is refused: ``math.isfinite`` and ``float``
    raise ``OverflowError`` on it.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False
