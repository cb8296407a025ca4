"""Secure aggregation inside a CorBin-FL round (server side; :mod:`corbin_fl.secure`).

:class:`SecureRound` runs SecAgg+ (:class:`corbin_fl.secagg.server.SecAggServer`, Bell et al.
2020) around CorBin-FL's update stage, on the same transport (:func:`server.stages.exchange`,
so every reply passes the round's replay and misdirection checks and is counted in
``bytes_up`` / ``round_trips``):

1. ``secagg-advertise`` (only nodes without keys pipelined from the last unmask reply) and
   ``secagg-share`` over the update stage's participants, before the update stage;
2. ``update`` (the SecAgg+ mask stage): CorBin-FL's update instruction plus the node's mask
   request (the share ciphertexts its neighbours addressed to it); the pair's blobs, the next
   round's pairing and the node's next public key still ride it; the reply carries the masked
   ``b``-bit symbol vector instead of the packed update (:meth:`accept`);
3. ``secagg-unmask`` over the survivors; its replies carry each node's SecAgg+ keys for the
   next round (pipelined advertise);
4. the exact symbol sum is fed to the mechanism's own aggregator (:func:`feed`), which decodes
   it as it decodes the plain counts: ``c + r alpha (2 S / n - 1)`` for the one-bit mechanisms
   (the ``BitCounter``'s counts ARE the symbol sums), so the estimate equals the plain path's
   bit for bit given the same bits.

A steady round (every participant sent keys with the last unmask reply) is 3 round trips:
``secagg-share`` -> ``update`` -> ``secagg-unmask`` (the plain round is 1). The share stage of
round t+1 cannot ride round t's unmask: round t+1's participants are the wrapped strategy's
sample, drawn after round t's aggregate. A round that loses too many nodes (fewer than ``t``
holders of a needed secret, fewer than 2 masked inputs) is abandoned with its reason in
``metrics.jsonl`` (``secure_aggregation.abandoned``); nothing of it is applied (no update is
counted, the global model stays).
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any, Final

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

from corbin_fl import secure, wire
from corbin_fl.secagg import wire as sawire
from corbin_fl.secagg.messages import (
    ADVERTISE,
    MASK,
    SHARE,
    UNMASK,
    MaskReply,
    MaskRequest,
    SecAggError,
)
from corbin_fl.secagg.server import SecAggServer
from corbin_fl.server.round import reply_head
from corbin_fl.server.stages import RoundState, exchange

logger = logging.getLogger(__name__)

_PURPOSE_GRAPH: Final[int] = 5
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
        rnd_keys, keys = getattr(rt, "secagg_keys", None) or (-1, {})
        self.srv: SecAggServer | None = None
        try:
            self.srv = SecAggServer(
                run_id=rt.run_id,
                server_round=state.round,
                node_ids=list(participants),
                levels=self.levels,
                num_neighbours=cfg.secagg_neighbours or None,
                threshold=cfg.secagg_threshold or None,
                rng=rt.rng(state.round, _PURPOSE_GRAPH),
                prekeys=keys if rnd_keys == state.round else None,
            )
        except ValueError as exc:  # fewer than 2 nodes, or k / t impossible for this n
            self._abandon(f"setup: {exc}")
            return
        self.record.update({"b": self.srv.config.bits, "k": self.srv.k, "t": self.srv.threshold})
        if self.srv.abandoned:
            self._abandon(self.srv.abandoned)

    # ------------------------------------------------------------------ helpers
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
        self, stage: str, bodies: dict[int, ConfigRecord]
    ) -> tuple[dict[int, RecordDict], dict[int, str]]:
        """One secure stage over :func:`exchange`: replies by node, and the failures."""
        rt, state = self.rt, self.state
        from corbin_fl.server.round import instruction

        got: dict[int, RecordDict] = {}
        before = set(state.dropped)

        def on_reply(nid: int, reply: Message) -> None:
            content = reply.content
            wire.check_records(content, {secure.SECAGG_REC: ConfigRecord})
            rec = content.config_records[secure.SECAGG_REC]
            wire.check_round(reply, rec, state.round)
            inner = RecordDict({sawire.RECORD: rec})
            try:
                ok = sawire.stage_of(inner) == (_INNER[stage], state.round)
            except SecAggError as exc:
                raise wire.WireError(str(exc)) from exc
            if not ok:
                raise wire.WireError(f"{secure.SECAGG_REC} does not answer {stage}")
            got[nid] = inner

        exchange(
            rt.grid,
            state,
            {
                nid: instruction(rt, stage, nid, state.round, {}, **{secure.SECAGG_REC: body})
                for nid, body in bodies.items()
            },
            on_reply,
            timeout=rt.timeout(stage) if bodies else 0.0,
            poll_interval=rt.cfg.poll_interval,
            max_inflight=rt.cfg.max_inflight,
            files=rt.files,
        )
        failed = {n: state.dropped[n] for n in set(state.dropped) - before}
        return got, failed

    @staticmethod
    def _decode(got: dict[int, RecordDict], failed: dict[int, str], fn: Any) -> dict[int, Any]:
        out = {}
        for nid, inner in got.items():
            try:
                out[nid] = fn(inner)
            except (SecAggError, KeyError, TypeError, ValueError) as exc:
                failed[nid] = f"malformed reply: {exc}"
        return out

    # ------------------------------------------------------------------ 1. before the update
    def begin(self) -> list[int]:
        """Advertise (where keys are missing) and share; the nodes that mask in the update."""
        srv, state = self.srv, self.state
        if srv is None or self.abandoned:
            return []
        if srv.stage == ADVERTISE:
            got, failed = self._exchange(
                secure.ADVERTISE,
                {
                    u: sawire.advertise_request(state.round).config_records[sawire.RECORD]
                    for u in srv.advertise_targets()
                },
            )
            srv.receive_adverts(self._decode(got, failed, sawire.decode_advertise_reply), failed)
            self._sync_drops(secure.ADVERTISE)
            if self.abandoned:
                return []
        got, failed = self._exchange(
            secure.SHARE,
            {
                u: sawire.share_request(r).config_records[sawire.RECORD]
                for u, r in srv.share_requests().items()
            },
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
            self.assignment[nid] = str(msg.content.config_records[wire.CFG][wire.ASSIGNMENT])

    def accept(self, nid: int, reply: Message) -> None:
        """Check a secure update reply; keep its masked vector (nothing is decoded yet)."""
        assert self.srv is not None
        cfg, state = self.rt.cfg, self.state
        content = reply.content
        wire.check_records(
            content,
            {
                wire.REPLY: ConfigRecord,
                secure.SECAGG_REC: ConfigRecord,
                secure.MASKED_REC: ArrayRecord,
            },
        )
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
            srv.receive_masked({n: r for n, r in self.masked.items() if n not in failed}, failed)
            self._sync_drops(wire.UPDATE)
            if self.abandoned:
                return
            advertise_next = state.round < rt.cfg.num_rounds
            got, failed = self._exchange(
                secure.UNMASK,
                {
                    u: sawire.unmask_request(r).config_records[sawire.RECORD]
                    for u, r in srv.unmask_requests(advertise_next).items()
                },
            )
            replies = self._decode(got, failed, sawire.decode_unmask_reply)
            for nid in failed:  # its masked input is in the sum: it stays a participant
                if nid in state.dropped and nid in srv.survivors:
                    state.dropped.pop(nid)
                    state.active.add(nid)
            outcome = srv.receive_unmask(replies, failed)
            self.record["faulty"] = {str(n): why for n, why in sorted(outcome.faulty.items())}
            if outcome.total is None:
                self._abandon(outcome.abandoned or "unmask failed")
                return
            rt.secagg_keys = (state.round + 1, dict(outcome.next_keys))
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
