"""Secure aggregation inside a CorBin-FL round (server side; :mod:`corbin_fl.secure`).

:class:`SecureRound` runs SecAgg+ (:class:`corbin_fl.secagg.server.SecAggServer`, Bell et al.
2020) around CorBin-FL's update stage, on the same transport (:func:`server.stages.exchange`,
so every reply passes the round's replay and misdirection checks and is counted in
``bytes_up`` / ``round_trips``):

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

A steady round is 2 round trips, ``update`` -> ``secagg-unmask`` (the plain round is 1). Round
``t+1`` uses the pipelined share stage when its sample (the wrapped strategy's, drawn after round
``t``'s aggregate) is a subset of round ``t``'s survivors that shared and keeps ``t`` sampled
holders of every secret its unmask would need (:meth:`SecAggServer.serves`): a pipelined node
not sampled counts as dropped before masking (its mask key is recovered, it masked nothing); a
pipelined node whose share failed is dropped at ``secagg-share`` as in an unpipelined round.
Otherwise the round re-keys every node (advertise, share: 4 round trips; a node re-keys only
before it masked, :meth:`corbin_fl.secagg.client.SecAggClient.advertise`). Nothing of the
pipeline is checkpointed: a resumed run has a new Flower run id, which every SecAgg+ key
derivation binds, and bootstraps afresh (as the pipelined relay, :class:`server.round.Pipeline`).
A round that loses too many nodes (fewer than ``t`` holders of a needed secret, fewer than 2
masked inputs) is abandoned with its reason in ``metrics.jsonl``
(``secure_aggregation.abandoned``); nothing of it is applied (no update is counted, the global
model stays).
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from typing import Any, Final

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

from corbin_fl import secure, wire
from corbin_fl.secagg import wire as sawire
from corbin_fl.secagg.graph import COLLUSION, DROPOUT, failure_probabilities
from corbin_fl.secagg.messages import (
    ADVERTISE,
    MASK,
    SHARE,
    UNMASK,
    KeyAdvert,
    MaskReply,
    MaskRequest,
    SecAggError,
    ShareKeysReply,
)
from corbin_fl.secagg.server import SecAggServer
from corbin_fl.server.round import instruction, reply_head
from corbin_fl.server.stages import RoundState, exchange

logger = logging.getLogger(__name__)

_STAGES: Final[tuple[str, ...]] = (secure.ADVERTISE, secure.SHARE, wire.UPDATE, secure.UNMASK)


class SecureRound:
    """SecAgg+ of one CorBin-FL round (module docstring). ``rt`` is the ServerRuntime."""

    def __init__(self, rt: Any, state: RoundState, participants: list[int]) -> None:
        cfg = rt.cfg
        self.rt, self.state = rt, state
        self.levels = secure.levels_of(cfg)
        self.masked: dict[int, MaskReply] = {}
        self.requests: dict[int, MaskRequest] = {}
        self.assignment: dict[int, str] = {}
        self.trips0 = state.round_trips
        self.record: dict[str, Any] = {
            "on": True,
            "levels": self.levels,
            "sampled": len(participants),
        }
        state.secure = self.record
        self.next_keys: dict[int, KeyAdvert] = {}
        self.advertise_next = state.round < cfg.num_rounds
        self.not_sampled: set[int] = set()
        self.srv: SecAggServer | None = None
        pipe, rt.secagg_next = rt.secagg_next, None
        if (
            pipe is not None
            and pipe.config.server_round == state.round
            and pipe.serves(participants)
        ):  # the shares came with the last round's unmask replies, and they cover the sample
            self.srv, self.not_sampled = pipe, set(pipe.sampled) - set(participants)
            self.record["pipelined"] = True
        else:
            self.record["pipelined"] = False
            if pipe is not None:  # its nodes shared with keys of its graph: re-key them all
                logger.info("round %d: pipelined secure aggregation shares unused", state.round)
            rnd_keys, keys = rt.secagg_keys or (-1, {})
            self.srv = self._server(
                state.round,
                participants,
                keys if rnd_keys == state.round and pipe is None else None,
            )
            if self.srv is None:
                return
        self._record_parameters()
        if self.srv.abandoned:
            self._abandon(self.srv.abandoned)

    def _server(
        self, rnd: int, nodes: list[int], prekeys: dict[int, KeyAdvert] | None
    ) -> SecAggServer | None:
        """Round ``rnd``'s SecAgg+ server over ``nodes`` (None, the round abandoned, when ``k``
        or ``t`` is impossible for this ``n``)."""
        cfg = self.rt.cfg
        try:
            return SecAggServer(
                run_id=self.rt.run_id,
                server_round=rnd,
                node_ids=list(nodes),
                levels=self.levels,
                num_neighbours=cfg.secagg_neighbours or None,
                threshold=cfg.secagg_threshold or None,
                prekeys=prekeys,
            )
        except ValueError as exc:  # fewer than 2 nodes, or k / t impossible for this n
            if rnd == self.state.round:
                self._abandon(f"setup: {exc}")
            return None

    # ------------------------------------------------------------------ helpers
    def _record_parameters(self) -> None:
        """``b``, ``k``, ``t`` of the round and their bounds (:func:`failure_probabilities` at
        the default sizing's dropout and collusion fractions, over the graph's nodes: the
        participants once drawn, else the sampled), for ``metrics.jsonl`` and the report."""
        srv = self.srv
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

    def _sync_drops(self, stage: str) -> None:
        """Nodes SecAgg+ dropped leave the CorBin-FL round too (never the other way round)."""
        assert self.srv is not None
        for nid, why in sorted(self.srv.dropped.items()):
            self.state.drop(nid, f"secure aggregation: {why}", stage)
        if self.srv.abandoned:
            self._abandon(self.srv.abandoned)

    def _exchange(
        self, stage: str, bodies: dict[int, dict[str, ConfigRecord]]
    ) -> tuple[dict[int, dict[str, RecordDict]], dict[int, str]]:
        """One secure stage over :func:`exchange`: each node's records (:data:`secure.SECAGG_REC`,
        and :data:`secure.NEXT_REC` where the next round's stage rides it); a reply must carry
        the same record names, each as :mod:`corbin_fl.secagg.wire` reads it (the main one's
        stage and round checked here). Returns the replies by node and the failures."""
        rt, state = self.rt, self.state
        got: dict[int, dict[str, RecordDict]] = {}
        before = set(state.dropped)

        def on_reply(nid: int, reply: Message) -> None:
            content = reply.content
            wire.check_records(content, dict.fromkeys(bodies[nid], ConfigRecord))
            rec = content.config_records[secure.SECAGG_REC]
            wire.check_round(reply, rec, state.round)
            inner = {n: RecordDict({sawire.RECORD: content.config_records[n]}) for n in bodies[nid]}
            try:
                ok = sawire.stage_of(inner[secure.SECAGG_REC]) == (_INNER[stage], state.round)
            except SecAggError as exc:
                raise wire.WireError(str(exc)) from exc
            if not ok:
                raise wire.WireError(f"{secure.SECAGG_REC} does not answer {stage}")
            got[nid] = inner

        exchange(
            rt.grid,
            state,
            {
                nid: instruction(rt, stage, nid, state.round, {}, **records)
                for nid, records in bodies.items()
            },
            on_reply,
            timeout=rt.timeout(stage) if bodies else 0.0,
            poll_interval=rt.cfg.poll_interval,
            max_inflight=rt.cfg.max_inflight,
            files=rt.files,
            link=rt.link,
        )
        failed = {n: state.dropped[n] for n in set(state.dropped) - before}
        return got, failed

    @staticmethod
    def _decode(
        got: dict[int, dict[str, RecordDict]],
        failed: dict[int, str],
        fn: Any,
        name: str = secure.SECAGG_REC,
    ) -> dict[int, Any]:
        """``fn`` of each reply's record ``name``; a reply that does not decode goes to
        ``failed``."""
        out = {}
        for nid, records in got.items():
            if name not in records:
                continue
            try:
                out[nid] = fn(records[name])
            except (SecAggError, KeyError, TypeError, ValueError) as exc:
                failed[nid] = f"malformed reply: {exc}"
        return out

    @staticmethod
    def _body(request: RecordDict) -> dict[str, ConfigRecord]:
        return {secure.SECAGG_REC: request.config_records[sawire.RECORD]}

    # ------------------------------------------------------------------ 1. before the update
    def begin(self) -> list[int]:
        """Advertise (where keys are missing) and share, unless the last round's unmask did;
        the nodes that mask in the update."""
        srv, state = self.srv, self.state
        if srv is None or self.abandoned:
            return []
        if srv.stage == MASK:  # pipelined: its share stage's drops are this round's
            self._sync_drops(secure.SHARE)
        else:
            if srv.stage == ADVERTISE:
                got, failed = self._exchange(
                    secure.ADVERTISE,
                    {
                        u: self._body(sawire.advertise_request(state.round))
                        for u in srv.advertise_targets()
                    },
                )
                srv.receive_adverts(
                    self._decode(got, failed, sawire.decode_advertise_reply), failed
                )
                if srv.abandoned is None:  # k, t sized again for the nodes with keys
                    self._record_parameters()
                self._sync_drops(secure.ADVERTISE)
                if self.abandoned:
                    return []
            got, failed = self._exchange(
                secure.SHARE,
                {u: self._body(sawire.share_request(r)) for u, r in srv.share_requests().items()},
            )
            srv.receive_shares(self._decode(got, failed, sawire.decode_share_reply), failed)
            self._sync_drops(secure.SHARE)
        if self.abandoned:
            return []
        self.requests = srv.mask_requests()
        return [nid for nid in sorted(self.requests) if nid in state.active]

    # ------------------------------------------------------------------ 2. the update stage
    def attach(self, messages: dict[int, Message]) -> None:
        """Add each node's mask request to its update instruction."""
        for nid, msg in messages.items():
            rec = sawire.mask_request(self.requests[nid], RecordDict())[sawire.RECORD]
            msg.content[secure.SECAGG_REC] = rec
            if self.advertise_next:  # round t+1's keys ride the reply (pipelined advertise)
                adv = sawire.advertise_request(self.state.round + 1)
                msg.content[secure.NEXT_REC] = adv.config_records[sawire.RECORD]
            self.assignment[nid] = str(msg.content.config_records[wire.CFG][wire.ASSIGNMENT])

    def accept(self, nid: int, reply: Message) -> None:
        """Check a secure update reply; keep its masked vector (nothing is decoded yet)."""
        assert self.srv is not None
        cfg, state = self.rt.cfg, self.state
        content = reply.content
        expected: dict[str, type] = {
            wire.REPLY: ConfigRecord,
            secure.SECAGG_REC: ConfigRecord,
            secure.MASKED_REC: ArrayRecord,
        }
        if self.advertise_next:
            expected[secure.NEXT_REC] = ConfigRecord
        wire.check_records(content, expected)
        next_pk, digest, next_blob = reply_head(state, nid, reply, cfg)
        m, bits = self.rt.layout.m, self.srv.config.bits
        arrays = content.array_records[secure.MASKED_REC]
        wire.check_keys(arrays, {sawire.MASKED_ARRAY}, what="masked")
        # the careful .npy reader first: a hostile header allocates nothing
        wire.read_array(arrays, sawire.MASKED_ARRAY, np.uint8, (m * bits + 7) // 8)
        rec = content.config_records[secure.SECAGG_REC]
        inner = RecordDict({sawire.RECORD: rec, sawire.MASKED_RECORD: arrays})
        try:
            if sawire.stage_of(inner) != (MASK, state.round):
                raise wire.WireError(f"{secure.SECAGG_REC} does not answer the mask stage")
            rep, layout = sawire.decode_mask_reply(inner, bits)
        except SecAggError as exc:
            raise wire.WireError(str(exc)) from exc
        if layout != ((secure.SYMBOLS_KEY, (m,)),):
            raise wire.WireError(f"masked update layout {layout!r:.80}, expected {m} symbols")
        if self.advertise_next:
            self.next_keys[nid] = _next_keys(content, state.round + 1)
        self.masked[nid] = rep
        if next_pk is not None:
            state.next_pubkeys[nid] = next_pk
        if digest is not None:
            state.z_digests[nid] = digest
        if next_blob is not None:
            state.next_blobs[nid] = next_blob

    # ------------------------------------------------------------------ 3-4. unmask, aggregate
    def finish(self, masking: list[int], aggregator: Any) -> None:
        """Unmask and feed ``aggregator`` with the exact sum, or abandon (nothing applied).

        ``masking``: the nodes sent an update instruction. Each survivor's release goes to the
        ledger with what the server knows of it: ``paired`` from its assignment (the clients'
        own metrics stay on the nodes).
        """
        rt, state, srv = self.rt, self.state, self.srv
        rt.secagg_keys = (-1, {})
        try:
            if srv is None or self.abandoned:
                return
            failed = {
                nid: state.dropped.get(nid, "no reply") for nid in masking if nid not in self.masked
            }
            failed.update(dict.fromkeys(self.not_sampled, "not sampled in this round"))
            srv.receive_masked({n: r for n, r in self.masked.items() if n not in failed}, failed)
            self._sync_drops(wire.UPDATE)
            if self.advertise_next:  # unused until a share stage takes them
                rt.secagg_keys = (state.round + 1, dict(self.next_keys))
            if self.abandoned:
                return
            nxt = self._next_server() if self.advertise_next else None
            shares = nxt.share_requests() if nxt is not None else {}
            bodies = {}
            for u, r in srv.unmask_requests().items():
                bodies[u] = self._body(sawire.unmask_request(r))
                if u in shares:
                    req = sawire.share_request(shares[u]).config_records[sawire.RECORD]
                    bodies[u][secure.NEXT_REC] = req
            got, failed = self._exchange(secure.UNMASK, bodies)
            replies = self._decode(got, failed, sawire.decode_unmask_reply)
            if nxt is not None:  # round t+1's shares: a bad one drops its sender from t+1 only
                self._pipeline(nxt, got, failed)
            for nid in failed:  # its masked input is in the sum: it stays a participant
                if nid in state.dropped and nid in srv.survivors:
                    state.dropped.pop(nid)
                    state.active.add(nid)
            outcome = srv.receive_unmask(replies, failed)
            self.record["faulty"] = {str(n): why for n, why in sorted(outcome.faulty.items())}
            if outcome.total is None:
                self._abandon(outcome.abandoned or "unmask failed")
                return
            feed(aggregator, outcome.total, len(outcome.survivors), rt.cfg)
            self.record["sum_max"] = int(outcome.total.max()) if outcome.total.size else 0
            # who is in the sum, by assignment (the privacy report's count of the clients that
            # quantized independently: every assignment but "paired")
            kinds = Counter(self.assignment.get(nid, "?") for nid in outcome.survivors)
            self.record["assignments"] = dict(sorted(kinds.items()))
            for nid in outcome.survivors:
                paired = self.assignment.get(nid) == wire.PAIRED
                state.client_metrics[nid] = {wire.M_PAIRED: float(paired)}
                if rt.on_release is not None:
                    rt.on_release(state.round, nid, state.client_metrics[nid])
        finally:
            self.record["survivors"] = len(state.client_metrics)
            self.record["round_trips"] = state.round_trips - self.trips0
            self.record["bytes_up"] = {s: state.bytes_up[s] for s in _STAGES if s in state.bytes_up}
            self.record.setdefault("abandoned", None)

    # ------------------------------------------------------------------ the next round's share
    def _next_server(self) -> SecAggServer | None:
        """Round ``t+1``'s SecAgg+ server over this round's survivors with keys for it (its
        graph derived now from their keys), or None when it cannot run."""
        assert self.srv is not None
        nodes = [u for u in self.srv.survivors if u in self.next_keys]
        nxt = self._server(self.state.round + 1, nodes, self.next_keys)
        return nxt if nxt is not None and nxt.abandoned is None else None

    def _pipeline(
        self, nxt: SecAggServer, got: dict[int, dict[str, RecordDict]], failed: dict[int, str]
    ) -> None:
        """Take round ``t+1``'s share replies that came with the unmask replies."""
        rnd, bad = self.state.round + 1, dict(failed)

        def decode(content: RecordDict) -> ShareKeysReply:
            if sawire.stage_of(content) != (SHARE, rnd):
                raise SecAggError(f"{secure.NEXT_REC} does not answer the share of round {rnd}")
            return sawire.decode_share_reply(content)

        shares = self._decode(got, bad, decode, secure.NEXT_REC)
        nxt.receive_shares(shares, bad)
        self.rt.secagg_keys = (-1, {})  # the keys are in round t+1's shares now
        self.rt.secagg_next = nxt
        self.record["next_shared"] = len(nxt.alive)


def _next_keys(content: RecordDict, rnd: int) -> KeyAdvert:
    """The node's SecAgg+ keys of round ``rnd`` from an update reply (:data:`secure.NEXT_REC`)."""
    inner = RecordDict({sawire.RECORD: content.config_records[secure.NEXT_REC]})
    try:
        return sawire.decode_next_keys(inner, rnd)
    except SecAggError as exc:
        raise wire.WireError(f"{secure.NEXT_REC}: {exc}") from exc


_INNER: Final[dict[str, str]] = {
    secure.ADVERTISE: ADVERTISE,
    secure.SHARE: SHARE,
    secure.UNMASK: UNMASK,
}


def feed(aggregator: Any, total: np.ndarray, n: int, cfg: Any) -> None:
    """Put the exact symbol sum ``total`` of ``n`` clients into the mechanism's aggregator
    (:meth:`corbin_fl.server.aggregation.Aggregator.from_symbol_sum`), which decodes it as the
    plain path decodes the same symbols."""
    try:
        aggregator.from_symbol_sum(np.asarray(total, dtype=np.int64), n)
    except (NotImplementedError, ValueError) as exc:
        raise SecAggError(f"{cfg.mechanism}: {exc}") from exc


__all__ = ["SecureRound", "feed"]
