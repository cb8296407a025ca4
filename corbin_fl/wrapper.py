"""What a strategy wrapper of this project shares: :class:`StrategyWrapper`.

Both wrappers of this project, ``CorBin`` (``server/strategy.py``) and the standalone
``SecAggPlus`` (``corbin_fl/secagg/strategy.py``), wrap a Flower Message-API strategy as
Flower's DP wrappers do: the wrapped strategy samples the nodes (``configure_train``), runs
federated evaluation, and receives, per round, ONE reply holding the round's aggregate
(:meth:`StrategyWrapper.aggregate_one`), so its ``aggregate_train`` (FedAvg's mean, a server
optimizer's step) applies with no code of ours. Imports nothing of the project.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

WEIGHT_KEY: Final[str] = "num-examples"
"""The weight key of a wrapped strategy that names none (Flower's FedAvg default)."""


class StrategyWrapper(Strategy):
    """A Flower strategy around ``self.strategy``: every method it does not override is the
    wrapped strategy's."""

    strategy: Strategy
    """The wrapped strategy."""

    def weight_key(self) -> str:
        """The key the wrapped strategy weights replies by (its ``weighted_by_key``)."""
        return str(getattr(self.strategy, "weighted_by_key", None) or WEIGHT_KEY)

    def aggregate_one(
        self,
        server_round: int,
        arrays_key: str,
        arrays: ArrayRecord,
        metrics: Mapping[str, int | float],
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The wrapped strategy's ``aggregate_train`` of one reply: ``arrays`` under
        ``arrays_key`` and a MetricRecord ``metrics`` (the weight key set to 1 among them)."""
        reply = Message(
            RecordDict(
                {arrays_key: arrays, "metrics": MetricRecord({self.weight_key(): 1, **metrics})}
            ),
            dst_node_id=0,
            message_type="train",
        )
        return self.strategy.aggregate_train(server_round, [reply])

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The wrapped strategy's train messages: who takes part, with which train config."""
        return self.strategy.configure_train(server_round, arrays, config, grid)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The wrapped strategy's aggregation."""
        return self.strategy.aggregate_train(server_round, replies)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Federated evaluation, as the wrapped strategy configures it."""
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Federated evaluation metrics, as the wrapped strategy aggregates them."""
        return self.strategy.aggregate_evaluate(server_round, replies)

    def summary(self) -> None:
        """The wrapped strategy's summary (a wrapper logs its own line first)."""
        self.strategy.summary()


__all__ = ["WEIGHT_KEY", "StrategyWrapper"]
