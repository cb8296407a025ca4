"""Client side of one CorBin-FL round: what :func:`client.mod.corbin_mod` does at each stage.

``keygen``  fresh X25519 key pair for the round (Alg. 3 line 1); private key kept in
            ``context.state``, public key sent.
``pair``    relay/exact: derive the pair key, draw ``Y`` (and a seed, or the ``d*m`` bits of ``z``
            in exact mode) from the CSPRNG and send ``AEAD(Y || secret)`` (line 8).
``update``  :func:`prepare_update` checks the instruction and resolves the pair's common
            randomness (lines 9-17: lead by the two ``Y``s, the lead's seed or bits); the app's own
            train handler trains (line 4); :func:`finish_update` encodes the trained model with the
            mechanism (line 19, ``client/encode.py``) and builds the reply: the packed update, the
            mechanism's metrics, the app's metrics and the public key for the next round (line 21).
            Relay is pipelined: when the instruction names the partner of round ``t+1``, the reply
            also carries this node's sealed ``Y || seed`` for round ``t+1`` (lines 6-8 one round
            early; the pair key is derived with this round's private key and bound to ``t+1``).

Every instruction is validated (message type, records, keys, types, sizes, round in group id and
record, round not already handled). The mechanism's settings come from the instruction, parsed
by :meth:`corbin_fl.config.RunConfig.from_flower` and checked against the node's policy by the
mod; the run config (which the server controls) is never read here.

Roles stay hidden from the server: ``Y``, seeds, ``z`` and the lead flag never appear in a reply in
the clear (tests capture every message to check this).

torch is imported only by :func:`finish_update`, so keygen/pair replies stay fast.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from corbin_fl import registry, wire
from corbin_fl.client.pair_crypto import (
    KEY_BYTES,
    BlobAuthError,
    PairContext,
    PairCryptoError,
    derive_pair_key,
    derive_randomness,
    draw_seed,
    draw_y,
    generate_keypair,
    open_blob,
    seal_blob,
)
from corbin_fl.client.shared import Fallback, Shared, assignments_of
from corbin_fl.config import RunConfig

if TYPE_CHECKING:
    from corbin_fl.layout import ParamLayout

logger = logging.getLogger(__name__)

STATE_KEY = "corbin.key"
"""``context.state`` ConfigRecord: ``{"round": t, "sk": 32 bytes}``, the X25519 key of round t."""
STATE_PAIR = "corbin.pair"
"""``context.state`` ConfigRecord of the pair of round t: partner, pair key, own Y, own secret
(seed or packed z), and ``source``: ``"pair"`` (the pair stage of round t) or ``"pipeline"``
(sealed with the update reply of round t-1; a pair stage of round t may replace it)."""
SOURCE_PAIR, SOURCE_PIPELINE = "pair", "pipeline"
STATE_PROGRESS = "corbin.progress"
"""``context.state`` ConfigRecord: ``{"last-update": t}``, last round whose update was sent."""


# ----------------------------------------------------------------------------- common checks
def _instruction(msg: Message, stage: str, records: dict[str, type]) -> tuple[ConfigRecord, int]:
    if msg.metadata.message_type != wire.TRAIN:
        raise wire.WireError(f"message type {msg.metadata.message_type!r:.64}, expected 'train'")
    if not msg.has_content():
        raise wire.WireError("instruction without content")
    wire.check_records(msg.content, records)
    cfg_rec = msg.content.config_records[wire.CFG]
    got = wire.get_str(cfg_rec, wire.STAGE, wire.STAGES)
    if got != stage:
        raise wire.WireError(f"stage {got!r} sent to the {stage} handler")
    rnd = wire.check_round(msg, cfg_rec)
    return cfg_rec, rnd


def _private_key(context: Context, rnd: int) -> bytes | None:
    rec = context.state.config_records.get(STATE_KEY)
    if rec is None or rec.get(wire.ROUND) != rnd:
        return None
    sk = rec.get("sk")
    return sk if isinstance(sk, bytes) and len(sk) == KEY_BYTES else None


def _store_key(context: Context, rnd: int) -> bytes:
    sk, pk = generate_keypair()
    context.state.config_records[STATE_KEY] = ConfigRecord({wire.ROUND: rnd, "sk": sk})
    return pk


def _partner_id(cfg_rec: ConfigRecord, context: Context, key: str = wire.PARTNER) -> int:
    """The node id under ``key``: an unsigned 64-bit id other than this node's."""
    partner = wire.get_int(cfg_rec, key, low=0)
    if partner >= 2**64:
        raise wire.WireError(f"{key} {partner} is not a node id (unsigned 64-bit)")
    if partner == context.node_id:
        raise wire.WireError(f"{key} {partner} is not another node's id (it is this node)")
    return partner


# ----------------------------------------------------------------------------- keygen
def keygen(msg: Message, context: Context, cfg: RunConfig) -> RecordDict:
    """Stage ``keygen``: a fresh X25519 key pair for round ``t`` (Alg. 3 line 1).

    Instruction ``corbin{stage, round, params}``; reply ``corbin.keys{round, pubkey}``. The
    private key replaces any older one in ``context.state`` (keys are never reused across rounds).
    """
    cfg_rec, rnd = _instruction(msg, wire.KEYGEN, {wire.CFG: ConfigRecord})
    wire.check_keys(cfg_rec, registry.keygen_cfg_keys(), what="keygen cfg")
    if not cfg.paired:
        raise wire.WireError(f"keygen sent although mechanism {cfg.mechanism!r} does not pair")
    pk = _store_key(context, rnd)
    return RecordDict({wire.KEYS: ConfigRecord({wire.ROUND: rnd, wire.PUBKEY: pk})})


# ----------------------------------------------------------------------------- pair
def pair(msg: Message, context: Context, cfg: RunConfig, *, max_params: int) -> RecordDict:
    """Stage ``pair`` (relay/exact): seal ``Y || secret`` for the partner (Alg. 3 lines 6-8).

    Instruction ``corbin{stage, round, params, partner, partner-pubkey[, num-params]}``; reply
    ``corbin.pair{round, blob}``. ``num-params`` (exact mode) may be at most ``max_params``
    (the node's policy). Both partners send a blob of the same size, so the server cannot tell
    which one will lead. The own ``Y`` and secret stay in ``context.state`` for the update.
    In exact mode the secret is the packed ``d*m`` bits of ``z`` (Alg. 3 lines 14-17): both sides
    send theirs and the pair uses the lead's (the follower's are discarded).
    """
    cfg_rec, rnd = _instruction(msg, wire.PAIR, {wire.CFG: ConfigRecord})
    if not cfg.paired or cfg.cr_mode == "derived":
        raise wire.WireError(
            f"pair stage sent although mechanism/mode is {cfg.mechanism}/{cfg.cr_mode}"
        )
    wire.check_keys(cfg_rec, registry.pair_cfg_keys(cfg.cr_mode), what="pair cfg")
    mode = cfg.cr_mode
    partner = _partner_id(cfg_rec, context)
    partner_pk = wire.get_bytes(cfg_rec, wire.PARTNER_PUBKEY, KEY_BYTES)
    sk = _private_key(context, rnd)
    if sk is None:
        raise wire.WireError(f"no private key for round {rnd} (keygen missed or state lost)")
    old = context.state.config_records.get(STATE_PAIR)
    if old is not None and old.get(wire.ROUND) == rnd and old.get("source") != SOURCE_PIPELINE:
        raise wire.WireError(f"pair stage of round {rnd} already answered (replayed instruction)")
    num_params = None
    if mode == "exact":
        num_params = wire.get_int(cfg_rec, wire.NUM_PARAMS, low=1)
        if num_params > max_params:
            # d * num-params bits are drawn: an unchecked value could exhaust the memory.
            raise wire.WireError(f"num-params {num_params} above this node's limit {max_params}")
    ctx = PairContext(context.run_id, rnd, context.node_id, partner)
    blob = _seal_pair(context, cfg, sk, partner_pk, ctx, num_params, SOURCE_PAIR)
    return RecordDict({wire.PAIR_REC: ConfigRecord({wire.ROUND: rnd, wire.BLOB: blob})})


def _seal_pair(
    context: Context,
    cfg: RunConfig,
    sk: bytes,
    partner_pk: bytes,
    ctx: PairContext,
    num_params: int | None,
    source: str,
) -> bytes:
    """Alg. 3 lines 6-8 for the pair ``ctx`` (its round, self, partner): derive the pair key,
    draw ``Y`` and the secret (a seed, or the packed ``z`` of exact mode when ``num_params`` is
    given), keep them in ``context.state`` (:data:`STATE_PAIR`) and return the sealed blob."""
    pair_key = derive_pair_key(sk, partner_pk, ctx)
    y = draw_y()
    secret = draw_seed() if num_params is None else _exact_bits(cfg, ctx, num_params)
    blob = seal_blob(pair_key, y, secret, ctx)
    context.state.config_records[STATE_PAIR] = ConfigRecord(
        {
            wire.ROUND: ctx.round,
            wire.PARTNER: ctx.partner_id,
            "key": pair_key,
            "y": y,
            "secret": secret,
            "source": source,
        }
    )
    return blob


def _exact_bits(cfg: RunConfig, ctx: PairContext, num_params: int) -> bytes:
    """Exact mode: this node's candidate ``z`` (``d`` bits for each of ``m`` parameters), packed.

    Drawn with the law of the codebook (i.i.d. Bernoulli(``p_x``) bits) by expanding a fresh
    CSPRNG seed; for ``p_x = 1/2`` these are ``d*m`` fair bits as in Alg. 3 line 15.
    """
    # Imported here, not at the top, as every import of this module inside a function: it
    # loads torch, which a ClientApp process answering keygen or pair must not (client/mod.py
    # imports this module; tests/unit/test_lazy_imports.py).
    from corbin_fl.mechanisms.randomness import context_label, expand_seed, pack_z

    label = context_label(ctx.run_id, ctx.round, ctx.self_id, ctx.partner_id)
    z = expand_seed(draw_seed(), label, num_params, cfg.d, p_x=cfg.p_x)
    return pack_z(z, cfg.d)


# ----------------------------------------------------------------------------- update
@dataclass(frozen=True)
class UpdatePlan:
    """A checked update instruction, with the pair's common randomness resolved.

    Attributes
    ----------
    round : int
        Round ``t``.
    assignment : str
        The server's assignment (``paired``, ``unpaired``, ...).
    arrays_key : str
        Name of the ArrayRecord holding the global model (the wrapped strategy's key).
    layout : ParamLayout
        Where each floating-point array of the model lives in the flat vector.
    weights : np.ndarray
        The global model's floating-point arrays, flat float32 ``[m]``.
    center, radius : np.ndarray
        Per-layer (per array) center and radius, float32 ``[L]``.
    shared : Shared | Fallback | None
        The pair's common randomness, the reason for a fall-back, or None (solo mechanisms).
    shared_seed : tuple[int, int, int] | None
        ``(seed, rank, clients)`` of a mechanism with a server-shared seed (its registry entry's
        ``shared_seed`` keys), else None.
    next_pair : tuple[int, bytes] | None
        Pipelined relay: the partner of round ``t+1`` and its public key (of round ``t``).
    """

    round: int
    assignment: str
    arrays_key: str
    layout: ParamLayout
    weights: np.ndarray
    center: np.ndarray
    radius: np.ndarray
    shared: Shared | Fallback | None
    shared_seed: tuple[int, int, int] | None
    next_pair: tuple[int, bytes] | None = None


def prepare_update(
    msg: Message, context: Context, cfg: RunConfig, *, max_params: int
) -> UpdatePlan:
    """Check an update instruction and resolve the common randomness (Alg. 3 lines 9-17).

    Instruction ``corbin{stage, round, params, assignment, arrays-key, ...}``,
    ``corbin.range{center, radius}`` and the app's records (the global model under
    ``arrays-key``, usually a train config). The model may have at most ``max_params``
    floating-point parameters (the node's policy).
    """
    from corbin_fl.arrays import ArrayLayoutError, flatten_arrays, layout_of_arrays  # torch

    if not msg.has_content():
        raise wire.WireError("instruction without content")
    protocol = {name: msg.content[name] for name in msg.content if wire.is_protocol_record(name)}
    extra = sorted(set(protocol) - {wire.CFG, wire.RANGE})
    if extra:
        raise wire.WireError(f"unexpected protocol records {extra}")
    if msg.metadata.message_type != wire.TRAIN:
        raise wire.WireError(f"message type {msg.metadata.message_type!r:.64}, expected 'train'")
    wire.check_records(RecordDict(protocol), {wire.CFG: ConfigRecord, wire.RANGE: ArrayRecord})
    cfg_rec = msg.content.config_records[wire.CFG]
    if wire.get_str(cfg_rec, wire.STAGE, wire.STAGES) != wire.UPDATE:
        raise wire.WireError("update records sent with another stage")
    rnd = wire.check_round(msg, cfg_rec)
    assignment = wire.get_str(cfg_rec, wire.ASSIGNMENT, assignments_of(cfg))
    pipelined = wire.pipelined(cfg.paired, cfg.cr_mode)
    wire.check_keys(
        cfg_rec,
        registry.update_cfg_keys(cfg.mechanism, assignment, cfg.cr_mode),
        wire.NEXT_PAIR_KEYS if pipelined else (),
        what="update cfg",
    )
    progress = context.state.config_records.get(STATE_PROGRESS)
    last = progress.get("last-update", 0) if progress is not None else 0
    if isinstance(last, int) and rnd <= last:
        raise wire.WireError(f"update for round {rnd} but round {last} was already handled")

    arrays_key = wire.get_str(cfg_rec, wire.ARRAYS_KEY)
    if wire.is_protocol_record(arrays_key) or arrays_key not in msg.content.array_records:
        raise wire.WireError(f"no ArrayRecord {arrays_key!r:.64} with the global model")
    global_arrays = msg.content.array_records[arrays_key]
    try:
        layout = layout_of_arrays(global_arrays)
        if layout.m > max_params:
            raise wire.WireError(f"{layout.m} parameters, above this node's limit {max_params}")
        weights = flatten_arrays(global_arrays, layout)
    except ArrayLayoutError as exc:
        raise wire.WireError(f"global model: {exc}") from exc
    range_rec = msg.content.array_records[wire.RANGE]
    wire.check_keys(range_rec, {wire.CENTER, wire.RADIUS}, what="range")
    center = wire.read_array(range_rec, wire.CENTER, np.float32, layout.num_layers, finite=True)
    radius = wire.read_array(range_rec, wire.RADIUS, np.float32, layout.num_layers, finite=True)
    if not (radius > 0).all():
        raise wire.WireError("radius must be > 0 in every layer")
    seed_keys = registry.get(cfg.mechanism).shared_seed
    shared_seed = _shared_seed(cfg_rec, seed_keys) if seed_keys else None
    next_pair = _next_pair(cfg_rec, context) if pipelined else None
    # Common randomness first: cheap, and a failure is a fall-back, not an error.
    shared = _resolve_common_randomness(cfg_rec, context, cfg, rnd, assignment)
    if (
        isinstance(shared, Shared)
        and shared.exact
        and not _exact_bits_fit(shared, cfg.d * layout.m)
    ):
        logger.warning(
            "node %d: the pair's exact bits do not fit the model, using ldpq", context.node_id
        )
        shared = Fallback("blob-invalid")
    return UpdatePlan(
        round=rnd,
        assignment=assignment,
        arrays_key=arrays_key,
        layout=layout,
        weights=weights,
        center=center,
        radius=radius,
        shared=shared,
        shared_seed=shared_seed,
        next_pair=next_pair,
    )


def _next_pair(cfg_rec: ConfigRecord, context: Context) -> tuple[int, bytes] | None:
    """The pipelined partner of the next round and its public key, or None (both keys or none)."""
    present = wire.NEXT_PAIR_KEYS & set(cfg_rec.keys())
    if not present:
        return None
    if present != wire.NEXT_PAIR_KEYS:
        raise wire.WireError(f"pipelined pair needs both of {sorted(wire.NEXT_PAIR_KEYS)}")
    partner = _partner_id(cfg_rec, context, wire.NEXT_PARTNER)
    return partner, wire.get_bytes(cfg_rec, wire.NEXT_PARTNER_PUBKEY, KEY_BYTES)


def _exact_bits_fit(shared: Shared, num_bits: int) -> bool:
    """Exact mode: the lead's packed ``z`` has exactly ``num_bits`` bits and zero padding (a
    partner's authenticated blob can still carry other bits; that is a fall-back, not an error)."""
    if len(shared.secret) != wire.packed_len(num_bits):
        return False
    return not np.unpackbits(np.frombuffer(shared.secret, np.uint8))[num_bits:].any()


def app_view(msg: Message) -> RecordDict:
    """The records of an update instruction that belong to the app (all but ``corbin*``)."""
    return RecordDict(
        {name: rec for name, rec in msg.content.items() if not wire.is_protocol_record(name)}
    )


def finish_update(
    plan: UpdatePlan, app_reply: RecordDict, context: Context, cfg: RunConfig
) -> RecordDict:
    """Encode the app's trained model and build the update reply (Alg. 3 lines 19-21).

    ``app_reply`` is what the app's train handler returned: its ArrayRecord under
    ``plan.arrays_key`` (or its only ArrayRecord) must hold the same floating-point arrays as the
    global model. The reply is ``corbin.reply{round[, next-pubkey][, z-digest]}``,
    ``corbin.update{bits | values}``, ``corbin.metrics{...}`` and the app's MetricRecords and
    ConfigRecords unchanged; no ArrayRecord of the app ever leaves the node.
    """
    from corbin_fl.arrays import ArrayLayoutError, check_same_weights, flatten_arrays  # torch
    from corbin_fl.client import encode  # torch lives behind this import

    arrays = app_reply.array_records
    if plan.arrays_key in arrays:
        trained = arrays[plan.arrays_key]
    elif len(arrays) == 1:
        trained = next(iter(arrays.values()))
    else:
        raise ValueError(
            f"the train handler must reply with the model in ArrayRecord {plan.arrays_key!r} "
            f"(got {sorted(arrays)[:5]})"
        )
    try:
        check_same_weights(trained, plan.layout)
        w = flatten_arrays(trained, plan.layout)
    except ArrayLayoutError as exc:
        raise ValueError(
            f"the train handler's model does not match the global model: {exc}"
        ) from exc
    result = encode.encode_update(
        cfg,
        context,
        rnd=plan.round,
        layout=plan.layout,
        weights=w,
        w_global=plan.weights,
        center=plan.center,
        radius=plan.radius,
        assignment=plan.assignment,
        shared=plan.shared,
        shared_seed=plan.shared_seed,
    )
    reply_cfg: dict[str, Any] = {wire.ROUND: plan.round}
    context.state.config_records.pop(STATE_PAIR, None)
    if plan.next_pair is not None:
        next_blob = _seal_next(plan.next_pair, plan.round, context, cfg)
        if next_blob is not None:
            reply_cfg[wire.NEXT_BLOB] = next_blob
    if cfg.paired:
        reply_cfg[wire.NEXT_PUBKEY] = _store_key(context, plan.round + 1)
    if result.z_digest is not None:
        reply_cfg[wire.Z_DIGEST] = result.z_digest
    context.state.config_records[STATE_PROGRESS] = ConfigRecord({"last-update": plan.round})
    out = RecordDict(
        {
            wire.REPLY: ConfigRecord(reply_cfg),
            wire.UPDATE_REC: ArrayRecord({result.array_key: wire.to_array(result.array)}),
            wire.METRICS: MetricRecord({**result.metrics}),
        }
    )
    for name, rec in app_reply.items():
        if isinstance(rec, MetricRecord | ConfigRecord) and not wire.is_protocol_record(name):
            out[name] = rec
    return out


def _seal_next(
    next_pair: tuple[int, bytes], rnd: int, context: Context, cfg: RunConfig
) -> bytes | None:
    """Pipelined relay: seal ``Y || seed`` for the partner of round ``t+1`` with this round's
    private key; the pair key and the AAD are bound to round ``t+1``, sender and recipient.

    None (no blob; the partner pairs again or falls back next round, the update still counts)
    when this node has no private key for round ``t`` or the partner's key is refused.
    """
    partner, partner_pk = next_pair
    sk = _private_key(context, rnd)
    if sk is None:
        logger.warning(
            "node %d: no private key for round %d, no pipelined blob", context.node_id, rnd
        )
        return None
    ctx = PairContext(context.run_id, rnd + 1, context.node_id, partner)
    try:
        return _seal_pair(context, cfg, sk, partner_pk, ctx, None, SOURCE_PIPELINE)
    except PairCryptoError as exc:
        logger.warning(
            "node %d: next partner's key refused (%s), no pipelined blob", context.node_id, exc
        )
        return None


def _shared_seed(cfg_rec: ConfigRecord, keys: tuple[str, ...]) -> tuple[int, int, int]:
    """``(shared seed, rank, clients)`` under the mechanism's ``keys`` (seed, rank, clients)."""
    seed_key, rank_key, clients_key = keys
    seed = int.from_bytes(wire.get_bytes(cfg_rec, seed_key, wire.SHARED_SEED_BYTES), "big")
    clients = wire.get_int(cfg_rec, clients_key, low=1)
    if clients > wire.MAX_SHARED_CLIENTS:
        raise wire.WireError(f"{clients_key} {clients} above the limit {wire.MAX_SHARED_CLIENTS}")
    rank = wire.get_int(cfg_rec, rank_key, low=0)
    if rank >= clients:
        raise wire.WireError(f"{rank_key} {rank} not below {clients_key} {clients}")
    return seed, rank, clients


def _resolve_common_randomness(
    cfg_rec: ConfigRecord, context: Context, cfg: RunConfig, rnd: int, assignment: str
) -> Shared | Fallback | None:
    """Alg. 3 lines 9-17: who leads the pair and whose seed (or bits) it uses.

    Relay/exact: open the partner's blob, lead by ``is_lead`` from the two ``Y``s (Alg. 3 lines
    9-12), take the lead's secret. Derived: seed and role bit from HKDF of the X25519 secret.
    Anything that goes wrong is a :class:`Fallback` (``ldpq``) with its reason, never an error:
    the node's update still counts.
    """
    if assignment != wire.PAIRED:
        if assignment == wire.PARTNER_GONE:
            _partner_id(cfg_rec, context)  # unused, but the instruction must be well formed
        reason = _ASSIGNMENT_FALLBACK.get(assignment)
        return Fallback(reason) if reason else None
    from corbin_fl.mechanisms.pairing import is_lead  # torch (mechanisms.validate)

    nid = context.node_id
    partner = _partner_id(cfg_rec, context)
    ctx = PairContext(context.run_id, rnd, nid, partner)
    if cfg.cr_mode == "derived":
        partner_pk = wire.get_bytes(cfg_rec, wire.PARTNER_PUBKEY, KEY_BYTES)
        sk = _private_key(context, rnd)
        if sk is None:
            logger.warning("node %d: no private key for round %d, using ldpq", nid, rnd)
            return Fallback("no-pair-state")
        try:
            derived = derive_randomness(sk, partner_pk, ctx)
        except PairCryptoError as exc:
            logger.warning("node %d: partner key rejected (%s), using ldpq", nid, exc)
            return Fallback("blob-invalid")
        lead = is_lead(nid, partner, derived.role_bit, 0)
        return Shared(partner=partner, lead=lead, secret=derived.seed)

    blob = wire.get_bytes(cfg_rec, wire.PARTNER_BLOB)
    state = context.state.config_records.get(STATE_PAIR)
    if state is None or state.get(wire.ROUND) != rnd or state.get(wire.PARTNER) != partner:
        logger.warning("node %d: no pair state for round %d, using ldpq", nid, rnd)
        return Fallback("no-pair-state")
    own_secret, pair_key, y_self = state["secret"], state["key"], state["y"]
    if not (isinstance(own_secret, bytes) and isinstance(pair_key, bytes) and y_self in (0, 1)):
        return Fallback("no-pair-state")
    try:
        y_partner, partner_secret = open_blob(pair_key, blob, ctx, len(own_secret))
    except BlobAuthError:
        logger.warning(
            "node %d: blob of partner %d failed authentication in round %d, using ldpq",
            nid,
            partner,
            rnd,
        )
        return Fallback("blob-auth-failed")
    except PairCryptoError as exc:
        logger.warning("node %d: blob of partner %d invalid (%s), using ldpq", nid, partner, exc)
        return Fallback("blob-invalid")
    lead = is_lead(nid, partner, int(y_self), y_partner)
    return Shared(
        partner=partner,
        lead=lead,
        secret=own_secret if lead else partner_secret,
        exact=cfg.cr_mode == "exact",
    )


_ASSIGNMENT_FALLBACK: dict[str, str] = {
    wire.UNPAIRED: "unpaired",
    wire.INDEPENDENT: "independent",
    wire.PARTNER_GONE: "partner-gone",
}
