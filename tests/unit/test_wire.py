"""The wire format: record/key checks, array decoding, sizes, ternary codec, byte counting."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from corbin_fl import registry, wire
from corbin_fl.config import RunConfig
from corbin_fl.mechanisms.baselines import ternary

CQ_SEED, CQ_RANK, CQ_CLIENTS = registry.get("cq").shared_seed
"""CQ's shared-seed keys of the update instruction (its registry entry's)."""


def test_message_types_are_valid_flower_types() -> None:
    """Every protocol message is a Flower ``train`` message; the stage is named in the record."""
    from flwr.app import MessageType
    from flwr.app.metadata import validate_message_type

    assert wire.TRAIN == MessageType.TRAIN
    assert validate_message_type(wire.TRAIN)
    assert wire.STAGES == (wire.KEYGEN, wire.PAIR, wire.UPDATE)
    assert len(set(wire.STAGES)) == len(wire.STAGES)


def test_stage_of_reads_the_instruction_record(monkeypatch: pytest.MonkeyPatch) -> None:
    """``stage_of`` never raises: no record -> None, a non-str stage -> "" (refused later)."""
    from flwr.app import Error, Message
    from flwr.supercore.task_identity import TaskIdentity

    monkeypatch.setattr(TaskIdentity, "_run_id", 1)
    monkeypatch.setattr(TaskIdentity, "_node_id", 1)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)

    def msg(content: RecordDict) -> Message:
        return Message(content, dst_node_id=1, message_type=wire.TRAIN, group_id="1")

    assert wire.stage_of(msg(RecordDict())) is None
    assert wire.stage_of(msg(RecordDict({"config": ConfigRecord({wire.STAGE: "pair"})}))) is None
    assert wire.stage_of(msg(RecordDict({wire.CFG: ArrayRecord()}))) is None
    for stage in wire.STAGES:
        assert (
            wire.stage_of(msg(RecordDict({wire.CFG: ConfigRecord({wire.STAGE: stage})}))) == stage
        )
    assert wire.stage_of(msg(RecordDict({wire.CFG: ConfigRecord({wire.STAGE: 3})}))) == ""
    assert wire.stage_of(msg(RecordDict({wire.CFG: ConfigRecord({})}))) == ""
    error = Message(Error(code=1, reason="x"), reply_to=msg(RecordDict()))
    assert wire.stage_of(error) is None


def test_protocol_records_are_named_by_prefix() -> None:
    """Only ``corbin`` and ``corbin.*`` are the protocol's; every other name is the app's."""
    for name in (wire.CFG, wire.RANGE, wire.KEYS, wire.PAIR_REC, wire.REPLY, wire.UPDATE_REC):
        assert wire.is_protocol_record(name), name
    assert wire.is_protocol_record(wire.METRICS)
    for name in ("arrays", "metrics", "config", "corbinx", "xcorbin", "Corbin", "", "corbin_"):
        assert not wire.is_protocol_record(name), name


def test_check_records_exact_set_and_types() -> None:
    content = RecordDict({wire.CFG: ConfigRecord({"round": 1})})
    wire.check_records(content, {wire.CFG: ConfigRecord})
    with pytest.raises(wire.WireError, match=r"missing \['corbin.range'\]"):
        wire.check_records(content, {wire.CFG: ConfigRecord, wire.RANGE: ArrayRecord})
    with pytest.raises(wire.WireError, match=r"unexpected \['corbin'\]"):
        wire.check_records(content, {})
    with pytest.raises(wire.WireError, match="must be a ArrayRecord"):
        wire.check_records(content, {wire.CFG: ArrayRecord})


def test_check_keys_and_getters() -> None:
    rec = ConfigRecord({"a": 1, "b": b"xy", "c": "s", "t": True})
    wire.check_keys(rec, {"a", "b"}, {"c", "t"})
    with pytest.raises(wire.WireError, match=r"missing \['z'\], unexpected \['t'\]"):
        wire.check_keys(rec, {"a", "b", "c", "z"})
    assert wire.get_int(rec, "a", low=1) == 1
    with pytest.raises(wire.WireError, match=">= 2"):
        wire.get_int(rec, "a", low=2)
    with pytest.raises(wire.WireError, match="must be an int"):
        wire.get_int(rec, "t")  # a bool is not an int here
    assert wire.get_bytes(rec, "b", 2) == b"xy"
    with pytest.raises(wire.WireError, match="3 bytes"):
        wire.get_bytes(rec, "b", 3)
    with pytest.raises(wire.WireError, match="unknown value"):
        wire.get_str(rec, "c", ("x",))


def test_read_array_checks_header_then_content() -> None:
    rec = ArrayRecord({"v": Array(np.arange(5, dtype=np.float32))})
    out = wire.read_array(rec, "v", np.float32, 5, finite=True)
    np.testing.assert_array_equal(out, np.arange(5, dtype=np.float32))
    with pytest.raises(wire.WireError, match=r"float32\[6\]"):
        wire.read_array(rec, "v", np.float32, 6)
    with pytest.raises(wire.WireError, match="uint8"):
        wire.read_array(rec, "v", np.uint8, 5)
    with pytest.raises(wire.WireError, match="missing"):
        wire.read_array(rec, "w", np.float32, 5)
    bad = np.array([0.0, np.nan], dtype=np.float32)
    with pytest.raises(wire.WireError, match="NaN or inf"):
        wire.read_array(ArrayRecord({"v": Array(bad)}), "v", np.float32, 2, finite=True)
    # a header that lies about its content
    liar = Array(dtype="float32", shape=(4,), stype="numpy.ndarray", data=rec["v"].data)
    with pytest.raises(wire.WireError, match="decodes to"):
        wire.read_array(ArrayRecord({"v": liar}), "v", np.float32, 4)
    huge = Array(dtype="uint8", shape=(4,), stype="numpy.ndarray", data=b"\x00" * 100_000)
    with pytest.raises(wire.WireError, match="too many"):
        wire.read_array(ArrayRecord({"v": huge}), "v", np.uint8, 4)
    junk = Array(dtype="uint8", shape=(4,), stype="numpy.ndarray", data=b"not npy")
    with pytest.raises(wire.WireError, match="does not decode"):
        wire.read_array(ArrayRecord({"v": junk}), "v", np.uint8, 4)


@pytest.mark.parametrize(
    ("mechanism", "key", "dtype", "length"),
    [
        ("corbin", wire.BITS, np.uint8, 13),
        ("ldpfl", wire.BITS, np.uint8, 13),
        ("cq", wire.BITS, np.uint8, 13),
        ("gaussian", wire.VALUES, np.float32, 100),
        ("fedcad", wire.VALUES, np.float32, 100),
        ("ternary", wire.BITS, np.uint8, 25),
        ("pbm", wire.BITS, np.uint8, 13),
        ("rqm", wire.BITS, np.uint8, 13),
        ("imvu", wire.BITS, np.uint8, 13),
    ],
)
def test_update_spec(mechanism: str, key: str, dtype: type, length: int) -> None:
    cfg = RunConfig(mechanism=mechanism)
    assert registry.update_spec(cfg, 100) == (key, np.dtype(dtype), length)


@pytest.mark.parametrize(
    ("params", "length"),
    [
        ({"mechanism": "pbm", "pbm_trials": 2}, 25),  # 3 symbols: 2 bits
        ({"mechanism": "pbm", "pbm_trials": 3}, 25),
        ({"mechanism": "pbm", "pbm_trials": 4}, 50),  # 5 symbols: 4 bits
        ({"mechanism": "rqm", "rqm_levels": 3}, 25),
        ({"mechanism": "imvu", "imvu_bits": 2}, 25),
        ({"mechanism": "imvu", "imvu_bits": 4}, 50),
    ],
)
def test_update_spec_of_multi_bit_mechanisms(params: dict[str, object], length: int) -> None:
    """b bits per parameter, packed: ceil(100 b / 8) bytes."""
    assert registry.update_spec(RunConfig().replace(**params), 100) == (
        wire.BITS,
        np.dtype(np.uint8),
        length,
    )


def test_update_spec_ternary_int8_and_unknown() -> None:
    int8 = RunConfig().replace(mechanism="ternary", ternary_encoding="int8")
    assert registry.update_spec(int8, 7) == (wire.VALUES, np.dtype(np.int8), 7)
    with pytest.raises(wire.WireError):
        registry.update_spec(SimpleNamespace(mechanism="nope"), 7)  # type: ignore[arg-type]


@pytest.mark.parametrize("encoding", ["bits", "int8"])
@pytest.mark.parametrize("m", [1, 7, 8, 9, 100])
def test_ternary_codec_round_trip(encoding: str, m: int) -> None:
    t = np.random.default_rng(m).integers(-1, 2, size=m).astype(np.int8)
    wire_form = ternary.encode_ternary(t, encoding)
    cfg = RunConfig().replace(mechanism="ternary", ternary_encoding=encoding)
    _key, dtype, length = registry.update_spec(cfg, m)
    assert wire_form.dtype == dtype and wire_form.shape == (length,)
    np.testing.assert_array_equal(ternary.decode_ternary(wire_form, m, encoding), t)
    np.testing.assert_array_equal(ternary.symbols(wire_form, m, cfg), t + 1)


def test_ternary_codec_rejects_bad_symbols() -> None:
    """The codec refuses them; the server's aggregator reports them as a bad update."""
    from corbin_fl.server.aggregation import make_aggregator

    with pytest.raises(ValueError, match=r"\{-1, 0, 1\}"):
        ternary.decode_ternary(np.array([0, 2], np.int8), 2, "int8")
    with pytest.raises(ValueError, match="padding"):
        ternary.decode_ternary(np.array([0b00000011], np.uint8), 3, "bits")
    for encoding, bad, m in (("int8", [0, 2], 2), ("bits", [0b00000011], 3)):
        cfg = RunConfig().replace(mechanism="ternary", ternary_encoding=encoding)
        agg = make_aggregator(cfg, torch.zeros(m), torch.zeros(m), torch.ones(m))
        key, dtype, _ = registry.update_spec(cfg, m)
        with pytest.raises(wire.WireError, match=r"\{-1, 0, 1\}|padding"):
            agg.add(ArrayRecord({key: wire.to_array(np.array(bad, dtype))}))


def test_cfg_key_sets() -> None:
    """Every instruction carries stage, round and all mechanism settings, plus its stage's keys."""
    common = {wire.STAGE, wire.ROUND, *registry.PARAM_KEYS}
    assert registry.keygen_cfg_keys() == common
    assert registry.update_cfg_keys("corbin", wire.PAIRED, "relay") == common | {
        wire.ASSIGNMENT,
        wire.ARRAYS_KEY,
        wire.PARTNER,
        wire.PARTNER_BLOB,
    }
    assert registry.update_cfg_keys("corbin", wire.PAIRED, "derived") == common | {
        wire.ASSIGNMENT,
        wire.ARRAYS_KEY,
        wire.PARTNER,
        wire.PARTNER_PUBKEY,
    }
    assert registry.update_cfg_keys("corbin", wire.PARTNER_GONE, "relay") == common | {
        wire.ASSIGNMENT,
        wire.ARRAYS_KEY,
        wire.PARTNER,
    }
    assert registry.update_cfg_keys("gaussian", wire.SOLO, "relay") == common | {
        wire.ASSIGNMENT,
        wire.ARRAYS_KEY,
    }
    assert registry.update_cfg_keys("cq", wire.SOLO, "relay") >= {
        CQ_SEED,
        CQ_RANK,
        CQ_CLIENTS,
    }
    assert registry.pair_cfg_keys("relay") == common | {wire.PARTNER, wire.PARTNER_PUBKEY}
    assert registry.pair_cfg_keys("exact") == registry.pair_cfg_keys("relay") | {wire.NUM_PARAMS}
    assert wire.MECHANISM in registry.PARAM_KEYS and wire.CR_MODE in registry.PARAM_KEYS


def test_blob_len_and_packed_len() -> None:
    assert wire.blob_len(32) == 12 + 1 + 32 + 16
    assert [wire.packed_len(n) for n in (0, 1, 8, 9)] == [0, 1, 1, 2]


def test_payload_bytes_counts_what_we_serialise() -> None:
    arr = np.zeros(100, np.float32)
    content = RecordDict(
        {
            "a": ArrayRecord({"x": Array(arr)}),
            "c": ConfigRecord({"k": b"12345", "s": "abc", "n": 3}),
            "m": MetricRecord({"loss": 1.5}),
        }
    )
    npy = len(Array(arr).data)
    assert npy >= 400
    assert wire.payload_bytes(content) == npy + 5 + 3 + 8 + 8


def test_finite_metric() -> None:
    assert wire.finite_metric(1) and wire.finite_metric(0.5)
    assert not wire.finite_metric(float("nan")) and not wire.finite_metric(True)


def test_protocol_version_matches_common_randomness() -> None:
    """One protocol version for the pair keys, the AADs and the z expansion."""
    from corbin_fl.mechanisms import randomness

    assert randomness.PROTOCOL_VERSION.decode() == wire.PROTOCOL_VERSION
