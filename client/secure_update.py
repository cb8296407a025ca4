"""The client half of secure aggregation composed with CorBin-FL (:mod:`corbin_fl.secure`).

:func:`client.mod.corbin_mod` calls this module for a run with ``secure-aggregation = true``:

- ``secagg-advertise``, ``secagg-share``, ``secagg-unmask``: answered here with the pure SecAgg+
  client role (:class:`corbin_fl.secagg.client.SecAggClient`); its state (private keys, the
  self-mask seed until masking, the shares this node holds) lives in ``context.state`` under
  :data:`corbin_fl.secagg.wire.STATE_RECORD`, as ``secagg_mod`` keeps it. Every refusal of the
  building block holds here: a replayed or out-of-order instruction, a run id or round that is
  not this node's, an unmask request that names a node both survivor and dropped.
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

from flwr.app import ConfigRecord, Context, Message, RecordDict

from corbin_fl import secure, wire
from corbin_fl.config import RunConfig
from corbin_fl.secagg import wire as sawire
from corbin_fl.secagg.client import SHARED, ClientState, SecAggClient
from corbin_fl.secagg.messages import ADVERTISE, MASK, SHARE, UNMASK, MaskRequest, SecAggError

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
    wire.check_records(msg.content, {wire.CFG: ConfigRecord, secure.SECAGG_REC: ConfigRecord})
    head = msg.content.config_records[wire.CFG]
    wire.check_keys(head, {wire.STAGE, wire.ROUND, *wire.PARAM_KEYS}, what=f"{stage} cfg")
    rnd = wire.check_round(msg, head)
    content = _inner(msg, _STAGE_OF[stage], rnd)
    client = load(context)
    out: RecordDict
    if stage == secure.ADVERTISE:
        out = sawire.advertise_reply(rnd, client.advertise(rnd))
    elif stage == secure.SHARE:
        req = sawire.decode_share_request(content, context.run_id)
        if req.config.levels != secure.levels_of(cfg):
            raise wire.WireError(
                f"share: levels {req.config.levels} but {cfg.mechanism} has {secure.levels_of(cfg)}"
            )
        out = sawire.share_reply(rnd, client.share_keys(req))
    else:
        out = sawire.unmask_reply(rnd, client.unmask(sawire.decode_unmask_request(content)))
    save(context, client)
    return RecordDict({secure.SECAGG_REC: out.config_records[sawire.RECORD]})


def take_mask_request(
    msg: Message, context: Context, cfg: RunConfig
) -> tuple[MaskRequest, ConfigRecord] | None:
    """Remove and decode the mask request of an update instruction: ``(request, its record)``
    (the caller puts the record back after CorBin-FL's checks), or None without secure
    aggregation (a mask request then stays and CorBin-FL's checks refuse it).

    The request must name this round and this node must be at the ``share``-done stage of it
    (checked before training: a replay is refused cheaply).
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
    load(context).expect(rnd, SHARED, "mask")
    rec = msg.content.config_records[secure.SECAGG_REC]
    del msg.content[secure.SECAGG_REC]
    return req, rec


def masked_reply(
    reply: RecordDict, req: MaskRequest, context: Context, cfg: RunConfig, num_params: int
) -> RecordDict:
    """The update reply of a secure run: ``corbin.reply`` and the masked symbol vector.

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
    save(context, client)
    return RecordDict(
        {
            wire.REPLY: reply.config_records[wire.REPLY],
            secure.SECAGG_REC: packed.config_records[sawire.RECORD],
            secure.MASKED_REC: packed.array_records[sawire.MASKED_RECORD],
        }
    )


__all__ = ["answer", "load", "masked_reply", "save", "take_mask_request"]
