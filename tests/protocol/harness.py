"""The in-process harness of the protocol tests: a Flower ``Grid`` whose nodes are the real
ClientApp handlers, and the helpers that build configs, instructions and server runtimes.

An :class:`InProcessGrid` implements Flower's ``Grid`` by calling the ClientApp handlers
directly (each node has its own ``Context`` with a persistent ``state``), assigns message ids like
the SuperLink does, records every message, and lets a test drop, delay, replay or rewrite any
reply or instruction. This drives the real ``server.round`` code and the real ``client`` code.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import pytest
import torch
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    Message,
    RecordDict,
)
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from wire_helpers import message_stage

from corbin_fl import registry, wire
from corbin_fl.app import client_app, server_app
from corbin_fl.app.config import AppConfig
from corbin_fl.deploy.run import node_policy
from corbin_fl.server import round as server_round
from corbin_fl.server.metrics import RunFiles

RUN_ID = 4242


SERVER_NODE = 1


FAST: dict[str, Any] = {
    "max-steps": 1,
    "batch-size": 16,
    "eval-batch-size": 1000,
    "stage-timeout": 0.3,
    "first-stage-timeout": 0.3,
    "poll-interval": 0.01,
    "wait-for-nodes": 1.0,
    "min-clients": 1,
    "device": "cpu",
}


Hook = Callable[[int, Message, Message | None], list[Message] | None]
"""``hook(node, instruction, reply)`` -> replies to deliver (None: deliver ``reply`` as is)."""


# ============================================================================ harness
class InProcessGrid(Grid):
    """A Flower Grid whose nodes are ClientApp handler calls in this process."""

    def __init__(self, run_config: dict[str, Any], num_nodes: int, *, first_id: int = 101) -> None:
        self._run = Run.create_empty(RUN_ID)
        self.node_ids = [first_id + 7 * i for i in range(num_nodes)]
        self.contexts = {
            nid: Context(
                run_id=RUN_ID,
                node_id=nid,
                node_config={
                    "partition-id": i,
                    "num-partitions": num_nodes,
                    **node_policy({**AppConfig().to_flower(), **run_config}),
                },
                state=RecordDict(),
                run_config=dict(run_config),
            )
            for i, nid in enumerate(self.node_ids)
        }
        self.sent: list[Message] = []
        self.received: list[Message] = []
        self.hooks: list[Hook] = []
        self.instruction_hooks: list[Callable[[int, Message], Message | None]] = []
        self._outbox: dict[str, list[Message]] = {}

    # --- Grid API
    def set_run(self, run: Run) -> None:  # pragma: no cover - not used by the ServerApp
        self._run = run

    @property
    def run(self) -> Run:
        return self._run

    def create_message(self, *args: Any, **kwargs: Any) -> Message:  # pragma: no cover
        raise NotImplementedError("the ServerApp uses the Message constructor")

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids: list[str] = []
        for msg in messages:
            nid = msg.metadata.dst_node_id
            if nid not in self.contexts:
                ids.append("")
                continue
            mid = uuid.uuid4().hex
            msg.metadata.__dict__["_message_id"] = mid
            self.sent.append(msg)
            delivered = msg
            for ihook in self.instruction_hooks:
                delivered = ihook(nid, delivered) or delivered
            try:
                reply: Message | None = client_app.app(delivered, self.contexts[nid])
            except Exception as exc:  # what Flower does with a raising ClientApp
                reply = Message(Error(code=2, reason=f"{type(exc).__name__}: {exc}"), reply_to=msg)
            outs: list[Message] | None = None
            for hook in self.hooks:
                outs = hook(nid, msg, reply)
                if outs is not None:
                    break
            if outs is None:
                outs = [reply] if reply is not None else []
            for out in outs:
                if not out.metadata.message_id and not out.__dict__.get("_keep_empty_id"):
                    out.metadata.__dict__["_message_id"] = uuid.uuid4().hex
            self._outbox[mid] = outs
            ids.append(mid)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        out: list[Message] = []
        for mid in message_ids:
            out.extend(self._outbox.pop(mid, []))
        self.received.extend(out)
        return out

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        return self.pull_messages(list(self.push_messages(messages)))


def make_cfg(**overrides: Any) -> dict[str, Any]:
    return {**FAST, **{k.replace("_", "-"): v for k, v in overrides.items()}}


def run(grid: InProcessGrid, **overrides: Any) -> dict[str, Any]:
    cfg = AppConfig.from_flower({**grid.contexts[grid.node_ids[0]].run_config, **overrides})
    return server_app.run_training(grid, cfg)


def payload_blobs(msg: Message) -> list[bytes]:
    """Every bytes-like payload of a message (config bytes and raw array data)."""
    if not msg.has_content():
        return [(msg.error.reason or "").encode()]
    out: list[bytes] = []
    for rec in msg.content.values():
        if isinstance(rec, ConfigRecord):
            for v in rec.values():
                if isinstance(v, bytes):
                    out.append(v)
                elif isinstance(v, str):
                    out.append(v.encode())
        elif isinstance(rec, ArrayRecord):
            out.extend(arr.data for arr in rec.values())
    return out


def reply_hook(
    msg_type: str, node: int, action: Callable[[Message, Message], list[Message]]
) -> Hook:
    def hook(nid: int, instruction: Message, reply: Message | None) -> list[Message] | None:
        if nid == node and message_stage(instruction) == msg_type and reply is not None:
            return action(instruction, reply)
        return None

    return hook


def rebuild(reply: Message, instruction: Message, mutate: Callable[[RecordDict], None]) -> Message:
    content = copy.deepcopy(reply.content)
    mutate(content)
    return Message(content, reply_to=instruction)


def node_context(run_config: dict[str, Any], nid: int = 5) -> Context:
    return Context(RUN_ID, nid, {"partition-id": 0, "num-partitions": 2}, RecordDict(), run_config)


def mechanism_params(**overrides: Any) -> dict[str, Any]:
    """The mechanism settings an instruction carries (``registry.PARAM_KEYS``)."""
    settings = AppConfig.from_flower(make_cfg(**overrides)).to_flower()
    return {k: settings[k] for k in registry.PARAM_KEYS}


def make_instruction(
    stage: str,
    rnd: int = 1,
    group: str | None = None,
    params: dict[str, Any] | None = None,
    **keys: Any,
) -> Message:
    head = {wire.STAGE: stage, wire.ROUND: rnd, **(params or mechanism_params()), **keys}
    msg = Message(
        RecordDict({wire.CFG: ConfigRecord(head)}),
        dst_node_id=5,
        message_type=wire.TRAIN,
        group_id=group if group is not None else str(rnd),
    )
    msg.metadata.__dict__["_message_id"] = uuid.uuid4().hex
    return msg


def keygen_instruction(rnd: int = 1, group: str | None = None, **keys: Any) -> Message:
    return make_instruction(wire.KEYGEN, rnd, group, **keys)


# ============================================================================ helpers
def runtime(grid: InProcessGrid, cfg: AppConfig) -> server_round.ServerRuntime:
    """The server's state before round 1 (as ``run_training`` builds it)."""
    from corbin_fl.app.data import dataset_info
    from corbin_fl.app.models import build_model
    from corbin_fl.layout import flatten, layout_of

    info = dataset_info(cfg.dataset)
    model = build_model(cfg.model, info.in_channels, info.num_classes, seed=cfg.seed)
    return server_round.ServerRuntime(
        grid=grid,
        cfg=cfg,
        run_id=RUN_ID,
        weights=flatten(model),
        layout=layout_of(model),
        device=torch.device("cpu"),
        files=RunFiles(""),
        update_radius=(server_app.update_radius(cfg, len(grid.node_ids)) or {}).get("value", 0.0),
    )


def capture_metrics(grid: InProcessGrid) -> list[dict[str, Any]]:
    """Run the whole training loop and return its ``metrics.jsonl`` rows (in memory)."""
    records: list[dict[str, Any]] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(RunFiles, "metrics", lambda self, rec: records.append(rec))
        run(grid)
    return records
