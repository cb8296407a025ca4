"""This project's ClientApp: its own train handler behind :func:`client.mod.corbin_mod`.

It is one ordinary user of the building block: ``ClientApp(mods=[..., corbin_mod])`` and one
``@app.train()`` handler (:func:`client.train.train`) that trains the run's model on the node's
partition. The privacy protocol lives entirely in the mod. In front of it, :func:`dropout_mod`
simulates a crashing client (``dropout-prob`` of the run config, for experiments and tests).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from corbin_fl import wire
from corbin_fl.app.config import AppConfig
from corbin_fl.app.train import partition
from corbin_fl.app.train import train as train_locally
from corbin_fl.client.mod import corbin_mod
from corbin_fl.config import ConfigError, configure_app_logging
from corbin_fl.flower_version import check_flower


class SimulatedDropoutError(RuntimeError):
    """Raised on purpose (``dropout-prob``) to make the node fail the round like a crash."""


def dropout_mod(
    msg: Message, context: Context, call_next: Callable[[Message, Context], Message]
) -> Message:
    """Fail every message of a round with probability ``dropout-prob`` (simulated dropout).

    The draw is seeded per (run seed, partition or node, round), so every stage of the round
    fails alike, and it raises exactly like a crashing client would.
    """
    try:
        cfg = AppConfig.from_flower(context.run_config)
        rnd = wire.round_of(msg)
    except (ConfigError, TypeError, wire.WireError):
        return call_next(msg, context)  # the handlers report what is wrong
    if cfg.dropout_prob > 0 and _drops_out(cfg, context, rnd):
        raise SimulatedDropoutError(
            f"node {context.node_id} drops out of round {rnd} (dropout-prob)"
        )
    return call_next(msg, context)


def _drops_out(cfg: AppConfig, context: Context, rnd: int) -> bool:
    try:
        who = partition(context, required=False)
    except (TypeError, ValueError):  # malformed node config: reported by the train handler
        who = None
    ident = who[0] if who is not None else context.node_id
    rng = np.random.default_rng([cfg.seed, 0xD809, ident, rnd])
    return bool(rng.random() < cfg.dropout_prob)


app = ClientApp(mods=[dropout_mod, corbin_mod])


@app.lifespan()
def lifespan(context: Context) -> Iterator[None]:
    """Route this app's log lines (fall-backs, rejections) to the ClientApp's output, and refuse
    a Flower of another release than the app's, naming both (:mod:`corbin_fl.flower_version`)."""
    configure_app_logging()
    check_flower("ClientApp")
    yield


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train the global model locally (torch is imported then, not for keygen/pair:
    :mod:`corbin_fl.app.train` imports it in its handler)."""
    return train_locally(msg, context)
