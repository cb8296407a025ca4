"""``CorBin`` around Flower strategies other than plain ``FedAvg``: per-node configs are honoured,
per-node models are refused, and a server-side optimizer (``FedAdam``) runs unchanged.

The wrapped strategy's ``configure_train`` picks the nodes and their train records. A strategy
may configure nodes differently (a per-node learning rate, say): each node's update instruction
carries that node's own ConfigRecord. It may not send nodes different global models: every update
is quantized around one global model and the decoded mean is added back to it (paper eq. 6), so
``CorBin`` refuses such a strategy with a message that names the nodes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAdam, FedAvg
from harness import InProcessGrid, make_cfg

from corbin_fl import wire
from corbin_fl.app.config import AppConfig
from corbin_fl.config import ConfigError
from corbin_fl.server.strategy import CorBin


def _initial_arrays(cfg: AppConfig) -> ArrayRecord:
    from corbin_fl.app.data import dataset_info
    from corbin_fl.app.models import build_model

    info = dataset_info(cfg.dataset)
    model = build_model(cfg.model, info.in_channels, info.num_classes, seed=cfg.seed)
    return ArrayRecord({k: v.detach().cpu() for k, v in model.state_dict().items()})


class PerNodeLr(FedAvg):
    """FedAvg that gives node ``i`` (in sorted order) the learning rate ``0.01 * (i + 1)``."""

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        nodes = sorted(int(n) for n in grid.get_node_ids())
        return [
            Message(
                RecordDict(
                    {
                        "arrays": arrays,
                        "config": ConfigRecord({**config, "lr": 0.01 * (i + 1), "node": nid}),
                    }
                ),
                dst_node_id=nid,
                message_type=MessageType.TRAIN,
            )
            for i, nid in enumerate(nodes)
        ]


class PerNodeModel(FedAvg):
    """FedAvg that sends the last node a perturbed copy of the global model."""

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        nodes = sorted(int(n) for n in grid.get_node_ids())
        other = ArrayRecord(
            {k: Array(np.asarray(v.numpy()) + np.float32(1e-3)) for k, v in arrays.items()}
        )
        return [
            Message(
                RecordDict({"arrays": other if nid == nodes[-1] else arrays, "config": config}),
                dst_node_id=nid,
                message_type=MessageType.TRAIN,
            )
            for nid in nodes
        ]


def _corbin(strategy: Any, run_config: dict[str, Any]) -> tuple[CorBin, AppConfig]:
    cfg = AppConfig.from_flower({**run_config, "update-radius": 0.01})
    return CorBin.from_run_config(strategy, cfg), cfg


def _update_instructions(grid: InProcessGrid) -> list[Message]:
    return [m for m in grid.sent if m.content.config_records[wire.CFG][wire.STAGE] == wire.UPDATE]


def test_per_node_configs_reach_their_nodes() -> None:
    run_config = make_cfg(num_rounds=2, mechanism="ldpfl")
    grid = InProcessGrid(run_config, 3)
    corbin, cfg = _corbin(PerNodeLr(fraction_evaluate=0.0), run_config)
    corbin.start(grid=grid, initial_arrays=_initial_arrays(cfg), num_rounds=2)
    sent = _update_instructions(grid)
    assert len(sent) == 2 * 3
    order = sorted(grid.node_ids)
    for msg in sent:
        nid = int(msg.metadata.dst_node_id)
        config = msg.content.config_records["config"]
        assert config["node"] == nid  # this node's own record, not the first node's
        assert config["lr"] == pytest.approx(0.01 * (order.index(nid) + 1))
    # the replies were accepted: both rounds aggregated every node's update
    assert [row["participants"] for row in corbin.history] == [3, 3]


def test_deriving_r_needs_the_apps_rule() -> None:
    """``update-radius = 0`` means "derive R", which only the app can do (from its data)."""
    with pytest.raises(ConfigError, match="update-radius"):
        CorBin.from_run_config(FedAvg(), AppConfig.from_flower(make_cfg()))


def test_per_node_models_are_refused_naming_the_nodes() -> None:
    run_config = make_cfg(num_rounds=1, mechanism="ldpfl")
    grid = InProcessGrid(run_config, 3)
    corbin, cfg = _corbin(PerNodeModel(fraction_evaluate=0.0), run_config)
    with pytest.raises(ValueError, match="another global model") as info:
        corbin.start(grid=grid, initial_arrays=_initial_arrays(cfg), num_rounds=1)
    nodes = sorted(grid.node_ids)
    assert f"node {nodes[-1]}" in str(info.value) and f"node {nodes[0]}" in str(info.value)
    assert not _update_instructions(grid)  # refused before any instruction went out


@pytest.mark.parametrize("mechanism", ["corbin", "ldpfl"])
def test_a_server_optimizer_runs_on_the_decoded_mean(mechanism: str) -> None:
    """``FedAdam`` turns the decoded mean into the next model: the run completes, every round
    aggregates every node, and the model moved."""
    run_config = make_cfg(num_rounds=2, mechanism=mechanism)
    grid = InProcessGrid(run_config, 4)
    corbin, cfg = _corbin(FedAdam(fraction_evaluate=0.0, eta=1e-2), run_config)
    initial = _initial_arrays(cfg)
    result = corbin.start(grid=grid, initial_arrays=initial, num_rounds=2)
    assert [row["participants"] for row in corbin.history] == [4, 4]
    moved = [float(np.abs(result.arrays[k].numpy() - initial[k].numpy()).max()) for k in initial]
    assert max(moved) > 0.0
