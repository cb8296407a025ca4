"""The server's SecAgg+ round driver: the one sequence of stages every host runs.

:class:`SecAggDriver` runs one round of :class:`~.server.SecAggServer` over a :class:`Channel`,
the host's transport: the standalone strategy's channel is Flower's ``grid.send_and_receive``
(:class:`~.strategy.SecAggRound`), CorBin-FL's is its own stage exchange with replay and
misdirection checks (``server/secure_round.py``). The driver speaks the records of :mod:`.wire`
only; a channel may carry them under names of its own.

One round:

1. :meth:`SecAggDriver.begin`: ``advertise`` (nodes without keys) and ``share``, unless the
   previous round's ``unmask`` already did them; then each sampled node's ``mask`` request;
2. the host sends the ``mask`` requests with the app's records (the app trains there) and
   hands each reply to :meth:`SecAggDriver.take_masked`;
3. :meth:`SecAggDriver.finish`: ``unmask`` over the survivors; the exact sum of their inputs,
   or the reason the round was abandoned (:class:`~.messages.RoundOutcome`).

Pipelined one round ahead (``pipeline``; round trips per round: ``mask`` -> ``unmask`` (2) in
the steady state):

- the ``mask`` instruction of round ``t`` also carries round ``t+1``'s advertise request
  (:data:`.wire.NEXT_RECORD`); the mask reply carries the node's keys for ``t+1`` (the client
  role keeps them beside round ``t``'s held shares, :meth:`~.client.SecAggClient.advertise`);
- the ``unmask`` instruction of round ``t`` carries round ``t+1``'s share request, built by a
  round-``t+1`` :class:`~.server.SecAggServer` over round ``t``'s survivors that sent keys (its
  neighbour graph drawn then); each unmask reply carries round ``t``'s unmask shares and round
  ``t+1``'s share reply, or the node refuses both (its state unchanged). A node whose share
  part is missing or bad stays in round ``t``'s sum and is dropped from round ``t+1`` only;
- round ``t+1`` reuses that server when its sample is a subset of the nodes it was drawn over
  and every secret its unmask would need keeps ``t`` sampled holders (else the round would be
  abandoned even if every node answered). A pipelined node not sampled is dropped before masking
  ("not sampled in this round": its mask key is recovered, it masked nothing); a sampled node
  whose pipelined share failed is dropped at ``share``. Otherwise (the host samples
  another set: a new node, a node back after a dropout) the round re-keys every node:
  ``advertise`` -> ``share`` -> ``mask`` -> ``unmask`` (4), as round 1 does; a node re-keys a
  round it shared but did not mask. A round whose pipelined share was not sent (round ``t``
  abandoned before its unmask; fewer than 2 of its survivors with keys, or ``k``/``t``
  impossible for them) uses the keys of the mask replies and adds the ``share`` trip (3), plus
  ``advertise`` for nodes without keys; one whose pipelined share was sent but lost too many
  nodes re-keys (4).

``mask`` and ``unmask`` cannot merge (unmasking needs the set of masked inputs received), nor
``share`` and ``mask`` of one round (a client must know which neighbours' shares arrived before
it masks), nor ``advertise`` and ``share`` of one round (shares are encrypted to neighbours'
keys): each round's stages ride the previous round's instead.

Every security check is the server role's (:mod:`.server`) and the client role's
(:mod:`.client`); the driver only moves their messages.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol, TypeVar

from flwr.app import RecordDict

from . import wire
from .messages import (
    ADVERTISE,
    MASK,
    SHARE,
    UNMASK,
    KeyAdvert,
    MalformedMessageError,
    MaskReply,
    RoundOutcome,
    SecAggError,
)
from .server import SecAggServer

logger = logging.getLogger(__name__)

T = TypeVar("T")

DECODE_ERRORS: tuple[type[Exception], ...] = (SecAggError, KeyError, TypeError, ValueError)
"""What a decoder raises for a reply it cannot read (the node then counts as failed)."""


class Channel(Protocol):
    """How a round driver reaches the nodes (the host's transport)."""

    def exchange(
        self, stage: str, contents: Mapping[int, RecordDict]
    ) -> tuple[dict[int, RecordDict], dict[int, str]]:
        """Send each node its instruction of ``stage`` (:mod:`.wire` records) and return the
        replies, by node, whose ``secagg`` record names this stage and round (as :mod:`.wire`
        records), and the nodes that failed, with why."""
        ...

    def settled(self, stage: str, server: SecAggServer) -> None:
        """Called once ``server`` has taken the replies of ``stage`` (``advertise``, ``share``,
        ``mask``): its drops of that stage are final."""
        ...


def decode_all(
    replies: Mapping[int, RecordDict],
    failed: dict[int, str],
    decoder: Callable[[RecordDict], T],
) -> dict[int, T]:
    """``decoder`` of each reply; one that does not decode goes to ``failed``."""
    out: dict[int, T] = {}
    for node, content in replies.items():
        try:
            out[node] = decoder(content)
        except DECODE_ERRORS as exc:
            failed[node] = f"malformed reply: {exc}"
    return out


class SecAggDriver:
    """One SecAgg+ round over a :class:`Channel` (module docstring).

    Parameters
    ----------
    channel
        The host's transport.
    run_id, server_round
        Bound into every key and AD; the round number.
    sampled
        This round's sample (the nodes that may mask).
    levels, num_neighbours, threshold, min_survivors
        As in :class:`~.server.SecAggServer`.
    prekeys
        Keys the nodes sent for this round with the previous round's mask replies; used only
        when no ``pipelined`` server is given.
    pipelined
        This round's server whose share stage rode the previous round's unmask: used when it
        serves this round's sample; otherwise every sampled node re-keys.
    pipeline
        Pipeline the next round: ask for its keys with the mask request and run its share stage
        with this round's unmask (:attr:`next_keys`, :attr:`next_server`).
    layout
        The layout every mask reply must have; None: the majority's (the others fail).
    """

    def __init__(
        self,
        channel: Channel,
        *,
        run_id: int,
        server_round: int,
        sampled: Iterable[int],
        levels: int,
        num_neighbours: int | None = None,
        threshold: int | None = None,
        min_survivors: int = 2,
        prekeys: Mapping[int, KeyAdvert] | None = None,
        pipelined: SecAggServer | None = None,
        pipeline: bool = False,
        layout: wire.Layout | None = None,
    ) -> None:
        self.channel = channel
        self.run_id, self.server_round = run_id, server_round
        self.sampled = tuple(sorted(sampled))
        self.levels, self.num_neighbours, self.threshold = levels, num_neighbours, threshold
        self.min_survivors = min_survivors
        self.pipeline = pipeline
        self.layout = layout
        self.pipelined = False
        """Whether this round's share stage rode the previous round's unmask."""
        self.not_sampled: set[int] = set()
        self.setup_failed: str | None = None
        """Why no server could be set up for this round (too few nodes for any ``k``, ``t``)."""
        self.next_keys: dict[int, KeyAdvert] = {}
        """Keys for the next round that came with the mask replies (``pipeline``)."""
        self.shared_ahead: SecAggServer | None = None
        """The next round's server whose share stage rode this round's unmask (even if it lost
        too many nodes there)."""
        self.next_server: SecAggServer | None = None
        """:attr:`shared_ahead` when it is still usable (not abandoned)."""
        self._taken: dict[int, tuple[MaskReply, wire.Layout, KeyAdvert | None]] = {}
        self.unmasked = False
        """Whether the ``unmask`` stage ran (the round was not abandoned before it)."""
        self.server: SecAggServer | None = None
        if pipelined is not None and self._fits(pipelined):
            self.server, self.pipelined = pipelined, True
            self.not_sampled = set(pipelined.sampled) - set(self.sampled)
            return
        if pipelined is not None:  # its nodes shared with the keys of its graph: re-key them all
            logger.info("secagg round %d: pipelined shares unused, re-keying", server_round)
            prekeys = None
        try:
            self.server = self._new_server(server_round, self.sampled, prekeys)
        except ValueError as exc:  # too few nodes for any k, t
            self.setup_failed = f"setup: {exc}"
            logger.warning("secagg round %d abandoned: setup: %s", server_round, exc)

    def _new_server(
        self, rnd: int, nodes: Iterable[int], prekeys: Mapping[int, KeyAdvert] | None
    ) -> SecAggServer:
        return SecAggServer(
            run_id=self.run_id,
            server_round=rnd,
            node_ids=list(nodes),
            levels=self.levels,
            num_neighbours=self.num_neighbours,
            threshold=self.threshold,
            prekeys=prekeys,
            min_survivors=self.min_survivors,
        )

    def _fits(self, srv: SecAggServer) -> bool:
        """``srv`` (shared ahead) serves this round (:meth:`~.server.SecAggServer.serves`)."""
        return srv.config.server_round == self.server_round and srv.serves(self.sampled)

    @property
    def abandoned(self) -> str | None:
        """Why the round was abandoned so far (None while it runs)."""
        if self.server is None:
            return self.setup_failed
        return self.server.abandoned

    # ------------------------------------------------------------------ 1. before the mask
    def begin(self, app: Mapping[int, RecordDict] | None = None) -> dict[int, RecordDict]:
        """``advertise`` (for nodes without keys) and ``share``, unless the previous round's
        unmask did them; each sampled node's ``mask`` request, its ``app`` records beside it
        (with the next round's advertise request when pipelining). Empty once abandoned."""
        srv = self.server
        if srv is None or srv.abandoned:
            return {}
        if self.pipelined:  # its share stage's drops are this round's
            self.channel.settled(SHARE, srv)
        else:
            if srv.stage == ADVERTISE:
                targets = srv.advertise_targets()
                good, bad = self.channel.exchange(
                    ADVERTISE, {u: wire.advertise_request(self.server_round) for u in targets}
                )
                srv.receive_adverts(decode_all(good, bad, wire.decode_advertise_reply), bad)
                self.channel.settled(ADVERTISE, srv)
                if srv.abandoned:
                    return {}
            requests = {u: wire.share_request(r) for u, r in srv.share_requests().items()}
            good, bad = self.channel.exchange(SHARE, requests)
            srv.receive_shares(decode_all(good, bad, wire.decode_share_reply), bad)
            self.channel.settled(SHARE, srv)
        if srv.abandoned:
            return {}
        sample, out = set(self.sampled), {}
        for u, r in srv.mask_requests().items():
            if u not in sample:  # pipelined, not sampled: dropped in finish
                continue
            content = wire.mask_request(r, (app or {}).get(u, RecordDict()))
            if self.pipeline:  # one record per node: nothing is shared between messages
                content = wire.with_next(content, wire.advertise_request(self.server_round + 1))
            out[u] = content
        return out

    # ------------------------------------------------------------------ 2. the mask replies
    def take_masked(self, node: int, content: RecordDict) -> None:
        """Read one node's mask reply (:mod:`.wire` records: ``secagg``, ``secagg-masked`` and,
        pipelined, ``secagg-next`` with its keys of the next round); kept until :meth:`finish`.

        Raises :class:`~.messages.MalformedMessageError` for a reply that does not decode, names
        another stage or round, has another layout than ``layout`` or carries keys ahead that
        were not asked for (nothing is kept then).
        """
        if self.server is None:
            raise SecAggError(f"round {self.server_round} has no server")
        main, nxt = wire.split_next(content)
        if wire.stage_of(main) != (MASK, self.server_round):
            raise MalformedMessageError("reply names another stage or round")
        rep, layout = wire.decode_mask_reply(main, self.server.config.bits)
        if self.layout is not None and layout != self.layout:
            raise MalformedMessageError(
                f"masked update layout {layout!r:.80}, expected {self.layout!r:.80}"
            )
        keys = None
        if nxt is not None:  # no keys ahead (a mod that does not pipeline): re-keyed if sampled
            if not self.pipeline:
                raise MalformedMessageError("keys for the next round that were not asked for")
            keys = wire.decode_next_keys(nxt, self.server_round + 1)
        self._taken[node] = (rep, layout, keys)

    def taken(self, node: int) -> bool:
        """Whether :meth:`take_masked` kept a mask reply of ``node``."""
        return node in self._taken

    def _masked(self, failed: dict[int, str]) -> dict[int, MaskReply]:
        """The mask replies taken, of the agreed layout (the others go to ``failed``)."""
        taken = {n: t for n, t in self._taken.items() if n not in failed}
        if self.layout is None:
            layouts = Counter(layout for _, layout, _ in taken.values())
            if layouts:
                self.layout = max(layouts, key=lambda lay: (layouts[lay], -len(lay)))
        masked = {}
        for node, (rep, layout, keys) in taken.items():
            if layout != self.layout:
                failed[node] = "masked update with another layout than the majority's"
                continue
            masked[node] = rep
            if keys is not None:
                self.next_keys[node] = keys
        return masked

    # ------------------------------------------------------------------ 3. unmask
    def _outcome(self) -> RoundOutcome:
        """The outcome of a round abandoned before its unmask."""
        srv = self.server
        if srv is None:
            return RoundOutcome(self.server_round, self.sampled, abandoned=self.setup_failed)
        return RoundOutcome(
            self.server_round,
            srv.sampled,
            dropped=dict(srv.dropped),
            abandoned=srv.abandoned,
            next_keys=dict(self.next_keys),
        )

    def finish(self, failed: Mapping[int, str] | None = None) -> RoundOutcome:
        """Take the mask replies (``failed``: nodes whose mask reply the host refused, with why),
        run ``unmask`` (with the next round's ``share`` when pipelining): the exact sum or the
        abandon reason."""
        srv = self.server
        if srv is None or srv.abandoned:
            return self._outcome()
        bad = dict(failed or {})
        masked = self._masked(bad)
        bad.update(dict.fromkeys(self.not_sampled, "not sampled in this round"))
        srv.receive_masked(masked, bad)
        self.channel.settled(MASK, srv)
        if srv.abandoned:
            return self._outcome()
        nxt = self._next_server() if self.pipeline else None
        shares = nxt.share_requests() if nxt is not None else {}
        contents = {}
        for u, r in srv.unmask_requests().items():
            contents[u] = wire.unmask_request(r)
            if u in shares:
                contents[u] = wire.with_next(contents[u], wire.share_request(shares[u]))
        self.unmasked = True
        good, bad = self.channel.exchange(UNMASK, contents)
        unmasked = decode_all(good, bad, lambda c: wire.decode_unmask_reply(wire.split_next(c)[0]))
        if nxt is not None:  # a bad share drops its sender from the next round only
            self._take_next_shares(nxt, good, bad)
        outcome = srv.receive_unmask(unmasked, bad)
        # keys ahead serve the next round's share stage only if none rode this unmask: a node
        # that answered it shared with them (its next round re-keys unless the shares are used)
        outcome.next_keys = dict(self.next_keys) if not shares else {}
        return outcome

    def _next_server(self) -> SecAggServer | None:
        """The next round's server over this round's survivors that sent keys for it (its
        graph drawn now), or None when it cannot run."""
        assert self.server is not None
        nodes = [u for u in self.server.survivors if u in self.next_keys]
        try:
            nxt = self._new_server(self.server_round + 1, nodes, self.next_keys)
        except ValueError as exc:
            logger.info("secagg round %d: no pipelined share: %s", self.server_round + 1, exc)
            return None
        return nxt if nxt.abandoned is None else None

    def _take_next_shares(
        self, nxt: SecAggServer, good: Mapping[int, RecordDict], bad: Mapping[int, str]
    ) -> None:
        """Round ``t+1``'s share replies that rode the unmask replies."""
        bad_next, got = dict(bad), {}
        for node, content in good.items():
            if node in bad_next:
                continue
            try:
                share = wire.split_next(content)[1]
                if share is not None and wire.stage_of(share) != (SHARE, self.server_round + 1):
                    raise MalformedMessageError(
                        f"'{wire.NEXT_RECORD}' does not answer the next {SHARE}"
                    )
            except DECODE_ERRORS as exc:
                bad_next[node] = f"malformed reply: {exc}"
                continue
            if share is not None:
                got[node] = share
        nxt.receive_shares(decode_all(got, bad_next, wire.decode_share_reply), bad_next)
        self.shared_ahead = nxt
        self.next_server = nxt if nxt.abandoned is None else None


__all__ = ["Channel", "SecAggDriver", "decode_all"]
