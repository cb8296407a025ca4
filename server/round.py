"""One CorBin-FL round (paper Alg. 3) on Flower's Message API.

:func:`run_round` is one round, top to bottom::

    [AugCorBin split] -> pipelined pairs of the last round -> keygen (nodes without a fresh
    key) -> pairing of the others (Alg. 3 line 2) -> pair stage (relay: only fresh pairs; exact:
    every round; encrypted Y || seed blobs, lines 6-8) -> update stage (the app's records,
    center/radius, partner blob or key, next round's pairing; lines 3-4, 9-21) -> aggregate
    (line 23) -> global learning rate (paper eq. 6)

A steady relay round is the update stage alone (one round trip): its instruction carries the
blobs of the pair fixed in the last round, and its reply the blob for the next round.

The nodes are the wrapped strategy's sample (:class:`server.strategy.CorBin`). Every stage is
:func:`server.stages.exchange` over one :class:`server.stages.RoundState`: a node that does not
answer in time, answers with an error, or answers badly is dropped from every later stage of the
round; the round goes on with the rest. A paired node whose partner vanished before its blob was
relayed is told ``partner-gone`` and quantizes independently (``ldpq``); an update whose partner
vanished later still counts (each role's marginal is LDPQ's, Theorem 1).

The run's records (``metrics.jsonl`` rows, ``summary.json``) are :mod:`corbin_fl.server.records`.
The update radius ``R`` comes from
:class:`server.strategy.CorBin` (a number, or the app's rule: this project's is
:func:`server.app.update_radius`); a round never needs the app's data.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid

from corbin_fl import registry, wire
from corbin_fl.arrays import unflatten_arrays
from corbin_fl.config import RunConfig
from corbin_fl.layout import layer_center_radius
from corbin_fl.mechanisms.pairing import independent_split, random_pairing
from corbin_fl.secagg.messages import KeyAdvert
from corbin_fl.secagg.server import SecAggServer
from corbin_fl.server.aggregation import Aggregator, apply_global_lr, make_aggregator
from corbin_fl.server.metrics import RunFiles
from corbin_fl.server.secure_round import SecureRound
from corbin_fl.server.stages import LinkClock, RoundState, active_of, exchange, instruction

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Pipeline:
    """Pipelined relay: what round ``round`` inherits from the previous round's update stage.

    Attributes
    ----------
    round : int
        The round the pairing and blobs are for.
    partner : dict[int, int]
        Node -> partner (both directions), fixed when the previous round's update stage began.
    blobs : dict[int, bytes]
        Node -> the blob it sealed for its partner (only nodes whose update reply was accepted).
    """

    round: int
    partner: dict[int, int]
    blobs: dict[int, bytes]


@dataclass
class ServerRuntime:
    """What the server keeps across rounds.

    Attributes
    ----------
    grid : Grid
        Flower grid.
    cfg : RunConfig
        Run configuration.
    run_id : int
        Flower run id (bound into every pair key by the clients).
    weights : torch.Tensor
        Current global model, float32 ``[m]``.
    layout : Any
        ``corbin_fl.layout.ParamLayout`` of the model.
    device : torch.device
        Where the server aggregates and evaluates.
    files : RunFiles
        Output files.
    pubkeys : dict[int, tuple[int, bytes]]
        Node -> (round the key is for, X25519 public key).
    seen_message_ids : set[str]
        Every reply message id of the run (replay check).
    stages_seen : set[str]
        Stages that have run once (the first run of a stage gets ``first-stage-timeout``).
    on_release : Callable[[int, int, dict[str, float]], None] or None
        Called as ``on_release(round, node, metrics)`` right after an update is accepted (and
        aggregated): the run journals the release for the privacy ledger before the round ends.
    update_radius : float
        ``R`` of ``range-mode = "update"`` for every round of the run (:func:`update_radius`).
    pipeline : Pipeline or None
        Pipelined relay: the pairing and blobs the last update stage fixed for the next round.
        Never checkpointed: a resumed run (a new Flower run id, which every blob's AAD binds)
        starts with a fresh bootstrap.
    secagg_keys : tuple[int, dict[int, KeyAdvert]] or None
        Secure aggregation: the round and the SecAgg+ keys the nodes sent with the last update
        reply, while no share stage has used them (server/secure_round.py).
    secagg_next : SecAggServer or None
        Secure aggregation: the next round's SecAgg+ server, its share stage done with the last
        unmask (pipelined). Never checkpointed, as ``pipeline``.
    link : LinkClock
        The bound on a stage after a SuperLink outage (``server/stages.py``): each stage's
        reply time in this run, the outages seen.
    """

    grid: Grid
    cfg: RunConfig
    run_id: int
    weights: torch.Tensor
    layout: Any
    device: torch.device
    files: RunFiles
    pubkeys: dict[int, tuple[int, bytes]] = field(default_factory=dict)
    seen_message_ids: set[str] = field(default_factory=set)
    stages_seen: set[str] = field(default_factory=set)
    on_release: Callable[[int, int, dict[str, float]], None] | None = None
    update_radius: float = 0.0
    pipeline: Pipeline | None = None
    secagg_keys: tuple[int, dict[int, KeyAdvert]] | None = None
    secagg_next: SecAggServer | None = None
    link: LinkClock = field(default_factory=LinkClock)

    def rng(self, rnd: int, purpose: int) -> np.random.Generator:
        """Public, reproducible generator for (run seed, round, purpose)."""
        return np.random.default_rng([self.cfg.seed, rnd, purpose])

    def timeout(self, stage: str) -> float:
        """``first-stage-timeout`` the first time a stage runs (process start-up, imports, data
        loading, Ray start-up in simulation), ``stage-timeout`` afterwards."""
        if stage in self.stages_seen:
            return self.cfg.stage_timeout
        self.stages_seen.add(stage)
        return max(self.cfg.first_stage_timeout, self.cfg.stage_timeout)


_PURPOSE_SPLIT, _PURPOSE_PAIRING, _PURPOSE_PIPELINE = 2, 3, 4


# ============================================================================ one round
def skipped_round(rt: ServerRuntime, rnd: int, connected: int) -> RoundState:
    """The state of a round skipped because fewer than ``min-clients`` nodes are connected."""
    logger.warning(
        "round %d: %d node(s) connected, min-clients is %d; round skipped",
        rnd,
        connected,
        rt.cfg.min_clients,
    )
    return RoundState(round=rnd, run_id=rt.run_id, sampled=[], seen_message_ids=rt.seen_message_ids)


def run_round(
    rt: ServerRuntime,
    rnd: int,
    sampled: list[int],
    app_records: RecordDict,
    arrays_key: str,
    node_records: Mapping[int, RecordDict] | None = None,
) -> RoundState:
    """Run round ``rnd`` of Alg. 3 and update ``rt.weights`` (paper eq. 6).

    Parameters
    ----------
    rt : ServerRuntime
        Server state; ``rt.weights`` is replaced by the round's aggregate.
    rnd : int
        Round number, ``>= 1``.
    sampled : list[int]
        The nodes of the round (the wrapped strategy's sample).
    app_records : RecordDict
        The wrapped strategy's train records (the global model under ``arrays_key``, the train
        config): the app's part of every update instruction.
    arrays_key : str
        Name of the global model's ArrayRecord in ``app_records``.
    node_records : Mapping[int, RecordDict], optional
        A node's own train records where the wrapped strategy configured nodes differently
        (each with the same global model: :func:`server.strategy.node_train_records`); the
        others get ``app_records``.

    Returns
    -------
    RoundState
        The round's bookkeeping (participants, drops, pairs, bytes, stage times) and, in
        ``aggregate``, the new global model as an ArrayRecord (None if no update was valid).
    """
    cfg = rt.cfg
    state = RoundState(
        round=rnd,
        run_id=rt.run_id,
        sampled=list(sampled),
        seen_message_ids=rt.seen_message_ids,
    )
    if len(state.sampled) < cfg.min_clients:
        logger.warning(
            "round %d: %d node(s) sampled, min-clients is %d; round skipped",
            rnd,
            len(state.sampled),
            cfg.min_clients,
        )
        return state

    # 1. Roles the server may know: AugCorBin's gamma-fraction quantizes independently.
    to_pair = split_roles(rt, state) if cfg.paired else []
    # 2. Pipelined relay: the pairs fixed last round whose two blobs came with its update replies.
    pipelined = wire.pipelined(cfg.paired, cfg.cr_mode)
    if pipelined:
        carry_pipeline(rt, state, to_pair)
    leftover = [nid for nid in to_pair if nid not in state.partner]
    fresh: list[tuple[int, int]] = []
    if cfg.paired:
        # 3. Keys (Alg. 3 line 1): fresh per round; nodes without one answer a keygen stage.
        keygen_stage(rt, state, to_pair, leftover)
        # 4. Pairing (Alg. 3 line 2): uniform over pairings of the other nodes with a key.
        fresh = pair_leftover(rt, state, leftover)
    # 5. Pair stage (relay / exact; Alg. 3 lines 6-8, 14-17): both partners of each fresh pair
    #    send one AEAD blob (pipelined pairs sent theirs with the last update reply).
    if cfg.paired and cfg.cr_mode != "derived" and fresh:
        pair_stage(rt, state, fresh)
    # 6. Update stage (Alg. 3 lines 3-4, 9-21): model, center/radius, partner blob or key, and
    #    (pipelined relay) the pairing of round t+1, fixed now over this stage's nodes.
    aggregator = update_stage(rt, state, app_records, arrays_key, node_records, pipelined)
    keep_keys(rt, state, pipelined)
    # 7. Aggregate (Alg. 3 line 23) and apply the global learning rate (paper eq. 6).
    aggregate_round(rt, state, aggregator, app_records, arrays_key)
    return state


# ============================================================================ the steps of a round
def split_roles(rt: ServerRuntime, state: RoundState) -> list[int]:
    """Step 1 of a pairing mechanism's round: the sampled nodes to pair.

    All of them, except (AugCorBin-FL) the gamma-fraction that quantizes independently, which
    goes to ``state.independent`` (drawn from the public generator of the round)."""
    independent: list[int] = []
    to_pair = list(state.sampled)
    if registry.get(rt.cfg.mechanism).independent_share:
        independent, to_pair = independent_split(
            state.sampled, rt.cfg.gamma, rt.rng(state.round, _PURPOSE_SPLIT)
        )
    state.independent = set(independent)
    return to_pair


def keygen_stage(
    rt: ServerRuntime, state: RoundState, to_pair: list[int], leftover: list[int]
) -> None:
    """Step 3: the round keys (Alg. 3 line 1) of the nodes to pair.

    A key of this round already known (from the last update reply) is taken; the leftover nodes
    without one answer a keygen stage."""
    for nid in to_pair:
        key = round_key(rt, state, nid)
        if key is not None:
            state.pubkeys[nid] = key
    need = [nid for nid in leftover if nid not in state.pubkeys]
    exchange(
        rt.grid,
        state,
        {nid: instruction(rt, wire.KEYGEN, nid, state.round, {}) for nid in need},
        lambda nid, reply: accept_pubkey(state, nid, reply),
        timeout=rt.timeout("keygen") if need else 0.0,
        poll_interval=rt.cfg.poll_interval,
        max_inflight=rt.cfg.max_inflight,
        files=rt.files,
        link=rt.link,
    )


def pair_leftover(
    rt: ServerRuntime, state: RoundState, leftover: list[int]
) -> list[tuple[int, int]]:
    """Step 4 (Alg. 3 line 2): pair the leftover nodes that are still active, uniformly from the
    public generator; returns the fresh pairs (an odd node goes to ``state.unpaired``)."""
    pairs, odd = random_pairing(active_of(state, leftover), rt.rng(state.round, _PURPOSE_PAIRING))
    fresh = [(int(a), int(b)) for a, b in pairs]
    state.pairs += fresh
    state.unpaired = [int(n) for n in odd]
    for a, b in fresh:
        state.partner[a], state.partner[b] = b, a
        state.lost_partner.pop(a, None)
        state.lost_partner.pop(b, None)
    return fresh


def pair_stage(rt: ServerRuntime, state: RoundState, fresh: list[tuple[int, int]]) -> None:
    """Step 5 (relay / exact; Alg. 3 lines 6-8, 14-17): both partners of each fresh pair send
    one AEAD blob (a seed, or in exact mode the packed z), checked for its length."""
    cfg = rt.cfg
    secret_len = wire.packed_len(cfg.d * rt.layout.m) if cfg.cr_mode == "exact" else wire.SEED_BYTES
    exchange(
        rt.grid,
        state,
        {nid: pair_instruction(state, nid, rt) for pair in fresh for nid in pair},
        lambda nid, reply: accept_blob(state, nid, reply, wire.blob_len(secret_len)),
        timeout=rt.timeout("pair"),
        poll_interval=cfg.poll_interval,
        max_inflight=cfg.max_inflight,
        files=rt.files,
        link=rt.link,
    )


def update_range(rt: ServerRuntime) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-layer center and radius of the round's update stage.

    ``range-mode = "update"``: clients encode ``w_i - w_g`` in ``[-R, R]`` (center 0, radius
    ``rt.update_radius``); otherwise the global model's layer-wise range
    (:func:`corbin_fl.layout.layer_center_radius`)."""
    cfg = rt.cfg
    if cfg.quantizes_update:  # clients encode w_i - w_g in [-R, R]
        shape, dev = (rt.layout.num_layers,), rt.weights.device  # as layer_center_radius
        c_layer = torch.zeros(shape, dtype=torch.float32, device=dev)
        if not rt.update_radius > 0:  # CorBin.start resolves it before round 1
            raise ValueError("range-mode 'update' needs ServerRuntime.update_radius R > 0")
        r_layer = torch.full(shape, rt.update_radius, dtype=torch.float32, device=dev)
        return c_layer, r_layer
    return layer_center_radius(
        rt.weights, rt.layout, cfg.radius_margin, cfg.min_radius, cfg.range_quantile
    )


def begin_secure(
    rt: ServerRuntime, state: RoundState, participants: list[int]
) -> tuple[SecureRound, list[int]]:
    """The secure-aggregation hook before the update stage: SecAgg+ advertise/share
    (``server/secure_round.py``); returns the round's :class:`SecureRound` and the nodes left."""
    secure = SecureRound(rt, state, participants)
    return secure, secure.begin()


def update_stage(
    rt: ServerRuntime,
    state: RoundState,
    app_records: RecordDict,
    arrays_key: str,
    node_records: Mapping[int, RecordDict] | None,
    pipelined: bool,
) -> Aggregator:
    """Step 6 (Alg. 3 lines 3-4, 9-21): send every active node its update instruction, fold each
    accepted update into the round's aggregator (through SecAgg+ with secure aggregation) and
    return the aggregator.

    The instruction carries the app's records, the per-layer range, the partner's blob or key and
    (pipelined relay) the pairing of round t+1, fixed now over this stage's nodes."""
    cfg, rnd = rt.cfg, state.round
    c_layer, r_layer = update_range(rt)
    state.max_radius = float(r_layer.max())
    range_rec = ArrayRecord(
        {
            wire.CENTER: wire.to_array(c_layer.cpu().numpy()),
            wire.RADIUS: wire.to_array(r_layer.cpu().numpy()),
        }
    )
    participants = active_of(state, state.sampled)
    secure = None
    if cfg.secure_aggregation:  # SecAgg+ advertise/share before the update (secure_round.py)
        secure, participants = begin_secure(rt, state, participants)
    aggregator = make_aggregator(
        cfg, rt.weights, c_layer, r_layer, rt.layout, cohort=len(participants)
    )
    if pipelined and rnd < cfg.num_rounds:  # no blob for a round that will not run
        pair_next_round(rt, state, participants)
    shared_seed = secrets.token_bytes(wire.SHARED_SEED_BYTES)

    def on_update(nid: int, reply: Message) -> None:
        if secure is not None:
            accept_masked(state, nid, reply, secure, cfg)
            return
        accept_update(state, nid, reply, aggregator, cfg)
        if rt.on_release is not None:
            rt.on_release(rnd, nid, state.client_metrics[nid])

    updates = {
        nid: update_instruction(
            state,
            nid,
            rt,
            range_rec,
            (node_records or {}).get(nid, app_records),
            arrays_key,
            participants,
            shared_seed,
        )
        for nid in participants
    }
    if secure is not None:
        secure.attach(updates)
    exchange(
        rt.grid,
        state,
        updates,
        on_update,
        timeout=rt.timeout("update") if participants else 0.0,
        poll_interval=cfg.poll_interval,
        max_inflight=cfg.max_inflight,
        files=rt.files,
        link=rt.link,
    )
    del range_rec
    if secure is not None:  # unmask; the exact symbol sum goes to the aggregator
        secure.finish(aggregator)
    return aggregator


def keep_keys(rt: ServerRuntime, state: RoundState, pipelined: bool) -> None:
    """After the update stage: forget the keys of dropped nodes (their key state is unknown, so
    they answer a keygen next time), keep the next round's keys and (pipelined relay) the pairs
    and blobs fixed for round t+1."""
    for nid in state.dropped:
        rt.pubkeys.pop(nid, None)  # its key state is unknown now: keygen next time
    for nid, pk in state.next_pubkeys.items():
        rt.pubkeys[nid] = (state.round + 1, pk)
    if pipelined:
        rt.pipeline = Pipeline(state.round + 1, dict(state.next_partner), dict(state.next_blobs))


def aggregate_round(
    rt: ServerRuntime,
    state: RoundState,
    aggregator: Aggregator,
    app_records: RecordDict,
    arrays_key: str,
) -> None:
    """Step 7 (Alg. 3 line 23, paper eq. 6): the aggregator's estimate, with the global learning
    rate, becomes ``rt.weights`` and ``state.aggregate`` (an ArrayRecord shaped as the global
    model under ``arrays_key`` in ``app_records``); with no valid update the model is kept."""
    estimate = aggregator.estimate()
    if estimate is None:
        logger.warning("round %d: no valid update; the global model is kept", state.round)
        return
    if rt.cfg.quantizes_update:  # the decoded mean update, back on the global model
        estimate = estimate.to(rt.weights.device, torch.float32).add_(rt.weights)
    rt.weights = apply_global_lr(rt.weights, estimate, rt.cfg.global_lr, inplace=True)
    state.aggregate = unflatten_arrays(
        rt.weights.detach().cpu().numpy(), rt.layout, app_records.array_records[arrays_key]
    )


# ============================================================================ pipelined relay
def carry_pipeline(rt: ServerRuntime, state: RoundState, to_pair: list[int]) -> None:
    """Take over the pairs :attr:`ServerRuntime.pipeline` fixed for this round.

    A pair is kept when both nodes are to pair this round (sampled, not AugCorBin's independent
    share) and both blobs came with accepted update replies; its blobs become this round's
    ``state.blobs``. Every other node of the pipelined pairing pairs afresh with this round's
    leftovers (or falls back to ``ldpq``); ``state.pipeline_broken`` counts why. A pipeline of
    another round (a skipped round in between) is dropped whole.
    """
    pipe, rt.pipeline = rt.pipeline, None
    if pipe is None:
        return
    if pipe.round != state.round:
        logger.info("round %d: pipelined pairing of round %d dropped", state.round, pipe.round)
        return
    members = set(to_pair)
    for a in sorted(members & set(pipe.partner)):
        b = pipe.partner[a]
        if b not in members:
            reason = "independent" if b in state.independent else "partner-not-sampled"
        elif a not in pipe.blobs:
            reason = "no-blob"
        elif b not in pipe.blobs:
            reason = "partner-no-blob"
        else:
            if a < b:
                state.pairs.append((a, b))
                state.carried_pairs += 1
            state.partner[a] = b
            state.blobs[a] = pipe.blobs[a]
            continue
        state.pipeline_broken[reason] = state.pipeline_broken.get(reason, 0) + 1
        state.lost_partner[a] = b


def pair_next_round(rt: ServerRuntime, state: RoundState, participants: list[int]) -> None:
    """Fix round ``t+1``'s pairing (Alg. 3 line 2, one round early) over this round's update
    stage nodes that hold a key of round ``t`` (uniform, from the public generator)."""
    keyed = [nid for nid in participants if round_key(rt, state, nid) is not None]
    pairs, _ = random_pairing(keyed, rt.rng(state.round + 1, _PURPOSE_PIPELINE))
    for a, b in pairs:
        state.next_partner[int(a)], state.next_partner[int(b)] = int(b), int(a)


def round_key(rt: ServerRuntime, state: RoundState, nid: int) -> bytes | None:
    """Node ``nid``'s public key of this round (from keygen or the last update reply)."""
    if nid in state.pubkeys:
        return state.pubkeys[nid]
    known = rt.pubkeys.get(nid)
    return known[1] if known is not None and known[0] == state.round else None


# ============================================================================ messages
def pair_instruction(state: RoundState, nid: int, rt: ServerRuntime) -> Message:
    """Pair stage: partner id and partner public key (relay/exact)."""
    partner = state.partner[nid]
    body: dict[str, Any] = {
        wire.PARTNER: partner,
        wire.PARTNER_PUBKEY: state.pubkeys[partner],
    }
    if rt.cfg.cr_mode == "exact":
        body[wire.NUM_PARAMS] = rt.layout.m
    return instruction(rt, wire.PAIR, nid, state.round, body)


def update_instruction(
    state: RoundState,
    nid: int,
    rt: ServerRuntime,
    range_rec: ArrayRecord,
    app_records: RecordDict,
    arrays_key: str,
    participants: list[int],
    shared_seed: bytes,
) -> Message:
    """Update stage: assignment and what the pair needs, the per-layer range, and the app's
    records (the global model under ``arrays_key`` and the train config)."""
    cfg = rt.cfg
    body: dict[str, Any] = {
        wire.ASSIGNMENT: assignment_of(state, nid, cfg),
        wire.ARRAYS_KEY: arrays_key,
    }
    if body[wire.ASSIGNMENT] == wire.PAIRED:
        partner = state.partner[nid]
        body[wire.PARTNER] = partner
        if cfg.cr_mode == "derived":
            body[wire.PARTNER_PUBKEY] = state.pubkeys[partner]
        else:
            body[wire.PARTNER_BLOB] = state.blobs[partner]
    elif body[wire.ASSIGNMENT] == wire.PARTNER_GONE:
        body[wire.PARTNER] = state.partner.get(nid, state.lost_partner.get(nid))
    if nid in state.next_partner:
        nxt = state.next_partner[nid]
        body[wire.NEXT_PARTNER] = nxt
        body[wire.NEXT_PARTNER_PUBKEY] = round_key(rt, state, nxt)
    entry = registry.get(cfg.mechanism)
    if entry.shared_seed:  # the seed, this node's rank, the participants
        seed_key, rank_key, clients_key = entry.shared_seed
        ranks = entry.hook("shared_ranks")
        assert ranks is not None  # the entry's own check
        body[seed_key] = shared_seed
        body[rank_key] = ranks(int.from_bytes(shared_seed, "big"), len(participants))[
            sorted(participants).index(nid)
        ]
        body[clients_key] = len(participants)
    records = {name: rec for name, rec in app_records.items() if not wire.is_protocol_record(name)}
    return instruction(
        rt, wire.UPDATE, nid, state.round, body, **records, **{wire.RANGE: range_rec}
    )


def assignment_of(state: RoundState, nid: int, cfg: RunConfig) -> str:
    """What node ``nid`` does in the update stage (see :data:`corbin_fl.wire.ASSIGNMENTS`)."""
    if not cfg.paired:
        return wire.SOLO
    if nid in state.independent:
        return wire.INDEPENDENT
    partner = state.partner.get(nid)
    if partner is None:
        return wire.PARTNER_GONE if nid in state.lost_partner else wire.UNPAIRED
    if partner not in state.active:
        return wire.PARTNER_GONE
    if cfg.cr_mode != "derived" and partner not in state.blobs:
        return wire.PARTNER_GONE
    return wire.PAIRED


# ============================================================================ reply checks
def accept_pubkey(state: RoundState, nid: int, reply: Message) -> None:
    """Check a ``keygen`` stage reply: ``keys{round, pubkey}`` with a valid X25519 key."""
    wire.check_records(reply.content, {wire.KEYS: ConfigRecord})
    rec = reply.content.config_records[wire.KEYS]
    wire.check_keys(rec, {wire.ROUND, wire.PUBKEY}, what="keys")
    wire.check_round(reply, rec, state.round)
    state.pubkeys[nid] = wire.check_pubkey(rec[wire.PUBKEY])


def accept_blob(state: RoundState, nid: int, reply: Message, length: int) -> None:
    """Check a ``pair`` stage reply: ``pair{round, blob}``, blob of the expected size.

    The blob is opaque to the server (AES-GCM under the pair key); it is relayed unchanged.
    """
    wire.check_records(reply.content, {wire.PAIR_REC: ConfigRecord})
    rec = reply.content.config_records[wire.PAIR_REC]
    wire.check_keys(rec, {wire.ROUND, wire.BLOB}, what="pair")
    wire.check_round(reply, rec, state.round)
    state.blobs[nid] = wire.get_bytes(rec, wire.BLOB, length)


def reply_head(
    state: RoundState, nid: int, reply: Message, cfg: RunConfig
) -> tuple[bytes | None, bytes | None, bytes | None]:
    """The checked ``corbin.reply`` of an update reply (plain or, with secure aggregation, the
    mask stage's): ``round``, and ``(next-pubkey, z-digest, next-blob)``, each None when absent
    (the public key only for a pairing mechanism, the digest only in a test-z-digest run, the
    blob only for a node given a next partner)."""
    head = reply.content.config_records[wire.REPLY]
    required = {wire.ROUND} | ({wire.NEXT_PUBKEY} if cfg.paired else set())
    optional = {wire.Z_DIGEST} if cfg.paired and cfg.test_z_digest else set()
    if nid in state.next_partner:
        optional.add(wire.NEXT_BLOB)
    wire.check_keys(head, required, optional, what="reply")
    wire.check_round(reply, head, state.round)
    next_pk = wire.check_pubkey(head[wire.NEXT_PUBKEY], "next-pubkey") if cfg.paired else None
    digest = wire.get_bytes(head, wire.Z_DIGEST, 32) if wire.Z_DIGEST in head else None
    next_blob = (
        wire.get_bytes(head, wire.NEXT_BLOB, wire.blob_len(wire.SEED_BYTES))
        if wire.NEXT_BLOB in head
        else None
    )
    return next_pk, digest, next_blob


def keep_head(
    state: RoundState, nid: int, head: tuple[bytes | None, bytes | None, bytes | None]
) -> None:
    """Keep what an accepted update reply's head carries (:func:`reply_head`)."""
    next_pk, digest, next_blob = head
    if next_pk is not None:
        state.next_pubkeys[nid] = next_pk
    if digest is not None:
        state.z_digests[nid] = digest
    if next_blob is not None:
        state.next_blobs[nid] = next_blob


def accept_masked(
    state: RoundState, nid: int, reply: Message, secure: SecureRound, cfg: RunConfig
) -> None:
    """Check a secure update reply (its records, its ``corbin.reply``) and hand its masked
    vector to secure aggregation (nothing is decoded before the unmask)."""
    secure.check_records(reply)
    head = reply_head(state, nid, reply, cfg)
    secure.accept(nid, reply)
    keep_head(state, nid, head)


def accept_update(
    state: RoundState, nid: int, reply: Message, aggregator: Any, cfg: RunConfig
) -> None:
    """Check an update reply and fold its update into ``aggregator``.

    ``corbin.reply{round[, next-pubkey][, z-digest]}``, ``corbin.update{bits|values}`` of the
    mechanism's dtype and length (finite for floats), ``corbin.metrics`` with the mechanism's keys
    and finite values, and at most :data:`corbin_fl.wire.MAX_APP_RECORDS` app records
    (MetricRecords with finite values, ConfigRecords); no other ArrayRecord.
    """
    content = reply.content
    protocol = RecordDict({k: v for k, v in content.items() if wire.is_protocol_record(k)})
    wire.check_records(
        protocol,
        {wire.REPLY: ConfigRecord, wire.UPDATE_REC: ArrayRecord, wire.METRICS: MetricRecord},
    )
    app = {k: v for k, v in content.items() if not wire.is_protocol_record(k)}
    if len(app) > wire.MAX_APP_RECORDS:
        raise wire.WireError(f"{len(app)} app records, at most {wire.MAX_APP_RECORDS}")
    app_bytes = wire.payload_bytes(RecordDict(app))
    if app_bytes > wire.MAX_APP_BYTES:
        raise wire.WireError(f"app records carry {app_bytes} bytes, at most {wire.MAX_APP_BYTES}")
    for name, rec in app.items():
        if isinstance(rec, MetricRecord):
            if len(rec) > wire.MAX_APP_METRICS:
                raise wire.WireError(f"app metrics {name!r:.64} has {len(rec)} entries")
            for key, value in rec.items():
                values = value if isinstance(value, list) else [value]
                if not values or not all(wire.finite_metric(v) for v in values):
                    raise wire.WireError(f"app metric {key!r:.64} is not a finite number")
        elif not isinstance(rec, ConfigRecord):
            raise wire.WireError(f"app record {name!r:.64} is a {type(rec).__name__}")
    head = reply_head(state, nid, reply, cfg)
    metrics = content.metric_records[wire.METRICS]
    wire.check_keys(metrics, wire.METRIC_KEYS, what="metrics")
    for key, value in metrics.items():
        if not wire.finite_metric(value):
            raise wire.WireError(f"metric {key!r} is not a finite number")
    aggregator.add(content.array_records[wire.UPDATE_REC])  # validates, then counts
    state.client_metrics[nid] = {k: float(v) for k, v in metrics.items()}  # type: ignore[arg-type]
    state.app_records[nid] = RecordDict(app)
    keep_head(state, nid, head)


# ============================================================================ nodes
def wait_for_nodes(grid: Grid, cfg: RunConfig) -> list[int]:
    """Block until ``min-clients`` nodes are connected (at most ``wait-for-nodes`` seconds)."""
    deadline = time.monotonic() + cfg.wait_for_nodes
    while True:
        nodes = sorted(int(n) for n in grid.get_node_ids())
        if len(nodes) >= cfg.min_clients:
            return nodes
        if time.monotonic() >= deadline:
            raise RuntimeError(
                f"only {len(nodes)} node(s) connected after {cfg.wait_for_nodes:g} s; "
                f"min-clients is {cfg.min_clients}"
            )
        time.sleep(min(1.0, cfg.poll_interval))
