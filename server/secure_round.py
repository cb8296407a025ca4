"""Secure aggregation inside a CorBin-FL round (server side; :mod:`corbin_fl.secure`).

:class:`SecureRound` runs SecAgg+ (Bell et al. 2020) around CorBin-FL's update stage with the
round driver of the standalone building block (:class:`corbin_fl.secagg.driver.SecAggDriver`,
which :class:`corbin_fl.secagg.strategy.SecAggPlus` runs over Flower's grid). It is that
driver's channel on CorBin-FL's transport (:func:`server.stages.exchange`, so every reply passes
the round's replay and misdirection checks and is counted in ``bytes_up`` / ``round_trips``),
with the SecAgg+ records under the protocol's names (:data:`corbin_fl.secure.SECAGG_RECORDS`),
and keeps the round's ``secure_aggregation`` record:

1. before the update stage, only when the last round's unmask did not already do it
   (bootstrap, a sample that is not a subset of the pipelined one, a new node):
   ``secagg-advertise`` (nodes without keys from the last update reply) and ``secagg-share``;
2. ``update`` (the SecAgg+ mask stage): CorBin-FL's update instruction plus the node's mask
   request (the share ciphertexts its neighbours addressed to it) and, below the last round,
   round ``t+1``'s advertise request (:data:`corbin_fl.secure.NEXT_REC`); the pair's blobs,
   the next round's pairing and the node's next public key still ride it; the reply carries
   the masked ``b``-bit symbol vector instead of the packed update (:meth:`accept`) and the
   node's SecAgg+ keys of round ``t+1``;
3. ``secagg-unmask`` over the survivors, carrying round ``t+1``'s share request over them (the
   neighbour graph of round ``t+1`` drawn now over the survivors with keys): its replies carry
   the unmask shares of round ``t`` and the share ciphertexts of round ``t+1``;
4. the exact symbol sum is fed to the mechanism's own aggregator (:func:`feed`), which decodes
   it as it decodes the plain counts: ``c + r alpha (2 S / n - 1)`` for the one-bit mechanisms
   (the ``BitCounter``'s counts ARE the symbol sums), so the estimate equals the plain path's
   bit for bit given the same bits.

A steady round is 2 round trips, ``update`` -> ``secagg-unmask`` (the plain round is 1); when
the pipelined shares do not serve the round's sample, it re-keys every node (4), by the
driver's rules (:mod:`corbin_fl.secagg.driver`). Nothing of the pipeline is checkpointed: a
resumed run has a new Flower run id, which every SecAgg+ key derivation binds, and bootstraps
afresh (as the pipelined relay, :class:`server.round.Pipeline`). A round that loses too many
nodes (fewer than ``t`` holders of a needed secret, fewer than 2 masked inputs) is abandoned
with its reason in ``metrics.jsonl`` (``secure_aggregation.abandoned``); nothing of it is
applied (no update is counted, the global model stays).
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Mapping
from typing import Any, Final

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

from corbin_fl import secure, wire
from corbin_fl.secagg import wire as sawire
from corbin_fl.secagg.driver import SecAggDriver
from corbin_fl.secagg.graph import COLLUSION, DROPOUT, failure_probabilities
from corbin_fl.secagg.messages import ADVERTISE, MASK, SHARE, UNMASK, SecAggError
from corbin_fl.secagg.server import SecAggServer
from corbin_fl.server.stages import RoundState, exchange, instruction

logger = logging.getLogger(__name__)

_STAGES: Final[tuple[str, ...]] = (secure.ADVERTISE, secure.SHARE, wire.UPDATE, secure.UNMASK)
_STAGE_OF: Final[dict[str, str]] = {
    ADVERTISE: secure.ADVERTISE,
    SHARE: secure.SHARE,
    MASK: wire.UPDATE,
    UNMASK: secure.UNMASK,
}
"""Each SecAgg+ stage's CorBin-FL stage (the mask stage is the update stage)."""
_FROM_HOST: Final[dict[str, str]] = {ours: sa for sa, ours in secure.SECAGG_RECORDS.items()}


class SecureRound:
    """SecAgg+ of one CorBin-FL round (module docstring). ``rt`` is the ServerRuntime.

    The channel of :class:`~corbin_fl.secagg.driver.SecAggDriver`: :meth:`exchange` sends a
    secure stage's instructions, :meth:`settled` drops the nodes SecAgg+ dropped from the
    CorBin-FL round too.
    """

    def __init__(self, rt: Any, state: RoundState, participants: list[int]) -> None:
        cfg = rt.cfg
        self.rt, self.state = rt, state
        self.levels = secure.levels_of(cfg)
        self.assignment: dict[int, str] = {}
        self.masking: list[int] = []
        self.requests: dict[int, RecordDict] = {}
        self.trips0 = state.round_trips
        self.record: dict[str, Any] = {
            "on": True,
            "levels": self.levels,
            "sampled": len(participants),
        }
        state.secure = self.record
        pipe, rt.secagg_next = rt.secagg_next, None
        rnd_keys, keys = rt.secagg_keys or (-1, {})
        self.driver = SecAggDriver(
            self,
            run_id=rt.run_id,
            server_round=state.round,
            sampled=participants,
            levels=self.levels,
            num_neighbours=cfg.secagg_neighbours or None,
            threshold=cfg.secagg_threshold or None,
            prekeys=keys if rnd_keys == state.round else None,
            pipelined=pipe,
            pipeline=state.round < cfg.num_rounds,
            layout=((secure.SYMBOLS_KEY, (rt.layout.m,)),),
        )
        self.record["pipelined"] = self.driver.pipelined
        if self.driver.server is not None:
            self._record_parameters()
        if self.driver.abandoned is not None:
            self._abandon(self.driver.abandoned)

    # ------------------------------------------------------------------ helpers
    def _record_parameters(self) -> None:
        """``b``, ``k``, ``t`` of the round and their bounds (:func:`failure_probabilities` at
        the default sizing's dropout and collusion fractions, over the graph's nodes: the
        participants once drawn, else the sampled), for ``metrics.jsonl`` and the report."""
        srv = self.driver.server
        assert srv is not None
        n = len(srv.participants or srv.sampled)
        k, t = min(srv.degree or srv.k, n - 1), srv.threshold
        p_sec, p_abandon = failure_probabilities(
            n,
            k,
            t,
            dropout=DROPOUT,
            collusion=COLLUSION,
            corrupt=math.floor(COLLUSION * len(srv.sampled)),
        )
        self.record.update(
            {
                "b": srv.config.bits,
                "k": k,
                "t": t,
                "dropout": DROPOUT,
                "collusion": COLLUSION,
                "p_security": p_sec,
                "p_abandon": p_abandon,
            }
        )

    def _abandon(self, reason: str) -> None:
        if self.record.get("abandoned") is None:
            self.record["abandoned"] = reason
            logger.warning("round %d: secure aggregation abandoned: %s", self.state.round, reason)

    @property
    def abandoned(self) -> bool:
        return self.record.get("abandoned") is not None

    # ------------------------------------------------------------------ the driver's channel
    def settled(self, stage: str, server: SecAggServer) -> None:
        """Nodes SecAgg+ dropped leave the CorBin-FL round too (never the other way round);
        ``k`` and ``t`` as sized again for the nodes with keys."""
        if stage == ADVERTISE and server.abandoned is None:
            self._record_parameters()
        for nid, why in sorted(server.dropped.items()):
            self.state.drop(nid, f"secure aggregation: {why}", _STAGE_OF[stage])
        if server.abandoned:
            self._abandon(server.abandoned)

    def exchange(
        self, stage: str, contents: Mapping[int, RecordDict]
    ) -> tuple[dict[int, RecordDict], dict[int, str]]:
        """One secure stage over :func:`exchange`: each node's SecAgg+ records under the
        protocol's names; a reply must carry the same record names, its main one naming this
        stage and round. A node that fails the unmask stage stays a participant: its masked
        input is in the sum. Returns the replies by node (SecAgg+ records) and the failures."""
        rt, state = self.rt, self.state
        ours = _STAGE_OF[stage]
        bodies = {nid: sawire.renamed(c, secure.SECAGG_RECORDS) for nid, c in contents.items()}
        got: dict[int, RecordDict] = {}
        before = set(state.dropped)

        def on_reply(nid: int, reply: Message) -> None:
            content = reply.content
            wire.check_records(content, dict.fromkeys(bodies[nid], ConfigRecord))
            wire.check_round(reply, content.config_records[secure.SECAGG_REC], state.round)
            inner = sawire.renamed(content, _FROM_HOST)
            try:
                ok = sawire.stage_of(inner) == (stage, state.round)
            except SecAggError as exc:
                raise wire.WireError(str(exc)) from exc
            if not ok:
                raise wire.WireError(f"{secure.SECAGG_REC} does not answer {ours}")
            got[nid] = inner

        exchange(
            rt.grid,
            state,
            {
                nid: instruction(rt, ours, nid, state.round, {}, **body)
                for nid, body in bodies.items()
            },
            on_reply,
            timeout=rt.timeout(ours) if bodies else 0.0,
            poll_interval=rt.cfg.poll_interval,
            max_inflight=rt.cfg.max_inflight,
            files=rt.files,
            link=rt.link,
        )
        failed = {n: state.dropped[n] for n in set(state.dropped) - before}
        survivors = self.driver.server.survivors if self.driver.server is not None else ()
        for nid in failed if stage == UNMASK else ():
            if nid in survivors:  # its masked input is in the sum: it stays a participant
                state.dropped.pop(nid)
                state.active.add(nid)
        return got, failed

    # ------------------------------------------------------------------ 1. before the update
    def begin(self) -> list[int]:
        """Advertise (where keys are missing) and share, unless the last round's unmask did;
        the nodes that mask in the update."""
        if self.abandoned:
            return []
        self.requests = {
            nid: content for nid, content in self.driver.begin().items() if nid in self.state.active
        }
        return sorted(self.requests)

    # ------------------------------------------------------------------ 2. the update stage
    def attach(self, messages: dict[int, Message]) -> None:
        """Add each node's mask request (and the next round's advertise request) to its update
        instruction."""
        for nid, msg in messages.items():
            for name, rec in sawire.renamed(self.requests[nid], secure.SECAGG_RECORDS).items():
                msg.content[name] = rec
            self.assignment[nid] = str(msg.content.config_records[wire.CFG][wire.ASSIGNMENT])
        self.masking = list(messages)

    def check_records(self, reply: Message) -> None:
        """The records of a secure update reply: ``corbin.reply``, the mask reply and the
        masked vector (and the next round's keys when they were asked for)."""
        expected: dict[str, type] = {
            wire.REPLY: ConfigRecord,
            secure.SECAGG_REC: ConfigRecord,
            secure.MASKED_REC: ArrayRecord,
        }
        if self.driver.pipeline:
            expected[secure.NEXT_REC] = ConfigRecord
        wire.check_records(reply.content, expected)

    def accept(self, nid: int, reply: Message) -> None:
        """Take a secure update reply's masked vector (nothing is decoded yet); its records and
        its ``corbin.reply`` were checked (:meth:`check_records`)."""
        srv = self.driver.server
        assert srv is not None
        arrays = reply.content.array_records[secure.MASKED_REC]
        wire.check_keys(arrays, {sawire.MASKED_ARRAY}, what="masked")
        # the careful .npy reader first: a hostile header allocates nothing
        m = self.rt.layout.m
        wire.read_array(arrays, sawire.MASKED_ARRAY, np.uint8, (m * srv.config.bits + 7) // 8)
        try:
            self.driver.take_masked(nid, sawire.renamed(reply.content, _FROM_HOST))
        except SecAggError as exc:
            raise wire.WireError(str(exc)) from exc

    # ------------------------------------------------------------------ 3-4. unmask, aggregate
    def finish(self, aggregator: Any) -> None:
        """Unmask and feed ``aggregator`` with the exact sum, or abandon (nothing applied).

        Each survivor's release goes to the ledger with what the server knows of it: ``paired``
        from its assignment (the clients' own metrics stay on the nodes).
        """
        rt, state, driver = self.rt, self.state, self.driver
        rt.secagg_keys = (-1, {})
        try:
            if driver.server is None or self.abandoned:
                return
            failed = {
                nid: state.dropped.get(nid, "no reply")
                for nid in self.masking
                if not driver.taken(nid)
            }
            outcome = driver.finish(failed)
            if driver.pipeline and driver.shared_ahead is None:  # unused until a share stage
                rt.secagg_keys = (state.round + 1, dict(driver.next_keys))
            if driver.shared_ahead is not None:  # the keys are in round t+1's shares now
                rt.secagg_next = driver.shared_ahead
                self.record["next_shared"] = len(driver.shared_ahead.alive)
            if driver.unmasked:
                self.record["faulty"] = {str(n): why for n, why in sorted(outcome.faulty.items())}
            if outcome.total is None:
                self._abandon(outcome.abandoned or "unmask failed")
                return
            self._aggregate(aggregator, outcome.total, outcome.survivors)
        finally:
            self.record["survivors"] = len(state.client_metrics)
            self.record["round_trips"] = state.round_trips - self.trips0
            self.record["bytes_up"] = {s: state.bytes_up[s] for s in _STAGES if s in state.bytes_up}
            self.record.setdefault("abandoned", None)

    def _aggregate(self, aggregator: Any, total: np.ndarray, survivors: tuple[int, ...]) -> None:
        """Feed the exact sum; each survivor's release to the ledger."""
        rt, state = self.rt, self.state
        feed(aggregator, total, len(survivors), rt.cfg)
        self.record["sum_max"] = int(total.max()) if total.size else 0
        # who is in the sum, by assignment (the privacy report's count of the clients that
        # quantized independently: every assignment but "paired")
        kinds = Counter(self.assignment.get(nid, "?") for nid in survivors)
        self.record["assignments"] = dict(sorted(kinds.items()))
        for nid in survivors:
            paired = self.assignment.get(nid) == wire.PAIRED
            state.client_metrics[nid] = {wire.M_PAIRED: float(paired)}
            if rt.on_release is not None:
                rt.on_release(state.round, nid, state.client_metrics[nid])


def feed(aggregator: Any, total: np.ndarray, n: int, cfg: Any) -> None:
    """Put the exact symbol sum ``total`` of ``n`` clients into the mechanism's aggregator
    (:meth:`corbin_fl.server.aggregation.Aggregator.from_symbol_sum`), which decodes it as the
    plain path decodes the same symbols."""
    try:
        aggregator.from_symbol_sum(np.asarray(total, dtype=np.int64), n)
    except (NotImplementedError, ValueError) as exc:
        raise SecAggError(f"{cfg.mechanism}: {exc}") from exc


__all__ = ["SecureRound", "feed"]
