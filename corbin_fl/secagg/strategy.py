"""The server half of SecAgg+ on Flower's Message API: :class:`SecAggRound` and :class:`SecAggPlus`.

:class:`SecAggRound` runs one round's stages with ``grid.send_and_receive`` around the train
messages a Message-API strategy configured, and returns the exact sum of the survivors' integer
updates (:class:`~.messages.RoundOutcome`). :class:`SecAggPlus` wraps a strategy like Flower's
DP wrappers do: ``configure_train`` is the wrapped strategy's plus the ``advertise`` and
``share`` stages, the returned messages are the ``mask`` stage (the app trains there), and
``aggregate_train`` runs ``unmask`` and hands the wrapped strategy's ``aggregate_train`` ONE
reply holding the sum, so ``Strategy.start`` drives it unchanged.

Round trips per round: ``share`` -> ``mask`` -> ``unmask`` (3) in the steady state, because each
``unmask`` reply carries the node's public keys for the next round (pipelined ``advertise``); a
round where some sampled node has no such keys (round 1, a node new or not sampled in the
previous round, a round abandoned before unmasking) adds one ``advertise`` round trip, for those
nodes only. ``mask`` and ``unmask`` cannot merge (unmasking needs the set of masked inputs
received), nor ``share`` and ``mask`` (a client must know which neighbours' shares arrived
before it masks), nor ``advertise`` and ``share`` (shares are encrypted to neighbours' keys).
Composed with CorBin-FL (``server/secure_round.py``) a steady round is 2: round ``t+1``'s keys
ride the mask reply and its share stage rides round ``t``'s unmask, drawn over round ``t``'s
survivors and used when round ``t+1``'s sample is a subset of them; this wrapper does not do
that yet (the client role supports it: :meth:`~.client.SecAggClient.advertise`).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from . import wire
from .messages import (
    ADVERTISE,
    MASK,
    SHARE,
    UNMASK,
    KeyAdvert,
    MalformedMessageError,
    RoundOutcome,
    SecAggError,
)
from .server import SecAggServer

logger = logging.getLogger(__name__)


class SecAggRound:
    """One SecAgg+ round over a Flower grid around a strategy's train messages.

    Parameters
    ----------
    grid
        The ServerApp's grid; its ``run.run_id`` is bound into every key and AD.
    server_round
        The round number (in every message's group id and record).
    train_messages
        The wrapped strategy's ``configure_train`` output: one ``train`` message per sampled
        node, whose records reach the app's train handler in the ``mask`` stage.
    levels, num_neighbours, threshold, rng, min_survivors
        As in :class:`~.server.SecAggServer`.
    prekeys
        Keys the nodes sent for this round with the previous round's unmask replies.
    stage_timeout
        Seconds each stage waits for replies (``grid.send_and_receive``'s timeout).
    """

    def __init__(
        self,
        grid: Grid,
        server_round: int,
        train_messages: Iterable[Message],
        *,
        levels: int,
        num_neighbours: int | None = None,
        threshold: int | None = None,
        rng: np.random.Generator | None = None,
        prekeys: Mapping[int, KeyAdvert] | None = None,
        stage_timeout: float = 60.0,
        min_survivors: int = 2,
    ) -> None:
        self.grid = grid
        self.server_round = server_round
        self.stage_timeout = stage_timeout
        self.train: dict[int, RecordDict] = {}
        for msg in train_messages:
            if msg.metadata.message_type.split(".")[0] != wire.TRAIN:
                raise ValueError("the wrapped strategy configured a non-train message")
            if msg.metadata.dst_node_id in self.train:
                raise ValueError(f"two train messages for node {msg.metadata.dst_node_id}")
            self.train[msg.metadata.dst_node_id] = msg.content
        self.round_trips = 0
        self.seconds: dict[str, float] = {}
        self.layout: wire.Layout = ()
        self._mask_sent: dict[str, int] = {}
        self._mask_msgs: list[Message] = []
        self.server: SecAggServer | None = None
        self._early: RoundOutcome | None = None
        try:
            self.server = SecAggServer(
                run_id=grid.run.run_id,
                server_round=server_round,
                node_ids=sorted(self.train),
                levels=levels,
                num_neighbours=num_neighbours,
                threshold=threshold,
                rng=rng,
                prekeys=prekeys,
                min_survivors=min_survivors,
            )
        except ValueError as exc:  # too few nodes for any k, t
            self._early = RoundOutcome(
                server_round, tuple(sorted(self.train)), abandoned=f"setup: {exc}"
            )
            logger.warning("secagg round %d abandoned: setup: %s", server_round, exc)

    # ------------------------------------------------------------------ transport
    def _message(self, node: int, content: RecordDict) -> Message:
        return Message(
            content, dst_node_id=node, message_type=wire.TRAIN, group_id=str(self.server_round)
        )

    def _collect(
        self, stage: str, sent: Mapping[str, int], replies: Iterable[Message]
    ) -> tuple[dict[int, RecordDict], dict[int, str]]:
        """Replies by node: only one per instruction, from its addressee, naming this stage."""
        good: dict[int, RecordDict] = {}
        bad: dict[int, str] = {}
        for reply in replies:
            node = sent.get(reply.metadata.reply_to_message_id)
            if node is None or reply.metadata.src_node_id != node:
                logger.warning(
                    "secagg %s: ignored a reply from node %d to no instruction of this stage",
                    stage,
                    reply.metadata.src_node_id,
                )
                continue
            if node in good or node in bad:
                good.pop(node, None)
                bad[node] = "more than one reply"
                continue
            if reply.has_error():
                bad[node] = f"error reply: {reply.error.reason}"
                continue
            try:
                if wire.stage_of(reply.content) != (stage, self.server_round):
                    raise MalformedMessageError("reply names another stage or round")
            except MalformedMessageError as exc:
                bad[node] = f"malformed reply: {exc}"
                continue
            good[node] = reply.content
        return good, bad

    def _exchange(
        self, stage: str, contents: Mapping[int, RecordDict]
    ) -> tuple[dict[int, RecordDict], dict[int, str]]:
        t0 = time.perf_counter()
        msgs = [self._message(node, c) for node, c in contents.items()]
        replies = list(self.grid.send_and_receive(msgs, timeout=self.stage_timeout))
        sent = {m.metadata.message_id: m.metadata.dst_node_id for m in msgs}
        self.round_trips += 1
        self.seconds[stage] = time.perf_counter() - t0
        return self._collect(stage, sent, replies)

    @staticmethod
    def _decode(
        good: Mapping[int, RecordDict], bad: dict[int, str], decoder: Any
    ) -> dict[int, Any]:
        out = {}
        for node, content in good.items():
            try:
                out[node] = decoder(content)
            except (MalformedMessageError, KeyError, TypeError, ValueError) as exc:
                bad[node] = f"malformed reply: {exc}"
        return out

    # ------------------------------------------------------------------ stages
    def begin(self) -> list[Message]:
        """``advertise`` (for nodes without pipelined keys) and ``share``; the ``mask`` messages.

        Returns no message if the round was abandoned (the reason is in :meth:`finish`).
        """
        srv = self.server
        if srv is None:
            return []
        if srv.stage == ADVERTISE:
            good, bad = self._exchange(
                ADVERTISE,
                {u: wire.advertise_request(self.server_round) for u in srv.advertise_targets()},
            )
            srv.receive_adverts(self._decode(good, bad, wire.decode_advertise_reply), bad)
        if srv.abandoned:
            return []
        good, bad = self._exchange(
            SHARE, {u: wire.share_request(r) for u, r in srv.share_requests().items()}
        )
        srv.receive_shares(self._decode(good, bad, wire.decode_share_reply), bad)
        if srv.abandoned:
            return []
        self._mask_msgs = [
            self._message(u, wire.mask_request(r, self.train[u]))
            for u, r in srv.mask_requests().items()
        ]
        self._t_mask = time.perf_counter()
        return list(self._mask_msgs)

    def finish(self, replies: Iterable[Message], advertise_next: bool = True) -> RoundOutcome:
        """Decode the ``mask`` replies, run ``unmask``: the exact sum or the abandon reason."""
        srv = self.server
        if srv is None:
            assert self._early is not None
            return self._early
        if srv.abandoned:
            return RoundOutcome(
                self.server_round, srv.sampled, dropped=dict(srv.dropped), abandoned=srv.abandoned
            )
        self.round_trips += 1
        self.seconds[MASK] = time.perf_counter() - self._t_mask
        sent = {m.metadata.message_id: m.metadata.dst_node_id for m in self._mask_msgs}
        good, bad = self._collect(MASK, sent, replies)
        bits = srv.config.bits
        decoded = self._decode(good, bad, lambda c: wire.decode_mask_reply(c, bits))
        layouts = Counter(layout for _, layout in decoded.values())
        if layouts:
            self.layout = max(layouts, key=lambda lay: (layouts[lay], -len(lay)))
        masked = {}
        for node, (rep, layout) in decoded.items():
            if layout != self.layout:
                bad[node] = "masked update with another layout than the majority's"
            else:
                masked[node] = rep
        srv.receive_masked(masked, bad)
        if srv.abandoned:
            return RoundOutcome(
                self.server_round, srv.sampled, dropped=dict(srv.dropped), abandoned=srv.abandoned
            )
        good, bad = self._exchange(
            UNMASK,
            {u: wire.unmask_request(r) for u, r in srv.unmask_requests(advertise_next).items()},
        )
        outcome = srv.receive_unmask(self._decode(good, bad, wire.decode_unmask_reply), bad)
        return outcome

    def run(self, timeout: float | None = None) -> RoundOutcome:
        """All stages: :meth:`begin`, the ``mask`` exchange, :meth:`finish`."""
        msgs = self.begin()
        replies: list[Message] = []
        if msgs:
            replies = list(
                self.grid.send_and_receive(
                    msgs, timeout=self.stage_timeout if timeout is None else timeout
                )
            )
        return self.finish(replies)

    def aggregate_arrays(self, outcome: RoundOutcome) -> ArrayRecord:
        """The outcome's sum as an ArrayRecord with the app's keys and shapes (int64)."""
        if outcome.total is None:
            raise SecAggError(f"round abandoned: {outcome.abandoned}")
        return wire.unflatten(outcome.total, self.layout)


class SecAggPlus(Strategy):
    """A Message-API strategy wrapper: the wrapped strategy sees only the sum of the updates.

    ``SecAggPlus(MyStrategy(...), levels=L)`` with ``ClientApp(mods=[secagg_mod])``; clients'
    train handlers return integer arrays in ``[0, L]``. Each round, the wrapped strategy's
    ``aggregate_train`` receives one reply whose ``arrays_key`` ArrayRecord is the exact sum
    (int64, the app's keys and shapes) over the surviving clients and whose MetricRecord
    ``metrics`` holds ``{weighted_by_key: 1, "secagg-survivors": |U3|}``. An abandoned round
    gives ``(None, None)`` (Flower keeps the model) and its reason in :attr:`outcomes`.
    """

    def __init__(
        self,
        strategy: Strategy,
        *,
        levels: int,
        num_neighbours: int | None = None,
        threshold: int | None = None,
        stage_timeout: float = 60.0,
        min_survivors: int = 2,
        rng: np.random.Generator | None = None,
        arrays_key: str = "arrays",
        weighted_by_key: str | None = None,
    ) -> None:
        self.strategy = strategy
        self.levels = levels
        self.num_neighbours = num_neighbours
        self.threshold = threshold
        self.stage_timeout = stage_timeout
        self.min_survivors = min_survivors
        self.rng = rng
        self.arrays_key = arrays_key
        self.weighted_by_key: str = str(
            weighted_by_key or getattr(strategy, "weighted_by_key", None) or "num-examples"
        )
        self.outcomes: dict[int, RoundOutcome] = {}
        self.round_trips: dict[int, int] = {}
        self._round: SecAggRound | None = None
        self._prekeys: tuple[int, dict[int, KeyAdvert]] = (-1, {})

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        msgs = list(self.strategy.configure_train(server_round, arrays, config, grid))
        rnd, keys = self._prekeys
        self._round = SecAggRound(
            grid,
            server_round,
            msgs,
            levels=self.levels,
            num_neighbours=self.num_neighbours,
            threshold=self.threshold,
            rng=self.rng,
            prekeys=keys if rnd == server_round else None,
            stage_timeout=self.stage_timeout,
            min_survivors=self.min_survivors,
        )
        return self._round.begin()

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        rnd = self._round
        if rnd is None or rnd.server_round != server_round:
            raise SecAggError(f"aggregate_train for round {server_round} without its configure")
        outcome = rnd.finish(replies)
        self._round = None
        self.outcomes[server_round] = outcome
        self.round_trips[server_round] = rnd.round_trips
        self._prekeys = (server_round + 1, dict(outcome.next_keys))
        if outcome.total is None:
            logger.warning("secagg round %d abandoned: %s", server_round, outcome.abandoned)
            return None, None
        logger.info(
            "secagg round %d: exact sum of %d survivor(s) (%d dropped) after %d round trip(s)",
            server_round,
            len(outcome.survivors),
            len(outcome.dropped),
            rnd.round_trips,
        )
        reply = Message(
            RecordDict(
                {
                    self.arrays_key: rnd.aggregate_arrays(outcome),
                    "metrics": MetricRecord(
                        {self.weighted_by_key: 1, "secagg-survivors": len(outcome.survivors)}
                    ),
                }
            ),
            dst_node_id=0,
            message_type=wire.TRAIN,
        )
        return self.strategy.aggregate_train(server_round, [reply])

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        return self.strategy.aggregate_evaluate(server_round, replies)

    def summary(self) -> None:
        logger.info(
            "SecAggPlus(levels=%d, k=%s, t=%s) around %s",
            self.levels,
            self.num_neighbours,
            self.threshold,
            type(self.strategy).__name__,
        )
        self.strategy.summary()
