"""Hostile inputs for every decoder of the wire format, with hypothesis (mark ``fuzz``).

Server side: the reply decoding of every stage (``query.keygen``, ``query.pair``,
``train.update`` for every mechanism) through the real :func:`server.stages.exchange` and the
real ``accept_*`` validators of ``server/round.py``. Three nodes answer: two honest ones, and a
third that sends what hypothesis draws: a random record dict, a mutation of a valid reply
(records or keys dropped or added, values of the wrong type or size, huge values, NaN/inf,
forged arrays), an error reply, a reply with another round in its group id, a reply to another
node's or an old instruction, a replayed or duplicated reply, or nothing. Properties:

* nothing escapes ``exchange`` and nothing is logged at ERROR (every rejection was foreseen);
* the honest nodes are accepted and what the server keeps of them (key, blob, aggregate) is
  exactly what they sent;
* the hostile node ends up either accepted, and then what it sent is valid by an independent
  check of the wire spec written here, or dropped, with a warning that names it and the reason;
  a valid reply sent once is always accepted;
* a rejected update never reaches the aggregate.

Client side: every instruction handler through the real ClientApp (``client.app.app``) with
random or mutated instructions. Properties: nothing escapes; the instruction is answered iff it
is valid by an independent check of the spec; an answer passes the server's own validator; a
refusal is an error reply (``ERROR_CODE_REJECTED``) with a warning that names the node and the
reason, leaves ``context.state`` untouched, and the next valid instruction is still answered.

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
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

# The in-process harness of the protocol tests: Flower's task identity for Message(), and the
# tiny linear model with stub training/evaluation (autouse fixtures, active here too).
from test_protocol_logic import (  # noqa: F401
    RUN_ID,
    _stub_training,
    _task_identity,
    make_cfg,
)

from client import app as client_app
from client import handlers, pair_crypto
from client.shared import assignments_of
from corbin_fl import wire
from corbin_fl.config import RunConfig
from server import round as server_round
from server.aggregation import float_release_bounds, make_aggregator
from server.stages import RoundState, exchange

pytestmark = pytest.mark.fuzz

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
    wire.MODEL,
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
    wire.CQ_SEED,
    wire.CQ_RANK,
    wire.CQ_CLIENTS,
    wire.NEXT_PUBKEY,
    wire.Z_DIGEST,
    wire.WEIGHTS,
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
    values: np.ndarray, cfg: RunConfig, c: torch.Tensor, r: torch.Tensor
) -> bool:
    """The value rules of an update: zero padding bits, ternary symbols, float bounds."""
    m = c.numel()
    mech = cfg.mechanism
    if mech in wire.BITS_MECHANISMS:
        return not np.unpackbits(values)[m:].any()
    if mech == "ternary":
        if cfg.ternary_encoding == "int8":
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
    content: RecordDict, rnd: int, cfg: RunConfig, c: torch.Tensor, r: torch.Tensor
) -> bool:
    expected = {wire.REPLY: ConfigRecord, wire.UPDATE_REC: ArrayRecord, wire.METRICS: MetricRecord}
    if not exact_records(content, expected):
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
    key, dtype, length = wire.update_spec(cfg.mechanism, c.numel(), cfg.ternary_encoding)
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

    def meta_ok(self, msg_type: str) -> bool:
        """Whether the metadata is what a valid reply has (group id, type, sender, ...)."""
        group_ok = self.group_id is None or group_round(self.group_id) == RND
        type_ok = self.message_type in (None, msg_type)
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
            st.sampled_from([wire.KEYGEN, wire.PAIR, wire.UPDATE, "train", "query.other"])
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


def run_stage(
    msg_type: str,
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
    msgs = {nid: server_round.instruction(msg_type, nid, RND, {}) for nid in NODES}
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
    msg_type: str,
    caplog: pytest.LogCaptureFixture,
) -> bool:
    """The properties every stage shares; returns whether the victim was accepted."""
    assert sorted(n for n in accepted if n in HONEST) == list(HONEST)
    assert all(n not in state.dropped for n in HONEST), state.dropped
    victim_ok = VICTIM in accepted
    assert victim_ok != (VICTIM in state.dropped), (accepted, state.dropped)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]
    valid = body_valid and plan.meta_ok(msg_type) and isinstance(plan.body, RecordDict)
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
    ok = check_outcome(state, accepted, plan, body_valid, wire.KEYGEN, caplog)
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
    ok = check_outcome(state, accepted, plan, body_valid, wire.PAIR, caplog)
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
    cfg: RunConfig, c: torch.Tensor, r: torch.Tensor, rng: np.random.Generator
) -> RecordDict:
    """A valid ``train.update`` reply of ``cfg.mechanism`` for round ``RND``."""
    m = c.numel()
    mech = cfg.mechanism
    if mech in wire.BITS_MECHANISMS:
        key, values = wire.BITS, np.packbits(rng.integers(0, 2, m).astype(bool))
    elif mech == "ternary":
        t = rng.integers(-1, 2, m).astype(np.int8)
        key, _, _ = wire.ternary_update_spec(m, cfg.ternary_encoding)
        values = wire.encode_ternary(t, cfg.ternary_encoding)
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
    cfg = RunConfig(**UPDATE_CASES[case])
    rng = np.random.default_rng(7)
    gen = torch.Generator().manual_seed(7)
    w_g = torch.randn(M, generator=gen)
    c = 0.1 * torch.randn(M, generator=gen)
    r = 0.5 + torch.rand(M, generator=gen)
    honest = {nid: honest_update(cfg, c, r, rng) for nid in HONEST}
    base = honest_update(cfg, c, r, rng)
    key, _, _ = wire.update_spec(cfg.mechanism, M, cfg.ternary_encoding)
    plan = data.draw(plans(base, arrays_for(base.array_records[wire.UPDATE_REC][key].numpy())))
    aggregator = make_aggregator(cfg, w_g, c, r)
    state, accepted = run_stage(
        wire.UPDATE,
        honest,
        plan,
        lambda s: lambda nid, reply: server_round.accept_update(s, nid, reply, aggregator, cfg),
    )
    body_valid = isinstance(plan.body, RecordDict) and spec_update_reply(plan.body, RND, cfg, c, r)
    ok = check_outcome(state, accepted, plan, body_valid, wire.UPDATE, caplog)
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


# ============================================================================ client side
NID = 5
PARTNER = 9


HANDLERS: dict[str, handlers.Handler] = {
    wire.KEYGEN: handlers.keygen,
    wire.PAIR: handlers.pair,
    wire.UPDATE: handlers.update,
}


@pytest.fixture(autouse=True)
def _no_client_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stub training ignores the data: skip loading the node's partition."""
    from client import encode

    monkeypatch.setattr(encode, "local_dataset", lambda *args, **kwargs: None)


def client_context(**overrides: Any) -> Context:
    return Context(
        run_id=RUN_ID,
        node_id=NID,
        node_config={"partition-id": 0, "num-partitions": 2},
        state=RecordDict(),
        run_config=make_cfg(**overrides),
    )


def instruction(msg_type: str, content: RecordDict, group: str = str(RND)) -> Message:
    msg = Message(content, dst_node_id=NID, message_type=msg_type, group_id=group)
    msg.metadata.__dict__["_message_id"] = uuid.uuid4().hex
    return msg


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
    expected_type: str
    untouched: bool


@st.composite
def client_plans(
    draw: st.DrawFn, msg_type: str, base: RecordDict, arrays: st.SearchStrategy[Array]
) -> ClientPlan:
    kind = draw(st.sampled_from(["valid", "mutated", "mutated", "mutated", "random"]))
    if kind == "valid":
        content = copy.deepcopy(base)
    elif kind == "mutated":
        content = draw(mutations(base, arrays))
    else:
        content = draw(record_dicts(arrays))
    group, mtype = str(RND), msg_type
    variant = draw(st.sampled_from(["none"] * 5 + ["group", "type"]))
    if variant == "group":
        group = draw(
            st.sampled_from([str(RND + 1), "", "²", "9" * 5000, "05", "-1", "0"])
            | st.text(max_size=5)
        )
    elif variant == "type":
        mtype = draw(st.sampled_from([wire.KEYGEN, wire.PAIR, wire.UPDATE, "query.other"]))
    untouched = kind == "valid" and group == str(RND) and mtype == msg_type
    return ClientPlan(content, group, mtype, msg_type, untouched)


def check_client(
    ctx: Context,
    plan: ClientPlan,
    valid: bool,
    caplog: pytest.LogCaptureFixture,
    follow_up: Callable[[], Message],
) -> Message:
    """Send ``plan`` to the ClientApp and check the shared client-side properties."""
    before = state_snapshot(ctx)
    caplog.clear()
    msg = instruction(plan.msg_type, plan.content, plan.group)
    if plan.msg_type in HANDLERS:
        reply = client_app.app(msg, ctx)  # Flower's router picks the handler of the type
    else:  # Flower refuses unknown types before our code runs: test our own type check
        reply = handlers.handle(msg, ctx, HANDLERS[plan.expected_type])
    assert isinstance(reply, Message)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]
    if plan.untouched:
        assert valid, "the unmodified instruction must be valid"
    event(f"instruction {'answered' if valid else 'refused'}")
    if valid:
        assert reply.has_content(), reply.error.reason if reply.has_error() else ""
        return reply
    assert reply.has_error(), "an invalid instruction was answered"
    assert reply.error.code == wire.ERROR_CODE_REJECTED
    assert reply.error.reason
    lines = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and r.getMessage().startswith(f"node {NID}: rejected")
    ]
    assert len(lines) == 1 and reply.error.reason.split(": ", 1)[-1] in lines[0], lines
    assert state_snapshot(ctx) == before, "a rejected instruction changed the node's state"
    again = client_app.app(follow_up(), ctx)
    assert again.has_content(), again.error.reason
    return reply


def keygen_content(rnd: int = RND) -> RecordDict:
    return RecordDict({wire.CFG: ConfigRecord({wire.ROUND: rnd})})


def spec_client_round(content: RecordDict, group: str) -> int | None:
    """The instruction's round if record and group id agree and it is >= 1."""
    rec = content.get(wire.CFG)
    rnd = rec.get(wire.ROUND) if isinstance(rec, ConfigRecord) else None
    if not is_int(rnd, 1) or group_round(group) != rnd:
        return None
    return rnd


@given(data=st.data())
@fuzz_settings(40)
def test_client_keygen_instruction_decoding(
    data: st.DataObject, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    ctx = client_context()
    plan = data.draw(client_plans(wire.KEYGEN, keygen_content(), arrays_for(np.zeros(4, np.uint8))))
    valid = (
        plan.msg_type == wire.KEYGEN
        and exact_records(plan.content, {wire.CFG: ConfigRecord})
        and set(plan.content[wire.CFG]) == {wire.ROUND}
        and spec_client_round(plan.content, plan.group) is not None
    )
    reply = check_client(
        ctx, plan, valid, caplog, lambda: instruction(wire.KEYGEN, keygen_content())
    )
    if valid:
        rnd = plan.content[wire.CFG][wire.ROUND]
        assert spec_keygen_reply(reply.content, rnd)
        assert handlers._private_key(ctx, rnd) is not None


def pair_content(partner_pk: bytes, mode: str, m: int) -> RecordDict:
    body: dict[str, Any] = {
        wire.ROUND: RND,
        wire.PARTNER: PARTNER,
        wire.PARTNER_PUBKEY: partner_pk,
        wire.CR_MODE: mode,
    }
    if mode == "exact":
        body[wire.NUM_PARAMS] = m
    return RecordDict({wire.CFG: ConfigRecord(body)})


def tiny_layout() -> Any:
    """Layout of the model the client builds under the stubs (what the server would send)."""
    from client import encode

    return encode.LocalTask.get(RunConfig.from_flower(make_cfg())).layout


def spec_pair_instruction(plan: ClientPlan, mode: str, m: int) -> bool:
    if plan.msg_type != wire.PAIR or not exact_records(plan.content, {wire.CFG: ConfigRecord}):
        return False
    rec = plan.content[wire.CFG]
    if set(rec) != wire.pair_cfg_keys(mode) or spec_client_round(plan.content, plan.group) != RND:
        return False  # the node holds a private key for round RND only
    partner = rec[wire.PARTNER]
    return (
        is_int(partner, 0, 2**64)
        and partner != NID
        and is_pubkey(rec[wire.PARTNER_PUBKEY])
        and rec[wire.CR_MODE] == mode
        and (mode != "exact" or rec[wire.NUM_PARAMS] == m)
        and (mode != "exact" or type(rec[wire.NUM_PARAMS]) is int)
    )


@pytest.mark.parametrize("mode", ["relay", "exact"])
@given(data=st.data())
@fuzz_settings(30)
def test_client_pair_instruction_decoding(
    mode: str, data: st.DataObject, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    m = tiny_layout().m
    ctx = client_context(cr_mode=mode)
    assert client_app.app(instruction(wire.KEYGEN, keygen_content()), ctx).has_content()
    _, partner_pk = pair_crypto.generate_keypair()
    base = pair_content(partner_pk, mode, m)
    plan = data.draw(client_plans(wire.PAIR, base, arrays_for(np.zeros(4, np.uint8))))
    valid = spec_pair_instruction(plan, mode, m)
    reply = check_client(
        ctx, plan, valid, caplog, lambda: instruction(wire.PAIR, copy.deepcopy(base))
    )
    if valid:
        secret = wire.SEED_BYTES if mode == "relay" else wire.packed_len(5 * m)
        assert spec_pair_reply(reply.content, RND, wire.blob_len(secret))
        assert ctx.state.config_records[handlers.STATE_PAIR][wire.ROUND] == RND


CLIENT_UPDATE_CASES: dict[str, tuple[dict[str, Any], str]] = {
    "corbin-paired": ({"mechanism": "corbin"}, wire.PAIRED),
    "corbin-partner-gone": ({"mechanism": "corbin"}, wire.PARTNER_GONE),
    "augcorbin-independent": ({"mechanism": "augcorbin"}, wire.INDEPENDENT),
    "corbin-derived": ({"mechanism": "corbin", "cr_mode": "derived"}, wire.PAIRED),
    "cq": ({"mechanism": "cq"}, wire.SOLO),
    "gaussian": ({"mechanism": "gaussian"}, wire.SOLO),
    "ternary": ({"mechanism": "ternary"}, wire.SOLO),
}


def update_setup(
    overrides: dict[str, Any], assignment: str
) -> tuple[Context, RunConfig, RecordDict]:
    """A node ready for the update stage of round ``RND`` and the valid instruction for it."""
    ctx = client_context(**overrides)
    cfg = RunConfig.from_flower(ctx.run_config)
    layout = tiny_layout()
    body: dict[str, Any] = {wire.ROUND: RND, wire.MECHANISM: cfg.mechanism}
    body[wire.ASSIGNMENT] = assignment
    if cfg.paired:
        keys = client_app.app(instruction(wire.KEYGEN, keygen_content()), ctx)
        own_pk = keys.content[wire.KEYS][wire.PUBKEY]
        partner_sk, partner_pk = pair_crypto.generate_keypair()
        if assignment == wire.PAIRED and cfg.cr_mode == "derived":
            body[wire.PARTNER] = PARTNER
            body[wire.PARTNER_PUBKEY] = partner_pk
        elif assignment == wire.PAIRED:
            sent = client_app.app(
                instruction(wire.PAIR, pair_content(partner_pk, cfg.cr_mode, layout.m)), ctx
            )
            assert sent.has_content()
            pctx = pair_crypto.PairContext(RUN_ID, RND, PARTNER, NID)
            key = pair_crypto.derive_pair_key(partner_sk, own_pk, pctx)
            body[wire.PARTNER] = PARTNER
            body[wire.PARTNER_BLOB] = pair_crypto.seal_blob(key, 1, os.urandom(32), pctx)
        elif assignment == wire.PARTNER_GONE:
            body[wire.PARTNER] = PARTNER
    if cfg.mechanism == "cq":
        body |= {wire.CQ_SEED: os.urandom(8), wire.CQ_RANK: 1, wire.CQ_CLIENTS: 3}
    gen = torch.Generator().manual_seed(3)
    weights = (0.05 * torch.randn(layout.m, generator=gen)).numpy()
    model = ArrayRecord(
        {
            wire.WEIGHTS: wire.to_array(weights),
            wire.CENTER: wire.to_array(np.zeros(layout.num_layers, np.float32)),
            wire.RADIUS: wire.to_array(np.full(layout.num_layers, 0.2, np.float32)),
        }
    )
    return ctx, cfg, RecordDict({wire.CFG: ConfigRecord(body), wire.MODEL: model})


def spec_update_instruction(plan: ClientPlan, cfg: RunConfig, layout: Any) -> bool:
    """The full spec of a ``train.update`` instruction, for a node that has not yet sent an
    update (written from the wire docstring, independently of ``client.handlers``)."""
    content = plan.content
    if plan.msg_type != wire.UPDATE:
        return False
    if not exact_records(content, {wire.CFG: ConfigRecord, wire.MODEL: ArrayRecord}):
        return False
    rec, model = content[wire.CFG], content[wire.MODEL]
    if spec_client_round(content, plan.group) is None:
        return False
    if rec.get(wire.MECHANISM) != cfg.mechanism or not isinstance(rec.get(wire.MECHANISM), str):
        return False
    assignment = rec.get(wire.ASSIGNMENT)
    if not isinstance(assignment, str) or assignment not in assignments_of(cfg):
        return False
    if set(rec) != wire.update_cfg_keys(cfg.mechanism, assignment, cfg.cr_mode):
        return False
    if set(model) != {wire.WEIGHTS, wire.CENTER, wire.RADIUS}:
        return False
    arrays = [
        spec_array(model[wire.WEIGHTS], np.float32, layout.m),
        spec_array(model[wire.CENTER], np.float32, layout.num_layers),
        spec_array(model[wire.RADIUS], np.float32, layout.num_layers),
    ]
    if any(a is None or not np.isfinite(a).all() for a in arrays):
        return False
    if not (arrays[2] > 0).all():  # type: ignore[operator]
        return False
    if cfg.mechanism == "cq":
        seed, clients, rank = rec[wire.CQ_SEED], rec[wire.CQ_CLIENTS], rec[wire.CQ_RANK]
        if not (isinstance(seed, bytes) and len(seed) == wire.CQ_SEED_BYTES):
            return False
        if not is_int(clients, 1, wire.MAX_CQ_CLIENTS + 1) or not is_int(rank, 0, clients):
            return False
    if assignment in (wire.PAIRED, wire.PARTNER_GONE):
        partner = rec[wire.PARTNER]
        if not is_int(partner, 0, 2**64) or partner == NID:
            return False
    if assignment == wire.PAIRED:
        if cfg.cr_mode == "derived":
            pk = rec[wire.PARTNER_PUBKEY]
            return isinstance(pk, bytes) and len(pk) == wire.KEY_BYTES
        return isinstance(rec[wire.PARTNER_BLOB], bytes)
    return True


@pytest.mark.parametrize("case", sorted(CLIENT_UPDATE_CASES))
@given(data=st.data())
@fuzz_settings(15)
def test_client_update_instruction_decoding(
    case: str, data: st.DataObject, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    overrides, assignment = CLIENT_UPDATE_CASES[case]
    ctx, cfg, base = update_setup(overrides, assignment)
    layout = tiny_layout()
    model = base.array_records[wire.MODEL]
    slot = data.draw(st.sampled_from([wire.WEIGHTS, wire.CENTER, wire.RADIUS]))
    arrays = arrays_for(model[slot].numpy())
    plan = data.draw(client_plans(wire.UPDATE, base, arrays))
    valid = spec_update_instruction(plan, cfg, layout)
    reply = check_client(
        ctx, plan, valid, caplog, lambda: instruction(wire.UPDATE, copy.deepcopy(base))
    )
    if valid:
        # What the client answers is what the server's own validator accepts.
        rnd = plan.content[wire.CFG][wire.ROUND]
        w_g = torch.zeros(layout.m)
        center = torch.from_numpy(plan.content[wire.MODEL][wire.CENTER].numpy())
        radius = torch.from_numpy(plan.content[wire.MODEL][wire.RADIUS].numpy())
        from corbin_fl.models import expand_per_element

        c = expand_per_element(center, layout)
        r = expand_per_element(radius, layout)
        state = RoundState(round=rnd, run_id=RUN_ID, sampled=[NID])
        aggregator = make_aggregator(cfg, w_g, c, r)
        server_round.accept_update(state, NID, reply, aggregator, cfg)
        assert aggregator.n == 1


def test_client_rejects_replayed_and_stale_instructions(caplog: pytest.LogCaptureFixture) -> None:
    """A replayed pair or update instruction, or one for a round already handled, is refused
    with a reason, and the node's state stays as the first (valid) instruction left it."""
    caplog.set_level(logging.WARNING)
    ctx, _, update = update_setup({"mechanism": "corbin"}, wire.PAIRED)
    _, partner_pk = pair_crypto.generate_keypair()
    replayed_pair = client_app.app(
        instruction(wire.PAIR, pair_content(partner_pk, "relay", tiny_layout().m)), ctx
    )
    assert replayed_pair.has_error() and "already answered" in replayed_pair.error.reason
    first = client_app.app(instruction(wire.UPDATE, copy.deepcopy(update)), ctx)
    assert first.has_content()
    after = state_snapshot(ctx)
    again = client_app.app(instruction(wire.UPDATE, copy.deepcopy(update)), ctx)
    assert again.has_error() and again.error.code == wire.ERROR_CODE_REJECTED
    assert f"update for round {RND} but round {RND} was already handled" in again.error.reason
    stale = copy.deepcopy(update)
    stale[wire.CFG][wire.ROUND] = RND - 1
    older = client_app.app(instruction(wire.UPDATE, stale, group=str(RND - 1)), ctx)
    assert older.has_error() and "already handled" in older.error.reason
    assert state_snapshot(ctx) == after
    rejected = [r.getMessage() for r in caplog.records if f"node {NID}: rejected" in r.getMessage()]
    assert len(rejected) == 3
