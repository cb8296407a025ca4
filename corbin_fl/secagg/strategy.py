"""The server half of SecAgg+ on Flower's Message API: :class:`SecAggRound` and :class:`SecAggPlus`.

:class:`SecAggRound` runs one round's stages with ``grid.send_and_receive`` around the train
messages a Message-API strategy configured, and returns the exact sum of the survivors' integer
updates (:class:`~.messages.RoundOutcome`). :class:`SecAggPlus` wraps a strategy like Flower's
DP wrappers do: ``configure_train`` is the wrapped strategy's plus whatever of the ``advertise``
and ``share`` stages the last round did not already do, the returned messages are the ``mask``
stage (the app trains there), and ``aggregate_train`` runs ``unmask`` and hands the wrapped
strategy's ``aggregate_train`` ONE reply holding the sum, so ``Strategy.start`` drives it
unchanged.

Round trips per round: ``mask`` -> ``unmask`` (2) in the steady state, each round's
``advertise`` and ``share`` riding the previous round's ``mask`` and ``unmask``; a round whose
sample the pipelined shares do not serve re-keys (4, as round 1). The rules are the round
driver's (:mod:`.driver`, which the composition with CorBin-FL runs too). The last round of
``Strategy.start`` asks for nothing ahead.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from corbin_fl.wrapper import StrategyWrapper

from . import wire
from .driver import DECODE_ERRORS, SecAggDriver
from .messages import MASK, KeyAdvert, MalformedMessageError, RoundOutcome, SecAggError
from .server import SecAggServer

logger = logging.getLogger(__name__)


class SecAggRound:
    """One SecAgg+ round over a Flower grid around a strategy's train messages: the channel of
    :class:`~.driver.SecAggDriver` on ``grid.send_and_receive``.

    Parameters
    ----------
    grid
        The ServerApp's grid; its ``run.run_id`` is bound into every key and AD.
    server_round
        The round number (in every message's group id and record).
    train_messages
        The wrapped strategy's ``configure_train`` output: one ``train`` message per sampled
        node, whose records reach the app's train handler in the ``mask`` stage.
    levels, num_neighbours, threshold, min_survivors, prekeys, pipelined, pipeline
        As in :class:`~.driver.SecAggDriver`.
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
        prekeys: Mapping[int, KeyAdvert] | None = None,
        pipelined: SecAggServer | None = None,
        pipeline: bool = False,
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
        self._mask_msgs: list[Message] = []
        self._t_mask = 0.0
        self.driver = SecAggDriver(
            self,
            run_id=grid.run.run_id,
            server_round=server_round,
            sampled=self.train,
            levels=levels,
            num_neighbours=num_neighbours,
            threshold=threshold,
            min_survivors=min_survivors,
            prekeys=prekeys,
            pipelined=pipelined,
            pipeline=pipeline,
        )

    @property
    def pipelined(self) -> bool:
        """Whether this round's share stage rode the previous round's unmask."""
        return self.driver.pipelined

    @property
    def next_server(self) -> SecAggServer | None:
        """The next round's server, its share stage done with this round's unmask."""
        return self.driver.next_server

    @property
    def layout(self) -> wire.Layout:
        """The app's arrays (the mask replies' agreed layout; empty before :meth:`finish`)."""
        return self.driver.layout or ()

    # ------------------------------------------------------------------ the channel
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

    def exchange(
        self, stage: str, contents: Mapping[int, RecordDict]
    ) -> tuple[dict[int, RecordDict], dict[int, str]]:
        """One stage over ``grid.send_and_receive`` (:class:`~.driver.Channel`)."""
        t0 = time.perf_counter()
        msgs = [self._message(node, c) for node, c in contents.items()]
        replies = list(self.grid.send_and_receive(msgs, timeout=self.stage_timeout))
        sent = {m.metadata.message_id: m.metadata.dst_node_id for m in msgs}
        self.round_trips += 1
        self.seconds[stage] = time.perf_counter() - t0
        return self._collect(stage, sent, replies)

    def settled(self, stage: str, server: SecAggServer) -> None:
        """Nothing to do: the outcome reports the drops (:class:`~.driver.Channel`)."""

    # ------------------------------------------------------------------ stages
    def begin(self) -> list[Message]:
        """``advertise`` (for nodes without keys) and ``share``, unless the previous round's
        unmask did them; the ``mask`` messages (with the next round's advertise request).

        Returns no message if the round was abandoned (the reason is in :meth:`finish`).
        """
        contents = self.driver.begin(self.train)
        self._mask_msgs = [self._message(u, c) for u, c in contents.items()]
        self._t_mask = time.perf_counter()
        return list(self._mask_msgs)

    def finish(self, replies: Iterable[Message]) -> RoundOutcome:
        """Take the ``mask`` replies, run ``unmask`` (with the next round's ``share`` when
        pipelining): the exact sum or the abandon reason."""
        if self.driver.abandoned is None:
            self.round_trips += 1
            self.seconds[MASK] = time.perf_counter() - self._t_mask
            sent = {m.metadata.message_id: m.metadata.dst_node_id for m in self._mask_msgs}
            good, bad = self._collect(MASK, sent, replies)
            for node, content in good.items():
                try:
                    self.driver.take_masked(node, content)
                except DECODE_ERRORS as exc:
                    bad[node] = f"malformed reply: {exc}"
            return self.driver.finish(bad)
        return self.driver.finish()

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


class SecAggPlus(StrategyWrapper):
    """A Message-API strategy wrapper: the wrapped strategy sees only the sum of the updates.

    ``SecAggPlus(MyStrategy(...), levels=L)`` with ``ClientApp(mods=[secagg_mod])``; clients'
    train handlers return integer arrays in ``[0, L]``. Each round, the wrapped strategy's
    ``aggregate_train`` receives one reply whose ``arrays_key`` ArrayRecord is the exact sum
    (int64, the app's keys and shapes) over the surviving clients and whose MetricRecord
    ``metrics`` holds ``{weighted_by_key: 1, "secagg-survivors": |U3|}``. An abandoned round
    gives ``(None, None)`` (Flower keeps the model) and its reason in :attr:`outcomes`.

    Each round below the last pipelines the next one (module docstring): a steady round is 2
    round trips, a round whose sample does not fit the pipelined share re-keys (4);
    :attr:`round_trips` and :attr:`pipelined` record both per round.
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
        arrays_key: str = "arrays",
        weighted_by_key: str | None = None,
    ) -> None:
        self.strategy = strategy
        self.levels = levels
        self.num_neighbours = num_neighbours
        self.threshold = threshold
        self.stage_timeout = stage_timeout
        self.min_survivors = min_survivors
        self.arrays_key = arrays_key
        self.weighted_by_key: str = weighted_by_key or super().weight_key()
        self.outcomes: dict[int, RoundOutcome] = {}
        self.round_trips: dict[int, int] = {}
        self._round: SecAggRound | None = None
        self._prekeys: tuple[int, dict[int, KeyAdvert]] = (-1, {})
        self._pipe: SecAggServer | None = None
        self.pipelined: dict[int, bool] = {}
        """Per round: whether its share stage rode the previous round's unmask."""
        self.num_rounds: int | None = None
        """Set by :meth:`start`: the last round pipelines nothing ahead."""

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        *args: Any,
        **kwargs: Any,
    ) -> Result:
        """:meth:`Strategy.start` (the same arguments), knowing the last round: it asks for no
        keys ahead."""
        self.num_rounds = num_rounds
        self._pipe, self._prekeys = None, (-1, {})
        try:
            return super().start(grid, initial_arrays, num_rounds, *args, **kwargs)
        finally:
            self.num_rounds = None

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        msgs = list(self.strategy.configure_train(server_round, arrays, config, grid))
        rnd, keys = self._prekeys
        pipe, self._pipe = self._pipe, None
        if pipe is not None and pipe.config.server_round != server_round:
            pipe = None
        self._round = SecAggRound(
            grid,
            server_round,
            msgs,
            levels=self.levels,
            num_neighbours=self.num_neighbours,
            threshold=self.threshold,
            prekeys=keys if rnd == server_round else None,
            pipelined=pipe,
            pipeline=self.num_rounds is None or server_round < self.num_rounds,
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
        self.pipelined[server_round] = rnd.pipelined
        self._pipe = rnd.next_server
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
        return self.aggregate_one(
            server_round,
            self.arrays_key,
            rnd.aggregate_arrays(outcome),
            {"secagg-survivors": len(outcome.survivors)},
        )

    def weight_key(self) -> str:
        """``weighted_by_key``: the key the wrapped strategy weights the one reply by."""
        return self.weighted_by_key

    def summary(self) -> None:
        logger.info(
            "SecAggPlus(levels=%d, k=%s, t=%s) around %s",
            self.levels,
            self.num_neighbours,
            self.threshold,
            type(self.strategy).__name__,
        )
        super().summary()
