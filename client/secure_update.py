"""The client half of secure aggregation composed with CorBin-FL (:mod:`corbin_fl.secure`).

:func:`client.mod.corbin_mod` calls this module for a run with ``secure-aggregation = true``:

- ``secagg-advertise``, ``secagg-share``, ``secagg-unmask``: answered here with the pure SecAgg+
  client role (:class:`corbin_fl.secagg.client.SecAggClient`); its state (private keys, the
  self-mask seed until masking, the shares this node holds) lives in ``context.state`` under
  :data:`corbin_fl.secagg.wire.STATE_RECORD`, as ``secagg_mod`` keeps it. Every refusal of the
  building block holds here: a replayed or out-of-order instruction, a run id or round that is
  not this node's, an unmask request that names a node both survivor and dropped.
- Pipelined (a steady round is 2 round trips, ``update`` and ``secagg-unmask``): the update
  instruction may carry round ``t+1``'s advertise request (:data:`corbin_fl.secure.NEXT_REC`);
  the reply then carries the node's keys for ``t+1``, kept beside round ``t``'s held shares.
  The unmask instruction may carry round ``t+1``'s share request there; the node unmasks round
  ``t`` and shares round ``t+1``'s secrets in one reply, or refuses both (state unchanged).
- ``update``: :func:`take_mask_request` removes the node's mask request from the instruction
  before CorBin-FL checks it (and refuses an update of a secure run without one, so the server
  cannot fall back to the plain upload), the update is quantized exactly as without secure
  aggregation, and :func:`masked_reply` replaces the encoded update by the masked symbol vector:
  the reply keeps ``corbin.reply`` (round, next public key, the sealed blob for the next partner)
  and carries the mask reply (rejected senders, length, layout) and the ``b``-bit packed masked
  vector. ``corbin.metrics`` (clip fraction, paired/fall-back flags, encode time) and the app's
  MetricRecords (its loss, number of examples, timings) stay on the node.
"""

from __future__ import annotations

from dataclasses import dataclass

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from corbin_fl import registry, secure, wire
from corbin_fl.config import RunConfig
from corbin_fl.secagg import wire as sawire
from corbin_fl.secagg.client import SHARED, ClientState, SecAggClient
from corbin_fl.secagg.messages import (
    ADVERTISE,
    MASK,
    SHARE,
    UNMASK,
    MaskRequest,
    SecAggError,
    ShareKeysReply,
)

_STAGE_OF = {secure.ADVERTISE: ADVERTISE, secure.SHARE: SHARE, secure.UNMASK: UNMASK}


def load(context: Context) -> SecAggClient:
    """This node's SecAgg+ role with its state from ``context.state``."""
    rec = context.state.config_records.get(sawire.STATE_RECORD)
    state = ClientState.from_dict(dict(rec)) if rec else None
    return SecAggClient(context.node_id, context.run_id, state)


def save(context: Context, client: SecAggClient) -> None:
    context.state.config_records[sawire.STATE_RECORD] = ConfigRecord(client.state.to_dict())


def _inner(msg: Message, stage: str, rnd: int) -> RecordDict:
    """The SecAgg+ record of a secure stage as :mod:`corbin_fl.secagg.wire` reads it."""
    rec = msg.content.config_records.get(secure.SECAGG_REC)
    if rec is None:
        raise wire.WireError(f"no {secure.SECAGG_REC!r} record")
    content = RecordDict({sawire.RECORD: rec})
    try:
        got = sawire.stage_of(content)
    except SecAggError as exc:
        raise wire.WireError(str(exc)) from exc
    if got != (stage, rnd):
        raise wire.WireError(f"secagg record names {got}, expected ({stage!r}, {rnd})")
    return content


def answer(msg: Message, context: Context, cfg: RunConfig, stage: str) -> RecordDict:
    """The reply content of a ``secagg-*`` stage (advertise, share, unmask).

    Raises :class:`corbin_fl.wire.WireError` for a malformed instruction and
    :class:`corbin_fl.secagg.messages.SecAggError` for one the role refuses (state unchanged).
    """
    if not cfg.secure_aggregation:
        raise wire.WireError(f"{stage} in a run without secure-aggregation")
    expected = {wire.CFG: ConfigRecord, secure.SECAGG_REC: ConfigRecord}
    if stage == secure.UNMASK and secure.NEXT_REC in msg.content:
        expected[secure.NEXT_REC] = ConfigRecord  # the next round's share request (pipelined)
    wire.check_records(msg.content, expected)
    head = msg.content.config_records[wire.CFG]
    wire.check_keys(head, {wire.STAGE, wire.ROUND, *registry.param_keys()}, what=f"{stage} cfg")
    rnd = wire.check_round(msg, head)
    content = _inner(msg, _STAGE_OF[stage], rnd)
    nxt = _next(msg, SHARE, rnd) if secure.NEXT_REC in expected else None
    client = load(context)
    out: RecordDict
    if stage == secure.ADVERTISE:
        out = sawire.advertise_reply(rnd, client.advertise(rnd))
    elif stage == secure.SHARE:
        out = sawire.share_reply(rnd, _share(content, context, cfg, client))
    else:
        out = sawire.unmask_reply(rnd, client.unmask(sawire.decode_unmask_request(content)))
    replies: dict[str, ConfigRecord | ArrayRecord | MetricRecord] = {
        secure.SECAGG_REC: out.config_records[sawire.RECORD]
    }
    if nxt is not None:  # unmasked round t; now share round t+1's secrets
        share = sawire.share_reply(rnd + 1, _share(nxt, context, cfg, client))
        replies[secure.NEXT_REC] = share.config_records[sawire.RECORD]
    save(context, client)  # only now: a refusal of either stage leaves the state as it was
    return RecordDict(replies)


def _share(
    content: RecordDict, context: Context, cfg: RunConfig, client: SecAggClient
) -> ShareKeysReply:
    """The role's share reply to a share request for ``cfg``'s mechanism."""
    req = sawire.decode_share_request(content, context.run_id)
    if req.config.levels != secure.levels_of(cfg):
        raise wire.WireError(
            f"share: levels {req.config.levels} but {cfg.mechanism} has {secure.levels_of(cfg)}"
        )
    return client.share_keys(req)


def _next(msg: Message, stage: str, rnd: int) -> RecordDict:
    """The next round's SecAgg+ stage riding this instruction (:data:`secure.NEXT_REC`), as
    :mod:`corbin_fl.secagg.wire` reads it; it must name ``stage`` of round ``rnd + 1``."""
    content = RecordDict({sawire.RECORD: msg.content.config_records[secure.NEXT_REC]})
    try:
        got = sawire.stage_of(content)
    except SecAggError as exc:
        raise wire.WireError(f"{secure.NEXT_REC}: {exc}") from exc
    if got != (stage, rnd + 1):
        raise wire.WireError(f"{secure.NEXT_REC} names {got}, expected ({stage!r}, {rnd + 1})")
    return content


@dataclass(frozen=True)
class MaskInstruction:
    """The secure part of an update instruction, taken out before CorBin-FL's checks.

    Attributes
    ----------
    request : MaskRequest
        The share ciphertexts this node's neighbours addressed to it.
    records : dict[str, ConfigRecord]
        The records removed from the instruction (the caller puts them back afterwards).
    advertise_next : bool
        The instruction asks for this node's SecAgg+ keys of the next round (pipelined).
    """

    request: MaskRequest
    records: dict[str, ConfigRecord]
    advertise_next: bool


def take_mask_request(msg: Message, context: Context, cfg: RunConfig) -> MaskInstruction | None:
    """Remove and decode the secure records of an update instruction (the caller puts them
    back after CorBin-FL's checks), or None without secure aggregation (a mask request then
    stays and CorBin-FL's checks refuse it).

    The request must name this round and this node must be at the ``share``-done stage of it
    (checked before training: a replay is refused cheaply). A pipelined advertise request
    (:data:`corbin_fl.secure.NEXT_REC`) must name the next round.
    """
    if not cfg.secure_aggregation:
        return None
    if secure.SECAGG_REC not in msg.content.config_records:
        raise wire.WireError(
            "update without a mask request in a secure-aggregation run: the update would "
            "leave this node unmasked"
        )
    rnd = wire.round_of(msg)
    content = _inner(msg, MASK, rnd)
    try:
        req = sawire.decode_mask_request(content)
    except SecAggError as exc:
        raise wire.WireError(str(exc)) from exc
    advertise_next = secure.NEXT_REC in msg.content
    if advertise_next:
        rec = msg.content.config_records.get(secure.NEXT_REC)
        if not isinstance(rec, ConfigRecord):
            raise wire.WireError(f"record {secure.NEXT_REC!r} must be a ConfigRecord")
        try:  # round t+1's advertise request, and nothing else
            sawire.decode_advertise_request(_next(msg, ADVERTISE, rnd))
        except SecAggError as exc:
            raise wire.WireError(f"{secure.NEXT_REC}: {exc}") from exc
    load(context).expect(rnd, SHARED, "mask")
    names = [secure.SECAGG_REC, *([secure.NEXT_REC] if advertise_next else [])]
    records = {name: msg.content.config_records[name] for name in names}
    for name in names:
        del msg.content[name]
    return MaskInstruction(req, records, advertise_next)


def masked_reply(
    reply: RecordDict,
    req: MaskRequest,
    context: Context,
    cfg: RunConfig,
    num_params: int,
    advertise_next: bool = False,
) -> RecordDict:
    """The update reply of a secure run: ``corbin.reply`` and the masked symbol vector (and,
    with ``advertise_next``, this node's SecAgg+ keys of the next round under
    :data:`corbin_fl.secure.NEXT_REC`).

    ``reply`` is the plain update reply (:func:`client.handlers.finish_update`); its encoded
    update is read back into symbols (:func:`corbin_fl.secure.symbols`) and masked.
    """
    update = reply.array_records[wire.UPDATE_REC]
    (key, arr), *rest = list(update.items())
    if rest:
        raise ValueError("the encoded update has more than one array")
    x = secure.symbols(cfg, key, arr.numpy(), num_params)
    client = load(context)
    rep = client.mask(req, x)
    packed = sawire.mask_reply(
        req.server_round, rep, client.state.bits, ((secure.SYMBOLS_KEY, (int(num_params),)),)
    )
    out = RecordDict(
        {
            wire.REPLY: reply.config_records[wire.REPLY],
            secure.SECAGG_REC: packed.config_records[sawire.RECORD],
            secure.MASKED_REC: packed.array_records[sawire.MASKED_RECORD],
        }
    )
    if advertise_next:
        rnd = req.server_round + 1
        keys = sawire.advertise_reply(rnd, client.advertise(rnd))
        out[secure.NEXT_REC] = keys.config_records[sawire.RECORD]
    save(context, client)
    return out


__all__ = ["MaskInstruction", "answer", "load", "masked_reply", "save", "take_mask_request"]
