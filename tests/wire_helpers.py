"""What tests need to tell the protocol's messages apart: every stage is a Flower ``train``
message, so the stage comes from the ``corbin`` instruction record, or from a reply's records."""

from __future__ import annotations

from typing import Any

from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict

from corbin_fl import wire

REPLY_RECORD_OF_STAGE: dict[str, str] = {
    wire.KEYGEN: wire.KEYS,
    wire.PAIR: wire.PAIR_REC,
    wire.UPDATE: wire.REPLY,
}
"""The record that marks the reply of each stage."""


def message_stage(msg: Message) -> str | None:
    """The stage of an instruction (``corbin`` record) or of a reply (its protocol record);
    None for an error reply or a message of no stage."""
    if not msg.has_content():
        return None
    stage = wire.stage_of(msg)
    if stage is not None:
        return stage
    for name, record in REPLY_RECORD_OF_STAGE.items():
        if record in msg.content:
            return name
    return None


def is_stage(msg: Message, stage: str) -> bool:
    """Whether ``msg`` is an instruction or a (content) reply of ``stage``."""
    return message_stage(msg) == stage


def app_records(weights: Any, layout: Any, rnd: int) -> RecordDict:
    """What the wrapped ``FedAvg`` sends the app in round ``rnd``: the global model (one array
    per layer of ``layout``) under ``arrays`` and the train config under ``config``."""
    import numpy as np

    flat = np.asarray(weights.detach().cpu().numpy() if hasattr(weights, "detach") else weights)
    arrays = {
        name: Array(np.array(flat[lo : lo + size].reshape(shape), dtype=np.float32))
        for name, shape, lo, size in zip(
            layout.names, layout.shapes, layout.offsets, layout.sizes, strict=True
        )
    }
    return RecordDict(
        {"arrays": ArrayRecord(arrays), "config": ConfigRecord({"server-round": rnd})}
    )


def run_plain_round(rt: Any, rnd: int) -> Any:
    """:func:`server.round.run_round` over every connected node, as ``CorBin`` runs it when the
    wrapped ``FedAvg`` samples them all."""
    from corbin_fl.server.round import run_round

    nodes = sorted(int(n) for n in rt.grid.get_node_ids())
    return run_round(rt, rnd, nodes, app_records(rt.weights, rt.layout, rnd), "arrays")


def encode_solo(
    cfg: Any,
    node: int,
    w: Any,
    c: Any,
    r: Any,
    *,
    shared: Any = None,
    shared_seed: tuple[int, int, int] | None = None,
) -> tuple[str, Any, Any]:
    """One client's update of ``w`` (an update, ``w_g = 0``) with ``cfg``'s mechanism, as the
    mod encodes it (``client.encode.encode``): ``(array key, array, metric flags)``."""
    import torch
    from flwr.app import Context

    from corbin_fl.client.encode import encode

    ctx = Context(run_id=9, node_id=node, node_config={}, state=RecordDict(), run_config={})
    key, array, flags, _ = encode(
        cfg,
        ctx,
        w=w,
        w_global=torch.zeros(w.numel()),
        c=c,
        r=r,
        rnd=1,
        assignment="solo",
        shared=shared,
        shared_seed=shared_seed,
    )
    return key, array, flags
