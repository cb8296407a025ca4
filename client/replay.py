"""A node answers an instruction it already answered with the same reply, never a new one.

After a SuperLink outage the server sends every node still silent its instruction once more, as
a new message with the same content (``server/stages.py``): the first reply may have been lost
on its way, or the first instruction never arrived. A node that did answer must not answer
again with fresh randomness: a second quantization of the same model is a second release (its
privacy cost adds up, Theorem 1's eps_p per release), a second keygen would replace the key the
server already holds, and a second masked update would not match its SecAgg+ shares. So
``corbin_mod`` keeps the last reply it sent in ``context.state`` with the digest of the
instruction it answered, and an instruction with that digest gets that reply again, byte for
byte: the re-sent instruction costs no release and changes no state.

The digest is SHA-256 over the message type, the group id and each record's name and Flower
object id (a hash of the record's content), in name order: two messages with the same content
have it whatever their message ids and creation times. Only the last reply is kept: a node
works on one message at a time and the server re-sends only the stage in flight.
"""

from __future__ import annotations

import hashlib
import logging

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict

logger = logging.getLogger(__name__)

STATE_REPLY = "corbin.last-reply"
"""``context.state`` ConfigRecord: ``digest`` (hex) of the last instruction answered and
``reply``, its reply's content serialized (Flower's RecordDict protobuf)."""


def instruction_digest(msg: Message) -> str:
    """SHA-256 (hex) of an instruction's type, group id and records (name and object id)."""
    if not msg.has_content():
        raise ValueError("an instruction without content has no digest")
    meta = msg.metadata
    h = hashlib.sha256()
    for part in (meta.message_type, meta.group_id):
        h.update(len(part).to_bytes(4, "big") + part.encode())
    for name in sorted(msg.content):
        ident = f"{name}\x00{msg.content[name].object_id}".encode()
        h.update(len(ident).to_bytes(4, "big") + ident)
    return h.hexdigest()


def replayed(digest: str, context: Context) -> RecordDict | None:
    """The content of the reply this node sent to the instruction with ``digest``, if it was
    the last one it answered; None otherwise."""
    rec = context.state.config_records.get(STATE_REPLY)
    if rec is None or rec.get("digest") != digest:
        return None
    blob = rec.get("reply")
    if not isinstance(blob, bytes):
        raise ValueError(f"context.state[{STATE_REPLY!r}] holds no reply bytes")
    proto = ProtoRecordDict()
    proto.ParseFromString(blob)
    logger.info("node %d: instruction answered already: the same reply again", context.node_id)
    return recorddict_from_proto(proto)


def remember(digest: str, reply: Message, context: Context) -> None:
    """Keep ``reply`` (a content reply) as this node's answer to the instruction ``digest``."""
    if not reply.has_content():
        raise ValueError("only a content reply is kept (an error reply releases nothing)")
    blob = recorddict_to_proto(reply.content).SerializeToString()
    context.state.config_records[STATE_REPLY] = ConfigRecord({"digest": digest, "reply": blob})
