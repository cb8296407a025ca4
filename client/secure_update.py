"""The client half of secure aggregation composed with CorBin-FL (:mod:`corbin_fl.secure`).

:func:`client.mod.corbin_mod` calls this module for a run with ``secure-aggregation = true``.
The answers are the building block's (:mod:`corbin_fl.secagg.node`, which ``secagg_mod`` gives
too: the same role, state in ``context.state``, refusals and pipelining); this module carries
its records under the protocol's names (:data:`corbin_fl.secure.SECAGG_RECORDS`) inside
CorBin-FL's instructions and replies, and checks what CorBin-FL adds:

- ``secagg-advertise``, ``secagg-share``, ``secagg-unmask``: the ``corbin`` record names the
  stage, the round and the mechanism's settings; the SecAgg+ record must name the same stage and
  round, and a share request the mechanism's ``levels`` (:func:`answer`). Pipelined, the unmask
  instruction may carry round ``t+1``'s share request (:data:`corbin_fl.secure.NEXT_REC`).
- ``update``: :func:`take_mask_request` removes the node's mask request (and, pipelined, round
  ``t+1``'s advertise request) from the instruction before CorBin-FL checks it (and refuses an
  update of a secure run without one, so the server cannot fall back to the plain upload), the
  update is quantized exactly as without secure aggregation, and :func:`masked_reply` replaces
  the encoded update by the masked symbol vector: the reply keeps ``corbin.reply`` (round, next
  public key, the sealed blob for the next partner) and carries the mask reply (rejected senders,
  length, layout), the ``b``-bit packed masked vector and, pipelined, the node's keys of round
  ``t+1``. ``corbin.metrics`` (clip fraction, paired/fall-back flags, encode time) and the app's
  MetricRecords (its loss, number of examples, timings) stay on the node.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flwr.app import ConfigRecord, Context, Message, RecordDict

from corbin_fl import registry, secure, wire
from corbin_fl.config import RunConfig
from corbin_fl.secagg import node
from corbin_fl.secagg import wire as sawire
from corbin_fl.secagg.messages import ADVERTISE, MASK, SHARE, UNMASK, MaskRequest, SecAggError

_STAGE_OF = {secure.ADVERTISE: ADVERTISE, secure.SHARE: SHARE, secure.UNMASK: UNMASK}
_FROM_HOST = {ours: sa for sa, ours in secure.SECAGG_RECORDS.items()}


def _inner(msg: Message, stage: str, rnd: int) -> RecordDict:
    """The SecAgg+ records of a secure instruction as :mod:`corbin_fl.secagg.wire` reads them;
    the main one must name ``stage`` of round ``rnd`` (the ``corbin`` record's)."""
    if secure.SECAGG_REC not in msg.content.config_records:
        raise wire.WireError(f"no {secure.SECAGG_REC!r} record")
    content = sawire.renamed(msg.content, _FROM_HOST)
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
    reply = node.answer(content, context, levels=secure.levels_of(cfg))
    return sawire.renamed(reply, secure.SECAGG_RECORDS)


@dataclass(frozen=True)
class MaskInstruction(node.MaskInstruction):
    """The secure part of an update instruction, taken out before CorBin-FL's checks.

    Attributes
    ----------
    records : dict[str, ConfigRecord]
        The records removed from the instruction (the caller puts them back afterwards).
    """

    records: dict[str, ConfigRecord] = field(default_factory=dict)


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
    names = [secure.SECAGG_REC, *([secure.NEXT_REC] if secure.NEXT_REC in msg.content else [])]
    if not all(isinstance(msg.content[name], ConfigRecord) for name in names):
        raise wire.WireError(f"records {names} must be ConfigRecords")
    records = {name: msg.content.config_records[name] for name in names}
    mask = node.mask_instruction(_inner(msg, MASK, wire.round_of(msg)), context)
    for name in names:
        del msg.content[name]
    return MaskInstruction(mask.request, mask.advertise_next, records)


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
    layout = ((secure.SYMBOLS_KEY, (int(num_params),)),)
    masked = node.masked_reply(context, node.MaskInstruction(req, advertise_next), x, layout)
    out = RecordDict({wire.REPLY: reply.config_records[wire.REPLY]})
    for name, rec in sawire.renamed(masked, secure.SECAGG_RECORDS).items():
        out[name] = rec
    return out


__all__ = ["MaskInstruction", "answer", "masked_reply", "take_mask_request"]
