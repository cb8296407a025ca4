"""The client's SecAgg+ glue on Flower: the one answer of a node to every stage's records.

:func:`answer` (``advertise``, ``share``, ``unmask``), :func:`mask_instruction` and
:func:`masked_reply` (``mask``, around the app's update) run the pure client role
(:class:`~.client.SecAggClient`) on the records of :mod:`.wire`, with the node's protocol state
in ``context.state`` (:data:`.wire.STATE_RECORD`: private keys, the self-mask seed until
masking, the shares this node holds). Two hosts use them: :func:`~.mod.secagg_mod` (the
standalone building block) and CorBin-FL's ``corbin_mod`` (``client/secure_update.py``, which
carries the same records under its protocol's names inside its own instructions).

Pipelined (a steady round is 2 round trips): a ``mask`` instruction may carry round ``t+1``'s
advertise request in :data:`.wire.NEXT_RECORD`; the reply then carries this node's keys for
``t+1`` there (kept beside round ``t``'s held shares). An ``unmask`` instruction may carry round
``t+1``'s share request there; the node unmasks round ``t`` and shares round ``t+1``'s secrets
in one reply, or refuses both.

Every refusal raises :class:`~.messages.SecAggError` (a malformed record:
:class:`~.messages.MalformedMessageError`) and leaves the state as it was: it is saved only once
every part of a reply is made. What is refused, for both hosts, is listed in :mod:`.mod`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from flwr.app import ConfigRecord, Context, RecordDict

from . import wire
from .client import SHARED, ClientState, SecAggClient
from .messages import (
    ADVERTISE,
    MASK,
    SHARE,
    UNMASK,
    MalformedMessageError,
    MaskRequest,
    ShareKeysReply,
)


def load(context: Context) -> SecAggClient:
    """This node's SecAgg+ role with its state from ``context.state``."""
    rec = context.state.config_records.get(wire.STATE_RECORD)
    state = ClientState.from_dict(dict(rec)) if rec else None
    return SecAggClient(context.node_id, context.run_id, state)


def save(context: Context, client: SecAggClient) -> None:
    """Keep the role's state in ``context.state`` (only once a reply is complete)."""
    context.state.config_records[wire.STATE_RECORD] = ConfigRecord(client.state.to_dict())


def _expect(nxt: RecordDict, stage: str, rnd: int) -> None:
    """The next-round record must name ``stage`` of round ``rnd + 1``."""
    got = wire.stage_of(nxt)
    if got != (stage, rnd + 1):
        raise MalformedMessageError(
            f"'{wire.NEXT_RECORD}' names {got}, expected ({stage!r}, {rnd + 1})"
        )


def _share(
    content: RecordDict, context: Context, client: SecAggClient, levels: int | None
) -> ShareKeysReply:
    """The role's share reply; with ``levels``, the request must be for inputs up to it."""
    req = wire.decode_share_request(content, context.run_id)
    if levels is not None and req.config.levels != levels:
        raise MalformedMessageError(
            f"share: levels {req.config.levels}, but this node's inputs go up to {levels}"
        )
    return client.share_keys(req)


def answer(content: RecordDict, context: Context, *, levels: int | None = None) -> RecordDict:
    """The reply to an ``advertise``, ``share`` or ``unmask`` instruction (:mod:`.wire`
    records; an unmask may carry the next round's share request). ``levels``: the top input
    value this node's host expects (a share request for another is refused)."""
    stage, rnd = wire.stage_of(content)
    if stage not in (ADVERTISE, SHARE, UNMASK):
        raise MalformedMessageError(f"a {stage} instruction is not answered without an update")
    main, nxt = wire.split_next(content)
    if nxt is not None and stage != UNMASK:
        raise MalformedMessageError(f"a {stage} instruction carries no next-round stage")
    if nxt is not None:
        _expect(nxt, SHARE, rnd)
    client = load(context)
    out: RecordDict
    if stage == ADVERTISE:
        out = wire.advertise_reply(rnd, client.advertise(rnd))
    elif stage == SHARE:
        out = wire.share_reply(rnd, _share(main, context, client, levels))
    else:
        ureq = wire.decode_unmask_request(main)
        if nxt is not None and ureq.advertise_next:
            raise MalformedMessageError(
                "an unmask request that shares the next round must not re-key it"
            )
        out = wire.unmask_reply(rnd, client.unmask(ureq))
        if nxt is not None:  # unmasked round t; now share round t+1's secrets
            out = wire.with_next(
                out, wire.share_reply(rnd + 1, _share(nxt, context, client, levels))
            )
    save(context, client)  # only now: a refusal of either stage leaves the state as it was
    return out


@dataclass(frozen=True)
class MaskInstruction:
    """A checked ``mask`` instruction.

    Attributes
    ----------
    request : MaskRequest
        The share ciphertexts this node's neighbours addressed to it.
    advertise_next : bool
        The instruction asks for this node's keys of the next round (pipelined).
    """

    request: MaskRequest
    advertise_next: bool


def mask_instruction(content: RecordDict, context: Context) -> MaskInstruction:
    """Decode a ``mask`` instruction (:mod:`.wire` records; the next round's advertise request
    may ride it) and check this node is at the share-done stage of its round: before the app
    trains, so a replay is refused cheaply."""
    stage, rnd = wire.stage_of(content)
    if stage != MASK:
        raise MalformedMessageError(f"a {stage} instruction is not a mask instruction")
    main, nxt = wire.split_next(content)
    req = wire.decode_mask_request(main)
    if nxt is not None:  # round t+1's advertise request, and nothing else
        _expect(nxt, ADVERTISE, rnd)
        wire.decode_advertise_request(nxt)
    load(context).expect(rnd, SHARED, "mask")
    return MaskInstruction(req, nxt is not None)


def masked_reply(
    context: Context, mask: MaskInstruction, x: np.ndarray, layout: wire.Layout
) -> RecordDict:
    """The ``mask`` reply: ``x`` (integers in ``[0, levels]``, ``layout`` its arrays) masked
    and ``b``-bit packed, with this node's keys of the next round when they were asked for."""
    client = load(context)
    rnd = mask.request.server_round
    content = wire.mask_reply(rnd, client.mask(mask.request, x), client.state.bits, layout)
    if mask.advertise_next:  # round t+1's keys, kept beside round t's held shares
        content = wire.with_next(content, wire.advertise_reply(rnd + 1, client.advertise(rnd + 1)))
    save(context, client)
    return content


__all__ = ["MaskInstruction", "answer", "load", "mask_instruction", "masked_reply", "save"]
