"""Stages of a CorBin-FL round: send one instruction per node, collect replies with a timeout.

The pattern is Flower's SecAgg+ workflow: every stage works on ONE explicit state object
(:class:`RoundState`), waits at most its timeout, treats no reply, an error reply and an invalid
reply alike, and removes a node that failed from every later stage of the round
(:meth:`RoundState.drop`). What each stage sends and how it checks each reply lives in
``server/round.py`` (the round, top to bottom); this module is the transport and the bookkeeping.

A reply is accepted only if it answers an instruction of this stage that is still pending, comes
from the node the instruction went to, has the instruction's message type, carries a message id
never seen before in this run, is the only reply to its instruction in its batch, and passes the
stage's validator. Anything else is one log line naming the node and the reason, and the node is
dropped for the round. Replies are validated (and, for the update stage, aggregated) as they
arrive, so the server never holds all updates at once.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from flwr.app import ArrayRecord, Message, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.serverapp import Grid

from corbin_fl.server.metrics import RunFiles
from corbin_fl.wire import CFG, ERROR_CODE_POLICY, STAGE, WireError, payload_bytes

logger = logging.getLogger(__name__)

ReplyHandler = Callable[[int, Message], None]
"""Validates (and consumes) one reply of node ``nid``; raises :class:`WireError` to reject it."""


@dataclass
class RoundState:
    """Everything the stages of one round share.

    Attributes
    ----------
    round : int
        Round ``t``.
    run_id : int
        Flower run id.
    sampled : list[int]
        Nodes sampled for the round, in sampling order.
    active : set[int]
        Nodes still in the round (sampled minus dropped).
    dropped : dict[int, str]
        Node -> reason it left the round.
    refused : dict[int, str]
        Node -> the reason its own privacy policy gave for refusing the instruction
        (:data:`corbin_fl.wire.ERROR_CODE_POLICY`); each is also in ``dropped``.
    seen_message_ids : set[str]
        Message ids of every reply received in the run (shared across rounds; replay check).
    pubkeys : dict[int, bytes]
        X25519 public keys for this round.
    next_pubkeys : dict[int, bytes]
        Public keys for round ``t+1``, from the update replies.
    partner : dict[int, int]
        Pairing: node -> partner (both directions).
    pairs : list[tuple[int, int]]
        The pairs formed this round.
    unpaired : list[int]
        Odd one out of the pairing (and paired nodes without a usable partner key).
    independent : set[int]
        AugCorBin-FL nodes told to quantize independently.
    blobs : dict[int, bytes]
        Relay/exact: the blob each node sent for its partner (opaque ciphertext), from this
        round's pair stage or, pipelined, from the previous round's update reply.
    carried_pairs : int
        Pairs of this round whose blobs came with the previous round's update replies.
    pipeline_broken : dict[str, int]
        Nodes whose pipelined pair could not be used, by reason (``partner-not-sampled``,
        ``partner-no-blob``, ``no-blob``, ``independent``).
    next_partner : dict[int, int]
        Pipelined relay: the pairing of round ``t+1`` sent with this round's update instructions.
    next_blobs : dict[int, bytes]
        Pipelined relay: the blobs for round ``t+1`` that came with accepted update replies.
    lost_partner : dict[int, int]
        Node -> its pipelined partner, for a node whose pipelined pair broke and that found no
        new partner this round (its assignment is ``partner-gone``).
    client_metrics : dict[int, dict[str, float]]
        Metrics of each accepted update.
    z_digests : dict[int, bytes]
        Test-only z digests reported by paired nodes.
    stage_seconds : dict[str, float]
        Wall time of each stage.
    stage_replies : dict[str, int]
        Accepted replies of each stage.
    bytes_up, bytes_down : dict[str, int]
        Payload bytes received / sent per stage (:func:`corbin_fl.wire.payload_bytes`).
    round_trips : int
        Stages that sent at least one message.
    max_radius : float
        Largest layer radius sent this round (for the privacy report).
    app_records : dict[int, RecordDict]
        The app's own records (metrics) of each accepted update.
    aggregate : ArrayRecord or None
        The round's new global model (eq. 6), for the wrapped strategy.
    secure : dict or None
        Secure aggregation's record of the round (``server/secure_round.py``), None without it.
    """

    round: int
    run_id: int
    sampled: list[int]
    active: set[int] = field(default_factory=set)
    dropped: dict[int, str] = field(default_factory=dict)
    refused: dict[int, str] = field(default_factory=dict)
    seen_message_ids: set[str] = field(default_factory=set)
    pubkeys: dict[int, bytes] = field(default_factory=dict)
    next_pubkeys: dict[int, bytes] = field(default_factory=dict)
    partner: dict[int, int] = field(default_factory=dict)
    pairs: list[tuple[int, int]] = field(default_factory=list)
    unpaired: list[int] = field(default_factory=list)
    independent: set[int] = field(default_factory=set)
    blobs: dict[int, bytes] = field(default_factory=dict)
    carried_pairs: int = 0
    pipeline_broken: dict[str, int] = field(default_factory=dict)
    next_partner: dict[int, int] = field(default_factory=dict)
    next_blobs: dict[int, bytes] = field(default_factory=dict)
    lost_partner: dict[int, int] = field(default_factory=dict)
    client_metrics: dict[int, dict[str, float]] = field(default_factory=dict)
    z_digests: dict[int, bytes] = field(default_factory=dict)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    stage_replies: dict[str, int] = field(default_factory=dict)
    bytes_up: dict[str, int] = field(default_factory=dict)
    bytes_down: dict[str, int] = field(default_factory=dict)
    round_trips: int = 0
    max_radius: float = 0.0
    app_records: dict[int, RecordDict] = field(default_factory=dict)
    aggregate: ArrayRecord | None = None
    secure: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not self.active:
            self.active = set(self.sampled)

    def drop(self, nid: int, reason: str, stage: str) -> None:
        """Remove ``nid`` from the round (all later stages) and log one line with the reason."""
        if nid in self.active:
            self.active.discard(nid)
            self.dropped[nid] = f"{stage}: {reason}"
            logger.warning(
                "round %d, stage %s: node %d dropped: %s", self.round, stage, nid, reason
            )


def _push(
    grid: Grid,
    state: RoundState,
    stage: str,
    msgs: list[Message],
    nodes: list[int],
    pending: dict[str, int],
) -> None:
    """Push ``msgs`` (one per node of ``nodes``); record the ids, drop the nodes that failed."""
    try:
        ids = list(grid.push_messages(msgs))
    except Exception as exc:  # a failed push drops the nodes, not the run
        logger.exception("round %d, stage %s: push failed", state.round, stage)
        for nid in nodes:
            state.drop(nid, f"could not push the instruction ({exc})", stage)
        return
    if len(ids) != len(nodes):
        raise RuntimeError(f"push_messages returned {len(ids)} ids for {len(nodes)} messages")
    for nid, mid in zip(nodes, ids, strict=True):
        if mid:
            pending[mid] = nid
        else:
            state.drop(nid, "could not push the instruction (node gone?)", stage)


def exchange(
    grid: Grid,
    state: RoundState,
    messages: dict[int, Message],
    on_reply: ReplyHandler,
    *,
    timeout: float,
    poll_interval: float,
    files: RunFiles | None = None,
    max_inflight: int = 0,
) -> list[int]:
    """Send one instruction per node and collect the replies of one stage.

    Parameters
    ----------
    grid : Grid
        Flower grid (``push_messages`` / ``pull_messages``).
    state : RoundState
        Round state; nodes that fail are dropped from it.
    messages : dict[int, Message]
        Node -> instruction, all of one message type. Nodes must be active.
    on_reply : ReplyHandler
        Validates/consumes a reply; raise :class:`WireError` to reject it (node dropped).
    timeout : float
        Seconds to wait for all replies; nodes still silent are dropped.
    poll_interval : float
        Seconds between two pulls.
    files : RunFiles, optional
        Receives the ``stage_end`` event.
    max_inflight : int
        At most this many instructions outstanding at once (``0``: all at once). The next node's
        instruction is pushed when a reply (or a drop) frees a slot; ``timeout`` bounds the whole
        stage. Each instruction makes its SuperNode start a ClientApp process, so on a small
        machine with many SuperNodes this keeps the stage from starting them all together.

    Returns
    -------
    list[int]
        Nodes whose reply was accepted, in arrival order.
    """
    if not messages:
        return []
    stages = {
        (msg.metadata.message_type, msg.content.config_records[CFG][STAGE])
        for msg in messages.values()
    }
    if len(stages) != 1:
        raise ValueError(f"one stage sends one message type and stage, got {sorted(stages)}")
    msg_type, stage = stages.pop()
    stage = str(stage)
    t0 = time.monotonic()
    state.round_trips += 1
    state.bytes_down[stage] = state.bytes_down.get(stage, 0) + sum(
        payload_bytes(msg.content) for msg in messages.values()
    )
    before = set(state.dropped)

    if max_inflight < 0:
        raise ValueError(f"max_inflight must be >= 0, got {max_inflight}")
    queue = list(messages)
    pending: dict[str, int] = {}

    def push_more() -> None:
        room = len(queue) if max_inflight == 0 else max(0, max_inflight - len(pending))
        nodes, queue[:room] = queue[:room], []
        if nodes:
            _push(grid, state, stage, [messages[nid] for nid in nodes], nodes, pending)

    accepted: list[int] = []
    deadline = t0 + timeout
    push_more()
    while pending or queue:
        batch = list(grid.pull_messages(list(pending))) if pending else []
        _screen_batch(state, stage, batch, pending, accepted)
        for reply in batch:
            _handle(state, stage, msg_type, reply, pending, on_reply, accepted)
        push_more()
        if not pending and not queue:
            break
        now = time.monotonic()
        if now >= deadline:
            break
        time.sleep(min(poll_interval, deadline - now))
    for nid in pending.values():
        state.drop(nid, f"no reply within {timeout:g} s", stage)
    for nid in queue:
        state.drop(nid, f"not reached within the stage timeout of {timeout:g} s", stage)

    seconds = time.monotonic() - t0
    state.stage_seconds[stage] = state.stage_seconds.get(stage, 0.0) + seconds
    state.stage_replies[stage] = state.stage_replies.get(stage, 0) + len(accepted)
    newly_dropped = sorted(set(state.dropped) - before)
    if files is not None:
        files.stage_end(state.round, stage, seconds, len(accepted), newly_dropped)
    logger.debug(
        "round %d, stage %s: %d replies, %d dropped, %.2f s",
        state.round,
        stage,
        len(accepted),
        len(newly_dropped),
        seconds,
    )
    return accepted


def _recipient(reply: Message, pending: dict[str, int]) -> int | None:
    """The node whose pending instruction ``reply`` answers, if the reply may speak for it.

    That is the case when it comes from that node, or when it is an error reply the SuperLink
    made up on the node's behalf (source ``SUPERLINK_NODE_ID``, e.g. "node unavailable"). A
    reply of another node to this instruction is *misdirected*: it speaks for nobody.
    """
    meta = reply.metadata
    nid = pending.get(meta.reply_to_message_id)
    if nid is None:
        return None
    if meta.src_node_id == nid or (reply.has_error() and meta.src_node_id == SUPERLINK_NODE_ID):
        return nid
    return None


def _screen_batch(
    state: RoundState,
    stage: str,
    batch: list[Message],
    pending: dict[str, int],
    accepted: list[int],
) -> None:
    """Drop nodes with replayed replies or several replies to one instruction in ``batch``.

    Blame goes to the node a reply speaks for (:func:`_recipient`), else to its sender; a node
    whose reply this stage already accepted only gets a warning (its counted reply stays valid,
    and dropping it now would leave the round's books inconsistent).
    """
    owned = [(reply, _recipient(reply, pending)) for reply in batch]
    mids = Counter(r.metadata.message_id for r in batch)
    rids = Counter(r.metadata.reply_to_message_id for r, nid in owned if nid is not None)
    for reply, owner in owned:
        meta = reply.metadata
        culprit = owner if owner is not None else meta.src_node_id
        mid = meta.message_id  # empty for error replies the SuperLink makes up itself
        if mid and (mid in state.seen_message_ids or mids[mid] > 1):
            why = f"replayed reply (message id {mid[:16]}...)"
        elif owner is not None and rids[meta.reply_to_message_id] > 1:
            why = "more than one reply to one instruction"
        else:
            continue
        if culprit in accepted:
            logger.warning(
                "round %d, stage %s: ignored a %s from node %d after its accepted reply",
                state.round,
                stage,
                why,
                culprit,
            )
            continue
        _forget(pending, culprit)
        state.drop(culprit, why, stage)


def _forget(pending: dict[str, int], nid: int) -> None:
    for mid in [m for m, n in pending.items() if n == nid]:
        del pending[mid]


def _handle(
    state: RoundState,
    stage: str,
    msg_type: str,
    reply: Message,
    pending: dict[str, int],
    on_reply: ReplyHandler,
    accepted: list[int],
) -> None:
    meta = reply.metadata
    if meta.message_id:
        state.seen_message_ids.add(meta.message_id)
    if meta.reply_to_message_id in pending and _recipient(reply, pending) is None:
        # Another node (or the SuperLink, with content) answered this node's instruction: the
        # instruction stays pending for its own node, and the sender alone is to blame.
        _misdirected(state, stage, reply, pending[meta.reply_to_message_id], pending, accepted)
        return
    nid = pending.pop(meta.reply_to_message_id, None)
    if nid is None:
        if meta.src_node_id in state.active and meta.src_node_id not in accepted:
            _forget(pending, meta.src_node_id)
            state.drop(meta.src_node_id, "reply to an instruction it was not sent", stage)
        elif meta.src_node_id not in state.dropped:
            logger.warning(
                "round %d, stage %s: ignored an unexpected reply from node %d",
                state.round,
                stage,
                meta.src_node_id,
            )
        return
    if reply.has_content():
        state.bytes_up[stage] = state.bytes_up.get(stage, 0) + payload_bytes(reply.content)
    if nid not in state.active:
        return
    if reply.has_error():  # from the node, or from the SuperLink on its behalf (unavailable)
        err = reply.error
        reason = (str(err.reason or "")).strip().splitlines()
        last = reason[-1][:500] if reason else ""
        if err.code == ERROR_CODE_POLICY and meta.src_node_id == nid:
            state.refused[nid] = last
        state.drop(nid, f"error reply (code {err.code}): {last}", stage)
        return
    if meta.message_type != msg_type:
        state.drop(
            nid, f"wrong message type {meta.message_type!r:.64}, expected {msg_type!r}", stage
        )
        return
    try:
        on_reply(nid, reply)
    except WireError as exc:
        state.drop(nid, f"invalid reply: {exc}", stage)
        return
    except Exception as exc:  # a bad reply must never crash the round
        logger.exception("round %d, stage %s: reply of node %d", state.round, stage, nid)
        state.drop(nid, f"invalid reply ({type(exc).__name__}: {exc})", stage)
        return
    accepted.append(nid)


def _misdirected(
    state: RoundState,
    stage: str,
    reply: Message,
    recipient: int,
    pending: dict[str, int],
    accepted: list[int],
) -> None:
    """A reply from ``src`` to the instruction of ``recipient``: drop ``src`` if it is in the
    round (and not already accepted), otherwise log and ignore it."""
    src = reply.metadata.src_node_id
    if src in state.active and src not in accepted:
        _forget(pending, src)
        state.drop(src, f"reply to the instruction of node {recipient}", stage)
    else:
        logger.warning(
            "round %d, stage %s: ignored a reply from node %d to the instruction of node %d",
            state.round,
            stage,
            src,
            recipient,
        )


def active_of(state: RoundState, nodes: Iterable[int]) -> list[int]:
    """The nodes of ``nodes`` still active, in order."""
    return [nid for nid in nodes if nid in state.active]
