"""Hostile inputs for every decoder of the wire format, with hypothesis (mark ``fuzz``).

Server side: the reply decoding of every stage (keygen, pair, update for every mechanism)
through the real :func:`server.stages.exchange` and the real ``accept_pubkey`` /
``accept_blob`` / ``accept_update`` of ``server/round.py``. Three nodes answer: two honest ones,
and a third that sends what hypothesis draws: a random record dict, a mutation of a valid reply
(records or keys dropped or added, values of the wrong type or size, huge values, NaN/inf,
forged arrays, app records of any kind), an error reply, a reply with another round in its group
id or another message type, a reply to another node's or an old instruction, a replayed or
duplicated reply, or nothing. Properties:

* nothing escapes ``exchange`` and nothing is logged at ERROR (every rejection was foreseen);
* the honest nodes are accepted and what the server keeps of them (key, blob, aggregate, the
  app's records) is exactly what they sent;
* the hostile node ends up either accepted, and then what it sent is valid by an independent
  check of the wire spec written here, or dropped, with a warning that names it and the reason;
  a valid reply sent once is always accepted;
* a rejected update never reaches the aggregate; the app's records of an update reply (extra
  ArrayRecords, MetricRecords too large or not finite, too many records) are refused with a
  :class:`~corbin_fl.wire.WireError`.

Client side: every stage through the real entry point, with random or mutated instructions:
keygen and pair through the project's ClientApp (``client.app.app``: dropout mod, then
``corbin_mod`` with the node's policy check), the update stage through ``corbin_mod`` in front
of a trivial train handler (the project's own handler runs in
:func:`test_client_rejects_replayed_and_stale_instructions`). Properties: nothing escapes; the
instruction is answered iff it is valid by an independent check of the spec; an answer passes the
server's own validator; a refusal is an error reply (``ERROR_CODE_POLICY`` when the node's policy
refused it, else ``ERROR_CODE_REJECTED``) with a warning that
names the node and the reason, leaves ``context.state`` untouched, and the next valid instruction
is still answered; a message that is not a ``train`` message passes to the app untouched. The
mechanism settings an instruction carries (``registry.PARAM_KEYS``) get any value, a wrong type or
go missing: the node answers only what parses and what its policy admits, and names the cause
otherwise. ``corbin_fl/arrays.py`` round-trips any float model and refuses what does not fit.

Hypothesis runs derandomized (fixed examples, no example database written into the repo); set
``CORBIN_FUZZ_SCALE=N`` to run ``N`` times as many random examples.
"""

from __future__ import annotations

import copy
import io
import logging
import os
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.common.constant import SUPERLINK_NODE_ID, SType
from flwr.serverapp import Grid
from flwr.supercore.run import Run

# The in-process harness of the protocol tests: Flower's task identity for Message(), and the
# tiny linear model with stub training/evaluation (autouse fixtures, active here too).
from harness import RUN_ID, make_cfg
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from corbin_fl import registry, wire
from corbin_fl.app import client_app
from corbin_fl.app import train as client_train
from corbin_fl.app.config import AppConfig
from corbin_fl.arrays import (
    ArrayLayoutError,
    check_same_weights,
    flatten_arrays,
    layout_of_arrays,
    unflatten_arrays,
)
from corbin_fl.client import handlers, pair_crypto
from corbin_fl.client.mod import corbin_mod
from corbin_fl.client.policy import Policy, PolicyError
from corbin_fl.client.shared import assignments_of
from corbin_fl.config import MECHANISMS, ConfigError
from corbin_fl.deploy.run import node_policy
from corbin_fl.mechanisms.baselines import ternary
from corbin_fl.server import round as server_round
from corbin_fl.server.aggregation import float_release_bounds, make_aggregator
from corbin_fl.server.stages import RoundState, exchange

pytestmark = pytest.mark.fuzz

CQ_SEED, CQ_RANK, CQ_CLIENTS = registry.get("cq").shared_seed
"""CQ's shared-seed keys of the update instruction (its registry entry's)."""
_SCALE = max(1, int(os.environ.get("CORBIN_FUZZ_SCALE", "1")))


def fuzz_settings(examples: int) -> settings:
    """Bounded, reproducible hypothesis settings (the whole file runs in well under 60 s)."""
    return settings(
        max_examples=examples * _SCALE,
        deadline=None,
        derandomize=_SCALE == 1,
        database=None,
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
        ],
    )


# ============================================================================ value strategies
LOW_ORDER_POINTS: tuple[bytes, ...] = (
    bytes(32),
    bytes([1]) + bytes(31),
    bytes.fromhex("e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800"),
    bytes.fromhex("5f9c95bca3508c24b1d0b1559c83ef5b04445cc4581c8e86d8224eddd09f1157"),
    bytes.fromhex("ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f"),
)
"""X25519 public keys whose shared secret is all-zero (RFC 7748 Sec. 6.1 warns about them)."""

RND = 5
"""The round every fuzzed stage runs in."""

small_ints = st.integers(-3, 12)
ints = st.one_of(
    small_ints,
    st.sampled_from([RND, RND - 1, RND + 1, 2**63 - 1, -(2**63), 2**64, 2**64 + 9, 2**200]),
    st.integers(),
)
floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([3.4e38, -3.4e38, 1e308, 5e-324, float("nan"), float("inf")]),
)
texts = st.one_of(
    st.text(max_size=10),
    st.sampled_from(["relay", "exact", "derived", "corbin", "paired", "partner-gone", "²", "05"]),
)
blobs = st.one_of(
    st.binary(max_size=80),
    st.sampled_from(LOW_ORDER_POINTS),
    st.builds(os.urandom, st.sampled_from([8, 31, 32, 33, wire.blob_len(wire.SEED_BYTES)])),
    st.just(b"\x00" * 1_000_000),
)
config_values = st.one_of(
    ints,
    floats,
    texts,
    blobs,
    st.booleans(),
    st.lists(ints, max_size=3),
    st.lists(floats, max_size=3),
    st.lists(texts, max_size=3),
    st.lists(st.binary(max_size=40), max_size=3),
    st.lists(st.booleans(), max_size=3),
)
metric_values = st.one_of(ints, floats, st.lists(ints, max_size=3), st.lists(floats, max_size=3))

ALL_NAMES: tuple[str, ...] = (
    wire.CFG,
    wire.RANGE,
    wire.STAGE,
    wire.ARRAYS_KEY,
    "arrays",
    "metrics",
    "config",
    "corbin.x",
    wire.KEYS,
    wire.PAIR_REC,
    wire.REPLY,
    wire.UPDATE_REC,
    wire.METRICS,
    wire.ROUND,
    wire.PUBKEY,
    wire.PARTNER,
    wire.PARTNER_PUBKEY,
    wire.PARTNER_BLOB,
    wire.CR_MODE,
    wire.NUM_PARAMS,
    wire.BLOB,
    wire.MECHANISM,
    wire.ASSIGNMENT,
    CQ_SEED,
    CQ_RANK,
    CQ_CLIENTS,
    wire.NEXT_PUBKEY,
    wire.Z_DIGEST,
    wire.CENTER,
    wire.RADIUS,
    wire.BITS,
    wire.VALUES,
    *sorted(wire.METRIC_KEYS),
    wire.M_IS_LEAD,
)
names = st.one_of(st.sampled_from(ALL_NAMES), st.text(max_size=8))

NP_DTYPES = (np.uint8, np.int8, np.float32, np.float64, np.int64, np.bool_, np.uint16)


def npy_bytes(values: np.ndarray) -> bytes:
    """What ``np.save`` writes (and Flower's ``Array(ndarray)`` carries)."""
    buf = io.BytesIO()
    np.save(buf, values, allow_pickle=False)
    return buf.getvalue()


def npy_with_header(header: dict[str, Any], payload: bytes, version: tuple[int, int]) -> bytes:
    """A ``.npy`` file with an arbitrary (hostile) header in front of ``payload``."""
    from numpy.lib import format as npy_format

    buf = io.BytesIO()
    if version == (1, 0):
        npy_format.write_array_header_1_0(buf, header)
    else:
        npy_format.write_array_header_2_0(buf, header)
    return buf.getvalue() + payload


def hostile_payloads(dtype: Any, length: int) -> st.SearchStrategy[bytes]:
    """Bytes that look like, or are, the ``.npy`` of a ``dtype[length]`` array."""
    want = np.dtype(dtype)
    good = npy_bytes(np.zeros(length, want))
    body = bytes(want.itemsize * length)
    descr = np.lib.format.dtype_to_descr(want)
    return st.one_of(
        st.binary(max_size=300),
        st.sampled_from(
            [
                good[: len(good) // 2],  # truncated
                good[:9],  # truncated inside the header
                good + b"trailing",  # bytes after the payload
                npy_with_header(
                    {"descr": descr, "fortran_order": False, "shape": (2**40,)}, body, (1, 0)
                ),  # header claims 2**40 elements (np.load would allocate them)
                npy_with_header(
                    {"descr": descr, "fortran_order": False, "shape": (length,)}, body, (2, 0)
                ),  # format 2.0
                npy_with_header(
                    {"descr": descr, "fortran_order": True, "shape": (length,)}, body, (1, 0)
                ),  # Fortran order
                npy_with_header(
                    {"descr": "|O", "fortran_order": False, "shape": (length,)}, body, (1, 0)
                ),  # object dtype (a pickle)
                b"\x93NUMPY\x01\x00\xff\xff" + b"(" * 60000,  # oversized, nested header
            ]
        ),
        hnp.arrays(st.sampled_from(NP_DTYPES), st.integers(0, length + 3)).map(npy_bytes),
    )


@st.composite
def forged_arrays(draw: st.DrawFn, dtype: Any, length: int) -> Array:
    """An ``Array`` whose declared dtype/shape/stype and bytes may disagree."""
    want = np.dtype(dtype)
    declared_dtype = draw(
        st.sampled_from([str(want), str(want), "float32", "uint8", "int8", "object", ""])
    )
    declared_shape = draw(
        st.sampled_from([(length,), (length,), (length + 1,), (0,), (), (length, 1), (2**40,)])
    )
    stype = draw(st.sampled_from([SType.NUMPY, SType.NUMPY, "torch.Tensor", ""]))
    data = draw(hostile_payloads(want, length))
    return Array(dtype=declared_dtype, shape=declared_shape, stype=stype, data=data)


@st.composite
def poisoned_arrays(draw: st.DrawFn, base: np.ndarray) -> Array:
    """``base`` with one to three entries replaced by any value of its dtype (NaN, inf, huge,
    negative, set padding bits, out-of-range symbols), re-sized, or cast to another dtype."""
    values = base.copy()
    how = draw(st.sampled_from(["poison", "poison", "resize", "cast"]))
    if how == "poison" and values.size:
        for _ in range(draw(st.integers(1, 3))):
            index = draw(st.sampled_from([0, values.size - 1, values.size // 2]))
            values[index] = draw(hnp.from_dtype(values.dtype))
    elif how == "resize":
        size = draw(st.sampled_from([0, 1, base.size - 1, base.size + 1, 2 * base.size + 3]))
        values = np.resize(values, max(size, 0))
    else:
        values = values.astype(draw(st.sampled_from(NP_DTYPES)))
    return Array(np.ascontiguousarray(values))


def arrays_for(base: np.ndarray) -> st.SearchStrategy[Array]:
    """Arrays for a slot whose valid value is ``base``: poisoned/re-sized/cast copies of it,
    small random arrays of any dtype, or forged ones (declared metadata and bytes disagree)."""
    return st.one_of(
        poisoned_arrays(base),
        hnp.arrays(st.sampled_from(NP_DTYPES), st.integers(0, 8)).map(Array),
        forged_arrays(base.dtype, base.size),
    )


def config_records() -> st.SearchStrategy[ConfigRecord]:
    return st.dictionaries(names, config_values, max_size=5).map(ConfigRecord)


def metric_records() -> st.SearchStrategy[MetricRecord]:
    return st.dictionaries(names, metric_values, max_size=5).map(MetricRecord)


def array_records(arrays: st.SearchStrategy[Array]) -> st.SearchStrategy[ArrayRecord]:
    return st.dictionaries(names, arrays, max_size=3).map(ArrayRecord)


def any_records(arrays: st.SearchStrategy[Array]) -> st.SearchStrategy[Any]:
    return st.one_of(config_records(), metric_records(), array_records(arrays))


def record_dicts(arrays: st.SearchStrategy[Array]) -> st.SearchStrategy[RecordDict]:
    return st.dictionaries(names, any_records(arrays), max_size=4).map(RecordDict)


@st.composite
def mutations(draw: st.DrawFn, base: RecordDict, arrays: st.SearchStrategy[Array]) -> RecordDict:
    """One to three edits of ``base``: a record dropped, added or replaced, a key dropped or
    added, a value replaced (with a value of any type, an array of ``arrays``)."""
    out = copy.deepcopy(base)
    ops = ["drop_record", "add_record", "replace_record", "drop_key", "add_key", "set", "set"]
    for _ in range(draw(st.integers(1, 3))):
        present = list(out.keys())
        op = draw(st.sampled_from(ops))
        if op == "add_record" or not present:
            out[draw(names)] = draw(any_records(arrays))
            continue
        name = draw(st.sampled_from(present))
        rec = out[name]
        if op == "drop_record":
            del out[name]
        elif op == "replace_record":
            out[name] = draw(any_records(arrays))
        elif op == "drop_key" and len(rec):
            del rec[draw(st.sampled_from(sorted(rec)))]
        else:
            key = draw(st.sampled_from(sorted(rec))) if op == "set" and len(rec) else draw(names)
            if isinstance(rec, ConfigRecord):
                rec[key] = draw(config_values)
            elif isinstance(rec, MetricRecord):
                rec[key] = draw(metric_values)
            else:
                rec[key] = draw(arrays)
    return out


# ============================================================================ spec oracles
def one_bit(mechanism: str) -> bool:
    """Whether ``mechanism`` sends one packed bit per parameter (by its registered wire spec)."""
    return (
        mechanism not in ("ternary", *FINITE_LEVELS)
        and registry.update_spec(AppConfig(mechanism=mechanism), 9)[0] == wire.BITS
    )


FINITE_LEVELS = {
    "pbm": lambda cfg: cfg.param("pbm-trials") + 1,
    "rqm": lambda cfg: cfg.param("rqm-levels"),
    "imvu": lambda cfg: 1 << cfg.param("imvu-bits"),
}
"""The finite-output mechanisms and their number of symbols ``K``."""


def finite_number(value: object) -> bool:
    """An int or float (not a bool) whose float value is finite."""
    if type(value) not in (int, float):
        return False
    try:
        return bool(np.isfinite(float(value)))  # type: ignore[arg-type]
    except OverflowError:
        return False


def spec_value_bytes(value: object) -> int:
    """Payload bytes of one config or metric value by the wire spec: raw bytes, UTF-8 text, 1
    for a bool, 8 for any other number; a list is the sum of its items."""
    if isinstance(value, list):
        return sum(spec_value_bytes(v) for v in value)
    if isinstance(value, bytes):
        return len(value)
    if isinstance(value, str):
        return len(value.encode("utf-8"))
    return 1 if isinstance(value, bool) else 8


def spec_app_bytes(app: dict[str, Any]) -> int:
    """Payload bytes of an update reply's app records (their array data, config and metric
    values; not Flower's framing): what ``MAX_APP_BYTES`` caps."""
    total = 0
    for rec in app.values():
        if isinstance(rec, ArrayRecord):
            total += sum(len(arr.data) for arr in rec.values())
        else:
            total += sum(spec_value_bytes(v) for v in rec.values())
    return total


def spec_app_records(content: RecordDict) -> bool:
    """The app's records of an update reply by the wire spec: at most ``MAX_APP_RECORDS``
    records carrying at most ``MAX_APP_BYTES`` payload bytes together, each a MetricRecord (at
    most ``MAX_APP_METRICS`` entries, each a finite number or a non-empty list of them) or a
    ConfigRecord; no ArrayRecord (the app's arrays never leave the node)."""
    app = {k: v for k, v in content.items() if not (k == "corbin" or k.startswith("corbin."))}
    if len(app) > wire.MAX_APP_RECORDS:
        return False
    if spec_app_bytes(app) > wire.MAX_APP_BYTES:
        return False
    for rec in app.values():
        if type(rec) is MetricRecord:
            if len(rec) > wire.MAX_APP_METRICS:
                return False
            for value in rec.values():
                values = value if isinstance(value, list) else [value]
                if not values or not all(finite_number(v) for v in values):
                    return False
        elif type(rec) is not ConfigRecord:
            return False
    return True


def is_pubkey(value: object) -> bool:
    """32 bytes and not a low-order point (the exchange of a fresh key with it succeeds)."""
    if not isinstance(value, bytes) or len(value) != wire.KEY_BYTES:
        return False
    try:
        X25519PrivateKey.generate().exchange(X25519PublicKey.from_public_bytes(value))
    except ValueError:
        return False
    return True


def is_int(value: object, low: int, high: int | None = None) -> bool:
    if type(value) is not int or value < low:
        return False
    return high is None or value < high


def group_round(group: object) -> int | None:
    """The round a ``group_id`` names by the spec: ASCII digits, at most 18 of them."""
    if isinstance(group, str) and group.isascii() and group.isdigit() and len(group) <= 18:
        return int(group)
    return None


def spec_array(arr: object, dtype: Any, length: int) -> np.ndarray | None:
    """The values of ``arr`` if it is exactly what ``np.save`` makes of a ``dtype[length]``
    array (declared dtype, shape and stype included), else None."""
    want = np.dtype(dtype)
    if not isinstance(arr, Array) or arr.dtype != str(want) or tuple(arr.shape) != (length,):
        return None
    size = want.itemsize * length
    if arr.stype != SType.NUMPY or len(arr.data) < size:
        return None
    values = np.frombuffer(arr.data[len(arr.data) - size :], dtype=want).copy()
    return values if npy_bytes(values) == arr.data else None


def exact_records(content: RecordDict, expected: dict[str, type]) -> bool:
    return set(content.keys()) == set(expected) and all(
        type(content[k]) is kind for k, kind in expected.items()
    )


def spec_keygen_reply(content: RecordDict, rnd: int) -> bool:
    if not exact_records(content, {wire.KEYS: ConfigRecord}):
        return False
    rec = content[wire.KEYS]
    return (
        set(rec) == {wire.ROUND, wire.PUBKEY}
        and rec[wire.ROUND] == rnd
        and is_int(rec[wire.ROUND], 1)
        and is_pubkey(rec[wire.PUBKEY])
    )


def spec_pair_reply(content: RecordDict, rnd: int, blob_len: int) -> bool:
    if not exact_records(content, {wire.PAIR_REC: ConfigRecord}):
        return False
    rec = content[wire.PAIR_REC]
    blob = rec.get(wire.BLOB)
    return (
        set(rec) == {wire.ROUND, wire.BLOB}
        and is_int(rec[wire.ROUND], 1)
        and rec[wire.ROUND] == rnd
        and isinstance(blob, bytes)
        and len(blob) == blob_len
    )


def spec_update_values(
    values: np.ndarray, cfg: AppConfig, c: torch.Tensor, r: torch.Tensor
) -> bool:
    """The value rules of an update: zero padding bits, ternary symbols, float bounds."""
    m = c.numel()
    mech = cfg.mechanism
    if one_bit(mech):
        return not np.unpackbits(values)[m:].any()
    if mech in FINITE_LEVELS:
        k = FINITE_LEVELS[mech](cfg)
        b = next(b for b in (1, 2, 4, 8) if k <= 1 << b)
        bits = np.unpackbits(values)
        if bits[m * b :].any():
            return False
        symbols = bits[: m * b].reshape(m, b) @ (1 << np.arange(b - 1, -1, -1))
        return bool((symbols < k).all())
    if mech == "ternary":
        if cfg.param("ternary-encoding") == "int8":
            return bool(np.isin(values, (-1, 0, 1)).all())
        bits = np.unpackbits(values)
        nonzero, positive = bits[:m].astype(bool), bits[m : 2 * m].astype(bool)
        return not bits[2 * m :].any() and not (positive & ~nonzero).any()
    if not np.isfinite(values).all():
        return False
    reference, limit = float_release_bounds(cfg, c, r)
    v = torch.from_numpy(values.astype(np.float64))
    return bool(((v - reference).abs() <= limit).all())


def spec_update_reply(
    content: RecordDict, rnd: int, cfg: AppConfig, c: torch.Tensor, r: torch.Tensor
) -> bool:
    expected = {wire.REPLY: ConfigRecord, wire.UPDATE_REC: ArrayRecord, wire.METRICS: MetricRecord}
    protocol = {k: v for k, v in content.items() if k == "corbin" or k.startswith("corbin.")}
    if not exact_records(RecordDict(protocol), expected):
        return False
    if not spec_app_records(content):
        return False
    head = content[wire.REPLY]
    required = {wire.ROUND} | ({wire.NEXT_PUBKEY} if cfg.paired else set())
    optional = {wire.Z_DIGEST} if cfg.paired and cfg.test_z_digest else set()
    if not required <= set(head) <= required | optional:
        return False
    if not (is_int(head[wire.ROUND], 1) and head[wire.ROUND] == rnd):
        return False
    if cfg.paired and not is_pubkey(head[wire.NEXT_PUBKEY]):
        return False
    digest = head.get(wire.Z_DIGEST)
    if wire.Z_DIGEST in head and not (isinstance(digest, bytes) and len(digest) == 32):
        return False
    metrics = content[wire.METRICS]
    if set(metrics) != wire.METRIC_KEYS:
        return False
    for value in metrics.values():
        if type(value) not in (int, float) or abs(value) > np.finfo(np.float64).max:
            return False
        if not np.isfinite(float(value)):
            return False
    key, dtype, length = registry.update_spec(cfg, c.numel())
    update = content[wire.UPDATE_REC]
    if set(update) != {key}:
        return False
    values = spec_array(update[key], dtype, length)
    return values is not None and spec_update_values(values, cfg, c, r)


# ============================================================================ server side
NODES = (11, 12, 13)
VICTIM = 12
HONEST = (11, 13)
OLD_REPLY_ID = "0ld" * 21
"""Message id of the victim's reply of an earlier round: already seen by the server."""
OLD_INSTRUCTION_ID = "1ns" * 21
"""Message id of an instruction of an earlier round (no longer pending)."""
TIMEOUT = 0.03


class ScriptedGrid(Grid):
    """A Flower Grid whose replies are scripted (no ClientApp runs).

    ``script(instructions)`` is called at the first pull with the pushed instruction of every
    node and returns the batches the successive pulls return.
    """

    def __init__(self, script: Callable[[dict[int, Message]], list[list[Message]]]) -> None:
        self._run = Run.create_empty(RUN_ID)
        self._script = script
        self.instructions: dict[int, Message] = {}
        self._batches: list[list[Message]] | None = None

    def set_run(self, run: Run) -> None:  # pragma: no cover - not used
        self._run = run

    @property
    def run(self) -> Run:
        return self._run

    def create_message(self, *args: Any, **kwargs: Any) -> Message:  # pragma: no cover
        raise NotImplementedError

    def get_node_ids(self) -> Iterable[int]:
        return list(NODES)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for msg in messages:
            mid = uuid.uuid4().hex
            msg.metadata.__dict__["_message_id"] = mid
            self.instructions[msg.metadata.dst_node_id] = msg
            ids.append(mid)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        if self._batches is None:
            self._batches = self._script(self.instructions)
        return self._batches.pop(0) if self._batches else []

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:  # pragma: no cover - not used
        raise NotImplementedError


@dataclass
class Plan:
    """What the hostile node sends (drawn by :func:`plans`)."""

    body: RecordDict | Error
    group_id: str | None = None
    message_type: str | None = None
    src: int | None = None
    reply_to: str = "own"
    message_id: str = "fresh"
    copies: int = 1
    same_id: bool = False
    split: bool = False
    position: int = 0

    def meta_ok(self) -> bool:
        """Whether the metadata is what a valid reply has (group id, type, sender, ...)."""
        group_ok = self.group_id is None or group_round(self.group_id) == RND
        type_ok = self.message_type in (None, wire.TRAIN)
        return (
            group_ok
            and type_ok
            and self.src is None
            and self.reply_to == "own"
            and self.message_id != "old"
        )


@st.composite
def plans(draw: st.DrawFn, base: RecordDict, arrays: st.SearchStrategy[Array]) -> Plan:
    kind = draw(st.sampled_from(["valid", "mutated", "mutated", "mutated", "random", "error"]))
    body: RecordDict | Error
    if kind == "valid":
        body = copy.deepcopy(base)
    elif kind == "mutated":
        body = draw(mutations(base, arrays))
    elif kind == "random":
        body = draw(record_dicts(arrays))
    else:
        body = Error(code=draw(ints), reason=draw(st.none() | st.text(max_size=60)))
    plan = Plan(body=body)
    variant = draw(
        st.sampled_from(["none"] * 6 + ["group", "type", "src", "reply_to", "id", "copies"])
    )
    if variant == "group":
        plan.group_id = draw(
            st.sampled_from(
                [str(RND - 1), str(RND + 1), "", "x", "²", "9" * 5000, " 5", "05", "-5"]
            )
            | st.text(max_size=6)
        )
    elif variant == "type":
        plan.message_type = draw(
            st.sampled_from([wire.KEYGEN, wire.UPDATE, wire.TRAIN, "evaluate", "query.other"])
        )
    elif variant == "src":
        # Replies that claim another sender; Flower's SuperLink admits a reply only from the
        # node its instruction went to, so an impersonation of an honest node by id is not
        # drawn (the server could not tell it from the node itself).
        plan.src = draw(st.sampled_from([999, SUPERLINK_NODE_ID, 0]))
    elif variant == "reply_to":
        plan.reply_to = draw(st.sampled_from(["other", "old", "unknown", "empty"]))
    elif variant == "id":
        plan.message_id = draw(st.sampled_from(["old", "empty"]))
    elif variant == "copies":
        plan.copies = draw(st.sampled_from([0, 2]))
        plan.same_id = draw(st.booleans())
        plan.split = draw(st.booleans())
    plan.position = draw(st.integers(0, 2))
    return plan


def make_reply(instruction: Message, body: RecordDict | Error) -> Message:
    reply = Message(copy.deepcopy(body), reply_to=instruction)
    reply.metadata.__dict__["_message_id"] = uuid.uuid4().hex
    return reply


def victim_messages(plan: Plan, instructions: dict[int, Message]) -> list[Message]:
    own = instructions[VICTIM]
    out: list[Message] = []
    for i in range(plan.copies):
        msg = make_reply(own, plan.body)
        meta = msg.metadata.__dict__
        if plan.group_id is not None:
            meta["_group_id"] = plan.group_id
        if plan.message_type is not None:
            meta["_message_type"] = plan.message_type
        if plan.src is not None:
            meta["_src_node_id"] = plan.src
        meta["_reply_to_message_id"] = {
            "own": own.metadata.message_id,
            "other": instructions[HONEST[1]].metadata.message_id,
            "old": OLD_INSTRUCTION_ID,
            "unknown": uuid.uuid4().hex,
            "empty": "",
        }[plan.reply_to]
        if plan.message_id == "old":
            meta["_message_id"] = OLD_REPLY_ID
        elif plan.message_id == "empty":
            meta["_message_id"] = ""
        if i == 1 and plan.same_id:
            meta["_message_id"] = out[0].metadata.message_id
        out.append(msg)
    return out


SERVER_RT: Any = SimpleNamespace(cfg=AppConfig())
"""What :func:`server.round.instruction` reads of the server's runtime (the mechanism settings)."""


def run_stage(
    stage: str,
    honest: dict[int, RecordDict],
    plan: Plan,
    on_reply: Callable[[RoundState], Callable[[int, Message], None]],
) -> tuple[RoundState, list[int]]:
    """One stage through the real ``exchange``: honest replies first batch, the plan's too."""

    def script(instructions: dict[int, Message]) -> list[list[Message]]:
        first = [make_reply(instructions[nid], honest[nid]) for nid in HONEST]
        hostile = victim_messages(plan, instructions)
        if hostile:
            first.insert(min(plan.position, len(first)), hostile[0])
        later = hostile[1:]
        if plan.split:
            return [first, later]
        return [first + later]

    state = RoundState(
        round=RND, run_id=RUN_ID, sampled=list(NODES), seen_message_ids={OLD_REPLY_ID}
    )
    msgs = {nid: server_round.instruction(SERVER_RT, stage, nid, RND, {}) for nid in NODES}
    accepted = exchange(
        ScriptedGrid(script),
        state,
        msgs,
        on_reply(state),
        timeout=TIMEOUT,
        poll_interval=0.005,
    )
    return state, accepted


def check_outcome(
    state: RoundState,
    accepted: list[int],
    plan: Plan,
    body_valid: bool,
    caplog: pytest.LogCaptureFixture,
) -> bool:
    """The properties every stage shares; returns whether the victim was accepted."""
    assert sorted(n for n in accepted if n in HONEST) == list(HONEST)
    assert all(n not in state.dropped for n in HONEST), state.dropped
    victim_ok = VICTIM in accepted
    assert victim_ok != (VICTIM in state.dropped), (accepted, state.dropped)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]
    valid = body_valid and plan.meta_ok() and isinstance(plan.body, RecordDict)
    event(f"hostile node {'accepted' if victim_ok else 'dropped'}")
    if victim_ok:
        assert valid, "the server accepted an invalid reply"
        assert accepted.count(VICTIM) == 1
    else:
        reason = state.dropped[VICTIM]
        lines = [
            r.getMessage()
            for r in caplog.records
            if r.levelno == logging.WARNING and f"node {VICTIM} dropped" in r.getMessage()
        ]
        assert len(lines) == 1 and reason.split(": ", 1)[1] in lines[0], (lines, reason)
        if valid and (plan.copies == 1 or (plan.copies == 2 and plan.split)):
            pytest.fail(f"a valid reply was rejected: {reason}")
    for nid in HONEST:
        assert not any(f"node {nid} dropped" in r.getMessage() for r in caplog.records)
    return victim_ok


def _pubkey() -> bytes:
    return pair_crypto.generate_keypair()[1]


@given(data=st.data())
@fuzz_settings(60)
def test_server_keygen_reply_decoding(
    data: st.DataObject, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    caplog.clear()
    honest = {
        nid: RecordDict({wire.KEYS: ConfigRecord({wire.ROUND: RND, wire.PUBKEY: _pubkey()})})
        for nid in HONEST
    }
    base = RecordDict({wire.KEYS: ConfigRecord({wire.ROUND: RND, wire.PUBKEY: _pubkey()})})
    plan = data.draw(plans(base, arrays_for(np.zeros(4, np.uint8))))
    state, accepted = run_stage(
        wire.KEYGEN,
        honest,
        plan,
        lambda s: lambda nid, reply: server_round.accept_pubkey(s, nid, reply),
    )
    body_valid = isinstance(plan.body, RecordDict) and spec_keygen_reply(plan.body, RND)
    ok = check_outcome(state, accepted, plan, body_valid, caplog)
    for nid in HONEST:
        assert state.pubkeys[nid] == honest[nid][wire.KEYS][wire.PUBKEY]
    if ok:
        assert isinstance(plan.body, RecordDict)
        assert state.pubkeys[VICTIM] == plan.body[wire.KEYS][wire.PUBKEY]
    else:
        assert VICTIM not in state.pubkeys


@given(data=st.data())
@fuzz_settings(60)
def test_server_pair_reply_decoding(data: st.DataObject, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    caplog.clear()
    size = wire.blob_len(wire.SEED_BYTES)
    honest = {
        nid: RecordDict(
            {wire.PAIR_REC: ConfigRecord({wire.ROUND: RND, wire.BLOB: os.urandom(size)})}
        )
        for nid in HONEST
    }
    base = RecordDict({wire.PAIR_REC: ConfigRecord({wire.ROUND: RND, wire.BLOB: os.urandom(size)})})
    plan = data.draw(plans(base, arrays_for(np.zeros(4, np.uint8))))
    state, accepted = run_stage(
        wire.PAIR,
        honest,
        plan,
        lambda s: lambda nid, reply: server_round.accept_blob(s, nid, reply, size),
    )
    body_valid = isinstance(plan.body, RecordDict) and spec_pair_reply(plan.body, RND, size)
    ok = check_outcome(state, accepted, plan, body_valid, caplog)
    for nid in HONEST:
        assert state.blobs[nid] == honest[nid][wire.PAIR_REC][wire.BLOB]
    if ok:
        assert isinstance(plan.body, RecordDict)
        assert state.blobs[VICTIM] == plan.body[wire.PAIR_REC][wire.BLOB]
    else:
        assert VICTIM not in state.blobs


UPDATE_CASES: dict[str, dict[str, Any]] = {
    "corbin": {"mechanism": "corbin"},
    "corbin-z-digest": {"mechanism": "corbin", "test_z_digest": True},
    "augcorbin": {"mechanism": "augcorbin"},
    "ldpfl": {"mechanism": "ldpfl"},
    "cq": {"mechanism": "cq"},
    "gaussian": {"mechanism": "gaussian"},
    "laplace": {"mechanism": "laplace", "epsilon": 0.5},
    "fedavg": {"mechanism": "fedavg"},
    "fedcad": {"mechanism": "fedcad"},
    "ternary-bits": {"mechanism": "ternary", "ternary_encoding": "bits"},
    "ternary-int8": {"mechanism": "ternary", "ternary_encoding": "int8"},
}
M = 29
"""Parameters of the fuzzed update stage (not a multiple of 8: packed bits have padding)."""


def honest_update(
    cfg: AppConfig, c: torch.Tensor, r: torch.Tensor, rng: np.random.Generator
) -> RecordDict:
    """A valid ``train.update`` reply of ``cfg.mechanism`` for round ``RND``."""
    m = c.numel()
    mech = cfg.mechanism
    if one_bit(mech):
        key, values = wire.BITS, np.packbits(rng.integers(0, 2, m).astype(bool))
    elif mech == "ternary":
        t = rng.integers(-1, 2, m).astype(np.int8)
        key, _, _ = registry.update_spec(cfg, m)
        values = ternary.encode_ternary(t, cfg.param("ternary-encoding"))
    else:
        noise = rng.normal(0.0, 1.0, m)
        values = (c.numpy() + r.numpy() * np.clip(noise, -1, 1)).astype(np.float32)
        key = wire.VALUES
    head: dict[str, Any] = {wire.ROUND: RND}
    if cfg.paired:
        head[wire.NEXT_PUBKEY] = _pubkey()
        if cfg.test_z_digest:
            head[wire.Z_DIGEST] = os.urandom(32)
    return RecordDict(
        {
            wire.REPLY: ConfigRecord(head),
            wire.UPDATE_REC: ArrayRecord({key: wire.to_array(values)}),
            wire.METRICS: MetricRecord({k: float(rng.random()) for k in sorted(wire.METRIC_KEYS)}),
            "metrics": MetricRecord(
                {wire.M_TRAIN_LOSS: float(rng.random()), wire.M_NUM_EXAMPLES: 64, "steps": 1}
            ),
        }
    )


@pytest.mark.parametrize("case", sorted(UPDATE_CASES))
@given(data=st.data())
@fuzz_settings(25)
def test_server_update_reply_decoding(
    case: str, data: st.DataObject, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    caplog.clear()
    cfg = AppConfig().replace(**UPDATE_CASES[case])
    rng = np.random.default_rng(7)
    gen = torch.Generator().manual_seed(7)
    w_g = torch.randn(M, generator=gen)
    c = 0.1 * torch.randn(M, generator=gen)
    r = 0.5 + torch.rand(M, generator=gen)
    honest = {nid: honest_update(cfg, c, r, rng) for nid in HONEST}
    base = honest_update(cfg, c, r, rng)
    key, _, _ = registry.update_spec(cfg, M)
    plan = data.draw(plans(base, arrays_for(base.array_records[wire.UPDATE_REC][key].numpy())))
    aggregator = make_aggregator(cfg, w_g, c, r)
    state, accepted = run_stage(
        wire.UPDATE,
        honest,
        plan,
        lambda s: lambda nid, reply: server_round.accept_update(s, nid, reply, aggregator, cfg),
    )
    body_valid = isinstance(plan.body, RecordDict) and spec_update_reply(plan.body, RND, cfg, c, r)
    ok = check_outcome(state, accepted, plan, body_valid, caplog)
    # What was aggregated is exactly the accepted updates.
    reference = make_aggregator(cfg, w_g, c, r)
    for nid in HONEST:
        reference.add(honest[nid].array_records[wire.UPDATE_REC])
    if ok:
        assert isinstance(plan.body, RecordDict)
        reference.add(plan.body.array_records[wire.UPDATE_REC])
    assert aggregator.n == reference.n == len(HONEST) + ok
    assert set(state.client_metrics) == set(HONEST) | ({VICTIM} if ok else set())
    estimate, expected = aggregator.estimate(), reference.estimate()
    assert estimate is not None and expected is not None
    torch.testing.assert_close(estimate, expected, rtol=1e-6, atol=1e-6)
    if cfg.paired:
        assert (VICTIM in state.next_pubkeys) == ok
    # The app's records are kept as sent, for accepted nodes only.
    for nid in HONEST:
        assert dict(state.app_records[nid]) == {"metrics": honest[nid]["metrics"]}
    assert (VICTIM in state.app_records) == ok
    if ok:
        assert isinstance(plan.body, RecordDict)
        sent = {k: v for k, v in plan.body.items() if not wire.is_protocol_record(k)}
        assert dict(state.app_records[VICTIM]) == sent


@st.composite
def app_record_sets(draw: st.DrawFn) -> dict[str, Any]:
    """App records an update reply may carry, and hostile ones: extra ArrayRecords, MetricRecords
    with many entries or non-finite values, more than ``MAX_APP_RECORDS`` records, and
    ConfigRecords whose bytes or text (2 UTF-8 bytes a letter) bring the payload to just under,
    exactly at or just over ``MAX_APP_BYTES`` (two halves sum to the cap), or far over it."""
    count = draw(st.sampled_from([0, 1, 2, wire.MAX_APP_RECORDS, wire.MAX_APP_RECORDS + 1, 12]))
    out: dict[str, Any] = {}
    for i in range(count):
        name = draw(
            st.sampled_from(["metrics", "config", "arrays", f"app-{i}"]) | st.text(max_size=6)
        )
        if wire.is_protocol_record(name) or name in out:
            name = f"app-{i}"
        kind = draw(st.sampled_from(["metrics", "metrics", "huge", "config", "arrays", "big"]))
        if kind == "metrics":
            out[name] = draw(metric_records())
        elif kind == "huge":
            size = draw(st.sampled_from([wire.MAX_APP_METRICS, wire.MAX_APP_METRICS + 1, 500]))
            value = draw(st.sampled_from([1.0, 2, float("nan"), [0.5, 1.5]]))
            out[name] = MetricRecord({f"m{j}": value for j in range(size)})
        elif kind == "config":
            out[name] = draw(config_records())
        elif kind == "big":
            cap = wire.MAX_APP_BYTES
            size = draw(st.sampled_from([cap // 2, cap // 2 + 1, cap - 8, cap, cap + 1]))
            text = draw(st.booleans())
            out[name] = ConfigRecord({"blob": "é" * (size // 2) if text else b"\x00" * size})
        else:
            out[name] = ArrayRecord({"w": wire.to_array(np.zeros(3, np.float32))})
    return out


_CAP = wire.MAX_APP_BYTES


@given(app=app_record_sets())
@example(app={"config": ConfigRecord({"blob": b"\x00" * _CAP})})  # at the cap: accepted
@example(app={"config": ConfigRecord({"blob": b"\x00" * (_CAP + 1)})})  # one byte over
@example(
    app={"a": ConfigRecord({"t": "é" * (_CAP // 4)}), "b": ConfigRecord({"t": "é" * (_CAP // 4)})}
)
@example(app={"a": ConfigRecord({"t": "é" * (_CAP // 4)}), "m": MetricRecord({"x": 1.0})})
@example(app={"config": ConfigRecord({"blob": b"\x00" * 1_000_000})})  # hypothesis's find
@fuzz_settings(60)
def test_server_update_refuses_bad_app_records(app: dict[str, Any]) -> None:
    """``accept_update`` keeps the app's MetricRecords and ConfigRecords of an update reply and
    refuses, with a WireError and before aggregating anything, extra ArrayRecords, MetricRecords
    with too many entries or non-finite values, more than ``MAX_APP_RECORDS`` records, and
    records that carry more than ``MAX_APP_BYTES`` payload bytes together (the examples sit on
    both sides of that cap; the oracle counts the bytes by the spec, not by the server's code)."""
    cfg = AppConfig(mechanism="corbin")
    rng = np.random.default_rng(3)
    w_g, c, r = torch.zeros(M), torch.zeros(M), torch.ones(M)
    body = honest_update(cfg, c, r, rng)
    del body["metrics"]
    for name, rec in app.items():
        body[name] = rec
    state = RoundState(round=RND, run_id=RUN_ID, sampled=[VICTIM])
    aggregator = make_aggregator(cfg, w_g, c, r)
    reply = make_reply(server_round.instruction(SERVER_RT, wire.UPDATE, VICTIM, RND, {}), body)
    valid = spec_app_records(body)
    event(f"app records {'accepted' if valid else 'refused'}")
    app_bytes = spec_app_bytes(app)
    cap = wire.MAX_APP_BYTES
    event(f"app bytes {'over' if app_bytes > cap else 'at' if app_bytes == cap else 'under'} cap")
    if valid:
        server_round.accept_update(state, VICTIM, reply, aggregator, cfg)
        assert aggregator.n == 1
        assert dict(state.app_records[VICTIM]) == app
        return
    with pytest.raises(wire.WireError) as info:
        server_round.accept_update(state, VICTIM, reply, aggregator, cfg)
    assert str(info.value)
    assert aggregator.n == 0 and VICTIM not in state.client_metrics
    assert VICTIM not in state.app_records


# ============================================================================ client side
NID = 5
PARTNER = 9
MAX_PARAMS = 10_000
"""The fuzzed node's ``corbin-max-params`` (exact mode draws ``d`` bits per parameter)."""
ARRAYS = "arrays"
GLOBAL_MODEL: dict[str, np.ndarray] = {
    "w": (0.05 * np.random.default_rng(3).standard_normal((3, 5))).astype(np.float32),
    "b": np.linspace(-0.1, 0.1, 5).astype(np.float64),
    "n": np.array(7, dtype=np.int64),
}
"""The app's global model of the fuzzed update stage: two layers (float32 and float64) and an
integer counter that is not a weight."""


def global_arrays() -> ArrayRecord:
    return ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in GLOBAL_MODEL.items()})


def client_context(**overrides: Any) -> Context:
    """A node whose policy admits exactly the run's mechanism settings (as the launcher does)."""
    run_config = make_cfg(**overrides)
    policy = node_policy({**AppConfig().to_flower(), **run_config})
    return Context(
        run_id=RUN_ID,
        node_id=NID,
        node_config={
            "partition-id": 0,
            "num-partitions": 2,
            "corbin-max-params": MAX_PARAMS,
            **policy,
        },
        state=RecordDict(),
        run_config=run_config,
    )


def params_of(cfg: AppConfig) -> dict[str, Any]:
    """The mechanism settings every instruction carries (``registry.PARAM_KEYS``)."""
    flat = cfg.to_flower()
    return {key: flat[key] for key in registry.PARAM_KEYS}


def instruction(content: RecordDict, group: str = str(RND), msg_type: str = wire.TRAIN) -> Message:
    msg = Message(content, dst_node_id=NID, message_type=msg_type, group_id=group)
    msg.metadata.__dict__["_message_id"] = uuid.uuid4().hex
    return msg


def echo_app(msg: Message, context: Context) -> Message:
    """A trivial train handler: it "trains" by returning the model it got, plus app metrics.

    It checks that the mod showed it only the app's records (never a ``corbin*`` record).
    """
    assert not any(wire.is_protocol_record(name) for name in msg.content)
    content = RecordDict(
        {name: rec for name, rec in msg.content.items() if isinstance(rec, ArrayRecord)}
    )
    content["metrics"] = MetricRecord({wire.M_TRAIN_LOSS: 1.0, wire.M_NUM_EXAMPLES: 8})
    return Message(content, reply_to=msg)


def send(ctx: Context, msg: Message, stage: str) -> Message:
    """Deliver ``msg`` through the real entry point: the project's ClientApp for keygen/pair,
    ``corbin_mod`` in front of :func:`echo_app` for the update stage."""
    if stage == wire.UPDATE:
        return corbin_mod(msg, ctx, echo_app)
    return client_app.app(msg, ctx)


def state_snapshot(ctx: Context) -> dict[str, Any]:
    """Everything in ``context.state`` as plain values."""
    out: dict[str, Any] = {}
    for name, rec in ctx.state.items():
        if isinstance(rec, ArrayRecord):
            out[name] = {k: (a.dtype, tuple(a.shape), a.data) for k, a in rec.items()}
        else:
            out[name] = dict(rec.items())
    return out


@dataclass
class ClientPlan:
    """A drawn instruction: its content, group id and message type."""

    content: RecordDict
    group: str
    msg_type: str
    untouched: bool


@st.composite
def client_plans(draw: st.DrawFn, base: RecordDict, arrays: st.SearchStrategy[Array]) -> ClientPlan:
    kind = draw(st.sampled_from(["valid", "mutated", "mutated", "mutated", "random"]))
    if kind == "valid":
        content = copy.deepcopy(base)
    elif kind == "mutated":
        content = draw(mutations(base, arrays))
    else:
        content = draw(record_dicts(arrays))
    group, mtype = str(RND), wire.TRAIN
    variant = draw(st.sampled_from(["none"] * 6 + ["group", "type"]))
    if variant == "group":
        group = draw(
            st.sampled_from([str(RND + 1), "", "²", "9" * 5000, "05", "-1", "0"])
            | st.text(max_size=5)
        )
    elif variant == "type":
        mtype = draw(st.sampled_from(["evaluate", "query", "query.other", "train.keygen"]))
    untouched = kind == "valid" and group == str(RND) and mtype == wire.TRAIN
    return ClientPlan(content, group, mtype, untouched)


PASSED_THROUGH = "passed through to the app"


def check_client(
    ctx: Context,
    plan: ClientPlan,
    valid: bool | None,
    stage: str,
    caplog: pytest.LogCaptureFixture,
    follow_up: Callable[[], Message],
) -> Message | None:
    """Send ``plan`` through the real entry point and check the shared client-side properties.

    ``valid`` is the spec's verdict (None: the mechanism settings were changed, and
    :func:`test_client_mechanism_settings` decides). Returns the reply if it was answered.
    """
    before = state_snapshot(ctx)
    caplog.clear()
    msg = instruction(plan.content, plan.group, plan.msg_type)
    if plan.msg_type != wire.TRAIN:
        # Not a train message: corbin_mod hands it to the app untouched (evaluate and query
        # carry only the public global model); Flower's router never gives it a train handler.
        def app(got: Message, node_context: Context) -> Message:
            assert got is msg
            return Message(Error(code=0, reason=PASSED_THROUGH), reply_to=got)

        reply = corbin_mod(msg, ctx, app)
        assert reply.has_error() and reply.error.reason == PASSED_THROUGH
        assert state_snapshot(ctx) == before
        event("not a train message: passed through")
        return None
    reply = send(ctx, msg, stage)
    assert isinstance(reply, Message)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]
    if plan.untouched:
        assert valid, "the unmodified instruction must be valid"
    event(f"instruction {'answered' if reply.has_content() else 'refused'}")
    if valid:
        assert reply.has_content(), reply.error.reason if reply.has_error() else ""
        return reply
    if valid is None and reply.has_content():
        return None
    assert reply.has_error(), "an invalid instruction was answered"
    check_refusal(ctx, reply, before, caplog)
    again = send(ctx, follow_up(), stage)
    assert again.has_content(), again.error.reason
    return None


def check_refusal(
    ctx: Context, reply: Message, before: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """A refusal is an error reply with a reason, one warning that names the node and the
    reason, and no change of the node's state."""
    policy = (reply.error.reason or "").startswith("refused by the node's privacy policy")
    assert reply.error.code == (wire.ERROR_CODE_POLICY if policy else wire.ERROR_CODE_REJECTED)
    assert reply.error.reason
    lines = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING
        and r.getMessage().startswith((f"node {NID}: rejected", f"node {NID}: refused"))
    ]
    assert len(lines) == 1 and reply.error.reason.split(": ", 1)[-1] in lines[0], lines
    assert state_snapshot(ctx) == before, "a rejected instruction changed the node's state"


def keygen_content(cfg: AppConfig, rnd: int = RND) -> RecordDict:
    head = {wire.STAGE: wire.KEYGEN, wire.ROUND: rnd, **params_of(cfg)}
    return RecordDict({wire.CFG: ConfigRecord(head)})


def spec_client_round(content: RecordDict, group: str) -> int | None:
    """The instruction's round if record and group id agree and it is >= 1."""
    rec = content.get(wire.CFG)
    rnd = rec.get(wire.ROUND) if isinstance(rec, ConfigRecord) else None
    if not is_int(rnd, 1) or group_round(group) != rnd:
        return None
    return rnd


def spec_params(rec: ConfigRecord, cfg: AppConfig) -> bool | None:
    """True if the instruction carries exactly the run's mechanism settings, False if one is
    missing, None if one was changed (then the settings test decides)."""
    if not set(registry.PARAM_KEYS) <= set(rec):
        return False
    expected = params_of(cfg)
    same = all(type(rec[k]) is type(v) and rec[k] == v for k, v in expected.items())
    return True if same else None


def spec_head(plan: ClientPlan, stage: str, cfg: AppConfig) -> bool | None:
    """The checks every stage shares: records, stage, round and mechanism settings."""
    content = plan.content
    protocol = {k: v for k, v in content.items() if k == "corbin" or k.startswith("corbin.")}
    rec = protocol.get(wire.CFG)
    if type(rec) is not ConfigRecord or rec.get(wire.STAGE) != stage:
        return False
    if spec_client_round(content, plan.group) is None:
        return False
    return spec_params(rec, cfg)


def both(a: bool | None, b: bool) -> bool | None:
    """``a and b`` where None (unknown) stays unknown unless ``b`` is False."""
    if not b:
        return False
    return a


@given(data=st.data())
@fuzz_settings(60)
def test_client_keygen_instruction_decoding(
    data: st.DataObject, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    ctx = client_context()
    cfg = AppConfig.from_flower(ctx.run_config)
    base = keygen_content(cfg)
    plan = data.draw(client_plans(base, arrays_for(np.zeros(4, np.uint8))))
    valid = both(
        spec_head(plan, wire.KEYGEN, cfg),
        exact_records(plan.content, {wire.CFG: ConfigRecord})
        and set(plan.content[wire.CFG]) == registry.keygen_cfg_keys(),
    )
    reply = check_client(
        ctx, plan, valid, wire.KEYGEN, caplog, lambda: instruction(keygen_content(cfg))
    )
    if reply is not None:
        rnd = plan.content[wire.CFG][wire.ROUND]
        assert spec_keygen_reply(reply.content, rnd)
        assert handlers._private_key(ctx, rnd) is not None


def pair_content(cfg: AppConfig, partner_pk: bytes, m: int) -> RecordDict:
    body: dict[str, Any] = {
        wire.STAGE: wire.PAIR,
        wire.ROUND: RND,
        **params_of(cfg),
        wire.PARTNER: PARTNER,
        wire.PARTNER_PUBKEY: partner_pk,
    }
    if cfg.cr_mode == "exact":
        body[wire.NUM_PARAMS] = m
    return RecordDict({wire.CFG: ConfigRecord(body)})


def model_layout() -> Any:
    return layout_of_arrays(global_arrays())


def spec_pair_instruction(plan: ClientPlan, cfg: AppConfig) -> bool | None:
    head = spec_head(plan, wire.PAIR, cfg)
    if head is False or not exact_records(plan.content, {wire.CFG: ConfigRecord}):
        return False
    rec = plan.content[wire.CFG]
    if (
        set(rec) != registry.pair_cfg_keys(cfg.cr_mode)
        or spec_client_round(plan.content, plan.group) != RND
    ):
        return False  # the node holds a private key for round RND only
    partner = rec[wire.PARTNER]
    return both(
        head,
        is_int(partner, 0, 2**64)
        and partner != NID
        and is_pubkey(rec[wire.PARTNER_PUBKEY])
        and (cfg.cr_mode != "exact" or is_int(rec[wire.NUM_PARAMS], 1, MAX_PARAMS + 1)),
    )


@pytest.mark.parametrize("mode", ["relay", "exact"])
@given(data=st.data())
@fuzz_settings(30)
def test_client_pair_instruction_decoding(
    mode: str, data: st.DataObject, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    m = model_layout().m
    ctx = client_context(cr_mode=mode)
    cfg = AppConfig.from_flower(ctx.run_config)
    assert client_app.app(instruction(keygen_content(cfg)), ctx).has_content()
    _, partner_pk = pair_crypto.generate_keypair()
    base = pair_content(cfg, partner_pk, m)
    plan = data.draw(client_plans(base, arrays_for(np.zeros(4, np.uint8))))
    valid = spec_pair_instruction(plan, cfg)
    reply = check_client(
        ctx, plan, valid, wire.PAIR, caplog, lambda: instruction(copy.deepcopy(base))
    )
    if reply is not None:
        rec = plan.content[wire.CFG]
        bits = cfg.d * rec[wire.NUM_PARAMS] if mode == "exact" else 0
        secret = wire.SEED_BYTES if mode == "relay" else wire.packed_len(bits)
        assert spec_pair_reply(reply.content, RND, wire.blob_len(secret))
        assert ctx.state.config_records[handlers.STATE_PAIR][wire.ROUND] == RND


CLIENT_UPDATE_CASES: dict[str, tuple[dict[str, Any], str]] = {
    "corbin-paired": ({"mechanism": "corbin"}, wire.PAIRED),
    "corbin-exact": ({"mechanism": "corbin", "cr_mode": "exact"}, wire.PAIRED),
    "corbin-partner-gone": ({"mechanism": "corbin"}, wire.PARTNER_GONE),
    "augcorbin-independent": ({"mechanism": "augcorbin"}, wire.INDEPENDENT),
    "corbin-derived": ({"mechanism": "corbin", "cr_mode": "derived"}, wire.PAIRED),
    "cq": ({"mechanism": "cq"}, wire.SOLO),
    "gaussian": ({"mechanism": "gaussian"}, wire.SOLO),
    "ternary": ({"mechanism": "ternary"}, wire.SOLO),
}


def update_setup(
    overrides: dict[str, Any],
    assignment: str,
    *,
    partner_secret: bytes | None = None,
    partner_y: int = 1,
) -> tuple[Context, AppConfig, RecordDict]:
    """A node ready for the update stage of round ``RND`` and the valid instruction for it
    (``partner_secret``, ``partner_y``: what the partner seals in its blob, an honest secret by
    default)."""
    ctx = client_context(**overrides)
    cfg = AppConfig.from_flower(ctx.run_config)
    layout = model_layout()
    body: dict[str, Any] = {wire.STAGE: wire.UPDATE, wire.ROUND: RND, **params_of(cfg)}
    body[wire.ASSIGNMENT] = assignment
    body[wire.ARRAYS_KEY] = ARRAYS
    if cfg.paired:
        keys = client_app.app(instruction(keygen_content(cfg)), ctx)
        own_pk = keys.content[wire.KEYS][wire.PUBKEY]
        partner_sk, partner_pk = pair_crypto.generate_keypair()
        if assignment == wire.PAIRED and cfg.cr_mode == "derived":
            body[wire.PARTNER] = PARTNER
            body[wire.PARTNER_PUBKEY] = partner_pk
        elif assignment == wire.PAIRED:
            sent = client_app.app(instruction(pair_content(cfg, partner_pk, layout.m)), ctx)
            assert sent.has_content(), sent.error.reason
            pctx = pair_crypto.PairContext(RUN_ID, RND, PARTNER, NID)
            key = pair_crypto.derive_pair_key(partner_sk, own_pk, pctx)
            secret = (  # an honest partner's z: d*m random bits, zero padding
                np.packbits(np.frombuffer(os.urandom(cfg.d * layout.m), np.uint8) & 1).tobytes()
                if cfg.cr_mode == "exact"
                else os.urandom(wire.SEED_BYTES)
            )
            if partner_secret is not None:
                secret = partner_secret
            body[wire.PARTNER] = PARTNER
            body[wire.PARTNER_BLOB] = pair_crypto.seal_blob(key, partner_y, secret, pctx)
        elif assignment == wire.PARTNER_GONE:
            body[wire.PARTNER] = PARTNER
    if cfg.mechanism == "cq":
        body |= {CQ_SEED: os.urandom(8), CQ_RANK: 1, CQ_CLIENTS: 3}
    ranges = ArrayRecord(
        {
            wire.CENTER: wire.to_array(np.zeros(layout.num_layers, np.float32)),
            wire.RADIUS: wire.to_array(np.full(layout.num_layers, 0.2, np.float32)),
        }
    )
    content = RecordDict(
        {
            wire.CFG: ConfigRecord(body),
            wire.RANGE: ranges,
            ARRAYS: global_arrays(),
            "config": ConfigRecord({"server-round": RND}),
        }
    )
    return ctx, cfg, content


def spec_model(record: ArrayRecord) -> tuple[int, int] | None:
    """``(parameters, layers)`` of the app's model by the spec, or None if it is not usable.

    A layer is an array whose declared dtype is floating-point and whose declared shape has at
    least one element; its bytes must be exactly what ``np.save`` makes of that dtype and shape,
    and its values finite. Other arrays are the app's own business.
    """
    m = layers = 0
    for arr in record.values():
        try:
            dtype = np.dtype(arr.dtype)
        except TypeError:
            continue
        shape = tuple(int(s) for s in arr.shape)
        size = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if dtype.kind != "f" or size < 1:
            continue
        if arr.stype != SType.NUMPY or len(arr.data) < dtype.itemsize * size:
            return None
        values = np.frombuffer(arr.data[len(arr.data) - dtype.itemsize * size :], dtype=dtype)
        values = values.reshape(shape)
        if npy_bytes(values) != arr.data:
            return None
        if not np.isfinite(values.astype(np.float64)).all():
            return None
        if not np.isfinite(values.astype(np.float32)).all():
            return None
        m, layers = m + size, layers + 1
    return (m, layers) if layers else None


def spec_update_instruction(plan: ClientPlan, cfg: AppConfig) -> bool | None:
    """The full spec of an update instruction, for a node that has not yet sent an update
    (written from the wire docstring, independently of ``client.handlers``)."""
    content = plan.content
    head = spec_head(plan, wire.UPDATE, cfg)
    protocol = {k: v for k, v in content.items() if k == "corbin" or k.startswith("corbin.")}
    if head is False or not exact_records(
        RecordDict(protocol), {wire.CFG: ConfigRecord, wire.RANGE: ArrayRecord}
    ):
        return False
    rec, ranges = content[wire.CFG], content[wire.RANGE]
    assignment = rec.get(wire.ASSIGNMENT)
    if not isinstance(assignment, str) or assignment not in assignments_of(cfg):
        return False
    if set(rec) != registry.update_cfg_keys(cfg.mechanism, assignment, cfg.cr_mode):
        return False
    key = rec[wire.ARRAYS_KEY]
    if not isinstance(key, str) or key == "corbin" or key.startswith("corbin."):
        return False
    if type(content.get(key)) is not ArrayRecord:
        return False
    model = spec_model(content[key])
    if model is None or model[0] > MAX_PARAMS:
        return False
    _, layers = model
    if set(ranges) != {wire.CENTER, wire.RADIUS}:
        return False
    center = spec_array(ranges[wire.CENTER], np.float32, layers)
    radius = spec_array(ranges[wire.RADIUS], np.float32, layers)
    if center is None or radius is None or not np.isfinite(center).all():
        return False
    if not (np.isfinite(radius).all() and (radius > 0).all()):
        return False
    if cfg.mechanism == "cq":
        seed, clients, rank = rec[CQ_SEED], rec[CQ_CLIENTS], rec[CQ_RANK]
        if not (isinstance(seed, bytes) and len(seed) == wire.SHARED_SEED_BYTES):
            return False
        if not is_int(clients, 1, wire.MAX_SHARED_CLIENTS + 1) or not is_int(rank, 0, clients):
            return False
    if assignment in (wire.PAIRED, wire.PARTNER_GONE):
        partner = rec[wire.PARTNER]
        if not is_int(partner, 0, 2**64) or partner == NID:
            return False
    if assignment == wire.PAIRED:
        if cfg.cr_mode == "derived":
            pk = rec[wire.PARTNER_PUBKEY]
            return both(head, isinstance(pk, bytes) and len(pk) == wire.KEY_BYTES)
        return both(head, isinstance(rec[wire.PARTNER_BLOB], bytes))
    return head


def check_update_reply(reply: Message, instruction_content: RecordDict, cfg: AppConfig) -> None:
    """What the client answers is what the server's own validator accepts."""
    from corbin_fl.layout import expand_per_element

    rec = instruction_content[wire.CFG]
    layout = layout_of_arrays(instruction_content[rec[wire.ARRAYS_KEY]])
    ranges = instruction_content[wire.RANGE]
    c = expand_per_element(torch.from_numpy(ranges[wire.CENTER].numpy()), layout)
    r = expand_per_element(torch.from_numpy(ranges[wire.RADIUS].numpy()), layout)
    state = RoundState(round=rec[wire.ROUND], run_id=RUN_ID, sampled=[NID])
    aggregator = make_aggregator(cfg, torch.zeros(layout.m), c, r)
    server_round.accept_update(state, NID, reply, aggregator, cfg)
    assert aggregator.n == 1
    sent = {k: v for k, v in reply.content.items() if not wire.is_protocol_record(k)}
    assert "metrics" in sent  # (and the app's train-info, with the device it trained on)
    assert dict(state.app_records[NID]) == sent


@pytest.mark.parametrize("case", sorted(CLIENT_UPDATE_CASES))
@given(data=st.data())
@fuzz_settings(25)
def test_client_update_instruction_decoding(
    case: str, data: st.DataObject, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    overrides, assignment = CLIENT_UPDATE_CASES[case]
    ctx, cfg, base = update_setup(overrides, assignment)
    slot = data.draw(
        st.sampled_from([(ARRAYS, "w"), (ARRAYS, "b"), (ARRAYS, "n"), (wire.RANGE, wire.CENTER)])
        | st.just((wire.RANGE, wire.RADIUS))
    )
    arrays = arrays_for(np.ravel(base[slot[0]][slot[1]].numpy()))
    plan = data.draw(client_plans(base, arrays))
    valid = spec_update_instruction(plan, cfg)
    reply = check_client(
        ctx, plan, valid, wire.UPDATE, caplog, lambda: instruction(copy.deepcopy(base))
    )
    if reply is not None:
        check_update_reply(reply, plan.content, cfg)


def test_client_rejects_replayed_and_stale_instructions(caplog: pytest.LogCaptureFixture) -> None:
    """A replayed pair instruction, another update for a round already handled, or one for an
    older round is refused with a reason (the same update instruction again gets the same
    reply), and the node's state stays as the first (valid) instruction left it. The
    first update goes through the project's real ClientApp (its own train handler)."""
    caplog.set_level(logging.WARNING)
    ctx, cfg, update = update_setup({"mechanism": "corbin"}, wire.PAIRED)
    task_arrays = ArrayRecord(
        {
            k: Array(v.detach().numpy().copy())
            for k, v in client_train.LocalTask.get(cfg).model.state_dict().items()
        }
    )
    update[ARRAYS] = task_arrays
    layers = layout_of_arrays(task_arrays).num_layers
    update[wire.RANGE] = ArrayRecord(
        {
            wire.CENTER: wire.to_array(np.zeros(layers, np.float32)),
            wire.RADIUS: wire.to_array(np.full(layers, 0.2, np.float32)),
        }
    )
    _, partner_pk = pair_crypto.generate_keypair()
    replayed_pair = client_app.app(instruction(pair_content(cfg, partner_pk, 20)), ctx)
    assert replayed_pair.has_error() and "already answered" in replayed_pair.error.reason
    first = client_app.app(instruction(copy.deepcopy(update)), ctx)
    assert first.has_content(), first.error.reason
    check_update_reply(first, update, cfg)
    after = state_snapshot(ctx)
    # The same instruction again (a re-send after a SuperLink outage): the same reply, byte for
    # byte, no second release (client/replay.py); another update of the round is refused.
    same = client_app.app(instruction(copy.deepcopy(update)), ctx)
    assert same.has_content() and same.content.object_id == first.content.object_id
    assert state_snapshot(ctx) == after
    changed = copy.deepcopy(update)
    changed[wire.RANGE] = ArrayRecord(
        {
            wire.CENTER: wire.to_array(np.zeros(layers, np.float32)),
            wire.RADIUS: wire.to_array(np.full(layers, 0.3, np.float32)),
        }
    )
    again = client_app.app(instruction(changed), ctx)
    assert again.has_error() and again.error.code == wire.ERROR_CODE_REJECTED
    assert f"update for round {RND} but round {RND} was already handled" in again.error.reason
    stale = copy.deepcopy(update)
    stale[wire.CFG][wire.ROUND] = RND - 1
    older = client_app.app(instruction(stale, group=str(RND - 1)), ctx)
    assert older.has_error() and "already handled" in older.error.reason
    assert state_snapshot(ctx) == after
    rejected = [r.getMessage() for r in caplog.records if f"node {NID}: rejected" in r.getMessage()]
    assert len(rejected) == 3


# ============================================================================ mechanism settings
PARAM_CANDIDATES: dict[str, list[Any]] = {
    "mechanism": [*MECHANISMS, "nope", "", "CORBIN"],
    "epsilon": [0.5, 2.0, 0.0, -1.0, float("nan"), float("inf"), 1e308, 1],
    "delta": [0.0, 1e-6, 1e-3, 1.0, -1e-5, float("nan")],
    "d": [0, 1, 3, 5, 64, 10**6, -2, 2.5],
    "p-x": [0.0, 0.25, 0.5, 1.0, 1.5],
    "cr-mode": ["relay", "exact", "derived", "x"],
    "range-mode": ["update", "model", "x"],
    "ternary-encoding": ["bits", "int8", "x"],
    "test-z-digest": [True, False, 1],
}
"""Values of interest per mechanism setting (any other key gets only arbitrary values)."""


@st.composite
def settings_changes(draw: st.DrawFn) -> dict[str, Any]:
    """One to three mechanism settings dropped (``DROP``) or set to any value."""
    size = draw(st.sampled_from([1, 1, 1, 2, 3]))
    keys = draw(
        st.lists(st.sampled_from(registry.PARAM_KEYS), min_size=size, max_size=size, unique=True)
    )
    out: dict[str, Any] = {}
    for key in keys:
        how = draw(st.sampled_from(["drop", "candidate", "candidate", "candidate", "any"]))
        if how == "drop":
            out[key] = DROP
        elif how == "candidate":
            out[key] = draw(st.sampled_from(PARAM_CANDIDATES.get(key, [0.5, 0.0, -1.0, "x"])))
        else:
            out[key] = draw(config_values)
    return out


DROP = object()
"""Marks a setting removed from the instruction."""


@pytest.mark.parametrize("stage", [wire.KEYGEN, wire.UPDATE])
@given(changes=settings_changes())
@fuzz_settings(80)
def test_client_mechanism_settings(
    stage: str, changes: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """Any value of any mechanism setting in an instruction, a wrong type or a missing key, is
    answered (if it parses and the node's policy admits it) or refused with an error reply that
    names the cause; never an exception, never an ERROR log, no change of the node's state."""
    caplog.set_level(logging.WARNING)
    if stage == wire.KEYGEN:
        ctx = client_context()
        cfg = AppConfig.from_flower(ctx.run_config)
        content = keygen_content(cfg)
    else:
        ctx, cfg, content = update_setup({"mechanism": "gaussian"}, wire.SOLO)
    rec = content[wire.CFG]
    for key, value in changes.items():
        if value is DROP:
            del rec[key]
        else:
            rec[key] = value
    before = state_snapshot(ctx)
    caplog.clear()
    reply = send(ctx, instruction(content), stage)
    assert isinstance(reply, Message)
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    dropped = sorted(k for k, v in changes.items() if v is DROP)
    params = {k: rec[k] for k in registry.PARAM_KEYS if k in rec}
    if dropped:
        expected = "lacks the mechanism settings"
        names = dropped
    else:
        try:
            parsed = AppConfig.from_flower(params)
        except ConfigError as exc:
            expected, names = "bad mechanism settings", sorted(exc.errors)
        else:
            try:
                Policy.from_node(ctx.node_config).check(parsed)
            except PolicyError:
                expected, names = "refused by the node's privacy policy", []
            else:
                expected, names = "", []
    event(f"settings: {expected or 'parse and admitted'}")
    if not expected:  # the stage itself decides (e.g. keygen for a mechanism that never pairs)
        if reply.has_error():
            check_refusal(ctx, reply, before, caplog)
        elif stage == wire.KEYGEN:
            assert spec_keygen_reply(reply.content, RND)
        return
    assert reply.has_error(), f"instruction with bad settings {changes} was answered"
    reason = reply.error.reason
    assert expected in reason, reason
    assert names or expected.startswith("refused")
    named = [name for name in names if repr(name) in reason or f"{name}:" in reason]
    # The reason is cut at 2,000 characters: the first cause is always named, and every
    # cause when nothing was cut (a huge value's repr can push the others out).
    assert not names or named[:1] == names[:1], (names, reason[:300])
    if len(reason) < 1900:
        assert named == names, (names, reason[:300])
    check_refusal(ctx, reply, before, caplog)


# ============================================================================ corbin_fl.arrays
FLOAT_DTYPES = (np.float16, np.float32, np.float64)


@st.composite
def models(draw: st.DrawFn) -> dict[str, np.ndarray]:
    """A model as any set of named arrays: floating-point layers of any float dtype and shape
    (empty ones too), and integer / boolean arrays that are not weights."""
    names = draw(st.lists(st.text(min_size=1, max_size=6), min_size=1, max_size=5, unique=True))
    out: dict[str, np.ndarray] = {}
    for name in names:
        dtype = draw(st.sampled_from([*FLOAT_DTYPES, *FLOAT_DTYPES, np.int64, np.bool_]))
        weight = np.dtype(dtype).kind == "f"
        # Float layers of at least one dimension and one element here; 0-d and empty float
        # arrays have their own tests below.
        shape = draw(
            hnp.array_shapes(
                min_dims=1 if weight else 0, max_dims=3, min_side=1 if weight else 0, max_side=4
            )
        )
        elements = st.floats(-1e4, 1e4, width=16) if np.dtype(dtype).kind == "f" else None
        out[name] = draw(hnp.arrays(dtype, shape, elements=elements))
    return out


def weight_names(model: dict[str, np.ndarray]) -> list[str]:
    return [k for k, v in model.items() if v.dtype.kind == "f" and v.size >= 1]


def as_record(model: dict[str, np.ndarray]) -> ArrayRecord:
    """The model as an ArrayRecord (0-d arrays stay 0-d: no ``np.ascontiguousarray``)."""
    return ArrayRecord({k: Array(np.array(v, order="C", copy=True)) for k, v in model.items()})


@given(model=models())
@fuzz_settings(80)
def test_arrays_round_trip_any_float_model(model: dict[str, np.ndarray]) -> None:
    """``unflatten(flatten(x))`` is ``x``: every floating-point array of any float dtype keeps
    its values, shape and dtype, in record order; other arrays are left as they are."""
    record = as_record(model)
    weights = weight_names(model)
    if not weights:
        with pytest.raises(ArrayLayoutError):
            layout_of_arrays(record)
        return
    layout = layout_of_arrays(record)
    assert list(layout.names) == weights
    assert layout.m == sum(model[k].size for k in weights)
    assert [tuple(s) for s in layout.shapes] == [model[k].shape for k in weights]
    flat = flatten_arrays(record, layout)
    assert flat.dtype == np.float32 and flat.shape == (layout.m,)
    expected = np.concatenate([model[k].astype(np.float32).reshape(-1) for k in weights])
    np.testing.assert_array_equal(flat, expected)
    back = unflatten_arrays(flat, layout, record)
    assert list(back.keys()) == list(record.keys())
    for name, values in model.items():
        got = back[name].numpy()
        assert got.dtype == values.dtype and got.shape == values.shape, name
        np.testing.assert_array_equal(got, values)
    check_same_weights(back, layout)
    # A new vector lands where the layout says, cast to each array's dtype.
    shifted = unflatten_arrays(flat + 1, layout, record)
    expected_shifted = [
        (model[k].astype(np.float32).reshape(-1) + 1).astype(model[k].dtype).astype(np.float32)
        for k in weights
    ]
    np.testing.assert_array_equal(flatten_arrays(shifted, layout), np.concatenate(expected_shifted))


@given(model=models(), data=st.data())
@fuzz_settings(80)
def test_arrays_refuse_mismatched_models(model: dict[str, np.ndarray], data: st.DataObject) -> None:
    """An ArrayRecord that does not fit the layout (a layer missing, reshaped, of a non-float
    dtype, with NaN/inf, an extra layer) or a vector of another length is refused with an
    ArrayLayoutError, never accepted and never another exception."""
    weights = weight_names(model)
    if not weights:
        return
    record = as_record(model)
    layout = layout_of_arrays(record)
    name = data.draw(st.sampled_from(weights))
    how = data.draw(st.sampled_from(["missing", "reshape", "int", "nonfinite", "extra", "length"]))
    other = dict(model)
    values = model[name]
    if how == "missing":
        del other[name]
    elif how == "reshape":
        other[name] = np.zeros(values.size + data.draw(st.integers(1, 3)), values.dtype)
    elif how == "int":
        other[name] = values.astype(np.int32)
    elif how == "nonfinite":
        bad = values.astype(values.dtype, copy=True).reshape(-1)
        bad[data.draw(st.integers(0, bad.size - 1))] = data.draw(
            st.sampled_from([np.nan, np.inf, -np.inf])
        )
        other[name] = bad.reshape(values.shape)
    elif how == "extra":
        other["\x00extra"] = np.ones(2, np.float32)
    event(f"mismatch: {how}")
    if how == "length":
        size = data.draw(st.sampled_from([0, layout.m - 1, layout.m + 1]))
        with pytest.raises(ArrayLayoutError):
            unflatten_arrays(np.zeros(size, np.float32), layout, record)
        return
    changed = as_record(other)
    with pytest.raises(ArrayLayoutError):
        check_same_weights(changed, layout)
        flatten_arrays(changed, layout)


def test_arrays_refuse_values_beyond_float32() -> None:
    """A float64 value that float32 cannot hold would become inf in the flat vector: refused."""
    record = as_record({"w": np.array([1.0, 1e300], np.float64)})
    with pytest.raises(ArrayLayoutError, match="NaN or inf"):
        flatten_arrays(record, layout_of_arrays(record))


def test_arrays_keep_0d_float_layers() -> None:
    """A 0-d float array (a scalar parameter, e.g. a learnable temperature) is one layer of one
    element, and ``unflatten_arrays`` gives it back 0-d (an app loads it with its own shape)."""
    record = as_record({"t": np.array(1.5, np.float32), "w": np.ones(3, np.float64)})
    layout = layout_of_arrays(record)
    assert layout.m == 4 and layout.num_layers == 2
    back = unflatten_arrays(flatten_arrays(record, layout), layout, record)
    assert back["t"].numpy().shape == () and back["t"].numpy() == np.float32(1.5)
    assert back["w"].numpy().dtype == np.float64


def test_arrays_ignore_empty_float_arrays() -> None:
    """An empty float array is not a layer (nothing to quantize), in the layout and in the check
    of the trained model alike: a model with one still round-trips."""
    record = as_record({"e": np.zeros((0, 3), np.float32), "w": np.ones(3, np.float32)})
    layout = layout_of_arrays(record)
    assert layout.names == ("w",)
    check_same_weights(record, layout)
    back = unflatten_arrays(flatten_arrays(record, layout), layout, record)
    assert back["e"].numpy().shape == (0, 3)


@pytest.mark.parametrize("node_leads", [True, False])
def test_client_exact_bits_with_padding_from_the_partner_fall_back(
    node_leads: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Exact mode: a partner whose (authenticated) blob carries ``z`` with non-zero padding bits
    cannot make the node fail the round. A leading node uses its own bits; a following node
    falls back to ``ldpq`` with reason ``blob-invalid`` (the wire docstring: anything wrong with
    the pair's randomness is a fall-back, never an error)."""
    from corbin_fl.mechanisms.pairing import is_lead

    m = model_layout().m
    d = AppConfig().d
    assert (d * m) % 8, "the model must leave padding bits"
    padded = np.packbits(np.ones(d * m, np.uint8)).tobytes()[:-1] + bytes([0xFF])
    monkeypatch.setattr(handlers, "draw_y", lambda: 0)  # the node's own Y
    partner_y = next(y for y in (0, 1) if is_lead(NID, PARTNER, 0, y) == node_leads)
    ctx, cfg, content = update_setup(
        {"mechanism": "corbin", "cr_mode": "exact"},
        wire.PAIRED,
        partner_secret=padded,
        partner_y=partner_y,
    )
    reply = send(ctx, instruction(content), wire.UPDATE)
    assert reply.has_content(), reply.error.reason
    check_update_reply(reply, content, cfg)
    metrics = reply.content[wire.METRICS]
    if node_leads:
        assert metrics[wire.M_PAIRED] == 1
    else:
        assert metrics[wire.M_PAIRED] == 0
        reason = wire.FALLBACK_REASONS[int(metrics[wire.M_FALLBACK_CODE])]
        assert reason == "blob-invalid", reason


def forged_layer(how: str) -> Array:
    """The ``w`` layer (float32 [3, 5]) of the global model with forged ``.npy`` bytes: its
    declared dtype and shape say float32 [3, 5], its bytes do not."""
    good = npy_bytes(np.zeros((3, 5), np.float32))
    body = bytes(4 * 15)
    header = {"descr": "<f4", "fortran_order": False, "shape": (3, 5)}
    data = {
        "huge-header": npy_with_header({**header, "shape": (2**40,)}, body, (1, 0)),
        "truncated": good[:-4],
        "header-only": good[: len(good) - len(body)],
        "object-dtype": npy_with_header({**header, "descr": "|O"}, body, (1, 0)),
        "other-dtype": npy_bytes(np.zeros((3, 5), np.int32)),
        "other-shape": npy_bytes(np.zeros(15, np.float32)),
        "trailing-bytes": good + b"\x00" * 8,
    }[how]
    return Array(dtype="float32", shape=(3, 5), stype=SType.NUMPY, data=data)


@pytest.mark.parametrize(
    "how",
    [
        "huge-header",
        "truncated",
        "header-only",
        "object-dtype",
        "other-dtype",
        "other-shape",
        "trailing-bytes",
    ],
)
def test_client_refuses_forged_model_arrays(how: str, caplog: pytest.LogCaptureFixture) -> None:
    """A global model whose bytes disagree with the array's declared dtype and shape is refused
    with an error reply naming the array; the node never decodes what the header alone claims
    (a header claiming 2**40 elements would make ``np.load`` allocate 4 TiB), never logs at
    ERROR, and keeps its state."""
    caplog.set_level(logging.WARNING)
    ctx, _, content = update_setup({"mechanism": "gaussian"}, wire.SOLO)
    content[ARRAYS]["w"] = forged_layer(how)
    before = state_snapshot(ctx)
    caplog.clear()
    reply = send(ctx, instruction(content), wire.UPDATE)
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert reply.has_error(), "a forged model array was accepted"
    assert "'w'" in reply.error.reason, reply.error.reason
    check_refusal(ctx, reply, before, caplog)
