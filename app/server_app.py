"""This project's ServerApp (Flower 1.42 Message API): one user of the ``CorBin`` strategy.

``flwr run`` starts it with the run's ``run_config``; it is parsed once into a validated
:class:`corbin_fl.app.config.AppConfig` (a bad config fails here, listing every bad key). Then
:func:`run_training` builds the run's model (CNN / ResNet18) and the server's validation and
test sets, wraps Flower's ``FedAvg`` in :class:`server.strategy.CorBin` and starts it, exactly as
any Flower app would.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

# Through the modules (data.server_datasets, not server_datasets): the protocol tests replace
# their functions with fakes (tests/protocol/conftest.py).
from corbin_fl.app import data, models, training
from corbin_fl.app.config import AppConfig
from corbin_fl.config import configure_app_logging
from corbin_fl.devices import pick_device
from corbin_fl.flower_version import check_flower
from corbin_fl.server.strategy import CorBin

logger = logging.getLogger(__name__)

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Entry point of the ServerApp: check the Flower release (:mod:`corbin_fl.flower_version`:
    another one fails here, naming both versions), validate the run config, then train."""
    configure_app_logging()
    check_flower("ServerApp")
    cfg = AppConfig.from_flower(context.run_config)
    try:
        summary = run_training(grid, cfg)
    except Exception as exc:
        logger.error("%s", outcome_line(cfg, None, exc))
        raise
    logger.info("%s", outcome_line(cfg, summary))


def outcome_line(
    cfg: AppConfig, summary: dict[str, Any] | None, error: BaseException | None = None
) -> str:
    """The run's last log line, its outcome: what ``flwr run --stream`` and ``flwr log`` end on.

    ``CorBin-FL run completed: R/N rounds, test accuracy A, results in OUT`` from
    ``summary.json``'s content, or ``CorBin-FL run failed: <error>`` (Flower's own status,
    ``finished:completed`` or ``finished:failed``, is set only after this line, by the SuperLink).

    Raises
    ------
    ValueError
        Given neither a summary nor an error, or both.
    """
    if (summary is None) == (error is None):
        raise ValueError("outcome_line needs exactly one of a summary and an error")
    if error is not None:
        return f"CorBin-FL run failed: {type(error).__name__}: {error}"
    assert summary is not None
    rounds = summary.get("rounds")
    accuracy = summary.get("final_test_accuracy")
    parts = [f"{rounds if isinstance(rounds, int) else '?'}/{cfg.num_rounds} rounds"]
    if isinstance(accuracy, int | float):
        parts.append(f"test accuracy {accuracy:.4f}")
    parts.append(f"results in {cfg.out_dir}" if cfg.out_dir else "no out-dir (no result files)")
    return f"CorBin-FL run completed: {', '.join(parts)}"


def inner_strategy(cfg: AppConfig) -> Any:
    """The wrapped Flower strategy: :class:`SeededFedAvg` sampling ``clients-per-round`` nodes
    (all when 0), no federated evaluation (the server evaluates on its own validation and test
    sets)."""
    return SeededFedAvg(
        seed=cfg.seed,
        clients_per_round=cfg.clients_per_round,
        fraction_train=1.0,
        fraction_evaluate=0.0,
        min_train_nodes=1,
        min_available_nodes=1,
        weighted_by_key="num-examples",
    )


class SeededFedAvg(FedAvg):
    """Flower's ``FedAvg`` whose node sample is public and reproducible.

    ``clients_per_round`` nodes (all when 0), drawn with ``numpy.random.default_rng([seed,
    round, 1])`` from the sorted connected node ids, so a resumed run samples round ``t`` exactly
    as the uninterrupted run would have (Flower's own sampling uses the process-global
    ``random`` state). Aggregation is ``FedAvg``'s.
    """

    def __init__(self, *, seed: int, clients_per_round: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seed = seed
        self.clients_per_round = clients_per_round

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """One train message per sampled node: the model and ``config`` + ``server-round``."""
        nodes = sorted(int(n) for n in grid.get_node_ids())
        k = self.clients_per_round
        if 0 < k < len(nodes):
            rng = np.random.default_rng([self.seed, server_round, 1])
            nodes = [nodes[i] for i in sorted(rng.choice(len(nodes), size=k, replace=False))]
        config["server-round"] = server_round
        record = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})
        return self._construct_messages(record, nodes, MessageType.TRAIN)


def run_training(grid: Grid, cfg: AppConfig) -> dict[str, Any]:
    """The whole run of this project's app; returns ``summary.json``'s content.

    Raises
    ------
    server.checkpoint.CheckpointError
        ``resume = true`` without a usable checkpoint, or an ``out-dir`` holding another run's.
    """
    device = pick_device(cfg.device)
    info = data.dataset_info(cfg.dataset, cfg.data_dir or None)
    logger.info(
        "data: %s (dataset %s), %d examples, classes %s, normalised with mean %s and std %s; "
        "test: %s",
        info.title, cfg.dataset, info.num_examples, ", ".join(info.class_names) or "-",
        info.mean, info.std, data.test_split_text(cfg.dataset, cfg.use_official_test),
    )  # fmt: skip
    model = models.build_model(cfg.model, info.in_channels, info.num_classes, seed=cfg.seed)
    val, test = data.server_datasets(
        cfg.dataset,
        data_seed=cfg.data_seed,
        data_dir=cfg.data_dir or None,
        use_official_test=cfg.use_official_test,
    )

    # The server's evaluation (validation and test parts every round: 22,000 images of
    # Fashion-MNIST) is most of what a round does besides training. Its own copy of the model
    # keeps the convolution weights channels-last, which oneDNN runs about 1.8x cheaper on CPU
    # (docs/BENCHMARKS.md, "One 50-client round"); the values are the same.
    scorer = models.build_model(cfg.model, info.in_channels, info.num_classes, seed=cfg.seed)
    scorer.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # torch's stubs lack it

    def evaluate_fn(rnd: int, arrays: ArrayRecord) -> MetricRecord:
        scorer.load_state_dict(arrays.to_torch_state_dict(), strict=True)
        v = training.evaluate(scorer, val, batch_size=cfg.eval_batch_size, device=device)
        t = training.evaluate(scorer, test, batch_size=cfg.eval_batch_size, device=device)
        return MetricRecord(
            {
                "val_accuracy": v.accuracy,
                "val_loss": v.loss,
                "test_accuracy": t.accuracy,
                "test_loss": t.loss,
            }
        )

    strategy = CorBin.from_run_config(
        inner_strategy(cfg),
        cfg,
        update_radius=lambda num_nodes: update_radius(cfg, num_nodes) or {},
    )
    arrays = ArrayRecord({k: v.detach().cpu() for k, v in model.state_dict().items()})
    strategy.start(
        grid=grid,
        initial_arrays=arrays,
        num_rounds=cfg.num_rounds,
        evaluate_fn=evaluate_fn,
    )
    return strategy.summary_ or {}


def update_radius(cfg: AppConfig, num_nodes: int) -> dict[str, Any] | None:
    """This app's ``R`` of ``range-mode = "update"`` and how it was chosen (``None`` otherwise):
    the rule it hands to :class:`server.strategy.CorBin`, which calls it once when the run starts
    (a resumed run keeps the ``R`` of its checkpointed rounds, in ``CorBin``).

    ``update-radius > 0`` is taken as given. ``0`` derives ``R = S * lr`` from public settings
    (:func:`corbin_fl.app.training.step_bound`: Adam's per-step bound times the steps ``S`` of a
    round, with ``N = num_nodes``, the nodes connected at the start of the run, and the size of
    this app's public training split). The building block cannot derive it: it knows nothing of
    an app's data or optimizer.
    """
    if not cfg.quantizes_update:
        return None
    if cfg.update_radius > 0:
        return {"value": cfg.update_radius, "source": "update-radius (run config)"}
    bound = training.step_bound(
        lr=cfg.lr,
        local_epochs=cfg.local_epochs,
        batch_size=cfg.batch_size,
        max_steps=cfg.max_steps,
        train_size=data.train_size(
            cfg.dataset,
            data_seed=cfg.data_seed,
            data_dir=cfg.data_dir or None,
            use_official_test=cfg.use_official_test,
        ),
        num_clients=max(num_nodes, 1),
    )
    return {
        "value": bound.radius,
        "source": f"steps x lr = {bound.steps} x {cfg.lr:g}; steps = {bound.source}",
        "steps": bound.steps,
    }
