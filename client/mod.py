"""``corbin_mod``: the CorBin-FL ClientApp mod. Any Flower app becomes private with one line.

::

    from corbin_fl import corbin_mod

    app = ClientApp(mods=[corbin_mod])

    @app.train()
    def train(msg, context):  # the app's own handler, unchanged
        ...  # reads msg.content["arrays"], trains, replies {"arrays": ..., "metrics": ...}

Every protocol message of the :class:`server.strategy.CorBin` strategy is a ``train`` message
whose ``corbin`` record names its stage (``client/handlers.py``):

- ``keygen`` and ``pair`` are answered here; the app's handler never sees them.
- ``update``: the mod checks the instruction, resolves the pair's common randomness, hands the
  app's handler exactly what a plain ``FedAvg`` would send (the global model and the train
  config), takes the trained model from its reply, quantizes it with the instruction's mechanism
  (one bit per parameter for CorBin-FL) and replies with the encoded update, the mechanism's
  metrics and the app's own metrics. The app's arrays never leave the node.

**The node's policy** (:class:`client.policy.Policy`, from node config): every instruction's
mechanism settings are checked against it first. An instruction asking for a mechanism the node
does not allow or a larger epsilon/delta, and a ``train`` message with no CorBin-FL instruction
at all (what a plain ``FedAvg`` sends), get an error reply and are never followed, so a malicious
server cannot switch the node off privacy. ``evaluate`` and ``query`` messages pass through to
the app: they carry the (public) global model to the node, and their replies are the app's own
metrics.

**An instruction answered twice gets the same reply** (``client/replay.py``): after a SuperLink
outage the server re-sends the instructions of nodes it has not heard from; a node that had
answered replies with its first reply again, byte for byte, so it releases nothing twice.

Every failure becomes a Flower error reply naming the cause (``code = wire.ERROR_CODE_POLICY``
for a policy refusal, ``wire.ERROR_CODE_REJECTED`` for anything else); nothing raises into
Flower's executor.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from flwr.app import Context, Error, Message, RecordDict

from corbin_fl import registry, secure, wire
from corbin_fl.client import handlers, replay, secure_update
from corbin_fl.client.pair_crypto import PairCryptoError
from corbin_fl.client.policy import Policy, PolicyError
from corbin_fl.config import ConfigError, RunConfig
from corbin_fl.secagg.messages import SecAggError

logger = logging.getLogger(__name__)

ClientAppCallable = Callable[[Message, Context], Message]


def corbin_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Answer the CorBin-FL stages and wrap the app's train handler (see the module docstring).

    An instruction this node answered last (same content: :func:`replay.instruction_digest`)
    gets that reply again once the policy accepts it; a new content reply is kept for that.

    Parameters
    ----------
    msg : Message
        The message Flower delivers to the ClientApp.
    context : Context
        The node's context; ``state`` keeps the round's private key and pair state.
    call_next : Callable[[Message, Context], Message]
        The next mod, or the app's handler.

    Returns
    -------
    Message
        The protocol reply, or an error reply naming why the instruction was refused.
    """
    if msg.metadata.message_type != wire.TRAIN:
        return call_next(msg, context)
    try:  # a content Flower cannot serialize has no digest: the stage's checks refuse it
        digest = replay.instruction_digest(msg) if msg.has_content() else None
    except (ValueError, TypeError, OverflowError):
        digest = None
    reply = _answer(msg, context, call_next, digest)
    if digest is not None and reply.has_content() and wire.stage_of(msg) is not None:
        replay.remember(digest, reply, context)
    return reply


def _answer(
    msg: Message, context: Context, call_next: ClientAppCallable, digest: str | None
) -> Message:
    """:func:`corbin_mod` on a ``train`` message whose instruction digest is ``digest``."""
    nid = context.node_id
    stage = wire.stage_of(msg)
    try:
        if stage is None:
            raise PolicyError(
                "a train message without a CorBin-FL instruction: this node sends its update "
                "only through corbin_mod's private protocol, never in the clear"
            )
        policy = Policy.from_node(context.node_config)
        cfg = instruction_config(msg)
        policy.check(cfg)
        again = replay.replayed(digest, context) if digest is not None else None
        if again is not None:
            return Message(again, reply_to=msg)
        if stage == wire.KEYGEN:
            return Message(handlers.keygen(msg, context, cfg), reply_to=msg)
        if stage == wire.PAIR:
            return Message(
                handlers.pair(msg, context, cfg, max_params=policy.max_params), reply_to=msg
            )
        if stage in secure.STAGES:  # secure aggregation (corbin_fl/secure.py)
            return Message(secure_update.answer(msg, context, cfg, stage), reply_to=msg)
        if stage != wire.UPDATE:
            raise wire.WireError(f"unknown stage {stage!r:.64}")
        mask = secure_update.take_mask_request(msg, context, cfg)
        plan = handlers.prepare_update(msg, context, cfg, max_params=policy.max_params)
        if mask is not None:  # back in the instruction: the app never sees corbin.* records
            for name, rec in mask.records.items():
                msg.content[name] = rec
    except PolicyError as exc:
        logger.warning("node %d: refused a train message: %s", nid, exc)
        return error_reply(msg, f"{wire.POLICY_REFUSAL}{exc}", code=wire.ERROR_CODE_POLICY)
    except (wire.WireError, PairCryptoError, SecAggError, ValueError, TypeError) as exc:
        logger.warning("node %d: rejected stage %r: %s", nid, stage, exc)
        return error_reply(msg, f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # the executor must get a reply, whatever happened
        logger.exception("node %d: stage %r failed", nid, stage)
        return error_reply(msg, f"{type(exc).__name__}: {exc}")

    # The app trains on exactly what a plain FedAvg would send it.
    protocol = RecordDict({k: v for k, v in msg.content.items() if wire.is_protocol_record(k)})
    msg.content = handlers.app_view(msg)
    try:
        app_reply = call_next(msg, context)
    except Exception as exc:  # the app's handler failed: an error reply, not a crash
        logger.exception("node %d: the train handler failed in round %d", nid, plan.round)
        return error_reply(msg, f"train handler: {type(exc).__name__}: {exc}")
    finally:
        msg.content = RecordDict({**protocol, **msg.content})
    if app_reply.has_error():
        return app_reply
    try:
        content = handlers.finish_update(plan, app_reply.content, context, cfg)
        if mask is not None:
            content = secure_update.masked_reply(
                content, mask.request, context, cfg, plan.layout.m, mask.advertise_next
            )
    except (wire.WireError, SecAggError, ValueError, TypeError) as exc:
        logger.warning("node %d: could not encode round %d: %s", nid, plan.round, exc)
        return error_reply(msg, f"{type(exc).__name__}: {exc}")
    except Exception as exc:
        logger.exception("node %d: encoding round %d failed", nid, plan.round)
        return error_reply(msg, f"{type(exc).__name__}: {exc}")
    return Message(content, reply_to=msg)


def instruction_config(msg: Message) -> RunConfig:
    """The mechanism settings of an instruction (:data:`corbin_fl.registry.PARAM_KEYS`), checked.

    Raises
    ------
    corbin_fl.wire.WireError
        A missing setting, or one :meth:`RunConfig.from_flower` refuses.
    """
    rec = msg.content.config_records[wire.CFG]
    keys = registry.param_keys()
    missing = [key for key in keys if key not in rec]
    if missing:
        raise wire.WireError(f"instruction lacks the mechanism settings {missing}")
    try:
        return RunConfig.from_flower({key: rec[key] for key in keys})
    except (ConfigError, TypeError) as exc:
        raise wire.WireError(f"bad mechanism settings: {exc}") from exc


def error_reply(msg: Message, reason: str, code: int = wire.ERROR_CODE_REJECTED) -> Message:
    """A Flower error reply with ``code`` (:data:`corbin_fl.wire.ERROR_CODE_REJECTED`, or
    :data:`corbin_fl.wire.ERROR_CODE_POLICY` for a policy refusal) and ``reason``."""
    return Message(Error(code=code, reason=reason[:2000]), reply_to=msg)
