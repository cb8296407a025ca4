"""The update radius ``R`` of ``range-mode = "update"`` (the app's default) from public settings.

``R = S * lr`` (:func:`corbin_fl.app.training.step_bound`): Adam moves a weight by about ``lr`` per
step, and ``S`` is the steps of one round from public settings only. These tests check the
formula, that the server resolves ``R`` once per run from the configuration and the number of
nodes (never from a client's data), that a resumed run keeps its ``R``, and that ``R`` does bound
a real round of Adam training of the app's CNN on its embedded MNIST partition.
"""

from __future__ import annotations

import math

import pytest
import torch
from flwr.serverapp.strategy import FedAvg

from corbin_fl.app.config import AppConfig
from corbin_fl.app.data import client_dataset, dataset_info, train_size
from corbin_fl.app.models import build_model
from corbin_fl.app.server_app import update_radius
from corbin_fl.app.training import step_bound, train_local
from corbin_fl.config import ConfigError
from corbin_fl.layout import flatten
from corbin_fl.server.records import clip_summary
from corbin_fl.server.strategy import CorBin


def test_step_bound_is_one_clients_share_of_the_public_split() -> None:
    # 3,200 training digits over 4 clients at batch 64: ceil(800 / 64) = 13 steps per epoch.
    b = step_bound(
        lr=1e-3, local_epochs=1, batch_size=64, max_steps=0, train_size=3200, num_clients=4
    )
    assert b.steps == 13 and b.radius == pytest.approx(0.013)
    # epochs multiply, an uneven share rounds up, and a smaller max-steps caps S
    b = step_bound(
        lr=2e-3, local_epochs=3, batch_size=32, max_steps=0, train_size=3201, num_clients=10
    )
    assert b.steps == 3 * math.ceil(321 / 32) and b.radius == pytest.approx(b.steps * 2e-3)
    capped = step_bound(
        lr=1e-3, local_epochs=3, batch_size=32, max_steps=7, train_size=3200, num_clients=10
    )
    assert capped.steps == 7 and "max-steps" in capped.source
    larger_cap = step_bound(
        lr=1e-3, local_epochs=1, batch_size=64, max_steps=50, train_size=3200, num_clients=4
    )
    assert larger_cap.steps == 13  # a cap above the epoch's steps changes nothing


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("lr", 0.0),
        ("local_epochs", 0),
        ("batch_size", 0),
        ("train_size", 0),
        ("num_clients", 0),
        ("max_steps", -1),
    ],
)
def test_step_bound_rejects_bad_settings(key: str, value: float) -> None:
    kw = {
        "lr": 1e-3,
        "local_epochs": 1,
        "batch_size": 64,
        "max_steps": 0,
        "train_size": 3200,
        "num_clients": 4,
    }
    with pytest.raises(ValueError, match=key):
        step_bound(**{**kw, key: value})


def test_the_server_resolves_r_from_the_config_and_the_node_count() -> None:
    cfg = AppConfig()
    assert cfg.range_mode == "update" and cfg.update_radius == 0  # the defaults
    n_train = train_size("mnist")
    assert n_train == 3200  # 5,000 digits minus 20% test, minus 20% of the rest for validation
    got = update_radius(cfg, 4)
    assert got is not None
    assert got["steps"] == 13 and got["value"] == pytest.approx(0.013)
    assert "3200 training examples / 4 clients" in got["source"]
    # more nodes, smaller shares, fewer steps
    assert update_radius(cfg, 10)["value"] == pytest.approx(5e-3)
    # an explicit R is taken as given; the layer range and fedcad have no R
    assert update_radius(cfg.replace(update_radius=0.02), 4)["value"] == 0.02
    assert update_radius(cfg.replace(range_mode="layer"), 4) is None
    assert update_radius(cfg.replace(mechanism="fedcad"), 4) is None
    # a resumed run keeps the R of its checkpointed rounds whatever connects after the crash:
    # CorBin keeps it, whatever the app's rule would say now
    strategy = CorBin.from_run_config(
        FedAvg(), cfg, update_radius=lambda n: update_radius(cfg, n) or {}
    )
    history = [{"round": 1, "update_radius": 0.013}]
    assert strategy._resolve_radius(2, history)["value"] == pytest.approx(0.013)
    assert strategy._resolve_radius(2, [])["value"] == pytest.approx(update_radius(cfg, 2)["value"])


def test_derived_r_needs_adam() -> None:
    with pytest.raises(ConfigError, match="update-radius"):
        AppConfig.from_flower({"optimizer": "sgd"})
    AppConfig.from_flower({"optimizer": "sgd", "update-radius": 0.05})  # an explicit R is fine
    AppConfig.from_flower({"optimizer": "sgd", "range-mode": "layer"})  # no R at all


def test_r_bounds_one_round_of_adam_on_the_cnn() -> None:
    """One client's round with the default training settings moves (almost) no weight by more
    than ``R = S * lr``: the default run's clip fraction is about 1e-4, where ``R = 0.01`` (the
    old default) clipped 12% of the coordinates in round 1."""
    cfg = AppConfig()
    data = client_dataset("mnist", 0, 4)
    info = dataset_info("mnist")
    model = build_model(cfg.model, info.in_channels, info.num_classes, seed=0)
    w0 = flatten(model).clone()
    result = train_local(
        model,
        data,
        epochs=cfg.local_epochs,
        batch_size=cfg.batch_size,
        seed=0,
        device="cpu",
        lr=cfg.lr,
        weight_decay=cfg.weight_decay,
    )
    bound = update_radius(cfg, 4)
    assert bound is not None and result.steps == bound["steps"]
    delta = (flatten(model) - w0).abs()
    outside = float((delta > bound["value"]).double().mean())
    assert outside < 1e-3, outside
    # and the bound is not loose by orders of magnitude: the largest move uses most of R
    assert float(delta.max()) > 0.5 * bound["value"]
    assert torch.isfinite(delta).all()


def test_clip_summary() -> None:
    rows = [{"clip_fraction": 0.1}, {"clip_fraction": None}, {"clip_fraction": 0.3}]
    got = clip_summary(rows)
    assert got["per_round"] == [0.1, None, 0.3]
    assert got["mean"] == pytest.approx(0.2) and got["max"] == 0.3
    assert clip_summary([]) == {"per_round": [], "mean": None, "max": None}
