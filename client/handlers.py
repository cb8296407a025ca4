"""Client side of one CorBin-FL round: one handler per message type.

``query.keygen``  fresh X25519 key pair for the round (Alg. 3 line 1); private key kept in
                  ``context.state``, public key sent.
``query.pair``    relay/exact: derive the pair key, draw ``Y`` (and a seed, or the ``d*m`` bits of
                  ``z`` in exact mode) from the CSPRNG and send ``AEAD(Y || secret)`` (line 8).
``train.update``  load the global model, train locally (line 4), resolve the pair's common
                  randomness (lines 9-17: lead by the two ``Y``s, the lead's seed or bits), encode
                  the update (line 19, ``client/encode.py``) and reply with the packed update, the
                  metrics and the public key for the next round (line 21).

Every instruction is validated (message type, records, keys, types, sizes, round in group id and
record, round not already handled) and a bad one is answered with a Flower error reply
(``Error(code=ERROR_CODE_REJECTED, reason=...)``) instead of raising into Flower's executor. The
one deliberate exception is simulated dropout (``dropout-prob``): it raises, exactly like a
crashing client would.

Roles stay hidden from the server: ``Y``, seeds, ``z`` and the lead flag never appear in a reply in
the clear (tests capture every message to check this).

torch is imported only inside the update handler, so keygen/pair replies stay fast.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord, RecordDict

from client.pair_crypto import (
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
from client.shared import Fallback, Shared, assignments_of
from corbin_fl import wire
from corbin_fl.config import ConfigError, RunConfig

logger = logging.getLogger(__name__)

STATE_KEY = "corbin.key"
"""``context.state`` ConfigRecord: ``{"round": t, "sk": 32 bytes}``, the X25519 key of round t."""
STATE_PAIR = "corbin.pair"
"""``context.state`` ConfigRecord of the pair stage of round t: partner, pair key, own Y, own
secret (seed or packed z)."""
STATE_PROGRESS = "corbin.progress"
"""``context.state`` ConfigRecord: ``{"last-update": t}``, last round whose update was sent."""


class SimulatedDropoutError(RuntimeError):
    """Raised on purpose (``dropout-prob``) to make the node fail the round like a crash."""


Handler = Callable[[Message, Context, RunConfig], RecordDict]


# ----------------------------------------------------------------------------- entry point
def handle(msg: Message, context: Context, handler: Handler) -> Message:
    """Run ``handler`` and turn every failure into an error reply (never raise into Flower).

    Parameters
    ----------
    msg : Message
        The instruction.
    context : Context
        The node's context (``state`` persists across messages and rounds).
    handler : Handler
        One of :func:`keygen`, :func:`pair`, :func:`update`.

    Returns
    -------
    Message
        The reply, or an error reply with ``code = wire.ERROR_CODE_REJECTED`` and the reason.

    Raises
    ------
    SimulatedDropoutError
        Only when the run config's ``dropout-prob`` makes this node drop this round.
    """
    nid = context.node_id
    try:
        cfg = RunConfig.from_flower(context.run_config)
    except (ConfigError, TypeError) as exc:
        logger.error("node %d: bad run config: %s", nid, exc)
        return _error(msg, f"bad run config: {exc}")
    try:
        rnd_hint: int | None = wire.round_of(msg)
    except wire.WireError:
        rnd_hint = None  # not a round number: the handler rejects the instruction
    if cfg.dropout_prob > 0 and rnd_hint is not None and _drops_out(cfg, context, rnd_hint):
        logger.info("node %d: simulated dropout in round %d", nid, rnd_hint)
        raise SimulatedDropoutError(f"node {nid} drops out of round {rnd_hint} (dropout-prob)")
    try:
        return Message(handler(msg, context, cfg), reply_to=msg)
    except (wire.WireError, PairCryptoError, ValueError, TypeError) as exc:
        logger.warning("node %d: rejected %s: %s", nid, msg.metadata.message_type, exc)
        return _error(msg, f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # the executor must get a reply, whatever happened
        logger.exception("node %d: %s failed", nid, msg.metadata.message_type)
        return _error(msg, f"{type(exc).__name__}: {exc}")


def _error(msg: Message, reason: str) -> Message:
    return Message(Error(code=wire.ERROR_CODE_REJECTED, reason=reason[:2000]), reply_to=msg)


def _drops_out(cfg: RunConfig, context: Context, rnd: int) -> bool:
    """Seeded per (run seed, node, round), identical for every stage of the round."""
    try:
        who = _partition(context, required=False)
    except (TypeError, ValueError):  # malformed node config: reported by the update handler
        who = None
    ident = who[0] if who is not None else context.node_id
    rng = np.random.default_rng([cfg.seed, 0xD809, ident, rnd])
    return bool(rng.random() < cfg.dropout_prob)


def _partition(context: Context, *, required: bool = True) -> tuple[int, int] | None:
    pid, num = context.node_config.get("partition-id"), context.node_config.get("num-partitions")
    if pid is None or num is None:
        if required:
            raise ValueError("node config lacks partition-id / num-partitions")
        return None
    if isinstance(pid, bool) or isinstance(num, bool):
        raise TypeError("partition-id and num-partitions must be integers")
    pid, num = int(pid), int(num)
    if not 0 <= pid < num:
        raise ValueError(f"partition-id {pid} not in [0, num-partitions={num})")
    return pid, num


# ----------------------------------------------------------------------------- common checks
def _instruction(
    msg: Message, expected_type: str, records: dict[str, type]
) -> tuple[ConfigRecord, int]:
    if msg.metadata.message_type != expected_type:
        raise wire.WireError(f"message type {msg.metadata.message_type!r} sent to {expected_type}")
    if not msg.has_content():
        raise wire.WireError("instruction without content")
    wire.check_records(msg.content, records)
    cfg_rec = msg.content.config_records[wire.CFG]
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


def _partner_id(cfg_rec: ConfigRecord, context: Context) -> int:
    partner = wire.get_int(cfg_rec, wire.PARTNER, low=0)
    if partner >= 2**64:
        raise wire.WireError(f"partner {partner} is not a node id (unsigned 64-bit)")
    if partner == context.node_id:
        raise wire.WireError("partner is this node itself")
    return partner


# ----------------------------------------------------------------------------- keygen
def keygen(msg: Message, context: Context, cfg: RunConfig) -> RecordDict:
    """``query.keygen``: a fresh X25519 key pair for round ``t`` (Alg. 3 line 1).

    Instruction ``cfg{round}``; reply ``keys{round, pubkey}``. The private key replaces any older
    one in ``context.state`` (keys are never reused across rounds).
    """
    cfg_rec, rnd = _instruction(msg, wire.KEYGEN, {wire.CFG: ConfigRecord})
    wire.check_keys(cfg_rec, {wire.ROUND}, what="keygen cfg")
    if not cfg.paired:
        raise wire.WireError(f"keygen sent although mechanism {cfg.mechanism!r} does not pair")
    pk = _store_key(context, rnd)
    return RecordDict({wire.KEYS: ConfigRecord({wire.ROUND: rnd, wire.PUBKEY: pk})})


# ----------------------------------------------------------------------------- pair
def pair(msg: Message, context: Context, cfg: RunConfig) -> RecordDict:
    """``query.pair`` (relay/exact): seal ``Y || secret`` for the partner (Alg. 3 lines 6-8).

    Instruction ``cfg{round, partner, partner-pubkey, cr-mode[, num-params]}``; reply
    ``pair{round, blob}``. Both partners send a blob of the same size, so the server cannot tell
    which one will lead. The own ``Y`` and secret stay in ``context.state`` for the update.
    In exact mode the secret is the packed ``d*m`` bits of ``z`` (Alg. 3 lines 14-17): both sides
    send theirs and the pair uses the lead's (the follower's are discarded).
    """
    cfg_rec, rnd = _instruction(msg, wire.PAIR, {wire.CFG: ConfigRecord})
    if not cfg.paired or cfg.cr_mode == "derived":
        raise wire.WireError(
            f"pair stage sent although mechanism/mode is {cfg.mechanism}/{cfg.cr_mode}"
        )
    wire.check_keys(cfg_rec, wire.pair_cfg_keys(cfg.cr_mode), what="pair cfg")
    mode = wire.get_str(cfg_rec, wire.CR_MODE, ("relay", "exact"))
    if mode != cfg.cr_mode:
        raise wire.WireError(f"cr-mode {mode!r} in the instruction, {cfg.cr_mode!r} in the run")
    partner = _partner_id(cfg_rec, context)
    partner_pk = wire.get_bytes(cfg_rec, wire.PARTNER_PUBKEY, KEY_BYTES)
    sk = _private_key(context, rnd)
    if sk is None:
        raise wire.WireError(f"no private key for round {rnd} (keygen missed or state lost)")
    old = context.state.config_records.get(STATE_PAIR)
    if old is not None and old.get(wire.ROUND) == rnd:
        raise wire.WireError(f"pair stage of round {rnd} already answered (replayed instruction)")
    ctx = PairContext(context.run_id, rnd, context.node_id, partner)
    pair_key = derive_pair_key(sk, partner_pk, ctx)
    y = draw_y()
    if mode == "exact":
        num_params = wire.get_int(cfg_rec, wire.NUM_PARAMS, low=1)
        from client import encode  # torch: exact mode expands z here anyway

        expected = encode.LocalTask.get(cfg).layout.m
        if num_params != expected:
            # d * num-params bits are drawn: an unchecked value could exhaust the memory.
            raise wire.WireError(f"num-params {num_params}, but the model has {expected}")
        secret = _exact_bits(cfg, ctx, num_params)
    else:
        secret = draw_seed()
    blob = seal_blob(pair_key, y, secret, ctx)
    context.state.config_records[STATE_PAIR] = ConfigRecord(
        {wire.ROUND: rnd, wire.PARTNER: partner, "key": pair_key, "y": y, "secret": secret}
    )
    return RecordDict({wire.PAIR_REC: ConfigRecord({wire.ROUND: rnd, wire.BLOB: blob})})


def _exact_bits(cfg: RunConfig, ctx: PairContext, num_params: int) -> bytes:
    """Exact mode: this node's candidate ``z`` (``d`` bits for each of ``m`` parameters), packed.

    Drawn with the law of the codebook (i.i.d. Bernoulli(``p_x``) bits) by expanding a fresh
    CSPRNG seed; for ``p_x = 1/2`` these are ``d*m`` fair bits as in Alg. 3 line 15.
    """
    from mechanisms.randomness import context_label, expand_seed, pack_z

    label = context_label(ctx.run_id, ctx.round, ctx.self_id, ctx.partner_id)
    z = expand_seed(draw_seed(), label, num_params, cfg.d, p_x=cfg.p_x)
    return pack_z(z, cfg.d)


# ----------------------------------------------------------------------------- update
def update(msg: Message, context: Context, cfg: RunConfig) -> RecordDict:
    """``train.update``: train, encode with the mechanism, reply (Alg. 3 lines 4, 9-21).

    Instruction ``cfg{round, mechanism, assignment, ...}`` and ``model{weights, center,
    radius}``; reply ``reply{round[, next-pubkey][, z-digest]}``, ``update{bits|values}``,
    ``metrics{...}``.
    """
    from client import encode  # torch lives behind this import

    cfg_rec, rnd = _instruction(msg, wire.UPDATE, {wire.CFG: ConfigRecord, wire.MODEL: ArrayRecord})
    mechanism = wire.get_str(cfg_rec, wire.MECHANISM)
    if mechanism != cfg.mechanism:
        raise wire.WireError(
            f"mechanism {mechanism!r} in the instruction, {cfg.mechanism!r} in the run"
        )
    allowed = assignments_of(cfg)
    assignment = wire.get_str(cfg_rec, wire.ASSIGNMENT, allowed)
    wire.check_keys(
        cfg_rec, wire.update_cfg_keys(mechanism, assignment, cfg.cr_mode), what="update cfg"
    )
    progress = context.state.config_records.get(STATE_PROGRESS)
    last = progress.get("last-update", 0) if progress is not None else 0
    if isinstance(last, int) and rnd <= last:
        raise wire.WireError(f"update for round {rnd} but round {last} was already handled")

    task = encode.LocalTask.get(cfg)
    model_rec = msg.content.array_records[wire.MODEL]
    wire.check_keys(model_rec, {wire.WEIGHTS, wire.CENTER, wire.RADIUS}, what="model")
    weights = wire.read_array(model_rec, wire.WEIGHTS, np.float32, task.layout.m, finite=True)
    center = wire.read_array(
        model_rec, wire.CENTER, np.float32, task.layout.num_layers, finite=True
    )
    radius = wire.read_array(
        model_rec, wire.RADIUS, np.float32, task.layout.num_layers, finite=True
    )
    if not (radius > 0).all():
        raise wire.WireError("radius must be > 0 in every layer")
    cq = _cq_instruction(cfg_rec) if mechanism == "cq" else None

    # Common randomness first: cheap, and a failure is a fall-back, not an error.
    shared = _resolve_common_randomness(cfg_rec, context, cfg, rnd, assignment)

    pid, num = _partition(context)  # type: ignore[misc]
    result = encode.train_and_encode(
        task,
        cfg,
        context,
        rnd=rnd,
        partition=(pid, num),
        weights=weights,
        center=center,
        radius=radius,
        assignment=assignment,
        shared=shared,
        cq=cq,
    )

    reply_cfg: dict[str, Any] = {wire.ROUND: rnd}
    if cfg.paired:
        reply_cfg[wire.NEXT_PUBKEY] = _store_key(context, rnd + 1)
    if result.z_digest is not None:
        reply_cfg[wire.Z_DIGEST] = result.z_digest
    context.state.config_records.pop(STATE_PAIR, None)
    context.state.config_records[STATE_PROGRESS] = ConfigRecord({"last-update": rnd})
    metrics = MetricRecord(result.metrics)
    return RecordDict(
        {
            wire.REPLY: ConfigRecord(reply_cfg),
            wire.UPDATE_REC: ArrayRecord({result.array_key: wire.to_array(result.array)}),
            wire.METRICS: metrics,
        }
    )


def _cq_instruction(cfg_rec: ConfigRecord) -> tuple[int, int, int]:
    """``(shared seed, rank, clients)`` of the CQ baseline."""
    seed = int.from_bytes(wire.get_bytes(cfg_rec, wire.CQ_SEED, wire.CQ_SEED_BYTES), "big")
    clients = wire.get_int(cfg_rec, wire.CQ_CLIENTS, low=1)
    if clients > wire.MAX_CQ_CLIENTS:
        raise wire.WireError(f"cq-clients {clients} above the limit {wire.MAX_CQ_CLIENTS}")
    rank = wire.get_int(cfg_rec, wire.CQ_RANK, low=0)
    if rank >= clients:
        raise wire.WireError(f"cq-rank {rank} not below cq-clients {clients}")
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
    from mechanisms.pairing import is_lead

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
