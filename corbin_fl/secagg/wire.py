"""The SecAgg+ wire format on Flower records: the ONE definition of record names and keys.

Every protocol message is a Flower ``train`` message (the mod answers all stages, as Flower's
legacy ``secaggplus_mod`` does) whose ``secagg`` ConfigRecord names the stage and round; the
``mask`` instruction also carries the wrapped strategy's own records (model, train config) for
the app's train handler. Decoders check the exact key set and every type, and raise
:class:`~.messages.MalformedMessageError`.

| stage     | server -> client                              | client -> server                    |
|-----------|-----------------------------------------------|-------------------------------------|
| advertise | -                                             | c-pk, s-pk                          |
| share     | bits, levels, threshold, degree, ids/c-pk/    | dst-ids, ciphertexts, commitment    |
|           | s-pk (every participant), nbr-ids             |                                     |
| mask      | src-ids, ciphertexts (+ the app's records)    | rejected, length, layout-*; packed  |
|           |                                               | y in ArrayRecord ``secagg-masked``  |
| unmask    | survivors, dropped, advertise-next,           | b-ids, b-shares, s-ids, s-shares,   |
|           | all-survivors                                 |                                     |
|           |                                               | next-c-pk, next-s-pk (may be empty) |

Every record carries ``version`` (:data:`VERSION`); a message of another version is malformed.
Version 2 (issue 38): the share instruction lists every participant's keys (the client derives
the neighbour graph from them) and the unmask instruction every survivor.

Pipelined (:mod:`.driver`): the next round's stage may ride an instruction and
its reply in a second ConfigRecord, ``secagg-next`` (:data:`NEXT_RECORD`), with the keys that
stage's own ``secagg`` record has (:func:`with_next`, :func:`split_next`): round ``t+1``'s
advertise on round ``t``'s ``mask`` instruction and reply, round ``t+1``'s share on round
``t``'s ``unmask`` instruction and reply. Messages without it decode as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from . import crypto
from .messages import (
    ADVERTISE,
    MASK,
    SHARE,
    STAGES,
    UNMASK,
    KeyAdvert,
    MalformedMessageError,
    MaskReply,
    MaskRequest,
    RoundConfig,
    ShareKeysReply,
    ShareKeysRequest,
    UnmaskReply,
    UnmaskRequest,
)
from .packing import pack, unpack

RECORD: Final[str] = "secagg"
"""ConfigRecord of every SecAgg+ message (instruction and reply)."""
MASKED_RECORD: Final[str] = "secagg-masked"
"""ArrayRecord of the mask reply: one uint8 array ``y``, the ``b``-bit packed masked vector."""
MASKED_ARRAY: Final[str] = "y"
STATE_RECORD: Final[str] = "secagg-state"
"""ConfigRecord in the node's ``context.state`` holding :class:`~.client.ClientState`."""
NEXT_RECORD: Final[str] = "secagg-next"
"""ConfigRecord of the next round's stage riding a ``mask`` or ``unmask`` message (pipelined)."""
TRAIN: Final[str] = "train"
ERROR_CODE_REFUSED: Final[int] = 1100
"""Error code of a reply by which the mod refuses an instruction (reason in the error)."""

VERSION: Final[int] = 2
"""The wire version every record carries (1: neighbours' keys only, a server-drawn graph)."""
K_STAGE, K_ROUND, K_VERSION = "stage", "round", "version"
_HEAD = {K_STAGE: str, K_ROUND: int, K_VERSION: int}


def _check(rec: ConfigRecord, spec: dict[str, type | tuple[type, type]], what: str) -> None:
    """Exact key set and types (``(list, T)``: a list of ``T``; bool is not an int here)."""
    full = {**_HEAD, **spec}
    if set(rec) != set(full):
        raise MalformedMessageError(f"{what}: keys {sorted(rec)}, expected {sorted(full)}")
    for key, typ in full.items():
        value = rec[key]
        if isinstance(typ, tuple):
            if not isinstance(value, list) or any(
                not isinstance(v, typ[1]) or isinstance(v, bool) != (typ[1] is bool) for v in value
            ):
                raise MalformedMessageError(f"{what}: {key} must be a list of {typ[1].__name__}")
        elif not isinstance(value, typ) or (isinstance(value, bool) and typ is not bool):
            raise MalformedMessageError(f"{what}: {key} must be {typ.__name__}")


def _get(rec: ConfigRecord, key: str) -> Any:
    """A value already checked by :func:`_check` (typed as ``Any`` for the decoders)."""
    return rec[key]


def _record(stage: str, server_round: int, **values: Any) -> ConfigRecord:
    return ConfigRecord({K_STAGE: stage, K_ROUND: server_round, K_VERSION: VERSION, **values})


def _zip(ids: Sequence[int], values: Sequence[Any], what: str) -> dict[int, Any]:
    if len(ids) != len(values) or len(set(ids)) != len(ids):
        raise MalformedMessageError(f"{what}: ids and values do not pair up one to one")
    return dict(zip(ids, values, strict=True))


def stage_of(content: RecordDict) -> tuple[str, int]:
    """The ``(stage, round)`` a SecAgg+ message names."""
    rec = content.config_records.get(RECORD)
    if rec is None:
        raise MalformedMessageError(f"no '{RECORD}' ConfigRecord")
    if rec.get(K_VERSION) != VERSION:
        raise MalformedMessageError(
            f"secagg wire version {rec.get(K_VERSION)!r}; this node speaks version {VERSION}"
        )
    stage, rnd = rec.get(K_STAGE), rec.get(K_ROUND)
    if stage not in STAGES or not isinstance(rnd, int) or isinstance(rnd, bool) or rnd < 0:
        raise MalformedMessageError(f"bad stage {stage!r} or round {rnd!r}")
    return str(stage), rnd


def with_next(content: RecordDict, nxt: RecordDict) -> RecordDict:
    """``content`` (a copy) with the SecAgg+ message ``nxt`` of the next round's stage under
    :data:`NEXT_RECORD`."""
    if NEXT_RECORD in content:
        raise ValueError(f"the message already has a '{NEXT_RECORD}' record")
    out = RecordDict(dict(content.items()))
    out[NEXT_RECORD] = nxt.config_records[RECORD]
    return out


def split_next(content: RecordDict) -> tuple[RecordDict, RecordDict | None]:
    """``content`` without :data:`NEXT_RECORD`, and that record as a SecAgg+ message of its own
    (its ``secagg`` record; None when absent). Its stage and round are checked."""
    if NEXT_RECORD not in content:
        return content, None
    rec = content.config_records.get(NEXT_RECORD)
    if rec is None:
        raise MalformedMessageError(f"'{NEXT_RECORD}' must be a ConfigRecord")
    nxt = RecordDict({RECORD: rec})
    stage_of(nxt)
    return RecordDict({k: v for k, v in content.items() if k != NEXT_RECORD}), nxt


def renamed(content: RecordDict, names: Mapping[str, str]) -> RecordDict:
    """The records of ``content`` that ``names`` names, each under its new name (the others
    left out): a host protocol carries the SecAgg+ records under names of its own (CorBin-FL:
    :data:`corbin_fl.secure.SECAGG_RECORDS`), and this maps them there and back."""
    return RecordDict({names[name]: rec for name, rec in content.items() if name in names})


# ---------------------------------------------------------------------- advertise
def advertise_request(server_round: int) -> RecordDict:
    return RecordDict({RECORD: _record(ADVERTISE, server_round)})


def decode_advertise_request(content: RecordDict) -> int:
    """The round an advertise instruction names (it carries nothing else)."""
    rec = content.config_records[RECORD]
    _check(rec, {}, "advertise instruction")
    if _get(rec, K_STAGE) != ADVERTISE:
        raise MalformedMessageError(f"advertise instruction names stage {_get(rec, K_STAGE)!r}")
    return int(_get(rec, K_ROUND))


def advertise_reply(server_round: int, adv: KeyAdvert) -> RecordDict:
    return RecordDict(
        {RECORD: _record(ADVERTISE, server_round, **{"c-pk": adv.c_public, "s-pk": adv.s_public})}
    )


def decode_advertise_reply(content: RecordDict) -> KeyAdvert:
    rec = content.config_records[RECORD]
    _check(rec, {"c-pk": bytes, "s-pk": bytes}, "advertise reply")
    return KeyAdvert(_get(rec, "c-pk"), _get(rec, "s-pk"))


def decode_next_keys(content: RecordDict, server_round: int) -> KeyAdvert:
    """The keys of ``server_round`` that a mask reply carries ahead (pipelined): an advertise
    reply naming that round, both keys valid X25519 public keys (the server uses them without
    an advertise stage of their own)."""
    if stage_of(content) != (ADVERTISE, server_round):
        raise MalformedMessageError(f"the keys ahead do not advertise round {server_round}")
    keys = decode_advertise_reply(content)
    try:
        crypto.check_public_key(keys.c_public)
        crypto.check_public_key(keys.s_public)
    except ValueError as exc:
        raise MalformedMessageError(f"the keys ahead: {exc}") from exc
    return keys


# ---------------------------------------------------------------------- share
def share_request(req: ShareKeysRequest) -> RecordDict:
    cfg, ids = req.config, sorted(req.participants)
    return RecordDict(
        {
            RECORD: _record(
                SHARE,
                cfg.server_round,
                bits=cfg.bits,
                levels=cfg.levels,
                threshold=cfg.threshold,
                degree=cfg.degree,
                **{
                    "ids": ids,
                    "c-pk": [req.participants[v].c_public for v in ids],
                    "s-pk": [req.participants[v].s_public for v in ids],
                    "nbr-ids": sorted(req.neighbours),
                },
            )
        }
    )


def decode_share_request(content: RecordDict, run_id: int) -> ShareKeysRequest:
    rec = content.config_records[RECORD]
    _check(
        rec,
        {
            "bits": int,
            "levels": int,
            "threshold": int,
            "degree": int,
            "ids": (list, int),
            "c-pk": (list, bytes),
            "s-pk": (list, bytes),
            "nbr-ids": (list, int),
        },
        "share instruction",
    )
    ids = list(_get(rec, "ids"))
    cs = _zip(ids, list(_get(rec, "c-pk")), "share instruction")
    ss = _zip(ids, list(_get(rec, "s-pk")), "share instruction")
    nbrs = list(_get(rec, "nbr-ids"))
    if len(set(nbrs)) != len(nbrs):
        raise MalformedMessageError("share instruction: a neighbour is named twice")
    cfg = RoundConfig(
        run_id,
        int(_get(rec, K_ROUND)),
        int(_get(rec, "bits")),
        int(_get(rec, "levels")),
        int(_get(rec, "threshold")),
        int(_get(rec, "degree")),
    )
    return ShareKeysRequest(cfg, {v: KeyAdvert(cs[v], ss[v]) for v in ids}, tuple(nbrs))


def share_reply(server_round: int, rep: ShareKeysReply) -> RecordDict:
    ids = sorted(rep.ciphertexts)
    return RecordDict(
        {
            RECORD: _record(
                SHARE,
                server_round,
                **{
                    "dst-ids": ids,
                    "ciphertexts": [rep.ciphertexts[v] for v in ids],
                    "commitment": rep.commitment,
                },
            )
        }
    )


def decode_share_reply(content: RecordDict) -> ShareKeysReply:
    rec = content.config_records[RECORD]
    _check(
        rec,
        {"dst-ids": (list, int), "ciphertexts": (list, bytes), "commitment": bytes},
        "share reply",
    )
    cts = _zip(list(_get(rec, "dst-ids")), list(_get(rec, "ciphertexts")), "share reply")
    return ShareKeysReply(cts, _get(rec, "commitment"))


# ---------------------------------------------------------------------- mask
def mask_request(req: MaskRequest, app_content: RecordDict) -> RecordDict:
    """The app's records (model, config) plus the ``secagg`` record with the relayed shares."""
    if RECORD in app_content:
        raise ValueError(f"the wrapped strategy's train message already has a '{RECORD}' record")
    ids = sorted(req.ciphertexts)
    content = RecordDict(dict(app_content.items()))
    content[RECORD] = _record(
        MASK, req.server_round, **{"src-ids": ids, "ciphertexts": [req.ciphertexts[v] for v in ids]}
    )
    return content


def decode_mask_request(content: RecordDict) -> MaskRequest:
    rec = content.config_records[RECORD]
    _check(rec, {"src-ids": (list, int), "ciphertexts": (list, bytes)}, "mask instruction")
    cts = _zip(list(_get(rec, "src-ids")), list(_get(rec, "ciphertexts")), "mask instruction")
    return MaskRequest(int(_get(rec, K_ROUND)), cts)


Layout = tuple[tuple[str, tuple[int, ...]], ...]
"""The app's arrays: (key, shape) in record order; public (the model's architecture)."""


def flatten_arrays(record: ArrayRecord) -> tuple[np.ndarray, Layout]:
    """One integer vector from every array of ``record`` (record order) and their layout."""
    parts, layout = [], []
    for key, arr in record.items():
        values = arr.numpy()
        if values.dtype.kind not in "biu":
            raise ValueError(
                f"array '{key}' has dtype {values.dtype}; secure aggregation sums "
                "integer arrays (quantize first)"
            )
        parts.append(values.reshape(-1))
        layout.append((key, tuple(int(s) for s in values.shape)))
    flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return flat, tuple(layout)


def unflatten(total: np.ndarray, layout: Layout) -> ArrayRecord:
    """The sum as an ArrayRecord of int64 arrays with the app's keys and shapes."""
    out, pos = {}, 0
    for key, shape in layout:
        size = int(np.prod(shape, dtype=np.int64))
        out[key] = Array(np.ascontiguousarray(total[pos : pos + size].reshape(shape)))
        pos += size
    if pos != total.size:
        raise ValueError("layout does not cover the vector")
    return ArrayRecord(out)


def mask_reply(server_round: int, rep: MaskReply, bits: int, layout: Layout) -> RecordDict:
    packed = np.frombuffer(pack(rep.masked, bits), dtype=np.uint8)
    return RecordDict(
        {
            RECORD: _record(
                MASK,
                server_round,
                **{
                    "rejected": sorted(rep.rejected),
                    "length": int(rep.masked.size),
                    "layout-keys": [k for k, _ in layout],
                    "layout-shapes": [",".join(map(str, s)) for _, s in layout],
                },
            ),
            MASKED_RECORD: ArrayRecord({MASKED_ARRAY: Array(packed)}),
        }
    )


def decode_mask_reply(content: RecordDict, bits: int) -> tuple[MaskReply, Layout]:
    rec = content.config_records[RECORD]
    _check(
        rec,
        {
            "rejected": (list, int),
            "length": int,
            "layout-keys": (list, str),
            "layout-shapes": (list, str),
        },
        "mask reply",
    )
    if set(content) != {RECORD, MASKED_RECORD}:
        raise MalformedMessageError(f"mask reply holds records {sorted(content)}")
    arrays = content.array_records[MASKED_RECORD]
    if list(arrays) != [MASKED_ARRAY]:
        raise MalformedMessageError("mask reply: the masked record must hold exactly 'y'")
    arr = arrays[MASKED_ARRAY]
    length = int(_get(rec, "length"))
    if arr.dtype != "uint8" or tuple(arr.shape) != ((length * bits + 7) // 8,):
        raise MalformedMessageError("mask reply: packed vector of the wrong type or size")
    try:
        y = unpack(arr.numpy().tobytes(), length, bits)
        shapes = [tuple(int(s) for s in sh.split(",") if s) for sh in _get(rec, "layout-shapes")]
    except ValueError as exc:
        raise MalformedMessageError(f"mask reply: {exc}") from exc
    keys = list(_get(rec, "layout-keys"))
    if (
        any(dim < 0 for shape in shapes for dim in shape)
        or len(keys) != len(shapes)
        or len(set(keys)) != len(keys)
        or sum(int(np.prod(s, dtype=np.int64)) for s in shapes) != length
    ):
        raise MalformedMessageError("mask reply: layout does not match the vector")
    return MaskReply(y, tuple(_get(rec, "rejected"))), tuple(zip(keys, shapes, strict=True))


# ---------------------------------------------------------------------- unmask
def unmask_request(req: UnmaskRequest) -> RecordDict:
    return RecordDict(
        {
            RECORD: _record(
                UNMASK,
                req.server_round,
                **{
                    "survivors": list(req.survivors),
                    "dropped": list(req.dropped),
                    "advertise-next": bool(req.advertise_next),
                    "all-survivors": list(req.all_survivors),
                },
            )
        }
    )


def decode_unmask_request(content: RecordDict) -> UnmaskRequest:
    rec = content.config_records[RECORD]
    _check(
        rec,
        {
            "survivors": (list, int),
            "dropped": (list, int),
            "advertise-next": bool,
            "all-survivors": (list, int),
        },
        "unmask instruction",
    )
    return UnmaskRequest(
        int(_get(rec, K_ROUND)),
        tuple(_get(rec, "survivors")),
        tuple(_get(rec, "dropped")),
        bool(_get(rec, "advertise-next")),
        tuple(_get(rec, "all-survivors")),
    )


def unmask_reply(server_round: int, rep: UnmaskReply) -> RecordDict:
    b_ids, s_ids = sorted(rep.self_mask_shares), sorted(rep.key_shares)
    nxt = rep.next_keys
    return RecordDict(
        {
            RECORD: _record(
                UNMASK,
                server_round,
                **{
                    "b-ids": b_ids,
                    "b-shares": [rep.self_mask_shares[v] for v in b_ids],
                    "s-ids": s_ids,
                    "s-shares": [rep.key_shares[v] for v in s_ids],
                    "next-c-pk": nxt.c_public if nxt else b"",
                    "next-s-pk": nxt.s_public if nxt else b"",
                },
            )
        }
    )


def decode_unmask_reply(content: RecordDict) -> UnmaskReply:
    rec = content.config_records[RECORD]
    _check(
        rec,
        {
            "b-ids": (list, int),
            "b-shares": (list, bytes),
            "s-ids": (list, int),
            "s-shares": (list, bytes),
            "next-c-pk": bytes,
            "next-s-pk": bytes,
        },
        "unmask reply",
    )
    b = _zip(list(_get(rec, "b-ids")), list(_get(rec, "b-shares")), "unmask reply")
    s = _zip(list(_get(rec, "s-ids")), list(_get(rec, "s-shares")), "unmask reply")
    c_pk, s_pk = _get(rec, "next-c-pk"), _get(rec, "next-s-pk")
    nxt = KeyAdvert(c_pk, s_pk) if c_pk or s_pk else None
    return UnmaskReply(b, s, nxt)
