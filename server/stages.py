"""Stages of a CorBin-FL round: send one instruction per node, collect replies with a timeout.

The pattern is Flower's SecAgg+ workflow: every stage works on ONE explicit state object
(:class:`RoundState`), waits at most its timeout, treats no reply, an error reply and an invalid
reply alike, and removes a node that failed from every later stage of the round
(:meth:`RoundState.drop`). What each stage sends and how it checks each reply lives in
``server/round.py`` (the round, top to bottom); this module is the transport and the bookkeeping,
and the envelope every instruction shares (:func:`instruction`).

A reply is accepted only if it answers an instruction of this stage that is still pending, comes
from the node the instruction went to, has the instruction's message type, carries a message id
never seen before in this run, is the only reply to its instruction in its batch, and passes the
stage's validator. Anything else is one log line naming the node and the reason, and the node is
dropped for the round. Replies are validated (and, for the update stage, aggregated) as they
arrive, so the server never holds all updates at once.

**A SuperLink that restarts mid-stage** (:class:`LinkClock`). Flower's grid retries a call until
the SuperLink answers again (no limit, back-off capped at ``MAX_RETRY_DELAY`` = 20 s), so an
outage reaches the ServerApp as a grid call that raises or blocks. Messages in flight may be lost
then: a SuperNode that had pulled its instruction may have dropped it half-received, or lost
the reply it was pushing (an object push session that ended with the SuperLink), and the
SuperLink, which marked the instruction delivered, never reports either. So once the link
answers again every node still silent gets its instruction once more, as a new message with
the same content (``corbin_mod`` answers an instruction it already answered with the same reply,
so no node releases twice), its first valid reply counts, and the stage ends at most
:meth:`LinkClock.grace` after the link's return instead of at its timeout. A SuperNode works
on one message at a time, so its answer to the re-sent instruction comes at most one message's
work after its answer to the first. ``NODE_UNAVAILABLE`` right after an outage means only that
the node has not heartbeated yet: the node is re-sent its instruction once the SuperLink lists
it online again, within the same bound. A node in flight at the outage that is still silent and
not listed online from :func:`reconnect_after` after the return on (:data:`RECONNECT_S` or
more: gRPC's and Flower's back-off grow with the outage) is dropped then (a live SuperNode has
heartbeated by that time), without waiting for its work bound.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.common.constant import (
    HEARTBEAT_BASE_MULTIPLIER,
    HEARTBEAT_CALL_TIMEOUT,
    HEARTBEAT_DEFAULT_INTERVAL,
    HEARTBEAT_RANDOM_RANGE,
    MAX_RETRY_DELAY,
    SUPERLINK_NODE_ID,
    ErrorCode,
)
from flwr.serverapp import Grid

from corbin_fl import registry
from corbin_fl.mechanisms.validate import require, why_at_least
from corbin_fl.server.metrics import RunFiles
from corbin_fl.wire import (
    CFG,
    ERROR_CODE_POLICY,
    ROUND,
    STAGE,
    TRAIN,
    WireError,
    payload_bytes,
)

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
    unconfirmed : dict[int, str]
        Node -> stage, for a node that was working on the stage when the SuperLink went away
        and was dropped after its return: its reply may have been sent and lost (or held by the
        SuperLink), so the privacy ledger counts an update stage's as released.
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
    unconfirmed: dict[int, str] = field(default_factory=dict)

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


RECONNECT_S = float(
    (HEARTBEAT_DEFAULT_INTERVAL - HEARTBEAT_CALL_TIMEOUT)
    * (HEARTBEAT_BASE_MULTIPLIER + HEARTBEAT_RANDOM_RANGE[1])
    + HEARTBEAT_CALL_TIMEOUT
)
"""27.5 s (Flower 1.41 and 1.42): a live SuperNode reaches a SuperLink that answers again within
this time. Its heartbeat thread calls every ``(30 - 5) x (0.8 +- 0.1)`` s, at most 22.5 s, with
a 5 s call timeout, and retries a failed heartbeat with back-off capped at ``MAX_RETRY_DELAY``
(20 s, below 22.5); its message loop retries a failed pull, or a reply it could not push, with
the same cap and polls every 3 s. So within this time of the SuperLink's return a live node has
heartbeated (the SuperLink lists it online again), pulled its instruction and pushed the reply
it held. The SuperLink's own patience (``HEARTBEAT_PATIENCE x interval`` = 60 s) is how long it
waits before it calls a silent node offline; this bound does not wait for that: a node silent
past it is dropped for the round, and one whose reply may have been sent counts as released."""

OUTAGE_S = float(MAX_RETRY_DELAY) / 2
"""10 s: a pull that blocked this long spanned an outage. Flower's grid waits 1, 2, 4, 8 s ...
between its tries, so a SuperLink away for more than a few seconds blocks a pull about this
long; a pull that reaches the SuperLink returns in well under a second (the replies of a stage
are small: a packed update is m/8 bytes). A push is not timed (it carries the model). Flower's
own retry warning ("Connection attempt failed") during any grid call, and a call that raises,
are outages too, however short."""


GRPC_BACKOFF_S: tuple[float, float, float, float] = (1.0, 1.6, 0.2, 120.0)
"""gRPC's connection back-off (its ``doc/connection-backoff.md``; Flower's channels keep the
defaults): INITIAL 1 s, MULTIPLIER 1.6, JITTER 0.2, MAX 120 s. A SuperNode's channel that lost
the SuperLink tries to connect again at ``t_{k+1} = t_k + B_k (1 + u)``, ``B_k = min(1.6^k,
120)``, ``u ~ U(-0.2, 0.2)``, and every call between two tries fails at once."""

RETRY_S = float(MAX_RETRY_DELAY + 2 * HEARTBEAT_CALL_TIMEOUT)
"""30 s: from the channel's reconnection to the node's heartbeat. Flower's retry of a failed call
waits at most ``MAX_RETRY_DELAY`` = 20 s (exponential, full jitter, capped), and its two threads
(message loop, heartbeat) share that wait's lock and wake on the first success: one call whose
wait ends within 20 s succeeds, then the heartbeat (5 s call timeout); two call timeouts."""


def reconnect_after(away_s: float) -> float:
    """Seconds after the SuperLink's return by which a live SuperNode has heartbeated, when
    the SuperLink was away ``away_s`` seconds: ``gap(away_s) + RETRY_S``, at least 31.2 s, above
    :data:`RECONNECT_S` (the floor :meth:`LinkClock.reconnect` applies) at every length.

    ``gap`` bounds how long after the return the node's channel next tries to connect
    (:data:`GRPC_BACKOFF_S`). The try before the return started at ``t_k``, ``k`` tries after
    the channel's first failure, no earlier than the outage: ``away_s >= t_k - t_0 >= 0.8 sum_{j<k}
    1.6^j = 0.8 (1.6^k - 1) / 0.6`` while uncapped, so ``1.6^k <= 0.75 away_s + 1``; the next
    try comes at most ``1.2 B_k`` after ``t_k``, so ``gap <= 1.2 min(120, 0.75 away_s + 1)``
    (past the cap, ``1.2 x 120`` s). Then Flower's own retry, :data:`RETRY_S`. An outage of
    32 s (the Docker restart test's) gives 60 s; gRPC's simulated schedule reaches a gap of
    19.8 s there (``tests/unit/test_reconnect_bound.py``), so with Flower's retry a live node
    may take 45 s, and the fixed 27.5 s of :data:`RECONNECT_S` (a node that never noticed the
    outage, whose next heartbeat is due) would drop it. ``away_s`` is the server's own measure
    (from the start of its first call that failed or blocked to its first answer), no shorter
    than a node's.
    """
    initial, multiplier, jitter, most = GRPC_BACKOFF_S
    uncapped = initial + away_s * (multiplier - 1.0) / (1.0 - jitter)
    return (1.0 + jitter) * min(most, uncapped) + RETRY_S


@dataclass
class LinkClock:
    """What the stages of a run know about the SuperLink link: the bound after an outage.

    After the SuperLink answers again, a node still silent has its reply within
    ``grace = reconnect() + work_s[stage]``: the reconnection bound after an outage of the
    length measured (:func:`reconnect_after`), then one message's work (the SuperNode handles
    one message at a time: whatever it was doing, then the re-sent instruction; ``corbin_mod``
    answers that from its cache when it had answered already). ``work_s[stage]`` is the
    slowest accepted reply (push to arrival) of the last exchange of that stage that saw no
    outage: this run's own start-up and work, measured, not the stage timeout. A stage that
    never completed a reply in this run has no such figure, and its silent nodes keep the
    stage timeout.

    Attributes
    ----------
    reconnect_s : float
        :data:`RECONNECT_S`, the least reconnection bound.
    outage_s : float
        :data:`OUTAGE_S`.
    after_outage : Callable[[float], float] or None
        The reconnection bound as a function of the outage's length (:func:`reconnect_after`);
        ``None``: :attr:`reconnect_s` whatever the length (a harness on its own time scale).
    work_s : dict[str, float]
        Stage -> slowest accepted reply latency of its last exchange without an outage (s).
    outages : int
        Outages seen in the run.
    down_since : float or None
        When the first call of the outage in progress started (monotonic), or None.
    away_s : float
        Length of the last outage: from :attr:`down_since` to the first answer (s).
    """

    reconnect_s: float = RECONNECT_S
    outage_s: float = OUTAGE_S
    after_outage: Callable[[float], float] | None = reconnect_after
    work_s: dict[str, float] = field(default_factory=dict)
    outages: int = 0
    down_since: float | None = None
    away_s: float = 0.0

    def __post_init__(self) -> None:
        if not (self.reconnect_s >= 0 and self.outage_s > 0):
            raise ValueError(
                f"LinkClock needs reconnect_s >= 0 and outage_s > 0, got {self.reconnect_s!r}, "
                f"{self.outage_s!r}"
            )

    def grace(self, stage: str) -> float | None:
        """Seconds a node silent at the SuperLink's return may still take, or None when this
        run has no reply time of ``stage`` yet (its nodes keep the stage timeout)."""
        work = self.work_s.get(stage)
        return None if work is None else self.reconnect() + work

    def reconnect(self) -> float:
        """Seconds after the SuperLink's return by which a live node is listed online again,
        for the last outage's length (:func:`reconnect_after`), never under
        :attr:`reconnect_s`."""
        if self.after_outage is None:
            return self.reconnect_s
        return max(self.reconnect_s, self.after_outage(self.away_s))

    def went_down(self, since: float) -> None:
        """A call that started at ``since`` failed or blocked: the outage began no later."""
        if self.down_since is None or since < self.down_since:
            self.down_since = since

    def came_back(self, now: float) -> None:
        """The SuperLink answered at ``now``: the outage's length is :attr:`away_s`."""
        if self.down_since is not None:
            self.away_s = max(0.0, now - self.down_since)
        self.down_since = None


class _RetryLog(logging.Handler):
    """Sees Flower's "Connection attempt failed" warning of its grid's retries (logger
    ``flwr``): the SuperLink did not answer one call, however short the outage was. ``since``:
    when the first such warning came (monotonic), so that an outage spent inside a call that
    is not timed (a push, which retries until the SuperLink is back, then succeeds) still
    counts from its start."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.failed = False
        self.since: float | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if str(record.msg).startswith("Connection attempt failed"):
            self.failed = True
            if self.since is None:
                self.since = time.monotonic()


def _resend(msg: Message) -> Message:
    """The same instruction as a new message (a new id): same content, type, node and group."""
    meta = msg.metadata
    return Message(
        msg.content,
        dst_node_id=meta.dst_node_id,
        message_type=meta.message_type,
        group_id=meta.group_id,
    )


def _push(
    grid: Grid,
    state: RoundState,
    stage: str,
    msgs: list[Message],
    nodes: list[int],
    pending: dict[str, int],
) -> Exception | None:
    """Push ``msgs`` (one per node of ``nodes``) and record their ids; drop the nodes the
    SuperLink refused (no id). A push that raised returns its exception: the caller decides."""
    try:
        ids = list(grid.push_messages(msgs))
    except Exception as exc:  # a failed push is the caller's to handle, never the run's end
        logger.warning("round %d, stage %s: push failed: %s", state.round, stage, exc)
        return exc
    if len(ids) != len(nodes):
        raise RuntimeError(f"push_messages returned {len(ids)} ids for {len(nodes)} messages")
    for nid, mid in zip(nodes, ids, strict=True):
        if mid:
            pending[mid] = nid
        else:
            state.drop(nid, "could not push the instruction (node gone?)", stage)
    return None


def instruction(
    rt: Any, stage: str, nid: int, rnd: int, body: dict[str, Any], **records: Any
) -> Message:
    """The ``stage`` instruction to node ``nid`` for round ``rnd``: a ``train`` message whose
    ``corbin`` record holds the stage, the round (also in the group id), the mechanism's settings
    (:data:`corbin_fl.registry.PARAM_KEYS`) and ``body``."""
    params = rt.cfg.to_flower()
    head = {STAGE: stage, ROUND: rnd, **{k: params[k] for k in registry.param_keys()}}
    content = RecordDict({CFG: ConfigRecord({**head, **body}), **records})
    return Message(content, dst_node_id=nid, message_type=TRAIN, group_id=str(rnd))


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
    link: LinkClock | None = None,
    stage: str | None = None,
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
        At most this many nodes' instructions outstanding at once (``0``: all at once). The next
        node's instruction is pushed when a reply (or a drop) frees a slot; ``timeout`` bounds
        the whole stage. Each instruction makes its SuperNode start a ClientApp process, so on a
        small machine with many SuperNodes this keeps the stage from starting them all together.
    link : LinkClock, optional
        The run's link clock (the bound after a SuperLink outage; the module docstring). Without
        one, a fresh clock: an outage re-sends, but the nodes keep the stage timeout.
    stage : str, optional
        The stage's name for messages outside the protocol (:func:`collect`); by default the
        ``corbin`` record of the instructions names it.

    Returns
    -------
    list[int]
        Nodes whose reply was accepted, in arrival order.
    """
    if not messages:
        return []
    msg_type, name = _stage_of(messages, stage)
    require("max_inflight", why_at_least(max_inflight, 0))
    t0 = time.monotonic()
    state.round_trips += 1
    state.bytes_down[name] = state.bytes_down.get(name, 0) + sum(
        payload_bytes(msg.content) for msg in messages.values()
    )
    before = set(state.dropped)
    run = _StageRun(
        grid,
        state,
        messages,
        on_reply,
        stage=name,
        msg_type=msg_type,
        timeout=timeout,
        poll_interval=poll_interval,
        max_inflight=max_inflight,
        link=link if link is not None else LinkClock(),
        t0=t0,
    )
    run.run()
    run.settle()
    accepted = run.accepted

    seconds = time.monotonic() - t0
    state.stage_seconds[name] = state.stage_seconds.get(name, 0.0) + seconds
    state.stage_replies[name] = state.stage_replies.get(name, 0) + len(accepted)
    newly_dropped = sorted(set(state.dropped) - before)
    if files is not None:
        files.stage_end(state.round, name, seconds, len(accepted), newly_dropped)
    logger.debug(
        "round %d, stage %s: %d replies, %d dropped, %.2f s",
        state.round,
        name,
        len(accepted),
        len(newly_dropped),
        seconds,
    )
    return accepted


def _stage_of(messages: dict[int, Message], stage: str | None) -> tuple[str, str]:
    """``(message type, stage name)`` of a stage's instructions, which must share both (the name
    is ``stage`` if given, else the one the ``corbin`` record of each instruction names)."""
    stages = {
        (
            msg.metadata.message_type,
            str(stage if stage is not None else msg.content.config_records[CFG][STAGE]),
        )
        for msg in messages.values()
    }
    if len(stages) != 1:
        raise ValueError(f"one stage sends one message type and stage, got {sorted(stages)}")
    return stages.pop()


class _StageRun:
    """One stage of :func:`exchange` in flight: what its jobs (push, pull, handle the replies,
    recover from a SuperLink outage, re-send, expire the bounds, settle) share.

    Attributes
    ----------
    queue : list[int]
        Nodes whose instruction is not pushed yet (``max_inflight``).
    pending : dict[str, int]
        Message id -> node (two ids of one node after a re-send).
    sent_at : dict[int, float]
        Node -> when its instruction was first pushed.
    resent : set[int]
        Nodes sent their instruction again after an outage.
    revived : set[int]
        Of those, nodes re-sent after NODE_UNAVAILABLE (once).
    stranded : set[int]
        Nodes in flight when the SuperLink went away.
    unpushed : list[int]
        Nodes whose push raised: pushed again once the link answers.
    unavailable : dict[int, str]
        NODE_UNAVAILABLE after an outage: re-sent once online.
    bounds : dict[int, tuple[float, float]]
        Silent node -> (its deadline, the grace).
    seen, down : bool
        Whether the link came back from an outage in this stage; whether it is away now.
    returned_at : float or None
        When the SuperLink first answered again in this stage.
    online_next : float
        When :meth:`check_online` may ask the SuperLink for the online nodes again.
    accepted : list[int]
        Nodes whose reply was accepted, in arrival order.
    latency : dict[int, float]
        Node -> seconds from its push to its accepted reply.
    """

    def __init__(
        self,
        grid: Grid,
        state: RoundState,
        messages: dict[int, Message],
        on_reply: ReplyHandler,
        *,
        stage: str,
        msg_type: str,
        timeout: float,
        poll_interval: float,
        max_inflight: int,
        link: LinkClock,
        t0: float,
    ) -> None:
        self.grid, self.state, self.messages, self.on_reply = grid, state, messages, on_reply
        self.stage, self.msg_type, self.link, self.t0 = stage, msg_type, link, t0
        self.timeout, self.poll_interval, self.max_inflight = timeout, poll_interval, max_inflight
        self.queue = list(messages)
        self.pending: dict[str, int] = {}
        self.sent_at: dict[int, float] = {}
        self.resent: set[int] = set()
        self.revived: set[int] = set()
        self.stranded: set[int] = set()
        self.unpushed: list[int] = []
        self.unavailable: dict[int, str] = {}
        self.bounds: dict[int, tuple[float, float]] = {}
        self.seen = False
        self.down = False
        self.returned_at: float | None = None
        self.online_next = 0.0
        self.accepted: list[int] = []
        self.latency: dict[int, float] = {}
        self.deadline = t0 + timeout
        self.watch = _RetryLog()

    def in_flight(self) -> set[int]:
        """Nodes of the stage still expected to answer (not accepted, not dropped)."""
        waiting = set(self.pending.values()) | set(self.unavailable) | set(self.unpushed)
        return {nid for nid in waiting if nid in self.state.active} - set(self.accepted)

    def push(self, nodes: list[int], msgs: list[Message]) -> None:
        """Push ``msgs`` to ``nodes``; a push that raised marks the link away, and its nodes are
        pushed again once it answers (a node whose second push failed is dropped)."""
        now = time.monotonic()
        for nid in nodes:
            self.sent_at.setdefault(nid, now)
        exc = _push(self.grid, self.state, self.stage, msgs, nodes, self.pending)
        if exc is None:  # a push's time is its payload's (the model): no outage sign
            return
        self.down = True  # the link failed a call: recover once it answers
        self.link.went_down(now)
        for nid in nodes:
            if nid in self.resent:  # its second push failed too
                self.state.drop(nid, f"could not push the instruction ({exc})", self.stage)
            else:
                self.unpushed.append(nid)

    def push_more(self) -> None:
        """Push the queued instructions that fit in ``max_inflight`` (all when it is 0)."""
        queue = self.queue
        if self.max_inflight == 0:
            room = len(queue)
        else:
            room = max(0, self.max_inflight - len(self.in_flight()))
        nodes, queue[:room] = queue[:room], []
        if nodes:
            self.push(nodes, [self.messages[nid] for nid in nodes])

    def bound(self, nid: int, now: float) -> None:
        """Bound the wait for silent node ``nid`` by :meth:`LinkClock.grace` from ``now``."""
        grace = self.link.grace(self.stage)
        if grace is not None and nid not in self.bounds:
            self.bounds[nid] = (now + grace, grace)

    def resend(self, nodes: list[int]) -> None:
        """Send ``nodes`` their instruction again, as new messages (counted in bytes down)."""
        copies = [_resend(self.messages[nid]) for nid in nodes]
        self.state.bytes_down[self.stage] += sum(payload_bytes(m.content) for m in copies)
        self.push(nodes, copies)

    def recover(self, now: float) -> None:
        """The SuperLink answers again after an outage: re-send every silent node's
        instruction once and bound its wait (:meth:`LinkClock.grace`)."""
        self.down = False
        self.link.outages += 1
        if self.returned_at is None:
            self.returned_at = now
        self.stranded.update(self.in_flight())
        silent = sorted(self.in_flight() - self.resent - set(self.unavailable))
        for nid in [*silent, *self.unavailable]:
            self.bound(nid, now)
        self.unpushed.clear()
        grace = self.link.grace(self.stage)
        logger.warning(
            "round %d, stage %s: the SuperLink did not answer for a while; %d silent node(s) "
            "sent their instruction again, %d wait to be listed online, each bounded by %s",
            self.state.round,
            self.stage,
            len(silent),
            len(self.unavailable),
            "the stage timeout" if grace is None else f"{grace:.0f} s from now",
        )
        if silent:
            self.resent.update(silent)
            self.resend(silent)

    def online(self) -> set[int] | None:
        """The nodes the SuperLink lists online, or None when it does not answer (logged; the
        next poll asks again)."""
        try:
            return {int(n) for n in self.grid.get_node_ids()}
        except Exception as exc:  # the link again: the next poll tries again
            logger.warning(
                "round %d, stage %s: get_node_ids failed: %s", self.state.round, self.stage, exc
            )
            return None

    def give_up(self, nid: int, reason: str) -> None:
        """Stop waiting for silent node ``nid``: forget its instructions, drop it with
        ``reason``."""
        _forget(self.pending, nid)
        self.unavailable.pop(nid, None)
        self.state.drop(nid, reason, self.stage)

    def revive(self) -> None:
        """Re-send the instruction of each node reported unavailable after an outage as soon
        as the SuperLink lists it online again (once per node)."""
        if not self.unavailable:
            return
        online = self.online()
        if online is None:
            return
        back = sorted(nid for nid in self.unavailable if nid in online)
        for nid in back:
            del self.unavailable[nid]
        if back:
            self.resent.update(back)
            self.revived.update(back)
            self.resend(back)

    def absorb(self, nid: int, reply: Message) -> bool:
        """An error reply that does not end the node's stage: another instruction of the node
        is still pending (a re-send), or, right after an outage, the SuperLink calls the node
        unavailable (it has not heartbeated since; once per node)."""
        if nid in self.pending.values():
            logger.info(
                "round %d, stage %s: node %d: error reply (code %s) to one of its two "
                "instructions; the other is pending",
                self.state.round,
                self.stage,
                nid,
                reply.error.code,
            )
            return True
        if self.seen and reply.error.code == ErrorCode.NODE_UNAVAILABLE and nid not in self.revived:
            self.unavailable[nid] = str(reply.error.reason or "node unavailable")
            self.stranded.add(nid)
            self.bound(nid, time.monotonic())
            return True
        return False

    def run(self) -> None:
        """Push, then poll every ``poll_interval`` until every node has answered or been
        dropped, or the stage timeout has passed (Flower's retry warnings are watched)."""
        flwr_logger = logging.getLogger("flwr")
        flwr_logger.addHandler(self.watch)
        try:
            self.push_more()
            while self.queue or self.in_flight():
                now = self.poll()
                if not self.queue and not self.in_flight():
                    break
                if now >= self.deadline:
                    break
                time.sleep(min(self.poll_interval, self.deadline - now))
        finally:
            flwr_logger.removeHandler(self.watch)

    def pull(self) -> tuple[list[Message], bool]:
        """The replies to the pending instructions, and whether the SuperLink answered (a pull
        that raised marks the link away and returns no reply)."""
        if not self.pending:
            return [], True
        try:
            return list(self.grid.pull_messages(list(self.pending))), True
        except Exception as exc:  # the SuperLink is away: keep polling
            if not self.down:
                logger.warning(
                    "round %d, stage %s: pull failed: %s", self.state.round, self.stage, exc
                )
            self.down = True
            return [], False

    def poll(self) -> float:
        """One pass: pull, screen and handle the replies, recover after an outage, re-send to
        revived nodes, push more, drop the nodes past their bound; returns the time."""
        call = time.monotonic()
        batch, answered = self.pull()
        now = time.monotonic()
        if self.watch.failed or now - call >= self.link.outage_s:
            self.down = True
            if self.watch.since is not None:  # Flower's first retry warning: the start
                self.link.went_down(self.watch.since)
            self.watch.failed, self.watch.since = False, None
        if self.down:  # away since this call at the latest
            self.link.went_down(call)
        back = self.down and answered
        if back:
            self.link.came_back(now)
        self.seen = self.seen or back
        state, stage, pending, accepted = self.state, self.stage, self.pending, self.accepted
        _screen_batch(state, stage, batch, pending, accepted)
        for reply in batch:
            _handle(
                state, stage, self.msg_type, reply, pending, self.on_reply, accepted, self.absorb
            )
        for nid in accepted:
            if nid not in self.latency:
                self.latency[nid] = now - self.sent_at.get(nid, self.t0)
                _forget(pending, nid)  # its other instruction: no reply to it is pulled
        if back:
            self.recover(now)
        self.revive()
        self.push_more()
        now = time.monotonic()
        for nid, (until, grace) in sorted(self.bounds.items()):
            if now >= until and nid in self.in_flight():
                self.give_up(nid, f"no reply within {grace:.0f} s of the SuperLink's return")
        self.check_online(now)
        return now

    def check_online(self, now: float) -> None:
        """From :meth:`LinkClock.reconnect` after the SuperLink's return on (at most once a
        second; :data:`RECONNECT_S` or more, by the outage's length),
        drop every node that was in flight at the outage, is still silent and is not listed
        online: a live SuperNode has heartbeated by then, so it will not answer (its wait is not
        worth its work bound). A node the SuperLink still lists from before the outage (its
        last heartbeat's patience, 60 s, not over yet) is dropped once that listing lapses."""
        if self.returned_at is None or now < max(
            self.returned_at + self.link.reconnect(), self.online_next
        ):
            return
        silent = self.stranded & self.in_flight()
        if not silent:
            return
        self.online_next = now + 1.0
        online = self.online()
        if online is None:
            return
        within = now - self.returned_at
        for nid in sorted(silent - online):
            self.give_up(nid, f"not listed online within {within:.0f} s of the SuperLink's return")

    def settle(self) -> None:
        """After the last poll: drop every node still silent, unavailable or never reached;
        mark a stranded node that was not accepted as possibly released (``unconfirmed``); keep
        the stage's reply time when no outage touched it."""
        state, stage, timeout = self.state, self.stage, self.timeout
        for nid in sorted(set(self.pending.values()) | set(self.unpushed)):
            state.drop(nid, f"no reply within {timeout:g} s", stage)
        for nid, why in sorted(self.unavailable.items()):
            state.drop(nid, f"unavailable since the SuperLink's return: {why[:200]}", stage)
        # A stranded node may have answered before the outage.
        for nid in sorted(self.stranded - set(self.accepted)):
            if not state.dropped.get(nid, "").startswith(f"{stage}: error reply"):  # it said no
                state.unconfirmed[nid] = stage
        for nid in self.queue:
            state.drop(nid, f"not reached within the stage timeout of {timeout:g} s", stage)
        clean = [self.latency[n] for n in self.accepted if n not in self.resent]
        if clean and not self.seen:
            self.link.work_s[stage] = max(clean)


def collect(
    grid: Grid,
    messages: list[Message],
    *,
    rnd: int,
    stage: str,
    timeout: float,
    poll_interval: float,
    link: LinkClock | None = None,
) -> list[Message]:
    """``grid.send_and_receive`` for messages outside the protocol (the wrapped strategy's
    federated evaluation), through :func:`exchange`: the same checks of each reply, the same
    handling of a SuperLink outage, and polls every ``poll_interval`` instead of Flower's 3 s.

    Returns the accepted content replies in arrival order; a node that answered with an error,
    or not at all, is left out with one log line (Flower's strategies aggregate only content
    replies). Messages that send one node two instructions go through ``send_and_receive``.
    """
    nodes = [int(msg.metadata.dst_node_id) for msg in messages]
    if len(set(nodes)) != len(nodes):
        return list(grid.send_and_receive(messages, timeout=timeout))
    state = RoundState(round=rnd, run_id=int(grid.run.run_id), sampled=nodes)
    replies: dict[int, Message] = {}

    def keep(nid: int, reply: Message) -> None:
        replies[nid] = reply

    accepted = exchange(
        grid,
        state,
        dict(zip(nodes, messages, strict=True)),
        keep,
        timeout=timeout,
        poll_interval=poll_interval,
        link=link,
        stage=stage,
    )
    return [replies[nid] for nid in accepted]


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
    absorb: Callable[[int, Message], bool] | None = None,
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
    if nid not in state.active or nid in accepted:
        return
    if reply.has_error():  # from the node, or from the SuperLink on its behalf (unavailable)
        if absorb is not None and absorb(nid, reply):
            return
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
