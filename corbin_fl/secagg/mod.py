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
(:data:`.wire.STATE_RECORD`).
"""

from __future__ import annotations

import logging

from flwr.app import ConfigRecord, Context, Error, Message, RecordDict
from flwr.clientapp.typing import ClientAppCallable

from . import wire
from .client import SHARED, ClientState, SecAggClient
from .messages import ADVERTISE, MASK, SHARE, UNMASK, MalformedMessageError, SecAggError

logger = logging.getLogger(__name__)


def _load(context: Context) -> SecAggClient:
    rec = context.state.config_records.get(wire.STATE_RECORD)
    state = ClientState.from_dict(dict(rec)) if rec else None
    return SecAggClient(context.node_id, context.run_id, state)


def _save(context: Context, client: SecAggClient) -> None:
    context.state.config_records[wire.STATE_RECORD] = ConfigRecord(client.state.to_dict())


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
    client = _load(context)
    try:
        stage, rnd = wire.stage_of(msg.content)
        if msg.metadata.group_id != str(rnd):
            raise MalformedMessageError(
                f"group id {msg.metadata.group_id!r} does not name round {rnd}"
            )
        main, nxt = wire.split_next(msg.content)
        if nxt is not None and stage not in (MASK, UNMASK):
            raise MalformedMessageError(f"a {stage} instruction carries no next-round stage")
        content: RecordDict
        if stage == ADVERTISE:
            content = wire.advertise_reply(rnd, client.advertise(rnd))
        elif stage == SHARE:
            req = wire.decode_share_request(main, context.run_id)
            content = wire.share_reply(rnd, client.share_keys(req))
        elif stage == MASK:
            mreq = wire.decode_mask_request(main)
            if nxt is not None and wire.decode_advertise_request(nxt) != rnd + 1:
                raise MalformedMessageError(f"the mask of round {rnd} advertises another round")
            client.expect(rnd, SHARED, "mask")  # before training: refuse replays cheaply
            app_reply = call_next(msg, context)
            if app_reply.has_error():
                return app_reply  # state untouched: the server drops this node
            records = list(app_reply.content.array_records.values())
            if len(records) != 1:
                raise ValueError(f"the train handler returned {len(records)} ArrayRecords, not 1")
            x, layout = wire.flatten_arrays(records[0])
            rep = client.mask(mreq, x)
            content = wire.mask_reply(rnd, rep, client.state.bits, layout)
            if nxt is not None:  # round t+1's keys, kept beside round t's held shares
                keys = wire.advertise_reply(rnd + 1, client.advertise(rnd + 1))
                content = wire.with_next(content, keys)
        elif stage == UNMASK:
            ureq = wire.decode_unmask_request(main)
            sreq = None
            if nxt is not None:
                if wire.stage_of(nxt) != (SHARE, rnd + 1):
                    raise MalformedMessageError(f"the unmask of round {rnd} shares another stage")
                if ureq.advertise_next:
                    raise MalformedMessageError(
                        "an unmask request that shares the next round must not re-key it"
                    )
                sreq = wire.decode_share_request(nxt, context.run_id)
            content = wire.unmask_reply(rnd, client.unmask(ureq))
            if sreq is not None:  # unmasked round t; now share round t+1's secrets
                share = wire.share_reply(rnd + 1, client.share_keys(sreq))
                content = wire.with_next(content, share)
        else:  # pragma: no cover - stage_of only returns known stages
            raise MalformedMessageError(stage)
    except (SecAggError, ValueError, TypeError, KeyError) as exc:
        return _refuse(msg, f"{type(exc).__name__}: {exc}")
    _save(context, client)
    return Message(content, reply_to=msg)
