"""``secagg_mod``: the client half of SecAgg+ as a Flower ClientApp mod (Message API).

Add it to any ClientApp whose ``@app.train()`` handler returns integer arrays in ``[0, levels]``
(one ArrayRecord): ``ClientApp(mods=[secagg_mod])``. It answers every SecAgg+ stage itself
(``advertise``, ``share``, ``unmask``), calls the app's train handler only for ``mask``, and
replaces the handler's reply by the masked, ``b``-bit packed vector and its layout (the keys and
shapes of the arrays): the handler's arrays and metrics never leave the node in the clear.

Pipelined (:class:`~.strategy.SecAggPlus`, 2 round trips a steady round): a ``mask``
instruction may carry round ``t+1``'s advertise request in :data:`.wire.NEXT_RECORD`; the reply
then carries this node's keys for ``t+1`` there (kept beside round ``t``'s held shares). An
``unmask`` instruction may carry round ``t+1``'s share request there; the node unmasks round
``t`` and shares round ``t+1``'s secrets in one reply, or refuses both.

It refuses (an error reply, state untouched) a ``train`` message without the ``secagg`` record, a
replayed or out-of-order instruction, a message of another wire version, a share request whose
neighbour set is not the graph derived from every participant's keys (or with ``t < 2``, or fewer
than 3 participants), an unmask request that names a node both as a survivor and as dropped or whose
survivor list is disconnected in that graph, and a next-round record that is malformed, names
another stage than the one that may ride this instruction or another round than the next (or rides
an unmask request that also asks for the next round's keys). Other message types (evaluate, query)
pass through to the app. The node's protocol state lives in ``context.state``
(:data:`.wire.STATE_RECORD`). The answers are :mod:`.node`'s, which CorBin-FL's ``corbin_mod``
gives too.
"""

from __future__ import annotations

import logging

from flwr.app import Context, Error, Message
from flwr.clientapp.typing import ClientAppCallable

from . import node, wire
from .messages import MASK, MalformedMessageError, SecAggError

logger = logging.getLogger(__name__)


def _refuse(msg: Message, reason: str) -> Message:
    logger.warning("secagg_mod refuses a %s message: %s", msg.metadata.message_type, reason)
    return Message(Error(code=wire.ERROR_CODE_REFUSED, reason=reason), reply_to=msg)


def secagg_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Answer the SecAgg+ stages; mask the app's integer update in the ``mask`` stage."""
    if msg.metadata.message_type.split(".")[0] != wire.TRAIN:
        return call_next(msg, context)
    if not msg.has_content() or wire.RECORD not in msg.content.config_records:
        return _refuse(
            msg,
            "train message without secure aggregation: the update would leave this node unmasked",
        )
    try:
        stage, rnd = wire.stage_of(msg.content)
        if msg.metadata.group_id != str(rnd):
            raise MalformedMessageError(
                f"group id {msg.metadata.group_id!r} does not name round {rnd}"
            )
        if stage != MASK:
            return Message(node.answer(msg.content, context), reply_to=msg)
        mask = node.mask_instruction(msg.content, context)  # before training: replays refused
        app_reply = call_next(msg, context)
        if app_reply.has_error():
            return app_reply  # state untouched: the server drops this node
        records = list(app_reply.content.array_records.values())
        if len(records) != 1:
            raise ValueError(f"the train handler returned {len(records)} ArrayRecords, not 1")
        x, layout = wire.flatten_arrays(records[0])
        return Message(node.masked_reply(context, mask, x, layout), reply_to=msg)
    except (SecAggError, ValueError, TypeError, KeyError) as exc:
        return _refuse(msg, f"{type(exc).__name__}: {exc}")
